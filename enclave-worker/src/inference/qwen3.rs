//! Qwen3 (transformers' `Qwen3Model`, the body of Qwen3-Embedding): its `config.json` spec and its
//! tensor names. The computation is the encoder's shared layer loop: pre-norm RMSNorm (a final
//! norm, no embedding norm), grouped-query attention with a head size the config states, RMSNorm
//! of each query and key head before rotary positions, a causal mask, SwiGLU, no biases. Each
//! text is its own packed sequence, so its positions start at 0 whatever its neighbours' lengths.
//!
//! Both forms of the config are read: the one the published checkpoints carry (`rope_theta`,
//! `rope_scaling: null`, `sliding_window`, `max_window_layers`) and the one transformers 5
//! writes (`rope_parameters`, `layer_types`); where both state the base they must agree. Every
//! count is capped; a field the engine does not know, or a variant it does not compute (biases,
//! sliding windows, rope scaling, another activation), is refused by name.

use serde_json::Value;

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, count, unsupported};
use super::arch::caps::{MAX_VOCAB, MAX_HIDDEN, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_INTERMEDIATE};
use super::encoder::blocks::{Embeddings, Tensors};
use super::encoder::{FamilyWeights, Layer};


/// Rotary positions have no table: nothing is allocated by this count, and attention's memory is
/// linear in a text's length. The manifest's `max_tokens` bounds what a job sends.
const MAX_POSITIONS: usize = 131_072;

/// transformers' `Qwen3Config` defaults when the config does not state them.
const DEFAULT_THETA: f64 = 10_000.0;
const DEFAULT_POSITIONS: u64 = 32_768;

/// Fields the encoder computes with.
const COMPUTED: &[&str] = &[
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias", "use_sliding_window",
    "sliding_window", "max_window_layers", "layer_types", "rope_theta", "rope_parameters", "rope_scaling", "model_type",
];

/// Fields that do not change `Qwen3Model`'s output: training (dropout, initialisation), the
/// language-model head (`tie_word_embeddings`: `Qwen3Model` has none), generation (`use_cache`),
/// special token ids (the tokenizer places the tokens), metadata.
const IGNORED: &[&str] = &[
    "architectures", "attention_dropout", "initializer_range", "tie_word_embeddings", "use_cache", "bos_token_id",
    "eos_token_id", "pad_token_id", "dtype", "torch_dtype", "transformers_version", "_name_or_path", "id2label",
    "label2id", "num_labels", "problem_type", "output_attentions", "output_hidden_states", "return_dict",
];

/// Every layer attends to the whole text before it: sliding windows are refused.
fn check_full_attention(config: &Value, layers: usize) -> Result<(), InferenceError> {
    if let Some(v) = arch::field(config, "use_sliding_window")
        && v != false
    {
        return Err(unsupported("use_sliding_window", v, "sliding-window attention is not computed for Qwen3"));
    }
    let Some(types) = arch::field(config, "layer_types") else { return Ok(()) };
    let types = types.as_array().filter(|t| t.len() == layers).ok_or_else(|| unsupported("layer_types", types, "not one entry per layer"))?;
    match types.iter().find(|t| t.as_str() != Some("full_attention")) {
        Some(other) => Err(unsupported("layer_types", other, "every layer must be full_attention")),
        None => Ok(()),
    }
}

/// Reads a Qwen3 `config.json` (already a JSON object whose `model_type` is `qwen3`).
pub(crate) fn parse(config: &Value) -> Result<ArchConfig, InferenceError> {
    let object = config.as_object().ok_or_else(|| InferenceError::Config("not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !COMPUTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str())) {
        return Err(unsupported(key.as_str(), value, "a field the engine does not know"));
    }
    let hidden = count(config, "hidden_size", None, MAX_HIDDEN)?;
    let heads = count(config, "num_attention_heads", None, MAX_HEADS)?;
    // Stated by every Qwen3 config; transformers' defaults for them (32 heads, 128 wide) fit no
    // small model, so an absent one is refused rather than guessed.
    let kv_heads = count(config, "num_key_value_heads", None, MAX_HEADS)?;
    if !heads.is_multiple_of(kv_heads) {
        return Err(unsupported("num_key_value_heads", kv_heads, "must divide num_attention_heads"));
    }
    let head_dim = count(config, "head_dim", None, MAX_HEAD_DIM)?;
    if !head_dim.is_multiple_of(2) {
        return Err(unsupported("head_dim", head_dim, "rotary positions turn pairs: an even head size"));
    }
    let layers = count(config, "num_hidden_layers", None, MAX_LAYERS)?;
    let positions = count(config, "max_position_embeddings", Some(DEFAULT_POSITIONS), MAX_POSITIONS)?;
    let eps = match arch::field(config, "rms_norm_eps") {
        None => 1e-6,
        Some(v) => v.as_f64().filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0).ok_or_else(|| unsupported("rms_norm_eps", v, "not in (0, 1)"))?,
    };
    if let Some(v) = arch::field(config, "attention_bias")
        && v != false
    {
        return Err(unsupported("attention_bias", v, "Qwen3 with attention biases is not computed"));
    }
    let activation = arch::text(config, "hidden_act", "silu")?;
    if activation != "silu" {
        return Err(unsupported("hidden_act", format!("{activation:?}"), "the engine computes SwiGLU with silu"));
    }
    check_full_attention(config, layers)?;
    let base = arch::rotary_base(config, DEFAULT_THETA as f32)?;
    Ok(ArchConfig {
        arch: Architecture::Qwen3,
        vocab_size: count(config, "vocab_size", None, MAX_VOCAB)?,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        intermediate_size: count(config, "intermediate_size", None, MAX_INTERMEDIATE)?,
        max_position_embeddings: positions,
        type_vocab_size: 0,
        layer_norm_eps: eps,
        padding_idx: None,
        hidden_act: activation.to_owned(),
        position_embedding_type: "rotary".to_owned(),
        placement: Placement::Pre,
        activation: Activation::SwiGlu,
        attention: vec![LayerAttention { rotary_base: Some(base), window: None, causal: true }; layers],
        query_scale: None,
    })
}

/// Qwen3's tensor names (`model.` first when saved from `Qwen3ForCausalLM`): Q | K | V and
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
            attn_norm: Some(t.rms_norm(&format!("{p}.input_layernorm"), hidden)?),
            ff1: t.fused_parts(&[(&gate, inter), (&up, inter)], hidden, false)?,
            ff2: t.linear(&format!("{p}.mlp.down_proj"), hidden, inter, false)?,
            ff_norm: t.rms_norm(&format!("{p}.post_attention_layernorm"), hidden)?,
            qk_norm: Some((t.rms_norm(&format!("{p}.self_attn.q_norm"), d)?, t.rms_norm(&format!("{p}.self_attn.k_norm"), d)?)),
            sandwich: None,
            attention,
        });
    }
    Ok(FamilyWeights {
        embeddings: Embeddings {
            word: t.values("embed_tokens.weight", &[config.vocab_size, hidden])?,
            position: None,
            token_type: Vec::new(),
            second_type: None,
            norm: None,
        },
        layers,
        final_norm: Some(t.rms_norm("norm", hidden)?),
        relative: None,
    })
}

#[cfg(test)]
mod tests;
