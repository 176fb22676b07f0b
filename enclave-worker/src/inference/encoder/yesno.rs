//! A decoder reranker's score (sentence-transformers' `LogitScore` over "yes" and "no", as
//! Qwen3-Reranker is scored): the last token's final-normed state times the language model's
//! "yes" row less its "no" row, then Sigmoid (`CrossEncoder`'s default for one score, P("yes")
//! of a softmax over the two) or nothing. The rows are the word embeddings' when the config ties
//! the lm_head to them (Qwen3-Reranker-0.6B's), else `lm_head.weight`'s; only the two are kept.
//! The product is in f32 with f64 sums whatever the body's precision.

use super::super::InferenceError;
use super::super::arch::{ArchConfig, Architecture};
use super::blocks::Tensors;

pub(crate) struct YesNoHead {
    yes: Vec<f32>,
    no: Vec<f32>,
    sigmoid: bool,
}

impl YesNoHead {
    pub(crate) fn load(weights: &[u8], config_json: &[u8], config: &ArchConfig, tokens: (u32, u32), sigmoid: bool) -> Result<Self, InferenceError> {
        if config.arch != Architecture::Qwen3 {
            return Err(InferenceError::UnsupportedArchitecture(format!("rerank_yesno scores Qwen3's language model, not {}'s", config.arch.as_str())));
        }
        let json: serde_json::Value = serde_json::from_slice(config_json).map_err(|e| InferenceError::Config(e.to_string()))?;
        // transformers' Qwen3Config does not tie unless the config says so.
        let tied = json.get("tie_word_embeddings").and_then(serde_json::Value::as_bool).unwrap_or(false);
        let (tensors, name) = if tied {
            (Tensors::new(weights, config.arch.weight_prefix())?, "embed_tokens.weight")
        } else {
            (Tensors::new(weights, "")?, "lm_head.weight")
        };
        let (vocab, h) = (config.vocab_size, config.hidden_size);
        let row = |id: u32| -> Result<Vec<f32>, InferenceError> {
            if id as usize >= vocab {
                return Err(InferenceError::Settings(format!("rerank_template token {id} is outside the vocabulary of {vocab}")));
            }
            tensors.row(name, vocab, h, id as usize)
        };
        Ok(Self { yes: row(tokens.0)?, no: row(tokens.1)?, sigmoid })
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(self.yes.as_slice()) + std::mem::size_of_val(self.no.as_slice())
    }

    /// A pair's score from its tokens' final states (`n × hidden`): the last token's.
    pub(crate) fn score(&self, states: &[f32]) -> f32 {
        let h = self.yes.len();
        let last = &states[states.len() - h..];
        let dot = |row: &[f32]| last.iter().zip(row).map(|(&x, &w)| f64::from(x) * f64::from(w)).sum::<f64>();
        let logit = (dot(&self.yes) - dot(&self.no)) as f32;
        if self.sigmoid { 1.0 / (1.0 + (-logit).exp()) } else { logit }
    }
}
