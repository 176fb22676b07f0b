use super::*;
use serde_json::Map;

/// The generator's config (transformers 5's form; both folders carry the same).
fn generated(folder: &str) -> Value {
    let path = format!("{}/../tests/testdata/models/gte/{folder}/config.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parse_with(edit: impl Fn(&mut Map<String, Value>)) -> Result<ArchConfig, InferenceError> {
    let mut config = generated("v6-mean");
    edit(config.as_object_mut().unwrap());
    ArchConfig::parse(&serde_json::to_vec(&config).unwrap())
}

#[test]
fn the_generated_config_reads_as_its_layers() {
    let config = parse_with(|_| {}).unwrap();
    assert_eq!(config.arch, Architecture::Gte);
    assert_eq!((config.hidden_size, config.num_attention_heads, config.head_dim, config.num_key_value_heads), (40, 4, 10, 4));
    assert_eq!((config.intermediate_size, config.num_hidden_layers, config.max_tokens(), config.type_vocab_size), (48, 3, 2048, 2));
    assert_eq!((config.placement, config.activation, config.layer_norm_eps), (Placement::Post, Activation::GeGlu, 1e-12));
    let layer = LayerAttention { rotary_base: Some(160_000.0), window: None, causal: false };
    assert_eq!(config.attention, [layer; 3]);
    assert_eq!(parse_with(|c| { c.remove("rope_parameters"); c.remove("hidden_act"); }).unwrap(), config, "transformers' defaults");
    assert_eq!(parse_with(|c| { c.insert("type_vocab_size".into(), 0.into()); }).unwrap().type_vocab_size, 0, "gte-base-en-v1.5 has none");
    assert_eq!(parse_with(|c| { c.insert("hidden_act".into(), "silu".into()); }).unwrap().activation, Activation::SwiGlu);
}

/// Each refusal names its field: unknown fields, rotary scaling (the remote code's `ntk`), other
/// activations, counts over their caps.
#[test]
fn unknown_fields_variants_and_counts_are_refused_by_name() {
    type Edit = Box<dyn Fn(&mut Map<String, Value>)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("auto_map", Box::new(|c| { c.insert("auto_map".into(), serde_json::json!({"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"})); })),
        ("unpad_inputs", Box::new(|c| { c.insert("unpad_inputs".into(), true.into()); })),
        ("position_embedding_type", Box::new(|c| { c.insert("position_embedding_type".into(), "rope".into()); })),
        ("rope_scaling", Box::new(|c| { c.insert("rope_scaling".into(), serde_json::json!({"type": "ntk", "factor": 2.0})); })),
        ("rope_parameters.rope_type", Box::new(|c| { c["rope_parameters"]["rope_type"] = "ntk".into(); })),
        ("rope_parameters.factor", Box::new(|c| { c["rope_parameters"]["factor"] = 2.0.into(); })),
        ("rope_theta", Box::new(|c| { c.insert("rope_theta".into(), 10_000.0.into()); })),
        ("hidden_act", Box::new(|c| { c.insert("hidden_act".into(), "gelu_new".into()); })),
        ("head_dim", Box::new(|c| { c.insert("head_dim".into(), 13.into()); })),
        ("num_hidden_layers", Box::new(|c| { c.insert("num_hidden_layers".into(), 97.into()); })),
        ("type_vocab_size", Box::new(|c| { c.insert("type_vocab_size".into(), 1025.into()); })),
        ("layer_norm_eps", Box::new(|c| { c.insert("layer_norm_eps".into(), 2.into()); })),
        ("max_position_embeddings", Box::new(|c| { c.insert("max_position_embeddings".into(), 131_073.into()); })),
        ("vocab_size", Box::new(|c| { c.insert("vocab_size".into(), 0.into()); })),
    ];
    let mut wrong = Vec::new();
    for (field, edit) in &cases {
        match parse_with(edit) {
            Err(InferenceError::UnsupportedSetting { file: "config.json", field: refused, .. }) if refused == *field => {}
            other => wrong.push(format!("{field}: {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "not refused by their field:\n{}", wrong.join("\n"));
}
