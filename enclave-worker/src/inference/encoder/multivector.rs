//! A ColBERT model's per-token head, as sentence-transformers' `MultiVectorEncoder` computes it
//! for documents: every real token's final state (the first and the separators included) through
//! the token-level Dense module (`y = W·x (+ b)`, identity activation), then each row
//! L2-normalised (the token-level `Normalize`). No skiplist, query expansion or token pooling:
//! the client refuses models that have them when it onboards the directory. Computed in f32
//! whatever the body's precision, like the other heads.

use super::super::InferenceError;
use super::super::embedder::l2_normalize;
use super::super::projection::{self, DenseFiles, TOKEN_EMBEDDINGS};
use super::blocks::{Linear, Tensors};
use super::{Product, dense};

pub(crate) struct MultiVectorHead {
    projection: Linear,
}

impl MultiVectorHead {
    /// The projection from the model's one Dense module (`dense.0.*`), which must read the
    /// `hidden`-wide token states.
    pub(crate) fn load(files: &[DenseFiles<'_>], hidden: usize) -> Result<Self, InferenceError> {
        let [files] = files else {
            return Err(InferenceError::Settings(format!("multivector pooling needs exactly one Dense module, the per-token projection; the model has {}", files.len())));
        };
        let (inp, out, bias) = projection::config(0, files.config, TOKEN_EMBEDDINGS)?;
        let refused = |field: &str, found: String, reason: &'static str| InferenceError::Dense {
            index: 0,
            file: "model.safetensors",
            field: field.into(),
            found,
            reason,
        };
        if inp != hidden {
            return Err(InferenceError::Dense {
                index: 0,
                file: "config.json",
                field: "in_features".into(),
                found: inp.to_string(),
                reason: "differs from the model's hidden size",
            });
        }
        let tensors = Tensors::new(files.weights, "").map_err(|e| refused("(file)", e.to_string(), "not a safetensors file"))?;
        let projection = tensors.linear("linear", out, inp, bias).map_err(|e| refused("linear", e.to_string(), "weights do not match the module's config"))?;
        Ok(Self { projection })
    }

    /// bge-m3's ColBERT head from `colbert_linear.safetensors` (FlagEmbedding's `colbert_linear`:
    /// `weight` `[d, hidden]`, `bias` `[d]`); its vectors are the tokens' after the first
    /// ([`MultiVectorHead::vectors`] of `states[hidden..]`).
    pub(crate) fn colbert_linear(weights: &[u8], hidden: usize) -> Result<Self, InferenceError> {
        let file = protocol::manifest::COLBERT_HEAD_FILE;
        let tensors = Tensors::new(weights, "").map_err(|e| InferenceError::Weights(format!("{file}: {e}")))?;
        let width = match tensors.shape("bias").as_deref() {
            Some(&[width]) if width > 0 => width,
            shape => return Err(InferenceError::Weights(format!("{file}: bias: shape {shape:?}, expected one row of values"))),
        };
        let projection = tensors.linear("", width, hidden, true).map_err(|e| InferenceError::Weights(format!("{file}: {e}")))?;
        Ok(Self { projection })
    }

    /// The width of each token's vector.
    pub(crate) fn dimensions(&self) -> usize {
        self.projection.width()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.projection.memory_bytes()
    }

    /// One text's vectors from its tokens' final states (`n × hidden`): `n × dimensions`, row
    /// after row.
    pub(crate) fn vectors(&self, states: &[f32]) -> Result<Vec<f32>, InferenceError> {
        let h = self.projection.w.shape().0;
        let n = states.len() / h;
        let mut out = Vec::new();
        dense(states, n, &self.projection.w, Product::Fp32, &mut out)?;
        let d = self.dimensions();
        for row in out.chunks_exact_mut(d) {
            if let Some(bias) = &self.projection.b {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
            l2_normalize(row);
        }
        Ok(out)
    }
}
