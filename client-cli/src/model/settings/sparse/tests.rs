use super::super::read_settings as read_any;
use super::super::testdata_dirs::{copy_of, edit, refused_field};
use super::*;

#[test]
fn a_sentence_transformers_sparse_encoder_reads_as_splade_over_its_vocabulary() {
    let dir = copy_of("splade");
    let settings = read_any(dir.path()).unwrap();
    assert_eq!(settings.pooling, Pooling::Splade);
    assert_eq!(settings.dimensions, 755, "the vocabulary's width, not the hidden size");
    assert_eq!(settings.max_tokens, 512);
    assert!(!settings.normalize);
    // The 4.x/5.x module name reads the same.
    edit(dir.path(), "modules.json", |m| m[0]["type"] = "sentence_transformers.sparse_encoder.models.MLMTransformer".into());
    assert_eq!(read_any(dir.path()).unwrap().pooling, Pooling::Splade);
}

#[test]
fn what_the_engine_does_not_compute_is_refused_by_field() {
    let cases: [(&str, &str, fn(&mut Value), &str); 6] = [
        ("1_SpladePooling/config.json", "sum pooling", |c| c["pooling_strategy"] = "sum".into(), "pooling_strategy"),
        ("1_SpladePooling/config.json", "a second log1p", |c| c["activation_function"] = "log1p_relu".into(), "activation_function"),
        ("1_SpladePooling/config.json", "another width", |c| c["embedding_dimension"] = 30522.into(), "embedding_dimension"),
        ("sentence_bert_config.json", "another task", |c| c["transformer_task"] = "feature-extraction".into(), "transformer_task"),
        ("config.json", "another architecture", |c| c["model_type"] = "modernbert".into(), "model_type"),
        (
            "modules.json",
            "a module after pooling",
            |m| m.as_array_mut().unwrap().push(serde_json::json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})),
            "type",
        ),
    ];
    for (file, what, change, field) in cases {
        let dir = copy_of("splade");
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), field, "{what}");
    }
}
