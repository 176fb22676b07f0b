//! A softmax row's two passes on AVX-512: its maximum, and `2^(x·log₂e − m·log₂e)` with the sum.
//! The arithmetic of [`super::max_lanes`] and [`super::exp_shifted_lanes`] lane for lane, the
//! same bits (their test compares them); what differs is the tail, here one masked chunk. The
//! vectoriser kept the portable tail's lanes on the stack and read them back in pieces, and each
//! row paid for it with store-forwarding stalls: 80 ns for a 65-value row, 33 ns for a 64-value
//! one (Emerald Rapids). The only `unsafe` of the element-wise kernels.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{EXP2_POLYNOMIAL, LANES, LOG2E, ROUND_TO_INTEGER};

/// Whether this CPU runs these passes (AVX-512 F).
pub(super) fn supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

pub(super) fn max(row: &[f32]) -> f32 {
    assert!(supported());
    // SAFETY: the CPU has AVX-512 F; the kernel reads `row.len()` values from `row`.
    unsafe { max_avx512(row.as_ptr(), row.len()) }
}

pub(super) fn exp_shifted(row: &mut [f32], m: f32) -> f32 {
    assert!(supported());
    // SAFETY: the CPU has AVX-512 F; the kernel reads and writes `row.len()` values of `row`.
    unsafe { exp_shifted_avx512(row.as_mut_ptr(), row.len(), m) }
}

/// The lanes `n % 16` values at `p` leave after `n / 16` whole chunks, −inf in the others.
#[inline(always)]
unsafe fn masked_tail(p: *const f32, tail: usize) -> (__mmask16, __m512) {
    let mask = ((1u32 << tail) - 1) as __mmask16;
    // SAFETY (caller): `tail` values lie at `p`; the masked lanes are not read.
    (mask, unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), mask, p) })
}

/// The sum (or with `max` the maximum) of the 16 lanes: lane i with lane i + w for w = 8, 4, 2,
/// 1, [`super::halving`]'s order.
#[inline(always)]
unsafe fn halving(v: __m512, max: bool) -> f32 {
    // SAFETY: inlined into a caller with AVX-512 F; registers only.
    unsafe {
        let op = |a, b| if max { _mm512_max_ps(b, a) } else { _mm512_add_ps(a, b) };
        let v = op(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
        let v = op(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        let v = op(v, _mm512_permute_ps::<0b01_00_11_10>(v));
        let v = op(v, _mm512_permute_ps::<0b10_11_00_01>(v));
        _mm512_cvtss_f32(v)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn max_avx512(p: *const f32, n: usize) -> f32 {
    // `if v > a { v } else { a }` is `max_ps(v, a)`.
    let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
    let (whole, tail) = (n - n % LANES, n % LANES);
    for i in (0..whole).step_by(LANES) {
        // SAFETY (caller): `n` values at `p`.
        acc = _mm512_max_ps(unsafe { _mm512_loadu_ps(p.add(i)) }, acc);
    }
    if tail > 0 {
        // SAFETY (caller): the tail's values lie at `p + whole`.
        let (_, v) = unsafe { masked_tail(p.add(whole), tail) };
        acc = _mm512_max_ps(v, acc);
    }
    // SAFETY: registers only.
    unsafe { halving(acc, true) }
}

/// [`super::exp2`] on 16 lanes, its operations in its order.
#[inline(always)]
unsafe fn exp2(x: __m512) -> __m512 {
    // SAFETY: inlined into a caller with AVX-512 F; registers only.
    unsafe {
        let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.0)), _mm512_set1_ps(127.0));
        let round = _mm512_set1_ps(ROUND_TO_INTEGER);
        let t = _mm512_add_ps(x, round);
        let f = _mm512_sub_ps(x, _mm512_sub_ps(t, round));
        let mut p = _mm512_set1_ps(EXP2_POLYNOMIAL[0]);
        for c in &EXP2_POLYNOMIAL[1..] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(*c));
        }
        let k = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(ROUND_TO_INTEGER.to_bits() as i32));
        let two_to_the_k = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(k, _mm512_set1_epi32(127))));
        _mm512_mul_ps(p, two_to_the_k)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(p: *mut f32, n: usize, m: f32) -> f32 {
    let (log2e, shift) = (_mm512_set1_ps(LOG2E), _mm512_set1_ps(-(m * LOG2E)));
    let mut acc = _mm512_setzero_ps();
    let (whole, tail) = (n - n % LANES, n % LANES);
    // The portable version's last whole chunk holds the tail in its top lanes when the row has a
    // whole chunk, and the padded one in its bottom lanes otherwise: the same lanes here.
    let last = (tail > 0 && n >= LANES).then(|| {
        // SAFETY (caller): `n ≥ 16` values at `p`; read before the chunks below write them.
        unsafe { _mm512_loadu_ps(p.add(n - LANES)) }
    });
    for i in (0..whole).step_by(LANES) {
        // SAFETY (caller): `n` values at `p`.
        let e = unsafe { exp2(_mm512_fmadd_ps(_mm512_loadu_ps(p.add(i)), log2e, shift)) };
        acc = _mm512_add_ps(acc, e);
        // SAFETY: as the load.
        unsafe { _mm512_storeu_ps(p.add(i), e) };
    }
    if let Some(v) = last {
        let fresh = !(((1u32 << (LANES - tail)) - 1) as __mmask16);
        // SAFETY: this function has AVX-512 F.
        let e = unsafe { exp2(_mm512_fmadd_ps(v, log2e, shift)) };
        acc = _mm512_mask_add_ps(acc, fresh, acc, e);
        // SAFETY: the chunk's 16 values lie inside the row (`n ≥ 16`).
        unsafe { _mm512_mask_storeu_ps(p.add(n - LANES), fresh, e) };
    } else if tail > 0 {
        // SAFETY (caller): `tail` values at `p`.
        let (mask, v) = unsafe { masked_tail(p, tail) };
        // SAFETY: this function has AVX-512 F.
        let e = unsafe { exp2(_mm512_fmadd_ps(v, log2e, shift)) };
        acc = _mm512_add_ps(acc, e);
        // SAFETY: as the load, the same lanes.
        unsafe { _mm512_mask_storeu_ps(p, mask, e) };
    }
    // SAFETY: registers only.
    unsafe { halving(acc, false) }
}
