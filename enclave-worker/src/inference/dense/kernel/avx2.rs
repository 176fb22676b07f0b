//! The int8 tile kernel on AVX2, for CPUs without AVX-512 VNNI (Zen 3: the c6a, m6a and r6a
//! parents): `vpmaddwd` multiplies 16 pairs of i16 and adds each pair into an int32 lane, so
//! both operands are widened to i16 first. The u8 × i8 products (at most 255 · 127) and their
//! pair sums fit, and int32 sums that wrap are the same whatever their order, so the kernel's
//! sums, and with the same dequantisation its values, are the VNNI kernel's bits (tests).
//!
//! It reads the same operands as the VNNI kernel (k-quads of u8 activations and i8 weights as
//! u32 lanes) and computes the same `MR × NR` tile. A panel row's quads of four columns
//! (16 bytes) sign-extend into one vector: per column a 64-bit lane of four i16 weights. Each
//! activation quad, zero-extended to four u16 once per tile and chunk, is broadcast to every
//! 64-bit lane; `vpmaddwd` then leaves each column's sum split over two int32 lanes, added
//! together (`vphaddd`) once, after the depth. A pass takes 8 columns: 6 rows × 2 vectors =
//! 12 accumulators, two weight vectors, a broadcast and a product in the 16 registers.

use std::arch::x86_64::*;

use super::super::{Dequant, MR, NR, Slice};
use super::CHAINS;

/// Columns a pass takes: two vectors of four columns.
const COLUMNS: usize = 8;
/// Passes over a tile's 64 columns.
const PASSES: usize = NR / COLUMNS;
/// Quads of depth widened at a time: 64 panel rows (16 KiB) and 6 widened rows (3 KiB) stay in
/// L1 while the eight passes read them.
const CHUNK: usize = 64;

#[allow(clippy::too_many_arguments)]
pub(in super::super) fn int8_tile(
    a: &[u32],
    b: &[u32],
    depth: usize,
    out: &mut [f32],
    ldc: usize,
    rows: usize,
    slice: Slice,
    d: &Dequant<'_>,
) {
    super::check(a, b, depth, out, ldc, rows, slice);
    super::check_dequant(rows, d);
    assert!(super::super::avx2_supported());
    // SAFETY: the CPU has AVX2 and FMA; the lengths the kernel reads and writes were checked
    // above (`check`, `check_dequant`).
    unsafe { int8_avx2(a.as_ptr(), b.as_ptr(), depth, out.as_mut_ptr(), ldc, rows, slice, d) }
}

/// A tile's sums while the depth runs: per row and pass, two vectors of four columns, each
/// column's sum split over its two int32 lanes.
type Sums = [[[__m256i; 2]; PASSES]; MR];

#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn int8_avx2(a: *const u32, b: *const u32, depth: usize, out: *mut f32, ldc: usize, rows: usize, slice: Slice, d: &Dequant<'_>) {
    // SAFETY (every access below): rows r < MR of `a` (`lda` apart) and p < depth; rows
    // r < rows of `out`, columns below NR; panel rows p < depth of NR lanes: within the lengths
    // `int8_tile` checked.
    let mut sums: Sums = [[[_mm256_setzero_si256(); 2]; PASSES]; MR];
    if !slice.first {
        // The slices before: each sum into the even lane of its column, 0 in the odd.
        for (r, row) in sums.iter_mut().enumerate().take(rows) {
            for (pass, pair) in row.iter_mut().enumerate() {
                let at = unsafe { out.add(r * ldc + pass * COLUMNS) }.cast::<__m128i>();
                *pair = unsafe { [_mm256_cvtepu32_epi64(_mm_loadu_si128(at)), _mm256_cvtepu32_epi64(_mm_loadu_si128(at.add(1)))] };
            }
        }
    }
    // Uninitialised, not zeroed (a 3 KiB memset per tile): a chunk writes the lanes it reads.
    let mut widened = [[std::mem::MaybeUninit::<u64>::uninit(); CHUNK]; MR];
    for chunk in (0..depth).step_by(CHUNK) {
        let steps = CHUNK.min(depth - chunk);
        for (r, row) in widened.iter_mut().enumerate() {
            for (p, lane) in row.iter_mut().enumerate().take(steps) {
                lane.write(widen(unsafe { *a.add(r * slice.lda + chunk + p) }));
            }
        }
        for pass in 0..PASSES {
            let mut acc = [[_mm256_setzero_si256(); 2]; MR];
            for (acc, sums) in acc.iter_mut().zip(&sums) {
                *acc = sums[pass];
            }
            for p in 0..steps {
                let bp = unsafe { b.add((chunk + p) * NR + pass * COLUMNS) }.cast::<__m128i>();
                let bv = unsafe { [_mm256_cvtepi8_epi16(_mm_loadu_si128(bp)), _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(1)))] };
                for (acc_row, widened_row) in acc.iter_mut().zip(&widened) {
                    // SAFETY: p < steps: written above.
                    let av = _mm256_set1_epi64x(unsafe { widened_row[p].assume_init() } as i64);
                    for (acc, bv) in acc_row.iter_mut().zip(bv) {
                        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(av, bv));
                    }
                }
            }
            for (acc, sums) in acc.iter().zip(&mut sums) {
                sums[pass] = *acc;
            }
        }
    }
    // SAFETY: as above; `d` holds `rows` row scales and zero points, `NR` column scales and
    // sums, `MR × exact` exact values and `exact × NR` exact weights (checked by `int8_tile`).
    unsafe { finish(&sums, out, ldc, rows, slice, d) }
}

/// An activation quad's four u8 as four u16 (lowest k lowest).
#[inline(always)]
fn widen(quad: u32) -> u64 {
    let b = quad.to_le_bytes();
    u64::from(b[0]) | u64::from(b[1]) << 16 | u64::from(b[2]) << 32 | u64::from(b[3]) << 48
}

/// The tile's int32 sums stored as they are (their bits) before a panel's last slice, after it
/// dequantised with the VNNI kernel's arithmetic (`int8_tile_reference`'s, operation for
/// operation): `f32(acc − zero·sum) · (row_scale · col_scale)`, then one FMA per exact channel,
/// the channels ascending.
///
/// Safety: the CPU has AVX2 and FMA; `out` holds `rows` rows of `NR` f32, `ldc` apart; `d` the
/// lengths `int8_tile` checked.
#[target_feature(enable = "avx2,fma")]
unsafe fn finish(sums: &Sums, out: *mut f32, ldc: usize, rows: usize, slice: Slice, d: &Dequant<'_>) {
    for (r, row) in sums.iter().enumerate().take(rows) {
        for (pass, [lo, hi]) in row.iter().enumerate() {
            // [c0 c1 c4 c5 | c2 c3 c6 c7] → [c0 … c7].
            let acc = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(*lo, *hi));
            let column = pass * COLUMNS;
            // SAFETY (every access below): r < rows, column + 8 ≤ NR, c < exact: the function's
            // contract.
            let at = unsafe { out.add(r * ldc + column) };
            if !slice.last {
                unsafe { _mm256_storeu_si256(at.cast(), acc) };
                continue;
            }
            let (col_scale, col_sum) = unsafe { (_mm256_loadu_ps(d.col_scale.as_ptr().add(column)), _mm256_loadu_si256(d.col_sum.as_ptr().add(column).cast())) };
            let corrected = _mm256_sub_epi32(acc, _mm256_mullo_epi32(_mm256_set1_epi32(d.row_zero[r]), col_sum));
            let mut value = _mm256_mul_ps(_mm256_cvtepi32_ps(corrected), _mm256_mul_ps(_mm256_set1_ps(d.row_scale[r]), col_scale));
            for c in 0..d.exact {
                let w = unsafe { _mm256_loadu_ps(d.exact_w.as_ptr().add(c * NR + column)) };
                value = _mm256_fmadd_ps(_mm256_set1_ps(d.exact_x[r * d.exact + c]), w, value);
            }
            unsafe { _mm256_storeu_ps(at, value) };
        }
    }
}

/// [`super::quantize_row`] on AVX2: the same bytes, mapping and contract.
pub(in super::super) fn quantize_row(row: &[f32], inv_smooth: &[f32], lanes: &mut [u32]) -> (f32, i32) {
    assert!(inv_smooth.len() == row.len() && lanes.len() * 4 >= row.len());
    assert!(super::super::avx2_supported());
    // SAFETY: the CPU has AVX2 and FMA; the kernel reads `row.len()` values of `row` and
    // `inv_smooth` and writes `row.len()` bytes into `lanes` (checked above).
    unsafe { quantize_row_avx2(row.as_ptr(), inv_smooth.as_ptr(), row.len(), lanes.as_mut_ptr().cast::<u8>()) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(row: *const f32, inv_smooth: *const f32, k: usize, bytes: *mut u8) -> (f32, i32) {
    // Whole vectors of 8, then the tail under a mask (masked-off lanes load as 0, inside the
    // range). SAFETY (every load and store below): the masks and `k` keep each access below `k`
    // values or bytes.
    let (full, tail) = (k / 8, k % 8);
    let tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    // `min`/`max` return their second operand when either is NaN: a NaN value is skipped.
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in 0..full {
        let v = unsafe { smoothed(row, inv_smooth, i * 8, None) };
        (lo, hi) = (_mm256_min_ps(v, lo), _mm256_max_ps(v, hi));
    }
    if tail != 0 {
        let v = unsafe { smoothed(row, inv_smooth, full * 8, Some(tail_mask)) };
        (lo, hi) = (_mm256_min_ps(v, lo), _mm256_max_ps(v, hi));
    }
    // SAFETY: the CPU has AVX2.
    let (lo, hi) = unsafe { (reduce(lo, |a, b| _mm_min_ps(a, b)), reduce(hi, |a, b| _mm_max_ps(a, b))) };
    match super::super::row_mapping(lo, hi) {
        Err(scale) => {
            unsafe { std::ptr::write_bytes(bytes, 0, k) };
            (scale, 0)
        }
        Ok((scale, inv, zero)) => {
            let (inv, zero_v) = (_mm256_set1_ps(inv), _mm256_set1_ps(zero));
            for i in 0..full {
                let q = unsafe { quantised(smoothed(row, inv_smooth, i * 8, None), inv, zero_v) };
                unsafe { std::ptr::copy_nonoverlapping(q.as_ptr(), bytes.add(i * 8), 8) };
            }
            if tail != 0 {
                let q = unsafe { quantised(smoothed(row, inv_smooth, full * 8, Some(tail_mask)), inv, zero_v) };
                unsafe { std::ptr::copy_nonoverlapping(q.as_ptr(), bytes.add(full * 8), tail) };
            }
            (scale, zero as i32)
        }
    }
}

/// `row[start..start + 8] · inv_smooth[start..]`, lanes outside `mask` 0.
#[inline(always)]
unsafe fn smoothed(row: *const f32, inv_smooth: *const f32, start: usize, mask: Option<__m256i>) -> __m256 {
    // SAFETY: inlined into a caller with AVX2 whose `start` (and mask) keep the reads inside
    // both slices.
    unsafe {
        match mask {
            None => _mm256_mul_ps(_mm256_loadu_ps(row.add(start)), _mm256_loadu_ps(inv_smooth.add(start))),
            Some(mask) => _mm256_mul_ps(_mm256_maskload_ps(row.add(start), mask), _mm256_maskload_ps(inv_smooth.add(start), mask)),
        }
    }
}

/// The eight lanes of `v` folded to one with `op` (`min` or `max`; the lanes are NaN-free
/// after the loop's folding, so the order does not matter).
///
/// Safety: the CPU has AVX2.
#[inline(always)]
unsafe fn reduce(v: __m256, op: impl Fn(__m128, __m128) -> __m128) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let four = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let two = op(four, _mm_movehl_ps(four, four));
        _mm_cvtss_f32(op(two, _mm_movehdup_ps(two)))
    }
}

/// `round(clamp(v · inv + zero, 0, 255))` of the eight lanes as bytes.
///
/// Safety: the CPU has AVX2.
#[inline(always)]
unsafe fn quantised(v: __m256, inv: __m256, zero: __m256) -> [u8; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_add_ps(_mm256_mul_ps(v, inv), zero);
        // max first: a NaN becomes 0. Rounded to nearest, ties to even (the MXCSR default).
        let q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0)));
        let words = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        (_mm_cvtsi128_si64(_mm_packus_epi16(words, words)) as u64).to_le_bytes()
    }
}

/// `rounds` rounds of [`CHAINS`] (the FMA probe's) `vpmaddwd` + `vpaddd` pairs on registers
/// only: the rate this kernel's arithmetic can issue, its limit as the FMA rate is the f32
/// kernels' (on Zen 3 the pair shares the vector pipes, so it is less than two `vpmaddwd` a
/// cycle). Each product reads its chain's sum, so that none can be hoisted. Returns the
/// operations done (two per multiply-add, 16 multiply-adds a pair) and a value every pair feeds.
pub(in super::super) fn madd_rounds(rounds: usize) -> (f64, i32) {
    assert!(super::super::avx2_supported());
    // SAFETY: the CPU has AVX2; no memory is touched.
    (rounds as f64 * (CHAINS * 16 * 2) as f64, unsafe { madd_avx2(rounds, std::hint::black_box(3)) })
}

#[target_feature(enable = "avx2")]
unsafe fn madd_avx2(rounds: usize, y: i16) -> i32 {
    let y = _mm256_set1_epi16(y);
    let mut acc = [_mm256_set1_epi32(1); CHAINS];
    for _ in 0..rounds {
        for acc in &mut acc {
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(*acc, y));
        }
    }
    let mut lanes = [0i32; 8];
    acc.iter().fold(0i32, |sum, &v| {
        // SAFETY: `lanes` holds 8 i32.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
        lanes.iter().fold(sum, |sum, &x| sum.wrapping_add(x))
    })
}
