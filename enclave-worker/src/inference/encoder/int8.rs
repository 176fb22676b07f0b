//! int8 jobs' weights: SmoothQuant factors and exact channels from a calibration set run in fp32,
//! per-output-channel quantisation, and which products stay wider.

use super::*;

/// A layer's dense weights for `precision: int8`: quantised per output channel, or kept at
/// higher precision where int8's error is too large ([`INT8_PLAN`]).
pub(super) struct Int8Layer {
    pub(super) qkv: Int8Product,
    pub(super) out: Int8Product,
    pub(super) ff1: Int8Product,
    pub(super) ff2: Int8Product,
}

impl Int8Layer {
    fn product_mut(&mut self, product: usize) -> &mut Int8Product {
        match product {
            0 => &mut self.qkv,
            1 => &mut self.out,
            2 => &mut self.ff1,
            3 => &mut self.ff2,
            _ => unreachable!("a layer has four products"),
        }
    }

    /// Bytes of its weights' int8 and wider copies.
    pub(super) fn memory_bytes(&self) -> usize {
        [&self.qkv, &self.out, &self.ff1, &self.ff2]
            .into_iter()
            .map(|p| match p {
                Int8Product::Int8(w) => w.memory_bytes(),
                Int8Product::Bf16(w) => w.memory_bytes(),
                Int8Product::Fp32 => 0,
                Int8Product::Bf16Rounded(w) => w.memory_bytes(),
            })
            .sum()
    }
}

/// One product of an int8 job.
pub(super) enum Int8Product {
    Int8(Int8Weights),
    /// bf16 inputs, f32 sums (where bf16 is faster than f32: [`dense::bf16_pays`]).
    Bf16(Packed<u32>),
    Fp32,
    /// While the calibration measures, where bf16 is not faster: what `Bf16` computes,
    /// emulated (inputs and these weights rounded to bf16, f32 sums); `Fp32` once it is done.
    Bf16Rounded(Weight),
}

/// How int8 jobs compute each product of a layer.
#[derive(Clone, Copy)]
enum Int8Plan {
    /// int8, with this many input channels (those with the largest smoothed calibration
    /// activations) exact in f32.
    Int8 { exact: usize },
    /// `Int8 { exact }` in the layers where the calibration set shows its error small enough
    /// ([`Encoder::int8_layers`]); bf16 (f32 where bf16 is not faster) in the others.
    Measured { exact: usize },
}

/// How int8 jobs compute each layer's products (QKV, attention output, FFN in, FFN out).
/// Measured on all-MiniLM-L6-v2 (per-product ablation in docs/benchmarks.md): with all four in
/// int8 the worst reference text reaches cosine 0.9978 to fp32; FFN out (the GELU output, heavy
/// outliers, 1536 inputs) alone costs more than the other three together, and neither finer
/// activation groups nor exact channels bring it under the bound in every layer — so each
/// layer's FFN out is measured on the calibration set, and the first layers' stay wider. In the
/// other three, 8 exact channels halve the error; FFN out, four times as deep, keeps 16 exact: with
/// 8, layer 1's passed the bound by 2·10⁻⁶ on one CPU and not on another, and the reference texts
/// fell to 0.99896 where it did (16: every measured layer 0.00007 or more from the bound, the
/// worst reference text 0.99919, on Zen 3).
const INT8_PLAN: [Int8Plan; 4] = [
    Int8Plan::Int8 { exact: 8 },
    Int8Plan::Int8 { exact: 8 },
    Int8Plan::Int8 { exact: 8 },
    Int8Plan::Measured { exact: 16 },
];

/// The smallest cosine to fp32 a [`Int8Plan::Measured`] product may leave on the calibration
/// set's mean hidden states: int8's bound (0.999 on every reference text,
/// `tests/inference_reference.rs`) with a margin for texts the eight calibration texts do not
/// resemble (on all-MiniLM-L6-v2 the reference texts ended 0.00017 below the calibration set,
/// the benchmark corpus 0.00004 above it).
const INT8_FIDELITY: f64 = 0.99925;

/// The SmoothQuant migration strength: activation channel `c` is divided by
/// `s_c = max|x_c|^α / max|w_c|^(1−α)` and weight row `c` multiplied by it.
const SMOOTHING_ALPHA: f32 = 0.5;

/// Per input channel, the largest |activation| each of a layer's four products saw.
#[derive(Clone)]
pub(super) struct LayerStats([Vec<f32>; 4]);

impl LayerStats {
    pub(super) fn observe(&mut self, product: usize, x: &[f32]) {
        let max = &mut self.0[product];
        let k = max.len();
        for row in x.chunks_exact(k) {
            for (m, &v) in max.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
    }
}

impl Encoder {
    /// Sets the token sequences (a fixed calibration set, tokenized by the embedder) whose fp32
    /// activations choose the int8 smoothing factors. Without any, int8 quantises unsmoothed.
    pub(crate) fn calibrate_with(&mut self, sequences: impl IntoIterator<Item = Vec<u32>>) {
        let limit = self.max_positions;
        self.calibration = sequences
            .into_iter()
            .filter(|s| !s.is_empty() && s.len() <= limit && s.iter().all(|&id| (id as usize) < self.vocab))
            .collect();
    }

    /// Per layer, the largest |input| of each product over the calibration set, and the final
    /// hidden states, in fp32.
    fn calibration_stats(&self, sequences: &[&[u32]]) -> Result<(Vec<LayerStats>, Vec<f32>), InferenceError> {
        let (h, inter) = (self.hidden, self.layers.first().map_or(0, |l| l.ff2.w.shape().0));
        let mut stats = vec![LayerStats([vec![0f32; h], vec![0f32; h], vec![0f32; h], vec![0f32; inter]]); self.layers.len()];
        let states = self.run(sequences, TokenTypes::Single, |_| Reduced::Fp32, Some(&mut stats), <[f32]>::to_vec)?;
        Ok((stats, states))
    }

    /// The dense weights quantised to int8 per output channel, once, after smoothing the
    /// activations' outlier channels into the weights (SmoothQuant): `x · w = (x / s) · (s · w)`
    /// for any per-channel `s > 0`, exact in real arithmetic, so the factors change only where
    /// the rounding error falls. Products planned [`Int8Plan::Measured`] are then tried in int8
    /// one at a time, last layer first, each kept only if the calibration set's hidden states
    /// stay within [`INT8_FIDELITY`] of fp32 with it and every one kept before.
    ///
    /// Not under `OnceLock::get_or_init`: the calibration passes run on the rayon pool, whose
    /// waiting threads may pick up another window of an int8 job and come back here, which
    /// must not block on the initialisation in progress. Such a thread computes the same
    /// (deterministic) layers again, and the first one stored is kept.
    pub(super) fn int8_layers(&self) -> Result<&[Int8Layer], InferenceError> {
        if let Some(quantised) = self.int8.get() {
            return quantised.as_deref().map_err(Clone::clone);
        }
        let computed = self.quantised_layers(INT8_FIDELITY);
        let _ = self.int8.set(computed);
        self.int8.get().expect("set above").as_deref().map_err(Clone::clone)
    }

    /// [`Encoder::int8_layers`], computed, with `bound` for the measured products.
    fn quantised_layers(&self, bound: f64) -> Result<Vec<Int8Layer>, InferenceError> {
        let sequences: Vec<&[u32]> = self.calibration.iter().map(Vec::as_slice).collect();
        let (stats, reference) = self.calibration_stats(&sequences)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut candidates = Vec::new();
        for (i, (l, LayerStats(seen))) in self.layers.iter().zip(&stats).enumerate() {
            let mut product = |p: usize, original: &Weight| {
                // Without an f32 kernel of ours the weights are gemm's plain rows: packed here
                // only to be quantised.
                let repacked;
                let w = match original {
                    Weight::Packed(w) => w,
                    Weight::Plain { values, rows, cols } => {
                        repacked = Packed::f32(values, *rows, *cols);
                        &repacked
                    }
                };
                match INT8_PLAN[p] {
                    Int8Plan::Int8 { exact } => quantise(w, &seen[p], exact),
                    Int8Plan::Measured { exact } => {
                        candidates.push((i, p, quantise(w, &seen[p], exact)));
                        wider(w, original)
                    }
                }
            };
            layers.push(Int8Layer { qkv: product(0, &l.qkv.w), out: product(1, &l.out.w), ff1: product(2, &l.ff1.w), ff2: product(3, &l.ff2.w) });
        }
        // Without a calibration set nothing can be measured: every candidate stays wider.
        if !sequences.is_empty() {
            for (i, p, candidate) in candidates.into_iter().rev() {
                let kept = std::mem::replace(layers[i].product_mut(p), candidate);
                let states = self.run(&sequences, TokenTypes::Single, |j| Reduced::Int8(&layers[j]), None, <[f32]>::to_vec)?;
                if fidelity(&states, &reference, self.hidden, &sequences) < bound {
                    *layers[i].product_mut(p) = kept;
                }
            }
        }
        for product in layers.iter_mut().flat_map(|l| [&mut l.qkv, &mut l.out, &mut l.ff1, &mut l.ff2]) {
            if matches!(product, Int8Product::Bf16Rounded(_)) {
                *product = Int8Product::Fp32;
            }
        }
        Ok(layers)
    }
}

/// The smallest cosine, over the calibration `sequences`, between a sequence's mean hidden state
/// in `states` and in `reference` (packed `(Σ lengths, hidden)`): how far the pooled vectors
/// moved, whatever the pooling.
fn fidelity(states: &[f32], reference: &[f32], hidden: usize, sequences: &[&[u32]]) -> f64 {
    let mean = |states: &[f32], rows: std::ops::Range<usize>| {
        let mut sum = vec![0f64; hidden];
        for row in states[rows.start * hidden..rows.end * hidden].chunks_exact(hidden) {
            sum.iter_mut().zip(row).for_each(|(s, &v)| *s += f64::from(v));
        }
        sum
    };
    let mut start = 0;
    let mut worst = 1f64;
    for s in sequences {
        let rows = start..start + s.len();
        let (a, b) = (mean(states, rows.clone()), mean(reference, rows));
        let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cosine = dot / (norm(&a) * norm(&b));
        // A zero vector's NaN counts as the worst (f64::min would skip it).
        worst = worst.min(if cosine.is_nan() { -1.0 } else { cosine });
        start += s.len();
    }
    worst
}

/// int8 weights for `w` whose input channels reached `seen` over the calibration set: smoothed,
/// with the `exact` channels still largest after that left out (computed in f32).
fn quantise(w: &Packed<f32>, seen: &[f32], exact: usize) -> Int8Product {
    let smooth = seen.iter().any(|&m| m > 0.0).then(|| smoothing(w, seen, SMOOTHING_ALPHA));
    let exact = largest_channels(seen, smooth.as_deref(), exact);
    Int8Product::Int8(Int8Weights::new(w, smooth.as_deref(), &exact))
}

/// `w` (packed; `original` as the encoder holds it) in bf16 where bf16 is faster than f32
/// ([`dense::bf16_pays`]), else rounded to bf16 for the calibration to measure with (then f32):
/// the products kept wider are chosen as if they ran at bf16 on every CPU, so that every CPU
/// keeps the same ones (and one computing them at fp32 only comes closer to fp32).
fn wider(w: &Packed<f32>, original: &Weight) -> Int8Product {
    if dense::bf16_pays() {
        Int8Product::Bf16(Packed::bf16(w))
    } else {
        Int8Product::Bf16Rounded(original.bf16_rounded())
    }
}

/// SmoothQuant factors for weights `w` (`(k, n)`) whose input channel `c` reached `seen[c]`:
/// `s_c = seen_c^α / max_j|w[c][j]|^(1−α)` rounded to a power of two, 1 for a channel never seen
/// or without weights.
fn smoothing(w: &Packed<f32>, seen: &[f32], alpha: f32) -> Vec<f32> {
    let row_max = w.row_abs_max();
    seen.iter()
        .zip(&row_max)
        .map(|(&x, &w)| {
            if x > 0.0 && w > 0.0 {
                // A power of two: scaling by it is exact in f32, so smoothing itself rounds nothing.
                (x.powf(alpha) / w.powf(1.0 - alpha)).log2().round().clamp(-14.0, 14.0).exp2()
            } else {
                1.0
            }
        })
        .collect()
}

/// The `count` input channels with the largest calibration activations after smoothing
/// (`seen[c] / smooth[c]`), none if no activation was seen; ties to the lower channel.
fn largest_channels(seen: &[f32], smooth: Option<&[f32]>, count: usize) -> Vec<usize> {
    if !seen.iter().any(|&m| m > 0.0) {
        return Vec::new();
    }
    let size = |c: usize| seen[c] / smooth.map_or(1.0, |s| s[c]);
    let mut channels: Vec<usize> = (0..seen.len()).collect();
    channels.sort_by(|&a, &b| size(b).total_cmp(&size(a)).then(a.cmp(&b)));
    channels.truncate(count);
    channels.sort_unstable();
    channels
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model matrix's BERT (tests/testdata/models, scripts/make_test_models.py), calibrated
    /// with a few token sequences or none.
    fn encoder(calibration: Vec<Vec<u32>>) -> Encoder {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/testdata/models/bert");
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let config = ArchConfig::parse(&std::fs::read(dir.join("v6-mean/config.json")).unwrap()).unwrap();
        let mut encoder = Encoder::load(&weights, &config).unwrap();
        encoder.calibrate_with(calibration);
        encoder
    }

    fn ffn_out_in_int8(layers: &[Int8Layer]) -> Vec<bool> {
        layers.iter().map(|l| matches!(l.ff2, Int8Product::Int8(_))).collect()
    }

    /// The measured products follow the bound both ways, and stay wider when nothing can be
    /// measured; the products planned int8 are int8 whatever the bound.
    #[test]
    fn measured_products_follow_the_calibration_bound() {
        if !dense::int8_supported() {
            eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2, so int8 jobs are refused");
            return;
        }
        let calibrated = encoder(vec![vec![2, 17, 45, 91, 3], (5..40).collect(), vec![2, 8, 8, 8, 3]]);
        let layers = calibrated.layers.len();
        let everything = calibrated.quantised_layers(-1.0).unwrap();
        assert_eq!(ffn_out_in_int8(&everything), vec![true; layers]);
        let unreachable = calibrated.quantised_layers(1.5).unwrap();
        assert_eq!(ffn_out_in_int8(&unreachable), vec![false; layers]);
        assert!(unreachable.iter().all(|l| matches!((&l.qkv, &l.out, &l.ff1), (Int8Product::Int8(_), Int8Product::Int8(_), Int8Product::Int8(_)))));
        let uncalibrated = encoder(Vec::new()).quantised_layers(-1.0).unwrap();
        assert_eq!(ffn_out_in_int8(&uncalibrated), vec![false; layers]);
    }

    #[test]
    fn fidelity_is_the_worst_pooled_cosine() {
        let (a, b): (&[u32], &[u32]) = (&[1, 2], &[3]);
        // Two sequences of 2-dimensional states: the first moved by a right angle on one of its
        // two tokens (its mean by 45°), the second not at all.
        let reference = [1.0, 0.0, 1.0, 0.0, 0.5, 0.5];
        let moved = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5];
        assert!((fidelity(&reference, &reference, 2, &[a, b]) - 1.0).abs() < 1e-12);
        assert!((fidelity(&moved, &reference, 2, &[a, b]) - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12);
        let zero = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        assert_eq!(fidelity(&zero, &reference, 2, &[a, b]), -1.0, "a zero vector is the worst, not skipped");
    }
}
