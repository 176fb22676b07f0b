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
//! Each task converts [`MC`] rows of activations to bf16 pairs (row-major, so the conversion is
//! one vectorised pass) and runs every `MR × NR` tile of its rows against every panel: 24
//! accumulators stay in registers for the whole depth, the panel comes from L1/L2 and is reused
//! by all the task's row tiles, and results are stored straight into the output rows.
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
    let panels = n.div_ceil(NR);
    if m >= MC * rayon::current_num_threads() {
        out.par_chunks_mut(MC * n).zip(x.par_chunks(MC * k)).for_each(|(out, x)| {
            let rows = x.len() / k;
            let a = to_pairs(x, rows, w);
            for panel in 0..panels {
                run_panel(&a, rows, w, panel, &mut out[panel * NR..], n);
            }
        });
    } else {
        let a = to_pairs(x, m, w);
        let blocks: Vec<Vec<f32>> = (0..panels)
            .into_par_iter()
            .map(|panel| {
                let mut block = vec![0f32; m * NR];
                run_panel(&a, m, w, panel, &mut block, NR);
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

/// `rows` rows of `x` as bf16 k-pairs, row after row (`pairs` lanes each), with zero rows up to
/// a whole number of [`MR`] tiles and a zero partner for an odd `k`.
fn to_pairs(x: &[f32], rows: usize, w: &PackedWeights) -> Vec<u32> {
    let (k, pairs) = (w.k, w.pairs);
    let mut a = vec![0u32; rows.div_ceil(MR) * MR * pairs];
    super::kernels::vectorized(
        #[inline(always)]
        || {
            for (lanes, row) in a.chunks_exact_mut(pairs).zip(x.chunks_exact(k)) {
                for (lane, two) in lanes.iter_mut().zip(row.chunks_exact(2)) {
                    *lane = pair(two[0], two[1]);
                }
                if k % 2 == 1 {
                    lanes[pairs - 1] = pair(row[k - 1], 0.0);
                }
            }
        },
    );
    a
}

/// Every row tile of `a` against weight panel `panel`, into `out` (row stride `ldc`, the panel's
/// first column at `out[0]`). Rows past `rows` are not written; columns past the matrix's `n`
/// are written only where `ldc` leaves room for a whole panel (the caller's scratch block).
fn run_panel(a: &[u32], rows: usize, w: &PackedWeights, panel: usize, out: &mut [f32], ldc: usize) {
    let lanes = &w.panels[panel * w.pairs * NR..(panel + 1) * w.pairs * NR];
    let width = NR.min(w.n - panel * NR);
    let mut scratch = [0f32; MR * NR];
    for (tile, a) in a.chunks_exact(MR * w.pairs).enumerate() {
        let valid = MR.min(rows - tile * MR);
        let out = &mut out[tile * MR * ldc..];
        if width == NR || ldc == NR {
            kernel::tile(a, lanes, w.pairs, out, ldc, valid);
        } else {
            // The matrix's last, narrower panel: through scratch, then only its real columns.
            kernel::tile(a, lanes, w.pairs, &mut scratch, NR, valid);
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

    /// One `MR × NR` tile over the whole depth: `out[r·ldc + j] = Σ_p a[r·pairs + p] ·
    /// b[p·NR + j]` (k-pairs, f32 sums), for the first `rows` rows.
    pub(super) fn tile(a: &[u32], b: &[u32], pairs: usize, out: &mut [f32], ldc: usize, rows: usize) {
        assert!((1..=MR).contains(&rows) && ldc >= NR);
        assert!(a.len() >= MR * pairs && b.len() >= pairs * NR && out.len() >= (rows - 1) * ldc + NR);
        assert!(super::supported());
        // SAFETY: the CPU has AVX-512 F + BF16; `a` holds `MR × pairs` and `b` `pairs × NR`
        // lanes, all the kernel reads; it writes `NR` f32 at `r·ldc` for `r < rows`, within `out`
        // (all checked above).
        unsafe { tile_avx512(a.as_ptr(), b.as_ptr(), pairs, out.as_mut_ptr(), ldc, rows) }
    }

    /// The 32 bf16 halves of 16 u32 lanes, as the type `vdpbf16ps` takes (same bits).
    #[inline(always)]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 512-bit vectors with no invalid bit patterns.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile_avx512(a: *const u32, b: *const u32, pairs: usize, out: *mut f32, ldc: usize, rows: usize) {
        // 6 rows × 4 vectors of 16 columns = 24 accumulators, 4 panel vectors, 1 broadcast.
        let mut acc = [[_mm512_setzero_ps(); NR / 16]; MR];
        for p in 0..pairs {
            // SAFETY: p < pairs and r < MR, so every read stays within the lengths `tile`
            // checked; the loads are unaligned ones.
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
                let av = as_bf16(_mm512_set1_epi32(unsafe { *a.add(r * pairs + p) } as i32));
                for (v, acc) in acc_row.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv[v]);
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            if r < rows {
                for (v, acc) in acc_row.iter().enumerate() {
                    // SAFETY: r < rows, v < NR/16: within the `out` length `tile` checked.
                    unsafe { _mm512_storeu_ps(out.add(r * ldc + v * 16), *acc) };
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    pub(super) fn tile(_: &[u32], _: &[u32], _: usize, _: &mut [f32], _: usize, _: usize) {
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

    /// Every shape class: tile and panel edges, odd depth, a single row, the encoder's shapes, both
    /// ways of splitting the work (by rows from MC·threads rows on, by panels below).
    #[test]
    fn matches_the_rounded_product() {
        if !supported() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return;
        }
        let shapes =
            [(1, 2, 1), (5, 7, 13), (6, 64, 64), (7, 383, 65), (97, 384, 1152), (200, 1536, 384), (13, 1, 130), (203, 7, 70)];
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
