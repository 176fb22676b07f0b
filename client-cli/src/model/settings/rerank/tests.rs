use super::super::read_settings as read_any;
use super::super::testdata_dirs::{copy_of, edit, refused_field};
use super::*;

#[test]
fn a_cross_encoder_reads_as_rerank_in_each_form() {
    let dir = copy_of("rerank");
    let settings = read_any(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.dimensions, settings.max_tokens, settings.normalize), (Pooling::Rerank { sigmoid: true }, 36, 128, false));
    // 4.x–5.x: the activation in config.json; Identity gives the logit.
    for name in ["config_sentence_transformers.json", "sentence_bert_config.json", "modules.json"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    edit(dir.path(), "config.json", |c| c["sentence_transformers"] = serde_json::json!({"activation_fn": IDENTITY}));
    assert_eq!(read_any(dir.path()).unwrap().pooling, Pooling::Rerank { sigmoid: false });
    // A plain sequence-classification checkpoint (bge-reranker-v2-m3's layout): Sigmoid.
    edit(dir.path(), "config.json", |c| {
        c.as_object_mut().unwrap().remove("sentence_transformers");
    });
    assert_eq!(read_any(dir.path()).unwrap().pooling, Pooling::Rerank { sigmoid: true });
}

/// ms-marco-MiniLM's shape: a BERT cross-encoder reads as rerank, with BERT's hidden size.
#[test]
fn a_bert_cross_encoder_reads_as_rerank() {
    let dir = copy_of("rerank-bert");
    let settings = read_any(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.dimensions, settings.max_tokens, settings.normalize), (Pooling::Rerank { sigmoid: true }, 24, 128, false));
    // The 4.x–5.x form (ms-marco-MiniLM-L6-v2 as published: config.json's activation, no modules).
    for name in ["config_sentence_transformers.json", "sentence_bert_config.json", "modules.json"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    edit(dir.path(), "config.json", |c| c["sentence_transformers"] = serde_json::json!({"activation_fn": SIGMOID}));
    assert_eq!(read_any(dir.path()).unwrap().pooling, Pooling::Rerank { sigmoid: true });
}

#[test]
fn a_bert_cross_encoder_without_its_pair_types_is_refused_by_field() {
    let cases: [(&str, &str, fn(&mut Value), &str); 2] = [
        ("config.json", "one token type", |c| c["type_vocab_size"] = 1.into(), "type_vocab_size"),
        ("tokenizer_config.json", "a tokenizer that does not pass types", |t| t["model_input_names"] = serde_json::json!(["input_ids", "attention_mask"]), "model_input_names"),
    ];
    for (file, what, change, field) in cases {
        let dir = copy_of("rerank-bert");
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), field, "{what}");
    }
}

#[test]
fn what_the_engine_does_not_compute_is_refused_by_field() {
    let cases: [(&str, &str, fn(&mut Value), &str); 4] = [
        ("config.json", "two labels", |c| c["id2label"] = serde_json::json!({"0": "no", "1": "yes"}), "id2label"),
        ("config.json", "an MPNet cross-encoder", |c| c["model_type"] = "mpnet".into(), "model_type"),
        ("config_sentence_transformers.json", "another activation", |c| c["activation_fn"] = "torch.nn.modules.activation.Tanh".into(), "activation_fn"),
        ("modules.json", "a pooling module", |m| m.as_array_mut().unwrap().push(serde_json::json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})), "type"),
    ];
    for (file, what, change, field) in cases {
        let dir = copy_of("rerank");
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), field, "{what}");
    }
}
