//! Text embedding inside the enclave: a sentence-embedding backend on our own encoder, and an
//! engine that batches records by token length under a token budget and returns results in input
//! order (DESIGN.md §5 step 5, §7).
//!
//! Layers, in the spirit of text-embeddings-inference:
//!
//! * [`Embedder`] — the backend: tokenizer + encoder, loaded from in-memory bytes (in
//!   production the weights are decrypted into memory; there is no mmap and no file access here).
//!   The architecture comes from `config.json`'s `model_type` ([`Architecture`], `arch.rs`): BERT,
//!   XLM-RoBERTa (positions offset by `padding_idx + 1`), MPNet (also a bucketed relative
//!   position bias in attention), ModernBERT (`modernbert.rs`: pre-norm, GeGLU, rotary, local
//!   and global layers) or Qwen3 (`qwen3.rs`: a causal decoder with RMSNorm, grouped-query
//!   attention, SwiGLU, rotary; pooled by its last token) or Gemma 3's text body (`gemma3.rs`:
//!   EmbeddingGemma, bidirectional, sliding and full layers, sandwich norms, tanh GeGLU) or
//!   NomicBERT (`nomic_bert.rs`: post-norm, rotary, SwiGLU) or GTE (`gte.rs`: post-norm, rotary,
//!   biased attention, GeGLU); any
//!   other is refused by name. sentence-transformers `Dense` modules after the pooling
//!   (`projection.rs`) are applied before normalisation. All run through one layer loop over shared
//!   blocks (`encoder/blocks.rs`). XLM-RoBERTa, MPNet, ModernBERT and Qwen3 run only in the fused
//!   encoder, at fp32 and bf16 (int8 is refused for them: its bound is measured on BERT only);
//!   `tests/arch_reference.rs` and the model matrix check them against sentence-transformers.
//!   It tokenizes one text ([`Embedder::tokenize`]) and embeds one batch
//!   ([`Embedder::embed_batch`]): mean, CLS or last-token pooling over the real tokens, optional L2
//!   normalisation. Two encoders ([`Backend`]):
//!   - `Fused` (default, `encoder.rs`): our own arrangement of the same computation — sequences
//!     packed without padding, attention per sequence, Q/K/V fused, bias/residual/LayerNorm/GELU
//!     fused in safe vectorisable Rust (`kernels.rs`), every product on our kernels (`dense.rs`)
//!     or gemm's (short texts' attention, and dense layers on a CPU without AVX2);
//!   - `CandleBert` (feature `candle`, for tests and the benchmark only: `candle_bert.rs`):
//!     `candle_transformers`' `BertModel` over right-padded batches with the attention mask and
//!     zero `token_type_ids` — the straightforward reference path.
//!
//!   Both are checked against the same reference vectors (`tests/inference_reference.rs`).
//!   The fused encoder also computes at the reduced precisions a job may ask for (`dense.rs`):
//!   bf16 (AVX-512 BF16) and int8 (AVX-512 VNNI: weights per output channel, activations per
//!   token, after smoothing outlier channels into the weights, 8 channels per product exact, the
//!   FFN output in bf16 where the calibration set asks for it, and every product of a text of at
//!   most [`INT8_SHORT_TOKENS`] tokens in bf16); attention, softmax, LayerNorm,
//!   GELU, residuals and pooling stay f32. A precision the worker cannot compute is refused.
//! * [`plan_batches`] — the pure batching policy: sort by length, cut into batches whose *padded*
//!   size (`batch size × longest member`) stays under a token budget and a batch-size cap.
//! * [`Engine`] — the serving side: owns a dedicated rayon thread pool, embeds a bounded window of
//!   records ([`Engine::embed_window`]) and keeps [`Metrics`]. [`Engine::embed_stream`] runs a
//!   stream of records through consecutive windows, so memory depends on the window, never on the
//!   corpus size, and output order is input order.
//!
//! The job loop (opening and sealing streams, receipts) lives elsewhere and only calls
//! [`Engine::embed_records`] / [`Engine::embed_stream`].
//!
//! # Performance (measured, 2-core AMD EPYC Zen 4, quiet machine)
//!
//! `examples/bench_inference.rs` on 2,000 Debian package descriptions (`scripts/build_corpus.py`,
//! 89 tokens mean), median of 3, model loaded from bytes in memory:
//!
//! | backend | threads | docs/s | tokens/s | of candle's GEMM peak | load | peak RSS |
//! |---|---|---|---|---|---|---|
//! | Fused | 1 | 43.8 | 3,903 | 81 % (of 107 GFLOP/s) | 79 ms | 188 MiB |
//! | Fused | 2 | 84.7 | 7,546 | 81 % (of 208 GFLOP/s) | 83 ms | 188 MiB |
//! | CandleBert | 1 | 29.0 | 2,588 | 55 % | 70 ms | 334 MiB |
//! | CandleBert | 2 | 49.1 | 4,373 | 47 % | 69 ms | 337 MiB |
//!
//! This CPU's fp32 GEMM peak (≈ 205 GFLOP/s at 2 threads, candle and OpenBLAS alike) is well below
//! the 540 GFLOP/s machine of STACK.md §6, so compare peers by fraction of peak or re-run them here.
//!
//! # Threads
//!
//! [`Engine`] runs everything inside its own `rayon::ThreadPool` of [`EngineSettings::threads`]
//! threads (default: available parallelism): tokenization, the dense kernels, attention (gemm on
//! the current rayon pool) and the element-wise kernels, so the engine's thread count is the
//! whole story. During a call the pool's other threads poll for work rather than sleep between
//! forks (`awake`): a sleeping thread's wake-up through a hypervisor cost more than a short fork.
//! The CandleBert reference also uses candle's own element-wise pool, which only the
//! process environment sizes, before the first tensor op (setting environment variables
//! in-process is `unsafe`, which this crate forbids): run it with `CANDLE_NUM_THREADS=n
//! RAYON_NUM_THREADS=n`; the benchmark does this for every thread count, in a child process, and
//! `candle_thread_settings` reports what candle will use.

mod arch;
mod awake;
#[cfg(feature = "candle")]
mod candle_bert;
mod batching;
mod embedder;
mod dense;
mod encoder;
mod engine;
mod kernels;
mod metrics;
mod modernbert;
mod nomic_bert;
mod projection;
mod gemma3;
mod gte;
mod qwen3;
mod strided;

pub use arch::Architecture;
pub use batching::{Batch, BatchLimits, plan_batches};
pub use dense::{Blocking as DenseBlocking, L2Size, Unit as DenseUnit, Units as DenseUnits, bf16_pays as dense_bf16_pays, blocking as dense_blocking, units as dense_units};
#[doc(hidden)] // for examples/bench_dense
pub use dense::bench as dense_bench;
pub use embedder::{Backend, Embedder, EmbedderSettings, HeadFiles, INT8_SHORT_TOKENS, LEXICAL_DROPPED_TOKENS, ModelFiles, Pooled, Tokenized};
#[cfg(feature = "candle")]
pub use candle_bert::{CandleThreads, candle_thread_settings};
pub use engine::{EmbedOptions, Engine, EngineSettings, MultiVectorOutput};
pub use metrics::{Metrics, MetricsSnapshot};
pub use projection::{DenseFiles, IDENTITY as DENSE_IDENTITY};

use protocol::envelope::{OutputDtype, OutputKind};
use protocol::quantize::Ranges;
use protocol::records::{EncodeError, ErrorCode, MultiVector, OutputRecord, SparseVector, Vector};


/// One embedded record.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The pooled (and, if asked, L2-normalised) vector, `hidden_size` values.
    pub vector: Vec<f32>,
    /// Real tokens fed to the model, `[CLS]` and `[SEP]` included, after truncation.
    pub tokens: u32,
    /// A lexical head's weights (bge-m3's sparse output), in place of `vector`.
    pub sparse: Option<SparseVector>,
}

impl Embedding {
    /// The vector in the dtype a job asked for, with the job's ranges for `int8`/`uint8`
    /// ([`Vector::encode`]).
    pub fn to_vector(&self, dtype: OutputDtype, ranges: Option<&Ranges>) -> Result<Vector, EncodeError> {
        Vector::encode(self.vector.clone(), dtype, ranges)
    }

    /// The output record for this embedding: its sparse form for a sparse job, else the vector in
    /// `dtype`; an `inference_failed` error if the job's ranges do not fit its vectors (the job's
    /// options were checked against the model before, so only a defect reaches that).
    pub fn into_output(self, id: String, dtype: OutputDtype, options: &EmbedOptions) -> OutputRecord {
        if options.output == OutputKind::Sparse {
            let sparse = match self.sparse {
                Some(sparse) => sparse.keep_largest(options.top_k),
                None => SparseVector::from_dense(&self.vector, options.top_k),
            };
            let vector = Vector::Sparse(sparse);
            return OutputRecord::Embedding { id, tokens: self.tokens, vector };
        }
        if let Some(multi) = options.multivector {
            let bytes = self.vector.len() * 4;
            if bytes > multi.max_record_bytes as usize {
                let message = format!("{bytes} bytes of vectors ({} tokens), over the job's max_record_bytes {}", self.tokens, multi.max_record_bytes);
                return OutputRecord::Error { id, code: ErrorCode::OutputTooLarge, message };
            }
            return match MultiVector::new(multi.dimensions, self.vector) {
                Some(vector) => OutputRecord::Embedding { id, tokens: self.tokens, vector: Vector::Multi(vector) },
                None => OutputRecord::Error { id, code: ErrorCode::InferenceFailed, message: "the head's vectors do not fill whole rows".into() },
            };
        }
        match Vector::encode(self.vector, dtype, options.ranges.as_deref()) {
            Ok(vector) => OutputRecord::Embedding { id, tokens: self.tokens, vector },
            Err(e) => OutputRecord::Error { id, code: ErrorCode::InferenceFailed, message: e.to_string() },
        }
    }
}

/// Why one record has no embedding. The job goes on; the record becomes an error record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordFailure {
    pub code: ErrorCode,
    /// Human-readable detail. Never contains the text itself (it goes back in a sealed stream,
    /// but also keep logs clean).
    pub message: String,
}

impl RecordFailure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The output record for this failure; the message is cut to the protocol's limit.
    pub fn into_output(self, id: String) -> OutputRecord {
        let mut message = self.message;
        if message.len() > protocol::records::MAX_MESSAGE_LEN {
            let mut cut = protocol::records::MAX_MESSAGE_LEN;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        OutputRecord::Error { id, code: self.code, message }
    }
}

impl std::fmt::Display for RecordFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// Failures of the engine itself (bad model files, bad settings, unsupported options): these fail
/// model loading or the job, not a record.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InferenceError {
    #[error("config.json: {0}")]
    Config(String),
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    #[error("model weights: {0}")]
    Weights(String),
    #[error("settings: {0}")]
    Settings(String),
    #[error("precision {0} is not supported by this worker (bf16 needs the fused encoder and a CPU with AVX-512 BF16, int8 the fused encoder and a CPU with AVX-512 VNNI)")]
    UnsupportedPrecision(&'static str),
    #[error("precision {precision} is not offered for {architecture} models (its accuracy is measured on BERT only)")]
    UnsupportedPrecisionFor { precision: &'static str, architecture: &'static str },
    #[error("prompt {0:?} is not one of the model manifest's prompts")]
    UnknownPrompt(String),
    #[error("dimensions {asked}: the model manifest offers {offered:?}")]
    DimensionsNotOffered { asked: u32, offered: Vec<u32> },
    #[error("ranges: {ranges} dimensions, the job's vectors have {vectors}")]
    RangesDimensions { ranges: usize, vectors: usize },
    #[error("output {asked}: the model gives {gives} output (its manifest's pooling and outputs)")]
    OutputNotOffered { asked: &'static str, gives: String },
    #[error("normalize: {0} output is never normalised by the job (SparseEncoder and CrossEncoder have no Normalize; a MultiVectorEncoder normalises each token vector itself)")]
    Normalized(&'static str),
    #[error("config.json: unsupported architecture: {0}")]
    UnsupportedArchitecture(String),
    /// A setting of the model's files the engine does not compute (or does not know), by file
    /// and field.
    #[error("{file}: {field} {found}: {reason}")]
    UnsupportedSetting { file: &'static str, field: String, found: String, reason: &'static str },
    /// A sentence-transformers Dense module (the `index`th after the pooling, from 0) the engine
    /// does not compute, or whose weights do not fit, by file and field.
    #[error("Dense module {index} {file}: {field} {found}: {reason}")]
    Dense { index: usize, file: &'static str, field: String, found: String, reason: &'static str },
    #[error("thread pool: {0}")]
    ThreadPool(String),
    #[error("model forward pass: {0}")]
    Forward(String),
}
