//! Gemma 3's text body run with bidirectional attention (transformers' `Gemma3TextModel` with
//! `use_bidirectional_attention`, the body of EmbeddingGemma): its `config.json` spec and its
//! tensor names. The computation is the encoder's shared layer loop: pre-norm RMSNorm with
//! Gemma's `(1 + w)` weights (applied at load: `1 + w` in f32 is what transformers multiplies
//! by), four norms per layer (the attention's and the feed-forward's outputs are normalised before
//! their residuals: the layer's sandwich norms), word embeddings scaled by `√hidden` in f32 (at
//! load, the same product), grouped-query attention with per-head `q_norm`/`k_norm` before rotary,
//! scores scaled by `query_pre_attn_scalar^−½`, sliding and full layers with their own rotary
//! bases, GeGLU with the tanh GELU, no biases, a final norm.
//!
//! With bidirectional attention transformers turns the stated `sliding_window` `W` into
//! `W / 2 + 1` and lets query `i` see key `j` when `|i − j| < W / 2 + 1` (the causal sliding mask
//! OR'd with the symmetric one), so a sliding layer's window is `|i − j| ≤ W / 2`.
//!
//! Both forms of the config are read: the one EmbeddingGemma carries (`rope_theta`,
//! `rope_local_base_freq`, `rope_scaling: null`) and the one transformers 5 writes
//! (`rope_parameters` per layer type); a base stated in both must agree. Every count is capped; a
//! field the engine does not know, or a variant it does not compute (causal use, soft-capping,
//! rope scaling, biases, another activation), is refused by name.

use serde_json::{Map, Value};

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, count, theta, unsupported};
use super::arch::caps::{MAX_VOCAB, MAX_HIDDEN, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_INTERMEDIATE};
use super::encoder::blocks::{Embeddings, Norm, Tensors};
use super::encoder::{FamilyWeights, Layer};

/// Rotary positions have no table: nothing is allocated by this count; the manifest's
/// `max_tokens` bounds a text.
const MAX_POSITIONS: usize = 131_072;
const MAX_QUERY_SCALAR: f64 = 1e6;

/// transformers' `Gemma3TextConfig` defaults when the config does not state them.
const DEFAULT_GLOBAL_THETA: f32 = 1_000_000.0;
const DEFAULT_LOCAL_THETA: f32 = 10_000.0;
const DEFAULT_POSITIONS: u64 = 131_072;
const DEFAULT_QUERY_SCALAR: f64 = 256.0;

/// Fields the encoder computes with, or checks.
const COMPUTED: &[&str] = &[
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "max_position_embeddings", "rms_norm_eps", "hidden_activation", "attention_bias", "query_pre_attn_scalar",
    "sliding_window", "layer_types", "rope_theta", "rope_local_base_freq", "rope_parameters", "rope_scaling",
    "use_bidirectional_attention", "attn_logit_softcapping", "final_logit_softcapping", "model_type",
];

/// Fields that do not change `Gemma3TextModel`'s output: training, the language-model head
/// (`tie_word_embeddings`), generation (`use_cache`, `cache_implementation`), token ids, metadata,
/// and the layer pattern's old spelling (`layer_types` must be stated, so the pattern it was
/// derived from is not read).
const IGNORED: &[&str] = &[
    "architectures", "attention_dropout", "initializer_range", "tie_word_embeddings", "use_cache", "cache_implementation",
    "bos_token_id", "eos_token_id", "pad_token_id", "dtype", "torch_dtype", "transformers_version", "_name_or_path",
    "id2label", "label2id", "num_labels", "problem_type", "output_attentions", "output_hidden_states", "return_dict",
    "_sliding_window_pattern", "sliding_window_pattern",
];

/// One layer type's rotary base from `rope_parameters` (the default kind only), if stated.
fn stated_base(parameters: &Map<String, Value>, kind: &str) -> Result<Option<f32>, InferenceError> {
    let Some(entry) = parameters.get(kind).filter(|v| !v.is_null()) else { return Ok(None) };
    let entry = entry.as_object().ok_or_else(|| unsupported(format!("rope_parameters.{kind}"), entry, "not an object"))?;
    for (key, value) in entry {
        match key.as_str() {
            "rope_type" if value == "default" => {}
            "rope_type" => return Err(unsupported(format!("rope_parameters.{kind}.rope_type"), value, "only the default rotary kind is computed")),
            "rope_theta" => {}
            _ => return Err(unsupported(format!("rope_parameters.{kind}.{key}"), value, "a rotary setting the engine does not compute")),
        }
    }
    entry.get("rope_theta").map(|t| theta(&format!("rope_parameters.{kind}.rope_theta"), t)).transpose()
}

/// The full and sliding layers' rotary bases: `rope_parameters` over `rope_theta` /
/// `rope_local_base_freq`, both stated must agree; transformers' defaults otherwise.
fn rotary_bases(config: &Value) -> Result<(f32, f32), InferenceError> {
    if let Some(v) = arch::field(config, "rope_scaling") {
        return Err(unsupported("rope_scaling", v, "rotary scaling is not computed"));
    }
    let global = arch::field(config, "rope_theta").map(|t| theta("rope_theta", t)).transpose()?;
    let local = arch::field(config, "rope_local_base_freq").map(|t| theta("rope_local_base_freq", t)).transpose()?;
    let (mut from_global, mut from_local) = (None, None);
    if let Some(parameters) = arch::field(config, "rope_parameters") {
        let parameters = parameters.as_object().ok_or_else(|| unsupported("rope_parameters", parameters, "not an object"))?;
        if let Some(other) = parameters.keys().find(|k| !["full_attention", "sliding_attention"].contains(&k.as_str())) {
            return Err(unsupported(format!("rope_parameters.{other}"), &parameters[other], "not a layer type of Gemma 3"));
        }
        from_global = stated_base(parameters, "full_attention")?;
        from_local = stated_base(parameters, "sliding_attention")?;
    }
    let agree = |name: &'static str, a: Option<f32>, b: Option<f32>, default: f32| match (a, b) {
        (Some(a), Some(b)) if a != b => Err(unsupported(name, b, "disagrees with rope_parameters")),
        (Some(t), _) | (None, Some(t)) => Ok(t),
        (None, None) => Ok(default),
    };
    Ok((agree("rope_theta", from_global, global, DEFAULT_GLOBAL_THETA)?, agree("rope_local_base_freq", from_local, local, DEFAULT_LOCAL_THETA)?))
}

/// A field that must be absent, null or `false`.
fn refuse_true(config: &Value, name: &str, reason: &'static str) -> Result<(), InferenceError> {
    match arch::field(config, name) {
        Some(v) if v != false => Err(unsupported(name, v, reason)),
        _ => Ok(()),
    }
}

/// Each layer's attention: `layer_types` (stated), the sliding window, the two bases.
fn layer_attention(config: &Value, layers: usize) -> Result<Vec<LayerAttention>, InferenceError> {
    let types = arch::field(config, "layer_types").ok_or_else(|| unsupported("layer_types", "(absent)", "must be stated, one entry per layer"))?;
    let types = types.as_array().filter(|t| t.len() == layers).ok_or_else(|| unsupported("layer_types", types, "not one entry per layer"))?;
    let (global, local) = rotary_bases(config)?;
    let sliding = types.iter().any(|t| t == "sliding_attention");
    // transformers keeps keys |i − j| < W/2 + 1 for bidirectional use: |i − j| ≤ W/2.
    let window = if sliding { Some(count(config, "sliding_window", None, MAX_POSITIONS)? / 2) } else { None };
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(LayerAttention { rotary_base: Some(global), window: None, causal: false }),
            Some("sliding_attention") => Ok(LayerAttention { rotary_base: Some(local), window, causal: false }),
            _ => Err(unsupported("layer_types", t, "each layer must be full_attention or sliding_attention")),
        })
        .collect()
}

/// Reads a Gemma 3 text `config.json` (already a JSON object whose `model_type` is `gemma3_text`).
pub(crate) fn parse(config: &Value) -> Result<ArchConfig, InferenceError> {
    let object = config.as_object().ok_or_else(|| InferenceError::Config("not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !COMPUTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str())) {
        return Err(unsupported(key.as_str(), value, "a field the engine does not know"));
    }
    if arch::field(config, "use_bidirectional_attention") != Some(&Value::Bool(true)) {
        let found = arch::field(config, "use_bidirectional_attention").cloned().unwrap_or(Value::Bool(false));
        return Err(unsupported("use_bidirectional_attention", found, "the engine computes Gemma 3 as EmbeddingGemma does: bidirectional"));
    }
    for name in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(v) = arch::field(config, name) {
            return Err(unsupported(name, v, "soft-capping is not computed"));
        }
    }
    refuse_true(config, "attention_bias", "Gemma 3 with attention biases is not computed")?;
    let activation = arch::text(config, "hidden_activation", "gelu_pytorch_tanh")?;
    if activation != "gelu_pytorch_tanh" {
        return Err(unsupported("hidden_activation", format!("{activation:?}"), "the engine computes GeGLU with gelu_pytorch_tanh"));
    }
    let hidden = count(config, "hidden_size", None, MAX_HIDDEN)?;
    let heads = count(config, "num_attention_heads", None, MAX_HEADS)?;
    // transformers' defaults (4 key/value heads, 256 wide) fit no small model: stated or refused.
    let kv_heads = count(config, "num_key_value_heads", None, MAX_HEADS)?;
    if !heads.is_multiple_of(kv_heads) {
        return Err(unsupported("num_key_value_heads", kv_heads, "must divide num_attention_heads"));
    }
    let head_dim = count(config, "head_dim", None, MAX_HEAD_DIM)?;
    if !head_dim.is_multiple_of(2) {
        return Err(unsupported("head_dim", head_dim, "rotary positions turn pairs: an even head size"));
    }
    let scalar = match arch::field(config, "query_pre_attn_scalar") {
        None => DEFAULT_QUERY_SCALAR,
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= MAX_QUERY_SCALAR)
            .ok_or_else(|| unsupported("query_pre_attn_scalar", v, "not a positive number up to 1e6"))?,
    };
    let layers = count(config, "num_hidden_layers", None, MAX_LAYERS)?;
    let eps = match arch::field(config, "rms_norm_eps") {
        None => 1e-6,
        Some(v) => v.as_f64().filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0).ok_or_else(|| unsupported("rms_norm_eps", v, "not in (0, 1)"))?,
    };
    Ok(ArchConfig {
        arch: Architecture::Gemma3,
        vocab_size: count(config, "vocab_size", None, MAX_VOCAB)?,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        intermediate_size: count(config, "intermediate_size", None, MAX_INTERMEDIATE)?,
        max_position_embeddings: count(config, "max_position_embeddings", Some(DEFAULT_POSITIONS), MAX_POSITIONS)?,
        type_vocab_size: 0,
        layer_norm_eps: eps,
        padding_idx: None,
        hidden_act: activation.to_owned(),
        position_embedding_type: "rotary".to_owned(),
        placement: Placement::Pre,
        activation: Activation::GeGluTanh,
        attention: layer_attention(config, layers)?,
        // transformers: `query_pre_attn_scalar ** -0.5` in double, used as an f32 factor.
        query_scale: Some(scalar.powf(-0.5) as f32),
    })
}

/// Gemma's RMSNorm `{name}.weight`: `x · (1/√(mean(x²) + ε)) · (1 + w)`.
fn norm(t: &Tensors<'_>, name: &str, len: usize) -> Result<Norm, InferenceError> {
    let mut norm = t.rms_norm(name, len)?;
    for g in &mut norm.gamma {
        *g += 1.0;
    }
    Ok(norm)
}

/// Gemma 3's tensor names (`model.` first when saved from a task model): Q | K | V and
/// gate | up fused at load.
pub(crate) fn weights(t: &Tensors<'_>, config: &ArchConfig) -> Result<FamilyWeights, InferenceError> {
    let (hidden, inter, d) = (config.hidden_size, config.intermediate_size, config.head_dim);
    let (q_width, kv_width) = (config.num_attention_heads * d, config.num_key_value_heads * d);
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for (i, &attention) in config.attention.iter().enumerate() {
        let p = format!("layers.{i}");
        let (q, k, v) = (format!("{p}.self_attn.q_proj"), format!("{p}.self_attn.k_proj"), format!("{p}.self_attn.v_proj"));
        let (gate, up) = (format!("{p}.mlp.gate_proj"), format!("{p}.mlp.up_proj"));
        layers.push(Layer {
            qkv: t.fused_parts(&[(&q, q_width), (&k, kv_width), (&v, kv_width)], hidden, false)?,
            out: t.linear(&format!("{p}.self_attn.o_proj"), hidden, q_width, false)?,
            attn_norm: Some(norm(t, &format!("{p}.input_layernorm"), hidden)?),
            ff1: t.fused_parts(&[(&gate, inter), (&up, inter)], hidden, false)?,
            ff2: t.linear(&format!("{p}.mlp.down_proj"), hidden, inter, false)?,
            ff_norm: norm(t, &format!("{p}.pre_feedforward_layernorm"), hidden)?,
            qk_norm: Some((norm(t, &format!("{p}.self_attn.q_norm"), d)?, norm(t, &format!("{p}.self_attn.k_norm"), d)?)),
            sandwich: Some((
                norm(t, &format!("{p}.post_attention_layernorm"), hidden)?,
                norm(t, &format!("{p}.post_feedforward_layernorm"), hidden)?,
            )),
            attention,
        });
    }
    // transformers multiplies the looked-up rows by √hidden in the weights' dtype (f32 here).
    let scale = (hidden as f64).sqrt() as f32;
    let mut word = t.values("embed_tokens.weight", &[config.vocab_size, hidden])?;
    for w in &mut word {
        *w *= scale;
    }
    Ok(FamilyWeights {
        embeddings: Embeddings { word, position: None, token_type: Vec::new(), second_type: None, norm: None },
        layers,
        final_norm: Some(norm(t, "norm", hidden)?),
        relative: None,
    })
}

#[cfg(test)]
mod tests;
