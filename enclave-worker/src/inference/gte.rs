//! GTE (transformers' `GteModel`: Alibaba's GTE v1.5 and mGTE encoders): its `config.json` spec and
//! its tensor names. The computation is the encoder's shared layer loop with BERT's placement:
//! LayerNorm (with bias) after the embeddings and after each residual, rotary positions inside
//! attention (one base, `0..n` per text, no position table), Q/K/V/O with biases, a gated
//! feed-forward (`act(gate) · up` without biases, the down projection with one). The embeddings
//! are the word rows plus token type 0 when the model has token types (added at load: the same f32
//! sum transformers does per token); `type_vocab_size: 0` (gte-base-en-v1.5) has none.
//!
//! The config read is transformers 5's (`hidden_size`, `rope_parameters`, default base 160,000).
//! Rotary scaling (`rope_scaling`, another `rope_type`: the remote code's `ntk`, which transformers
//! 5.24 does not compute either) is refused by field, as is every field the engine does not know.
//! Every count is capped.

use serde_json::Value;

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, count, unsupported};
use super::arch::caps::{MAX_VOCAB, MAX_HIDDEN, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_INTERMEDIATE, MAX_TOKEN_TYPES};
use super::encoder::blocks::{Embeddings, Tensors};
use super::encoder::{FamilyWeights, Layer};

/// Rotary positions have no table; the manifest's `max_tokens` bounds a text.
const MAX_POSITIONS: usize = 131_072;

/// transformers' `GteConfig` defaults.
const DEFAULT_THETA: f32 = 160_000.0;
const DEFAULT_POSITIONS: u64 = 8192;
const DEFAULT_TOKEN_TYPES: u64 = 1;

/// Fields the encoder computes with, or checks.
const COMPUTED: &[&str] = &[
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "rope_parameters", "rope_theta", "rope_scaling",
    "head_dim", "model_type",
];

/// Fields that do not change `GteModel`'s output: training (dropout, initialisation), heads, token
/// ids, metadata.
const IGNORED: &[&str] = &[
    "architectures", "attention_probs_dropout_prob", "hidden_dropout_prob", "classifier_dropout", "initializer_range",
    "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings", "dtype", "torch_dtype",
    "transformers_version", "_name_or_path", "id2label", "label2id", "num_labels", "problem_type", "output_attentions",
    "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
];

/// `hidden_act` → the gated feed-forward the encoder computes (`act(gate) · up`).
fn activation(name: &str) -> Option<Activation> {
    match name {
        // ACT2FN["gelu"] is the erf GELU.
        "gelu" => Some(Activation::GeGlu),
        "silu" | "swish" => Some(Activation::SwiGlu),
        _ => None,
    }
}

/// Reads a GTE `config.json` (already a JSON object whose `model_type` is `gte`).
pub(crate) fn parse(config: &Value) -> Result<ArchConfig, InferenceError> {
    let object = config.as_object().ok_or_else(|| InferenceError::Config("not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !COMPUTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str())) {
        return Err(unsupported(key.as_str(), value, "a field the engine does not know"));
    }
    let act_name = arch::text(config, "hidden_act", "gelu")?;
    let Some(act) = activation(act_name) else {
        return Err(unsupported("hidden_act", format!("{act_name:?}"), "the engine computes GTE's gated feed-forward with gelu or silu"));
    };
    let hidden = count(config, "hidden_size", None, MAX_HIDDEN)?;
    let heads = count(config, "num_attention_heads", None, MAX_HEADS)?;
    // transformers: hidden_size / num_attention_heads when not stated.
    let head_dim = match arch::field(config, "head_dim") {
        None => hidden / heads,
        Some(_) => count(config, "head_dim", None, MAX_HEAD_DIM)?,
    };
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(unsupported("head_dim", head_dim, "rotary positions turn pairs: an even head size"));
    }
    let layers = count(config, "num_hidden_layers", None, MAX_LAYERS)?;
    let eps = match arch::field(config, "layer_norm_eps") {
        None => 1e-12,
        Some(v) => v.as_f64().filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0).ok_or_else(|| unsupported("layer_norm_eps", v, "not in (0, 1)"))?,
    };
    // 0 is a model without token types (gte-base-en-v1.5); otherwise a capped count.
    let token_types = match arch::field(config, "type_vocab_size") {
        Some(v) if v.as_u64() == Some(0) => 0,
        _ => count(config, "type_vocab_size", Some(DEFAULT_TOKEN_TYPES), MAX_TOKEN_TYPES)?,
    };
    let base = arch::rotary_base(config, DEFAULT_THETA)?;
    Ok(ArchConfig {
        arch: Architecture::Gte,
        vocab_size: count(config, "vocab_size", None, MAX_VOCAB)?,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim,
        intermediate_size: count(config, "intermediate_size", None, MAX_INTERMEDIATE)?,
        max_position_embeddings: count(config, "max_position_embeddings", Some(DEFAULT_POSITIONS), MAX_POSITIONS)?,
        type_vocab_size: token_types,
        layer_norm_eps: eps,
        padding_idx: None,
        hidden_act: act_name.to_owned(),
        position_embedding_type: "rotary".to_owned(),
        placement: Placement::Post,
        activation: act,
        attention: vec![LayerAttention { rotary_base: Some(base), window: None, causal: false }; layers],
        query_scale: None,
    })
}

/// GTE's tensor names as transformers 5.24 saves them, which are the published checkpoints' (it
/// converts them to its own at load): `encoder.layer.N.attention.qkv_proj` (Q | K | V rows, with
/// bias), `attention.o_proj`, `attn_ln`, `mlp.up_gate_proj` (up then gate rows, no bias; read gate
/// first, the activated half), `mlp.down_proj` (with bias), `mlp_ln`, `embeddings.LayerNorm`; a
/// `new.` prefix when saved from a task model.
pub(crate) fn weights(t: &Tensors<'_>, config: &ArchConfig) -> Result<FamilyWeights, InferenceError> {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let width = config.num_attention_heads * config.head_dim;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for (i, &attention) in config.attention.iter().enumerate() {
        let p = format!("encoder.layer.{i}");
        layers.push(Layer {
            qkv: t.linear(&format!("{p}.attention.qkv_proj"), 3 * width, hidden, true)?,
            out: t.linear(&format!("{p}.attention.o_proj"), hidden, width, true)?,
            attn_norm: Some(t.norm(&format!("{p}.attn_ln"), hidden, true)?),
            ff1: t.linear_halves_swapped(&format!("{p}.mlp.up_gate_proj"), 2 * inter, hidden)?,
            ff2: t.linear(&format!("{p}.mlp.down_proj"), hidden, inter, true)?,
            ff_norm: t.norm(&format!("{p}.mlp_ln"), hidden, true)?,
            qk_norm: None,
            sandwich: None,
            attention,
        });
    }
    let mut word = t.values("embeddings.word_embeddings.weight", &[config.vocab_size, hidden])?;
    // Every text is one segment: token type 0's row, added to each word row as transformers adds
    // it to each token; a model without token types adds nothing.
    if config.type_vocab_size > 0 {
        let token_type = t.first_row("embeddings.token_type_embeddings.weight", config.type_vocab_size, hidden)?;
        for row in word.chunks_exact_mut(hidden) {
            for (w, &tt) in row.iter_mut().zip(&token_type) {
                *w += tt;
            }
        }
    }
    Ok(FamilyWeights {
        embeddings: Embeddings { word, position: None, token_type: Vec::new(), second_type: None, norm: Some(t.norm("embeddings.LayerNorm", hidden, true)?) },
        layers,
        final_norm: None,
        relative: None,
    })
}

#[cfg(test)]
mod tests;
