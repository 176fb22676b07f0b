//! bge-m3's lexical head, as FlagEmbedding's `BGEM3FlagModel` computes a text's lexical weights:
//! `relu(sparse_linear(h))` for every token's final state (a `Linear(hidden, 1)` with bias), the
//! largest weight per token id, the ids of the tokenizer's `<s>`, `</s>`, `<pad>` and `<unk>`
//! dropped, and zero weights dropped. Computed in f32 whatever the body's precision, one weight
//! per token, so a text holds its own ids' weights only (never a vocabulary-wide row).

use std::collections::BTreeMap;

use protocol::records::SparseVector;

use super::super::InferenceError;
use super::blocks::{Linear, Tensors};
use super::{Product, dense};

pub(crate) struct LexicalHead {
    /// `(hidden, 1)`, with its bias.
    linear: Linear,
    /// The vocabulary's size: the sparse vectors' dimensions.
    vocabulary: u32,
    /// Ids whose weights are never written (FlagEmbedding's `unused_tokens`).
    dropped: Vec<u32>,
}

impl LexicalHead {
    /// The head from `sparse_linear.safetensors` (`weight` `[1, hidden]`, `bias` `[1]`).
    pub(crate) fn load(weights: &[u8], hidden: usize, vocabulary: usize, dropped: Vec<u32>) -> Result<Self, InferenceError> {
        let refused = |e: InferenceError| InferenceError::Weights(format!("{}: {e}", protocol::manifest::LEXICAL_HEAD_FILE));
        let linear = Tensors::new(weights, "").and_then(|t| t.linear("", 1, hidden, true)).map_err(refused)?;
        let vocabulary = u32::try_from(vocabulary).map_err(|_| InferenceError::Config(format!("vocab_size {vocabulary}")))?;
        Ok(Self { linear, vocabulary, dropped })
    }

    pub(crate) fn dimensions(&self) -> usize {
        self.vocabulary as usize
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.linear.memory_bytes()
    }

    /// One text's weights from its token ids and their final states (`n × hidden`).
    pub(crate) fn weights(&self, ids: &[u32], states: &[f32]) -> Result<SparseVector, InferenceError> {
        let mut scores = Vec::new();
        dense(states, ids.len(), &self.linear.w, Product::Fp32, &mut scores)?;
        let bias = self.linear.b.as_deref().map_or(0.0, |b| b[0]);
        let mut largest: BTreeMap<u32, f32> = BTreeMap::new();
        for (&id, &score) in ids.iter().zip(&scores) {
            let weight = (score + bias).max(0.0);
            if weight > 0.0 && !self.dropped.contains(&id) {
                let kept = largest.entry(id).or_insert(0.0);
                *kept = kept.max(weight);
            }
        }
        Ok(SparseVector { dimensions: self.vocabulary, indices: largest.keys().copied().collect(), values: largest.into_values().collect() })
    }
}
