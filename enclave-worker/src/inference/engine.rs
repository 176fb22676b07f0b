//! The serving side: a thread pool, token-budget batching inside a bounded reorder window, and
//! metrics.

use std::sync::Arc;
use std::time::Instant;

use protocol::envelope::{JobOptions, OutputDtype, OutputKind, Precision};
use protocol::manifest::Manifest;
use protocol::quantize::Ranges;
use protocol::records::{ErrorCode, InputRecord, OutputRecord, RerankInput};
use rayon::prelude::*;

use super::awake;
use super::batching::{BatchLimits, plan_batches};
use super::embedder::{Embedder, Pooled, Tokenized};
use super::metrics::{Metrics, MetricsSnapshot};
use super::{Embedding, InferenceError, RecordFailure};

/// How an [`Engine`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSettings {
    /// Threads of the engine's rayon pool; 0 means `std::thread::available_parallelism()`.
    pub threads: usize,
    /// Token budget and batch-size cap of one batch.
    pub limits: BatchLimits,
    /// [`Engine::embed_stream`] closes a window after this many records…
    pub window_records: usize,
    /// …or once the window's texts add up to this many bytes, whichever comes first.
    pub window_bytes: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self { threads: 0, limits: BatchLimits::default(), window_records: 1024, window_bytes: 16 << 20 }
    }
}

/// Per-job choices that affect inference (from the sealed job header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Truncate texts over the model's maximum; if false they fail with `TooManyTokens`.
    pub truncate: bool,
    /// L2-normalise the vectors.
    pub normalize: bool,
    /// Compute precision of the dense layers; anything but fp32 is the client's explicit choice,
    /// recorded in the receipt.
    pub precision: Precision,
    /// Text put before every text, as sentence-transformers does with a prompt (the text of one
    /// of the manifest's named prompts).
    pub prompt: Option<Arc<str>>,
    /// Keep the first this many values of each pooled vector (Matryoshka), then normalise.
    pub dimensions: Option<usize>,
    /// The job's ranges for `int8`/`uint8` output, one per value of its vectors.
    pub ranges: Option<Arc<Ranges>>,
    /// Dense vectors, or the sparse form of a SPLADE model's (keeping the `top_k` largest weights).
    pub output: OutputKind,
    pub top_k: Option<u32>,
    /// A multi-vector job's vector width and bound on one record's bytes.
    pub multivector: Option<MultiVectorOutput>,
}

/// What a multi-vector record is checked against before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiVectorOutput {
    /// The model's token-vector width.
    pub dimensions: usize,
    /// The job's `max_record_bytes`: a record over it fails alone (`output_too_large`).
    pub max_record_bytes: u32,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self {
            truncate: true,
            normalize: true,
            precision: Precision::Fp32,
            prompt: None,
            dimensions: None,
            ranges: None,
            output: OutputKind::Dense,
            top_k: None,
            multivector: None,
        }
    }
}

impl EmbedOptions {
    /// The inference part of a job's options, for this embedder and its signed manifest. What it
    /// cannot serve exactly as asked is refused, never served otherwise (the receipt records the
    /// options): a precision it cannot compute at, a prompt the manifest does not name, a
    /// dimension count the manifest does not offer, ranges for another number of dimensions.
    pub fn for_job(options: &JobOptions, embedder: &Embedder, manifest: &Manifest) -> Result<Self, InferenceError> {
        embedder.check_precision(options.precision)?;
        // The manifest's pooling gives one kind; bge-m3's heads, listed in its `outputs`, others.
        // A head's width is checked against the manifest here; the pooling's own at load.
        let computed = embedder.output_dimensions(options.output);
        let offered = manifest.output_dimensions(options.output).map(|d| d as usize);
        let own = options.output == manifest.pooling.output();
        if computed.is_none() || offered.is_none() || (!own && offered != computed) {
            let gives = manifest.offered_outputs().iter().map(|(kind, _)| kind.as_str()).collect::<Vec<_>>().join(", ");
            return Err(InferenceError::OutputNotOffered { asked: options.output.as_str(), gives });
        }
        if options.output != OutputKind::Dense && options.normalize {
            // SparseEncoder's weights and CrossEncoder's scores are never normalised.
            return Err(InferenceError::Normalized(options.output.as_str()));
        }
        let multivector = match (options.output, options.max_record_bytes) {
            (OutputKind::MultiVector, Some(max_record_bytes)) => Some(MultiVectorOutput { dimensions: computed.unwrap_or(0), max_record_bytes }),
            (OutputKind::MultiVector, None) => return Err(InferenceError::Settings("a multivector job states max_record_bytes".into())),
            _ => None,
        };
        let prompt = match &options.prompt {
            None => None,
            Some(name) => Some(Arc::from(
                manifest.prompts.get(name).ok_or_else(|| InferenceError::UnknownPrompt(name.clone()))?,
            )),
        };
        let dimensions = match options.dimensions {
            None => None,
            Some(asked) if manifest.offers_dimensions(asked) => Some(asked as usize),
            Some(asked) => {
                return Err(InferenceError::DimensionsNotOffered { asked, offered: manifest.offered_dimensions() });
            }
        };
        let ranges = match &options.ranges {
            None => None,
            Some(ranges) => {
                let vectors = dimensions.unwrap_or(embedder.dimensions());
                if ranges.dimensions() != vectors {
                    return Err(InferenceError::RangesDimensions { ranges: ranges.dimensions(), vectors });
                }
                Some(Arc::new(ranges.clone()))
            }
        };
        Ok(Self {
            truncate: options.truncate,
            normalize: options.normalize,
            precision: options.precision,
            prompt,
            dimensions,
            ranges,
            output: options.output,
            top_k: options.top_k,
            multivector,
        })
    }
}

/// Embeds windows of records with one model on a dedicated thread pool. `Sync`: several jobs may
/// share it, their windows then take turns on the pool.
pub struct Engine {
    embedder: Arc<Embedder>,
    pool: Arc<rayon::ThreadPool>,
    settings: EngineSettings,
    metrics: Metrics,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("embedder", &self.embedder)
            .field("threads", &self.threads())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with its own pool of `settings.threads` threads.
    pub fn new(embedder: Arc<Embedder>, settings: EngineSettings) -> Result<Self, InferenceError> {
        let threads = if settings.threads == 0 {
            std::thread::available_parallelism().map(usize::from).unwrap_or(1)
        } else {
            settings.threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("inference-{i}"))
            .build()
            .map_err(|e| InferenceError::ThreadPool(e.to_string()))?;
        Ok(Self::with_pool(embedder, Arc::new(pool), settings))
    }

    /// An engine on an existing pool (e.g. one pool shared by the engines of several models).
    pub fn with_pool(embedder: Arc<Embedder>, pool: Arc<rayon::ThreadPool>, settings: EngineSettings) -> Self {
        Self { embedder, pool, settings, metrics: Metrics::default() }
    }

    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Counters since the engine was built.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Embeds one window of texts: tokenizes them in parallel, plans length-sorted batches under
    /// the token budget (padding only within a batch), runs them, and returns one result per
    /// text **in input order**. Memory is proportional to the window, so callers bound it (see
    /// [`Engine::embed_stream`]). A batch whose forward pass fails turns its records into
    /// `InferenceFailed`; nothing is dropped.
    pub fn embed_window<T>(&self, texts: &[T], options: &EmbedOptions) -> Vec<Result<Embedding, RecordFailure>>
    where
        T: AsRef<[u8]> + Sync,
    {
        self.run_awake(|| self.embed_window_here(texts, options))
    }

    /// `work` on this engine's pool, its threads kept awake until it returns ([`awake`]).
    fn run_awake<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        self.pool.install(|| awake::run(work))
    }

    fn embed_window_here<T>(&self, texts: &[T], options: &EmbedOptions) -> Vec<Result<Embedding, RecordFailure>>
    where
        T: AsRef<[u8]> + Sync,
    {
        let started = Instant::now();
        let tokenized: Vec<Result<Tokenized, RecordFailure>> =
            texts.par_iter().map(|text| self.embedder.tokenize_prompted(text.as_ref(), options.prompt.as_deref(), options.truncate)).collect();
        self.metrics.add_window(started.elapsed());
        self.run_tokenized(&tokenized, options)
    }

    /// The sequences of a window, tokenized (or failed), run in length-sorted batches; one result
    /// per sequence in order.
    fn run_tokenized(&self, tokenized: &[Result<Tokenized, RecordFailure>], options: &EmbedOptions) -> Vec<Result<Embedding, RecordFailure>> {
        let mut results: Vec<Option<Result<Embedding, RecordFailure>>> = Vec::with_capacity(tokenized.len());
        let mut ready: Vec<(usize, &Tokenized)> = Vec::with_capacity(tokenized.len());
        let mut failed = 0u64;
        for (index, outcome) in tokenized.iter().enumerate() {
            match outcome {
                Ok(tokens) => {
                    results.push(None);
                    ready.push((index, tokens));
                }
                Err(failure) => {
                    failed += 1;
                    results.push(Some(Err(failure.clone())));
                }
            }
        }

        let lengths: Vec<usize> = ready.iter().map(|(_, t)| t.tokens()).collect();
        for batch in plan_batches(&lengths, self.settings.limits) {
            let members: Vec<&Tokenized> = batch.members.iter().map(|&m| ready[m].1).collect();
            let started = Instant::now();
            match self.embedder.embed_batch_as(&members, options.output, options.normalize, options.precision) {
                Ok(vectors) => {
                    let real: usize = members.iter().map(|t| t.tokens()).sum();
                    let processed = if self.embedder.pads_batches() { batch.padded_tokens() } else { real };
                    self.metrics.add_batch(members.len() as u64, real as u64, processed as u64, started.elapsed());
                    for (&m, pooled) in batch.members.iter().zip(vectors) {
                        let (index, tokens) = ready[m];
                        let tokens = tokens.tokens() as u32;
                        let embedding = match pooled {
                            Pooled::Vector(mut vector) => {
                                shorten(&mut vector, options);
                                Embedding { vector, tokens, sparse: None }
                            }
                            Pooled::Sparse(sparse) => Embedding { vector: Vec::new(), tokens, sparse: Some(sparse) },
                        };
                        results[index] = Some(Ok(embedding));
                    }
                }
                Err(error) => {
                    failed += members.len() as u64;
                    for &m in &batch.members {
                        results[ready[m].0] =
                            Some(Err(RecordFailure::new(ErrorCode::InferenceFailed, error.to_string())));
                    }
                }
            }
        }
        self.metrics.add_failed(failed);
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(RecordFailure::new(ErrorCode::InferenceFailed, "not planned"))))
            .collect()
    }

    /// Scores each record's documents against its query (a cross-encoder's job: the record's
    /// text is a [`RerankInput`]): every (query, document) pair one sequence, all of the window's
    /// pairs batched together; one result per record, in order, whose vector holds a score per
    /// document and whose tokens are its pairs'. A record fails as its first failing pair does.
    pub fn rerank_window(&self, texts: &[&[u8]], options: &EmbedOptions) -> Vec<Result<Embedding, RecordFailure>> {
        self.run_awake(|| {
            let started = Instant::now();
            let inputs: Vec<Result<RerankInput, RecordFailure>> =
                texts.iter().map(|text| RerankInput::parse(text).map_err(|(code, message)| RecordFailure::new(code, message))).collect();
            // The window's pairs, record after record: a record's results are the next
            // `documents.len()` of them.
            let pairs: Vec<(&str, &str)> = inputs
                .iter()
                .flatten()
                .flat_map(|input| input.documents.iter().map(|d| (input.query.as_str(), d.as_str())))
                .collect();
            let tokenized: Vec<Result<Tokenized, RecordFailure>> =
                pairs.par_iter().map(|&(query, document)| self.embedder.tokenize_pair(query, document, options.truncate)).collect();
            self.metrics.add_window(started.elapsed());
            let mut scored = self.run_tokenized(&tokenized, options).into_iter();
            inputs
                .into_iter()
                .map(|input| {
                    let input = input?;
                    let mut embedding = Embedding { vector: Vec::with_capacity(input.documents.len()), tokens: 0, sparse: None };
                    let mut failure = None;
                    for (document, result) in scored.by_ref().take(input.documents.len()).enumerate() {
                        match result {
                            Ok(pair) => {
                                embedding.vector.push(pair.vector[0]);
                                embedding.tokens += pair.tokens;
                            }
                            Err(f) => {
                                failure.get_or_insert(RecordFailure::new(f.code, format!("document {document}: {}", f.message)));
                            }
                        }
                    }
                    failure.map_or(Ok(embedding), Err)
                })
                .collect()
        })
    }

    /// [`Engine::embed_window`] (or [`Engine::rerank_window`] for scores) for protocol records:
    /// one output record per input record, same order, vectors in `dtype`.
    pub fn embed_records(
        &self,
        records: &[InputRecord],
        options: &EmbedOptions,
        dtype: OutputDtype,
    ) -> Vec<OutputRecord> {
        let texts: Vec<&[u8]> = records.iter().map(|r| r.text.as_slice()).collect();
        let results = match options.output {
            OutputKind::Scores => self.rerank_window(&texts, options),
            OutputKind::Dense | OutputKind::Sparse | OutputKind::MultiVector => self.embed_window(&texts, options),
        };
        records
            .iter()
            .zip(results)
            .map(|(record, result)| match result {
                Ok(embedding) => embedding.into_output(record.id.clone(), dtype, options),
                Err(failure) => failure.into_output(record.id.clone()),
            })
            .collect()
    }

    /// Runs a stream of records through consecutive bounded windows
    /// ([`EngineSettings::window_records`] records or [`EngineSettings::window_bytes`] bytes) and
    /// hands every output record to `sink` in input order. Memory stays flat whatever the number
    /// of records. Stops at the first error of `sink`. Returns the number of records emitted.
    pub fn embed_stream<I, F, E>(
        &self,
        records: I,
        options: &EmbedOptions,
        dtype: OutputDtype,
        mut sink: F,
    ) -> Result<u64, E>
    where
        I: IntoIterator<Item = InputRecord>,
        F: FnMut(OutputRecord) -> Result<(), E>,
    {
        let max_records = self.settings.window_records.max(1);
        let mut window: Vec<InputRecord> = Vec::with_capacity(max_records.min(4096));
        let mut bytes = 0usize;
        let mut emitted = 0u64;
        let mut flush = |window: &mut Vec<InputRecord>, emitted: &mut u64| -> Result<(), E> {
            for output in self.embed_records(window, options, dtype) {
                sink(output)?;
                *emitted += 1;
            }
            window.clear();
            Ok(())
        };
        for record in records {
            bytes += record.text.len();
            window.push(record);
            if window.len() >= max_records || bytes >= self.settings.window_bytes {
                flush(&mut window, &mut emitted)?;
                bytes = 0;
            }
        }
        if !window.is_empty() {
            flush(&mut window, &mut emitted)?;
        }
        Ok(emitted)
    }
}

/// Matryoshka: the first `dimensions` values, normalised again when the job normalises (which
/// equals normalising the shortened pooled vector: normalisation does not depend on scale).
fn shorten(vector: &mut Vec<f32>, options: &EmbedOptions) {
    if let Some(dimensions) = options.dimensions
        && dimensions < vector.len()
    {
        vector.truncate(dimensions);
        if options.normalize {
            super::embedder::l2_normalize(vector);
        }
    }
}
