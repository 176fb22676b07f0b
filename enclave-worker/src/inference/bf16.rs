//! Matrix products with bf16 inputs and f32 accumulation, on AVX-512 BF16 (`vdpbf16ps`): the
//! dense layers of the encoder when a job asks for `precision: bf16`.
//!
//! This is the only module of the crate with `unsafe` code: the SIMD intrinsics, behind a safe
//! API ([`PackedWeights::pack`], [`matmul`]) that checks every length before the kernels run and
//! refuses to run on a CPU without the instructions ([`supported`]).
//!
//! `vdpbf16ps acc, a, b` adds, in each of its 16 f32 lanes, `a.lo·b.lo + a.hi·b.hi` of the lane's
//! two bf16 halves. So both operands hold *pairs along k*: a weight panel lane holds
//! `(w[2p][j], w[2p+1][j])` for its column `j`, and the activation operand is one row's pair
//! `(x[i][2p], x[i][2p+1])` broadcast to every lane. Rounding to bf16 is to nearest, ties to even
//! (what `vcvtne2ps2bf16` does); products and sums are f32.
//!
//! Blocking: weights are packed once into panels of [`NR`] columns (k-pairs × 64 lanes, u32 each).
//! Each task packs [`MC`] rows of activations into row tiles of [`MR`] and runs every
//! `MR × NR` tile of its rows against every panel: 24 accumulators stay in registers for the
//! whole depth, the panel comes from L1/L2 and is reused by all the task's row tiles.
#![allow(unsafe_code)]

use rayon::prelude::*;

/// Columns per weight panel (4 vectors of 16 lanes).
const NR: usize = 64;
/// Rows per register tile.
const MR: usize = 6;
/// Rows per task (a multiple of `MR`).
const MC: usize = 16 * MR;

/// Whether this CPU executes the kernels (AVX-512 F + BF16).
pub(crate) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
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

/// A `(k, n)` weight matrix (row-major, as the encoder multiplies `x · w`) in bf16 panels.
pub(crate) struct PackedWeights {
    k: usize,
    n: usize,
    /// `ceil(k/2)` k-pairs.
    pairs: usize,
    /// Panel after panel (`ceil(n/NR)` of them), each `pairs × NR` lanes; missing rows and
    /// columns are zero.
    panels: Vec<u32>,
}

impl PackedWeights {
    /// Packs `w`, `(k, n)` row-major.
    pub(crate) fn pack(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "weights are not (k, n)");
        let pairs = k.div_ceil(2);
        let count = n.div_ceil(NR);
        let mut panels = vec![0u32; count * pairs * NR];
        let at = |row: usize, col: usize| if row < k && col < n { w[row * n + col] } else { 0.0 };
        for (panel, lanes) in panels.chunks_exact_mut(pairs * NR).enumerate() {
            for (p, lane_row) in lanes.chunks_exact_mut(NR).enumerate() {
                for (j, lane) in lane_row.iter_mut().enumerate() {
                    let col = panel * NR + j;
                    *lane = pair(at(2 * p, col), at(2 * p + 1, col));
                }
            }
        }
        Self { k, n, pairs, panels }
    }

    pub(crate) fn rows(&self) -> usize {
        self.k
    }

    pub(crate) fn cols(&self) -> usize {
        self.n
    }
}

/// `out ← x · w`: `x` is `(m, k)` row-major f32, `out` `(m, n)`. Runs on the current rayon pool:
/// one task per [`MC`] rows when there are enough rows for every thread, otherwise (short
/// batches, one text) one task per weight panel.
///
/// Panics if the lengths do not match or the CPU lacks AVX-512 BF16 ([`supported`]): callers
/// check both when they choose this path.
pub(crate) fn matmul(x: &[f32], m: usize, w: &PackedWeights, out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    assert_eq!(x.len(), m * k, "activations are not (m, k)");
    assert_eq!(out.len(), m * n, "output is not (m, n)");
    assert!(supported(), "the CPU has no AVX-512 BF16");
    if m == 0 || n == 0 {
        return;
    }
    if m >= MC * rayon::current_num_threads() {
        out.par_chunks_mut(MC * n).zip(x.par_chunks(MC * k)).for_each(|(out, x)| {
            let rows = x.len() / k;
            let packed = pack_rows(x, rows, w);
            let mut tile_out = [0f32; MR * NR];
            for panel in 0..w.panels.len() / (w.pairs * NR) {
                run_panel(&packed, rows, w, panel, &mut tile_out, |row, col, values| {
                    out[row * n + col..row * n + col + values.len()].copy_from_slice(values)
                });
            }
        });
    } else {
        let packed = pack_rows(x, m, w);
        let panels: Vec<(usize, Vec<f32>)> = (0..w.panels.len() / (w.pairs * NR))
            .into_par_iter()
            .map(|panel| {
                let width = NR.min(n - panel * NR);
                let mut block = vec![0f32; m * width];
                let mut tile_out = [0f32; MR * NR];
                run_panel(&packed, m, w, panel, &mut tile_out, |row, _, values| {
                    block[row * width..(row + 1) * width].copy_from_slice(values)
                });
                (panel, block)
            })
            .collect();
        for (panel, block) in panels {
            let width = NR.min(n - panel * NR);
            for (row, values) in block.chunks_exact(width).enumerate() {
                out[row * n + panel * NR..row * n + panel * NR + width].copy_from_slice(values);
            }
        }
    }
}

/// `rows` rows of `x` as row tiles: tile after tile, `pairs × MR` lanes, each one row's k-pair
/// (missing rows and the odd k's partner are zero).
fn pack_rows(x: &[f32], rows: usize, w: &PackedWeights) -> Vec<u32> {
    let k = w.k;
    let tiles = rows.div_ceil(MR);
    let mut packed = vec![0u32; tiles * w.pairs * MR];
    for (tile, lanes) in packed.chunks_exact_mut(w.pairs * MR).enumerate() {
        for r in 0..MR.min(rows - tile * MR) {
            let row = &x[(tile * MR + r) * k..(tile * MR + r + 1) * k];
            for p in 0..w.pairs {
                let hi = if 2 * p + 1 < k { row[2 * p + 1] } else { 0.0 };
                lanes[p * MR + r] = pair(row[2 * p], hi);
            }
        }
    }
    packed
}

/// Every row tile of `packed` against weight panel `panel`; `store(row, first column, values)`
/// receives each row's (up to) `NR` results.
fn run_panel(
    packed: &[u32],
    rows: usize,
    w: &PackedWeights,
    panel: usize,
    tile_out: &mut [f32; MR * NR],
    mut store: impl FnMut(usize, usize, &[f32]),
) {
    let lanes = &w.panels[panel * w.pairs * NR..(panel + 1) * w.pairs * NR];
    let (col, width) = (panel * NR, NR.min(w.n - panel * NR));
    for (tile, a) in packed.chunks_exact(w.pairs * MR).enumerate() {
        kernel::tile(a, lanes, w.pairs, tile_out);
        for r in 0..MR.min(rows - tile * MR) {
            store(tile * MR + r, col, &tile_out[r * NR..r * NR + width]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// One `MR × NR` tile over the whole depth: `out[r][j] = Σ_p a_pair(r, p) · b_pair(p, j)`.
    pub(super) fn tile(a: &[u32], b: &[u32], pairs: usize, out: &mut [f32; MR * NR]) {
        assert!(a.len() >= pairs * MR && b.len() >= pairs * NR);
        assert!(super::supported());
        // SAFETY: the CPU has AVX-512 F + BF16 (checked above); `a` holds `pairs × MR` and `b`
        // `pairs × NR` lanes (checked above), which is all the kernel reads; it writes exactly
        // `MR × NR` f32 into `out`.
        unsafe { tile_avx512(a.as_ptr(), b.as_ptr(), pairs, out.as_mut_ptr()) }
    }

    /// The 32 bf16 halves of 16 u32 lanes, as the type `vdpbf16ps` takes (same bits).
    #[inline(always)]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 512-bit vectors with no invalid bit patterns.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile_avx512(a: *const u32, b: *const u32, pairs: usize, out: *mut f32) {
        // 6 rows × 4 vectors of 16 columns = 24 accumulators, 4 panel vectors, 1 broadcast.
        let mut acc = [[_mm512_setzero_ps(); NR / 16]; MR];
        for p in 0..pairs {
            // SAFETY: p < pairs, so every read stays within the lengths `tile` checked; the loads
            // are unaligned ones.
            let (bp, ap) = unsafe { (b.add(p * NR), a.add(p * MR)) };
            let bv = unsafe {
                [
                    as_bf16(_mm512_loadu_si512(bp.cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(16).cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(32).cast())),
                    as_bf16(_mm512_loadu_si512(bp.add(48).cast())),
                ]
            };
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let av = as_bf16(_mm512_set1_epi32(unsafe { *ap.add(r) } as i32));
                for (v, acc) in acc_row.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv[v]);
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            for (v, acc) in acc_row.iter().enumerate() {
                // SAFETY: r < MR, v < NR/16: within the MR × NR output.
                unsafe { _mm512_storeu_ps(out.add(r * NR + v * 16), *acc) };
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    use super::{MR, NR};

    pub(super) fn tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32; MR * NR]) {
        unreachable!("supported() is false off x86-64")
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

    /// The product of the bf16-rounded inputs in f64: what the kernel must return up to f32
    /// summation error.
    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let round = |v: f32| f64::from(bf16_value(bf16_bits(v)));
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

    /// Every shape class: tile and panel edges, odd depth, a single row, the encoder's shapes.
    #[test]
    fn matches_the_rounded_product() {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let shapes = [(1, 2, 1), (5, 7, 13), (6, 64, 64), (7, 383, 65), (97, 384, 1152), (200, 1536, 384), (13, 1, 130)];
        for (seed, &(m, k, n)) in shapes.iter().enumerate() {
            let x = values(seed as u64, m * k);
            let w = values(100 + seed as u64, k * n);
            let packed = PackedWeights::pack(&w, k, n);
            let mut out = vec![f32::NAN; m * n];
            matmul(&x, m, &packed, &mut out);
            let want = reference(&x, &w, m, k, n);
            // f32 accumulation of k products of magnitude ≤ 1: error ≲ k · 2^-24 · |sum terms|.
            let bound = k as f64 * 1.2e-7 + 1e-6;
            for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                assert!((f64::from(got) - want).abs() <= bound, "({m},{k},{n}) [{i}]: {got} vs {want}");
            }
        }
    }

    #[test]
    fn stays_close_to_full_precision() {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let (m, k, n) = (33, 384, 256);
        let x = values(7, m * k);
        let w = values(8, k * n);
        let mut out = vec![0f32; m * n];
        matmul(&x, m, &PackedWeights::pack(&w, k, n), &mut out);
        for i in 0..m {
            let exact: Vec<f64> = (0..n)
                .map(|j| (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(w[p * n + j])).sum())
                .collect();
            let dot: f64 = exact.iter().zip(&out[i * n..(i + 1) * n]).map(|(a, &b)| a * f64::from(b)).sum();
            let norms = exact.iter().map(|a| a * a).sum::<f64>().sqrt()
                * out[i * n..(i + 1) * n].iter().map(|&b| f64::from(b).powi(2)).sum::<f64>().sqrt();
            assert!(dot / norms > 0.9999, "row {i}: cosine {}", dot / norms);
        }
    }
}
