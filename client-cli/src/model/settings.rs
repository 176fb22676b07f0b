//! How a model directory says it embeds, in either sentence-transformers configuration form
//! (docs/models.md): the classic one (`pooling_mode_*` flags, `max_seq_length` in
//! `sentence_bert_config.json`) and the 6.x one (`"pooling_mode": "mean"`, the length from the
//! tokenizer's `model_max_length` when `sentence_bert_config.json` is absent). Anything the
//! enclave's engine would not compute exactly as sentence-transformers does is refused here, by
//! file and field: a manifest must never describe a model other than the one it names.

use std::path::Path;

use protocol::manifest::{Pooling, RerankTemplate};
use protocol::records::MAX_DIMENSIONS;
use serde_json::{Map, Value};

use super::{ModelError, read_json};

/// What `tokenizer_config.json` holds when the tokenizer has no limit of its own
/// (transformers' `VERY_LARGE_INTEGER`, int(1e30)), which JSON carries as a float.
const NO_TOKENIZER_LIMIT: f64 = 1e20;
/// transformers' `BertConfig` default when `config.json` does not state it.
const BERT_DEFAULT_POSITIONS: u32 = 512;
/// The `model_type`s the enclave's engine runs (enclave-worker's `inference::arch`), with the rows
/// of the position table before the first real token. A type is added here only once the engine
/// computes it exactly.
const ARCHITECTURES: [(&str, PositionOffset); 8] = [
    ("bert", PositionOffset::Zero),
    // Positions start at padding_idx + 1, the padding index being the config's pad_token_id.
    ("xlm-roberta", PositionOffset::AfterPadding),
    // MPNet's padding index is 1 whatever pad_token_id says: positions start at 2.
    ("mpnet", PositionOffset::Fixed(2)),
    // Rotary positions: the table's length is the model's reach, from position 0.
    ("modernbert", PositionOffset::Zero),
    // A causal decoder with rotary positions from 0 (Qwen3-Embedding).
    ("qwen3", PositionOffset::Zero),
    // Gemma 3's text body with bidirectional attention (EmbeddingGemma), rotary positions from 0.
    ("gemma3_text", PositionOffset::Zero),
    // NomicBERT (nomic-embed-text), rotary positions from 0.
    ("nomic_bert", PositionOffset::Zero),
    // GTE v1.5 / mGTE (transformers' `gte`), rotary positions from 0.
    ("gte", PositionOffset::Zero),
];

/// ModernBERT settings the engine computes only one way (`enclave-worker/src/inference/
/// modernbert.rs` checks the whole config again when it loads the model).
const MODERNBERT_FIXED: [(&str, &str); 4] =
    [("hidden_activation", "\"gelu\""), ("attention_bias", "false"), ("mlp_bias", "false"), ("norm_bias", "false")];

/// Qwen3 settings the engine computes only one way (`enclave-worker/src/inference/qwen3.rs`
/// checks the whole config again when it loads the model).
const QWEN3_FIXED: [(&str, &str); 3] = [("hidden_act", "\"silu\""), ("attention_bias", "false"), ("use_sliding_window", "false")];

/// Gemma 3 settings the engine computes only one way (`enclave-worker/src/inference/gemma3.rs`
/// checks the whole config again when it loads the model).
const GEMMA3_FIXED: [(&str, &str); 5] = [
    ("hidden_activation", "\"gelu_pytorch_tanh\""),
    ("attention_bias", "false"),
    ("use_bidirectional_attention", "true"),
    ("attn_logit_softcapping", "null"),
    ("final_logit_softcapping", "null"),
];

/// sentence-transformers' name of the identity activation, the only one a Dense module may have.
const DENSE_IDENTITY: &str = "torch.nn.modules.linear.Identity";
/// The pooled vector's key in sentence-transformers' features.
const SENTENCE_EMBEDDING: &str = "sentence_embedding";

#[derive(Debug, Clone, Copy)]
enum PositionOffset {
    Zero,
    AfterPadding,
    Fixed(u32),
}

/// MPNet's relative attention buckets: transformers computes 32 whatever the config says, and so
/// does the engine; another count would be silently different.
const MPNET_BUCKETS: u64 = 32;

/// How the model embeds, as its directory describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSettings {
    pub dimensions: u32,
    /// The model's own maximum sequence length, `[CLS]` and `[SEP]` included.
    pub max_tokens: u32,
    pub pooling: Pooling,
    /// Whether the pipeline ends with a `Normalize` module (modules.json).
    pub normalize: bool,
    /// `config_sentence_transformers.json` `prompts`, sorted by name.
    pub prompts: Vec<(String, String)>,
    /// `config_sentence_transformers.json` `default_prompt_name`, one of `prompts`.
    pub default_prompt: Option<String>,
    /// The folders of the `Dense` modules after the pooling, in pipeline order (modules.json).
    pub dense: Vec<String>,
    /// bge-m3's lexical and ColBERT heads, converted to the safetensors files sealed for them.
    pub heads: Vec<bgem3::Head>,
    /// A decoder reranker's pair template and score tokens (`Pooling::RerankYesNo`).
    pub rerank_template: Option<RerankTemplate>,
}

impl ModelSettings {
    /// The manifest's `outputs`: each head's kind and dimensions, sorted by kind name.
    pub fn outputs(&self) -> Vec<(protocol::envelope::OutputKind, u32)> {
        let mut outputs: Vec<_> = self.heads.iter().map(|h| (h.output, h.dimensions)).collect();
        outputs.sort_by_key(|(kind, _)| kind.as_str());
        outputs
    }
}

fn unsupported(path: &Path, field: &'static str, found: impl ToString, reason: &'static str) -> ModelError {
    ModelError::Unsupported { path: path.to_owned(), field, found: found.to_string(), reason }
}

fn config_error(path: &Path, message: String) -> ModelError {
    ModelError::Config { path: path.to_owned(), message }
}

/// A positive integer field that fits in u32, if present.
pub(super) fn positive_field(path: &Path, json: &Value, field: &str) -> Result<Option<u32>, ModelError> {
    match json.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .filter(|&v| v > 0)
            .and_then(|v| u32::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| config_error(path, format!("\"{field}\" is not a positive integer"))),
    }
}

fn object<'a>(path: &Path, json: &'a Value) -> Result<&'a Map<String, Value>, ModelError> {
    json.as_object().ok_or_else(|| config_error(path, "not a JSON object".into()))
}

/// Reads dimensions, sequence length, pooling, normalisation and prompts from a model directory.
pub fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    if !dir.join("model.safetensors").is_file() && dir.join("pytorch_model.bin").is_file() {
        // Weights as a torch pickle only (as the published bge-m3 once shipped them).
        let found = "a torch pickle of the weights, no model.safetensors";
        return Err(unsupported(&dir.join("pytorch_model.bin"), "(file)", found, "the enclave loads model.safetensors; save the model with safe_serialization"));
    }
    if sparse::is_sparse_encoder(dir)? {
        return sparse::read_settings(dir);
    }
    if rerank_qwen3::is_causal_reranker(dir)? {
        return rerank_qwen3::read_settings(dir);
    }
    if rerank::is_cross_encoder(dir)? {
        return rerank::read_settings(dir);
    }
    if multivector::is_multi_vector_encoder(dir)? {
        return multivector::read_settings(dir);
    }
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let dimensions = positive_field(&config_path, &config, "hidden_size")?
        .ok_or_else(|| config_error(&config_path, "no \"hidden_size\"".into()))?;
    if dimensions as usize > MAX_DIMENSIONS {
        return Err(config_error(&config_path, format!("\"hidden_size\" {dimensions} exceeds {MAX_DIMENSIONS}")));
    }
    let offset = check_architecture(&config_path, &config)?;
    let table = positive_field(&config_path, &config, "max_position_embeddings")?.unwrap_or(BERT_DEFAULT_POSITIONS);
    let positions = table.checked_sub(offset).filter(|&p| p > 0).ok_or_else(|| {
        unsupported(&config_path, "max_position_embeddings", table, "no room after the architecture's position offset")
    })?;

    let Modules { pooling: pooling_dir, dense, normalize } = read_modules(dir)?;
    let sbert_path = dir.join("sentence_bert_config.json");
    let sbert = read_json(&sbert_path)?;
    if let Some(sbert) = &sbert {
        // sentence-transformers lowercases in Python before the tokenizer, which the engine does not.
        if object(&sbert_path, sbert)?.get("do_lower_case").and_then(Value::as_bool) == Some(true) {
            return Err(unsupported(&sbert_path, "do_lower_case", true, "the engine tokenizes the text as given"));
        }
    }
    let max_tokens = read_max_tokens(dir, sbert.as_ref(), positions)?;
    let pooling = read_pooling(&dir.join(&pooling_dir).join("config.json"), dimensions)?;
    // The vectors are as wide as the last Dense module's output.
    let mut dimensions = dimensions;
    for folder in &dense {
        dimensions = read_dense(&dir.join(folder), dimensions)?;
    }
    let (prompts, default_prompt) = read_prompts(&dir.join("config_sentence_transformers.json"))?;
    let settings = ModelSettings { dimensions, max_tokens, pooling, normalize, prompts, default_prompt, dense, heads: Vec::new(), rerank_template: None };
    if bgem3::has_heads(dir) { bgem3::add_heads(dir, settings) } else { Ok(settings) }
}

/// The engine runs the [`ARCHITECTURES`]: the BERT family with absolute positions and erf GELU,
/// ModernBERT with its rotary positions, GeGLU and no biases, Qwen3 with SwiGLU, full causal
/// attention and no biases, Gemma 3 bidirectional with tanh GeGLU; anything else is refused. Returns
/// the architecture's position offset.
fn check_architecture(path: &Path, config: &Value) -> Result<u32, ModelError> {
    let (kind, offset) = match config.get("model_type").and_then(Value::as_str) {
        Some(kind) => match ARCHITECTURES.iter().find(|(known, _)| *known == kind) {
            Some((_, offset)) => (kind, *offset),
            None => return Err(unsupported(path, "model_type", kind, "the engine does not run this architecture")),
        },
        None => return Err(unsupported(path, "model_type", "(absent)", "the architecture must be stated")),
    };
    let offset = match offset {
        PositionOffset::Zero => 0,
        PositionOffset::Fixed(rows) => rows,
        PositionOffset::AfterPadding => match config.get("pad_token_id").and_then(Value::as_u64) {
            Some(pad) if pad < 1024 => pad as u32 + 1,
            _ => return Err(unsupported(path, "pad_token_id", config.get("pad_token_id").map_or("(absent)".into(), Value::to_string), "positions start after the padding index, which must be stated")),
        },
    };
    if kind == "qwen3" {
        for (field, only) in QWEN3_FIXED {
            if let Some(found) = config.get(field).filter(|v| v.to_string() != only) {
                return Err(unsupported(path, field, found, "the engine computes Qwen3 with SwiGLU, without biases or sliding windows"));
            }
        }
        if let Some(scaling) = config.get("rope_scaling").filter(|v| !v.is_null()) {
            return Err(unsupported(path, "rope_scaling", scaling, "the engine computes unscaled rotary positions"));
        }
        if let Some(kind) = config.get("layer_types").and_then(Value::as_array).and_then(|t| t.iter().find(|k| k.as_str() != Some("full_attention"))) {
            return Err(unsupported(path, "layer_types", kind, "the engine computes Qwen3 with full attention in every layer"));
        }
        return Ok(offset);
    }
    if kind == "gemma3_text" {
        for (field, only) in GEMMA3_FIXED {
            if let Some(found) = config.get(field).filter(|v| v.to_string() != only) {
                return Err(unsupported(path, field, found, "the engine computes Gemma 3 as EmbeddingGemma: bidirectional, tanh GeGLU, no biases or soft-capping"));
            }
        }
        if config.get("use_bidirectional_attention").is_none() {
            return Err(unsupported(path, "use_bidirectional_attention", "(absent: causal)", "the engine computes Gemma 3 with bidirectional attention"));
        }
        if let Some(scaling) = config.get("rope_scaling").filter(|v| !v.is_null()) {
            return Err(unsupported(path, "rope_scaling", scaling, "the engine computes unscaled rotary positions"));
        }
        return Ok(offset);
    }
    if kind == "nomic_bert" {
        if let Some(act) = config.get("hidden_act").filter(|v| v.as_str() != Some("silu")) {
            return Err(unsupported(path, "hidden_act", act, "the engine computes NomicBERT with SwiGLU (silu)"));
        }
        if let Some(scaling) = config.get("rope_scaling").filter(|v| !v.is_null()) {
            return Err(unsupported(path, "rope_scaling", scaling, "the engine computes unscaled rotary positions"));
        }
        return Ok(offset);
    }
    if kind == "gte" {
        if let Some(act) = config.get("hidden_act").filter(|v| v.as_str() != Some("gelu") && v.as_str() != Some("silu")) {
            return Err(unsupported(path, "hidden_act", act, "the engine computes GTE's gated feed-forward with gelu or silu"));
        }
        if let Some(scaling) = config.get("rope_scaling").filter(|v| !v.is_null()) {
            return Err(unsupported(path, "rope_scaling", scaling, "the engine computes unscaled rotary positions"));
        }
        if let Some(kind) = config.pointer("/rope_parameters/rope_type").filter(|v| v.as_str() != Some("default")) {
            return Err(unsupported(path, "rope_parameters.rope_type", kind, "the engine computes unscaled rotary positions"));
        }
        return Ok(offset);
    }
    if kind == "modernbert" {
        for (field, only) in MODERNBERT_FIXED {
            if let Some(found) = config.get(field).filter(|v| v.to_string() != only) {
                return Err(unsupported(path, field, found, "the engine computes ModernBERT with erf GELU and without biases"));
            }
        }
        if let Some(scaling) = config.get("rope_scaling").filter(|v| !v.is_null()) {
            return Err(unsupported(path, "rope_scaling", scaling, "the engine computes unscaled rotary positions"));
        }
        return Ok(offset);
    }
    if kind == "mpnet"
        && let Some(buckets) = config.get("relative_attention_num_buckets").filter(|b| b.as_u64() != Some(MPNET_BUCKETS))
    {
        return Err(unsupported(path, "relative_attention_num_buckets", buckets, "the engine computes MPNet's 32 buckets"));
    }
    if let Some(kind) = config.get("position_embedding_type").and_then(Value::as_str).filter(|&k| k != "absolute") {
        return Err(unsupported(path, "position_embedding_type", kind, "the engine implements absolute positions"));
    }
    if let Some(act) = config.get("hidden_act").and_then(Value::as_str).filter(|&a| a != "gelu") {
        return Err(unsupported(path, "hidden_act", act, "the engine implements erf GELU"));
    }
    Ok(offset)
}

/// The pipeline after the Transformer, as modules.json lists it.
struct Modules {
    /// The Pooling module's folder.
    pooling: String,
    /// The Dense modules' folders, in order.
    dense: Vec<String>,
    normalize: bool,
}

/// A module's own folder inside the model directory.
fn module_folder(path: &Path, kind: &'static str, folder: &str) -> Result<String, ModelError> {
    if folder.is_empty() || folder.contains("..") || folder.starts_with('/') || folder.contains('\\') {
        return Err(unsupported(path, "path", folder, match kind {
            "Dense" => "each Dense module needs its own folder",
            _ => "the Pooling module needs its own folder",
        }));
    }
    Ok(folder.to_owned())
}

/// Each module of modules.json as (its type's last path segment, its folder); none when the file
/// is not an array.
pub(super) fn module_kinds(modules: &Value) -> Vec<(&str, &str)> {
    let list = modules.as_array().map(Vec::as_slice).unwrap_or_default();
    list.iter()
        .map(|m| {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
            (kind.rsplit('.').next().unwrap_or(kind), m.get("path").and_then(Value::as_str).unwrap_or(""))
        })
        .collect()
}

/// modules.json: a Transformer, one Pooling, any number of Dense modules, optionally Normalize,
/// in that order. Without modules.json, sentence-transformers builds Transformer + mean Pooling
/// and does not normalise.
fn read_modules(dir: &Path) -> Result<Modules, ModelError> {
    let path = dir.join("modules.json");
    let Some(modules) = read_json(&path)? else { return Ok(Modules { pooling: "1_Pooling".into(), dense: Vec::new(), normalize: false }) };
    if !modules.is_array() {
        return Err(config_error(&path, "not a JSON array".into()));
    }
    let kinds = module_kinds(&modules);
    match kinds.as_slice() {
        [("Transformer", ""), ("Pooling", pooling), rest @ ..] => {
            let dense_count = rest.iter().take_while(|(k, _)| *k == "Dense").count();
            let normalize = match &rest[dense_count..] {
                [] => false,
                [("Normalize", _)] => true,
                after => {
                    let (other, _) = after.iter().find(|(k, _)| *k != "Normalize").unwrap_or(&after[0]);
                    return Err(unsupported(&path, "type", other, "only Dense modules, then Normalize, may follow Pooling (no LayerNorm, ...)"));
                }
            };
            if dense_count > protocol::manifest::MAX_DENSE {
                return Err(unsupported(&path, "type", format!("{dense_count} Dense modules"), "at most 8 Dense modules"));
            }
            let dense = rest[..dense_count].iter().map(|(_, folder)| module_folder(&path, "Dense", folder)).collect::<Result<_, _>>()?;
            Ok(Modules { pooling: module_folder(&path, "Pooling", pooling)?, dense, normalize })
        }
        _ => Err(unsupported(
            &path,
            "type",
            kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", "),
            "the pipeline must be Transformer (at the root), Pooling[, Normalize]",
        )),
    }
}

/// The model's own maximum length: `max_seq_length` if stated, else the tokenizer's
/// `model_max_length` capped by the position table (what sentence-transformers does). Never a default.
fn read_max_tokens(dir: &Path, sbert: Option<&Value>, positions: u32) -> Result<u32, ModelError> {
    let sbert_path = dir.join("sentence_bert_config.json");
    if let Some(stated) = sbert.map(|s| positive_field(&sbert_path, s, "max_seq_length")).transpose()?.flatten() {
        if stated > positions {
            return Err(unsupported(&sbert_path, "max_seq_length", stated, "above the model's max_position_embeddings"));
        }
        return Ok(stated);
    }
    let tokenizer_path = dir.join("tokenizer_config.json");
    let from_tokenizer = match read_json(&tokenizer_path)? {
        Some(tokenizer) => match tokenizer.get("model_max_length") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| v >= NO_TOKENIZER_LIMIT) => None,
            Some(_) => positive_field(&tokenizer_path, &tokenizer, "model_max_length")?,
        },
        None => None,
    };
    match from_tokenizer {
        Some(limit) => Ok(limit.min(positions)),
        None => Err(ModelError::NoMaxLength { dir: dir.to_owned() }),
    }
}

/// The pooling module's config, in either form; mean pooling when the file is absent (what
/// sentence-transformers builds for a plain transformers checkpoint).
fn read_pooling(path: &Path, dimensions: u32) -> Result<Pooling, ModelError> {
    let Some(json) = read_json(path)? else { return Ok(Pooling::Mean) };
    let config = object(path, &json)?;
    // "word_embedding_dimension" in the classic form, "embedding_dimension" in 6.x.
    for field in ["word_embedding_dimension", "embedding_dimension"] {
        if let Some(dim) = positive_field(path, &json, field)?.filter(|&d| d != dimensions) {
            return Err(unsupported(path, field, dim, "differs from config.json hidden_size"));
        }
    }
    if config.get("include_prompt").and_then(Value::as_bool) == Some(false) {
        return Err(unsupported(path, "include_prompt", false, "the engine pools over the prompt's tokens too"));
    }
    if let Some(mode) = config.get("pooling_mode") {
        // The 6.x form: one string.
        return match mode.as_str() {
            Some("mean") => Ok(Pooling::Mean),
            Some("cls") => Ok(Pooling::Cls),
            Some("lasttoken") => Ok(Pooling::LastToken),
            _ => Err(unsupported(path, "pooling_mode", mode, "the engine pools by mean, cls or lasttoken only")),
        };
    }
    let set: Vec<&str> = config
        .iter()
        .filter(|(key, value)| key.starts_with("pooling_mode_") && value.as_bool() == Some(true))
        .map(|(key, _)| key.as_str())
        .collect();
    match set.as_slice() {
        ["pooling_mode_mean_tokens"] => Ok(Pooling::Mean),
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        ["pooling_mode_lasttoken"] => Ok(Pooling::LastToken),
        [] => Err(unsupported(path, "pooling_mode_*", "none set", "one of mean_tokens, cls_token, lasttoken must be true")),
        other => Err(unsupported(path, "pooling_mode_*", other.join(", "), "exactly one of mean_tokens, cls_token, lasttoken")),
    }
}

/// One Dense module's folder: its `config.json` must take `width` values (the pooled vector or
/// the previous module's output) through the identity activation, and its weights must be a
/// `model.safetensors`. Returns its `out_features`. The enclave checks the config and the
/// weights' shape again when it loads the model.
fn read_dense(folder: &Path, width: u32) -> Result<u32, ModelError> {
    read_dense_of(folder, width, SENTENCE_EMBEDDING)
}

/// [`read_dense`] for a module mapping the features under `key` (a multi-vector model's
/// projection maps `token_embeddings`).
fn read_dense_of(folder: &Path, width: u32, key: &str) -> Result<u32, ModelError> {
    let path = folder.join("config.json");
    let json = read_json(&path)?.ok_or_else(|| config_error(&path, "missing: a Dense module's configuration".into()))?;
    let config = object(&path, &json)?;
    for (name, value) in config {
        let fits = match name.as_str() {
            "in_features" | "out_features" => true,
            "bias" => value.is_boolean(),
            "activation_function" => value == DENSE_IDENTITY,
            "module_input_name" | "module_output_name" => value == key,
            "use_residual" => value == false,
            _ => false,
        };
        if !fits {
            let field = ["activation_function", "module_input_name", "module_output_name", "use_residual", "bias"]
                .into_iter()
                .find(|f| f == name)
                .unwrap_or("(unknown field)");
            let reason = if key == SENTENCE_EMBEDDING {
                "a Dense module the engine computes maps the sentence embedding linearly, with the identity activation"
            } else {
                "a multi-vector projection the engine computes maps the token embeddings linearly, with the identity activation"
            };
            return Err(unsupported(&path, field, format!("{name}: {value}"), reason));
        }
    }
    if !config.contains_key("activation_function") {
        return Err(unsupported(&path, "activation_function", "(absent: Tanh)", "the engine computes the identity activation only"));
    }
    let features = |field: &'static str| {
        positive_field(&path, &json, field)?
            .filter(|&f| f as usize <= MAX_DIMENSIONS || field == "in_features")
            .ok_or_else(|| unsupported(&path, field, json.get(field).map_or("(absent)".into(), Value::to_string), "must be stated, at most the protocol's dimensions"))
    };
    let inp = features("in_features")?;
    if inp != width {
        return Err(unsupported(&path, "in_features", inp, "differs from the width of the vector the module receives"));
    }
    let out = features("out_features")?;
    if !folder.join("model.safetensors").is_file() {
        return Err(ModelError::MissingFile { dir: folder.to_owned(), name: "model.safetensors" });
    }
    Ok(out)
}

/// `prompts` (name → text) and `default_prompt_name`, sorted by name.
fn read_prompts(path: &Path) -> Result<(Vec<(String, String)>, Option<String>), ModelError> {
    let Some(json) = read_json(path)? else { return Ok((Vec::new(), None)) };
    let config = object(path, &json)?;
    let mut prompts = Vec::new();
    match config.get("prompts") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, text) in map {
                let text = text.as_str().ok_or_else(|| unsupported(path, "prompts", name, "a prompt must be a string"))?;
                if !protocol::manifest::valid_prompt_name(name) {
                    return Err(unsupported(path, "prompts", name, "prompt names are 1 to 64 printable ASCII characters"));
                }
                if text.len() > protocol::manifest::MAX_PROMPT_BYTES {
                    return Err(unsupported(path, "prompts", name, "a prompt's text is at most 4096 bytes"));
                }
                prompts.push((name.clone(), text.to_owned()));
            }
        }
        Some(other) => return Err(unsupported(path, "prompts", other, "must be an object of name to text")),
    }
    prompts.sort();
    let default_prompt = match config.get("default_prompt_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if prompts.iter().any(|(n, _)| n == name) => Some(name.clone()),
        Some(other) => return Err(unsupported(path, "default_prompt_name", other, "must name one of prompts")),
    };
    Ok((prompts, default_prompt))
}

mod bgem3;
mod multivector;
mod rerank;
mod rerank_qwen3;
mod sparse;
#[cfg(test)]
mod testdata_dirs;
#[cfg(test)]
mod tests;
