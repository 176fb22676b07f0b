//! The AVX-512 tile kernels (f32, bf16, int8), the int8 activations' quantisation and the FMA
//! rate probe of the benchmark, with AMX's and AVX2's kernels in submodules: the only `unsafe` of
//! the dense layers, each behind the checks of its safe wrapper.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{MR, NR, Slice};

pub(super) mod amx;
pub(super) mod avx2;
pub(super) mod avx2_f32;

/// The checks every tile kernel relies on.
fn check<T>(a: &[T], b: &[T], depth: usize, out: &[f32], ldc: usize, rows: usize, slice: Slice) {
    assert!((1..=MR).contains(&rows) && ldc >= NR && slice.lda >= depth);
    assert!(a.len() >= (MR - 1) * slice.lda + depth && b.len() >= depth * NR && out.len() >= (rows - 1) * ldc + NR);
}

/// The checks every int8 tile kernel's dequantisation relies on.
fn check_dequant(rows: usize, d: &super::Dequant<'_>) {
    assert!(d.row_scale.len() >= rows && d.row_zero.len() >= rows);
    assert!(d.col_scale.len() >= NR && d.col_sum.len() >= NR);
    assert!(d.exact_x.len() >= MR * d.exact && d.exact_w.len() >= d.exact * NR);
}

pub(super) fn f32_tile(a: &[f32], b: &[f32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, slice: Slice) {
    check(a, b, depth, out, ldc, rows, slice);
    assert!(super::avx512_supported());
    // SAFETY: the CPU has AVX-512 F; `a` holds `MR` rows of `depth` values `lda` apart and `b`
    // `depth × NR` values, all the kernel reads; it reads and writes `NR` f32 at `r·ldc` for
    // `r < rows`, within `out` (all checked above).
    unsafe { f32_avx512(a.as_ptr(), b.as_ptr(), depth, out.as_mut_ptr(), ldc, rows, slice) }
}

pub(super) fn bf16_tile(a: &[u32], b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, slice: Slice) {
    check(a, b, depth, out, ldc, rows, slice);
    assert!(super::bf16_supported());
    // SAFETY: as for `f32_tile`, with AVX-512 BF16 as well.
    unsafe { bf16_avx512(a.as_ptr(), b.as_ptr(), depth, out.as_mut_ptr(), ldc, rows, slice) }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn int8_tile(
    a: &[u32],
    b: &[u32],
    depth: usize,
    out: &mut [f32],
    ldc: usize,
    rows: usize,
    slice: Slice,
    d: &super::Dequant<'_>,
) {
    check(a, b, depth, out, ldc, rows, slice);
    check_dequant(rows, d);
    assert!(super::vnni_supported());
    // SAFETY: as for `f32_tile`, with AVX-512 BW and VNNI as well; the kernel reads `rows`
    // row scales and zero points and `NR` column scales and sums (checked above).
    unsafe {
        int8_avx512(
            a.as_ptr(),
            b.as_ptr(),
            depth,
            out.as_mut_ptr(),
            ldc,
            rows,
            slice,
            [d.row_scale.as_ptr(), d.col_scale.as_ptr()],
            [d.row_zero.as_ptr(), d.col_sum.as_ptr()],
            (d.exact, d.exact_x.as_ptr(), d.exact_w.as_ptr()),
        )
    }
}

/// Dequantises `rows` rows of `NR` int32 sums in place (their bits in `out`, rows `ldc` apart),
/// with the arithmetic of the VNNI kernel after its last slice (`int8_tile_reference`'s): the
/// AMX kernel's last step.
pub(super) fn dequantize_rows(out: &mut [f32], ldc: usize, rows: usize, d: &super::Dequant<'_>) {
    assert!(rows >= 1 && ldc >= NR && out.len() >= (rows - 1) * ldc + NR);
    assert!(d.row_scale.len() >= rows && d.row_zero.len() >= rows);
    assert!(d.col_scale.len() >= NR && d.col_sum.len() >= NR);
    assert!(d.exact_x.len() >= rows * d.exact && d.exact_w.len() >= d.exact * NR);
    assert!(super::vnni_supported());
    // SAFETY: the CPU has AVX-512 F; the kernel reads and writes `NR` f32 at `r·ldc` for
    // `r < rows` within `out`, reads `rows` row scales, zero points and rows of exact values,
    // `NR` column scales and sums and `exact × NR` exact weights (all checked above).
    unsafe {
        dequantize_avx512(
            out.as_mut_ptr(),
            ldc,
            rows,
            [d.row_scale.as_ptr(), d.col_scale.as_ptr()],
            [d.row_zero.as_ptr(), d.col_sum.as_ptr()],
            (d.exact, d.exact_x.as_ptr(), d.exact_w.as_ptr()),
        )
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn dequantize_avx512(
    out: *mut f32,
    ldc: usize,
    rows: usize,
    [row_scale, col_scale]: [*const f32; 2],
    [row_zero, col_sum]: [*const i32; 2],
    (exact, exact_x, exact_w): (usize, *const f32, *const f32),
) {
    // SAFETY: within the lengths `dequantize_rows` checked; each vector is loaded before it is
    // stored over.
    unsafe {
        let scale = [0, 16, 32, 48].map(|v| _mm512_loadu_ps(col_scale.add(v)));
        let sum = [0, 16, 32, 48].map(|v| _mm512_loadu_si512(col_sum.add(v).cast()));
        for r in 0..rows {
            let zero = _mm512_set1_epi32(*row_zero.add(r));
            let row = _mm512_set1_ps(*row_scale.add(r));
            for v in 0..NR / 16 {
                let at = out.add(r * ldc + v * 16);
                let corrected = _mm512_sub_epi32(_mm512_loadu_si512(at.cast()), _mm512_mullo_epi32(zero, sum[v]));
                let mut value = _mm512_mul_ps(_mm512_cvtepi32_ps(corrected), _mm512_mul_ps(row, scale[v]));
                for c in 0..exact {
                    let x = _mm512_set1_ps(*exact_x.add(r * exact + c));
                    value = _mm512_fmadd_ps(x, _mm512_loadu_ps(exact_w.add(c * NR + v * 16)), value);
                }
                _mm512_storeu_ps(at, value);
            }
        }
    }
}

/// One row of activations quantised to u8 (per token, asymmetric), each value multiplied by its
/// `inv_smooth` factor first, into `lanes` (its bytes four to a u32, little-endian; the row's
/// `k` bytes are written, the lanes' padding bytes left as they are); returns `(scale, zero)`.
/// The row's range includes 0; a NaN value is skipped by the range and quantises to 0. Equal,
/// byte for byte, to the scalar definition (`quantize_row_plain`, tests).
pub(super) fn quantize_row(row: &[f32], inv_smooth: &[f32], lanes: &mut [u32]) -> (f32, i32) {
    assert!(inv_smooth.len() == row.len() && lanes.len() * 4 >= row.len());
    assert!(super::vnni_supported());
    // SAFETY: the CPU has AVX-512 F and BW; the kernel reads `row.len()` values of `row` and
    // `inv_smooth` and writes `row.len()` bytes into `lanes` (checked above).
    unsafe { quantize_row_avx512(row.as_ptr(), inv_smooth.as_ptr(), row.len(), lanes.as_mut_ptr().cast::<i8>()) }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(row: *const f32, inv_smooth: *const f32, k: usize, bytes: *mut i8) -> (f32, i32) {
    // Whole vectors, then the tail under a mask (masked-off lanes load as 0, inside the range).
    // SAFETY (every load and store below): the masks keep each access below `k` values or bytes.
    let (full, tail) = (k / 16, (1u16 << (k % 16)) - 1);
    // Two accumulators each against the instructions' latency (named, not indexed: an indexed
    // array went through the stack). The second operand is returned when either is NaN: a NaN
    // value is skipped.
    let (mut lo, mut hi, mut lo2, mut hi2) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    for pair in 0..full / 2 {
        let (v, v2) = unsafe { (smoothed(row, inv_smooth, pair * 32, 0xffff), smoothed(row, inv_smooth, pair * 32 + 16, 0xffff)) };
        (lo, hi) = (_mm512_min_ps(v, lo), _mm512_max_ps(v, hi));
        (lo2, hi2) = (_mm512_min_ps(v2, lo2), _mm512_max_ps(v2, hi2));
    }
    for (start, mask) in [(full / 2 * 32, if full % 2 == 1 { 0xffff } else { 0 }), (full * 16, tail)] {
        if mask != 0 {
            let v = unsafe { smoothed(row, inv_smooth, start, mask) };
            (lo, hi) = (_mm512_min_ps(v, lo), _mm512_max_ps(v, hi));
        }
    }
    let (lo, hi) = (_mm512_min_ps(lo, lo2), _mm512_max_ps(hi, hi2));
    match super::row_mapping(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi)) {
        Err(scale) => {
            unsafe { std::ptr::write_bytes(bytes, 0, k) };
            (scale, 0)
        }
        Ok((scale, inv, zero)) => {
            let (inv, zero_v) = (_mm512_set1_ps(inv), _mm512_set1_ps(zero));
            for i in 0..full {
                unsafe { store_quantised(smoothed(row, inv_smooth, i * 16, 0xffff), inv, zero_v, bytes.add(i * 16), 0xffff) };
            }
            if tail != 0 {
                unsafe { store_quantised(smoothed(row, inv_smooth, full * 16, tail), inv, zero_v, bytes.add(full * 16), tail) };
            }
            (scale, zero as i32)
        }
    }
}

/// `row[start..] · inv_smooth[start..]`, the lanes outside `mask` 0.
#[inline(always)]
unsafe fn smoothed(row: *const f32, inv_smooth: *const f32, start: usize, mask: __mmask16) -> __m512 {
    // SAFETY: inlined into a caller with AVX-512 F, whose mask keeps the reads inside both slices.
    unsafe { _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row.add(start)), _mm512_maskz_loadu_ps(mask, inv_smooth.add(start))) }
}

/// Stores the `mask` lanes of `round(clamp(v · inv + zero, 0, 255))` as bytes at `out`.
#[inline(always)]
unsafe fn store_quantised(v: __m512, inv: __m512, zero: __m512, out: *mut i8, mask: __mmask16) {
    // SAFETY: inlined into a caller with AVX-512 F and BW, whose mask keeps the store inside
    // its bytes.
    unsafe {
        let v = _mm512_add_ps(_mm512_mul_ps(v, inv), zero);
        // max first: a NaN becomes 0. Rounded to nearest, ties to even (the MXCSR default).
        let q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0)));
        _mm512_mask_cvtepi32_storeu_epi8(out, mask, q);
    }
}

/// The 32 bf16 halves of 16 u32 lanes, as the type `vdpbf16ps` takes (same bits).
#[inline(always)]
fn as_bf16(v: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit vectors with no invalid bit patterns.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// An accumulator vector: 16 f32 sums, or 16 int32 sums kept in `out` between depth slices as
/// their bits.
trait Accumulator: Copy {
    /// Safety: the CPU has AVX-512 F.
    unsafe fn zero() -> Self;
    /// Safety: `at` is valid for reading 16 f32 and the CPU has AVX-512 F.
    unsafe fn load(at: *const f32) -> Self;
    /// Safety: `at` is valid for writing 16 f32 and the CPU has AVX-512 F.
    unsafe fn save(self, at: *mut f32);
}

impl Accumulator for __m512 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(at) }
    }
    #[inline(always)]
    unsafe fn save(self, at: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(at, self) }
    }
}

impl Accumulator for __m512i {
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_si512(at.cast()) }
    }
    #[inline(always)]
    unsafe fn save(self, at: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_si512(at.cast(), self) }
    }
}

/// The accumulators a slice starts from: zero for a panel's first slice, else the first `rows`
/// rows of `out` (the slices before).
///
/// Safety: the CPU has AVX-512 F; unless `first`, `out` holds `rows` rows of `NR` f32, `ldc` apart.
#[inline(always)]
unsafe fn start<V: Accumulator>(out: *const f32, ldc: usize, rows: usize, first: bool) -> [[V; NR / 16]; MR] {
    // SAFETY: the caller's contract.
    let mut acc = [[unsafe { V::zero() }; NR / 16]; MR];
    if !first {
        for (r, acc_row) in acc.iter_mut().enumerate().take(rows) {
            for (v, acc) in acc_row.iter_mut().enumerate() {
                // SAFETY: r < rows, v < NR/16: within the `out` length the caller checked.
                *acc = unsafe { V::load(out.add(r * ldc + v * 16)) };
            }
        }
    }
    acc
}

/// Asks for the cache lines of the first `rows` rows of a tile's output, which its stores would
/// otherwise wait for after the products: the tile's last instructions.
///
/// Safety: the CPU has SSE; `out` holds `rows` rows of `NR` f32, `ldc` apart.
#[inline(always)]
unsafe fn prefetch_tile(out: *const f32, ldc: usize, rows: usize) {
    for r in 0..rows {
        for v in 0..NR / 16 {
            // SAFETY: r < rows, v < NR/16: within `out` (the caller's contract).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(out.add(r * ldc + v * 16).cast()) };
        }
    }
}

/// How many steps ahead the tile kernels ask for their panel's rows.
const PREFETCH: usize = 8;

/// Asks for the panel row [`PREFETCH`] steps after the one at `row` (`NR` lanes of 4 bytes, four
/// lines): a panel deeper than L1 streams from L2 four lines a step, and asking ahead made the
/// f32 products 6–18 % and the int8 ones 3–10 % faster by shape, bf16's neither (Emerald
/// Rapids, 2 threads, 128 and 768 rows, alternating runs). `wrapping_add`: past the panel's end
/// it is only a hint, never a read.
///
/// Safety: the CPU has SSE.
#[inline(always)]
unsafe fn prefetch_panel_row<T>(row: *const T) {
    for v in 0..NR / 16 {
        // SAFETY: a prefetch reads nothing the program sees; SSE is the caller's contract.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(PREFETCH * NR + v * 16).cast()) };
    }
}

/// Stores the first `rows` rows of the accumulators.
///
/// Safety: the CPU has AVX-512 F; `out` holds `rows` rows of `NR` f32, `ldc` apart.
#[inline(always)]
unsafe fn store<V: Accumulator>(acc: &[[V; NR / 16]; MR], out: *mut f32, ldc: usize, rows: usize) {
    for (r, acc_row) in acc.iter().enumerate().take(rows) {
        for (v, acc) in acc_row.iter().enumerate() {
            // SAFETY: r < rows, v < NR/16: within the `out` length the caller checked.
            unsafe { acc.save(out.add(r * ldc + v * 16)) };
        }
    }
}

// The tile kernels: 6 rows × 4 vectors of 16 columns = 24 accumulators, 4 panel vectors and one
// broadcast per step. Every read is within the lengths `check` verified (p < depth, r < MR,
// rows `lda` apart); the loads are unaligned ones.

#[target_feature(enable = "avx512f")]
unsafe fn f32_avx512(a: *const f32, b: *const f32, depth: usize, out: *mut f32, ldc: usize, rows: usize, slice: Slice) {
    // SAFETY: see `start`.
    let mut acc: [[__m512; NR / 16]; MR] = unsafe { start(out, ldc, rows, slice.first) };
    // SAFETY: see `store` (a prefetch reads nothing the program sees).
    unsafe { prefetch_tile(out, ldc, rows) };
    for p in 0..depth {
        // SAFETY: see above.
        let bp = unsafe { b.add(p * NR) };
        let bv = unsafe {
            [_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16)), _mm512_loadu_ps(bp.add(32)), _mm512_loadu_ps(bp.add(48))]
        };
        // SAFETY: inlined into a kernel with AVX-512 F.
        unsafe { prefetch_panel_row(bp) };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(unsafe { *a.add(r * slice.lda + p) });
            for (v, acc) in acc_row.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(av, bv[v], *acc);
            }
        }
    }
    // SAFETY: see `store`.
    unsafe { store(&acc, out, ldc, rows) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_avx512(a: *const u32, b: *const u32, depth: usize, out: *mut f32, ldc: usize, rows: usize, slice: Slice) {
    // SAFETY: see `start`.
    let mut acc: [[__m512; NR / 16]; MR] = unsafe { start(out, ldc, rows, slice.first) };
    // SAFETY: see `store` (a prefetch reads nothing the program sees).
    unsafe { prefetch_tile(out, ldc, rows) };
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
        // SAFETY: inlined into a kernel with AVX-512 F.
        unsafe { prefetch_panel_row(bp) };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            let av = as_bf16(_mm512_set1_epi32(unsafe { *a.add(r * slice.lda + p) } as i32));
            for (v, acc) in acc_row.iter_mut().enumerate() {
                *acc = _mm512_dpbf16_ps(*acc, av, bv[v]);
            }
        }
    }
    // SAFETY: see `store`.
    unsafe { store(&acc, out, ldc, rows) }
}

/// `vpdpbusd acc, a, b` adds, in each of its 16 int32 lanes, the four products of `a`'s
/// unsigned bytes with `b`'s signed bytes: `a` is one row's k-quad of u8 activations
/// broadcast, `b` four panel vectors of i8 weight quads. Then per lane
/// `f32(acc − zero[r]·sum[j]) · (row_scale[r] · col_scale[j])`, exactly as
/// `int8_tile_reference` computes it (wrapping int32, `vcvtdq2ps` rounds to nearest even like
/// `as f32`, separate multiplies). Before the panel's last slice the int32 sums are stored as
/// they are (their bits in `out`), and the next slice starts from them.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn int8_avx512(
    a: *const u32,
    b: *const u32,
    depth: usize,
    out: *mut f32,
    ldc: usize,
    rows: usize,
    slice: Slice,
    [row_scale, col_scale]: [*const f32; 2],
    [row_zero, col_sum]: [*const i32; 2],
    (exact, exact_x, exact_w): (usize, *const f32, *const f32),
) {
    // SAFETY: see `start` (an f32 slot holds any 32 bits).
    let mut acc: [[__m512i; NR / 16]; MR] = unsafe { start(out, ldc, rows, slice.first) };
    // SAFETY: see `store` (a prefetch reads nothing the program sees).
    unsafe { prefetch_tile(out, ldc, rows) };
    for p in 0..depth {
        // SAFETY: see above.
        let bp = unsafe { b.add(p * NR) };
        let bv = unsafe {
            [
                _mm512_loadu_si512(bp.cast()),
                _mm512_loadu_si512(bp.add(16).cast()),
                _mm512_loadu_si512(bp.add(32).cast()),
                _mm512_loadu_si512(bp.add(48).cast()),
            ]
        };
        // SAFETY: inlined into a kernel with AVX-512 F.
        unsafe { prefetch_panel_row(bp) };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_epi32(unsafe { *a.add(r * slice.lda + p) } as i32);
            for (v, acc) in acc_row.iter_mut().enumerate() {
                *acc = _mm512_dpbusd_epi32(*acc, av, bv[v]);
            }
        }
    }
    if !slice.last {
        // SAFETY: see `store`.
        return unsafe { store(&acc, out, ldc, rows) };
    }
    // Every row of the tile is dequantised in registers (rows past `rows` from a zero point and
    // scale of 0, read from padded copies: computed, never stored, and no branch in the way of
    // the scheduler), one column vector at a time and in place, so that the 24 sums, one
    // column's scale and sum and a broadcast fit the 32 registers (all 24 corrections at once
    // spilled half of them); then the exact channels are added channel by channel, each
    // channel's four weight vectors loaded once for all rows. Each value still sees the same
    // operations in the same order (the channels ascending), so the bits are the scalar
    // reference's.
    // SAFETY: `NR` column scales and sums, `rows` row scales and zero points, `MR × exact`
    // exact values and `exact × NR` exact weights (checked by `int8_tile`); stores as in `store`.
    unsafe {
        let (mut zero, mut row) = ([0i32; MR], [0f32; MR]);
        for r in 0..rows {
            (zero[r], row[r]) = (*row_zero.add(r), *row_scale.add(r));
        }
        let mut value = [[_mm512_setzero_ps(); NR / 16]; MR];
        for v in 0..NR / 16 {
            let (scale, sum) = (_mm512_loadu_ps(col_scale.add(v * 16)), _mm512_loadu_si512(col_sum.add(v * 16).cast()));
            for r in 0..MR {
                let corrected = _mm512_sub_epi32(acc[r][v], _mm512_mullo_epi32(_mm512_set1_epi32(zero[r]), sum));
                value[r][v] = _mm512_mul_ps(_mm512_cvtepi32_ps(corrected), _mm512_mul_ps(_mm512_set1_ps(row[r]), scale));
            }
        }
        for c in 0..exact {
            let w = [0, 16, 32, 48].map(|v| _mm512_loadu_ps(exact_w.add(c * NR + v)));
            for (r, value_row) in value.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*exact_x.add(r * exact + c));
                for (value, w) in value_row.iter_mut().zip(w) {
                    *value = _mm512_fmadd_ps(x, w, *value);
                }
            }
        }
        for (r, value_row) in value.iter().enumerate().take(rows) {
            for (v, value) in value_row.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * ldc + v * 16), *value);
            }
        }
    }
}

/// Independent FMA chains a round: enough to cover the FMA latency on both FMA pipes (4 cycles ×
/// 2 on Zen; Intel's 512-bit FMAs the same), so the rounds run at the issue rate.
const CHAINS: usize = 12;

/// `rounds` rounds of [`CHAINS`] vector FMAs on registers only, on the widest f32 vectors this CPU
/// has (AVX-512, else AVX2): the rate the FMA units can issue, the limit of every f32 product.
/// Returns the FLOP done and a value every FMA feeds (so that none is left out).
pub(super) fn fma_rounds(rounds: usize) -> (f64, f32) {
    let (x, y) = (std::hint::black_box(0.999_999_9f32), std::hint::black_box(1e-7f32));
    if super::avx512_supported() {
        // SAFETY: the CPU has AVX-512 F; no memory is touched.
        (rounds as f64 * (CHAINS * 16 * 2) as f64, unsafe { fma_avx512(rounds, x, y) })
    } else {
        assert!(super::avx2_supported(), "the CPU has no FMA vectors of ours");
        // SAFETY: the CPU has AVX2 and FMA; no memory is touched.
        (rounds as f64 * (CHAINS * 8 * 2) as f64, unsafe { fma_avx2(rounds, x, y) })
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn fma_avx512(rounds: usize, x: f32, y: f32) -> f32 {
    let (x, y) = (_mm512_set1_ps(x), _mm512_set1_ps(y));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for acc in &mut acc {
            *acc = _mm512_fmadd_ps(*acc, x, y);
        }
    }
    acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
}

/// `rounds` rounds of [`CHAINS`] `vpdpbusd` on registers only: the rate the AVX-512 int8
/// kernel's arithmetic issues, its unit's limit (not a fixed multiple of the FMA peak: cores
/// differ in how many they issue a cycle). Each adds to its chain's lanes the four products of
/// the lane's own bytes (u8) with `y`'s (i8), so that none can be hoisted. Returns the
/// operations done (two per multiply-add, 64 multiply-adds an instruction) and a value every
/// instruction feeds.
pub(super) fn vnni_rounds(rounds: usize, y: i8) -> (f64, i32) {
    assert!(super::vnni_supported(), "the CPU has no AVX-512 VNNI");
    // SAFETY: the CPU has AVX-512 F, BW and VNNI; no memory is touched.
    (rounds as f64 * (CHAINS * 64 * 2) as f64, unsafe { vnni_avx512(rounds, y) })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_avx512(rounds: usize, y: i8) -> i32 {
    let y = _mm512_set1_epi8(y);
    let mut acc = [_mm512_set1_epi32(1); CHAINS];
    for _ in 0..rounds {
        for acc in &mut acc {
            *acc = _mm512_dpbusd_epi32(*acc, *acc, y);
        }
    }
    acc.iter().fold(0i32, |sum, &v| sum.wrapping_add(_mm512_reduce_add_epi32(v)))
}

/// `rounds` rounds of [`CHAINS`] `vdpbf16ps` on registers only: the rate the AVX-512 bf16
/// kernel's arithmetic issues. Each adds to its chain's lanes the two products of `x`'s bf16
/// pair with `y`'s. Returns the FLOP done (two per multiply-add, 32 multiply-adds an
/// instruction) and a value every instruction feeds.
pub(super) fn dpbf16_rounds(rounds: usize, x: f32, y: f32) -> (f64, f32) {
    assert!(super::bf16_supported(), "the CPU has no AVX-512 BF16");
    // SAFETY: the CPU has AVX-512 F and BF16; no memory is touched.
    (rounds as f64 * (CHAINS * 32 * 2) as f64, unsafe { dpbf16_avx512(rounds, x, y) })
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16_avx512(rounds: usize, x: f32, y: f32) -> f32 {
    let (x, y) = (_mm512_cvtne2ps_pbh(_mm512_set1_ps(x), _mm512_set1_ps(x)), _mm512_cvtne2ps_pbh(_mm512_set1_ps(y), _mm512_set1_ps(y)));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for acc in &mut acc {
            *acc = _mm512_dpbf16_ps(*acc, x, y);
        }
    }
    acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
}

#[target_feature(enable = "avx2,fma")]
unsafe fn fma_avx2(rounds: usize, x: f32, y: f32) -> f32 {
    let (x, y) = (_mm256_set1_ps(x), _mm256_set1_ps(y));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for acc in &mut acc {
            *acc = _mm256_fmadd_ps(*acc, x, y);
        }
    }
    let mut lanes = [0f32; 8];
    acc.iter().fold(0.0, |sum, &v| {
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        sum + lanes.iter().sum::<f32>()
    })
}
