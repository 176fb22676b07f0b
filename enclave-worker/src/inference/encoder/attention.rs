//! Multi-head self-attention of the fused encoder: per sequence over its own tokens, each head's
//! two products on views of the QKV rows ([`strided`]), written in place; per-head query and key
//! norms, rotary positions, a causal mask and a local window where the layer has them
//! ([`Attention`]). Grouped-query attention: query head `i` reads key/value head
//! `i / (heads / kv_heads)`, as transformers' `repeat_kv` pairs them.

use rayon::prelude::*;

mod tiled;

use super::{Attention, Encoder, fused_rows, resize};
use crate::inference::{dense, kernels};
use crate::inference::strided::{self, MatMut, MatRef};

/// The arithmetic of the tile kernels' attention (long texts, local windows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Products {
    F32,
    /// bf16 inputs, f32 sums: reduced-precision jobs where bf16 is faster than f32
    /// ([`dense::bf16_pays`]), whose dense products already round to bf16 or int8. At 8,192
    /// tokens in bf16 jobs: ModernBERT-base 727 tokens/s against 520 with f32 attention,
    /// Qwen3-Embedding-0.6B 196 against 138. Short texts keep gemm's f32 products: bf16 tiles
    /// measured slower there (all-MiniLM-L6-v2's 32-wide heads half-fill a panel, and packing a
    /// head costs as much as its products).
    Bf16,
}

impl Encoder {
    /// Multi-head attention per sequence over its own tokens, into `context` (`(total, heads·d)`).
    /// `qkv`: `(total, (heads + 2·kv_heads)·d)` without bias; the bias (if any) is added in place
    /// first, then each query and key head is normalised and turned by its rotary angles (if the
    /// layer has them). Each head's products read Q, K and V where they lie and write its context
    /// columns in place ([`strided`]). One task per sequence when there are enough of them for the
    /// pool, else (one long text: latency) one task per head of each sequence.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        qkv: &mut [f32],
        qkv_b: Option<&[f32]>,
        kind: &Attention<'_>,
        products: Products,
        offsets: &[usize],
        context: &mut Vec<f32>,
    ) {
        let (d, q_width, stride) = (self.head_dim, self.heads * self.head_dim, self.qkv_width());
        let total = offsets[offsets.len() - 1];
        if qkv_b.is_some() || kind.rotary.is_some() || kind.qk_norm.is_some() {
            let (eps, keys_end) = (self.eps, q_width + self.kv_heads * d);
            fused_rows(qkv, stride, #[inline(always)] |i, row| {
                if let Some(qkv_b) = qkv_b {
                    for (x, &b) in row.iter_mut().zip(qkv_b) {
                        *x += b;
                    }
                }
                // Queries and keys, not values: the norm of each head, then its rotary angles.
                for (j, head) in row[..keys_end].chunks_exact_mut(d).enumerate() {
                    if let Some((q_norm, k_norm)) = kind.qk_norm {
                        (if j * d < q_width { q_norm } else { k_norm }).apply_in_place(head, eps);
                    }
                    if let Some((table, places)) = kind.rotary {
                        table.apply(head, places[i]);
                    }
                }
            });
        }
        let (window, causal) = (kind.window, kind.causal);
        resize(context, total * q_width);
        let sequences = offsets.len() - 1;
        let qkv: &[f32] = qkv;
        let rows = |s: usize| (&qkv[offsets[s] * stride..offsets[s + 1] * stride], offsets[s + 1] - offsets[s]);
        if sequences >= rayon::current_num_threads() {
            let mut parts = Vec::with_capacity(sequences);
            let mut rest = &mut context[..];
            for s in 0..sequences {
                let (part, tail) = rest.split_at_mut((offsets[s + 1] - offsets[s]) * q_width);
                parts.push((s, part));
                rest = tail;
            }
            parts.into_par_iter().for_each(|(s, part)| {
                let (rows, n) = rows(s);
                let mut scores = Vec::new();
                for head in 0..self.heads {
                    self.attention_head(rows, head, window, causal, products, &mut scores, MatMut::new(&mut part[head * d..], n, d, q_width));
                }
            });
        } else {
            for s in 0..sequences {
                let (rows, n) = rows(s);
                let heads: Vec<Vec<f32>> = (0..self.heads)
                    .into_par_iter()
                    .map(|head| {
                        let mut out = vec![0f32; n * d];
                        self.attention_head(rows, head, window, causal, products, &mut Vec::new(), MatMut::new(&mut out, n, d, d));
                        out
                    })
                    .collect();
                for (i, row) in context[offsets[s] * q_width..offsets[s + 1] * q_width].chunks_exact_mut(q_width).enumerate() {
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
    /// memory linear in `n`. `causal`: query `i` sees keys `j ≤ i` only, and the keys after a
    /// block's last query are not computed. `scores` is the caller's buffer. Long texts and local
    /// windows go through the tile kernels on a CPU with AVX-512 or AVX2 ([`tiled`]), in `products`'
    /// arithmetic, keys in blocks as well; gemm's f32 products below are the path of short texts
    /// (their vectors as they always were), of MPNet's relative bias and of CPUs without AVX2.
    #[allow(clippy::too_many_arguments)]
    fn attention_head(
        &self,
        qkv: &[f32],
        head: usize,
        window: Option<usize>,
        causal: bool,
        products: Products,
        scores: &mut Vec<f32>,
        mut out: MatMut<'_>,
    ) {
        let (d, stride) = (self.head_dim, self.qkv_width());
        let n = qkv.len() / stride;
        let (q_width, kv_width) = (self.heads * d, self.kv_heads * d);
        let group = head / (self.heads / self.kv_heads);
        // Rows `start..start + rows` of this head's Q, or of its group's K or V.
        let q = |start: usize, rows: usize| MatRef::new(&qkv[start * stride + head * d..], rows, d, stride, 1);
        let kv = |offset: usize, start: usize, rows: usize| MatRef::new(&qkv[start * stride + offset + group * d..], rows, d, stride, 1);
        let scale = self.query_scale;
        let long_or_local = n > LONG_TEXT || matches!(window, Some(w) if w + 1 < n);
        if long_or_local && self.relative.is_none() && dense::f32_supported() {
            let rows = tiled::HeadRows { qkv, stride, d, columns: [head * d, q_width + group * d, q_width + kv_width + group * d] };
            let reach = tiled::Reach { reach: window.unwrap_or(n), causal };
            return match products {
                Products::Bf16 => tiled::head::<tiled::Bf16>(&rows, scale, reach, out),
                Products::F32 => tiled::head::<tiled::F32>(&rows, scale, reach, out),
            };
        }
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
            let k0 = q0.saturating_sub(reach);
            let k1 = if causal { q1 } else { (q1 + reach).min(n) };
            let (m, keys) = (q1 - q0, k1 - k0);
            resize(scores, m * keys);
            strided::matmul(q(q0, m), kv(q_width, k0, keys).t(), MatMut::new(scores, m, keys, keys), scale);
            kernels::vectorized(#[inline(always)] || {
                for (r, (row, total)) in scores.chunks_exact_mut(keys).zip(&mut totals).enumerate() {
                    let i = q0 + r;
                    // MPNet: the bias of each key's distance first, the bias row a slice.
                    if let Some(bias) = &self.relative {
                        for (o, &b) in row.iter_mut().zip(&bias.row(head, i, n)[k0..k1]) {
                            *o += b;
                        }
                    }
                    let last = if causal { i + 1 } else { i + reach + 1 };
                    let (lo, hi) = (i.saturating_sub(reach).max(k0) - k0, last.min(k1) - k0);
                    row[..lo].fill(0.0);
                    row[hi..].fill(0.0);
                    *total = kernels::softmax_unnormalised(&mut row[lo..hi]);
                }
            });
            let mut rows = out.rows(q0, q1);
            strided::matmul(MatRef::new(scores, m, keys, keys, 1), kv(q_width + kv_width, k0, keys), rows.reborrow(), 1.0);
            rows.scale_rows(&totals[..m]);
        }
    }

    /// One token's Q | K | V width.
    fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// Queries per block in a local layer: each block's scores are `QUERY_BLOCK × (QUERY_BLOCK + 2·window)`.
const QUERY_BLOCK: usize = 64;
/// Texts longer than this attend globally in blocks of [`GLOBAL_QUERY_BLOCK`] queries, each
/// block's scores `GLOBAL_QUERY_BLOCK × n` (4 MiB at 8,192 tokens, where all of them at once
/// were 256 MiB per head in flight).
const LONG_TEXT: usize = 512;
const GLOBAL_QUERY_BLOCK: usize = 128;
