//! A cross-encoder's directory: as sentence-transformers' `CrossEncoder` saves it (6.x: a
//! Transformer with `transformer_task` "sequence-classification", `model_type` "CrossEncoder" and
//! `activation_fn` in `config_sentence_transformers.json`; 4.x–5.x: `config.json`'s
//! `sentence_transformers.activation_fn`; older: `sbert_ce_default_activation_function`) or as a
//! plain transformers sequence-classification checkpoint (bge-reranker-v2-m3). The engine
//! computes XLM-RoBERTa's or BERT's classification head with one label (BERT's pairs with their
//! second segment as token type 1, as its tokenizer passes them), then Sigmoid (the default for
//! one label) or nothing; anything else is refused by file and field.

use std::path::Path;

use protocol::manifest::Pooling;
use serde_json::Value;

use super::super::{ModelError, read_json};
use super::{ModelSettings, check_architecture, config_error, positive_field, read_max_tokens, read_prompts, unsupported};

pub(super) const SIGMOID: &str = "torch.nn.modules.activation.Sigmoid";
pub(super) const IDENTITY: &str = "torch.nn.modules.linear.Identity";

/// Whether the directory is a cross-encoder's: says so, or is a plain sequence-classification
/// checkpoint without a sentence-transformers pipeline.
pub(super) fn is_cross_encoder(dir: &Path) -> Result<bool, ModelError> {
    let st = read_json(&dir.join("config_sentence_transformers.json"))?;
    let sbert = read_json(&dir.join("sentence_bert_config.json"))?;
    let config = read_json(&dir.join("config.json"))?;
    let says = st.as_ref().and_then(|c| c.get("model_type")).and_then(Value::as_str) == Some("CrossEncoder")
        || sbert.as_ref().and_then(|c| c.get("transformer_task")).and_then(Value::as_str) == Some("sequence-classification");
    let classifies = config
        .as_ref()
        .and_then(|c| c.get("architectures"))
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|k| k.as_str().is_some_and(|k| k.ends_with("ForSequenceClassification"))));
    Ok(says || (classifies && !dir.join("modules.json").exists()))
}

/// A BERT pair's second segment is token type 1: the model must embed that type, and the
/// tokenizer pass the types (transformers' `model_input_names`, where stated).
fn check_bert_pairs(dir: &Path, config_path: &Path, config: &Value) -> Result<(), ModelError> {
    let types = config.get("type_vocab_size").and_then(Value::as_u64).unwrap_or(2);
    if types < 2 {
        return Err(unsupported(config_path, "type_vocab_size", types, "a BERT pair's second segment is token type 1"));
    }
    let tokenizer_path = dir.join("tokenizer_config.json");
    let stated = read_json(&tokenizer_path)?.and_then(|t| t.get("model_input_names").cloned());
    if let Some(names) = stated.filter(|n| !n.as_array().is_some_and(|a| a.iter().any(|x| x.as_str() == Some("token_type_ids")))) {
        return Err(unsupported(&tokenizer_path, "model_input_names", names, "the engine embeds a BERT pair's token types, which this tokenizer does not pass"));
    }
    Ok(())
}

pub(super) fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let offset = check_architecture(&config_path, &config)?;
    match config.get("model_type").and_then(Value::as_str) {
        Some("xlm-roberta") => {}
        Some("bert") => check_bert_pairs(dir, &config_path, &config)?,
        kind => {
            return Err(unsupported(&config_path, "model_type", kind.unwrap_or("(absent)"), "the engine scores pairs with XLM-RoBERTa's or BERT's head"));
        }
    }
    let labels = match (config.get("id2label").and_then(Value::as_object), config.get("num_labels").and_then(Value::as_u64)) {
        (Some(labels), _) => labels.len() as u64,
        (None, Some(n)) => n,
        (None, None) => 2,
    };
    if labels != 1 {
        return Err(unsupported(&config_path, "id2label", labels, "a relevance score is one label"));
    }
    let dimensions = positive_field(&config_path, &config, "hidden_size")?
        .ok_or_else(|| config_error(&config_path, "no \"hidden_size\"".into()))?;
    let table = positive_field(&config_path, &config, "max_position_embeddings")?.unwrap_or(super::BERT_DEFAULT_POSITIONS);
    let positions = table.checked_sub(offset).filter(|&p| p > 0).ok_or_else(|| {
        unsupported(&config_path, "max_position_embeddings", table, "no room after the architecture's position offset")
    })?;

    let modules_path = dir.join("modules.json");
    if let Some(modules) = read_json(&modules_path)? {
        let kinds: Vec<&str> = modules.as_array().map(Vec::as_slice).unwrap_or_default().iter().map(|m| m.get("type").and_then(Value::as_str).unwrap_or("")).collect();
        if !matches!(kinds.as_slice(), [kind] if kind.rsplit('.').next() == Some("Transformer")) {
            return Err(unsupported(&modules_path, "type", kinds.join(", "), "a cross-encoder is one Transformer"));
        }
    }
    let sbert_path = dir.join("sentence_bert_config.json");
    let sbert = read_json(&sbert_path)?;
    if let Some(task) = sbert.as_ref().and_then(|s| s.get("transformer_task")).filter(|t| t.as_str() != Some("sequence-classification")) {
        return Err(unsupported(&sbert_path, "transformer_task", task, "a cross-encoder classifies the pair"));
    }
    let st_path = dir.join("config_sentence_transformers.json");
    let st = read_json(&st_path)?;
    let stated = [
        (&st_path, st.as_ref().and_then(|c| c.get("activation_fn"))),
        (&config_path, config.get("sentence_transformers").and_then(|c| c.get("activation_fn"))),
        (&config_path, config.get("sbert_ce_default_activation_function")),
    ];
    let sigmoid = match stated.into_iter().find_map(|(path, value)| value.filter(|v| !v.is_null()).map(|v| (path, v))) {
        None => true,
        Some((_, value)) if value.as_str() == Some(SIGMOID) => true,
        Some((_, value)) if value.as_str() == Some(IDENTITY) => false,
        Some((path, value)) => return Err(unsupported(path, "activation_fn", value, "the engine applies Sigmoid or nothing to the logit")),
    };
    let max_tokens = read_max_tokens(dir, sbert.as_ref(), positions)?;
    let (prompts, default_prompt) = read_prompts(&st_path)?;
    Ok(ModelSettings { dimensions, max_tokens, pooling: Pooling::Rerank { sigmoid }, normalize: false, prompts, default_prompt, dense: Vec::new(), heads: Vec::new(), rerank_template: None })
}

#[cfg(test)]
mod tests;
