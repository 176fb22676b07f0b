//! A SPLADE sparse encoder's directory, as sentence-transformers' `SparseEncoder` saves it: a
//! Transformer over a masked-language model (`MLMTransformer` in 4.x–5.x, `Transformer` with
//! `transformer_task` "fill-mask" in 6.x) at the root, then `SpladePooling`. The engine computes
//! BERT's masked-language-model head and SpladePooling "max" over `log(1 + ReLU(·))`; anything
//! else is refused by file and field. The manifest's dimensions are the vocabulary's.

use std::path::Path;

use protocol::manifest::Pooling;
use protocol::records::MAX_SPARSE_DIMENSIONS;
use serde_json::Value;

use super::super::{ModelError, read_json};
use super::{ModelSettings, check_architecture, config_error, module_kinds, positive_field, read_max_tokens, read_prompts, unsupported};

/// Whether modules.json names a `SpladePooling`: the directory is a sparse encoder's.
pub(super) fn is_sparse_encoder(dir: &Path) -> Result<bool, ModelError> {
    let Some(modules) = read_json(&dir.join("modules.json"))? else { return Ok(false) };
    Ok(module_kinds(&modules).iter().any(|(kind, _)| *kind == "SpladePooling"))
}

pub(super) fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let offset = check_architecture(&config_path, &config)?;
    if let Some(kind) = config.get("model_type").and_then(Value::as_str).filter(|&k| k != "bert") {
        return Err(unsupported(&config_path, "model_type", kind, "the engine computes BERT's masked-language-model head only"));
    }
    let vocabulary = positive_field(&config_path, &config, "vocab_size")?
        .ok_or_else(|| config_error(&config_path, "no \"vocab_size\"".into()))?;
    if vocabulary as usize > MAX_SPARSE_DIMENSIONS {
        return Err(unsupported(&config_path, "vocab_size", vocabulary, "above the largest vocabulary a sparse vector indexes"));
    }
    let table = positive_field(&config_path, &config, "max_position_embeddings")?.unwrap_or(super::BERT_DEFAULT_POSITIONS);
    let positions = table.saturating_sub(offset);

    let modules_path = dir.join("modules.json");
    let modules = read_json(&modules_path)?.unwrap_or(Value::Null);
    let pooling_dir = match module_kinds(&modules).as_slice() {
        [("Transformer" | "MLMTransformer", ""), ("SpladePooling", pooling)] if !pooling.is_empty() && !pooling.contains("..") && !pooling.starts_with('/') => {
            (*pooling).to_owned()
        }
        kinds => {
            let found = kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ");
            return Err(unsupported(&modules_path, "type", found, "a sparse encoder must be Transformer (at the root), SpladePooling (in its own folder)"));
        }
    };
    let sbert_path = dir.join("sentence_bert_config.json");
    let sbert = read_json(&sbert_path)?;
    if let Some(sbert) = &sbert {
        if let Some(task) = sbert.get("transformer_task").filter(|t| t.as_str() != Some("fill-mask")) {
            return Err(unsupported(&sbert_path, "transformer_task", task, "SPLADE pools a masked-language model's logits"));
        }
        if sbert.get("do_lower_case").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(&sbert_path, "do_lower_case", true, "the engine tokenizes the text as given"));
        }
    }
    let pooling_path = dir.join(&pooling_dir).join("config.json");
    let pooling = read_json(&pooling_path)?.unwrap_or(Value::Null);
    let stated = |field: &str| pooling.get(field).filter(|v| !v.is_null());
    if let Some(strategy) = stated("pooling_strategy").filter(|s| s.as_str() != Some("max")) {
        return Err(unsupported(&pooling_path, "pooling_strategy", strategy, "the engine pools SPLADE weights by their maximum"));
    }
    if let Some(activation) = stated("activation_function").filter(|a| a.as_str() != Some("relu")) {
        return Err(unsupported(&pooling_path, "activation_function", activation, "the engine computes log(1 + ReLU(logit))"));
    }
    for field in ["embedding_dimension", "word_embedding_dimension"] {
        if let Some(dim) = positive_field(&pooling_path, &pooling, field)?.filter(|&d| d != vocabulary) {
            return Err(unsupported(&pooling_path, field, dim, "differs from config.json vocab_size"));
        }
    }
    let max_tokens = read_max_tokens(dir, sbert.as_ref(), positions)?;
    let (prompts, default_prompt) = read_prompts(&dir.join("config_sentence_transformers.json"))?;
    Ok(ModelSettings { dimensions: vocabulary, max_tokens, pooling: Pooling::Splade, normalize: false, prompts, default_prompt, dense: Vec::new(), heads: Vec::new(), rerank_template: None })
}

#[cfg(test)]
mod tests;
