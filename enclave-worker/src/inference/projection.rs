//! sentence-transformers `Dense` modules after the pooling (EmbeddingGemma: 768 → 3072 → 768):
//! each `y = W·x (+ b)` with the identity activation, in pipeline order, before Matryoshka
//! truncation and normalisation, as sentence-transformers applies them. Their files are sealed
//! and hashed with the rest of the model (`dense.N.config.json`, `dense.N.safetensors`,
//! [`protocol::manifest::dense_file_names`]); here each module's config is checked again, field by
//! field, and its weights' shape against the config and against the vector it receives.

use serde_json::Value;

use super::InferenceError;
use super::encoder::blocks::Tensors;

/// sentence-transformers' name of the identity activation (`fullname(nn.Identity())`).
pub const IDENTITY: &str = "torch.nn.modules.linear.Identity";
/// The pooled vector's key in sentence-transformers' features: a Dense module after the pooling
/// must read and write it.
const SENTENCE_EMBEDDING: &str = "sentence_embedding";
/// The per-token states' key: a multi-vector model's projection reads and writes it.
pub(crate) const TOKEN_EMBEDDINGS: &str = "token_embeddings";
/// Widest input or output a Dense module may have.
const MAX_FEATURES: usize = 65_536;

/// One Dense module's two files, as bytes in memory (decrypted and hash-checked by the loader).
#[derive(Debug, Clone, Copy)]
pub struct DenseFiles<'a> {
    /// The module's `config.json`.
    pub config: &'a [u8],
    /// The module's `model.safetensors` (`linear.weight` `(out, in)`, `linear.bias` if `bias`).
    pub weights: &'a [u8],
}

/// One linear map: `w` row-major `(out, in)`.
struct Linear {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    inp: usize,
    out: usize,
}

/// The Dense modules of a model, in order; empty for a model without any.
pub(crate) struct Projection {
    layers: Vec<Linear>,
}

fn refused(index: usize, file: &'static str, field: impl Into<String>, found: impl std::fmt::Display, reason: &'static str) -> InferenceError {
    InferenceError::Dense { index, file, field: field.into(), found: found.to_string(), reason }
}

/// Reads and checks one module's config: `(in, out, bias)`; it must map the features under `key`
/// ([`SENTENCE_EMBEDDING`] or [`TOKEN_EMBEDDINGS`]).
pub(crate) fn config(index: usize, bytes: &[u8], key: &'static str) -> Result<(usize, usize, bool), InferenceError> {
    let config: Value = serde_json::from_slice(bytes).map_err(|e| refused(index, "config.json", "(file)", e, "not JSON"))?;
    let object = config.as_object().ok_or_else(|| refused(index, "config.json", "(file)", &config, "not a JSON object"))?;
    let features = |name: &str| {
        let value = object.get(name).ok_or_else(|| refused(index, "config.json", name, "(absent)", "must be stated"))?;
        value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|v| (1..=MAX_FEATURES).contains(v))
            .ok_or_else(|| refused(index, "config.json", name, value, "not a count within the engine's cap"))
    };
    let mut bias = true; // sentence-transformers' default
    for (name, value) in object {
        match name.as_str() {
            "in_features" | "out_features" => {}
            "bias" => bias = value.as_bool().ok_or_else(|| refused(index, "config.json", "bias", value, "not a boolean"))?,
            // Absent: sentence-transformers' default, Tanh.
            "activation_function" if value == IDENTITY => {}
            "activation_function" => return Err(refused(index, "config.json", name.as_str(), value, "only the identity activation is computed")),
            "module_input_name" | "module_output_name" if value == key => {}
            "module_input_name" | "module_output_name" => {
                let reason = if key == TOKEN_EMBEDDINGS {
                    "a multi-vector projection must map the token embeddings"
                } else {
                    "a Dense module must map the sentence embedding"
                };
                return Err(refused(index, "config.json", name.as_str(), value, reason));
            }
            "use_residual" if value == false => {}
            _ => return Err(refused(index, "config.json", name.as_str(), value, "a Dense setting the engine does not compute")),
        }
    }
    if !object.contains_key("activation_function") {
        return Err(refused(index, "config.json", "activation_function", "(absent: Tanh)", "only the identity activation is computed"));
    }
    Ok((features("in_features")?, features("out_features")?, bias))
}

impl Projection {
    /// Loads the modules in order; the first takes `pooled` values, each the previous one's output.
    pub(crate) fn load(files: &[DenseFiles<'_>], pooled: usize) -> Result<Self, InferenceError> {
        let mut layers = Vec::with_capacity(files.len());
        let mut width = pooled;
        for (index, files) in files.iter().enumerate() {
            let (inp, out, bias) = config(index, files.config, SENTENCE_EMBEDDING)?;
            if inp != width {
                return Err(refused(index, "config.json", "in_features", inp, "differs from the width of the vector it receives"));
            }
            let tensors = Tensors::new(files.weights, "").map_err(|e| refused(index, "model.safetensors", "(file)", e, "not a safetensors file"))?;
            let shape_err = |e: InferenceError| refused(index, "model.safetensors", "linear", e, "weights do not match the module's config");
            let w = tensors.values("linear.weight", &[out, inp]).map_err(shape_err)?;
            let b = if bias { Some(tensors.values("linear.bias", &[out]).map_err(shape_err)?) } else { None };
            layers.push(Linear { w, b, inp, out });
            width = out;
        }
        Ok(Self { layers })
    }

    /// The length of the vectors it returns for `pooled` values in.
    pub(crate) fn output_width(&self, pooled: usize) -> usize {
        self.layers.last().map_or(pooled, |l| l.out)
    }

    /// Each module in order over one pooled vector (sums in f64, rounded once).
    pub(crate) fn apply(&self, mut vector: Vec<f32>) -> Vec<f32> {
        for layer in &self.layers {
            debug_assert_eq!(vector.len(), layer.inp);
            vector = layer
                .w
                .chunks_exact(layer.inp)
                .enumerate()
                .map(|(o, row)| {
                    let dot: f64 = row.iter().zip(&vector).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
                    (dot + layer.b.as_ref().map_or(0.0, |b| f64::from(b[o]))) as f32
                })
                .collect();
        }
        vector
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.w.len() + l.b.as_ref().map_or(0, Vec::len)) * std::mem::size_of::<f32>()).sum()
    }
}
