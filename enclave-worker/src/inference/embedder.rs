//! A sentence-embedding model: tokenizer, encoder and pooling, loaded from bytes in memory.

use protocol::envelope::{OutputKind, Precision};
use protocol::manifest::{Manifest, Pooling, RerankTemplate};
use protocol::receipt::{Compute, ComputeUnit, ShortRecords};
use protocol::records::{ErrorCode, MAX_TEXT_LEN};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::arch::{ArchConfig, Architecture};
use super::encoder::{ClassifierHead, Encoder, LexicalHead, MultiVectorHead, SpladeHead, TokenTypes, YesNoHead};
use super::projection::{DenseFiles, Projection};
use super::{InferenceError, RecordFailure};

/// Which implementation of the BERT encoder runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The fused encoder (`encoder.rs`): packed unpadded tokens, per-sequence attention,
    /// fused element-wise kernels, our dense kernels. Default; with the `candle` feature a BERT
    /// config it does not implement falls back to [`Backend::CandleBert`].
    #[default]
    Fused,
    /// `candle_transformers::models::bert::BertModel` over right-padded batches with an attention
    /// mask: the straightforward reference path, in builds with the `candle` feature only
    /// ([`super::candle_bert`]).
    CandleBert,
}

// One per loaded model: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Model {
    Fused(Encoder),
    #[cfg(feature = "candle")]
    Candle(super::candle_bert::CandleBert),
}

/// The files of a model directory, as bytes in memory (decrypted and hash-checked by the model
/// loader before they get here).
#[derive(Debug, Clone, Copy)]
pub struct ModelFiles<'a> {
    /// `config.json` (Hugging Face BERT config).
    pub config: &'a [u8],
    /// `tokenizer.json` (Hugging Face tokenizers).
    pub tokenizer: &'a [u8],
    /// `model.safetensors`.
    pub weights: &'a [u8],
    /// The sentence-transformers `Dense` modules after the pooling, in order (most models: none).
    pub dense: &'a [DenseFiles<'a>],
}

/// bge-m3's heads beside its dense vectors, as the manifest lists them
/// ([`protocol::manifest::LEXICAL_HEAD_FILE`], [`protocol::manifest::COLBERT_HEAD_FILE`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadFiles<'a> {
    pub lexical: Option<&'a [u8]>,
    pub colbert: Option<&'a [u8]>,
}

/// The tokens whose lexical weights bge-m3 never writes: its tokenizer's `cls_token`,
/// `eos_token`, `pad_token` and `unk_token` (XLM-RoBERTa's).
pub const LEXICAL_DROPPED_TOKENS: [&str; 4] = ["<s>", "</s>", "<pad>", "<unk>"];

/// What one sequence's states became: a vector (or a multi-vector's rows), or a sparse vector.
#[derive(Debug, Clone, PartialEq)]
pub enum Pooled {
    Vector(Vec<f32>),
    Sparse(protocol::records::SparseVector),
}

/// How a model turns token states into one vector. Comes from the signed manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedderSettings {
    pub pooling: Pooling,
    /// The manifest's declared normalisation (informational: what the model's vectors are
    /// meant to be). Each job decides through [`super::EmbedOptions::normalize`].
    pub normalize: bool,
    /// Maximum tokens per text, `[CLS]` and `[SEP]` included; longer texts are truncated, or refused
    /// when a job asks for no truncation.
    pub max_tokens: usize,
    /// If set, the length of the model's vectors must equal it (the manifest's `dimensions`): the
    /// hidden size, or the last Dense module's `out_features`.
    pub dimensions: Option<usize>,
    pub backend: Backend,
}

impl Default for EmbedderSettings {
    /// all-MiniLM-L6-v2 as sentence-transformers runs it.
    fn default() -> Self {
        Self { pooling: Pooling::Mean, normalize: true, max_tokens: 256, dimensions: None, backend: Backend::Fused }
    }
}

impl EmbedderSettings {
    pub fn from_manifest(manifest: &Manifest) -> Self {
        Self {
            pooling: manifest.pooling,
            normalize: manifest.normalize,
            max_tokens: manifest.max_tokens as usize,
            dimensions: Some(manifest.dimensions as usize),
            backend: Backend::default(),
        }
    }
}

/// A tokenized text: token ids with `[CLS]`/`[SEP]`, already truncated to `max_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// A pair's second segment, where the model embeds it as token type 1 (BERT): the index it
    /// starts at, its closing `[SEP]` included. `None`: every token is type 0.
    pub second_segment: Option<usize>,
}

impl Tokenized {
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }
}

/// Texts whose activations set the int8 smoothing factors of the dense layers' input channels
/// (the fused encoder's `int8_layers`): a fixed set, so a model's int8 weights are the same on
/// every worker and for every job. Varied on purpose — prose, a question, punctuation, digits,
/// code, other scripts — since the outlier channels are a property of the model, not of a text.
const INT8_CALIBRATION: [&str; 8] = [
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "What is the capital of France, and how many people live there?",
    "Install the package with apt-get install -y libssl-dev (version 3.0.2, 2024-05-01).",
    "!!! ??? ... --- ;;; ((( ))) [[[ ]]]",
    "fn main() { let x: Vec<u32> = (0..10).collect(); println!(\"{x:?}\"); }",
    "Der schnelle braune Fuchs springt über den faulen Hund. Le renard brun saute par-dessus le chien.",
    "東京は日本の首都です。 Москва — столица России. القاهرة هي عاصمة مصر.",
    "A library for parsing, validating and transforming JSON documents in memory, with streaming support \
     for large inputs, a command-line tool, and bindings for several languages including Python and C.",
];

/// In an int8 job, texts of at most this many tokens (`[CLS]` and `[SEP]` included) run every
/// dense product at bf16 (fp32 where bf16 is not faster) instead: on them int8's bound does not
/// hold. Measured on all-MiniLM-L6-v2 (docs/benchmarks.md, "int8 on short texts"): over ~30,000
/// prefixes of Debian descriptions, int8's worst cosine to fp32 was 0.99563 at 3 tokens, 75,
/// 34, 9 and 1 texts below 0.999 at 3, 4, 5 and 6 tokens, 0.99907 at 8, and 0.99922 or more at
/// every length from 9 on, the corpus's own level. A short text is a small share of a job's
/// work, so computing it wider costs little.
pub const INT8_SHORT_TOKENS: usize = 8;

/// A sentence-embedding model: tokenizer + BERT encoder + pooling. `Send + Sync`; one instance
/// serves every job for its model.
pub struct Embedder {
    model: Model,
    tokenizer: Tokenizer,
    settings: EmbedderSettings,
    arch: Architecture,
    hidden_size: usize,
    /// SPLADE pooling's head (`Pooling::Splade`): the vectors are the vocabulary's width.
    splade: Option<SpladeHead>,
    /// A cross-encoder's head (`Pooling::Rerank`): a pair's vector is its one score.
    classifier: Option<ClassifierHead>,
    /// Whether a pair's second segment is token type 1: BERT's tokenizers pass the types, the
    /// RoBERTa family's do not (transformers' `model_input_names`), so XLM-RoBERTa's pairs are
    /// all type 0 whatever their template says.
    pair_types: bool,
    /// A ColBERT model's per-token head (`Pooling::MultiVector`): a text's vector is its tokens'
    /// vectors, row after row.
    multivector: Option<MultiVectorHead>,
    /// A decoder reranker's (`Pooling::RerankYesNo`) pair template and score.
    yesno: Option<YesNoPairs>,
    /// The Dense modules after the pooling (none for most models).
    projection: Projection,
    /// bge-m3's lexical head: a job's sparse output beside the dense vectors.
    lexical: Option<LexicalHead>,
    /// bge-m3's ColBERT head: a job's multi-vector output (every token after the first).
    colbert: Option<MultiVectorHead>,
    vocab_size: usize,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("settings", &self.settings)
            .field("hidden_size", &self.hidden_size)
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Builds the model from bytes in memory. The weights are copied into the encoder's own
    /// layout (no mmap); the caller may drop or zeroize `files` afterwards.
    pub fn load(files: ModelFiles<'_>, settings: EmbedderSettings) -> Result<Self, InferenceError> {
        Self::load_with_template(files, settings, None)
    }

    /// [`Embedder::load`] with the manifest's pair template, which a decoder reranker
    /// (`Pooling::RerankYesNo`) needs and no other model has.
    pub fn load_with_template(files: ModelFiles<'_>, settings: EmbedderSettings, template: Option<&RerankTemplate>) -> Result<Self, InferenceError> {
        let config = ArchConfig::parse(files.config)?;
        if settings.max_tokens < 3 || settings.max_tokens > config.max_tokens() {
            return Err(InferenceError::Settings(format!(
                "max_tokens {} outside 3..={} (the model's max_position_embeddings, less the position offset)",
                settings.max_tokens,
                config.max_tokens()
            )));
        }
        let splade = match settings.pooling {
            Pooling::Splade => Some(SpladeHead::load(files.weights, &config)?),
            _ => None,
        };
        let classifier = match settings.pooling {
            Pooling::Rerank { sigmoid } => Some(ClassifierHead::load(files.weights, &config, labels(files.config)?, sigmoid)?),
            _ => None,
        };
        let yesno_head = match (settings.pooling, template) {
            (Pooling::RerankYesNo { sigmoid }, Some(t)) => Some(YesNoHead::load(files.weights, files.config, &config, (t.yes, t.no), sigmoid)?),
            (Pooling::RerankYesNo { .. }, None) => return Err(InferenceError::Settings("rerank_yesno pooling without the manifest's rerank_template".into())),
            (_, Some(_)) => return Err(InferenceError::Settings("a rerank_template goes with rerank_yesno pooling only".into())),
            (_, None) => None,
        };
        if (splade.is_some() || classifier.is_some() || yesno_head.is_some()) && !files.dense.is_empty() {
            return Err(InferenceError::Settings("Dense modules follow a pooling to one vector, not splade or rerank".into()));
        }
        // A multi-vector model's one Dense module is its per-token projection, not a pooled one's.
        let (multivector, pooled_dense) = match settings.pooling {
            Pooling::MultiVector => (Some(MultiVectorHead::load(files.dense, config.hidden_size)?), &[][..]),
            _ => (None, files.dense),
        };
        let projection = Projection::load(pooled_dense, config.hidden_size)?;
        let width = match (&splade, &multivector) {
            (Some(head), _) => head.dimensions(),
            (_, Some(head)) => head.dimensions(),
            _ => projection.output_width(config.hidden_size),
        };
        if let Some(dimensions) = settings.dimensions
            && dimensions != width
        {
            return Err(InferenceError::Settings(format!(
                "the manifest says {dimensions} dimensions, the model's vectors have {width} (hidden size {}, vocabulary {}, {} Dense modules)",
                config.hidden_size,
                config.vocab_size,
                files.dense.len()
            )));
        }

        let mut tokenizer =
            Tokenizer::from_bytes(files.tokenizer).map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        // The shipped tokenizer.json pads every text to a fixed 128 tokens and truncates at 128
        // (STACK.md §5). We pad ourselves, within a batch, and truncate at max_tokens.
        #[cfg(feature = "candle")]
        let shipped_pad = tokenizer.get_padding().map(|p| p.pad_id).or_else(|| tokenizer.token_to_id("[PAD]"));
        tokenizer.with_padding(None);
        // The template's tail as sentence-transformers derives it, from untruncated renders.
        let yesno = match (yesno_head, template) {
            (Some(head), Some(template)) => Some(YesNoPairs::new(head, template, &tokenizer)?),
            _ => None,
        };
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: settings.max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| InferenceError::Tokenizer(e.to_string()))?;

        let fused = if settings.backend != Backend::Fused {
            Err("the CandleBert backend was asked for".to_owned())
        } else if !Encoder::reads(files.weights) {
            Err("model.safetensors holds tensors other than F32, BF16 or F16".to_owned())
        } else {
            Encoder::supports(&config)
        };
        let model = match fused {
            Ok(()) => {
                let mut encoder = Encoder::load(files.weights, &config)?;
                encoder.calibrate_with(
                    INT8_CALIBRATION.iter().filter_map(|text| tokenizer.encode_fast(*text, true).ok()).map(|e| e.get_ids().to_vec()),
                );
                Model::Fused(encoder)
            }
            #[cfg(feature = "candle")]
            Err(_) if config.arch == Architecture::Bert => {
                Model::Candle(super::candle_bert::CandleBert::load(files.config, files.weights, shipped_pad)?)
            }
            Err(why) => {
                // candle's BertModel (a test and benchmark reference) has neither their
                // positions, MPNet's relative bias nor ModernBERT's or Qwen3's layers.
                return Err(InferenceError::UnsupportedArchitecture(format!(
                    "{}: only the fused encoder computes it, and not this model here: {why}",
                    config.arch.as_str()
                )));
            }
        };
        if (splade.is_some() || classifier.is_some() || multivector.is_some() || yesno.is_some()) && !matches!(model, Model::Fused(_)) {
            return Err(InferenceError::UnsupportedArchitecture("splade, rerank and multivector heads run on the fused encoder only".into()));
        }
        let pair_types = config.arch == Architecture::Bert && config.type_vocab_size >= 2;
        Ok(Self {
            model,
            tokenizer,
            settings,
            arch: config.arch,
            hidden_size: config.hidden_size,
            splade,
            classifier,
            pair_types,
            multivector,
            yesno,
            projection,
            lexical: None,
            colbert: None,
            vocab_size: config.vocab_size,
        })
    }

    /// Adds bge-m3's lexical and ColBERT heads to a model with dense vectors (CLS, mean or
    /// last-token pooling) on the fused encoder; the lexical head needs the tokenizer's four
    /// dropped tokens ([`LEXICAL_DROPPED_TOKENS`]).
    pub fn with_heads(mut self, heads: HeadFiles<'_>) -> Result<Self, InferenceError> {
        if heads.lexical.is_none() && heads.colbert.is_none() {
            return Ok(self);
        }
        if self.settings.pooling.output() != OutputKind::Dense || !matches!(self.model, Model::Fused(_)) {
            return Err(InferenceError::Settings("lexical and ColBERT heads go beside a fused model's dense vectors only".into()));
        }
        if let Some(weights) = heads.lexical {
            let dropped = LEXICAL_DROPPED_TOKENS
                .iter()
                .map(|token| {
                    self.tokenizer.token_to_id(token).ok_or_else(|| {
                        InferenceError::Tokenizer(format!("no {token} token, whose lexical weight bge-m3 drops"))
                    })
                })
                .collect::<Result<Vec<u32>, _>>()?;
            self.lexical = Some(LexicalHead::load(weights, self.hidden_size, self.vocab_size, dropped)?);
        }
        if let Some(weights) = heads.colbert {
            self.colbert = Some(MultiVectorHead::colbert_linear(weights, self.hidden_size)?);
        }
        Ok(self)
    }

    /// The length of the vectors of a job's `output`, if this model computes it: the pooling's
    /// own ([`Embedder::dimensions`]), or a bge-m3 head's.
    pub fn output_dimensions(&self, output: OutputKind) -> Option<usize> {
        match output {
            _ if output == self.settings.pooling.output() => Some(self.dimensions()),
            OutputKind::Sparse => self.lexical.as_ref().map(LexicalHead::dimensions),
            OutputKind::MultiVector => self.colbert.as_ref().map(MultiVectorHead::dimensions),
            OutputKind::Dense | OutputKind::Scores => None,
        }
    }

    pub fn settings(&self) -> &EmbedderSettings {
        &self.settings
    }

    /// The backend actually in use (the fused one falls back for configs it does not implement).
    /// Whether this model computes at `precision` here: fp32 always; bf16 with the fused encoder
    /// on a CPU with AVX-512 BF16; int8 with the fused encoder on a CPU with AVX-512 VNNI.
    pub fn supports_precision(&self, precision: Precision) -> bool {
        self.check_precision(precision).is_ok()
    }

    /// [`Embedder::supports_precision`], with the reason. int8 is BERT's only: its accuracy
    /// bound was measured on BERT (docs/benchmarks.md), not on XLM-RoBERTa or MPNet.
    ///
    /// The model's own refusal comes first: it holds on every CPU, so a job gets the same
    /// answer whichever host's enclave runs it.
    pub fn check_precision(&self, precision: Precision) -> Result<(), InferenceError> {
        if precision == Precision::Int8 && self.arch != Architecture::Bert {
            return Err(InferenceError::UnsupportedPrecisionFor {
                precision: precision.as_str(),
                architecture: self.arch.as_str(),
            });
        }
        let computes = match self.model {
            Model::Fused(_) => Encoder::supports_precision(precision),
            #[cfg(feature = "candle")]
            Model::Candle(_) => precision == Precision::Fp32,
        };
        if !computes {
            return Err(InferenceError::UnsupportedPrecision(precision.as_str()));
        }
        Ok(())
    }

    /// The precision a text of `tokens` tokens (`[CLS]`, `[SEP]` and a prompt included) is
    /// computed at in a job at `precision`: the job's own, but in an int8 job a text of at most
    /// [`INT8_SHORT_TOKENS`] runs every dense product at [`Embedder::int8_short_precision`].
    pub fn precision_for(&self, precision: Precision, tokens: usize) -> Precision {
        if precision == Precision::Int8 && tokens <= INT8_SHORT_TOKENS {
            self.int8_short_precision()
        } else {
            precision
        }
    }

    /// What an int8 job's short texts run at: bf16 where it is faster than fp32 (its own bound,
    /// cosine ≥ 0.9999 to fp32 on every text measured), fp32 elsewhere.
    pub fn int8_short_precision(&self) -> Precision {
        if super::dense::bf16_pays() { Precision::Bf16 } else { Precision::Fp32 }
    }

    /// The receipt's statement of how a job at `precision` computed (`compute`, docs/protocol.md
    /// §4): the unit of each reduced arithmetic its products used and, for int8, how many of its
    /// embedded records were short enough to run wider. `None` for fp32.
    pub fn compute(&self, precision: Precision, short_records: u64) -> Option<Compute> {
        let units = super::dense::units();
        let unit = |unit: Option<super::dense::Unit>| {
            unit.map(|unit| match unit {
                super::dense::Unit::Avx512 => ComputeUnit::Avx512,
                super::dense::Unit::Amx => ComputeUnit::Amx,
                super::dense::Unit::Avx2 => ComputeUnit::Avx2,
            })
        };
        match precision {
            Precision::Fp32 => None,
            Precision::Bf16 => Some(Compute { bf16: unit(units.bf16), int8: None, short: None }),
            Precision::Int8 => {
                let wider = self.int8_short_precision();
                Some(Compute {
                    bf16: if wider == Precision::Bf16 { unit(units.bf16) } else { None },
                    int8: unit(units.int8),
                    short: Some(ShortRecords { max_tokens: INT8_SHORT_TOKENS as u32, precision: wider, records: short_records }),
                })
            }
        }
    }

    /// The model's architecture (`config.json` `model_type`).
    pub fn architecture(&self) -> Architecture {
        self.arch
    }

    pub fn backend(&self) -> Backend {
        match self.model {
            Model::Fused(_) => Backend::Fused,
            #[cfg(feature = "candle")]
            Model::Candle(_) => Backend::CandleBert,
        }
    }

    /// Whether batches are padded to their longest member (CandleBert) or packed (Fused). Decides
    /// how many tokens the model really processes.
    pub fn pads_batches(&self) -> bool {
        self.backend() == Backend::CandleBert
    }

    /// Length of the output vectors: the hidden size, the last Dense module's output, a SPLADE
    /// model's vocabulary, or the width of each of a multi-vector model's token vectors.
    pub fn dimensions(&self) -> usize {
        match (&self.splade, &self.multivector) {
            (Some(head), _) => head.dimensions(),
            (_, Some(head)) => head.dimensions(),
            _ => self.projection.output_width(self.hidden_size),
        }
    }

    /// Checks and tokenizes one text. Per-record failures: `TooLarge` (over the protocol's text
    /// limit), `InvalidUtf8`, `EmptyText` (empty, whitespace-only, or nothing left after the
    /// tokenizer's normalisation), `TokenizerFailed`, and `TooManyTokens` when `truncate` is off and
    /// the text has more than `max_tokens` tokens.
    pub fn tokenize(&self, text: &[u8], truncate: bool) -> Result<Tokenized, RecordFailure> {
        self.tokenize_prompted(text, None, truncate)
    }

    /// [`Embedder::tokenize`] of `prompt` followed by the text, as sentence-transformers joins
    /// them: the checks are the text's, the token limit (and truncation) the joined string's.
    pub fn tokenize_prompted(&self, text: &[u8], prompt: Option<&str>, truncate: bool) -> Result<Tokenized, RecordFailure> {
        if text.len() > MAX_TEXT_LEN {
            return Err(RecordFailure::new(
                ErrorCode::TooLarge,
                format!("text of {} bytes exceeds {MAX_TEXT_LEN}", text.len()),
            ));
        }
        let text = std::str::from_utf8(text).map_err(|e| {
            RecordFailure::new(ErrorCode::InvalidUtf8, format!("not UTF-8 after byte {}", e.valid_up_to()))
        })?;
        if text.trim().is_empty() {
            return Err(RecordFailure::new(ErrorCode::EmptyText, "the text is empty or only whitespace"));
        }
        let joined;
        let text = match prompt {
            Some(prompt) => {
                joined = format!("{prompt}{text}");
                joined.as_str()
            }
            None => text,
        };
        let encoding = self
            .tokenizer
            .encode_fast(text, true)
            .map_err(|e| RecordFailure::new(ErrorCode::TokenizerFailed, e.to_string()))?;
        if encoding.get_special_tokens_mask().iter().all(|&special| special != 0) {
            return Err(RecordFailure::new(ErrorCode::EmptyText, "no tokens left after normalisation"));
        }
        if !truncate && !encoding.get_overflowing().is_empty() {
            return Err(RecordFailure::new(
                ErrorCode::TooManyTokens,
                format!("more than {} tokens and truncation is off", self.settings.max_tokens),
            ));
        }
        Ok(Tokenized { ids: encoding.get_ids().to_vec(), second_segment: None })
    }

    /// A cross-encoder's (query, document) pair as one sequence, as its tokenizer joins a pair
    /// (`<s> query </s></s> document </s>`; BERT's `[CLS] query [SEP] document [SEP]`, the
    /// document and its `[SEP]` of token type 1), cut at `max_tokens` longest-first as
    /// sentence-transformers' `CrossEncoder` cuts it. Per-pair failures as
    /// [`Embedder::tokenize`]'s, and `TokenizerFailed` for types other than 0…0 1…1; an empty
    /// document is scored as it is. A decoder reranker's pair is its manifest's template around
    /// query and document instead ([`YesNoPairs`]).
    pub fn tokenize_pair(&self, query: &str, document: &str, truncate: bool) -> Result<Tokenized, RecordFailure> {
        if query.trim().is_empty() {
            return Err(RecordFailure::new(ErrorCode::EmptyText, "the query is empty or only whitespace"));
        }
        if query.len() + document.len() > MAX_TEXT_LEN {
            return Err(RecordFailure::new(ErrorCode::TooLarge, format!("query and document exceed {MAX_TEXT_LEN} bytes")));
        }
        if let Some(yesno) = &self.yesno {
            return yesno.tokenize(&self.tokenizer, query, document, truncate, self.settings.max_tokens);
        }
        let encoding = self
            .tokenizer
            .encode_fast((query, document), true)
            .map_err(|e| RecordFailure::new(ErrorCode::TokenizerFailed, e.to_string()))?;
        if !truncate && !encoding.get_overflowing().is_empty() {
            return Err(RecordFailure::new(
                ErrorCode::TooManyTokens,
                format!("more than {} tokens and truncation is off", self.settings.max_tokens),
            ));
        }
        let second_segment = if self.pair_types { second_segment(encoding.get_type_ids())? } else { None };
        Ok(Tokenized { ids: encoding.get_ids().to_vec(), second_segment })
    }

    /// Embeds one batch and returns one vector per member, in order: the encoder (packed tokens
    /// with the fused backend; right-padded with an attention mask and zero token types with
    /// CandleBert), then mean, CLS or last-token pooling over each member's real tokens and, if `normalize`,
    /// L2 normalisation. Runs on the calling thread's rayon pool (see the module docs).
    pub fn embed_batch(
        &self,
        batch: &[&Tokenized],
        normalize: bool,
        precision: Precision,
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let pooled = self.embed_batch_as(batch, self.settings.pooling.output(), normalize, precision)?;
        Ok(pooled.into_iter().map(|p| match p {
            Pooled::Vector(vector) => vector,
            Pooled::Sparse(sparse) => sparse.to_dense(),
        }).collect())
    }

    /// [`Embedder::embed_batch`] for a job's `output`: the pooling's own, or a bge-m3 head's
    /// (sparse weights, or the ColBERT vectors row after row).
    pub fn embed_batch_as(
        &self,
        batch: &[&Tokenized],
        output: OutputKind,
        normalize: bool,
        precision: Precision,
    ) -> Result<Vec<Pooled>, InferenceError> {
        self.check_precision(precision)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let h = self.hidden_size;
        let mut out = Vec::with_capacity(batch.len());
        match &self.model {
            Model::Fused(encoder) => {
                // Each member at its own precision ([`Embedder::precision_for`]): in an int8 job
                // the short ones and the others are two packed groups, one forward pass each.
                // Batches are sorted by length, so only the one at the boundary has both.
                let at = |t: &&Tokenized| self.precision_for(precision, t.tokens());
                let first = at(&batch[0]);
                if batch.iter().all(|t| at(t) == first) {
                    let sequences: Vec<&[u32]> = batch.iter().map(|t| t.ids.as_slice()).collect();
                    let segments: Vec<Option<usize>> = batch.iter().map(|t| t.second_segment).collect();
                    encoder.forward(&sequences, token_types(&segments), first, |states| {
                        let mut start = 0;
                        for tokenized in batch {
                            let n = tokenized.ids.len();
                            out.push(self.pool(&tokenized.ids, &states[start * h..(start + n) * h], output, normalize)?);
                            start += n;
                        }
                        Ok::<_, InferenceError>(())
                    })??;
                } else {
                    out.resize(batch.len(), Pooled::Vector(Vec::new()));
                    let (same, other): (Vec<usize>, Vec<usize>) = (0..batch.len()).partition(|&i| at(&batch[i]) == first);
                    for members in [same, other] {
                        let sequences: Vec<&[u32]> = members.iter().map(|&i| batch[i].ids.as_slice()).collect();
                        let segments: Vec<Option<usize>> = members.iter().map(|&i| batch[i].second_segment).collect();
                        encoder.forward(&sequences, token_types(&segments), at(&batch[members[0]]), |states| {
                            let mut start = 0;
                            for &i in &members {
                                let n = batch[i].ids.len();
                                out[i] = self.pool(&batch[i].ids, &states[start * h..(start + n) * h], output, normalize)?;
                                start += n;
                            }
                            Ok::<_, InferenceError>(())
                        })??;
                    }
                }
            }
            #[cfg(feature = "candle")]
            Model::Candle(model) => {
                let sequences: Vec<&[u32]> = batch.iter().map(|t| t.ids.as_slice()).collect();
                let (states, cols) = model.forward(&sequences, h)?;
                for (row, tokenized) in batch.iter().enumerate() {
                    // Right padding: the first n positions are the real tokens.
                    let start = row * cols * h;
                    out.push(self.pool(&tokenized.ids, &states[start..start + tokenized.ids.len() * h], output, normalize)?);
                }
            }
        }
        Ok(out)
    }

    /// Pools the states of one sequence's real tokens (`n × hidden`), then the Dense modules (if
    /// any), then normalises if asked; SPLADE's and a cross-encoder's heads in place of both.
    /// bge-m3's heads for their outputs.
    fn pool(&self, ids: &[u32], states: &[f32], output: OutputKind, normalize: bool) -> Result<Pooled, InferenceError> {
        let h = self.hidden_size;
        let missing = || InferenceError::Settings(format!("the model computes no {} output", output.as_str()));
        if output != self.settings.pooling.output() {
            return match output {
                OutputKind::Sparse => Ok(Pooled::Sparse(self.lexical.as_ref().ok_or_else(missing)?.weights(ids, states)?)),
                // FlagEmbedding's `colbert_linear(h[:, 1:])`: every token after the first.
                OutputKind::MultiVector => Ok(Pooled::Vector(self.colbert.as_ref().ok_or_else(missing)?.vectors(&states[h.min(states.len())..])?)),
                OutputKind::Dense | OutputKind::Scores => Err(missing()),
            };
        }
        self.pool_own(states, normalize).map(Pooled::Vector)
    }

    /// The pooling's own output for one sequence.
    fn pool_own(&self, states: &[f32], normalize: bool) -> Result<Vec<f32>, InferenceError> {
        let h = self.hidden_size;
        let n = (states.len() / h).max(1);
        let vector: Vec<f32> = match self.settings.pooling {
            Pooling::Splade => self.splade.as_ref().expect("loaded with splade pooling").pool(states)?,
            Pooling::Rerank { .. } => vec![self.classifier.as_ref().expect("loaded with rerank pooling").score(states)?],
            Pooling::RerankYesNo { .. } => vec![self.yesno.as_ref().expect("loaded with rerank_yesno pooling").head.score(states)],
            // Each row normalised by the head: no pooled projection, no normalisation of the whole.
            Pooling::MultiVector => return self.multivector.as_ref().expect("loaded with multivector pooling").vectors(states),
            Pooling::Cls => states[..h].to_vec(),
            // The sequence's last token: with the tokenizer's `<|endoftext|>` appended (and kept
            // by truncation), the token that has seen every other in a causal model.
            Pooling::LastToken => states[(n - 1) * h..n * h].to_vec(),
            Pooling::Mean => {
                let mut acc = vec![0f64; h];
                for token in states.chunks_exact(h) {
                    for (a, &v) in acc.iter_mut().zip(token) {
                        *a += f64::from(v);
                    }
                }
                acc.iter().map(|&a| (a / n as f64) as f32).collect()
            }
        };
        let mut vector = self.projection.apply(vector);
        if normalize {
            l2_normalize(&mut vector);
        }
        Ok(vector)
    }

    /// Bytes the model holds now: the fused encoder's weights as measured (bf16/int8 copies
    /// included once built) plus an estimate for the tokenizer (its vocabulary maps, about
    /// `TOKENIZER_BYTES_PER_TOKEN` per entry). `None` for the candle backend, whose tensors
    /// are not measured here: the caller counts the weights file instead.
    pub fn memory_bytes(&self) -> Option<u64> {
        #[cfg_attr(not(feature = "candle"), allow(irrefutable_let_patterns))]
        let Model::Fused(encoder) = &self.model else { return None };
        let head = self.splade.as_ref().map_or(0, SpladeHead::memory_bytes)
            + self.classifier.as_ref().map_or(0, ClassifierHead::memory_bytes)
            + self.multivector.as_ref().map_or(0, MultiVectorHead::memory_bytes)
            + self.lexical.as_ref().map_or(0, LexicalHead::memory_bytes)
            + self.colbert.as_ref().map_or(0, MultiVectorHead::memory_bytes)
            + self.yesno.as_ref().map_or(0, |y| y.head.memory_bytes());
        Some((encoder.memory_bytes() + head + self.projection.memory_bytes() + self.tokenizer.get_vocab_size(true) * TOKENIZER_BYTES_PER_TOKEN) as u64)
    }
}

/// A decoder reranker's pairs: the manifest's template around query and document, tokenized whole
/// without added special tokens (as transformers tokenizes a chat render), cut on the right at
/// `max_tokens`; a pair that reaches `max_tokens` gets the template's tail written back over its
/// last tokens, as sentence-transformers 6.2 restores it (`Transformer._restore_chat_template_suffix`:
/// the longest common token suffix of two renders with "0" and "1 2 3 4" for query and document).
struct YesNoPairs {
    head: YesNoHead,
    template: RerankTemplate,
    tail: Vec<u32>,
}

impl YesNoPairs {
    fn new(head: YesNoHead, template: &RerankTemplate, tokenizer: &Tokenizer) -> Result<Self, InferenceError> {
        let mut whole = tokenizer.clone();
        whole.with_truncation(None).map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
        let render = |filler: &str| -> Result<Vec<u32>, InferenceError> {
            let encoding = whole.encode_fast(template.render(filler, filler), false).map_err(|e| InferenceError::Tokenizer(e.to_string()))?;
            Ok(encoding.get_ids().to_vec())
        };
        let (a, b) = (render("0")?, render("1 2 3 4")?);
        let common = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
        // As sentence-transformers: renders that never diverge have no tail it trusts.
        let tail = if common > 0 && common < a.len().min(b.len()) { a[a.len() - common..].to_vec() } else { Vec::new() };
        Ok(Self { head, template: template.clone(), tail })
    }

    fn tokenize(&self, tokenizer: &Tokenizer, query: &str, document: &str, truncate: bool, max_tokens: usize) -> Result<Tokenized, RecordFailure> {
        let encoding = tokenizer
            .encode_fast(self.template.render(query, document), false)
            .map_err(|e| RecordFailure::new(ErrorCode::TokenizerFailed, e.to_string()))?;
        if !truncate && !encoding.get_overflowing().is_empty() {
            return Err(RecordFailure::new(ErrorCode::TooManyTokens, format!("more than {max_tokens} tokens and truncation is off")));
        }
        let mut ids = encoding.get_ids().to_vec();
        if ids.len() >= max_tokens {
            let keep = self.tail.len().min(ids.len());
            let at = ids.len() - keep;
            ids[at..].copy_from_slice(&self.tail[self.tail.len() - keep..]);
        }
        Ok(Tokenized { ids, second_segment: None })
    }
}

/// Single texts, or pairs where any member has a second segment.
fn token_types(segments: &[Option<usize>]) -> TokenTypes<'_> {
    if segments.iter().any(Option::is_some) { TokenTypes::Pairs(segments) } else { TokenTypes::Single }
}

/// Where a pair's token type 1 starts: its types must be 0…0 then 1…1.
fn second_segment(types: &[u32]) -> Result<Option<usize>, RecordFailure> {
    let start = types.iter().position(|&t| t != 0);
    if start.is_some_and(|s| types[s..].iter().any(|&t| t != 1)) {
        return Err(RecordFailure::new(ErrorCode::TokenizerFailed, "the pair's token types are not 0…0 then 1…1"));
    }
    Ok(start)
}

/// A sequence-classification model's labels as transformers counts them: `id2label`'s entries,
/// else `num_labels`, else its default of 2.
fn labels(config: &[u8]) -> Result<usize, InferenceError> {
    let config: serde_json::Value = serde_json::from_slice(config).map_err(|e| InferenceError::Config(e.to_string()))?;
    Ok(match (config.get("id2label").and_then(serde_json::Value::as_object), config.get("num_labels").and_then(serde_json::Value::as_u64)) {
        (Some(labels), _) => labels.len(),
        (None, Some(n)) => n as usize,
        (None, None) => 2,
    })
}

/// A vocabulary entry in both of a tokenizer's maps (token → id, id → token): two strings'
/// headers and text, the id and the hash tables' overhead.
const TOKENIZER_BYTES_PER_TOKEN: usize = 96;

/// `v / max(‖v‖₂, 1e-12)`, as sentence-transformers' `Normalize` (torch `F.normalize`).
pub(crate) fn l2_normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt().max(1e-12);
    for v in vector.iter_mut() {
        *v = (f64::from(*v) / norm) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair's types 0…0 1…1 give where type 1 starts; all 0 give none; any other order is
    /// refused by name rather than embedded as something the reference never computes.
    #[test]
    fn a_pairs_second_segment_is_where_its_types_turn_to_one() {
        assert_eq!(second_segment(&[0, 0, 0, 1, 1]).unwrap(), Some(3));
        assert_eq!(second_segment(&[0, 0, 0]).unwrap(), None);
        for types in [&[0, 1, 0][..], &[0, 2, 2], &[0, 1, 2]] {
            let refused = second_segment(types).unwrap_err();
            assert_eq!(refused.code, ErrorCode::TokenizerFailed, "{types:?}");
        }
    }
}
