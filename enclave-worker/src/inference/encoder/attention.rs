//! Multi-head self-attention of the fused encoder: per sequence over its own tokens, each head's
//! two products on views of the QKV rows ([`strided`]), written in place; rotary positions and a
//! local window where the layer has them ([`Attention`]).

use rayon::prelude::*;

use super::{Attention, Encoder, fused_rows, resize};
use crate::inference::kernels;
use crate::inference::strided::{self, MatMut, MatRef};

impl Encoder {
    /// Multi-head attention per sequence over its own tokens, into `context` (`(total, hidden)`).
    /// `qkv`: `(total, 3·hidden)` without bias; the bias (if any) is added in place first, then
    /// queries and keys are turned by their rotary angles (if the layer has them). Each head's
    /// products read Q, K and V where they lie and write its context columns in place
    /// ([`strided`]). One task per sequence when there are enough of them for the pool, else (one
    /// long text: latency) one task per head of each sequence.
    pub(super) fn attention(
        &self,
        qkv: &mut [f32],
        qkv_b: Option<&[f32]>,
        kind: &Attention<'_>,
        offsets: &[usize],
        context: &mut Vec<f32>,
    ) {
        let h = self.hidden;
        let total = offsets[offsets.len() - 1];
        if qkv_b.is_some() || kind.rotary.is_some() {
            let d = self.head_dim;
            fused_rows(qkv, 3 * h, #[inline(always)] |i, row| {
                if let Some(qkv_b) = qkv_b {
                    for (x, &b) in row.iter_mut().zip(qkv_b) {
                        *x += b;
                    }
                }
                if let Some((table, places)) = kind.rotary {
                    // Queries and keys, not values.
                    for head in row[..2 * h].chunks_exact_mut(d) {
                        table.apply(head, places[i]);
                    }
                }
            });
        }
        let window = kind.window;
        resize(context, total * h);
        let (d, sequences) = (self.head_dim, offsets.len() - 1);
        let qkv: &[f32] = qkv;
        let rows = |s: usize| (&qkv[offsets[s] * 3 * h..offsets[s + 1] * 3 * h], offsets[s + 1] - offsets[s]);
        if sequences >= rayon::current_num_threads() {
            let mut parts = Vec::with_capacity(sequences);
            let mut rest = &mut context[..];
            for s in 0..sequences {
                let (part, tail) = rest.split_at_mut((offsets[s + 1] - offsets[s]) * h);
                parts.push((s, part));
                rest = tail;
            }
            parts.into_par_iter().for_each(|(s, part)| {
                let (rows, n) = rows(s);
                let mut scores = Vec::new();
                for head in 0..self.heads {
                    self.attention_head(rows, head, window, &mut scores, MatMut::new(&mut part[head * d..], n, d, h));
                }
            });
        } else {
            for s in 0..sequences {
                let (rows, n) = rows(s);
                let heads: Vec<Vec<f32>> = (0..self.heads)
                    .into_par_iter()
                    .map(|head| {
                        let mut out = vec![0f32; n * d];
                        self.attention_head(rows, head, window, &mut Vec::new(), MatMut::new(&mut out, n, d, d));
                        out
                    })
                    .collect();
                for (i, row) in context[offsets[s] * h..offsets[s + 1] * h].chunks_exact_mut(h).enumerate() {
                    for (head, out) in heads.iter().enumerate() {
                        row[head * d..(head + 1) * d].copy_from_slice(&out[i * d..(i + 1) * d]);
                    }
                }
            }
        }
    }

    /// One head of one sequence (`qkv`: its `n` rows, bias added) into `out` (`(n, head_dim)`):
    /// `softmax(Q·Kᵀ/√d [+ MPNet's relative bias]) · V`, each row's softmax divided out of its
    /// `head_dim` results rather than its `n` probabilities; with a `window`, query `i`'s softmax
    /// runs over keys `|i − j| ≤ window` only, and the keys outside it are not computed at all
    /// (blocks of queries against the keys their windows reach: memory and work linear in `n`);
    /// a long text's global attention also runs in blocks of queries, so that its scores take
    /// memory linear in `n`. `scores` is the caller's buffer.
    fn attention_head(&self, qkv: &[f32], head: usize, window: Option<usize>, scores: &mut Vec<f32>, mut out: MatMut<'_>) {
        let (h, d) = (self.hidden, self.head_dim);
        let n = qkv.len() / (3 * h);
        // Rows `start..start + rows` of Q (0), K (h) or V (2h).
        let part = |offset: usize, start: usize, rows: usize| MatRef::new(&qkv[start * 3 * h + offset + head * d..], rows, d, 3 * h, 1);
        let scale = 1.0 / (d as f32).sqrt();
        // A local window: blocks of queries against the keys their windows reach. Global: every
        // key, in blocks of queries for long texts (scores linear in n), in one block up to
        // LONG_TEXT (every BERT-family text: their vectors as they always were).
        let (block, reach) = match window {
            Some(w) if w + 1 < n => (QUERY_BLOCK, w),
            _ if n > LONG_TEXT => (GLOBAL_QUERY_BLOCK, n),
            _ => (n.max(1), n),
        };
        let mut totals = vec![0f32; block.min(n)];
        for q0 in (0..n).step_by(block) {
            let q1 = (q0 + block).min(n);
            let (k0, k1) = (q0.saturating_sub(reach), (q1 + reach).min(n));
            let (m, keys) = (q1 - q0, k1 - k0);
            resize(scores, m * keys);
            strided::matmul(part(0, q0, m), part(h, k0, keys).t(), MatMut::new(scores, m, keys, keys), scale);
            kernels::vectorized(#[inline(always)] || {
                for (r, (row, total)) in scores.chunks_exact_mut(keys).zip(&mut totals).enumerate() {
                    let i = q0 + r;
                    // MPNet: the bias of each key's distance first, the bias row a slice.
                    if let Some(bias) = &self.relative {
                        for (o, &b) in row.iter_mut().zip(&bias.row(head, i, n)[k0..k1]) {
                            *o += b;
                        }
                    }
                    let (lo, hi) = (i.saturating_sub(reach).max(k0) - k0, (i + reach + 1).min(k1) - k0);
                    row[..lo].fill(0.0);
                    row[hi..].fill(0.0);
                    *total = kernels::softmax_unnormalised(&mut row[lo..hi]);
                }
            });
            let mut rows = out.rows(q0, q1);
            strided::matmul(MatRef::new(scores, m, keys, keys, 1), part(2 * h, k0, keys), rows.reborrow(), 1.0);
            rows.scale_rows(&totals[..m]);
        }
    }
}

/// Queries per block in a local layer: each block's scores are `QUERY_BLOCK × (QUERY_BLOCK + 2·window)`.
const QUERY_BLOCK: usize = 64;
/// Texts longer than this attend globally in blocks of [`GLOBAL_QUERY_BLOCK`] queries, each
/// block's scores `GLOBAL_QUERY_BLOCK × n` (4 MiB at 8,192 tokens, where all of them at once
/// were 256 MiB per head in flight).
const LONG_TEXT: usize = 512;
const GLOBAL_QUERY_BLOCK: usize = 128;
