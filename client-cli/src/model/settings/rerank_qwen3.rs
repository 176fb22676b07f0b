//! A decoder reranker's directory (Qwen3-Reranker), as sentence-transformers 6.2 saves a
//! `CrossEncoder` over a `Qwen3ForCausalLM`: a Transformer with `transformer_task`
//! "text-generation" whose pairs become `query` / `document` chat messages (the "message" modality,
//! "flat" format), then `LogitScore` over two token ids ("yes", "no"); the score is the last
//! position's logit difference, through Sigmoid by default. The chat template is rendered here,
//! at onboarding, and reduced to fixed text around the instruction, the query and the document
//! ([`chat_template`]); the enclave only concatenates and tokenizes. The lm_head must be tied to
//! the word embeddings (Qwen3-Reranker-0.6B's config): the two rows the score reads are then rows
//! of the sealed `embed_tokens`, and nothing else of the head is sealed. Refused by file and
//! field: another body than Qwen3, an untied head, a pipeline other than Transformer + LogitScore,
//! a score over one token or another input, a template that does not reduce to that shape, named
//! prompts, and everything the Qwen3 body refuses.

use std::path::Path;

use protocol::manifest::{Pooling, RerankTemplate};
use serde_json::Value;

use super::super::{ModelError, read_json};
use super::rerank::{IDENTITY, SIGMOID};
use super::{ModelSettings, check_architecture, config_error, module_folder, module_kinds, positive_field, read_max_tokens, unsupported};

mod chat_template;

const CAUSAL_LOGITS: &str = "causal_logits";

/// Whether the directory is a decoder reranker's: modules.json names a `LogitScore`, or a
/// `CrossEncoder` (config_sentence_transformers.json) is a text-generation Transformer or a
/// `*ForCausalLM` checkpoint.
pub(super) fn is_causal_reranker(dir: &Path) -> Result<bool, ModelError> {
    if let Some(modules) = read_json(&dir.join("modules.json"))?
        && module_kinds(&modules).iter().any(|(kind, _)| *kind == "LogitScore")
    {
        return Ok(true);
    }
    let cross = read_json(&dir.join("config_sentence_transformers.json"))?
        .is_some_and(|c| c.get("model_type").and_then(Value::as_str) == Some("CrossEncoder"));
    let generates = read_json(&dir.join("sentence_bert_config.json"))?
        .is_some_and(|c| c.get("transformer_task").and_then(Value::as_str) == Some("text-generation"));
    let causal = read_json(&dir.join("config.json"))?
        .and_then(|c| c.get("architectures").and_then(Value::as_array).cloned())
        .is_some_and(|a| a.iter().any(|k| k.as_str().is_some_and(|k| k.ends_with("ForCausalLM"))));
    Ok(cross && (generates || causal))
}

pub(super) fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let kind = config.get("model_type").and_then(Value::as_str);
    if kind != Some("qwen3") {
        return Err(unsupported(&config_path, "model_type", kind.unwrap_or("(absent)"), "the engine scores yes/no with Qwen3's body only"));
    }
    check_architecture(&config_path, &config)?;
    // transformers' Qwen3Config does not tie by default: only a config that says so is tied.
    if config.get("tie_word_embeddings") != Some(&Value::Bool(true)) {
        let found = config.get("tie_word_embeddings").map_or("(absent: untied)".into(), Value::to_string);
        return Err(unsupported(&config_path, "tie_word_embeddings", found, "the score reads the yes and no rows of the tied word embeddings; an untied lm_head is not sealed"));
    }
    let dimensions = positive_field(&config_path, &config, "hidden_size")?.ok_or_else(|| config_error(&config_path, "no \"hidden_size\"".into()))?;
    let vocabulary = positive_field(&config_path, &config, "vocab_size")?.ok_or_else(|| config_error(&config_path, "no \"vocab_size\"".into()))?;
    let positions = positive_field(&config_path, &config, "max_position_embeddings")?.unwrap_or(32_768);

    let modules_path = dir.join("modules.json");
    let modules = read_json(&modules_path)?.unwrap_or(Value::Null);
    let score_folder = match module_kinds(&modules).as_slice() {
        [("Transformer", ""), ("LogitScore", folder)] => module_folder(&modules_path, "LogitScore", folder)?,
        kinds => {
            let found = if kinds.is_empty() { "(absent)".to_owned() } else { kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ") };
            return Err(unsupported(&modules_path, "type", found, "a decoder reranker is Transformer (at the root), then LogitScore"));
        }
    };
    let (yes, no) = read_logit_score(&dir.join(&score_folder).join("config.json"), vocabulary)?;

    let sbert_path = dir.join("sentence_bert_config.json");
    let sbert = read_json(&sbert_path)?.unwrap_or(Value::Null);
    check_transformer(&sbert_path, &sbert)?;
    let st_path = dir.join("config_sentence_transformers.json");
    let sigmoid = read_activation(&st_path)?;
    check_tokenizer_config(&dir.join("tokenizer_config.json"))?;
    let (template_path, source) = chat_template::find(dir)?;
    let pieces = chat_template::reduce(&template_path, &source)?;
    let max_tokens = read_max_tokens(dir, Some(&sbert), positions)?;
    Ok(ModelSettings {
        dimensions,
        max_tokens,
        pooling: Pooling::RerankYesNo { sigmoid },
        normalize: false,
        prompts: Vec::new(),
        default_prompt: None,
        dense: Vec::new(),
        heads: Vec::new(),
        rerank_template: Some(RerankTemplate { yes, no, ..pieces }),
    })
}

/// LogitScore's config: two token ids within the vocabulary, read from the causal logits.
fn read_logit_score(path: &Path, vocabulary: u32) -> Result<(u32, u32), ModelError> {
    let json = read_json(path)?.ok_or_else(|| config_error(path, "missing: LogitScore's config".into()))?;
    let object = json.as_object().ok_or_else(|| config_error(path, "not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !matches!(k.as_str(), "true_token_id" | "false_token_id" | "module_input_name")) {
        return Err(unsupported(path, "LogitScore", format!("{key}: {value}"), "LogitScore scores two token ids, nothing else"));
    }
    if let Some(input) = json.get("module_input_name").filter(|v| v.as_str() != Some(CAUSAL_LOGITS)) {
        return Err(unsupported(path, "module_input_name", input, "the score reads the language model's logits"));
    }
    let token = |field: &'static str| match json.get(field) {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|id| id < u64::from(vocabulary)) => Ok(n.as_u64().unwrap_or_default() as u32),
        None | Some(Value::Null) => Err(unsupported(path, field, "null", "the engine scores the yes logit less the no logit: two tokens")),
        Some(other) => Err(unsupported(path, field, other, "a token id within config.json's vocab_size")),
    };
    let (yes, no) = (token("true_token_id")?, token("false_token_id")?);
    if yes == no {
        return Err(unsupported(path, "false_token_id", no, "the same token as true_token_id"));
    }
    Ok((yes, no))
}

/// The Transformer's config: text generation, pairs as flat chat messages, nothing that changes
/// the tokens (lower-casing, other kwargs to the template or the tokenizer, per-task lengths).
fn check_transformer(path: &Path, sbert: &Value) -> Result<(), ModelError> {
    let task = sbert.get("transformer_task").and_then(Value::as_str);
    if task != Some("text-generation") {
        return Err(unsupported(path, "transformer_task", task.unwrap_or("(absent)"), "a decoder reranker's Transformer generates text"));
    }
    let format = sbert.pointer("/modality_config/message/format");
    if format.and_then(Value::as_str) != Some("flat") {
        let found = format.map_or("(no message modality)".into(), Value::to_string);
        return Err(unsupported(path, "modality_config", found, "pairs reach the chat template as flat query/document messages"));
    }
    if let Some(name) = sbert.get("module_output_name").filter(|v| v.as_str() != Some(CAUSAL_LOGITS)) {
        return Err(unsupported(path, "module_output_name", name, "LogitScore reads causal_logits"));
    }
    if sbert.get("do_lower_case").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(path, "do_lower_case", true, "the engine tokenizes the text as given"));
    }
    for field in ["processing_kwargs", "query_length", "document_length", "query_expansion"] {
        if let Some(value) = sbert.get(field).filter(|v| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty())) {
            return Err(unsupported(path, field, value, "changes how a pair is rendered or cut, which the engine does not"));
        }
    }
    Ok(())
}

/// `activation_fn`: Sigmoid (also when unstated, `CrossEncoder`'s default for one score) or
/// Identity; named prompts (a system message, so another instruction) are not onboarded.
fn read_activation(path: &Path) -> Result<bool, ModelError> {
    let Some(st) = read_json(path)? else { return Ok(true) };
    if let Some(prompts) = st.get("prompts").filter(|p| p.as_object().is_some_and(|o| !o.is_empty())) {
        return Err(unsupported(path, "prompts", prompts, "a pair's instruction is the template's default; named prompts are not onboarded"));
    }
    if let Some(name) = st.get("default_prompt_name").filter(|v| !v.is_null()) {
        return Err(unsupported(path, "default_prompt_name", name, "a pair's instruction is the template's default; named prompts are not onboarded"));
    }
    match st.get("activation_fn").filter(|v| !v.is_null()) {
        None => Ok(true),
        Some(v) if v.as_str() == Some(SIGMOID) => Ok(true),
        Some(v) if v.as_str() == Some(IDENTITY) => Ok(false),
        Some(other) => Err(unsupported(path, "activation_fn", other, "the engine applies Sigmoid or nothing to the logit difference")),
    }
}

/// sentence-transformers cuts the rendered pair on the right (then writes the template's tail
/// back over its last tokens): a tokenizer that truncates on the left is refused.
fn check_tokenizer_config(path: &Path) -> Result<(), ModelError> {
    if let Some(side) = read_json(path)?.and_then(|t| t.get("truncation_side").cloned()).filter(|s| s.as_str() != Some("right")) {
        return Err(unsupported(path, "truncation_side", side, "the engine cuts a pair on the right, as sentence-transformers does by default"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
