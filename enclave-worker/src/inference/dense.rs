//! The dense layers' matrix products `x · w` on AVX-512, with kernels of our own: f32 inputs
//! (`vfmadd231ps`), and bf16 inputs with f32 accumulation (`vdpbf16ps`) for jobs that ask for
//! `precision: bf16`.
//!
//! This is the only module of the crate with `unsafe` code: the SIMD intrinsics, behind a safe
//! API ([`Packed`], [`matmul_f32`], [`matmul_bf16`]) that checks every length before a kernel
//! runs and refuses to run on a CPU without the instructions ([`f32_supported`],
//! [`bf16_supported`]).
//!
//! `vdpbf16ps acc, a, b` adds, in each of its 16 f32 lanes, `a.lo·b.lo + a.hi·b.hi` of the lane's
//! two bf16 halves. So for bf16 both operands hold *pairs along k*: a weight panel lane holds
//! `(w[2p][j], w[2p+1][j])` for its column `j`, and the activation operand is one row's pair
//! `(x[i][2p], x[i][2p+1])` broadcast to every lane. Rounding to bf16 is to nearest, ties to even
//! (what `vcvtne2ps2bf16` does); products and sums are f32. For f32 the "depth" is k itself.
//!
//! Blocking: weights are packed once (at load, or on the first bf16 job) into panels of [`NR`]
//! columns, depth × 64 lanes. Each task takes [`MC`] rows of activations (f32: read in place;
//! bf16: converted to row-major pairs in one vectorised pass) and runs every `MR × NR` tile of
//! its rows against every panel: 24 accumulators stay in registers for the whole depth, the panel
//! comes from L1/L2 and is reused by all the task's row tiles, and results are stored straight
//! into the output rows.
#![allow(unsafe_code)]

use rayon::prelude::*;

/// Columns per weight panel (4 vectors of 16 lanes).
const NR: usize = 64;
/// Rows per register tile.
const MR: usize = 6;
/// Rows per task (a multiple of `MR`).
const MC: usize = 16 * MR;

/// Whether this CPU executes the f32 kernel (AVX-512 F).
pub(crate) fn f32_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU executes the bf16 kernel (AVX-512 F + BF16).
pub(crate) fn bf16_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        f32_supported() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// f32 → bf16, round to nearest, ties to even (inputs are finite: NaN is not preserved).
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// bf16 → f32 (exact).
#[cfg(test)]
fn bf16_value(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// `lo` and `hi` rounded to bf16 and packed as one `vdpbf16ps` lane.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// A `(k, n)` weight matrix (row-major, as the encoder multiplies `x · w`) in panels of `T`:
/// f32 values, or u32 lanes of two bf16 (k-pairs).
pub(crate) struct Packed<T> {
    k: usize,
    n: usize,
    /// Panel rows: k for f32, `ceil(k/2)` k-pairs for bf16.
    depth: usize,
    /// Panel after panel (`ceil(n/NR)` of them), each `depth × NR` lanes; missing rows and
    /// columns are zero.
    panels: Vec<T>,
}

impl<T: Copy + Default> Packed<T> {
    /// Panels of `depth` rows whose lane for panel row `p`, matrix column `col` is `lane(p, col)`.
    fn pack(k: usize, n: usize, depth: usize, lane: impl Fn(usize, usize) -> T) -> Self {
        let mut panels = vec![T::default(); n.div_ceil(NR) * depth * NR];
        for (panel, lanes) in panels.chunks_exact_mut(depth * NR).enumerate() {
            for (p, lane_row) in lanes.chunks_exact_mut(NR).enumerate() {
                for (j, value) in lane_row.iter_mut().enumerate() {
                    *value = lane(p, panel * NR + j);
                }
            }
        }
        Self { k, n, depth, panels }
    }

    pub(crate) fn rows(&self) -> usize {
        self.k
    }

    pub(crate) fn cols(&self) -> usize {
        self.n
    }
}

impl Packed<f32> {
    /// Packs `w`, `(k, n)` row-major, for the f32 kernel.
    pub(crate) fn f32(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "weights are not (k, n)");
        Self::pack(k, n, k, |p, col| if col < n { w[p * n + col] } else { 0.0 })
    }

    /// `w[row][col]`; zero outside the matrix.
    fn value(&self, row: usize, col: usize) -> f32 {
        if row < self.k && col < self.n { self.panels[(col / NR * self.depth + row) * NR + col % NR] } else { 0.0 }
    }
}

impl Packed<u32> {
    /// The same weights rounded to bf16, for the bf16 kernel.
    pub(crate) fn bf16(w: &Packed<f32>) -> Self {
        Self::pack(w.k, w.n, w.k.div_ceil(2), |p, col| pair(w.value(2 * p, col), w.value(2 * p + 1, col)))
    }
}

/// A lane type with a kernel: `tile(a, b, depth, out, ldc, rows)` computes one `MR × NR` tile,
/// `out[r·ldc + j] = Σ_p a[r·depth + p] ⊙ b[p·NR + j]` for the first `rows` rows.
trait Lane: Copy + Default + Send + Sync + 'static {
    fn tile(a: &[Self], b: &[Self], depth: usize, out: &mut [f32], ldc: usize, rows: usize);
    /// `rows` rows of `x` (`k` values each) as this lane type, row-major, `depth` lanes per row,
    /// `pad_to` rows (the rest zero).
    fn rows_of(x: &[f32], rows: usize, k: usize, depth: usize, pad_to: usize) -> Vec<Self>;
}

impl Lane for f32 {
    fn tile(a: &[f32], b: &[f32], depth: usize, out: &mut [f32], ldc: usize, rows: usize) {
        kernel::f32_tile(a, b, depth, out, ldc, rows)
    }

    fn rows_of(x: &[f32], rows: usize, k: usize, _: usize, pad_to: usize) -> Vec<f32> {
        let mut a = vec![0f32; pad_to * k];
        a[..rows * k].copy_from_slice(&x[..rows * k]);
        a
    }
}

impl Lane for u32 {
    fn tile(a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize) {
        kernel::bf16_tile(a, b, depth, out, ldc, rows)
    }

    fn rows_of(x: &[f32], rows: usize, k: usize, depth: usize, pad_to: usize) -> Vec<u32> {
        let mut a = vec![0u32; pad_to * depth];
        super::kernels::vectorized(
            #[inline(always)]
            || {
                for (lanes, row) in a.chunks_exact_mut(depth).zip(x[..rows * k].chunks_exact(k)) {
                    for (lane, two) in lanes.iter_mut().zip(row.chunks_exact(2)) {
                        *lane = pair(two[0], two[1]);
                    }
                    if k % 2 == 1 {
                        lanes[depth - 1] = pair(row[k - 1], 0.0);
                    }
                }
            },
        );
        a
    }
}

/// A task's activations as the kernel reads them: whole row tiles (in place for f32) and, when
/// the row count is not a multiple of [`MR`], a zero-padded last tile.
struct Rows<'a, T: Lane> {
    whole: std::borrow::Cow<'a, [T]>,
    tail: Option<Vec<T>>,
    rows: usize,
}

fn rows_f32(x: &[f32], rows: usize, k: usize) -> Rows<'_, f32> {
    let whole_rows = rows / MR * MR;
    let tail = (whole_rows < rows).then(|| f32::rows_of(&x[whole_rows * k..], rows - whole_rows, k, k, MR));
    Rows { whole: std::borrow::Cow::Borrowed(&x[..whole_rows * k]), tail, rows }
}

fn rows_bf16(x: &[f32], rows: usize, k: usize, depth: usize) -> Rows<'static, u32> {
    Rows { whole: std::borrow::Cow::Owned(u32::rows_of(x, rows, k, depth, rows.div_ceil(MR) * MR)), tail: None, rows }
}

/// `out ← x · w` in f32: `x` is `(m, k)` row-major, `out` `(m, n)`.
///
/// Panics if the lengths do not match or the CPU lacks AVX-512 ([`f32_supported`]).
pub(crate) fn matmul_f32(x: &[f32], m: usize, w: &Packed<f32>, out: &mut [f32]) {
    assert!(f32_supported(), "the CPU has no AVX-512");
    product(x, m, w, out, |x, rows| rows_f32(x, rows, w.k));
}

/// `out ← x · w` with bf16 inputs and f32 sums: `x` is `(m, k)` row-major f32, `out` `(m, n)`.
///
/// Panics if the lengths do not match or the CPU lacks AVX-512 BF16 ([`bf16_supported`]).
pub(crate) fn matmul_bf16(x: &[f32], m: usize, w: &Packed<u32>, out: &mut [f32]) {
    assert!(bf16_supported(), "the CPU has no AVX-512 BF16");
    product(x, m, w, out, |x, rows| rows_bf16(x, rows, w.k, w.depth));
}

/// Runs on the current rayon pool: one task per [`MC`] rows when there are enough rows for
/// every thread, otherwise (short batches, one text) one task per weight panel.
fn product<'x, T: Lane>(
    x: &'x [f32],
    m: usize,
    w: &Packed<T>,
    out: &mut [f32],
    prepare: impl Fn(&'x [f32], usize) -> Rows<'x, T> + Sync,
) {
    let (k, n) = (w.k, w.n);
    assert_eq!(x.len(), m * k, "activations are not (m, k)");
    assert_eq!(out.len(), m * n, "output is not (m, n)");
    if m == 0 || n == 0 {
        return;
    }
    let panels = n.div_ceil(NR);
    if m >= MC * rayon::current_num_threads() {
        out.par_chunks_mut(MC * n).zip(x.par_chunks(MC * k)).for_each(|(out, x)| {
            let a = prepare(x, x.len() / k);
            for panel in 0..panels {
                run_panel(&a, w, panel, &mut out[panel * NR..], n);
            }
        });
    } else {
        let a = prepare(x, m);
        let blocks: Vec<Vec<f32>> = (0..panels)
            .into_par_iter()
            .map(|panel| {
                let mut block = vec![0f32; m * NR];
                run_panel(&a, w, panel, &mut block, NR);
                block
            })
            .collect();
        for (panel, block) in blocks.iter().enumerate() {
            let width = NR.min(n - panel * NR);
            for (row, values) in block.chunks_exact(NR).enumerate() {
                out[row * n + panel * NR..row * n + panel * NR + width].copy_from_slice(&values[..width]);
            }
        }
    }
}

/// Every row tile of `a` against weight panel `panel`, into `out` (row stride `ldc`, the panel's
/// first column at `out[0]`). Rows past `a.rows` are not written; columns past the matrix's `n`
/// are written only where `ldc` leaves room for a whole panel (the caller's scratch block).
fn run_panel<T: Lane>(a: &Rows<'_, T>, w: &Packed<T>, panel: usize, out: &mut [f32], ldc: usize) {
    let depth = w.depth;
    let lanes = &w.panels[panel * depth * NR..(panel + 1) * depth * NR];
    let width = NR.min(w.n - panel * NR);
    let tiles = a.whole.chunks_exact(MR * depth).chain(a.tail.as_deref());
    let mut scratch = [0f32; MR * NR];
    for (tile, a_tile) in tiles.enumerate() {
        let valid = MR.min(a.rows - tile * MR);
        let out = &mut out[tile * MR * ldc..];
        if width == NR || ldc == NR {
            T::tile(a_tile, lanes, depth, out, ldc, valid);
        } else {
            // The matrix's last, narrower panel: through scratch, then only its real columns.
            T::tile(a_tile, lanes, depth, &mut scratch, NR, valid);
            for r in 0..valid {
                out[r * ldc..r * ldc + width].copy_from_slice(&scratch[r * NR..r * NR + width]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// The checks both kernels rely on.
    fn check<T>(a: &[T], b: &[T], depth: usize, out: &[f32], ldc: usize, rows: usize) {
        assert!((1..=MR).contains(&rows) && ldc >= NR);
        assert!(a.len() >= MR * depth && b.len() >= depth * NR && out.len() >= (rows - 1) * ldc + NR);
    }

    pub(super) fn f32_tile(a: &[f32], b: &[f32], depth: usize, out: &mut [f32], ldc: usize, rows: usize) {
        check(a, b, depth, out, ldc, rows);
        assert!(super::f32_supported());
        // SAFETY: the CPU has AVX-512 F; `a` holds `MR × depth` and `b` `depth × NR` values, all
        // the kernel reads; it writes `NR` f32 at `r·ldc` for `r < rows`, within `out` (all
        // checked above).
        unsafe { f32_avx512(a.as_ptr(), b.as_ptr(), depth, out.as_mut_ptr(), ldc, rows) }
    }

    pub(super) fn bf16_tile(a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize) {
        check(a, b, depth, out, ldc, rows);
        assert!(super::bf16_supported());
        // SAFETY: as for `f32_tile`, with AVX-512 BF16 as well.
        unsafe { bf16_avx512(a.as_ptr(), b.as_ptr(), depth, out.as_mut_ptr(), ldc, rows) }
    }

    /// The 32 bf16 halves of 16 u32 lanes, as the type `vdpbf16ps` takes (same bits).
    #[inline(always)]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 512-bit vectors with no invalid bit patterns.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// Stores the first `rows` rows of the accumulators.
    #[inline(always)]
    unsafe fn store(acc: &[[__m512; NR / 16]; MR], out: *mut f32, ldc: usize, rows: usize) {
        for (r, acc_row) in acc.iter().enumerate() {
            if r < rows {
                for (v, acc) in acc_row.iter().enumerate() {
                    // SAFETY: r < rows, v < NR/16: within the `out` length the caller checked.
                    unsafe { _mm512_storeu_ps(out.add(r * ldc + v * 16), *acc) };
                }
            }
        }
    }

    // Both kernels: 6 rows × 4 vectors of 16 columns = 24 accumulators, 4 panel vectors and one
    // broadcast per step. Every read is within the lengths `check` verified (p < depth, r < MR);
    // the loads are unaligned ones.

    #[target_feature(enable = "avx512f")]
    unsafe fn f32_avx512(a: *const f32, b: *const f32, depth: usize, out: *mut f32, ldc: usize, rows: usize) {
        let mut acc = [[_mm512_setzero_ps(); NR / 16]; MR];
        for p in 0..depth {
            // SAFETY: see above.
            let bp = unsafe { b.add(p * NR) };
            let bv = unsafe {
                [_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)), _mm512_loadu_ps(bp.add(32)), _mm512_loadu_ps(bp.add(48))]
            };
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(unsafe { *a.add(r * depth + p) });
                for (v, acc) in acc_row.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(av, bv[v], *acc);
                }
            }
        }
        // SAFETY: see `store`.
        unsafe { store(&acc, out, ldc, rows) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn bf16_avx512(a: *const u32, b: *const u32, depth: usize, out: *mut f32, ldc: usize, rows: usize) {
        let mut acc = [[_mm512_setzero_ps(); NR / 16]; MR];
        for p in 0..depth {
            // SAFETY: see above.
            let bp = unsafe { b.add(p * NR) };
            let bv = unsafe {
                [
                    as_bf16(_mm512_loadu_si512(bp.cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(16).cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(32).cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(48).cast())),
                ]
            };
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let av = as_bf16(_mm512_set1_epi32(unsafe { *a.add(r * depth + p) } as i32));
                for (v, acc) in acc_row.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv[v]);
                }
            }
        }
        // SAFETY: see `store`.
        unsafe { store(&acc, out, ldc, rows) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    pub(super) fn f32_tile(_: &[f32], _: &[f32], _: usize, _: &mut [f32], _: usize, _: usize) {
        unreachable!("f32_supported() is false off x86-64")
    }

    pub(super) fn bf16_tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize) {
        unreachable!("bf16_supported() is false off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream in [-1, 1).
    fn values(seed: u64, len: usize) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// `x · w` in f64 after `round` is applied to every input.
    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, round: impl Fn(f32) -> f64) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                let a = round(x[i * k + p]);
                for j in 0..n {
                    out[i * n + j] += a * round(w[p * n + j]);
                }
            }
        }
        out
    }

    /// Every shape class: tile and panel edges, odd depth, a single row, the encoder's shapes, both
    /// ways of splitting the work (by rows from MC·threads rows on, by panels below).
    const SHAPES: [(usize, usize, usize); 8] =
        [(1, 2, 1), (5, 7, 13), (6, 64, 64), (7, 383, 65), (97, 384, 1152), (200, 1536, 384), (13, 1, 130), (203, 7, 70)];

    /// Runs `product` on every shape and compares with the f64 product of the inputs as `round`
    /// sees them, within f32 summation error.
    fn check_shapes(product: impl Fn(&[f32], usize, &[f32], usize, usize, &mut [f32]), round: impl Fn(f32) -> f64 + Copy) {
        for (seed, &(m, k, n)) in SHAPES.iter().enumerate() {
            let x = values(seed as u64, m * k);
            let w = values(100 + seed as u64, k * n);
            let mut out = vec![f32::NAN; m * n];
            product(&x, m, &w, k, n, &mut out);
            let want = reference(&x, &w, m, k, n, round);
            // f32 accumulation of k products of magnitude ≤ 1: error ≲ k · 2^-24 · |sum terms|.
            let bound = k as f64 * 1.2e-7 + 1e-6;
            for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                assert!((f64::from(got) - want).abs() <= bound, "({m},{k},{n}) [{i}]: {got} vs {want}");
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(bf16_value(bf16_bits(1.0)), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(bf16_value(bf16_bits(-2.5)), -2.5);
        let x = 0.123_456_79f32;
        assert!(((bf16_value(bf16_bits(x)) - x) / x).abs() <= 1.0 / 256.0);
    }

    #[test]
    fn f32_matches_the_exact_product() {
        if !f32_supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        check_shapes(|x, m, w, k, n, out| matmul_f32(x, m, &Packed::f32(w, k, n), out), f64::from);
    }

    #[test]
    fn bf16_matches_the_rounded_product() {
        if !bf16_supported() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let round = |v: f32| f64::from(bf16_value(bf16_bits(v)));
        check_shapes(|x, m, w, k, n, out| matmul_bf16(x, m, &Packed::bf16(&Packed::f32(w, k, n)), out), round);
    }

    #[test]
    fn bf16_stays_close_to_full_precision() {
        if !bf16_supported() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let (m, k, n) = (33, 384, 256);
        let x = values(7, m * k);
        let w = values(8, k * n);
        let mut out = vec![0f32; m * n];
        matmul_bf16(&x, m, &Packed::bf16(&Packed::f32(&w, k, n)), &mut out);
        let exact = reference(&x, &w, m, k, n, f64::from);
        for i in 0..m {
            let (exact, got) = (&exact[i * n..(i + 1) * n], &out[i * n..(i + 1) * n]);
            let dot: f64 = exact.iter().zip(got).map(|(a, &b)| a * f64::from(b)).sum();
            let norms = exact.iter().map(|a| a * a).sum::<f64>().sqrt()
                * got.iter().map(|&b| f64::from(b).powi(2)).sum::<f64>().sqrt();
            assert!(dot / norms > 0.9999, "row {i}: cosine {}", dot / norms);
        }
    }
}
