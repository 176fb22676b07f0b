//! `ephem-batch submit`: check each line locally, verify the published attestation against the
//! policy, seal the record stream to the attested fleet key, and upload it — the upload event
//! creates the job (DESIGN.md §5 steps 1–3).
//!
//! Lines refused locally never leave the machine: they go to the job's local errors file and
//! reappear in the results' errors file.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use cloud::{layout, ObjectStore, PutCondition, Services};
use indicatif::ProgressBar;

use crate::progress::bar;
use cloud::ObjectWriter;
use protocol::envelope::{self, JobHeader, JobId, JobOptions, OutputDtype, OutputKind, Precision, ResultSecretKey};
use protocol::manifest::Manifest;
use protocol::records::encode_input;
use sha2::{Digest, Sha256};

use batch_formats::corpus_file::{check_corpus_file, CorpusFileError};

use crate::corpus::{count_records, CorpusForm, CorpusItem, CorpusOptions, CorpusReader, CorpusSummary};
use crate::home::Home;
pub use crate::model_choice::CheckedModel;
use crate::model_choice::{choose_model, ModelPins};
use crate::jobstate::{ClientJob, IdsDigest, JobFiles};
use crate::trust::{current_enclave, ClientTrust, PublishedEnclave, TrustArgs};

pub const DEFAULT_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// Records per shard of `submit --bulk`: each shard is one job, so this is the unit one host
/// embeds (a few minutes of work) and the unit retried.
pub const DEFAULT_SHARD_RECORDS: u64 = 10_000;
pub const DEFAULT_STORE: &str = "default";
/// Plaintext is sealed in pieces of this size (the STREAM chunk size is 64 KiB).
const SEAL_PIECE: usize = 256 * 1024;

/// The precisions a worker computes at (`--precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    Fp32,
    Bf16,
    Int8,
}

#[derive(Args, Debug, Clone)]
pub struct SubmitArgs {
    /// The corpus: JSON lines, `{"id", "text"}` or OpenAI Batch embedding requests.
    pub file: PathBuf,
    /// Model id (a published, signed manifest must exist for it).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Use exactly this signed version of the model (default: the newest, never below the
    /// publisher's signed minimum nor below what this client has seen).
    #[arg(long, value_name = "N")]
    pub model_version: Option<u64>,
    /// Use exactly the manifest with this SHA-256 (64 hex digits, as receipts name it).
    #[arg(long, value_name = "HEX")]
    pub manifest_sha256: Option<String>,
    /// Wait for the job, then download, open and verify the results.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up waiting after this many seconds (the job goes on; exit 1 with its
    /// state). Default: a day.
    #[arg(long, value_name = "SECONDS")]
    pub wait_timeout: Option<u64>,
    /// Where `--wait` writes results (default: beside the input, `<stem>.embeddings.<ext>`).
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Output format for `--wait` (default: `openai` for OpenAI Batch input, else `jsonl`).
    #[arg(long, value_enum)]
    pub format: Option<crate::results::Format>,
    /// Vectors as f16 instead of f32 (half the size); the same as `--dtype f16`.
    #[arg(long, conflicts_with = "dtype")]
    pub f16: bool,
    /// Element type of the vectors: `f32`, `f16`, or a compact encoding computed in the enclave
    /// as sentence-transformers' `quantize_embeddings` does: `int8`/`uint8` (a byte per value, by
    /// the `--ranges` given), `binary`/`ubinary` (a bit per value, `v > 0`, packed). The receipt
    /// records it (and the ranges).
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<OutputDtype>,
    /// With `--dtype int8|uint8`: the per-dimension ranges, a `.npy` of shape (2, N) float32
    /// (row 0 the minima, row 1 the maxima; `ephem-batch ranges` computes one from a job's f32
    /// vectors).
    #[arg(long, value_name = "NPY")]
    pub ranges: Option<PathBuf>,
    /// What the records carry: `dense` vectors, `sparse` ones (the nonzero weights of a SPLADE
    /// model, by token id; never normalised) or `scores` (a cross-encoder's, one per document of
    /// each `{"id", "query", "documents"}` line) or `multivector` (a ColBERT model's vector per
    /// token, each unit-length). Default: what the model gives, which the signed
    /// manifest says (its pooling); another kind is refused.
    #[arg(long, value_name = "KIND", value_parser = parse_output_kind)]
    pub output_kind: Option<OutputKind>,
    /// Sparse output: keep each record's N largest weights (sentence-transformers'
    /// `max_active_dims`). Default: every nonzero weight.
    #[arg(long, value_name = "N")]
    pub top_k: Option<u32>,
    /// Multi-vector output: the most bytes one record's vectors may take (tokens × dimensions ×
    /// 4); a record over it fails alone (`output_too_large`). Default: 1 MiB.
    #[arg(long, value_name = "BYTES")]
    pub max_record_bytes: Option<u32>,
    /// Refuse texts longer than the model's maximum instead of truncating them.
    #[arg(long)]
    pub no_truncate: bool,
    /// Do not L2-normalise the vectors.
    #[arg(long)]
    pub no_normalize: bool,
    /// Compute precision of the model's dense layers. `bf16` is faster on AMX tiles and on AMD's
    /// cores with AVX-512 BF16 and stays at cosine ≥ 0.999 to fp32; `int8` (CPUs with AVX-512
    /// VNNI or AVX2) is faster still, at the same bound (texts of at most 8 tokens run wider in
    /// it; docs/benchmarks.md). The
    /// receipt records it and how it computed, and a worker that cannot compute at it refuses
    /// the job rather than serving another precision.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Fp32)]
    pub precision: PrecisionArg,
    /// Put one of the model's named prompts (its signed manifest's, e.g. `query`, `passage`)
    /// before every text, as sentence-transformers' `prompt_name` does; `none` for no prompt.
    /// Default: the model's default prompt, if it names one. The receipt records it.
    #[arg(long, value_name = "NAME")]
    pub prompt: Option<String>,
    /// Vectors of N values: one of the Matryoshka lengths the model's signed manifest offers
    /// (the first N values, normalised again). The receipt records it.
    #[arg(long, value_name = "N")]
    pub dimensions: Option<u32>,
    /// Print the job as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Seal the corpus into shards of `--shard-records` records, each an ordinary job, upload
    /// them under the store prefix `stores/<store>/incoming/<bulk_id>/` (each shard becomes a
    /// job there) and start the bulk workflow over them (`ephem-batch bulk …`).
    #[arg(long)]
    pub bulk: bool,
    /// With --bulk: records per shard (an OpenAI request line is never split across shards).
    #[arg(long, default_value_t = DEFAULT_SHARD_RECORDS, value_name = "N")]
    pub shard_records: u64,
    /// With --bulk: the store the shards go to (`stores/<store>/incoming/`).
    #[arg(long, default_value = DEFAULT_STORE, value_name = "NAME")]
    pub store: String,
    /// With --bulk --wait: write the committed shards' results even if some shard did not
    /// commit (by default nothing is written then).
    #[arg(long)]
    pub partial: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Counts bytes written and hashes them on the way to the object store.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    progress: ProgressBar,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Counts bytes read from the corpus, for the progress bar.
struct CountingReader<R> {
    inner: R,
    progress: ProgressBar,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.inc(n as u64);
        Ok(n)
    }
}

/// What every job of one submission shares: the attested fleet key, the checked model, the
/// client's result key, the options.
pub struct Sealing {
    pub trust: ClientTrust,
    pub enclave: PublishedEnclave,
    pub model: CheckedModel,
    pub result_key: ResultSecretKey,
    pub corpus_options: CorpusOptions,
    pub options: JobOptions,
    pub now_ms: u64,
}

impl Sealing {
    /// Verifies the published attestation against the policy and the model's manifest.
    pub fn prepare(home: &Home, services: &Services, args: &SubmitArgs) -> anyhow::Result<Sealing> {
        let trust = ClientTrust::load(home, &args.trust)?;
        trust.warn_if_development();
        let now_ms = cloud::now_ms();
        let enclave = current_enclave(services, &trust, now_ms)?;
        let pins = ModelPins::parse(args.model_version, args.manifest_sha256.as_deref())?;
        let image_pcr0 = enclave.verified.document.pcrs.get(&0).cloned().unwrap_or_default();
        let model = choose_model(services.models.as_ref(), &args.model, &trust.model_publisher, home, &pins, &image_pcr0)?;
        eprintln!("model {} v{} manifest {} ({})", model.manifest.model_id, model.manifest.version, hex::encode(model.hash), model.key);
        let result_key = crate::keys::load_result_key(&home.result_key(), true)?;
        let (prompt, dimensions) = shaping(&model.manifest, args.prompt.as_deref(), args.dimensions)?;
        let dtype = args.dtype.unwrap_or(if args.f16 { OutputDtype::F16 } else { OutputDtype::F32 });
        let ranges = crate::ranges::for_job(dtype, args.ranges.as_deref(), dimensions.unwrap_or(model.manifest.dimensions))?;
        let (output, top_k) = output_kind(&model.manifest, args.output_kind, args.top_k)?;
        let max_record_bytes = max_record_bytes(output, args.max_record_bytes)?;
        if let Some(format) = args.format {
            format.check_writes(output)?;
        }
        let mut corpus_options = CorpusOptions::new(args.model.clone());
        corpus_options.dimensions = Some(dimensions.unwrap_or(model.manifest.output_dimensions(output).unwrap_or(model.manifest.dimensions)));
        // A cross-encoder's lines are {"id", "query", "documents"}.
        corpus_options.rerank = Some(output == OutputKind::Scores);
        let options = JobOptions {
            truncate: !args.no_truncate,
            // SPLADE weights and cross-encoder scores are never normalised (no Normalize module);
            // a ColBERT model normalises each token vector itself.
            normalize: !args.no_normalize && output == OutputKind::Dense,
            dtype,
            precision: match args.precision {
                PrecisionArg::Fp32 => Precision::Fp32,
                PrecisionArg::Bf16 => Precision::Bf16,
                PrecisionArg::Int8 => Precision::Int8,
            },
            prompt,
            dimensions,
            ranges,
            output,
            top_k,
            max_record_bytes,
        };
        Ok(Sealing { trust, enclave, model, result_key, corpus_options, options, now_ms })
    }

    /// A job header for `records` records, sealed to the fleet key; the job id derives from it.
    fn seal(&self, records: u64) -> anyhow::Result<(envelope::Sealed, JobId)> {
        let header = JobHeader {
            fleet_key_id: self.enclave.fleet.key_id(),
            epoch: self.enclave.binding.epoch,
            model_id: self.corpus_options.model_id.clone(),
            manifest_hash: self.model.hash,
            options: self.options.clone(),
            result_public_key: self.result_key.public_key().to_bytes(),
            record_count: records,
            created_ms: self.now_ms,
        };
        let sealed = envelope::seal_job(&header, &self.enclave.fleet)?;
        let job_id = JobId(sealed.stream_id);
        Ok((sealed, job_id))
    }

    /// What the client remembers about a job it sealed.
    fn client_job(&self, job_id: &JobId, input_file: &Path, form: Option<CorpusForm>, records: u64, errors: u64, sealed: &SealOutcome) -> ClientJob {
        ClientJob {
            job_id: *job_id,
            submitted_ms: self.now_ms,
            input_file: input_file.display().to_string(),
            form: form.map(|f| f.as_str().to_owned()),
            model_id: self.corpus_options.model_id.clone(),
            manifest_key: self.model.key.clone(),
            manifest_hash: hex::encode(self.model.hash),
            epoch: self.enclave.binding.epoch,
            fleet_key_id: hex::encode(self.enclave.fleet.key_id()),
            result_key_id: hex::encode(self.result_key.public_key().key_id()),
            attestation_sha256: hex::encode(Sha256::digest(&self.enclave.document)),
            development: self.trust.development,
            records,
            local_errors: errors,
            sealed_sha256: hex::encode(sealed.sealed_sha256),
            sealed_size: sealed.sealed_size,
            plaintext_sha256: hex::encode(sealed.plaintext_sha256),
            truncate: self.options.truncate,
            normalize: self.options.normalize,
            dtype: self.options.dtype.as_str().to_owned(),
            precision: self.options.precision.as_str().to_owned(),
            prompt: self.options.prompt.clone(),
            dimensions: self.options.dimensions,
            ranges_sha256: self.options.ranges.as_ref().map(crate::ranges::sha256_hex),
            output: (self.options.output != OutputKind::Dense).then(|| self.options.output.as_str().to_owned()),
            top_k: self.options.top_k,
            max_record_bytes: self.options.max_record_bytes,
            ids_sha256: Some(sealed.ids_sha256.clone()),
            uploaded_ms: None,
            downloaded: None,
        }
    }
}

/// The prompt and vector length a job asks for, checked against the model's signed manifest
/// before anything is sealed: a prompt it names (by default its default prompt; `none`: no
/// prompt), a length it offers (its own asks for nothing).
fn parse_output_kind(text: &str) -> Result<OutputKind, String> {
    OutputKind::parse(text).ok_or_else(|| format!("{text:?}: dense, sparse, scores or multivector"))
}

/// A multi-vector job's default bound on one record: 2,048 tokens of 128 f32 (ColBERT's width).
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 1 << 20;

/// The `max_record_bytes` a job states: a multi-vector job's (by default
/// [`DEFAULT_MAX_RECORD_BYTES`]), none for the other kinds (the flag is refused there).
pub fn max_record_bytes(output: OutputKind, asked: Option<u32>) -> anyhow::Result<Option<u32>> {
    match (output, asked) {
        (OutputKind::MultiVector, None) => Ok(Some(DEFAULT_MAX_RECORD_BYTES)),
        (OutputKind::MultiVector, Some(bytes)) if bytes > 0 && bytes <= protocol::envelope::MAX_RECORD_BYTES => Ok(Some(bytes)),
        (OutputKind::MultiVector, Some(bytes)) => bail!("--max-record-bytes {bytes}: 1..={}", protocol::envelope::MAX_RECORD_BYTES),
        (_, None) => Ok(None),
        (kind, Some(_)) => bail!("--max-record-bytes: for multivector output only; this job's is {}", kind.as_str()),
    }
}

/// The output kind a job asks for: the model's (its signed pooling says which it gives); another
/// is refused by flag, as is `--top-k` without sparse output.
pub fn output_kind(manifest: &Manifest, asked: Option<OutputKind>, top_k: Option<u32>) -> anyhow::Result<(OutputKind, Option<u32>)> {
    // The pooling's own kind unless the job asks for another the manifest's `outputs` offer (bge-m3).
    let gives = asked.unwrap_or(manifest.pooling.output());
    if manifest.output_dimensions(gives).is_none() {
        let offered = manifest.offered_outputs().iter().map(|(kind, _)| kind.as_str()).collect::<Vec<_>>().join(", ");
        bail!("--output-kind {}: model {} gives {offered} output ({} pooling)", gives.as_str(), manifest.model_id, manifest.pooling.as_str());
    }
    if top_k.is_some() && gives != OutputKind::Sparse {
        bail!("--top-k: for sparse output only; model {} gives {} vectors", manifest.model_id, gives.as_str());
    }
    if top_k == Some(0) {
        bail!("--top-k 0: keep at least one weight");
    }
    Ok((gives, top_k))
}

fn parse_dtype(text: &str) -> Result<OutputDtype, String> {
    OutputDtype::parse(text).ok_or_else(|| format!("{text:?}: one of f32, f16, int8, uint8, binary, ubinary"))
}

pub fn shaping(manifest: &Manifest, prompt: Option<&str>, dimensions: Option<u32>) -> anyhow::Result<(Option<String>, Option<u32>)> {
    let prompt = manifest.prompts.chosen(prompt);
    if let Some(name) = prompt.filter(|name| manifest.prompts.get(name).is_none()) {
        let named: Vec<&str> = manifest.prompts.entries.iter().map(|(n, _)| n.as_str()).collect();
        bail!("--prompt {name:?}: model {} names the prompts {named:?} (or `none`)", manifest.model_id);
    }
    let dimensions = match dimensions {
        None => None,
        Some(asked) if asked == manifest.dimensions => None,
        Some(asked) if manifest.offers_dimensions(asked) => Some(asked),
        Some(asked) => bail!(
            "--dimensions {asked}: model {} offers {:?} (Matryoshka lengths from its signed manifest)",
            manifest.model_id,
            manifest.offered_dimensions()
        ),
    };
    Ok((prompt.map(str::to_owned), dimensions))
}

/// The local checks of `args.file`, run before anything reaches the stack: it exists, is a
/// regular file this process can read, and yields at least one record (every line checked as
/// sealing checks it). The binary runs them before it opens a backend; [`run`] and
/// [`seal_bulk`] run them first too, for the callers that opened one already.
pub fn check_input(args: &SubmitArgs) -> Result<CorpusSummary, CorpusFileError> {
    check_corpus_file(&args.file, &CorpusOptions::new(args.model.clone()))
}

pub fn run(home: &Home, services: &Services, args: &SubmitArgs) -> anyhow::Result<ClientJob> {
    check_input(args)?;
    let sealing = Sealing::prepare(home, services, args)?;
    let job = seal_file(home, services, &sealing, &args.file)?;
    check_accepted(services, &job.job_id)?;
    if job.local_errors > 0 {
        let files = JobFiles::new(home, &job.job_id.to_hex());
        eprintln!("{} line(s) refused locally (never sent): {}", job.local_errors, files.local_errors().display());
    }
    Ok(job)
}

/// Seals `file` as one job, uploads it and saves what the client remembers of it.
pub fn seal_file(home: &Home, services: &Services, sealing: &Sealing, file: &Path) -> anyhow::Result<ClientJob> {
    let summary = count_records(file, &sealing.corpus_options)?;
    let (sealed, job_id) = sealing.seal(summary.records)?;
    let files = JobFiles::new(home, &job_id.to_hex());
    files.create_dir()?;
    files.save_commitment_key(&sealed.commitment_key)?;

    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    let progress = bar(size, "sealing");
    let input = open_corpus(file, &progress)?;
    let mut corpus = CorpusReader::new(input, sealing.corpus_options.clone());
    let mut shard = ShardSealer::start(services.jobs.as_ref(), &layout::job_input(&job_id), sealed, &files.local_errors(), progress.clone())?;
    while let Some(item) = corpus.next_item()? {
        shard.item(item)?;
    }
    let (outcome, upload) = shard.seal()?;
    progress.finish_and_clear();
    if outcome.errors != summary.errors {
        // Dropped uncommitted: the upload is abandoned, no job is created.
        bail!("the corpus changed while it was being sealed ({} errors on the first pass, {} on the second)", summary.errors, outcome.errors);
    }
    let job = sealing.client_job(&job_id, file, summary.form, summary.records, summary.errors, &outcome);
    record_then_upload(&files, job, upload)
}

/// The upload's commit is what creates the job (the object appears, its event runs on-upload),
/// so the record goes to disk first, synced: a failure once the commit may have landed (an
/// acknowledgement lost, a status read or a wait failing, the process killed) still leaves
/// `status` and `results` able to find the job. The record then notes the confirmed upload.
fn record_then_upload(files: &JobFiles, mut job: ClientJob, upload: PendingUpload) -> anyhow::Result<ClientJob> {
    files.save(&job)?;
    upload.commit()?;
    job.uploaded_ms = Some(cloud::now_ms());
    files.save(&job)?;
    Ok(job)
}

fn open_corpus(file: &Path, progress: &ProgressBar) -> anyhow::Result<BufReader<CountingReader<File>>> {
    let input = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    Ok(BufReader::with_capacity(1 << 20, CountingReader { inner: input, progress: progress.clone() }))
}

/// One sealed shard as planned by the first pass over a bulk corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// The corpus line its first record comes from (1-based).
    pub first_line: u64,
    pub records: u64,
    /// Lines refused locally that travel with this shard's results.
    pub errors: u64,
}

/// One line of a corpus, as the shard plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineShape {
    Records { line: u64, count: u64 },
    Refused,
}

/// Splits a corpus into shards of about `per_shard` records: a shard closes once it holds that
/// many and the next line yields records (a line's records are never split, so an OpenAI
/// request line may take a shard a little over), and refused lines stay with the shard they
/// follow (those before the first record, with the first shard). Every shard holds at least
/// one record.
pub fn plan_shards(lines: impl IntoIterator<Item = LineShape>, per_shard: u64) -> Vec<ShardPlan> {
    let mut plans: Vec<ShardPlan> = Vec::new();
    let mut leading_errors = 0;
    for shape in lines {
        match shape {
            LineShape::Records { line, count } => {
                let full = plans.last().is_none_or(|p| p.records >= per_shard);
                if full {
                    plans.push(ShardPlan { first_line: line, records: 0, errors: std::mem::take(&mut leading_errors) });
                }
                plans.last_mut().expect("a shard").records += count;
            }
            LineShape::Refused => match plans.last_mut() {
                Some(plan) => plan.errors += 1,
                None => leading_errors += 1,
            },
        }
    }
    plans
}

/// The sealed shards of a bulk submission, uploaded under `prefix`; each one is an ordinary
/// job (its state saved like `submit`'s) that `on-upload` creates from the shard.
pub struct BulkSealed {
    pub sealing: Sealing,
    pub form: Option<CorpusForm>,
    /// (shard key, job) in shard order.
    pub shards: Vec<(String, ClientJob)>,
}

/// Seals `args.file` into shards of `per_shard` records under `prefix` (`<prefix>part-NNNNN.sealed`).
pub fn seal_bulk(home: &Home, services: &Services, args: &SubmitArgs, prefix: &str, per_shard: u64) -> anyhow::Result<BulkSealed> {
    if per_shard == 0 {
        bail!("--shard-records must be at least 1");
    }
    check_input(args)?;
    let sealing = Sealing::prepare(home, services, args)?;
    // First pass: where each shard starts and how many records it announces.
    let plans = plan_pass(&args.file, &sealing.corpus_options, per_shard)?;
    if plans.is_empty() {
        bail!("{} has no record to submit (every line was refused locally, or it is empty)", args.file.display());
    }

    // Second pass: one sealer per shard, switched where the plan says.
    let size = std::fs::metadata(&args.file).map(|m| m.len()).unwrap_or(0);
    let progress = bar(size, "sealing");
    let mut corpus = CorpusReader::new(open_corpus(&args.file, &progress)?, sealing.corpus_options.clone());
    let mut shards = Vec::with_capacity(plans.len());
    let mut current: Option<(usize, ShardSealer, JobId, JobFiles)> = None;
    let mut pending_errors = Vec::new();
    let finish = |current: Option<(usize, ShardSealer, JobId, JobFiles)>, shards: &mut Vec<(String, ClientJob)>| -> anyhow::Result<()> {
        let Some((index, sealer, job_id, files)) = current else { return Ok(()) };
        let plan: &ShardPlan = &plans[index];
        let (outcome, upload) = sealer.seal()?;
        if outcome.errors != plan.errors {
            bail!("the corpus changed while it was being sealed (shard {index}: {} errors planned, {} found)", plan.errors, outcome.errors);
        }
        let job = sealing.client_job(&job_id, &args.file, None, plan.records, plan.errors, &outcome);
        let job = record_then_upload(&files, job, upload)?;
        shards.push((shard_key(prefix, index), job));
        Ok(())
    };
    while let Some(item) = corpus.next_item()? {
        let next = current.as_ref().map_or(0, |(i, ..)| i + 1);
        let starts_next = matches!(&item, CorpusItem::Records { line, .. } if plans.get(next).is_some_and(|p| p.first_line == *line));
        if starts_next {
            finish(current.take(), &mut shards)?;
            let (sealed, job_id) = sealing.seal(plans[next].records)?;
            let files = JobFiles::new(home, &job_id.to_hex());
            files.create_dir()?;
            files.save_commitment_key(&sealed.commitment_key)?;
            let mut sealer = ShardSealer::start(services.jobs.as_ref(), &shard_key(prefix, next), sealed, &files.local_errors(), progress.clone())?;
            // Lines refused before the first record travel with the first shard.
            for error in pending_errors.drain(..) {
                sealer.item(error)?;
            }
            current = Some((next, sealer, job_id, files));
            continue_with(&mut current, item)?;
        } else if current.is_some() {
            continue_with(&mut current, item)?;
        } else {
            pending_errors.push(item);
        }
    }
    finish(current.take(), &mut shards)?;
    progress.finish_and_clear();
    if shards.len() != plans.len() {
        bail!("the corpus changed while it was being sealed ({} shards planned, {} sealed)", plans.len(), shards.len());
    }
    let form = corpus.summary().form;
    for (_, job) in &mut shards {
        job.form = form.map(|f| f.as_str().to_owned());
        JobFiles::new(home, &job.job_id.to_hex()).save(job)?;
    }
    Ok(BulkSealed { sealing, form, shards })
}

fn continue_with(current: &mut Option<(usize, ShardSealer, JobId, JobFiles)>, item: CorpusItem) -> anyhow::Result<()> {
    let (_, sealer, ..) = current.as_mut().expect("a shard is open");
    sealer.item(item)
}

/// The first pass of [`seal_bulk`]: the shard plan, reading the file once in constant memory.
fn plan_pass(file: &Path, options: &CorpusOptions, per_shard: u64) -> anyhow::Result<Vec<ShardPlan>> {
    let input = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut corpus = CorpusReader::new(BufReader::with_capacity(1 << 20, input), options.clone());
    // Only the shapes: the texts are dropped as the plan is made.
    let shapes = std::iter::from_fn(|| match corpus.next_item() {
        Ok(Some(CorpusItem::Records { line, records })) => Some(Ok(LineShape::Records { line, count: records.len() as u64 })),
        Ok(Some(CorpusItem::Error(_))) => Some(Ok(LineShape::Refused)),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    });
    let mut failure = None;
    let plans = plan_shards(shapes.map_while(|r| r.map_err(|e| failure = Some(e)).ok()), per_shard);
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(plans),
    }
}

/// `<prefix>part-00000.sealed`: in key order, as `bulk-list-shards` lists them.
pub fn shard_key(prefix: &str, index: usize) -> String {
    format!("{prefix}part-{index:05}.sealed")
}

/// What sealing one job's input gave.
pub struct SealOutcome {
    pub sealed_sha256: [u8; 32],
    pub sealed_size: u64,
    pub plaintext_sha256: [u8; 32],
    /// Hex [`IdsDigest`] of the ids sealed, in order.
    pub ids_sha256: String,
    /// Lines refused locally (written to the job's local errors file).
    pub errors: u64,
}

/// One job's input being sealed and uploaded: records into the sealer, sealed bytes into the
/// object store (create-only), refused lines into the job's local errors file.
struct ShardSealer {
    sealer: protocol::stream::StreamSealer,
    out: HashingWriter<BufWriter<Box<dyn ObjectWriter>>>,
    errors_out: BufWriter<File>,
    errors: u64,
    plaintext_hash: Sha256,
    ids: IdsDigest,
    plain: Vec<u8>,
    cipher: Vec<u8>,
}

impl ShardSealer {
    fn start(jobs: &dyn ObjectStore, key: &str, sealed: envelope::Sealed, local_errors: &Path, progress: ProgressBar) -> anyhow::Result<ShardSealer> {
        // The refused lines' ids are the corpus's: the user's alone, like job.json.
        let errors_file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(local_errors)
            .with_context(|| format!("creating {}", local_errors.display()))?;
        let errors_out = BufWriter::new(errors_file);
        let writer = jobs.writer(key, PutCondition::CreateOnly)?;
        let mut out = HashingWriter { inner: BufWriter::with_capacity(1 << 20, writer), hasher: Sha256::new(), written: 0, progress };
        out.write_all(&sealed.preamble)?;
        Ok(ShardSealer {
            sealer: sealed.sealer,
            out,
            errors_out,
            errors: 0,
            plaintext_hash: Sha256::new(),
            ids: IdsDigest::new(),
            plain: Vec::with_capacity(SEAL_PIECE * 2),
            cipher: Vec::with_capacity(SEAL_PIECE * 2),
        })
    }

    fn item(&mut self, item: CorpusItem) -> anyhow::Result<()> {
        match item {
            CorpusItem::Records { records, .. } => {
                for record in &records {
                    encode_input(record, &mut self.plain)?;
                    self.ids.push(&record.id);
                }
                if self.plain.len() >= SEAL_PIECE {
                    self.plaintext_hash.update(&self.plain);
                    self.sealer.push(&self.plain, &mut self.cipher)?;
                    self.out.write_all(&self.cipher)?;
                    self.plain.clear();
                    self.cipher.clear();
                }
            }
            CorpusItem::Error(error) => {
                self.errors += 1;
                serde_json::to_writer(&mut self.errors_out, &error)?;
                self.errors_out.write_all(b"\n")?;
            }
        }
        Ok(())
    }

    /// Seals the rest and writes it out; the upload is committed (the job created) only by
    /// [`PendingUpload::commit`].
    fn seal(mut self) -> anyhow::Result<(SealOutcome, PendingUpload)> {
        self.plaintext_hash.update(&self.plain);
        self.sealer.push(&self.plain, &mut self.cipher)?;
        self.sealer.finish(&mut self.cipher)?;
        self.out.write_all(&self.cipher)?;
        self.errors_out.flush()?;
        self.errors_out.get_ref().sync_all().context("syncing the local errors file")?;
        self.out.flush()?;
        let HashingWriter { inner, hasher, written, progress } = self.out;
        progress.set_message("uploading");
        let writer = inner.into_inner().map_err(|e| anyhow!("uploading the sealed input: {}", e.error()))?;
        let outcome = SealOutcome {
            sealed_sha256: hasher.finalize().into(),
            sealed_size: written,
            plaintext_sha256: self.plaintext_hash.finalize().into(),
            ids_sha256: self.ids.finish(),
            errors: self.errors,
        };
        Ok((outcome, PendingUpload(writer)))
    }
}

/// A sealed input written to the store but not committed: dropped, it is abandoned.
struct PendingUpload(Box<dyn ObjectWriter>);

impl PendingUpload {
    fn commit(self) -> anyhow::Result<()> {
        self.0.commit().map(drop).context("uploading the sealed input")
    }
}

/// The upload event ran `on-upload`; its verdict is in the status object.
pub fn check_accepted(services: &Services, job_id: &JobId) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match crate::status::read_status(services, job_id)? {
            Some(status) if status.state == cloud::messages::JobState::Failed => {
                let failure = status.failure.map(|f| format!("check `{}` failed: {}", f.check, f.message)).unwrap_or_default();
                bail!("job {job_id} was refused on upload: {failure}");
            }
            Some(_) => return Ok(()),
            None if std::time::Instant::now() > deadline => {
                eprintln!("note: the upload of job {job_id} has not been acknowledged yet");
                return Ok(());
            }
            None => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(line: u64, count: u64) -> LineShape {
        LineShape::Records { line, count }
    }

    #[test]
    fn shards_close_at_n_records_and_keep_lines_whole() {
        let lines = [
            LineShape::Refused,
            records(2, 1),
            records(3, 1),
            LineShape::Refused,
            records(5, 3),
            records(6, 1),
            LineShape::Refused,
        ];
        let plans = plan_shards(lines, 2);
        assert_eq!(
            plans,
            [
                ShardPlan { first_line: 2, records: 2, errors: 2 },
                ShardPlan { first_line: 5, records: 3, errors: 0 },
                ShardPlan { first_line: 6, records: 1, errors: 1 },
            ]
        );
        assert!(plan_shards([LineShape::Refused], 2).is_empty(), "no record, no shard");
        assert_eq!(plan_shards((1..=5).map(|l| records(l, 1)), 10).len(), 1);
        assert_eq!(shard_key("stores/s/incoming/b/", 7), "stores/s/incoming/b/part-00007.sealed");
    }
}
