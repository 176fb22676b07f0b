use super::*;

/// The generator's two configs: EmbeddingGemma's published form (`classic-mean`) and
/// transformers 5's (`v6-mean`).
fn generated(folder: &str) -> Value {
    let path = format!("{}/../tests/testdata/models/gemma3/{folder}/config.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parse_with(folder: &str, edit: impl Fn(&mut Map<String, Value>)) -> Result<ArchConfig, InferenceError> {
    let mut config = generated(folder);
    edit(config.as_object_mut().unwrap());
    ArchConfig::parse(&serde_json::to_vec(&config).unwrap())
}

#[test]
fn both_generated_configs_read_as_the_same_layers() {
    let published = parse_with("classic-mean", |_| {}).unwrap();
    assert_eq!(published.arch, Architecture::Gemma3);
    assert_eq!(
        (published.hidden_size, published.num_attention_heads, published.num_key_value_heads, published.head_dim),
        (48, 4, 2, 16)
    );
    assert_eq!((published.intermediate_size, published.num_hidden_layers, published.max_tokens()), (40, 4, 2048));
    assert_eq!((published.placement, published.activation, published.layer_norm_eps), (Placement::Pre, Activation::GeGluTanh, 1e-6));
    assert_eq!(published.query_scale, Some((24f64).powf(-0.5) as f32));
    // A stated window of 16 is |i − j| ≤ 8 under bidirectional attention.
    let full = LayerAttention { rotary_base: Some(1_000_000.0), window: None, causal: false };
    let sliding = LayerAttention { rotary_base: Some(10_000.0), window: Some(8), causal: false };
    assert_eq!(published.attention, [sliding, sliding, full, sliding]);
    assert_eq!(parse_with("v6-mean", |_| {}).unwrap(), published);
    let odd = parse_with("v6-mean", |c| { c.insert("sliding_window".into(), 17.into()); }).unwrap();
    assert_eq!(odd.attention[0].window, Some(8), "transformers: |i − j| < 17 / 2 + 1");
    // Without rope_parameters or the published bases, transformers' defaults (1e6 / 1e4).
    let defaults = parse_with("classic-mean", |c| {
        c.remove("rope_theta");
        c.remove("rope_local_base_freq");
    })
    .unwrap();
    assert_eq!(defaults, published);
}

/// Each refusal names its field. Every case is tried before any assertion, so that a run with a
/// check taken out lists each case that then went through.
#[test]
fn unknown_fields_variants_and_counts_are_refused_by_name() {
    type Edit = Box<dyn Fn(&mut Map<String, Value>)>;
    let cases: Vec<(&str, &str, Edit)> = vec![
        ("v6-mean", "fancy_new_flag", Box::new(|c| { c.insert("fancy_new_flag".into(), true.into()); })),
        ("v6-mean", "use_bidirectional_attention", Box::new(|c| { c.insert("use_bidirectional_attention".into(), false.into()); })),
        ("v6-mean", "use_bidirectional_attention", Box::new(|c| { c.remove("use_bidirectional_attention"); })),
        ("classic-mean", "attn_logit_softcapping", Box::new(|c| { c.insert("attn_logit_softcapping".into(), 50.0.into()); })),
        ("classic-mean", "final_logit_softcapping", Box::new(|c| { c.insert("final_logit_softcapping".into(), 30.0.into()); })),
        ("v6-mean", "attention_bias", Box::new(|c| { c.insert("attention_bias".into(), true.into()); })),
        ("classic-mean", "hidden_activation", Box::new(|c| { c.insert("hidden_activation".into(), "gelu".into()); })),
        ("v6-mean", "layer_types", Box::new(|c| { c["layer_types"][2] = "chunked_attention".into(); })),
        ("v6-mean", "layer_types", Box::new(|c| { c["layer_types"].as_array_mut().unwrap().pop(); })),
        ("classic-mean", "layer_types", Box::new(|c| { c.remove("layer_types"); })),
        ("classic-mean", "sliding_window", Box::new(|c| { c.remove("sliding_window"); })),
        ("classic-mean", "rope_scaling", Box::new(|c| { c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "linear", "factor": 8.0})); })),
        ("v6-mean", "rope_parameters.full_attention.rope_type", Box::new(|c| { c["rope_parameters"]["full_attention"]["rope_type"] = "linear".into(); })),
        ("v6-mean", "rope_parameters.sliding_attention.factor", Box::new(|c| { c["rope_parameters"]["sliding_attention"]["factor"] = 2.0.into(); })),
        ("v6-mean", "rope_parameters.chunked_attention", Box::new(|c| { c["rope_parameters"]["chunked_attention"] = serde_json::json!({"rope_type": "default"}); })),
        ("v6-mean", "rope_theta", Box::new(|c| { c.insert("rope_theta".into(), 10_000.0.into()); })),
        ("v6-mean", "rope_local_base_freq", Box::new(|c| { c.insert("rope_local_base_freq".into(), 1_000_000.0.into()); })),
        ("classic-mean", "rope_local_base_freq", Box::new(|c| { c.insert("rope_local_base_freq".into(), 0.5.into()); })),
        ("classic-mean", "query_pre_attn_scalar", Box::new(|c| { c.insert("query_pre_attn_scalar".into(), 0.into()); })),
        ("classic-mean", "num_key_value_heads", Box::new(|c| { c.insert("num_key_value_heads".into(), 3.into()); })),
        ("classic-mean", "num_key_value_heads", Box::new(|c| { c.remove("num_key_value_heads"); })),
        ("classic-mean", "head_dim", Box::new(|c| { c.remove("head_dim"); })),
        ("classic-mean", "head_dim", Box::new(|c| { c.insert("head_dim".into(), 15.into()); })),
        ("classic-mean", "max_position_embeddings", Box::new(|c| { c.insert("max_position_embeddings".into(), 131_073.into()); })),
        ("classic-mean", "num_hidden_layers", Box::new(|c| { c.insert("num_hidden_layers".into(), 0.into()); })),
        ("classic-mean", "hidden_size", Box::new(|c| { c.insert("hidden_size".into(), 1_000_000.into()); })),
        ("classic-mean", "rms_norm_eps", Box::new(|c| { c.insert("rms_norm_eps".into(), 0.into()); })),
    ];
    let mut wrong = Vec::new();
    for (folder, field, edit) in &cases {
        match parse_with(folder, edit) {
            Err(InferenceError::UnsupportedSetting { file: "config.json", field: refused, .. }) if refused == *field => {}
            other => wrong.push(format!("{folder} {field}: {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "not refused by their field:\n{}", wrong.join("\n"));
}
