//! One head's attention through the dense layers' f32 tile kernel ([`dense::f32_tile`]), for long
//! texts and local windows: blocks of queries against blocks of keys, the softmax carried from
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

/// `out ← softmax(scale · Q·Kᵀ, over each query's keys) · V` for one head (`out`: `n × d`).
///
/// Panics if the CPU lacks AVX-512 ([`dense::f32_supported`]).
pub(super) fn head(rows: &HeadRows<'_>, scale: f32, reach: Reach, mut out: MatMut<'_>) {
    let (n, d) = (rows.n(), rows.d);
    let keys = pack_keys(rows);
    let (values, padded_n) = pack_values(rows);
    let d_padded = d.div_ceil(PANEL) * PANEL;
    let mut queries = vec![0f32; QUERIES * d];
    let mut scores = vec![0f32; QUERIES * KEYS];
    let mut context = vec![0f32; QUERIES * d_padded];
    let (mut maximum, mut total, mut factor) = ([0f32; QUERIES], [0f32; QUERIES], [0f32; QUERIES]);
    for q0 in (0..n).step_by(QUERIES) {
        let m = QUERIES.min(n - q0);
        // The block's queries, scaled. Past `m`, the last block's tile reads rows of the block
        // before: computed, never stored.
        for (r, q) in queries.chunks_exact_mut(d).take(m).enumerate() {
            for (q, &x) in q.iter_mut().zip(rows.row(0, q0 + r)) {
                *q = x * scale;
            }
        }
        maximum.fill(f32::NEG_INFINITY);
        total.fill(0.0);
        let first_key = reach.keys(q0, n).start / PANEL * PANEL;
        let last_key = reach.keys(q0 + m - 1, n).end;
        for k0 in (first_key..last_key).step_by(KEYS) {
            let panels = (last_key - k0).min(KEYS).div_ceil(PANEL);
            let accumulate = k0 != first_key;
            for tile in 0..m.div_ceil(TILE_ROWS) {
                let tile_rows = TILE_ROWS.min(m - tile * TILE_ROWS);
                for panel in 0..panels {
                    let b = &keys[(k0 / PANEL + panel) * d * PANEL..][..d * PANEL];
                    let out = &mut scores[tile * TILE_ROWS * KEYS + panel * PANEL..];
                    dense::f32_tile(&queries[tile * TILE_ROWS * d..], d, b, d, out, KEYS, tile_rows, false);
                }
            }
            let width = panels * PANEL;
            kernels::vectorized(#[inline(always)] || {
                for (r, row) in scores.chunks_exact_mut(KEYS).take(m).enumerate() {
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
            for tile in 0..m.div_ceil(TILE_ROWS) {
                let tile_rows = TILE_ROWS.min(m - tile * TILE_ROWS);
                for column in 0..d_padded / PANEL {
                    let b = &values[(column * padded_n + k0) * PANEL..][..width * PANEL];
                    let out = &mut context[tile * TILE_ROWS * d_padded + column * PANEL..];
                    dense::f32_tile(&scores[tile * TILE_ROWS * KEYS..], KEYS, b, width, out, d_padded, tile_rows, accumulate);
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

/// K as the kernel's `b` panels: panel `t` holds keys `t·PANEL ..` transposed, `d × PANEL`
/// (`[p][j]` = key `t·PANEL + j`'s value `p`), keys past `n` zero.
fn pack_keys(rows: &HeadRows<'_>) -> Vec<f32> {
    let (n, d) = (rows.n(), rows.d);
    let mut packed = vec![0f32; n.div_ceil(PANEL) * d * PANEL];
    for key in 0..n {
        let panel = &mut packed[key / PANEL * d * PANEL + key % PANEL..];
        for (p, &x) in rows.row(1, key).iter().enumerate() {
            panel[p * PANEL] = x;
        }
    }
    packed
}

/// V as `b` panels: column panel `c` holds the values' columns `c·PANEL ..` of every key, one
/// row of `PANEL` per key (`[key][j]`), keys past `n` and columns past `d` zero. Returns them
/// and the padded key count (the rows of each column panel).
fn pack_values(rows: &HeadRows<'_>) -> (Vec<f32>, usize) {
    let (n, d) = (rows.n(), rows.d);
    let padded_n = n.div_ceil(PANEL) * PANEL;
    let mut packed = vec![0f32; d.div_ceil(PANEL) * padded_n * PANEL];
    for key in 0..n {
        for (column, chunk) in rows.row(2, key).chunks(PANEL).enumerate() {
            packed[(column * padded_n + key) * PANEL..][..chunk.len()].copy_from_slice(chunk);
        }
    }
    (packed, padded_n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition in f64: each query's softmax over its keys, then the weighted values.
    fn reference(rows: &HeadRows<'_>, scale: f32, reach: Reach) -> Vec<f64> {
        let (n, d) = (rows.n(), rows.d);
        let mut out = vec![0f64; n * d];
        for i in 0..n {
            let keys = reach.keys(i, n);
            let dot = |j: usize| rows.row(0, i).iter().zip(rows.row(1, j)).map(|(&q, &k)| q as f64 * k as f64).sum::<f64>() * scale as f64;
            let top = keys.clone().map(dot).fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = keys.clone().map(|j| (dot(j) - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (j, w) in keys.zip(&weights) {
                for (o, &v) in out[i * d..(i + 1) * d].iter_mut().zip(rows.row(2, j)) {
                    *o += w / total * v as f64;
                }
            }
        }
        out
    }

    /// Ragged lengths (a tail tile, a tail panel, one key block and several), head widths that
    /// fill no whole panel, two or four panels, global, windowed and causal: within f32
    /// summation error of the definition, and the output view's other columns untouched.
    #[test]
    fn blocks_of_queries_and_keys_equal_the_definition() {
        if !dense::f32_supported() {
            eprintln!("skipped: the CPU has no AVX-512 (the tiled path is not taken there)");
            return;
        }
        for (n, d, reach, causal) in [
            (1, 64, 1, false),
            (7, 48, 7, false),
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
            head(&rows, scale, reach, MatMut::new(&mut out[1..], n, d, d + 3));
            let want = reference(&rows, scale, reach);
            for i in 0..n {
                let row = &out[i * (d + 3)..(i + 1) * (d + 3)];
                assert_eq!((row[0], row[d + 1], row[d + 2]), (7.0, 7.0, 7.0), "n {n} d {d}: row {i} written outside the view");
                for (c, (&got, &want)) in row[1..=d].iter().zip(&want[i * d..]).enumerate() {
                    assert!((got as f64 - want).abs() < 2e-5, "n {n} d {d} reach {reach:?}: ({i}, {c}) {got} vs {want}", reach = (reach.reach, reach.causal));
                }
            }
        }
    }
}
