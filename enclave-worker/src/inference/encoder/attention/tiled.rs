//! One head's attention through the dense layers' tile kernels ([`dense::f32_tile`], or
//! [`dense::bf16_tile`] in reduced-precision jobs: [`Arithmetic`]), for long texts and local
//! windows: blocks of queries against blocks of keys, the softmax carried from
//! one key block to the next (each query's running maximum and sum; its earlier context rows
//! rescaled when the maximum rises), so that a block's scores stay in L2. Through gemm, a block
//! of 128 queries against 8,192 keys wrote 4 MiB of scores that the softmax and the second
//! product then read back, and each product packed its operands again; here K and V are packed
//! into the kernel's panels once per head and every block reads them from there.

use crate::inference::dense::{self, PANEL, TILE_ROWS};
use crate::inference::kernels;
use crate::inference::strided::MatMut;

/// Queries per block (16 tiles of the kernel's rows) and keys per block: a block's scores are
/// 96 × 256 f32 (96 KiB), its context rows 96 × head_dim.
const QUERIES: usize = 16 * TILE_ROWS;
const KEYS: usize = 4 * PANEL;

/// One head's `n` queries, keys and values: `d` values each, in rows of `stride` values at
/// columns `q`, `k` and `v` of `qkv`.
pub(super) struct HeadRows<'a> {
    pub qkv: &'a [f32],
    pub stride: usize,
    pub d: usize,
    pub columns: [usize; 3],
}

impl HeadRows<'_> {
    fn n(&self) -> usize {
        self.qkv.len() / self.stride
    }

    /// Row `i` of Q (`which` 0), K (1) or V (2).
    fn row(&self, which: usize, i: usize) -> &[f32] {
        &self.qkv[i * self.stride + self.columns[which]..][..self.d]
    }
}

/// Which keys query `i` sees: `i − reach ..= i + reach`, none after `i` when `causal`.
#[derive(Clone, Copy)]
pub(super) struct Reach {
    pub reach: usize,
    pub causal: bool,
}

impl Reach {
    /// The keys of query `i` among `n`, as a range.
    fn keys(self, i: usize, n: usize) -> std::ops::Range<usize> {
        let end = if self.causal { i + 1 } else { i.saturating_add(self.reach).saturating_add(1) };
        i.saturating_sub(self.reach)..end.min(n)
    }
}

/// The arithmetic of a head's two products: f32, or bf16 inputs with f32 sums (the attention of
/// reduced-precision jobs). A lane holds [`Arithmetic::PER_LANE`] consecutive values of a dot
/// product's depth; the scores, the softmax and the context stay f32 either way.
pub(super) trait Arithmetic {
    type Lane: Copy + Default;
    const PER_LANE: usize;
    /// `values` (at most `PER_LANE`, the missing ones zero) as one lane.
    fn lane(values: &[f32]) -> Self::Lane;
    /// `out[j] = lane(rows[0][c], rows[1][c], …)` for the columns `c` of `columns`, in order
    /// (`rows`: `PER_LANE` rows).
    fn interleave(rows: &[&[f32]], columns: std::ops::Range<usize>, out: &mut [Self::Lane]);
    /// [`dense::f32_tile`] or [`dense::bf16_tile`].
    #[allow(clippy::too_many_arguments)]
    fn tile(a: &[Self::Lane], lda: usize, b: &[Self::Lane], depth: usize, out: &mut [f32], ldc: usize, rows: usize, accumulate: bool);
    /// The first `rows` rows of `scores` (the first `width` of each `stride`) as lanes, rows
    /// `stride / PER_LANE` apart: the scores themselves in f32, else converted into `buffer`.
    fn probabilities<'s>(scores: &'s [f32], stride: usize, rows: usize, width: usize, buffer: &'s mut Vec<Self::Lane>) -> &'s [Self::Lane];
}

pub(super) struct F32;
pub(super) struct Bf16;

impl Arithmetic for F32 {
    type Lane = f32;
    const PER_LANE: usize = 1;
    fn lane(values: &[f32]) -> f32 {
        values[0]
    }
    fn interleave(rows: &[&[f32]], columns: std::ops::Range<usize>, out: &mut [f32]) {
        out.copy_from_slice(&rows[0][columns]);
    }
    fn tile(a: &[f32], lda: usize, b: &[f32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, accumulate: bool) {
        dense::f32_tile(a, lda, b, depth, out, ldc, rows, accumulate)
    }
    fn probabilities<'s>(scores: &'s [f32], _: usize, _: usize, _: usize, _: &'s mut Vec<f32>) -> &'s [f32] {
        scores
    }
}

impl Arithmetic for Bf16 {
    type Lane = u32;
    const PER_LANE: usize = 2;
    fn lane(values: &[f32]) -> u32 {
        dense::bf16_pair(values[0], values.get(1).copied().unwrap_or(0.0))
    }
    fn interleave(rows: &[&[f32]], columns: std::ops::Range<usize>, out: &mut [u32]) {
        for ((lane, &lo), &hi) in out.iter_mut().zip(&rows[0][columns.clone()]).zip(&rows[1][columns]) {
            *lane = dense::bf16_pair(lo, hi);
        }
    }
    fn tile(a: &[u32], lda: usize, b: &[u32], depth: usize, out: &mut [f32], ldc: usize, rows: usize, accumulate: bool) {
        dense::bf16_tile(a, lda, b, depth, out, ldc, rows, accumulate)
    }
    fn probabilities<'s>(scores: &'s [f32], stride: usize, rows: usize, width: usize, buffer: &'s mut Vec<u32>) -> &'s [u32] {
        buffer.resize(scores.len() / 2, 0);
        kernels::vectorized(#[inline(always)] || {
            for (lanes, row) in buffer.chunks_exact_mut(stride / 2).zip(scores.chunks_exact(stride)).take(rows) {
                for (lane, two) in lanes[..width / 2].iter_mut().zip(row[..width].chunks_exact(2)) {
                    *lane = dense::bf16_pair(two[0], two[1]);
                }
            }
        });
        buffer
    }
}

/// `out ← softmax(scale · Q·Kᵀ, over each query's keys) · V` for one head (`out`: `n × d`), the
/// products in arithmetic `A`.
///
/// Panics if the CPU has no f32 kernel ([`dense::f32_supported`]), or, for [`Bf16`], AVX-512 BF16
/// ([`dense::bf16_supported`]).
pub(super) fn head<A: Arithmetic>(rows: &HeadRows<'_>, scale: f32, reach: Reach, mut out: MatMut<'_>) {
    let (n, d) = (rows.n(), rows.d);
    // Lanes per row of Q or K, and values per lane.
    let (depth, per) = (d.div_ceil(A::PER_LANE), A::PER_LANE);
    let keys = pack_keys::<A>(rows);
    let (values, padded_n) = pack_values::<A>(rows);
    let d_padded = d.div_ceil(PANEL) * PANEL;
    // A short text's blocks are only as large as the text (whole tiles and panels).
    let (block, key_block) = (QUERIES.min(n.div_ceil(TILE_ROWS) * TILE_ROWS), KEYS.min(padded_n));
    let mut queries = vec![A::Lane::default(); block * depth];
    let mut scores = vec![0f32; block * key_block];
    let mut lanes = Vec::new();
    let mut context = vec![0f32; block * d_padded];
    let (mut maximum, mut total, mut factor) = ([0f32; QUERIES], [0f32; QUERIES], [0f32; QUERIES]);
    let mut scaled = vec![0f32; d];
    for q0 in (0..n).step_by(block) {
        let m = block.min(n - q0);
        // The block's queries, scaled. Past `m`, the last block's tile reads rows of the block
        // before (or, in a text shorter than a block, zeros): computed, never stored.
        for (r, q) in queries.chunks_exact_mut(depth).take(m).enumerate() {
            for (s, &x) in scaled.iter_mut().zip(rows.row(0, q0 + r)) {
                *s = x * scale;
            }
            for (lane, values) in q.iter_mut().zip(scaled.chunks(per)) {
                *lane = A::lane(values);
            }
        }
        maximum.fill(f32::NEG_INFINITY);
        total.fill(0.0);
        let first_key = reach.keys(q0, n).start / PANEL * PANEL;
        let last_key = reach.keys(q0 + m - 1, n).end;
        for k0 in (first_key..last_key).step_by(key_block) {
            let panels = (last_key - k0).min(key_block).div_ceil(PANEL);
            let accumulate = k0 != first_key;
            // Panel by panel, every tile of the block against it, so that the panel stays in L1
            // while the tiles read it. Tile by tile, each tile streamed the block's four panels
            // (64 KiB) again: a head of 8,192 tokens took 11–17 % longer, of 4,096 2–5 %.
            for panel in 0..panels {
                let b = &keys[(k0 / PANEL + panel) * depth * PANEL..][..depth * PANEL];
                for tile in 0..m.div_ceil(TILE_ROWS) {
                    let tile_rows = TILE_ROWS.min(m - tile * TILE_ROWS);
                    let out = &mut scores[tile * TILE_ROWS * key_block + panel * PANEL..];
                    A::tile(&queries[tile * TILE_ROWS * depth..], depth, b, depth, out, key_block, tile_rows, false);
                }
            }
            let width = panels * PANEL;
            kernels::vectorized(#[inline(always)] || {
                for (r, row) in scores.chunks_exact_mut(key_block).take(m).enumerate() {
                    let row = &mut row[..width];
                    let seen = reach.keys(q0 + r, n);
                    let (lo, hi) = (seen.start.max(k0) - k0, seen.end.min(k0 + width).saturating_sub(k0));
                    if lo >= hi {
                        row.fill(0.0);
                        factor[r] = 1.0;
                        continue;
                    }
                    let new_maximum = maximum[r].max(kernels::max(&row[lo..hi]));
                    factor[r] = if maximum[r] == f32::NEG_INFINITY { 0.0 } else { kernels::exp(maximum[r] - new_maximum) };
                    maximum[r] = new_maximum;
                    row[..lo].fill(0.0);
                    row[hi..].fill(0.0);
                    total[r] = total[r] * factor[r] + kernels::exp_shifted(&mut row[lo..hi], new_maximum);
                }
            });
            if accumulate {
                for (row, &f) in context.chunks_exact_mut(d_padded).zip(&factor[..m]) {
                    if f != 1.0 {
                        row.iter_mut().for_each(|x| *x *= f);
                    }
                }
            }
            let probabilities = A::probabilities(&scores, key_block, m, width, &mut lanes);
            let (lda, key_lanes) = (key_block / per, width / per);
            for tile in 0..m.div_ceil(TILE_ROWS) {
                let tile_rows = TILE_ROWS.min(m - tile * TILE_ROWS);
                for column in 0..d_padded / PANEL {
                    let b = &values[(column * padded_n + k0) / per * PANEL..][..key_lanes * PANEL];
                    let out = &mut context[tile * TILE_ROWS * d_padded + column * PANEL..];
                    A::tile(&probabilities[tile * TILE_ROWS * lda..], lda, b, key_lanes, out, d_padded, tile_rows, accumulate);
                }
            }
        }
        for (r, (row, &sum)) in context.chunks_exact(d_padded).zip(&total).take(m).enumerate() {
            let inv = 1.0 / sum;
            for (o, &x) in out.row(q0 + r).iter_mut().zip(row) {
                *o = x * inv;
            }
        }
    }
}

/// K as the kernel's `b` panels: panel `t` holds keys `t·PANEL ..` transposed, `d / PER_LANE`
/// lanes × `PANEL` (`[p][j]` = key `t·PANEL + j`'s lane `p`), keys past `n` zero.
fn pack_keys<A: Arithmetic>(rows: &HeadRows<'_>) -> Vec<A::Lane> {
    let (n, depth) = (rows.n(), rows.d.div_ceil(A::PER_LANE));
    let mut packed = vec![A::Lane::default(); n.div_ceil(PANEL) * depth * PANEL];
    for key in 0..n {
        let panel = &mut packed[key / PANEL * depth * PANEL + key % PANEL..];
        for (p, values) in rows.row(1, key).chunks(A::PER_LANE).enumerate() {
            panel[p * PANEL] = A::lane(values);
        }
    }
    packed
}

/// V as `b` panels: column panel `c` holds the values' columns `c·PANEL ..` of every key, one
/// row of `PANEL` lanes per `PER_LANE` keys (`[key / PER_LANE][j]`), keys past `n` and columns
/// past `d` zero. Returns them and the padded key count (`PER_LANE` × the rows of each panel).
fn pack_values<A: Arithmetic>(rows: &HeadRows<'_>) -> (Vec<A::Lane>, usize) {
    let (n, d, per) = (rows.n(), rows.d, A::PER_LANE);
    let padded_n = n.div_ceil(PANEL) * PANEL;
    let mut packed = vec![A::Lane::default(); d.div_ceil(PANEL) * padded_n / per * PANEL];
    let zero = vec![0f32; d];
    for first in (0..n).step_by(per) {
        let keys: [&[f32]; 2] = std::array::from_fn(|e| if first + e < n { rows.row(2, first + e) } else { &zero[..] });
        for (column, start) in (0..d).step_by(PANEL).enumerate() {
            let width = PANEL.min(d - start);
            let at = (column * padded_n + first) / per * PANEL;
            A::interleave(&keys[..per], start..start + width, &mut packed[at..at + width]);
        }
    }
    (packed, padded_n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition in f64 over the inputs as the products see them: each query's softmax
    /// over its keys of `round(scale·q)·round(k)`, then the weighted `round(v)`.
    fn reference(rows: &HeadRows<'_>, scale: f32, reach: Reach, round: fn(f32) -> f32) -> Vec<f64> {
        let (n, d) = (rows.n(), rows.d);
        let seen = |which: usize, i: usize, factor: f32| -> Vec<f64> { rows.row(which, i).iter().map(|&x| round(x * factor) as f64).collect() };
        let mut out = vec![0f64; n * d];
        for i in 0..n {
            let keys = reach.keys(i, n);
            let q = seen(0, i, scale);
            let dot = |j: usize| q.iter().zip(seen(1, j, 1.0)).map(|(q, k)| q * k).sum::<f64>();
            let top = keys.clone().map(dot).fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = keys.clone().map(|j| (dot(j) - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (j, w) in keys.zip(&weights) {
                for (o, v) in out[i * d..(i + 1) * d].iter_mut().zip(seen(2, j, 1.0)) {
                    *o += w / total * v;
                }
            }
        }
        out
    }

    /// `A`'s head on ragged lengths (a tail tile, a tail panel, one key block and several), head
    /// widths that fill no whole panel, two or four panels, global, windowed and causal: within
    /// `bound` of the definition, and the output view's other columns untouched.
    fn equals_the_definition<A: Arithmetic>(round: fn(f32) -> f32, bound: f64) {
        for (n, d, reach, causal) in [
            (1, 64, 1, false),
            (7, 48, 7, false),
            (5, 33, 5, false),
            (87, 32, 87, false),
            (97, 64, 97, false),
            (300, 32, 16, false),
            (613, 128, 613, true),
            (613, 64, 64, false),
            (1100, 256, 1100, false),
            (1100, 128, 40, true),
        ] {
            // Q | K | V at a stride with two spare columns; values of a size attention sees.
            let stride = 3 * d + 2;
            let qkv: Vec<f32> = (0..n * stride).map(|i| ((i as f32 * 0.7548).sin() * 2.5).fract() * 3.0).collect();
            let rows = HeadRows { qkv: &qkv, stride, d, columns: [0, d, 2 * d] };
            let reach = Reach { reach, causal };
            let scale = 1.0 / (d as f32).sqrt();
            let mut out = vec![7f32; n * (d + 3)];
            head::<A>(&rows, scale, reach, MatMut::new(&mut out[1..], n, d, d + 3));
            let want = reference(&rows, scale, reach, round);
            for i in 0..n {
                let row = &out[i * (d + 3)..(i + 1) * (d + 3)];
                assert_eq!((row[0], row[d + 1], row[d + 2]), (7.0, 7.0, 7.0), "n {n} d {d}: row {i} written outside the view");
                for (c, (&got, &want)) in row[1..=d].iter().zip(&want[i * d..]).enumerate() {
                    assert!((got as f64 - want).abs() < bound, "n {n} d {d} reach {reach:?}: ({i}, {c}) {got} vs {want}", reach = (reach.reach, reach.causal));
                }
            }
        }
    }

    /// f32: within f32 summation error.
    #[test]
    fn f32_blocks_of_queries_and_keys_equal_the_definition() {
        if !dense::f32_supported() {
            eprintln!("skipped: the CPU has neither AVX-512 nor AVX2 (the tiled path is not taken there)");
            return;
        }
        equals_the_definition::<F32>(|x| x, 2e-5);
    }

    /// bf16: the definition over bf16-rounded queries, keys and values; what is left is each
    /// probability's rounding to bf16 (2⁻⁹ of it, against the f32 sum it is divided by), at most
    /// 2⁻⁸ of the largest |value| (3).
    #[test]
    fn bf16_blocks_of_queries_and_keys_equal_the_definition() {
        if !dense::bf16_supported() {
            eprintln!("skipped: the CPU has no AVX-512 BF16 (bf16 attention is not used there)");
            return;
        }
        let round = |x: f32| f32::from_bits((dense::bf16_pair(x, 0.0) & 0xffff) << 16);
        equals_the_definition::<Bf16>(round, 3.0 / 256.0 + 1e-5);
    }
}
