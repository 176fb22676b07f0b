use super::*;
use serde_json::Map;

/// The generator's two configs: the published form (`classic-last`) and transformers 5's (`v6-last`).
fn generated(folder: &str) -> Value {
    let path = format!("{}/../tests/testdata/models/qwen3/{folder}/config.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parse_with(folder: &str, edit: impl Fn(&mut Map<String, Value>)) -> Result<ArchConfig, InferenceError> {
    let mut config = generated(folder);
    edit(config.as_object_mut().unwrap());
    ArchConfig::parse(&serde_json::to_vec(&config).unwrap())
}

#[test]
fn both_generated_configs_read_as_the_same_layers() {
    let published = parse_with("classic-last", |_| {}).unwrap();
    assert_eq!(published.arch, Architecture::Qwen3);
    assert_eq!(
        (published.hidden_size, published.num_attention_heads, published.num_key_value_heads, published.head_dim),
        (48, 4, 2, 16)
    );
    assert_eq!((published.intermediate_size, published.num_hidden_layers, published.max_tokens()), (40, 3, 32_768));
    assert_eq!((published.placement, published.activation, published.layer_norm_eps), (Placement::Pre, Activation::SwiGlu, 1e-6));
    let layer = LayerAttention { rotary_base: Some(1_000_000.0), window: None, causal: true };
    assert_eq!(published.attention, [layer; 3]);
    assert_eq!(parse_with("v6-last", |_| {}).unwrap(), published);
    // tie_word_embeddings says how the language-model head is tied; Qwen3Model has no head.
    assert_eq!(parse_with("v6-last", |c| { c.insert("tie_word_embeddings".into(), false.into()); }).unwrap(), published);
}

/// Each refusal names its field. Every case is tried before any assertion, so that a run with a
/// check taken out lists each case that then went through.
#[test]
fn unknown_fields_variants_and_counts_are_refused_by_name() {
    type Edit = Box<dyn Fn(&mut Map<String, Value>)>;
    let cases: Vec<(&str, &str, Edit)> = vec![
        ("v6-last", "fancy_new_flag", Box::new(|c| { c.insert("fancy_new_flag".into(), true.into()); })),
        ("v6-last", "attention_bias", Box::new(|c| { c.insert("attention_bias".into(), true.into()); })),
        ("classic-last", "use_sliding_window", Box::new(|c| { c.insert("use_sliding_window".into(), true.into()); })),
        ("v6-last", "layer_types", Box::new(|c| { c["layer_types"][2] = "sliding_attention".into(); })),
        ("v6-last", "layer_types", Box::new(|c| { c["layer_types"].as_array_mut().unwrap().pop(); })),
        ("classic-last", "rope_scaling", Box::new(|c| { c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "yarn", "factor": 4.0})); })),
        ("v6-last", "rope_parameters.rope_type", Box::new(|c| { c["rope_parameters"]["rope_type"] = "linear".into(); })),
        ("v6-last", "rope_parameters.factor", Box::new(|c| { c["rope_parameters"]["factor"] = 2.0.into(); })),
        ("v6-last", "rope_theta", Box::new(|c| { c.insert("rope_theta".into(), 10_000.0.into()); })),
        ("classic-last", "rope_theta", Box::new(|c| { c.insert("rope_theta".into(), 0.5.into()); })),
        ("classic-last", "hidden_act", Box::new(|c| { c.insert("hidden_act".into(), "gelu".into()); })),
        ("classic-last", "num_key_value_heads", Box::new(|c| { c.insert("num_key_value_heads".into(), 3.into()); })),
        ("classic-last", "num_key_value_heads", Box::new(|c| { c.remove("num_key_value_heads"); })),
        ("classic-last", "head_dim", Box::new(|c| { c.remove("head_dim"); })),
        ("classic-last", "head_dim", Box::new(|c| { c.insert("head_dim".into(), 15.into()); })),
        ("classic-last", "max_position_embeddings", Box::new(|c| { c.insert("max_position_embeddings".into(), 131_073.into()); })),
        ("classic-last", "num_hidden_layers", Box::new(|c| { c.insert("num_hidden_layers".into(), 0.into()); })),
        ("classic-last", "hidden_size", Box::new(|c| { c.insert("hidden_size".into(), 1_000_000.into()); })),
        ("classic-last", "rms_norm_eps", Box::new(|c| { c.insert("rms_norm_eps".into(), 0.into()); })),
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
