//! The committed Qwen3 reranker folder (scripts/make_output_models.py rerank_qwen3) onboards as
//! `rerank_yesno` with the template sentence-transformers renders; each change it cannot compute
//! exactly is refused by file and field.

use protocol::manifest::{Pooling, RerankTemplate};
use serde_json::{Value, json};

use super::super::read_settings;
use super::super::testdata_dirs::{copy_of, edit, refused_field};

const FOLDER: &str = "rerank-qwen3";

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs/rerank-qwen3-reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_committed_folder_reads_as_rerank_yesno_with_transformers_pieces() {
    let dir = copy_of(FOLDER);
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.dimensions, settings.max_tokens, settings.normalize), (Pooling::RerankYesNo { sigmoid: true }, 48, 256, false));
    let r = reference();
    let t = &r["template"];
    let text = |k: &str| t[k].as_str().unwrap().to_owned();
    let expected = RerankTemplate {
        prefix: text("prefix"),
        after_instruction: text("after_instruction"),
        after_query: text("after_query"),
        suffix: text("suffix"),
        instruction: text("instruction"),
        yes: r["yes"].as_u64().unwrap() as u32,
        no: r["no"].as_u64().unwrap() as u32,
    };
    assert_eq!(settings.rerank_template, Some(expected));
    // The same template from tokenizer_config.json (the older place) reads the same.
    let jinja = std::fs::read_to_string(dir.path().join("chat_template.jinja")).unwrap();
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    edit(dir.path(), "tokenizer_config.json", |c| c["chat_template"] = json!(jinja));
    assert_eq!(read_settings(dir.path()).unwrap().rerank_template, settings.rerank_template);
    // Identity: the logit difference as it is.
    edit(dir.path(), "config_sentence_transformers.json", |c| c["activation_fn"] = json!("torch.nn.modules.linear.Identity"));
    assert_eq!(read_settings(dir.path()).unwrap().pooling, Pooling::RerankYesNo { sigmoid: false });
}

/// A template with its instruction in its fixed text (no system message read) has an empty one.
#[test]
fn a_fixed_instruction_is_part_of_the_prefix() {
    let dir = copy_of(FOLDER);
    let fixed = "<|im_start|>user\n<Instruct>: Find it\n<Query>: {{ messages | selectattr(\"role\", \"eq\", \"query\") | map(attribute=\"content\") | first }}\n<Document>: {{ messages | selectattr(\"role\", \"eq\", \"document\") | map(attribute=\"content\") | first }}<|im_end|>\n";
    std::fs::write(dir.path().join("chat_template.jinja"), fixed).unwrap();
    let t = read_settings(dir.path()).unwrap().rerank_template.unwrap();
    assert_eq!((t.prefix.as_str(), t.instruction.as_str(), t.after_instruction.as_str()), ("<|im_start|>user\n<Instruct>: Find it\n<Query>: ", "", ""));
    assert_eq!((t.after_query.as_str(), t.suffix.as_str()), ("\n<Document>: ", "<|im_end|>"));
}

#[test]
fn what_is_not_computed_exactly_is_refused_by_field() {
    type Change = fn(&mut Value);
    let json_cases: &[(&str, Change, &str)] = &[
        ("config.json", |c| c["model_type"] = json!("llama"), "model_type"),
        ("config.json", |c| c["tie_word_embeddings"] = json!(false), "tie_word_embeddings"),
        ("config.json", |c| c["attention_bias"] = json!(true), "attention_bias"),
        ("config.json", |c| c["use_sliding_window"] = json!(true), "use_sliding_window"),
        ("modules.json", |m| m.as_array_mut().unwrap().push(json!({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.base.modules.dense.Dense"})), "type"),
        ("modules.json", |m| m[1]["type"] = json!("sentence_transformers.base.modules.dense.Dense"), "type"),
        ("1_LogitScore/config.json", |c| c["false_token_id"] = Value::Null, "false_token_id"),
        ("1_LogitScore/config.json", |c| c["extra_token_ids"] = json!([5, 6]), "LogitScore"),
        ("1_LogitScore/config.json", |c| c["true_token_id"] = json!(904), "true_token_id"),
        ("1_LogitScore/config.json", |c| c["module_input_name"] = json!("token_embeddings"), "module_input_name"),
        ("sentence_bert_config.json", |c| c["transformer_task"] = json!("sequence-classification"), "transformer_task"),
        ("sentence_bert_config.json", |c| c["modality_config"]["message"]["format"] = json!("structured"), "modality_config"),
        ("sentence_bert_config.json", |c| c["processing_kwargs"] = json!({"chat_template": {"restore_suffix": false}}), "processing_kwargs"),
        ("config_sentence_transformers.json", |c| c["activation_fn"] = json!("torch.nn.modules.activation.Tanh"), "activation_fn"),
        ("config_sentence_transformers.json", |c| c["prompts"] = json!({"query": "Find it"}), "prompts"),
        ("tokenizer_config.json", |c| c["truncation_side"] = json!("left"), "truncation_side"),
    ];
    for (file, change, field) in json_cases {
        let dir = copy_of(FOLDER);
        edit(dir.path(), file, change);
        assert_eq!(refused_field(dir.path()), *field, "{file}");
    }
    let original = std::fs::read_to_string(copy_of(FOLDER).path().join("chat_template.jinja")).unwrap();
    let templates = [
        // The document dropped, the query trimmed, the query twice, query and document swapped.
        original.replace("{{ document_text }}", ""),
        original.replace("{{ query_text }}", "{{ query_text | trim }}"),
        original.replace("{{ query_text }}", "{{ query_text }} {{ query_text }}"),
        original.replace("<Query>: {{ query_text }}\n<Document>: {{ document_text }}", "<Document>: {{ document_text }}\n<Query>: {{ query_text }}"),
        // Fixed text that depends on the content.
        original.replace("<|im_end|>\n<|im_start|>assistant", "{% if document_text | length > 12 %} long{% endif %}<|im_end|>\n<|im_start|>assistant"),
    ];
    for template in templates {
        let dir = copy_of(FOLDER);
        std::fs::write(dir.path().join("chat_template.jinja"), &template).unwrap();
        assert_eq!(refused_field(dir.path()), "chat_template", "{template}");
    }
    let dir = copy_of(FOLDER);
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    assert_eq!(refused_field(dir.path()), "chat_template", "no template");
}
