//! NomicBERT (transformers' `NomicBertModel`, the body of nomic-embed-text): its `config.json` spec
//! and its tensor names. The computation is the encoder's shared layer loop with BERT's placement:
//! LayerNorm (with bias) after each residual and after the embeddings, rotary positions inside
//! attention (one base, `0..n` per text), SwiGLU, no linear biases. The embeddings are the word
//! rows plus token type 0 (added at load: the same f32 sum transformers does per token).
//!
//! The config read is transformers 5's (`hidden_size`, `rope_parameters`, …); the tensor names are
//! those transformers writes and nomic-embed-text ships (`encoder.layers.N.attn.Wqkv`, `mlp.fc11`
//! the up projection, `mlp.fc12` the gate, `norm1`, `norm2`, `emb_ln`). The remote-code config of
//! the published checkpoints (`n_embd`, `rotary_emb_fraction`, …) is refused by its first unknown
//! field. Every count is capped; a variant the engine does not compute is refused by name.

use serde_json::Value;

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, count, unsupported};
use super::arch::caps::{MAX_VOCAB, MAX_HIDDEN, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_INTERMEDIATE, MAX_TOKEN_TYPES};
use super::encoder::blocks::{Embeddings, Tensors};
use super::encoder::{FamilyWeights, Layer};

/// Rotary positions have no table; the manifest's `max_tokens` bounds a text.
const MAX_POSITIONS: usize = 131_072;

/// transformers' `NomicBertConfig` defaults.
const DEFAULT_THETA: f32 = 1000.0;
const DEFAULT_POSITIONS: u64 = 2048;
const DEFAULT_TOKEN_TYPES: u64 = 2;

/// Fields the encoder computes with, or checks.
const COMPUTED: &[&str] = &[
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "rope_parameters", "rope_theta", "rope_scaling",
    "head_dim", "model_type",
];

/// Fields that do not change `NomicBertModel`'s output: training (dropout, initialisation), heads,
/// token ids, metadata.
const IGNORED: &[&str] = &[
    "architectures", "attention_probs_dropout_prob", "hidden_dropout_prob", "classifier_dropout", "initializer_range",
    "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings", "use_cache", "dtype", "torch_dtype",
    "transformers_version", "_name_or_path", "id2label", "label2id", "num_labels", "problem_type", "output_attentions",
    "output_hidden_states", "return_dict",
];

/// Reads a NomicBERT `config.json` (already a JSON object whose `model_type` is `nomic_bert`).
pub(crate) fn parse(config: &Value) -> Result<ArchConfig, InferenceError> {
    let object = config.as_object().ok_or_else(|| InferenceError::Config("not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !COMPUTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str())) {
        return Err(unsupported(key.as_str(), value, "a field the engine does not know"));
    }
    let activation = arch::text(config, "hidden_act", "silu")?;
    if activation != "silu" {
        return Err(unsupported("hidden_act", format!("{activation:?}"), "the engine computes SwiGLU with silu"));
    }
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
    let base = arch::rotary_base(config, DEFAULT_THETA)?;
    Ok(ArchConfig {
        arch: Architecture::NomicBert,
        vocab_size: count(config, "vocab_size", None, MAX_VOCAB)?,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim,
        intermediate_size: count(config, "intermediate_size", None, MAX_INTERMEDIATE)?,
        max_position_embeddings: count(config, "max_position_embeddings", Some(DEFAULT_POSITIONS), MAX_POSITIONS)?,
        type_vocab_size: count(config, "type_vocab_size", Some(DEFAULT_TOKEN_TYPES), MAX_TOKEN_TYPES)?,
        layer_norm_eps: eps,
        padding_idx: None,
        hidden_act: activation.to_owned(),
        position_embedding_type: "rotary".to_owned(),
        placement: Placement::Post,
        activation: Activation::SwiGlu,
        attention: vec![LayerAttention { rotary_base: Some(base), window: None, causal: false }; layers],
        query_scale: None,
    })
}

/// NomicBERT's tensor names as transformers saves them (nomic-embed-text's): Wqkv already fused
/// Q | K | V; fc12 (gate) | fc11 (up) fused at load.
pub(crate) fn weights(t: &Tensors<'_>, config: &ArchConfig) -> Result<FamilyWeights, InferenceError> {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let width = config.num_attention_heads * config.head_dim;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for (i, &attention) in config.attention.iter().enumerate() {
        let p = format!("encoder.layers.{i}");
        let (gate, up) = (format!("{p}.mlp.fc12"), format!("{p}.mlp.fc11"));
        layers.push(Layer {
            qkv: t.linear(&format!("{p}.attn.Wqkv"), 3 * width, hidden, false)?,
            out: t.linear(&format!("{p}.attn.out_proj"), hidden, width, false)?,
            attn_norm: Some(t.norm(&format!("{p}.norm1"), hidden, true)?),
            ff1: t.fused_parts(&[(&gate, inter), (&up, inter)], hidden, false)?,
            ff2: t.linear(&format!("{p}.mlp.fc2"), hidden, inter, false)?,
            ff_norm: t.norm(&format!("{p}.norm2"), hidden, true)?,
            qk_norm: None,
            sandwich: None,
            attention,
        });
    }
    // Every text is one segment: token type 0's row, added to each word row as transformers adds
    // it to each token.
    let token_type = t.first_row("embeddings.token_type_embeddings.weight", config.type_vocab_size, hidden)?;
    let mut word = t.values("embeddings.word_embeddings.weight", &[config.vocab_size, hidden])?;
    for row in word.chunks_exact_mut(hidden) {
        for (w, &tt) in row.iter_mut().zip(&token_type) {
            *w += tt;
        }
    }
    Ok(FamilyWeights {
        embeddings: Embeddings { word, position: None, token_type: Vec::new(), second_type: None, norm: Some(t.norm("emb_ln", hidden, true)?) },
        layers,
        final_norm: None,
        relative: None,
    })
}

#[cfg(test)]
mod tests;
