//! A cross-encoder's head on the first token's final state, one label: XLM-RoBERTa's sequence
//! classification (`classifier.dense`, tanh, `classifier.out_proj`) or BERT's (the pooler's
//! `bert.pooler.dense` and tanh, then `classifier`) — the same computation under other names —,
//! then sentence-transformers' `CrossEncoder` activation (Sigmoid by default for one label, or
//! the logit as it is). Computed in f32 whatever the body's precision.

use super::super::InferenceError;
use super::super::arch::{ArchConfig, Architecture};
use super::blocks::{Linear, Tensors};
use super::{Product, dense};

pub(crate) struct ClassifierHead {
    dense: Linear,
    out: Linear,
    sigmoid: bool,
}

impl ClassifierHead {
    pub(crate) fn load(weights: &[u8], config: &ArchConfig, labels: usize, sigmoid: bool) -> Result<Self, InferenceError> {
        let (dense, out) = match config.arch {
            Architecture::XlmRoberta => ("classifier.dense", "classifier.out_proj"),
            Architecture::Bert => ("bert.pooler.dense", "classifier"),
            other => {
                return Err(InferenceError::UnsupportedArchitecture(format!(
                    "rerank reads BERT's or XLM-RoBERTa's sequence-classification head, not {}'s",
                    other.as_str()
                )));
            }
        };
        if labels != 1 {
            return Err(InferenceError::Settings(format!("a cross-encoder scores with one label, this one has {labels}")));
        }
        let h = config.hidden_size;
        let tensors = Tensors::new(weights, "")?;
        Ok(Self {
            dense: tensors.linear(dense, h, h, true)?,
            out: tensors.linear(out, 1, h, true)?,
            sigmoid,
        })
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.dense.memory_bytes() + self.out.memory_bytes()
    }

    /// A pair's score from its tokens' final states (`n × hidden`): the first token's.
    pub(crate) fn score(&self, states: &[f32]) -> Result<f32, InferenceError> {
        let h = self.dense.width();
        let mut hidden = Vec::new();
        dense(&states[..h], 1, &self.dense.w, Product::Fp32, &mut hidden)?;
        for (x, &b) in hidden.iter_mut().zip(self.dense.b.as_deref().expect("the dense layer has a bias")) {
            *x = (*x + b).tanh();
        }
        let mut logit = Vec::new();
        dense(&hidden, 1, &self.out.w, Product::Fp32, &mut logit)?;
        let logit = logit[0] + self.out.b.as_deref().expect("the output layer has a bias")[0];
        Ok(if self.sigmoid { 1.0 / (1.0 + (-logit).exp()) } else { logit })
    }
}
