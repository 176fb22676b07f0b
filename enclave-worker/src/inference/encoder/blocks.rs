//! The building blocks every architecture's layers are made of: LayerNorm with or without a
//! bias and RMSNorm, linear layers with or without one (their width is their weight's), rotary position tables,
//! and the reader that takes them from a checkpoint by name. An architecture is a map from its
//! tensor names onto these ([`super::Layer`], [`Embeddings`]); the encoder's one layer loop
//! computes them all.

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::super::InferenceError;
use super::super::dense::{self, Packed};
use super::super::kernels;

pub(crate) fn weights_err(e: impl std::fmt::Display) -> InferenceError {
    InferenceError::Weights(e.to_string())
}

/// How a checkpoint stores its floats. The encoder computes in f32 (and makes its own bf16/int8
/// copies), so bf16 and f16 weights — Qwen3-Embedding ships bf16 — are widened at read, which is
/// exact: every bf16 and f16 value is an f32 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    F32,
    Bf16,
    F16,
}

impl Stored {
    pub(crate) fn of(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F32 => Some(Self::F32),
            Dtype::BF16 => Some(Self::Bf16),
            Dtype::F16 => Some(Self::F16),
            _ => None,
        }
    }

    fn width(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// One little-endian value of [`Stored::width`] bytes.
    fn read(self, bytes: &[u8]) -> f32 {
        match self {
            Self::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            Self::Bf16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            Self::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
        }
    }

    fn values(self, data: &[u8]) -> impl Iterator<Item = f32> + '_ {
        data.chunks_exact(self.width()).map(move |bytes| self.read(bytes))
    }
}

/// A norm's weights: LayerNorm (without `beta`, a LayerNorm without bias) or RMSNorm.
pub(crate) struct Norm {
    pub(crate) gamma: Vec<f32>,
    pub(crate) beta: Option<Vec<f32>>,
    pub(crate) kind: NormKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormKind {
    /// `(x − mean) / √(var + eps) · γ (+ β)`.
    Layer,
    /// `x / √(mean(x²) + eps) · γ` (Qwen3, T5): no centring, no bias.
    Rms,
}

impl Norm {
    pub(crate) fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(self.gamma.as_slice()) + self.beta.as_deref().map_or(0, std::mem::size_of_val)
    }

    /// `out ← Norm(x + bias + residual)` for one row (the sum's terms that are given).
    #[inline(always)]
    pub(crate) fn apply(&self, out: &mut [f32], x: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, eps: f32) {
        match self.kind {
            NormKind::Layer => kernels::add_layer_norm(out, x, bias, residual, &self.gamma, self.beta.as_deref(), eps),
            NormKind::Rms => kernels::add_rms_norm(out, x, bias, residual, &self.gamma, eps),
        }
    }

    /// One row normalised in place (a head's query or key).
    #[inline(always)]
    pub(crate) fn apply_in_place(&self, row: &mut [f32], eps: f32) {
        match self.kind {
            NormKind::Layer => {
                let input = row.to_vec();
                kernels::add_layer_norm(row, &input, None, None, &self.gamma, self.beta.as_deref(), eps);
            }
            NormKind::Rms => kernels::rms_norm_in_place(row, &self.gamma, eps),
        }
    }
}

/// A dense layer's `(in, out)` weights: packed for our f32 kernel (AVX-512 or AVX2), or
/// row-major for gemm's on a CPU with neither.
pub(crate) enum Weight {
    Packed(Packed<f32>),
    Plain { values: Vec<f32>, rows: usize, cols: usize },
}

impl Weight {
    pub(crate) fn new(values: Vec<f32>, rows: usize, cols: usize) -> Result<Self, InferenceError> {
        if dense::f32_supported() {
            Ok(Weight::Packed(Packed::f32(&values, rows, cols)))
        } else {
            if values.len() != rows * cols {
                return Err(InferenceError::Weights(format!("{} values for ({rows}, {cols})", values.len())));
            }
            Ok(Weight::Plain { values, rows, cols })
        }
    }

    /// The same weights rounded to bf16, still f32: bf16's arithmetic on a CPU without it.
    pub(crate) fn bf16_rounded(&self) -> Self {
        match self {
            Weight::Packed(p) => Weight::Packed(p.bf16_rounded()),
            Weight::Plain { values, rows, cols } => {
                Weight::Plain { values: values.iter().map(|&v| dense::bf16_rounded(v)).collect(), rows: *rows, cols: *cols }
            }
        }
    }

    /// `(in, out)`.
    pub(crate) fn shape(&self) -> (usize, usize) {
        match self {
            Weight::Packed(p) => (p.rows(), p.cols()),
            Weight::Plain { rows, cols, .. } => (*rows, *cols),
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        match self {
            Weight::Packed(p) => p.memory_bytes(),
            Weight::Plain { values, .. } => std::mem::size_of_val(values.as_slice()),
        }
    }
}

/// A linear layer: weights and, if the architecture has one, a bias of the output's width.
pub(crate) struct Linear {
    pub(crate) w: Weight,
    pub(crate) b: Option<Vec<f32>>,
}

impl Linear {
    /// Output width: the weight's, whether or not there is a bias.
    pub(crate) fn width(&self) -> usize {
        self.w.shape().1
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.w.memory_bytes() + self.b.as_deref().map_or(0, std::mem::size_of_val)
    }
}

/// What a layer's input embeddings are: word rows, plus for absolute-position architectures a
/// position row and the token's type row, then a norm where the architecture has one.
pub(crate) struct Embeddings {
    pub(crate) word: Vec<f32>,
    /// `None`: positions are rotary, inside attention.
    pub(crate) position: Option<Vec<f32>>,
    /// Token type 0 (a single text, a pair's first segment); zeros for MPNet, which has none.
    pub(crate) token_type: Vec<f32>,
    /// Token type 1 (a pair's second segment: BERT cross-encoders); `None` where the model has
    /// one type or none.
    pub(crate) second_type: Option<Vec<f32>>,
    /// `None`: the word rows as they are (Qwen3).
    pub(crate) norm: Option<Norm>,
}

impl Embeddings {
    pub(crate) fn memory_bytes(&self) -> usize {
        let values = |v: &[f32]| std::mem::size_of_val(v);
        values(&self.word) + self.position.as_deref().map_or(0, values) + values(&self.token_type)
            + self.second_type.as_deref().map_or(0, values) + self.norm.as_ref().map_or(0, Norm::memory_bytes)
    }
}

/// The token types of a forward pass's sequences: all 0 (single texts), or per sequence the
/// index its second segment starts at (type 1 from there to its end: a BERT pair's second text
/// and its closing `[SEP]`), `None` for a sequence of one segment.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TokenTypes<'a> {
    Single,
    Pairs(&'a [Option<usize>]),
}

impl TokenTypes<'_> {
    /// Each packed token's type, whether it is 1, sequence after sequence; checked against the
    /// sequences' lengths and against the model's having a second type.
    pub(crate) fn second_flags(self, lengths: impl ExactSizeIterator<Item = usize>, second_type: bool) -> Result<Vec<bool>, InferenceError> {
        let TokenTypes::Pairs(starts) = self else {
            return Ok(lengths.flat_map(|n| std::iter::repeat_n(false, n)).collect());
        };
        if starts.len() != lengths.len() {
            return Err(InferenceError::Forward(format!("{} token type boundaries for {} sequences", starts.len(), lengths.len())));
        }
        let mut flags = Vec::new();
        for (n, &start) in lengths.zip(starts) {
            let start = match start {
                None => n,
                Some(_) if !second_type => return Err(InferenceError::Forward("a second segment, and the model embeds one token type".into())),
                Some(s) if s > n => return Err(InferenceError::Forward(format!("a second segment at {s} of {n} tokens"))),
                Some(s) => s,
            };
            flags.extend((0..n).map(|i| i >= start));
        }
        Ok(flags)
    }
}

/// Reads a checkpoint's tensors by name (after an optional prefix, for checkpoints saved from a
/// task model), checking dtype and shape, straight into the layouts the encoder computes with.
pub(crate) struct Tensors<'a> {
    file: SafeTensors<'a>,
    prefix: &'static str,
}

impl<'a> Tensors<'a> {
    pub(crate) fn new(weights: &'a [u8], prefix: &'static str) -> Result<Self, InferenceError> {
        let file = SafeTensors::deserialize(weights).map_err(weights_err)?;
        let prefix = if file.names().iter().any(|n| n.starts_with(prefix)) { prefix } else { "" };
        Ok(Self { file, prefix })
    }

    /// Whether the checkpoint holds a tensor of this name.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.file.tensor(&format!("{}{name}", self.prefix)).is_ok()
    }

    /// A tensor's shape, if the checkpoint holds it.
    pub(crate) fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.file.tensor(&format!("{}{name}", self.prefix)).ok().map(|view| view.shape().to_vec())
    }

    /// A tensor's bytes and how they store its values, once its dtype and shape are checked.
    fn view(&self, name: &str, shape: &[usize]) -> Result<(TensorView<'_>, Stored), InferenceError> {
        let view = self.file.tensor(&format!("{}{name}", self.prefix)).map_err(|e| weights_err(format!("{name}: {e}")))?;
        let Some(stored) = Stored::of(view.dtype()) else {
            return Err(weights_err(format!("{name}: dtype {:?}, the fused encoder reads F32, BF16 or F16", view.dtype())));
        };
        if view.shape() != shape {
            return Err(weights_err(format!("{name}: shape {:?}, expected {shape:?}", view.shape())));
        }
        Ok((view, stored))
    }

    pub(crate) fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, InferenceError> {
        let (view, stored) = self.view(name, shape)?;
        Ok(stored.values(view.data()).collect())
    }

    /// The first row of a `(rows, cols)` tensor.
    pub(crate) fn first_row(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, InferenceError> {
        self.row(name, rows, cols, 0)
    }

    /// Row `index` of a `(rows, cols)` tensor.
    pub(crate) fn row(&self, name: &str, rows: usize, cols: usize, index: usize) -> Result<Vec<f32>, InferenceError> {
        let (view, stored) = self.view(name, &[rows, cols])?;
        if index >= rows {
            return Err(weights_err(format!("{name}: no row {index} of {rows}")));
        }
        let width = stored.width() * cols;
        Ok(stored.values(&view.data()[index * width..(index + 1) * width]).collect())
    }

    /// Linear weights are stored `(out, in)`; the products want `(in, out)`, possibly several side
    /// by side: `dst` has `dst_cols` columns and this weight goes to columns `col..col + out`.
    fn transpose_into(&self, name: &str, out: usize, inp: usize, dst: &mut [f32], dst_cols: usize, col: usize) -> Result<(), InferenceError> {
        let (view, stored) = self.view(name, &[out, inp])?;
        for (o, row) in view.data().chunks_exact(stored.width() * inp).enumerate() {
            for (i, value) in stored.values(row).enumerate() {
                dst[i * dst_cols + col + o] = value;
            }
        }
        Ok(())
    }

    /// A linear layer `{name}.weight` `(out, in)`, with `{name}.bias` if `bias`.
    pub(crate) fn linear(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear, InferenceError> {
        self.fused(&[name], out, inp, bias)
    }

    /// Several linear layers over the same input as one, their outputs side by side (Q | K | V).
    pub(crate) fn fused(&self, names: &[&str], out: usize, inp: usize, bias: bool) -> Result<Linear, InferenceError> {
        let parts: Vec<(&str, usize)> = names.iter().map(|&name| (name, out)).collect();
        self.fused_parts(&parts, inp, bias)
    }

    /// [`Tensors::fused`] with a width per part: grouped-query attention's Q | K | V, where K and
    /// V have fewer heads than Q.
    pub(crate) fn fused_parts(&self, parts: &[(&str, usize)], inp: usize, bias: bool) -> Result<Linear, InferenceError> {
        let cols: usize = parts.iter().map(|&(_, out)| out).sum();
        let mut w = vec![0f32; inp * cols];
        let mut b = Vec::with_capacity(if bias { cols } else { 0 });
        let mut col = 0;
        for &(name, out) in parts {
            // A file holding one Linear's state dict alone names its tensors `weight` and `bias`.
            let part = |part: &str| if name.is_empty() { part.to_owned() } else { format!("{name}.{part}") };
            self.transpose_into(&part("weight"), out, inp, &mut w, cols, col)?;
            if bias {
                b.extend(self.values(&part("bias"), &[out])?);
            }
            col += out;
        }
        Ok(Linear { w: Weight::new(w, inp, cols)?, b: bias.then_some(b) })
    }

    /// A linear layer without bias stored as two halves `[a | b]` (rows), read as `[b | a]`: GTE's
    /// `up_gate_proj` holds up then gate, and the gated activations take the activated half first.
    pub(crate) fn linear_halves_swapped(&self, name: &str, out: usize, inp: usize) -> Result<Linear, InferenceError> {
        if !out.is_multiple_of(2) {
            return Err(weights_err(format!("{name}: {out} rows do not split in halves")));
        }
        let mut w = vec![0f32; inp * out];
        self.transpose_into(&format!("{name}.weight"), out, inp, &mut w, out, 0)?;
        for row in w.chunks_exact_mut(out) {
            row.rotate_left(out / 2);
        }
        Ok(Linear { w: Weight::new(w, inp, out)?, b: None })
    }

    /// A LayerNorm `{name}.weight`, with `{name}.bias` if `bias`.
    pub(crate) fn norm(&self, name: &str, len: usize, bias: bool) -> Result<Norm, InferenceError> {
        Ok(Norm {
            gamma: self.values(&format!("{name}.weight"), &[len])?,
            beta: if bias { Some(self.values(&format!("{name}.bias"), &[len])?) } else { None },
            kind: NormKind::Layer,
        })
    }

    /// An RMSNorm `{name}.weight`.
    pub(crate) fn rms_norm(&self, name: &str, len: usize) -> Result<Norm, InferenceError> {
        Ok(Norm { gamma: self.values(&format!("{name}.weight"), &[len])?, beta: None, kind: NormKind::Rms })
    }
}

/// Rotary position embedding for one base (`rope_theta`), transformers' default kind: pairs
/// `(x[k], x[k + d/2])` of each head's query and key turned by `position · base^(−2k/d)`.
pub(crate) struct Rotary {
    /// `base^(−2k/d)` for `k < d/2`, in f32 as transformers computes it.
    inv_freq: Vec<f32>,
}

/// `cos` and `sin` of every position's angles up to some length: `(positions, d/2)` each.
pub(crate) struct RotaryTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl Rotary {
    pub(crate) fn new(base: f32, head_dim: usize) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|k| {
                // transformers: 1 / base ** (arange(0, d, 2).float() / d), in f32.
                let exponent = (2 * k) as f32 / head_dim as f32;
                1.0 / (f64::from(base).powf(f64::from(exponent)) as f32)
            })
            .collect();
        Self { inv_freq }
    }

    /// The angles of positions `0..positions`: `position · inv_freq` rounded to f32 as
    /// transformers rounds it, then its cosine and sine.
    pub(crate) fn table(&self, positions: usize) -> RotaryTable {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &self.inv_freq {
                let angle = f64::from(p as f32 * f);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RotaryTable { cos, sin, half }
    }
}

impl RotaryTable {
    /// Turns one head's `d` values at `position` in place: `x·cos + rotate_half(x)·sin`.
    #[inline(always)]
    pub(crate) fn apply(&self, x: &mut [f32], position: usize) {
        let half = self.half;
        let (cos, sin) = (&self.cos[position * half..(position + 1) * half], &self.sin[position * half..(position + 1) * half]);
        let (a, b) = x.split_at_mut(half);
        for (((a, b), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
            let (x1, x2) = (*a, *b);
            *a = x1 * c - x2 * s;
            *b = x2 * c + x1 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair's tokens from its second segment on are type 1; single texts and pairs without a
    /// second segment are all type 0; a boundary list of another length, one past its sequence,
    /// or any second segment for a model of one type is refused.
    #[test]
    fn token_types_mark_each_pairs_second_segment() {
        let lengths = [4usize, 3, 5];
        let flags = TokenTypes::Pairs(&[Some(2), None, Some(5)]).second_flags(lengths.iter().copied(), true).unwrap();
        let want = [false, false, true, true, false, false, false, false, false, false, false, false];
        assert_eq!(flags, want);
        assert_eq!(TokenTypes::Single.second_flags(lengths.iter().copied(), true).unwrap(), vec![false; 12]);
        let refused = [
            TokenTypes::Pairs(&[Some(2), None]).second_flags(lengths.iter().copied(), true),
            TokenTypes::Pairs(&[Some(5), None, None]).second_flags(lengths.iter().copied(), true),
            TokenTypes::Pairs(&[Some(2), None, None]).second_flags(lengths.iter().copied(), false),
        ];
        let messages: Vec<String> = refused.into_iter().map(|r| r.unwrap_err().to_string()).collect();
        for (message, names) in messages.iter().zip(["2 token type boundaries for 3 sequences", "at 5 of 4 tokens", "one token type"]) {
            assert!(message.contains(names), "{message}");
        }
    }

    /// Each pair turns by its angle: a rotation keeps the pair's length, and position 0 is the
    /// identity.
    #[test]
    fn rotary_turns_each_pair_by_its_angle() {
        let (d, base) = (8, 10_000.0f32);
        let rotary = Rotary::new(base, d);
        let table = rotary.table(40);
        let x: Vec<f32> = (0..d).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut at0 = x.clone();
        table.apply(&mut at0, 0);
        assert_eq!(at0, x);
        let mut y = x.clone();
        table.apply(&mut y, 37);
        for k in 0..d / 2 {
            let angle = 37.0 * f64::from(base).powf(-(2.0 * k as f64) / d as f64);
            let (x1, x2) = (f64::from(x[k]), f64::from(x[k + d / 2]));
            let want = (x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin());
            assert!((f64::from(y[k]) - want.0).abs() < 1e-5 && (f64::from(y[k + d / 2]) - want.1).abs() < 1e-5, "{k}");
        }
    }
}
