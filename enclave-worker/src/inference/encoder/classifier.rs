//! A cross-encoder's head: XLM-RoBERTa's sequence classification (`classifier.dense`, tanh,
//! `classifier.out_proj`) on the first token's final state, one label, then sentence-transformers'
//! `CrossEncoder` activation (Sigmoid by default for one label, or the logit as it is). Computed
//! in f32 whatever the body's precision. BERT's (`bert.pooler`, `classifier`) reads its pairs'
//! second segment with token type 1, which the engine does not embed: refused by name.

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
        if config.arch != Architecture::XlmRoberta {
            return Err(InferenceError::UnsupportedArchitecture(format!(
                "rerank reads XLM-RoBERTa's sequence-classification head, not {}'s (a BERT cross-encoder's second segment has token type 1, which the engine does not embed)",
                config.arch.as_str()
            )));
        }
        if labels != 1 {
            return Err(InferenceError::Settings(format!("a cross-encoder scores with one label, this one has {labels}")));
        }
        let h = config.hidden_size;
        let tensors = Tensors::new(weights, "")?;
        Ok(Self {
            dense: tensors.linear("classifier.dense", h, h, true)?,
            out: tensors.linear("classifier.out_proj", 1, h, true)?,
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
