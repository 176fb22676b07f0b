//! The fused BERT encoder: the same computation as `candle_transformers`' `BertModel` with an
//! attention mask, arranged for throughput on CPU.
//!
//! * **No padding at all.** The tokens of every sequence of a batch are packed into one
//!   `(total_tokens, hidden)` matrix ("varlen", as text-embeddings-inference does with flash
//!   attention). Dense layers see only real tokens; attention runs per sequence over its own
//!   tokens, so nothing is computed for, or masked out of, padding.
//! * **Dense layers through candle's gemm** (AVX-512 kernels with gemm's `x86-v4`), with weights
//!   transposed once at load time to contiguous `(in, out)` matrices and Q/K/V fused into one
//!   `(hidden, 3·hidden)` product.
//! * **Fused element-wise work** in vectorisable safe Rust ([`super::kernels`]): bias + GELU(erf),
//!   bias + residual + LayerNorm, softmax — one pass each instead of one tensor op per step.
//! * Parallel over the engine's rayon pool: gemm splits its work there, attention runs one task
//!   per sequence (its two products, all heads at once, through gemm too), element-wise kernels
//!   one task per block of rows.

use std::collections::HashMap;

use candle_core::{Device, Storage, Tensor};
use candle_transformers::models::bert::{Config, HiddenAct, PositionEmbeddingType};
use rayon::prelude::*;

use super::InferenceError;
use super::kernels;

/// Rows per element-wise task.
const ROWS_PER_TASK: usize = 16;

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

struct Layer {
    /// `(hidden, 3·hidden)`: [Q | K | V] columns.
    qkv_w: Tensor,
    qkv_b: Vec<f32>,
    out_w: Tensor,
    out_b: Vec<f32>,
    attn_ln: LayerNorm,
    ff1_w: Tensor,
    ff1_b: Vec<f32>,
    ff2_w: Tensor,
    ff2_b: Vec<f32>,
    ff_ln: LayerNorm,
}

pub(crate) struct Encoder {
    word: Vec<f32>,
    position: Vec<f32>,
    /// Token type 0 (every text is a single segment).
    token_type: Vec<f32>,
    embedding_ln: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    head_dim: usize,
    vocab: usize,
    max_positions: usize,
    eps: f32,
}

fn weights_err(e: impl std::fmt::Display) -> InferenceError {
    InferenceError::Weights(e.to_string())
}

impl Encoder {
    /// Whether this encoder implements the model the config describes; otherwise the caller uses
    /// the candle `BertModel` backend.
    pub(crate) fn supports(config: &Config) -> Result<(), String> {
        if config.hidden_act != HiddenAct::Gelu {
            return Err(format!("hidden_act {:?} (the fused encoder implements erf GELU)", config.hidden_act));
        }
        if config.position_embedding_type != PositionEmbeddingType::Absolute {
            return Err("non-absolute position embeddings".into());
        }
        if config.num_attention_heads == 0 || !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err("hidden size not divisible by the head count".into());
        }
        Ok(())
    }

    pub(crate) fn load(mut tensors: HashMap<String, Tensor>, config: &Config) -> Result<Self, InferenceError> {
        Self::supports(config).map_err(InferenceError::Config)?;
        // Checkpoints saved from BertModel have no prefix; from BertFor* they have `bert.`.
        if tensors.keys().any(|k| k.starts_with("bert.")) {
            tensors =
                tensors.into_iter().filter_map(|(k, v)| k.strip_prefix("bert.").map(|s| (s.to_owned(), v))).collect();
        }
        let hidden = config.hidden_size;
        let inter = config.intermediate_size;
        let get = |name: &str, shape: &[usize]| -> Result<Tensor, InferenceError> {
            let t = tensors.get(name).ok_or_else(|| weights_err(format!("missing tensor {name}")))?;
            if t.dims() != shape {
                return Err(weights_err(format!("{name}: shape {:?}, expected {shape:?}", t.dims())));
            }
            t.to_dtype(candle_core::DType::F32).map_err(weights_err)
        };
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, InferenceError> {
            get(name, &[len])?.to_vec1::<f32>().map_err(weights_err)
        };
        let flat = |name: &str, shape: &[usize]| -> Result<Vec<f32>, InferenceError> {
            get(name, shape)?.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(weights_err)
        };
        // Linear weights are stored (out, in); keep them as contiguous (in, out).
        let transposed = |name: &str, out: usize, inp: usize| -> Result<Tensor, InferenceError> {
            get(name, &[out, inp])?.t().and_then(|t| t.contiguous()).map_err(weights_err)
        };
        let layer_norm = |prefix: &str, len: usize| -> Result<LayerNorm, InferenceError> {
            Ok(LayerNorm {
                gamma: vector(&format!("{prefix}.weight"), len)?,
                beta: vector(&format!("{prefix}.bias"), len)?,
            })
        };

        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            let q = transposed(&format!("{p}.attention.self.query.weight"), hidden, hidden)?;
            let k = transposed(&format!("{p}.attention.self.key.weight"), hidden, hidden)?;
            let v = transposed(&format!("{p}.attention.self.value.weight"), hidden, hidden)?;
            let qkv_w = Tensor::cat(&[&q, &k, &v], 1).and_then(|t| t.contiguous()).map_err(weights_err)?;
            let mut qkv_b = vector(&format!("{p}.attention.self.query.bias"), hidden)?;
            qkv_b.extend(vector(&format!("{p}.attention.self.key.bias"), hidden)?);
            qkv_b.extend(vector(&format!("{p}.attention.self.value.bias"), hidden)?);
            layers.push(Layer {
                qkv_w,
                qkv_b,
                out_w: transposed(&format!("{p}.attention.output.dense.weight"), hidden, hidden)?,
                out_b: vector(&format!("{p}.attention.output.dense.bias"), hidden)?,
                attn_ln: layer_norm(&format!("{p}.attention.output.LayerNorm"), hidden)?,
                ff1_w: transposed(&format!("{p}.intermediate.dense.weight"), inter, hidden)?,
                ff1_b: vector(&format!("{p}.intermediate.dense.bias"), inter)?,
                ff2_w: transposed(&format!("{p}.output.dense.weight"), hidden, inter)?,
                ff2_b: vector(&format!("{p}.output.dense.bias"), hidden)?,
                ff_ln: layer_norm(&format!("{p}.output.LayerNorm"), hidden)?,
            });
        }
        let token_types = flat("embeddings.token_type_embeddings.weight", &[config.type_vocab_size, hidden])?;
        Ok(Self {
            word: flat("embeddings.word_embeddings.weight", &[config.vocab_size, hidden])?,
            position: flat("embeddings.position_embeddings.weight", &[config.max_position_embeddings, hidden])?,
            token_type: token_types[..hidden].to_vec(),
            embedding_ln: layer_norm("embeddings.LayerNorm", hidden)?,
            layers,
            hidden,
            heads: config.num_attention_heads,
            head_dim: hidden / config.num_attention_heads,
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// Final hidden states of the given sequences, packed: `(Σ lengths, hidden)`, sequence after
    /// sequence. Runs on the current rayon pool.
    pub(crate) fn forward(&self, sequences: &[&[u32]]) -> Result<Vec<f32>, InferenceError> {
        let h = self.hidden;
        let mut offsets = Vec::with_capacity(sequences.len() + 1);
        offsets.push(0usize);
        for s in sequences {
            if s.len() > self.max_positions {
                return Err(InferenceError::Forward(format!("{} tokens exceed {}", s.len(), self.max_positions)));
            }
            if let Some(&id) = s.iter().find(|&&id| id as usize >= self.vocab) {
                return Err(InferenceError::Forward(format!("token id {id} outside the vocabulary")));
            }
            offsets.push(offsets.last().unwrap() + s.len());
        }
        let total = *offsets.last().unwrap();
        if total == 0 {
            return Ok(Vec::new());
        }

        // Embeddings: word + position + token type 0, then LayerNorm.
        let mut positions = Vec::with_capacity(total);
        for s in sequences {
            positions.extend(s.iter().enumerate().map(|(p, &id)| (id as usize, p)));
        }
        let mut x = vec![0f32; total * h];
        x.par_chunks_mut(h * ROWS_PER_TASK).zip(positions.par_chunks(ROWS_PER_TASK)).for_each(|(rows, pos)| {
            let mut sum = vec![0f32; h];
            for (row, &(id, p)) in rows.chunks_exact_mut(h).zip(pos) {
                let word = &self.word[id * h..(id + 1) * h];
                let position = &self.position[p * h..(p + 1) * h];
                for (((s, &w), &q), &t) in sum.iter_mut().zip(word).zip(position).zip(&self.token_type) {
                    *s = w + q + t;
                }
                kernels::add_layer_norm(
                    row,
                    &sum,
                    None,
                    None,
                    &self.embedding_ln.gamma,
                    &self.embedding_ln.beta,
                    self.eps,
                );
            }
        });
        let mut hidden = tensor(x, total, h)?;

        for layer in &self.layers {
            hidden = self.layer(layer, hidden, &offsets)?;
        }
        let out = with_slice(&hidden, |s| s.to_vec())?;
        Ok(out)
    }

    fn layer(&self, layer: &Layer, x: Tensor, offsets: &[usize]) -> Result<Tensor, InferenceError> {
        let h = self.hidden;
        let total = offsets[offsets.len() - 1];

        // Self-attention.
        let qkv = x.matmul(&layer.qkv_w).map_err(forward_err)?;
        let context = with_slice(&qkv, |qkv| self.attention(qkv, &layer.qkv_b, offsets))??;
        drop(qkv);
        let context = tensor(context, total, h)?;
        let projected = context.matmul(&layer.out_w).map_err(forward_err)?;
        drop(context);
        let mut h1 = vec![0f32; total * h];
        with_slice(&projected, |proj| {
            with_slice(&x, |x| {
                fused_rows(&mut h1, h, |i, out| {
                    let row = i * h..(i + 1) * h;
                    kernels::add_layer_norm(
                        out,
                        &proj[row.clone()],
                        Some(&layer.out_b),
                        Some(&x[row]),
                        &layer.attn_ln.gamma,
                        &layer.attn_ln.beta,
                        self.eps,
                    )
                })
            })
        })??;
        drop((projected, x));
        let h1 = tensor(h1, total, h)?;

        // Feed-forward.
        let ff = h1.matmul(&layer.ff1_w).map_err(forward_err)?;
        let inter = layer.ff1_b.len();
        let mut activated = vec![0f32; total * inter];
        with_slice(&ff, |ff| {
            fused_rows(&mut activated, inter, |i, o| {
                kernels::bias_gelu(o, &ff[i * inter..(i + 1) * inter], &layer.ff1_b)
            })
        })?;
        drop(ff);
        let activated = tensor(activated, total, inter)?;
        let ff2 = activated.matmul(&layer.ff2_w).map_err(forward_err)?;
        drop(activated);
        let mut out = vec![0f32; total * h];
        with_slice(&ff2, |ff2| {
            with_slice(&h1, |h1| {
                fused_rows(&mut out, h, |i, o| {
                    let row = i * h..(i + 1) * h;
                    kernels::add_layer_norm(
                        o,
                        &ff2[row.clone()],
                        Some(&layer.ff2_b),
                        Some(&h1[row]),
                        &layer.ff_ln.gamma,
                        &layer.ff_ln.beta,
                        self.eps,
                    )
                })
            })
        })??;
        tensor(out, total, h)
    }

    /// Multi-head attention per sequence over its own tokens. `qkv`: `(total, 3·hidden)` without
    /// bias. Returns the context `(total, hidden)`. One task per sequence; the two products of each
    /// sequence (all heads at once) go through candle's gemm.
    fn attention(&self, qkv: &[f32], qkv_b: &[f32], offsets: &[usize]) -> Result<Vec<f32>, InferenceError> {
        let (h, d, heads) = (self.hidden, self.head_dim, self.heads);
        let sequences = offsets.len() - 1;
        let parts: Vec<Result<Vec<f32>, InferenceError>> = (0..sequences)
            .into_par_iter()
            .map(|s| self.attention_one(&qkv[offsets[s] * 3 * h..offsets[s + 1] * 3 * h], qkv_b))
            .collect();
        let mut context = vec![0f32; offsets[sequences] * h];
        for (s, part) in parts.into_iter().enumerate() {
            let part = part?;
            let (start, n) = (offsets[s], offsets[s + 1] - offsets[s]);
            for head in 0..heads {
                for i in 0..n {
                    let at = (start + i) * h + head * d;
                    context[at..at + d].copy_from_slice(&part[(head * n + i) * d..(head * n + i + 1) * d]);
                }
            }
        }
        Ok(context)
    }

    /// Attention of one sequence (`qkv`: its `n` rows). Returns `(heads, n, head_dim)`.
    fn attention_one(&self, qkv: &[f32], qkv_b: &[f32]) -> Result<Vec<f32>, InferenceError> {
        let (h, d, heads) = (self.hidden, self.head_dim, self.heads);
        let n = qkv.len() / (3 * h);
        let scale = 1.0 / (d as f32).sqrt();
        // Q (scaled), K, V as (heads, n, d), biases added: contiguous runs of d values.
        let mut q = vec![0f32; heads * n * d];
        let mut k = vec![0f32; heads * n * d];
        let mut v = vec![0f32; heads * n * d];
        for (j, row) in qkv.chunks_exact(3 * h).enumerate() {
            for head in 0..heads {
                let at = (head * n + j) * d;
                let (q0, k0, v0) = (head * d, h + head * d, 2 * h + head * d);
                for ((dst, &x), &b) in q[at..at + d].iter_mut().zip(&row[q0..q0 + d]).zip(&qkv_b[q0..q0 + d]) {
                    *dst = (x + b) * scale;
                }
                for ((dst, &x), &b) in k[at..at + d].iter_mut().zip(&row[k0..k0 + d]).zip(&qkv_b[k0..k0 + d]) {
                    *dst = x + b;
                }
                for ((dst, &x), &b) in v[at..at + d].iter_mut().zip(&row[v0..v0 + d]).zip(&qkv_b[v0..v0 + d]) {
                    *dst = x + b;
                }
            }
        }
        let cpu = &Device::Cpu;
        let q = Tensor::from_vec(q, (heads, n, d), cpu).map_err(forward_err)?;
        let k = Tensor::from_vec(k, (heads, n, d), cpu).map_err(forward_err)?;
        // Kᵀ as a strided view: gemm transposes while packing.
        let scores = q.matmul(&k.t().map_err(forward_err)?).map_err(forward_err)?;
        drop((q, k));
        let mut probs = vec![0f32; heads * n * n];
        with_slice(&scores, |scores| {
            for (dst, src) in probs.chunks_exact_mut(n).zip(scores.chunks_exact(n)) {
                kernels::softmax_into(dst, src);
            }
        })?;
        drop(scores);
        let probs = Tensor::from_vec(probs, (heads, n, n), cpu).map_err(forward_err)?;
        let v = Tensor::from_vec(v, (heads, n, d), cpu).map_err(forward_err)?;
        let context = probs.matmul(&v).map_err(forward_err)?;
        with_slice(&context, |c| c.to_vec())
    }
}

fn forward_err(e: candle_core::Error) -> InferenceError {
    InferenceError::Forward(e.to_string())
}

fn tensor(values: Vec<f32>, rows: usize, cols: usize) -> Result<Tensor, InferenceError> {
    Tensor::from_vec(values, (rows, cols), &Device::Cpu).map_err(forward_err)
}

/// Runs `f` on a contiguous f32 CPU tensor's values without copying them.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R, InferenceError> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(InferenceError::Forward("tensor is not on the CPU".into()));
    };
    let values = cpu.as_slice::<f32>().map_err(forward_err)?;
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(InferenceError::Forward("tensor is not contiguous".into()));
    };
    Ok(f(&values[start..end]))
}

/// Fills `out` row by row (`row_len` values each) in parallel blocks: `f(row_index, row)`.
fn fused_rows(out: &mut [f32], row_len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    out.par_chunks_mut(row_len * ROWS_PER_TASK).enumerate().for_each(|(block, rows)| {
        for (i, row) in rows.chunks_exact_mut(row_len).enumerate() {
            f(block * ROWS_PER_TASK + i, row);
        }
    });
}
