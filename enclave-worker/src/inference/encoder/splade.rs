//! SPLADE's head: a BERT checkpoint's masked-language-model head (`cls.predictions`: a dense
//! layer, erf GELU, LayerNorm, then the decoder onto the vocabulary, tied to the word embeddings
//! unless the checkpoint has its own) over every token's final state, then sentence-transformers'
//! `SpladePooling` "max" / "relu": `log(1 + ReLU(logit))`, the maximum over the text's tokens, per
//! vocabulary entry. Computed in f32 whatever the body's precision, a block of tokens at a time,
//! so a text never holds more than a block's logits (`SPLADE_TOKENS × vocabulary`).

use super::super::InferenceError;
use super::super::arch::{Activation, ArchConfig, Architecture};
use super::super::kernels;
use super::blocks::{Linear, Norm, Tensors};
use super::{Product, dense};

/// Tokens whose logits are computed together.
const SPLADE_TOKENS: usize = 64;

pub(crate) struct SpladeHead {
    transform: Linear,
    norm: Norm,
    /// `(hidden, vocabulary)`, with the prediction bias.
    decoder: Linear,
    eps: f32,
}

impl SpladeHead {
    pub(crate) fn load(weights: &[u8], config: &ArchConfig) -> Result<Self, InferenceError> {
        if config.arch != Architecture::Bert || config.activation != Activation::Gelu {
            return Err(InferenceError::UnsupportedArchitecture(format!(
                "splade pooling reads a BERT masked-language-model head (cls.predictions), not {}'s",
                config.arch.as_str()
            )));
        }
        let (h, vocab) = (config.hidden_size, config.vocab_size);
        // The head's names have no `bert.` prefix; the tied decoder is the body's word embeddings.
        let tensors = Tensors::new(weights, "")?;
        let decoder_name = if tensors.has("cls.predictions.decoder.weight") {
            "cls.predictions.decoder"
        } else {
            "bert.embeddings.word_embeddings"
        };
        let mut decoder = tensors.linear(decoder_name, vocab, h, false)?;
        decoder.b = Some(tensors.values("cls.predictions.bias", &[vocab])?);
        Ok(Self {
            transform: tensors.linear("cls.predictions.transform.dense", h, h, true)?,
            norm: tensors.norm("cls.predictions.transform.LayerNorm", h, true)?,
            decoder,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// The vocabulary's width.
    pub(crate) fn dimensions(&self) -> usize {
        self.decoder.width()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.transform.memory_bytes() + self.norm.memory_bytes() + self.decoder.memory_bytes()
    }

    /// One text's weights from its tokens' final states (`n × hidden`).
    pub(crate) fn pool(&self, states: &[f32]) -> Result<Vec<f32>, InferenceError> {
        let h = self.transform.width();
        let vocab = self.dimensions();
        // ReLU makes every weight ≥ 0, so 0 is the maximum's identity (padding never enters).
        let mut pooled = vec![0f32; vocab];
        let (mut hidden, mut normed, mut logits) = (Vec::new(), Vec::new(), Vec::new());
        for block in states.chunks(SPLADE_TOKENS * h) {
            let m = block.len() / h;
            dense(block, m, &self.transform.w, Product::Fp32, &mut hidden)?;
            normed.resize(m * h, 0.0);
            let bias = self.transform.b.as_deref().expect("the transform has a bias");
            for (row, out) in hidden.chunks_exact_mut(h).zip(normed.chunks_exact_mut(h)) {
                kernels::bias_gelu_in_place(row, bias);
                self.norm.apply(out, row, None, None, self.eps);
            }
            dense(&normed, m, &self.decoder.w, Product::Fp32, &mut logits)?;
            let bias = self.decoder.b.as_deref().expect("the decoder has the prediction bias");
            for row in logits.chunks_exact(vocab) {
                for ((p, &logit), &b) in pooled.iter_mut().zip(row).zip(bias) {
                    let weight = (logit + b).max(0.0).ln_1p();
                    *p = p.max(weight);
                }
            }
        }
        Ok(pooled)
    }
}
