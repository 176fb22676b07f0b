use super::*;

/// all-MiniLM-L6-v2's configuration as sentence-transformers 2.x wrote it (classic form).
fn classic(dir: &Path) {
    write(dir, "config.json", r#"{"model_type": "bert", "hidden_size": 8, "max_position_embeddings": 512, "hidden_act": "gelu", "position_embedding_type": "absolute"}"#);
    write(dir, "sentence_bert_config.json", r#"{"max_seq_length": 256, "do_lower_case": false}"#);
    write(dir, "tokenizer_config.json", r#"{"model_max_length": 512}"#);
    write(dir, "modules.json", &modules(&["Transformer", "Pooling", "Normalize"]));
    write(
        dir,
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}"#,
    );
}

/// The 6.x form: one `pooling_mode` string, no sentence_bert_config.json.
fn six(dir: &Path, mode: &str) {
    classic(dir);
    std::fs::remove_file(dir.join("sentence_bert_config.json")).unwrap();
    write(dir, "1_Pooling/config.json", &format!(r#"{{"embedding_dimension": 8, "pooling_mode": "{mode}", "include_prompt": true}}"#));
}

fn modules(kinds: &[&str]) -> String {
    let entries: Vec<String> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let path = if i == 0 { String::new() } else { format!("{i}_{kind}") };
            format!(r#"{{"idx": {i}, "name": "{i}", "path": "{path}", "type": "sentence_transformers.models.{kind}"}}"#)
        })
        .collect();
    format!("[{}]", entries.join(","))
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The file and field a refusal names.
fn refusal(dir: &Path) -> (String, &'static str, String) {
    match read_settings(dir) {
        Err(ModelError::Unsupported { path, field, found, .. }) => {
            (path.strip_prefix(dir).unwrap().display().to_string(), field, found)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn classic_form() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!(
        settings,
        ModelSettings { dimensions: 8, max_tokens: 256, pooling: Pooling::Mean, normalize: true, prompts: vec![], default_prompt: None, dense: vec![], heads: Vec::new(), rerank_template: None }
    );
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 128}"#);
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.max_tokens), (Pooling::Cls, 128));
}

#[test]
fn six_form_takes_the_tokenizer_limit_never_256() {
    let dir = tempfile::tempdir().unwrap();
    six(dir.path(), "cls");
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.max_tokens, settings.normalize), (Pooling::Cls, 512, true));
    six(dir.path(), "mean");
    assert_eq!(read_settings(dir.path()).unwrap().pooling, Pooling::Mean);
    // A tokenizer limit above the position table is capped by it, as sentence-transformers does.
    write(dir.path(), "tokenizer_config.json", r#"{"model_max_length": 8192}"#);
    assert_eq!(read_settings(dir.path()).unwrap().max_tokens, 512);
    write(dir.path(), "tokenizer_config.json", r#"{"model_max_length": 384}"#);
    assert_eq!(read_settings(dir.path()).unwrap().max_tokens, 384);
    // transformers' "no limit" sentinel, or no tokenizer_config.json: no length, refused (the old default was 256).
    write(dir.path(), "tokenizer_config.json", r#"{"model_max_length": 1000000000000000019884624838656}"#);
    assert!(matches!(read_settings(dir.path()), Err(ModelError::NoMaxLength { .. })));
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    assert!(matches!(read_settings(dir.path()), Err(ModelError::NoMaxLength { .. })));
}

#[test]
fn normalisation_is_what_modules_json_says() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    write(dir.path(), "modules.json", &modules(&["Transformer", "Pooling"]));
    assert!(!read_settings(dir.path()).unwrap().normalize);
    // Without modules.json sentence-transformers builds Transformer + mean Pooling, unnormalised.
    std::fs::remove_file(dir.path().join("modules.json")).unwrap();
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.normalize), (Pooling::Mean, false));
}

#[test]
fn prompts_are_read_sorted_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    six(dir.path(), "mean");
    write(
        dir.path(),
        "config_sentence_transformers.json",
        r#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query", "similarity_fn_name": "cosine"}"#,
    );
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!(settings.prompts, vec![("passage".into(), "passage: ".into()), ("query".into(), "query: ".into())]);
    assert_eq!(settings.default_prompt.as_deref(), Some("query"));
    write(dir.path(), "config_sentence_transformers.json", r#"{"prompts": {"query": "q"}, "default_prompt_name": "doc"}"#);
    assert_eq!(refusal(dir.path()).1, "default_prompt_name");
    write(dir.path(), "config_sentence_transformers.json", r#"{"prompts": {"query": 3}}"#);
    assert_eq!(refusal(dir.path()).1, "prompts");
}

#[test]
fn every_pooling_the_engine_cannot_compute_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["max", "weightedmean", "mean_sqrt_len_tokens", "MEAN", "last_token"] {
        six(dir.path(), mode);
        assert_eq!(refusal(dir.path()), ("1_Pooling/config.json".into(), "pooling_mode", format!("\"{mode}\"")));
    }
    classic(dir.path());
    for flag in ["max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens"] {
        write(dir.path(), "1_Pooling/config.json", &format!(r#"{{"pooling_mode_{flag}": true}}"#));
        assert_eq!(refusal(dir.path()).1, "pooling_mode_*", "{flag}");
    }
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#);
    assert_eq!(refusal(dir.path()).1, "pooling_mode_*");
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": true}"#);
    assert_eq!(refusal(dir.path()).1, "pooling_mode_*");
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode": "lasttoken", "include_prompt": false}"#);
    assert_eq!(refusal(dir.path()), ("1_Pooling/config.json".into(), "include_prompt", "false".into()));
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode_mean_tokens": false}"#);
    assert_eq!(refusal(dir.path()).1, "pooling_mode_*");
    write(dir.path(), "1_Pooling/config.json", r#"{"pooling_mode": "mean", "include_prompt": false}"#);
    assert_eq!(refusal(dir.path()), ("1_Pooling/config.json".into(), "include_prompt", "false".into()));
    write(dir.path(), "1_Pooling/config.json", r#"{"word_embedding_dimension": 16, "pooling_mode_mean_tokens": true}"#);
    assert_eq!(refusal(dir.path()).1, "word_embedding_dimension");
}

#[test]
fn modules_after_pooling_and_odd_pipelines_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    for (kinds, found) in [
        (&["Transformer", "Pooling", "Normalize", "Dense"][..], "Dense"),
        (&["Transformer", "Pooling", "LayerNorm"][..], "LayerNorm"),
        (&["Transformer", "Pooling", "Dense", "LayerNorm", "Normalize"][..], "LayerNorm"),
        (&["Transformer", "Dense", "Pooling"][..], "Transformer, Dense, Pooling"),
        (&["Transformer"][..], "Transformer"),
    ] {
        write(dir.path(), "modules.json", &modules(kinds));
        assert_eq!(refusal(dir.path()), ("modules.json".into(), "type", found.into()), "{kinds:?}");
    }
    write(dir.path(), "modules.json", r#"[{"path": "", "type": "sentence_transformers.models.Transformer"}, {"path": "../x", "type": "sentence_transformers.models.Pooling"}]"#);
    assert_eq!(refusal(dir.path()).1, "path");
}

#[test]
fn architectures_and_limits_the_engine_does_not_run_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    let config = |extra: &str| format!(r#"{{"hidden_size": 8, "max_position_embeddings": 512{extra}}}"#);
    for (extra, field) in [
        (r#", "model_type": "roberta""#, "model_type"),
        // XLM-RoBERTa's positions start after its padding index, which must be stated.
        (r#", "model_type": "xlm-roberta""#, "pad_token_id"),
        (r#", "model_type": "mpnet", "relative_attention_num_buckets": 64"#, "relative_attention_num_buckets"),
        ("", "model_type"),
        (r#", "model_type": "bert", "hidden_act": "gelu_new""#, "hidden_act"),
        (r#", "model_type": "bert", "position_embedding_type": "relative_key""#, "position_embedding_type"),
        (r#", "model_type": "modernbert", "mlp_bias": true"#, "mlp_bias"),
        (r#", "model_type": "modernbert", "hidden_activation": "silu""#, "hidden_activation"),
        (r#", "model_type": "modernbert", "rope_scaling": {"type": "linear", "factor": 2.0}"#, "rope_scaling"),
        (r#", "model_type": "qwen3", "attention_bias": true"#, "attention_bias"),
        (r#", "model_type": "qwen3", "use_sliding_window": true"#, "use_sliding_window"),
        (r#", "model_type": "qwen3", "hidden_act": "gelu""#, "hidden_act"),
        (r#", "model_type": "qwen3", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#, "rope_scaling"),
        (r#", "model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]"#, "layer_types"),
    ] {
        write(dir.path(), "config.json", &config(extra));
        assert_eq!(refusal(dir.path()).0, "config.json");
        assert_eq!(refusal(dir.path()).1, field);
    }
    classic(dir.path());
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 1024}"#);
    assert_eq!(refusal(dir.path()), ("sentence_bert_config.json".into(), "max_seq_length", "1024".into()));
    // 514 positions after an offset of 2 leave 512: one more is refused.
    write(dir.path(), "config.json", r#"{"hidden_size": 8, "max_position_embeddings": 514, "model_type": "mpnet"}"#);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 513}"#);
    assert_eq!(refusal(dir.path()).1, "max_seq_length");
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 512}"#);
    assert_eq!(read_settings(dir.path()).unwrap().max_tokens, 512);
    // ModernBERT: rotary positions from 0, its whole table.
    write(dir.path(), "config.json", r#"{"hidden_size": 8, "max_position_embeddings": 8192, "model_type": "modernbert", "hidden_activation": "gelu", "mlp_bias": false}"#);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 8192}"#);
    assert_eq!(read_settings(dir.path()).unwrap().max_tokens, 8192);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 128, "do_lower_case": true}"#);
    assert_eq!(refusal(dir.path()).1, "do_lower_case");
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": -1}"#);
    assert!(matches!(read_settings(dir.path()), Err(ModelError::Config { .. })));
}

/// Qwen3-Embedding's own files: the classic pooling flags with `pooling_mode_lasttoken`, the
/// stated length (its position table is larger), the instruction prompt and an empty one.
#[test]
fn a_qwen3_embedding_directory_reads_as_last_token_pooling_with_its_prompts() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    write(
        dir.path(),
        "config.json",
        r#"{"model_type": "qwen3", "hidden_size": 8, "max_position_embeddings": 32768, "hidden_act": "silu", "attention_bias": false, "use_sliding_window": false, "sliding_window": null, "rope_scaling": null, "rope_theta": 1000000}"#,
    );
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 8192, "do_lower_case": false}"#);
    write(
        dir.path(),
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false, "pooling_mode_weightedmean_tokens": false, "pooling_mode_lasttoken": true, "include_prompt": true}"#,
    );
    write(
        dir.path(),
        "config_sentence_transformers.json",
        r#"{"prompts": {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:", "document": ""}, "default_prompt_name": null}"#,
    );
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.pooling, settings.max_tokens, settings.normalize), (Pooling::LastToken, 8192, true));
    assert_eq!(settings.prompts[0], ("document".into(), String::new()));
    assert!(settings.prompts[1].1.ends_with("answer the query\nQuery:"), "{:?}", settings.prompts[1]);
    assert_eq!(settings.default_prompt, None);
    // The 6.x form says the same with one string.
    write(dir.path(), "1_Pooling/config.json", r#"{"embedding_dimension": 8, "pooling_mode": "lasttoken", "include_prompt": true}"#);
    assert_eq!(read_settings(dir.path()).unwrap().pooling, Pooling::LastToken);
}

/// EmbeddingGemma's layout: a Gemma 3 text config, mean pooling, two Dense modules (768 → 3072 →
/// 768 there; 8 → 12 → 6 here), Normalize, task prompts.
fn embedding_gemma(dir: &Path) {
    classic(dir);
    write(
        dir,
        "config.json",
        r#"{"model_type": "gemma3_text", "hidden_size": 8, "max_position_embeddings": 2048, "hidden_activation": "gelu_pytorch_tanh", "attention_bias": false, "use_bidirectional_attention": true, "attn_logit_softcapping": null, "final_logit_softcapping": null, "rope_scaling": null, "sliding_window": 512}"#,
    );
    write(dir, "sentence_bert_config.json", r#"{"max_seq_length": 2048, "do_lower_case": false}"#);
    write(dir, "modules.json", &modules(&["Transformer", "Pooling", "Dense", "Dense", "Normalize"]));
    let dense = |inp: u32, out: u32| {
        format!(r#"{{"in_features": {inp}, "out_features": {out}, "bias": false, "activation_function": "torch.nn.modules.linear.Identity", "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}}"#)
    };
    write(dir, "2_Dense/config.json", &dense(8, 12));
    write(dir, "2_Dense/model.safetensors", "weights");
    write(dir, "3_Dense/config.json", &dense(12, 6));
    write(dir, "3_Dense/model.safetensors", "weights");
    write(dir, "config_sentence_transformers.json", r#"{"prompts": {"query": "task: search result | query: ", "document": "title: none | text: "}, "default_prompt_name": null}"#);
}

#[test]
fn dense_modules_after_pooling_are_read_in_order_and_set_the_dimensions() {
    let dir = tempfile::tempdir().unwrap();
    embedding_gemma(dir.path());
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!(settings.dense, ["2_Dense", "3_Dense"]);
    assert_eq!((settings.dimensions, settings.max_tokens, settings.pooling, settings.normalize), (6, 2048, Pooling::Mean, true));
    assert_eq!(settings.prompts[1], ("query".into(), "task: search result | query: ".into()));
    // sentence-transformers 6.x leaves out the module names at their defaults.
    write(dir.path(), "3_Dense/config.json", r#"{"in_features": 12, "out_features": 6, "bias": true, "activation_function": "torch.nn.modules.linear.Identity"}"#);
    assert_eq!(read_settings(dir.path()).unwrap().dimensions, 6);
    // Without Normalize too.
    write(dir.path(), "modules.json", &modules(&["Transformer", "Pooling", "Dense", "Dense"]));
    assert!(!read_settings(dir.path()).unwrap().normalize);
}

/// Each Dense module the engine would not compute as sentence-transformers does is refused by
/// file and field; so is a Gemma 3 config the engine computes differently.
#[test]
fn dense_modules_and_gemma3_settings_the_engine_does_not_compute_are_refused() {
    type Edit = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, &str, Edit)> = vec![
        ("2_Dense/config.json", "activation_function", Box::new(|d| write(d, "2_Dense/config.json", r#"{"in_features": 8, "out_features": 12, "bias": false, "activation_function": "torch.nn.modules.activation.Tanh"}"#))),
        ("2_Dense/config.json", "activation_function", Box::new(|d| write(d, "2_Dense/config.json", r#"{"in_features": 8, "out_features": 12, "bias": false}"#))),
        ("3_Dense/config.json", "use_residual", Box::new(|d| write(d, "3_Dense/config.json", r#"{"in_features": 12, "out_features": 6, "activation_function": "torch.nn.modules.linear.Identity", "use_residual": true}"#))),
        ("3_Dense/config.json", "module_output_name", Box::new(|d| write(d, "3_Dense/config.json", r#"{"in_features": 12, "out_features": 6, "activation_function": "torch.nn.modules.linear.Identity", "module_output_name": "token_embeddings"}"#))),
        ("3_Dense/config.json", "in_features", Box::new(|d| write(d, "3_Dense/config.json", r#"{"in_features": 8, "out_features": 6, "activation_function": "torch.nn.modules.linear.Identity"}"#))),
        ("3_Dense/config.json", "out_features", Box::new(|d| write(d, "3_Dense/config.json", r#"{"in_features": 12, "activation_function": "torch.nn.modules.linear.Identity"}"#))),
        ("modules.json", "path", Box::new(|d| write(d, "modules.json", &modules(&["Transformer", "Pooling", "Dense"]).replace("2_Dense", "../elsewhere")))),
        ("config.json", "use_bidirectional_attention", Box::new(|d| edit_config(d, "use_bidirectional_attention", "false"))),
        ("config.json", "attn_logit_softcapping", Box::new(|d| edit_config(d, "attn_logit_softcapping", "50.0"))),
        ("config.json", "hidden_activation", Box::new(|d| edit_config(d, "hidden_activation", "\"gelu\""))),
        ("config.json", "rope_scaling", Box::new(|d| edit_config(d, "rope_scaling", r#"{"rope_type": "linear", "factor": 8.0}"#))),
    ];
    let mut wrong = Vec::new();
    for (file, field, edit) in &cases {
        let dir = tempfile::tempdir().unwrap();
        embedding_gemma(dir.path());
        edit(dir.path());
        match read_settings(dir.path()) {
            Err(ModelError::Unsupported { path, field: refused, .. }) if refused == *field && path == dir.path().join(file) => {}
            other => wrong.push(format!("{file} {field}: {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "not refused by file and field:\n{}", wrong.join("\n"));
    // A module whose weights are not a safetensors file.
    let dir = tempfile::tempdir().unwrap();
    embedding_gemma(dir.path());
    std::fs::remove_file(dir.path().join("3_Dense/model.safetensors")).unwrap();
    write(dir.path(), "3_Dense/pytorch_model.bin", "pickle");
    assert!(matches!(read_settings(dir.path()), Err(ModelError::MissingFile { name: "model.safetensors", .. })));
}

fn edit_config(dir: &Path, field: &str, value: &str) {
    let mut config: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    config[field] = serde_json::from_str(value).unwrap();
    write(dir, "config.json", &config.to_string());
}

/// nomic-embed-text's layout in transformers 5's config form: mean pooling, its task prefixes.
#[test]
fn a_nomic_bert_directory_reads_with_its_prompts_and_refuses_what_the_engine_does_not_compute() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    write(dir.path(), "config.json", r#"{"model_type": "nomic_bert", "hidden_size": 8, "max_position_embeddings": 2048, "hidden_act": "silu", "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}"#);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 2048, "do_lower_case": false}"#);
    write(dir.path(), "config_sentence_transformers.json", r#"{"prompts": {"search_query": "search_query: ", "search_document": "search_document: "}, "default_prompt_name": "search_query"}"#);
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.dimensions, settings.max_tokens, settings.pooling), (8, 2048, Pooling::Mean));
    assert_eq!(settings.default_prompt.as_deref(), Some("search_query"));
    edit_config(dir.path(), "hidden_act", "\"gelu\"");
    assert_eq!(refusal(dir.path()), ("config.json".into(), "hidden_act", "\"gelu\"".into()));
    edit_config(dir.path(), "hidden_act", "\"silu\"");
    edit_config(dir.path(), "rope_scaling", r#"{"rope_type": "dynamic", "factor": 2.0}"#);
    assert_eq!(refusal(dir.path()).1, "rope_scaling");
}

/// gte-base-en-v1.5's layout in transformers 5's config form: CLS pooling, no Normalize; the
/// rotary scaling of the remote code (`ntk`) refused by field.
#[test]
fn a_gte_directory_reads_with_cls_pooling_and_refuses_what_the_engine_does_not_compute() {
    let dir = tempfile::tempdir().unwrap();
    classic(dir.path());
    write(dir.path(), "config.json", r#"{"model_type": "gte", "hidden_size": 8, "max_position_embeddings": 8192, "hidden_act": "gelu", "type_vocab_size": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}"#);
    write(dir.path(), "modules.json", &modules(&["Transformer", "Pooling"]));
    write(dir.path(), "1_Pooling/config.json", r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}"#);
    write(dir.path(), "sentence_bert_config.json", r#"{"max_seq_length": 8192, "do_lower_case": false}"#);
    let settings = read_settings(dir.path()).unwrap();
    assert_eq!((settings.dimensions, settings.max_tokens, settings.pooling, settings.normalize), (8, 8192, Pooling::Cls, false));
    edit_config(dir.path(), "hidden_act", "\"gelu_new\"");
    assert_eq!(refusal(dir.path()), ("config.json".into(), "hidden_act", "\"gelu_new\"".into()));
    edit_config(dir.path(), "hidden_act", "\"silu\"");
    assert!(read_settings(dir.path()).is_ok(), "silu is SwiGLU");
    edit_config(dir.path(), "rope_scaling", r#"{"type": "ntk", "factor": 2.0}"#);
    assert_eq!(refusal(dir.path()).1, "rope_scaling");
    edit_config(dir.path(), "rope_scaling", "null");
    edit_config(dir.path(), "rope_parameters", r#"{"rope_type": "dynamic", "rope_theta": 500000.0, "factor": 2.0}"#);
    assert_eq!(refusal(dir.path()).1, "rope_parameters.rope_type");
}
