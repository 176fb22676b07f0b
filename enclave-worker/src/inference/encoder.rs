//! The fused encoder: the same computation as transformers' BERT, XLM-RoBERTa and MPNet encoders
//! with an attention mask (what differs between them: [`super::arch`]), arranged for throughput
//! on CPU.
//!
//! * **No padding at all.** The tokens of every sequence of a batch are packed into one
//!   `(total_tokens, hidden)` matrix ("varlen", as text-embeddings-inference does with flash
//!   attention). Dense layers see only real tokens; attention runs per sequence over its own
//!   tokens, so nothing is computed for, or masked out of, padding.
//! * **Dense layers through our own AVX-512 kernels** ([`super::dense`]: f32, or bf16 inputs with
//!   f32 sums, or int8 with int32 sums, when a job asks for it), with weights transposed and
//!   packed once at load time and Q/K/V fused into one `(hidden, 3·hidden)` product; gemm's kernels
//!   on a CPU without AVX-512. For int8 the activations' outlier channels are first moved into
//!   the weights (SmoothQuant, α = 0.5, power-of-two factors from the largest |activation| of each
//!   input channel over a fixed calibration set run in fp32), the 8 channels still largest after
//!   that are computed exactly in f32, and the rest of the weights are quantised per output
//!   channel; each layer's FFN output product, whose error is the largest, runs in int8 only
//!   where the calibration set's pooled states stay within a bound of fp32 with it, else in bf16
//!   (f32 where bf16 is not faster than f32, [`dense::bf16_pays`]) ([`int8`]).
//! * **Fused element-wise work** in vectorisable safe Rust ([`super::kernels`]): bias + GELU(erf),
//!   bias + residual + LayerNorm, softmax — one pass each instead of one tensor op per step.
//! * Parallel over the engine's rayon pool: the dense kernels split their rows or panels there,
//!   attention runs one task per sequence (each head's two products through gemm on views of the
//!   QKV rows, [`super::strided`]), or per head for a single text, element-wise kernels one task
//!   per block of rows.

use std::sync::{Mutex, OnceLock};

use protocol::envelope::Precision;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, RelativeBias};
use super::dense::{self, Int8Weights, Packed};
use super::kernels;
use super::strided::{self, MatMut, MatRef};

mod attention;
pub(crate) mod blocks;
mod classifier;
mod int8;
mod lexical;
mod multivector;
mod splade;
mod yesno;

use blocks::{Embeddings, Linear, Norm, Rotary, RotaryTable, Stored, Tensors, Weight};
pub(crate) use blocks::TokenTypes;
use int8::{Int8Layer, Int8Product, LayerStats};
pub(crate) use classifier::ClassifierHead;
pub(crate) use lexical::LexicalHead;
pub(crate) use multivector::MultiVectorHead;
pub(crate) use splade::SpladeHead;
pub(crate) use yesno::YesNoHead;

/// Rows per element-wise task.
const ROWS_PER_TASK: usize = 16;

/// One layer of any architecture: the four products and two norms, placed as the architecture
/// says ([`Placement`]).
pub(crate) struct Layer {
    /// `(hidden, (heads + 2·kv_heads)·head_dim)`: [Q | K | V] columns (`3·hidden` without
    /// grouped-query attention).
    pub(crate) qkv: Linear,
    pub(crate) out: Linear,
    /// `intermediate` wide, or `2·intermediate` for a gated activation.
    pub(crate) ff1: Linear,
    pub(crate) ff2: Linear,
    /// Post: after the attention's residual. Pre: before attention; `None` is the identity
    /// (ModernBERT's first layer).
    pub(crate) attn_norm: Option<Norm>,
    /// Post: after the feed-forward's residual. Pre: before the feed-forward.
    pub(crate) ff_norm: Norm,
    /// Per-head norms of the queries and keys before rotary (Qwen3's `q_norm`, `k_norm`).
    pub(crate) qk_norm: Option<(Norm, Norm)>,
    /// Pre-norm layers only: norms of the attention's and the feed-forward's outputs before each
    /// is added to the residual (Gemma's `post_attention_layernorm`, `post_feedforward_layernorm`).
    pub(crate) sandwich: Option<(Norm, Norm)>,
    pub(crate) attention: LayerAttention,
}

impl Layer {
    fn memory_bytes(&self) -> usize {
        [&self.qkv, &self.out, &self.ff1, &self.ff2].into_iter().map(Linear::memory_bytes).sum::<usize>()
            + self.attn_norm.as_ref().map_or(0, Norm::memory_bytes)
            + self.ff_norm.memory_bytes()
            + self.qk_norm.as_ref().map_or(0, |(q, k)| q.memory_bytes() + k.memory_bytes())
            + self.sandwich.as_ref().map_or(0, |(a, f)| a.memory_bytes() + f.memory_bytes())
    }
}

/// An architecture's weights, from its tensor-name map (BERT's family here, ModernBERT's and
/// Qwen3's in [`super::modernbert`], [`super::qwen3`]).
pub(crate) struct FamilyWeights {
    pub(crate) embeddings: Embeddings,
    pub(crate) layers: Vec<Layer>,
    /// After the last layer (pre-norm architectures).
    pub(crate) final_norm: Option<Norm>,
    /// MPNet's relative position bias, shared by all layers.
    pub(crate) relative: Option<RelativeBias>,
}

/// A layer's dense weights in bf16 panels (`precision: bf16`).
struct Bf16Layer {
    qkv: Packed<u32>,
    out: Packed<u32>,
    ff1: Packed<u32>,
    ff2: Packed<u32>,
}

/// The weights one layer's products use at the job's precision.
#[derive(Clone, Copy)]
enum Reduced<'a> {
    Fp32,
    Bf16(&'a Bf16Layer),
    Int8(&'a Int8Layer),
}

/// One product's weights: the f32 ones, or their bf16 or int8 copy.
#[derive(Clone, Copy)]
enum Product<'a> {
    Fp32,
    Bf16(&'a Packed<u32>),
    Int8(&'a Int8Weights),
    /// bf16's rounding where bf16 is not faster than f32: the inputs rounded to bf16 on the way in,
    /// times these weights (rounded to bf16 already), in f32 (int8's calibration only).
    Bf16Rounded(&'a Weight),
}

impl<'a> Reduced<'a> {
    /// The tiled attention's arithmetic: bf16 in reduced-precision jobs where it is faster than
    /// f32 ([`dense::bf16_pays`]).
    fn attention(self) -> attention::Products {
        match self {
            Reduced::Bf16(_) | Reduced::Int8(_) if dense::bf16_pays() => attention::Products::Bf16,
            _ => attention::Products::F32,
        }
    }

    fn pick(
        self,
        bf16: impl Fn(&'a Bf16Layer) -> &'a Packed<u32>,
        int8: impl Fn(&'a Int8Layer) -> &'a Int8Product,
    ) -> Product<'a> {
        match self {
            Reduced::Fp32 => Product::Fp32,
            Reduced::Bf16(layer) => Product::Bf16(bf16(layer)),
            Reduced::Int8(layer) => match int8(layer) {
                Int8Product::Int8(w) => Product::Int8(w),
                Int8Product::Bf16(w) => Product::Bf16(w),
                Int8Product::Fp32 => Product::Fp32,
                Int8Product::Bf16Rounded(w) => Product::Bf16Rounded(w),
            },
        }
    }
}
pub(crate) struct Encoder {
    embeddings: Embeddings,
    /// Positions start after this index, which a padding token keeps (XLM-RoBERTa, MPNet).
    padding_idx: Option<u32>,
    /// MPNet's relative position bias, shared by all layers.
    relative: Option<RelativeBias>,
    arch: Architecture,
    placement: Placement,
    activation: Activation,
    layers: Vec<Layer>,
    final_norm: Option<Norm>,
    /// One per distinct rotary base of the layers, with that base.
    rotary: Vec<(f32, Rotary)>,
    hidden: usize,
    heads: usize,
    /// Key/value heads; query head `i` reads group `i / (heads / kv_heads)`.
    kv_heads: usize,
    head_dim: usize,
    /// Scores' factor before the softmax: `1/√head_dim` unless the architecture states another.
    query_scale: f32,
    vocab: usize,
    max_positions: usize,
    eps: f32,
    /// Packed on the first bf16 job, so that fp32-only workers neither pay for it at boot nor
    /// hold it in memory.
    bf16: OnceLock<Result<Vec<Bf16Layer>, InferenceError>>,
    /// Quantised on the first int8 job, likewise.
    int8: OnceLock<Result<Vec<Int8Layer>, InferenceError>>,
    /// Token sequences whose fp32 activations set the int8 smoothing factors ([`Encoder::calibrate_with`]).
    calibration: Vec<Vec<u32>>,
    /// The intermediate matrices of finished forward passes, for the next ones: allocating them
    /// per pass made the allocator hand tens of MB back to the kernel and fault them in again on
    /// every batch (page faults and TLB shootdowns across the pool's threads). At most one per
    /// pass running at once, each as large as the largest batch so far.
    scratch: Mutex<Vec<Scratch>>,
}

/// BERT's, XLM-RoBERTa's and MPNet's tensor names (MPNet names its attention tensors
/// differently; the computation is BERT's).
fn bert_family(t: &Tensors<'_>, config: &ArchConfig) -> Result<FamilyWeights, InferenceError> {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let (qkv_names, attn_out, attn_ln) = match config.arch {
        Architecture::MpNet => (["attn.q", "attn.k", "attn.v"], "attn.o", "LayerNorm"),
        _ => (["self.query", "self.key", "self.value"], "output.dense", "output.LayerNorm"),
    };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for (i, &attention) in config.attention.iter().enumerate() {
        let p = format!("encoder.layer.{i}");
        let qkv: Vec<String> = qkv_names.iter().map(|n| format!("{p}.attention.{n}")).collect();
        let qkv: Vec<&str> = qkv.iter().map(String::as_str).collect();
        layers.push(Layer {
            qkv: t.fused(&qkv, hidden, hidden, true)?,
            out: t.linear(&format!("{p}.attention.{attn_out}"), hidden, hidden, true)?,
            attn_norm: Some(t.norm(&format!("{p}.attention.{attn_ln}"), hidden, true)?),
            ff1: t.linear(&format!("{p}.intermediate.dense"), inter, hidden, true)?,
            ff2: t.linear(&format!("{p}.output.dense"), hidden, inter, true)?,
            ff_norm: t.norm(&format!("{p}.output.LayerNorm"), hidden, true)?,
            qk_norm: None,
            sandwich: None,
            attention,
        });
    }
    let token_type = match config.type_vocab_size {
        0 => vec![0f32; hidden],
        types => t.first_row("embeddings.token_type_embeddings.weight", types, hidden)?,
    };
    let second_type = match config.type_vocab_size {
        0 | 1 => None,
        types => Some(t.row("embeddings.token_type_embeddings.weight", types, hidden, 1)?),
    };
    let heads = config.num_attention_heads;
    let relative = match config.arch {
        Architecture::MpNet => {
            let table = t.values("encoder.relative_attention_bias.weight", &[arch::MPNET_BUCKETS, heads])?;
            Some(RelativeBias::new(&table, heads, config.max_tokens()))
        }
        _ => None,
    };
    Ok(FamilyWeights {
        embeddings: Embeddings {
            word: t.values("embeddings.word_embeddings.weight", &[config.vocab_size, hidden])?,
            position: Some(t.values("embeddings.position_embeddings.weight", &[config.max_position_embeddings, hidden])?),
            token_type,
            second_type,
            norm: Some(t.norm("embeddings.LayerNorm", hidden, true)?),
        },
        layers,
        final_norm: None,
        relative,
    })
}

impl Encoder {
    /// Whether this encoder implements the model the config describes; otherwise the caller uses
    /// the candle `BertModel` backend.
    pub(crate) fn supports(config: &ArchConfig) -> Result<(), String> {
        config.fused_computes()
    }

    /// Builds the encoder straight from the bytes of a `model.safetensors` file: one pass per
    /// tensor from little-endian bytes into its final layout (transposed where needed), with no
    /// intermediate copy of the whole model. F32, BF16 or F16 checkpoints (the caller falls back to the
    /// CandleBert backend for others).
    pub(crate) fn load(weights: &[u8], config: &ArchConfig) -> Result<Self, InferenceError> {
        Self::supports(config).map_err(InferenceError::Config)?;
        // Checkpoints saved from BertModel have no prefix; from BertFor* they have `bert.` (and
        // likewise `roberta.`, `mpnet.`, `model.`).
        let tensors = Tensors::new(weights, config.arch.weight_prefix())?;
        let family = match config.arch {
            Architecture::ModernBert => super::modernbert::weights(&tensors, config)?,
            Architecture::Qwen3 => super::qwen3::weights(&tensors, config)?,
            Architecture::Gemma3 => super::gemma3::weights(&tensors, config)?,
            Architecture::NomicBert => super::nomic_bert::weights(&tensors, config)?,
            Architecture::Gte => super::gte::weights(&tensors, config)?,
            Architecture::Bert | Architecture::XlmRoberta | Architecture::MpNet => bert_family(&tensors, config)?,
        };
        let (heads, head_dim) = (config.num_attention_heads, config.head_dim);
        if heads % config.num_key_value_heads != 0 {
            return Err(InferenceError::Config("num_attention_heads is not a multiple of num_key_value_heads".into()));
        }
        let mut rotary: Vec<(f32, Rotary)> = Vec::new();
        for base in config.attention.iter().filter_map(|a| a.rotary_base) {
            if !rotary.iter().any(|(b, _)| *b == base) {
                rotary.push((base, Rotary::new(base, head_dim)));
            }
        }
        Ok(Self {
            embeddings: family.embeddings,
            padding_idx: config.padding_idx,
            relative: family.relative,
            arch: config.arch,
            placement: config.placement,
            activation: config.activation,
            layers: family.layers,
            final_norm: family.final_norm,
            rotary,
            hidden: config.hidden_size,
            heads,
            kv_heads: config.num_key_value_heads,
            head_dim,
            query_scale: config.query_scale.unwrap_or(1.0 / (head_dim as f32).sqrt()),
            vocab: config.vocab_size,
            max_positions: config.max_tokens(),
            eps: config.layer_norm_eps as f32,
            bf16: OnceLock::new(),
            int8: OnceLock::new(),
            calibration: Vec::new(),
            scratch: Mutex::new(Vec::new()),
        })
    }

    /// Bytes the encoder holds now: the f32 weights (packed, or row-major without AVX-512), the MPNet bias
    /// table, the calibration sequences, and the bf16 and int8 copies once a job has built them;
    /// not the forward passes' kept scratch, which the batch limits bound, like any activations.
    pub(crate) fn memory_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Layer::memory_bytes).sum();
        let bf16: usize = match self.bf16.get() {
            Some(Ok(packed)) => packed.iter().map(|l| [&l.qkv, &l.out, &l.ff1, &l.ff2].into_iter().map(|p| p.memory_bytes()).sum::<usize>()).sum(),
            _ => 0,
        };
        let int8: usize = match self.int8.get() {
            Some(Ok(quantised)) => quantised.iter().map(Int8Layer::memory_bytes).sum(),
            _ => 0,
        };
        // The table RelativeBias::new builds: (heads, 2·span − 1) with span = max_positions.
        let relative = self.relative.as_ref().map_or(0, |_| self.heads * (2 * self.max_positions - 1) * std::mem::size_of::<f32>());
        let calibration: usize = self.calibration.iter().map(|s| std::mem::size_of_val(s.as_slice())).sum();
        let rotary = self.rotary.len() * self.head_dim / 2 * std::mem::size_of::<f32>();
        self.embeddings.memory_bytes() + layers + self.final_norm.as_ref().map_or(0, Norm::memory_bytes)
            + bf16 + int8 + relative + calibration + rotary
    }

    /// Whether every tensor of the file is stored as [`Encoder::load`] reads it: floats as F32,
    /// BF16 or F16 (and BERT's I64 `position_ids` buffer).
    pub(crate) fn reads(weights: &[u8]) -> bool {
        SafeTensors::deserialize(weights)
            .is_ok_and(|f| f.iter().all(|(_, v)| Stored::of(v.dtype()).is_some() || v.dtype() == Dtype::I64))
    }

    /// Whether this encoder computes at `precision` on this CPU.
    pub(crate) fn supports_precision(precision: Precision) -> bool {
        match precision {
            Precision::Fp32 => true,
            Precision::Bf16 => dense::bf16_supported(),
            Precision::Int8 => dense::int8_supported(),
        }
    }

    /// The dense weights in bf16 panels, packed once.
    fn bf16_layers(&self) -> Result<&[Bf16Layer], InferenceError> {
        let packed = self.bf16.get_or_init(|| {
            let pack = |w: &Weight| match w {
                Weight::Packed(w) => Ok(Packed::bf16(w)),
                Weight::Plain { .. } => Err(InferenceError::UnsupportedPrecision(Precision::Bf16.as_str())),
            };
            self.layers
                .iter()
                .map(|l| {
                    Ok(Bf16Layer { qkv: pack(&l.qkv.w)?, out: pack(&l.out.w)?, ff1: pack(&l.ff1.w)?, ff2: pack(&l.ff2.w)? })
                })
                .collect()
        });
        packed.as_deref().map_err(Clone::clone)
    }

    /// `read` of the final hidden states of the given sequences, packed: `(Σ lengths, hidden)`,
    /// sequence after sequence, computed at `precision` (the dense layers' inputs rounded to bf16
    /// for [`Precision::Bf16`]; attention, element-wise work and accumulation stay f32), their
    /// tokens of the given types. Runs on the current rayon pool.
    pub(crate) fn forward<R>(
        &self,
        sequences: &[&[u32]],
        types: TokenTypes<'_>,
        precision: Precision,
        read: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, InferenceError> {
        if !Self::supports_precision(precision) {
            return Err(InferenceError::UnsupportedPrecision(precision.as_str()));
        }
        if precision == Precision::Int8 && self.arch != Architecture::Bert {
            return Err(InferenceError::UnsupportedPrecisionFor {
                precision: precision.as_str(),
                architecture: self.arch.as_str(),
            });
        }
        match precision {
            Precision::Fp32 => self.run(sequences, types, |_| Reduced::Fp32, None, read),
            Precision::Bf16 => {
                let layers = self.bf16_layers()?;
                self.run(sequences, types, |i| Reduced::Bf16(&layers[i]), None, read)
            }
            Precision::Int8 => {
                let layers = self.int8_layers()?;
                self.run(sequences, types, |i| Reduced::Int8(&layers[i]), None, read)
            }
        }
    }

    /// [`Encoder::forward`] with layer `i`'s products at `reduced(i)`, recording the largest
    /// |input| of every product into `stats` when given.
    fn run<'a, R>(
        &'a self,
        sequences: &[&[u32]],
        types: TokenTypes<'_>,
        reduced: impl Fn(usize) -> Reduced<'a>,
        stats: Option<&mut [LayerStats]>,
        read: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, InferenceError> {
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
        if *offsets.last().unwrap() == 0 {
            return Ok(read(&[]));
        }
        let taken = self.scratch.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        let mut scratch = taken.unwrap_or_default();
        let result = self.layers_over(sequences, types, &offsets, reduced, stats, &mut scratch).map(|()| read(&scratch.x));
        self.scratch.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(scratch);
        result
    }

    /// The embeddings and every layer of the packed `sequences` into `scratch.x`.
    fn layers_over<'a>(
        &'a self,
        sequences: &[&[u32]],
        types: TokenTypes<'_>,
        offsets: &[usize],
        reduced: impl Fn(usize) -> Reduced<'a>,
        mut stats: Option<&mut [LayerStats]>,
        scratch: &mut Scratch,
    ) -> Result<(), InferenceError> {
        let h = self.hidden;
        let total = offsets[offsets.len() - 1];
        let embeddings = &self.embeddings;

        // Embeddings: word (+ absolute position + token type), then the norm.
        let mut positions = Vec::with_capacity(total);
        let mut ids = Vec::with_capacity(total);
        for s in sequences {
            arch::positions(s, self.padding_idx, &mut positions);
            ids.extend(s.iter().map(|&id| id as usize));
        }
        let second = types.second_flags(sequences.iter().map(|s| s.len()), embeddings.second_type.is_some())?;
        let tokens: Vec<(usize, usize, bool)> = ids.into_iter().zip(positions).zip(second).map(|((id, p), t)| (id, p, t)).collect();
        let mut x = std::mem::take(&mut scratch.x);
        resize(&mut x, total * h);
        x.par_chunks_mut(h * ROWS_PER_TASK).zip(tokens.par_chunks(ROWS_PER_TASK)).for_each(|(rows, pos)| {
            let mut sum = vec![0f32; h];
            kernels::vectorized(#[inline(always)] || for (row, &(id, p, second)) in rows.chunks_exact_mut(h).zip(pos) {
                let word = &embeddings.word[id * h..(id + 1) * h];
                let input = match &embeddings.position {
                    Some(table) => {
                        let position = &table[p * h..(p + 1) * h];
                        let token_type = match (second, &embeddings.second_type) {
                            (true, Some(row)) => row,
                            _ => &embeddings.token_type,
                        };
                        for (((s, &w), &q), &t) in sum.iter_mut().zip(word).zip(position).zip(token_type) {
                            *s = w + q + t;
                        }
                        &sum[..]
                    }
                    None => word,
                };
                match &embeddings.norm {
                    Some(norm) => norm.apply(row, input, None, None, self.eps),
                    None => row.copy_from_slice(input),
                }
            });
        });
        // Rotary layers turn each token by its place in its own sequence.
        let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let tables: Vec<(f32, RotaryTable)> = self.rotary.iter().map(|(base, r)| (*base, r.table(longest))).collect();
        let places: Vec<usize> = if tables.is_empty() { Vec::new() } else { offsets.windows(2).flat_map(|w| 0..w[1] - w[0]).collect() };
        let result = self.layers.iter().enumerate().try_for_each(|(i, layer)| {
            let stats = stats.as_deref_mut().map(|s| &mut s[i]);
            let rotary = layer.attention.rotary_base.and_then(|base| tables.iter().find(|(b, _)| *b == base)).map(|(_, t)| t);
            let attention = Attention {
                window: layer.attention.window,
                causal: layer.attention.causal,
                rotary: rotary.map(|table| (table, places.as_slice())),
                qk_norm: layer.qk_norm.as_ref(),
            };
            self.layer(layer, reduced(i), &attention, &mut x, offsets, scratch, stats)
        });
        if result.is_ok()
            && let Some(norm) = &self.final_norm
        {
            fused_rows(&mut x, h, #[inline(always)] |_, row| norm.apply_in_place(row, self.eps));
        }
        scratch.x = x;
        result
    }

    /// One encoder layer over the packed hidden states `x` (`(total, hidden)`), in place, with
    /// its norms where the architecture places them.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        layer: &Layer,
        reduced: Reduced<'_>,
        attention: &Attention<'_>,
        x: &mut [f32],
        offsets: &[usize],
        scratch: &mut Scratch,
        mut stats: Option<&mut LayerStats>,
    ) -> Result<(), InferenceError> {
        let mut observe = |product: usize, x: &[f32]| {
            if let Some(stats) = stats.as_deref_mut() {
                stats.observe(product, x);
            }
        };
        let h = self.hidden;
        let total = offsets[offsets.len() - 1];
        let Scratch { qkv, context, proj, h1, ff, gated, .. } = scratch;
        match self.placement {
            Placement::Post => {
                // Self-attention, then Norm(projection + bias + x) into h1.
                observe(0, x);
                dense(x, total, &layer.qkv.w, reduced.pick(|b| &b.qkv, |q| &q.qkv), qkv)?;
                self.attention(qkv, layer.qkv.b.as_deref(), attention, reduced.attention(), offsets, context);
                observe(1, context);
                dense(context, total, &layer.out.w, reduced.pick(|b| &b.out, |q| &q.out), proj)?;
                resize(h1, total * h);
                let norm = layer.attn_norm.as_ref().ok_or_else(|| InferenceError::Forward("a post-norm layer without its attention norm".into()))?;
                self.residual_norm(h1, proj, layer.out.b.as_deref(), x, norm);
                // Feed-forward, then Norm(· W2 + b2 + h1) into x.
                observe(2, h1);
                let activated = self.feed_forward_in(layer, reduced, h1, total, ff, gated)?;
                observe(3, activated);
                dense(activated, total, &layer.ff2.w, reduced.pick(|b| &b.ff2, |q| &q.ff2), proj)?;
                self.residual_norm(x, proj, layer.ff2.b.as_deref(), h1, &layer.ff_norm);
            }
            Placement::Pre => {
                // x + Attention(Norm(x)), the first layer's norm possibly the identity.
                let input: &[f32] = match &layer.attn_norm {
                    Some(norm) => {
                        self.norm_into(h1, x, norm);
                        h1
                    }
                    None => x,
                };
                observe(0, input);
                dense(input, total, &layer.qkv.w, reduced.pick(|b| &b.qkv, |q| &q.qkv), qkv)?;
                self.attention(qkv, layer.qkv.b.as_deref(), attention, reduced.attention(), offsets, context);
                observe(1, context);
                dense(context, total, &layer.out.w, reduced.pick(|b| &b.out, |q| &q.out), proj)?;
                let sandwich = layer.sandwich.as_ref();
                self.add_residual_normed(x, proj, layer.out.b.as_deref(), sandwich.map(|(attn, _)| attn));
                // x + FFN(Norm(x)) (+ Norm of the FFN's output where the layer has one).
                self.norm_into(h1, x, &layer.ff_norm);
                observe(2, h1);
                let activated = self.feed_forward_in(layer, reduced, h1, total, ff, gated)?;
                observe(3, activated);
                dense(activated, total, &layer.ff2.w, reduced.pick(|b| &b.ff2, |q| &q.ff2), proj)?;
                self.add_residual_normed(x, proj, layer.ff2.b.as_deref(), sandwich.map(|(_, ff)| ff));
            }
        }
        Ok(())
    }

    /// The feed-forward's first product and its activation: `gelu(input · W1 + b1)` in `ff`, or
    /// for GeGLU `gelu(a) · g` of the two halves into `gated`. Returns the activated rows.
    fn feed_forward_in<'s>(
        &self,
        layer: &Layer,
        reduced: Reduced<'_>,
        input: &[f32],
        total: usize,
        ff: &'s mut Vec<f32>,
        gated: &'s mut Vec<f32>,
    ) -> Result<&'s [f32], InferenceError> {
        dense(input, total, &layer.ff1.w, reduced.pick(|b| &b.ff1, |q| &q.ff1), ff)?;
        let width = layer.ff1.width();
        if let Some(b) = &layer.ff1.b {
            if self.activation == Activation::Gelu {
                fused_rows(ff, width, #[inline(always)] |_, row| kernels::bias_gelu_in_place(row, b));
                return Ok(ff);
            }
            fused_rows(ff, width, #[inline(always)] |_, row| {
                for (o, &v) in row.iter_mut().zip(b) {
                    *o += v;
                }
            });
        }
        match self.activation {
            Activation::Gelu => {
                if layer.ff1.b.is_none() {
                    fused_rows(ff, width, #[inline(always)] |_, row| kernels::gelu_in_place(row));
                }
                Ok(ff)
            }
            Activation::GeGlu | Activation::SwiGlu | Activation::GeGluTanh => {
                let inter = width / 2;
                resize(gated, total * inter);
                let ff: &[f32] = ff;
                match self.activation {
                    Activation::GeGlu => fused_rows(gated, inter, #[inline(always)] |i, out| kernels::geglu(out, &ff[i * width..(i + 1) * width])),
                    Activation::GeGluTanh => fused_rows(gated, inter, #[inline(always)] |i, out| kernels::geglu_tanh(out, &ff[i * width..(i + 1) * width])),
                    _ => fused_rows(gated, inter, #[inline(always)] |i, out| kernels::swiglu(out, &ff[i * width..(i + 1) * width])),
                }
                Ok(gated)
            }
        }
    }

    /// `out ← Norm(product + bias + residual)`, row by row.
    fn residual_norm(&self, out: &mut [f32], product: &[f32], bias: Option<&[f32]>, residual: &[f32], norm: &Norm) {
        let h = self.hidden;
        fused_rows(out, h, #[inline(always)] |i, out| {
            let row = i * h..(i + 1) * h;
            norm.apply(out, &product[row.clone()], bias, Some(&residual[row]), self.eps)
        });
    }

    /// `out ← Norm(x)`, row by row.
    fn norm_into(&self, out: &mut Vec<f32>, x: &[f32], norm: &Norm) {
        let h = self.hidden;
        resize(out, x.len());
        fused_rows(out, h, #[inline(always)] |i, out| {
            norm.apply(out, &x[i * h..(i + 1) * h], None, None, self.eps)
        });
    }

    /// `x ← x + product (+ bias)`, row by row; with a sandwich norm `x ← x + Norm(product (+ bias))`.
    fn add_residual_normed(&self, x: &mut [f32], product: &mut [f32], bias: Option<&[f32]>, norm: Option<&Norm>) {
        let h = self.hidden;
        let Some(norm) = norm else {
            let product: &[f32] = product;
            fused_rows(x, h, #[inline(always)] |i, row| kernels::add_residual(row, &product[i * h..(i + 1) * h], bias));
            return;
        };
        fused_rows(product, h, #[inline(always)] |_, row| {
            if let Some(bias) = bias {
                for (o, &b) in row.iter_mut().zip(bias) {
                    *o += b;
                }
            }
            norm.apply_in_place(row, self.eps);
        });
        let product: &[f32] = product;
        fused_rows(x, h, #[inline(always)] |i, row| kernels::add_residual(row, &product[i * h..(i + 1) * h], None));
    }
}

/// How one layer attends: a local window or none, causal or not, per-head query and key norms
/// or none, and rotary positions (the table of its base and each packed token's place in its own
/// sequence) or none.
pub(super) struct Attention<'a> {
    window: Option<usize>,
    causal: bool,
    rotary: Option<(&'a RotaryTable, &'a [usize])>,
    qk_norm: Option<&'a (Norm, Norm)>,
}

/// A forward pass's matrices, reused from layer to layer (same sizes every layer) and from pass to
/// pass ([`Encoder`]'s `scratch`): the hidden states and the intermediate products.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    proj: Vec<f32>,
    h1: Vec<f32>,
    ff: Vec<f32>,
    /// A gated activation's output (half the first product's width).
    gated: Vec<f32>,
}

/// `buffer` with exactly `len` values; what it held is left in place (every user overwrites it).
fn resize(buffer: &mut Vec<f32>, len: usize) {
    buffer.resize(len, 0.0);
}

/// `out ← x · w` (`x`: `m` rows): through our f32 kernel (AVX-512 or AVX2; gemm's on a CPU with neither), or through the bf16 or int8 kernel with `w`'s bf16 or int8 copy.
fn dense(x: &[f32], m: usize, w: &Weight, reduced: Product<'_>, out: &mut Vec<f32>) -> Result<(), InferenceError> {
    if let Product::Bf16Rounded(rounded) = reduced {
        let x: Vec<f32> = x.iter().map(|&v| dense::bf16_rounded(v)).collect();
        return dense(&x, m, rounded, Product::Fp32, out);
    }
    let k = x.len() / m.max(1);
    let (rows, cols) = match (w, reduced) {
        (_, Product::Bf16(packed)) => (packed.rows(), packed.cols()),
        (_, Product::Int8(quantised)) => (quantised.rows(), quantised.cols()),
        (Weight::Packed(packed), Product::Fp32) => (packed.rows(), packed.cols()),
        (Weight::Plain { rows, cols, .. }, Product::Fp32) => (*rows, *cols),
        (_, Product::Bf16Rounded(_)) => unreachable!("computed above"),
    };
    if k != rows || x.len() != m * k {
        return Err(InferenceError::Forward(format!("({m}, {k}) · ({rows}, {cols})")));
    }
    resize(out, m * cols);
    match (w, reduced) {
        (_, Product::Bf16(packed)) => dense::matmul_bf16(x, m, packed, out),
        (_, Product::Int8(quantised)) => dense::matmul_int8(x, m, quantised, out),
        (Weight::Packed(packed), Product::Fp32) => dense::matmul_f32(x, m, packed, out),
        (Weight::Plain { values, rows, cols }, Product::Fp32) => strided::matmul_parallel(
            MatRef::new(x, m, k, k, 1),
            MatRef::new(values, *rows, *cols, *cols, 1),
            MatMut::new(out, m, *cols, *cols),
            1.0,
        ),
        (_, Product::Bf16Rounded(_)) => unreachable!("computed above"),
    }
    Ok(())
}

/// Fills `out` row by row (`row_len` values each) in parallel blocks: `f(row_index, row)`.
fn fused_rows(out: &mut [f32], row_len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    out.par_chunks_mut(row_len * ROWS_PER_TASK).enumerate().for_each(|(block, rows)| {
        kernels::vectorized(#[inline(always)] || {
            for (i, row) in rows.chunks_exact_mut(row_len).enumerate() {
                f(block * ROWS_PER_TASK + i, row);
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the encoder reports is what it holds: every f32 of the checkpoint it uses (packed,
    /// so a little padding on top), the MPNet bias table, then the bf16 copy once a job built it,
    /// half the f32 dense weights.
    #[test]
    fn memory_counts_the_weights_and_the_copies_once_built() {
        // The model matrix's MPNet (tests/testdata/models, scripts/make_test_models.py).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/testdata/models/mpnet");
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let config = ArchConfig::parse(&std::fs::read(dir.join("v6-mean/config.json")).unwrap()).unwrap();
        let encoder = Encoder::load(&weights, &config).unwrap();
        let tensors = SafeTensors::deserialize(&weights).unwrap();
        let used: usize = tensors.iter().filter(|(name, _)| !name.starts_with("pooler.")).map(|(_, v)| v.data().len()).sum();
        let before = encoder.memory_bytes();
        // The bucket weights become a table over every distance; MPNet has no token types (a
        // row of zeros stands for them); the dense weights' panels are padded to whole panels.
        let table = config.num_attention_heads * (2 * config.max_tokens() - 1) * 4;
        let bucket_weights = arch::MPNET_BUCKETS * config.num_attention_heads * 4;
        let padding: usize = encoder
            .layers
            .iter()
            .flat_map(|l| [&l.qkv.w, &l.out.w, &l.ff1.w, &l.ff2.w])
            .map(|w| match w {
                Weight::Packed(p) => p.memory_bytes() - p.rows() * p.cols() * 4,
                Weight::Plain { .. } => 0,
            })
            .sum();
        assert_eq!(before, used - bucket_weights + table + 4 * config.hidden_size + padding, "{used} bytes of tensors");
        if !dense::bf16_supported() {
            eprintln!("skipped the bf16 part: this CPU has no AVX-512 BF16");
            return;
        }
        let dense_f32: usize = encoder
            .layers
            .iter()
            .flat_map(|l| [&l.qkv.w, &l.out.w, &l.ff1.w, &l.ff2.w])
            .map(|w| match w {
                Weight::Packed(p) => p.memory_bytes(),
                Weight::Plain { .. } => 0,
            })
            .sum();
        encoder.bf16_layers().unwrap();
        let grown = encoder.memory_bytes() - before;
        assert!(grown.abs_diff(dense_f32 / 2) <= dense_f32 / 100, "bf16 copy {grown} bytes for {dense_f32} of f32");
    }

    /// bf16's rounding emulated in f32 (int8's calibration without AVX-512 BF16) is the product
    /// of the inputs rounded to bf16, within f32 summation error, on every CPU; and where the
    /// CPU has the bf16 kernel, within that error of the kernel's.
    #[test]
    fn the_emulated_bf16_product_rounds_as_bf16_does() {
        let (m, k, n) = (13, 200, 70);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1009) as f32 / 504.0 - 1.0).collect();
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0).collect();
        let weight = Weight::new(w.clone(), k, n).unwrap();
        let rounded = weight.bf16_rounded();
        let mut emulated = Vec::new();
        dense(&x, m, &weight, Product::Bf16Rounded(&rounded), &mut emulated).unwrap();
        let round = |v: f32| f64::from(dense::bf16_rounded(v));
        let bound = k as f64 * 1.2e-7 + 1e-6;
        let mut moved = 0f64;
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| round(x[i * k + p]) * round(w[p * n + j])).sum();
                let unrounded: f64 = (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(w[p * n + j])).sum();
                let got = f64::from(emulated[i * n + j]);
                assert!((got - want).abs() <= bound, "[{i}, {j}]: {got} vs {want}");
                moved = moved.max((want - unrounded).abs());
            }
        }
        assert!(moved > 100.0 * bound, "bf16's rounding should show: {moved}");
        if dense::bf16_supported() {
            let Weight::Packed(packed) = &weight else { unreachable!("AVX-512 BF16 implies AVX-512, which packs") };
            let mut kernel = Vec::new();
            dense(&x, m, &weight, Product::Bf16(&Packed::bf16(packed)), &mut kernel).unwrap();
            for (a, b) in kernel.iter().zip(&emulated) {
                assert!(f64::from((a - b).abs()) <= 2.0 * bound, "{a} vs {b}");
            }
        }
    }

    /// The two forms a dense weight takes (our kernel's panels where the CPU has AVX-512 or AVX2,
    /// gemm's row-major values elsewhere) compute the same product.
    #[test]
    fn both_weight_forms_give_the_same_product() {
        if !dense::f32_supported() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2, so only the plain form exists here");
            return;
        }
        let (m, k, n) = (11, 37, 70);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 97) as f32 / 48.0 - 1.0).collect();
        let packed = Weight::Packed(Packed::f32(&w, k, n));
        let plain = Weight::Plain { values: w, rows: k, cols: n };
        let (mut ours, mut theirs) = (Vec::new(), vec![1.0; 3]);
        dense(&x, m, &packed, Product::Fp32, &mut ours).unwrap();
        dense(&x, m, &plain, Product::Fp32, &mut theirs).unwrap();
        assert_eq!(ours.len(), m * n);
        assert_eq!(theirs.len(), m * n);
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        let wrong = dense(&x[..k * 3], 4, &packed, Product::Fp32, &mut ours).unwrap_err();
        assert!(wrong.to_string().contains("(4, "), "{wrong}");
    }
}
