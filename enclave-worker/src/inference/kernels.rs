//! Element-wise kernels of the fused encoder, in plain safe Rust written so that LLVM vectorises
//! them (branch-free bodies, independent accumulator lanes instead of serial float reductions).
//! Callers run them inside [`vectorized`], which compiles them once per SIMD level and picks the
//! widest this CPU has at run time (the binary itself targets the x86-64 baseline, SSE2). Their
//! polynomials and sums of products use `mul_add`: one FMA instruction at the AVX2 and AVX-512
//! levels (LLVM does not fuse a separate multiply and add by itself), a libm call at the
//! baseline. The one exception is the softmax's two row passes ([`max`], [`exp_shifted`]): where
//! the CPU has AVX-512 they run as intrinsics with a masked tail ([`avx512`], the same bits).
//! The matrix products are in [`super::dense`].

/// Runs `f` compiled for the widest SIMD level of this CPU (AVX-512, AVX2 + FMA, or the
/// baseline), chosen at run time. `f` must be `#[inline(always)]` (a closure can be), like the
/// kernels below, so that it is compiled into the dispatcher's code for each level.
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// 1.5·2^23: `x + ROUND_TO_INTEGER` (|x| ≤ 2^22) is rounded to an integer, ties to even, which
/// the sum's low mantissa bits then hold (two's complement for negative x); subtracting it again
/// gives the integer as an f32. Branch-free and vectorisable, unlike a float-to-int cast.
const ROUND_TO_INTEGER: f32 = 12_582_912.0;

const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `2^k` from `t = k + ROUND_TO_INTEGER` (k an integer in [-126, 127]): `t`'s low mantissa bits
/// hold k (two's complement, |k| < 2^22), and 2^k's exponent field is k + 127, taken with integer
/// operations only (a float-to-int cast would not vectorise).
#[inline(always)]
fn two_to_the_rounded(t: f32) -> f32 {
    let biased = t.to_bits().wrapping_sub(ROUND_TO_INTEGER.to_bits()).wrapping_add(127);
    f32::from_bits(biased << 23)
}

/// Independent accumulator lanes for reductions (a serial float sum does not vectorise).
const LANES: usize = 16;

/// `e^x` for f32, branch-free: `x = k·ln2 + r`, `|r| ≤ ln2/2`, Cephes' degree-7 polynomial for
/// `e^r`, `2^k` built in the exponent bits. Relative error below 2e-7 on [-87, 88]; inputs are
/// clamped to that range (softmax only feeds values ≤ 0).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4; // 0.693359375 = 355/512, exact in f32
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = x.mul_add(LOG2E, ROUND_TO_INTEGER);
    let k = t - ROUND_TO_INTEGER;
    let r = k.mul_add(-LN2_LO, k.mul_add(-LN2_HI, x));
    let r2 = r * r;
    let p = 1.987_569_1e-4f32.mul_add(r, 1.398_199_9e-3).mul_add(r, 8.333_452e-3).mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1).mul_add(r, 0.5); // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let e_r = p.mul_add(r2, r) + 1.0;
    e_r * two_to_the_rounded(t)
}

/// `2^x` for f32, branch-free: `x = k + f`, `|f| ≤ 1/2`, a degree-5 polynomial for `2^f`
/// (fitted for relative error, 2.2e-7 at most evaluated in f32), `2^k` built in the exponent
/// bits. Inputs are clamped to [-126, 127]. Five fused multiply-adds where [`exp`]'s reduction
/// and polynomial take eight: the softmax's exponentials ([`exp_shifted`]).
#[inline(always)]
pub(crate) fn exp2(x: f32) -> f32 {
    let x = x.clamp(-126.0, 127.0);
    let t = x + ROUND_TO_INTEGER;
    let f = x - (t - ROUND_TO_INTEGER);
    let p = EXP2_POLYNOMIAL[1..].iter().fold(EXP2_POLYNOMIAL[0], |p, &c| p.mul_add(f, c));
    p * two_to_the_rounded(t)
}

/// [`exp2`]'s polynomial for `2^f`, highest degree first (Horner's order).
const EXP2_POLYNOMIAL: [f32; 6] = [1.327_646_9e-3, 9.675_541e-3, 5.550_713_5e-2, 0.240_221_2, 0.693_146_94, 1.0];

/// `erf(x)` for f32: the odd/even rational approximation on [-4, 4] used by Eigen and XLA
/// (`x·P(x²)/Q(x²)`, degree 13/8), ±1 outside. Absolute error ≈ 1e-7.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = (-2.726_142_3e-10f32).mul_add(x2, 2.770_681_4e-8).mul_add(x2, -2.101_024e-6).mul_add(x2, -5.692_506_4e-5);
    let p = p.mul_add(x2, -7.349_906_3e-4).mul_add(x2, -2.954_6e-3).mul_add(x2, -1.609_603_3e-2) * x;
    let q = (-1.456_607_2e-5f32).mul_add(x2, -2.133_740_6e-4).mul_add(x2, -1.682_827e-3).mul_add(x2, -7.373_329e-3);
    let q = q.mul_add(x2, -1.426_473_9e-2);
    p / q
}

/// The exact (erf) GELU of one value.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let half = 0.5 * x;
    half.mul_add(erf(x * std::f32::consts::FRAC_1_SQRT_2), half)
}

/// `row ← gelu(row + bias)` in place, with the exact (erf) GELU.
#[inline(always)]
pub(crate) fn bias_gelu_in_place(row: &mut [f32], bias: &[f32]) {
    for (o, &b) in row.iter_mut().zip(bias) {
        *o = gelu(*o + b);
    }
}

/// `row ← gelu(row)` in place (a linear layer without bias).
#[inline(always)]
pub(crate) fn gelu_in_place(row: &mut [f32]) {
    for o in row.iter_mut() {
        *o = gelu(*o);
    }
}

/// GeGLU: `out ← gelu(input) · gate` where `input` and `gate` are the two halves of `row` (the
/// gated linear layer's output, `[input | gate]`, each `out.len()` wide).
#[inline(always)]
pub(crate) fn geglu(out: &mut [f32], row: &[f32]) {
    let (input, gate) = row.split_at(out.len());
    assert_eq!(gate.len(), out.len());
    for ((o, &x), &g) in out.iter_mut().zip(input).zip(gate) {
        *o = gelu(x) * g;
    }
}

/// The tanh approximation of GELU (`gelu_pytorch_tanh`, Gemma's `hidden_activation`):
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, computed as `x / (1 + e^(−2u))` — the same
/// function (`(1 + tanh u) / 2` is the logistic of `2u`) through the vectorisable [`exp`].
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (0.044_715 * x * x).mul_add(x, x);
    x / (1.0 + exp(-2.0 * u))
}

/// GeGLU with the tanh GELU: `out ← gelu_tanh(gate) · up` (Gemma's `[gate | up]`).
#[inline(always)]
pub(crate) fn geglu_tanh(out: &mut [f32], row: &[f32]) {
    let (gate, up) = row.split_at(out.len());
    assert_eq!(up.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// Sum with independent lanes (vectorisable).
#[inline(always)]
pub(crate) fn sum(values: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += v;
        }
    }
    halving(acc, |a, b| a + b) + chunks.remainder().iter().sum::<f32>()
}

/// Maximum of a softmax row: AVX-512's masked chunks where the CPU has them ([`avx512`]), else
/// [`max_lanes`]. `-inf` for an empty slice.
#[inline(always)]
pub(crate) fn max(values: &[f32]) -> f32 {
    if avx512::supported() { avx512::max(values) } else { max_lanes(values) }
}

/// Maximum with independent lanes (vectorisable). `-inf` for an empty slice.
#[inline(always)]
fn max_lanes(values: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = if v > *a { v } else { *a };
        }
    }
    // The tail: the last full chunk again where there is one (values seen twice change no
    // maximum), else the values themselves.
    let tail = if values.len() >= LANES && !chunks.remainder().is_empty() { &values[values.len() - LANES..] } else { chunks.remainder() };
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a = if v > *a { v } else { *a };
    }
    halving(acc, |a, b| if b > a { b } else { a })
}

/// The lanes folded into one by halving: `op` of lane `i` and lane `i + width` for width 8, 4,
/// 2, 1. Four dependent steps where a fold from the first lane to the last is sixteen, and the
/// order AVX-512's softmax passes fold in (they give these bits).
#[inline(always)]
fn halving(mut acc: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] = op(acc[i], acc[i + width]);
        }
        width /= 2;
    }
    acc[0]
}

/// `out ← LayerNorm(x + bias + residual)` for one row (`gamma`, `beta`, `bias` of the row's length;
/// without `beta` a LayerNorm without bias). Three passes: the sum, the centred values and their
/// squares, the scaled result.
#[inline(always)]
pub(crate) fn add_layer_norm(
    out: &mut [f32],
    x: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
) {
    let n = out.len();
    assert!(x.len() == n && gamma.len() == n && beta.is_none_or(|b| b.len() == n));
    assert!(bias.is_none_or(|b| b.len() == n) && residual.is_none_or(|r| r.len() == n));
    match (bias, residual) {
        (Some(bias), Some(residual)) => {
            for (((o, &v), &b), &r) in out.iter_mut().zip(x).zip(bias).zip(residual) {
                *o = v + b + r;
            }
        }
        (Some(other), None) | (None, Some(other)) => {
            for ((o, &v), &b) in out.iter_mut().zip(x).zip(other) {
                *o = v + b;
            }
        }
        (None, None) => out.copy_from_slice(x),
    }
    let mean = sum(out) / n as f32;
    let mut acc = [0f32; LANES];
    let mut chunks = out.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (a, o) in acc.iter_mut().zip(chunk) {
            *o -= mean;
            *a = o.mul_add(*o, *a);
        }
    }
    let mut tail = 0f32;
    for o in chunks.into_remainder() {
        *o -= mean;
        tail = o.mul_add(*o, tail);
    }
    let var = (halving(acc, |a, b| a + b) + tail) / n as f32;
    let inv = 1.0 / (var + eps).sqrt();
    match beta {
        Some(beta) => {
            for ((o, &g), &b) in out.iter_mut().zip(gamma).zip(beta) {
                *o = (*o * inv).mul_add(g, b);
            }
        }
        None => {
            for (o, &g) in out.iter_mut().zip(gamma) {
                *o = *o * inv * g;
            }
        }
    }
}

/// `out ← RMSNorm(x (+ bias) (+ residual))` for one row: `v · (1 / √(mean(v²) + eps)) · γ`, in
/// that order, as transformers' `Qwen3RMSNorm` computes it in f32.
#[inline(always)]
pub(crate) fn add_rms_norm(out: &mut [f32], x: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, gamma: &[f32], eps: f32) {
    let n = out.len();
    assert!(x.len() == n && gamma.len() == n);
    assert!(bias.is_none_or(|b| b.len() == n) && residual.is_none_or(|r| r.len() == n));
    out.copy_from_slice(x);
    for extra in [bias, residual].into_iter().flatten() {
        for (o, &v) in out.iter_mut().zip(extra) {
            *o += v;
        }
    }
    rms_norm_in_place(out, gamma, eps);
}

/// One row's RMSNorm in place ([`add_rms_norm`] without the sum).
#[inline(always)]
pub(crate) fn rms_norm_in_place(row: &mut [f32], gamma: &[f32], eps: f32) {
    assert_eq!(row.len(), gamma.len());
    let mut acc = [0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = v.mul_add(v, *a);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    let mean = (halving(acc, |a, b| a + b) + tail) / row.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for (o, &g) in row.iter_mut().zip(gamma) {
        *o = g * (*o * inv);
    }
}

/// SwiGLU: `out ← silu(gate) · up` where `gate` and `up` are the two halves of `row` (the fused
/// gate and up projections, `[gate | up]`, each `out.len()` wide); `silu(x) = x / (1 + e^−x)`.
#[inline(always)]
pub(crate) fn swiglu(out: &mut [f32], row: &[f32]) {
    let (gate, up) = row.split_at(out.len());
    assert_eq!(up.len(), out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

/// `out ← out + x (+ bias)` for one row: a pre-norm layer's residual.
#[inline(always)]
pub(crate) fn add_residual(out: &mut [f32], x: &[f32], bias: Option<&[f32]>) {
    assert!(x.len() == out.len() && bias.is_none_or(|b| b.len() == out.len()));
    match bias {
        Some(bias) => {
            for ((o, &v), &b) in out.iter_mut().zip(x).zip(bias) {
                *o += v + b;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o += v;
            }
        }
    }
}

/// `row ← exp(row − max(row))`, returning the sum of the new values: softmax without its final
/// division, which callers apply to what they compute from the row (fewer values).
#[inline(always)]
pub(crate) fn softmax_unnormalised(row: &mut [f32]) -> f32 {
    exp_shifted(row, max(row))
}

/// `row ← exp(row − m)`, returning the sum of the new values (`m` at least the row's maximum:
/// a softmax carried across blocks of the row shifts by the maximum so far). Computed as
/// `2^(x·log₂e − m·log₂e)`: one FMA shifts and changes the base, and [`exp2`]'s polynomial is
/// three FMAs shorter than [`exp`]'s (the shift's rounding is the same for the whole row, so a
/// softmax's division cancels it).
#[inline(always)]
pub(crate) fn exp_shifted(row: &mut [f32], m: f32) -> f32 {
    if avx512::supported() { avx512::exp_shifted(row, m) } else { exp_shifted_lanes(row, m) }
}

/// [`exp_shifted`] with independent lanes (vectorisable): AVX-512's arithmetic lane for lane.
#[inline(always)]
fn exp_shifted_lanes(row: &mut [f32], m: f32) -> f32 {
    let shift = m * LOG2E;
    let mut acc = [0f32; LANES];
    let tail = row.len() % LANES;
    // A tail is done as the row's last full chunk, its first `LANES − tail` lanes (done already)
    // neither written nor summed again: AVX-512's masked chunk, lane for lane. The chunk is read
    // before the whole chunks' results overwrite part of it.
    let last: Option<[f32; LANES]> = (tail > 0 && row.len() >= LANES).then(|| row[row.len() - LANES..].try_into().expect("a chunk"));
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (a, o) in acc.iter_mut().zip(chunk) {
            *o = exp2(o.mul_add(LOG2E, -shift));
            *a += *o;
        }
    }
    if let Some(values) = last {
        let start = row.len() - LANES;
        for (lane, (a, (o, x))) in acc.iter_mut().zip(row[start..].iter_mut().zip(values)).enumerate() {
            let (e, fresh) = (exp2(x.mul_add(LOG2E, -shift)), lane >= LANES - tail);
            *a += if fresh { e } else { 0.0 };
            if fresh {
                *o = e;
            }
        }
    } else if tail > 0 {
        // A row shorter than a chunk, padded with −inf (2^-126 ≈ 1e-38 there, below what any
        // real entry adds): a scalar exp per value cost as much as a vectorised chunk.
        let mut padded = [f32::NEG_INFINITY; LANES];
        padded[..tail].copy_from_slice(row);
        for (a, o) in acc.iter_mut().zip(&mut padded) {
            *o = exp2(o.mul_add(LOG2E, -shift));
            *a += *o;
        }
        row.copy_from_slice(&padded[..tail]);
    }
    halving(acc, |a, b| a + b)
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    pub(super) fn supported() -> bool {
        false
    }

    pub(super) fn max(_: &[f32]) -> f32 {
        unreachable!("supported() is false off x86-64")
    }

    pub(super) fn exp_shifted(_: &mut [f32], _: f32) -> f32 {
        unreachable!("supported() is false off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AVX-512's softmax passes give the bits of the portable ones, whole chunks and tails, rows
    /// shorter than a chunk and rows a tail's chunk overlaps.
    #[test]
    fn the_avx512_softmax_passes_are_the_portable_ones_bit_for_bit() {
        if !avx512::supported() {
            eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        for n in (0..=70).chain([95, 127, 128, 129, 511]) {
            let row: Vec<f32> = (0..n).map(|i| ((i * 7_919 % 1_013) as f32 / 1_013.0 - 0.5) * 9.0).collect();
            assert_eq!(avx512::max(&row).to_bits(), max_lanes(&row).to_bits(), "maximum of {n}");
            let m = max_lanes(&row).max(0.25);
            let (mut portable, mut avx512) = (row.clone(), row.clone());
            let (want, got) = (exp_shifted_lanes(&mut portable, m), avx512::exp_shifted(&mut avx512, m));
            assert_eq!(got.to_bits(), want.to_bits(), "sum of {n}");
            assert_eq!(avx512.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "row of {n}");
        }
    }

    /// erf by its Maclaurin series in f64: cancellation costs < 1e-8 for |x| ≤ 4.5, and beyond
    /// that erf is ±1 within 2e-10.
    fn erf_reference(x: f64) -> f64 {
        if x.abs() > 4.5 {
            return x.signum();
        }
        let mut term = x;
        let mut total = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            total += term / (2 * n + 1) as f64;
        }
        total * 2.0 / std::f64::consts::PI.sqrt()
    }

    /// The tanh GELU against its definition in f64, over the range activations take.
    #[test]
    fn gelu_tanh_is_accurate() {
        let mut worst = 0f64;
        let mut x = -12.0f32;
        while x <= 12.0 {
            let v = f64::from(x);
            let want = 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
            worst = worst.max((f64::from(gelu_tanh(x)) - want).abs() / want.abs().max(1.0));
            x += 0.0007;
        }
        assert!(worst < 1e-6, "{worst}");
    }

    /// The largest relative error of `f` against `want` on `range`, in steps of 0.00137.
    fn worst_relative_error(f: fn(f32) -> f32, want: fn(f64) -> f64, range: std::ops::RangeInclusive<f32>) -> f64 {
        let mut worst = 0f64;
        let mut x = *range.start();
        while x <= *range.end() {
            let (got, want) = (f64::from(f(x)), want(f64::from(x)));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        worst
    }

    #[test]
    fn exp_is_accurate() {
        let worst = worst_relative_error(exp, f64::exp, -87.0..=88.0);
        assert!(worst < 3e-7, "max relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
    }

    #[test]
    fn exp2_is_accurate() {
        let worst = worst_relative_error(exp2, f64::exp2, -126.0..=127.0);
        assert!(worst < 3e-7, "max relative error {worst:e}");
        assert_eq!((exp2(0.0), exp2(1.0), exp2(-3.0)), (1.0, 2.0, 0.125));
        assert!(exp2(-1000.0) > 0.0 && exp2(-1000.0) < 1e-37);
    }

    #[test]
    fn erf_is_accurate() {
        let mut worst = 0f64;
        let mut x = -7.0f32;
        while x <= 7.0 {
            worst = worst.max((f64::from(erf(x)) - erf_reference(f64::from(x))).abs());
            x += 0.000_97;
        }
        assert!(worst < 5e-7, "max absolute error {worst:e}");
    }

    #[test]
    fn reductions_and_softmax() {
        let values: Vec<f32> = (0..37).map(|i| ((i * 17) % 11) as f32 - 3.5).collect();
        assert_eq!(sum(&values), values.iter().sum::<f32>());
        assert_eq!(max(&values), 6.5);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        // Scores far from zero as well: the shift's rounding (in base 2) is the whole row's and
        // the division takes it out.
        for offset in [0.0, 87.25, -1000.0] {
            let values: Vec<f32> = values.iter().map(|&v| v + offset).collect();
            let mut p = values.clone();
            let total = softmax_unnormalised(&mut p);
            p.iter_mut().for_each(|v| *v /= total);
            let m = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let denom: f64 = values.iter().map(|&v| f64::from(v - m).exp()).sum();
            for (&v, &got) in values.iter().zip(&p) {
                let want = f64::from(v - m).exp() / denom;
                assert!((f64::from(got) - want).abs() < 1e-6, "offset {offset}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn layer_norm_matches_definition() {
        let x: Vec<f32> = (0..384).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let residual: Vec<f32> = (0..384).map(|i| (i as f32 * 0.11).cos()).collect();
        let bias: Vec<f32> = (0..384).map(|i| i as f32 * 1e-3).collect();
        let gamma: Vec<f32> = (0..384).map(|i| 1.0 + i as f32 * 1e-3).collect();
        let beta: Vec<f32> = (0..384).map(|i| -(i as f32) * 1e-3).collect();
        let mut out = vec![0f32; 384];
        add_layer_norm(&mut out, &x, Some(&bias), Some(&residual), &gamma, Some(&beta), 1e-12);
        let y: Vec<f64> = (0..384).map(|i| f64::from(x[i]) + f64::from(bias[i]) + f64::from(residual[i])).collect();
        let mean = y.iter().sum::<f64>() / 384.0;
        let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 384.0;
        for i in 0..384 {
            let want = (y[i] - mean) / (var + 1e-12).sqrt() * f64::from(gamma[i]) + f64::from(beta[i]);
            assert!((f64::from(out[i]) - want).abs() < 1e-5, "{i}: {} vs {want}", out[i]);
        }
    }

    #[test]
    fn rms_norm_and_swiglu_match_their_definitions() {
        let x: Vec<f32> = (0..45).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let residual: Vec<f32> = (0..45).map(|i| (i as f32 * 0.11).cos()).collect();
        let gamma: Vec<f32> = (0..45).map(|i| 1.0 + i as f32 * 1e-2).collect();
        let mut out = vec![0f32; 45];
        add_rms_norm(&mut out, &x, None, Some(&residual), &gamma, 1e-6);
        let y: Vec<f64> = (0..45).map(|i| f64::from(x[i]) + f64::from(residual[i])).collect();
        let ms = y.iter().map(|v| v * v).sum::<f64>() / 45.0;
        for i in 0..45 {
            let want = y[i] / (ms + 1e-6).sqrt() * f64::from(gamma[i]);
            assert!((f64::from(out[i]) - want).abs() < 1e-5, "{i}: {} vs {want}", out[i]);
        }
        let row: Vec<f32> = (0..40).map(|i| (i as f32 - 20.0) * 0.4).collect();
        let mut gated = vec![0f32; 20];
        swiglu(&mut gated, &row);
        for k in 0..20 {
            let (g, u) = (f64::from(row[k]), f64::from(row[20 + k]));
            let want = g / (1.0 + (-g).exp()) * u;
            assert!((f64::from(gated[k]) - want).abs() < 1e-5 * want.abs().max(1.0), "{k}");
        }
    }

    #[test]
    fn gelu_matches_definition() {
        let input: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 0.2).collect();
        let bias = vec![0.05f32; 64];
        let mut rows = input.clone();
        bias_gelu_in_place(&mut rows, &bias);
        for (&x, &got) in input.iter().zip(&rows) {
            let x = f64::from(x) + 0.05;
            let want = 0.5 * x * (1.0 + erf_reference(x / std::f64::consts::SQRT_2));
            assert!((f64::from(got) - want).abs() < 1e-6);
        }
    }
}
