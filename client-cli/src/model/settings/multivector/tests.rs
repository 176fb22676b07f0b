use super::super::read_settings as read_any;
use super::super::testdata_dirs::{copy_of, edit, refused_field};
use super::*;

#[test]
fn a_sentence_transformers_multi_vector_encoder_reads_as_multivector_over_its_projection() {
    let dir = copy_of("colbert");
    let settings = read_any(dir.path()).unwrap();
    assert_eq!(settings.pooling, Pooling::MultiVector);
    assert_eq!(settings.dimensions, 16, "the projection's width, not the hidden size");
    assert_eq!(settings.max_tokens, 512);
    assert_eq!(settings.dense, ["1_Dense"], "the projection is sealed as the one Dense module");
    assert!(settings.prompts.is_empty() && !settings.normalize);
}

#[test]
fn what_the_engine_does_not_compute_is_refused_by_field() {
    let cases: [(&str, &str, fn(&mut Value), &str); 10] = [
        ("2_MultiVectorMask/config.json", "a punctuation skiplist", |c| c["skiplist_words"] = serde_json::json!([".", ","]), "skiplist_words"),
        ("2_MultiVectorMask/config.json", "a keep-list", |c| c["keep_only_token_ids"] = serde_json::json!([5]), "keep_only_token_ids"),
        ("sentence_bert_config.json", "query expansion", |c| c["query_expansion"] = serde_json::json!({"strategy": "fixed", "attend": false, "length": 32}), "query_expansion"),
        ("sentence_bert_config.json", "a document length", |c| c["document_length"] = 180.into(), "document_length"),
        ("config_sentence_transformers.json", "a query prompt", |c| c["prompts"]["query"] = "[Q] ".into(), "prompts"),
        ("3_Normalize/config.json", "a sentence-level Normalize", |c| c["module_input_name"] = "sentence_embedding".into(), "module_input_name"),
        ("1_Dense/config.json", "a pooled Dense", |c| c["module_input_name"] = "sentence_embedding".into(), "module_input_name"),
        ("1_Dense/config.json", "a Tanh projection", |c| c["activation_function"] = "torch.nn.modules.activation.Tanh".into(), "activation_function"),
        ("1_Dense/config.json", "another input width", |c| c["in_features"] = 32.into(), "in_features"),
        (
            "modules.json",
            "token pooling after Normalize",
            |m| m.as_array_mut().unwrap().push(serde_json::json!({"idx": 4, "name": "4", "path": "4_HierarchicalTokenPooling", "type": "sentence_transformers.multi_vector_encoder.modules.token_pooling.HierarchicalTokenPooling"})),
            "type",
        ),
    ];
    for (file, what, change, field) in cases {
        let dir = copy_of("colbert");
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), field, "{what}");
    }
    // Without Normalize the vectors would not be unit-length.
    let dir = copy_of("colbert");
    edit(dir.path(), "modules.json", |m| {
        m.as_array_mut().unwrap().pop();
    });
    assert_eq!(refused_field(dir.path()), "type");
    // A Stanford-NLP checkpoint (no modules.json) is not read as a mean-pooled model.
    let dir = copy_of("colbert");
    std::fs::remove_file(dir.path().join("modules.json")).unwrap();
    std::fs::remove_file(dir.path().join("config_sentence_transformers.json")).unwrap();
    edit(dir.path(), "config.json", |c| c["architectures"] = serde_json::json!(["HF_ColBERT"]));
    assert_eq!(refused_field(dir.path()), "type");
}
