//! `ephem-batch submit`: check each line locally, verify the published attestation against the
//! policy, seal the record stream to the attested fleet key, and upload it — the upload event
//! creates the job (DESIGN.md §5 steps 1–3).
//!
//! Lines refused locally never leave the machine: they go to the job's local errors file and
//! reappear in the results' errors file.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use cloud::{layout, ObjectStore, PutCondition, Services};
use indicatif::{ProgressBar, ProgressStyle};
use protocol::envelope::{self, JobHeader, JobId, JobOptions, OutputDtype};
use protocol::manifest::{Manifest, SignedManifest};
use protocol::records::encode_input;
use sha2::{Digest, Sha256};

use crate::corpus::{count_records, CorpusItem, CorpusOptions, CorpusReader};
use crate::home::Home;
use crate::jobstate::{ClientJob, JobFiles};
use crate::trust::{current_enclave, ClientTrust, TrustArgs};

pub const DEFAULT_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// Plaintext is sealed in pieces of this size (the STREAM chunk size is 64 KiB).
const SEAL_PIECE: usize = 256 * 1024;

#[derive(Args, Debug, Clone)]
pub struct SubmitArgs {
    /// The corpus: JSON lines, `{"id", "text"}` or OpenAI Batch embedding requests.
    pub file: PathBuf,
    /// Model id (a published, signed manifest must exist for it).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Wait for the job, then download, open and verify the results.
    #[arg(long)]
    pub wait: bool,
    /// Where `--wait` writes results (default: beside the input, `<stem>.embeddings.<ext>`).
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Output format for `--wait` (default: `openai` for OpenAI Batch input, else `jsonl`).
    #[arg(long, value_enum)]
    pub format: Option<crate::results::Format>,
    /// Vectors as f16 instead of f32 (half the size).
    #[arg(long)]
    pub f16: bool,
    /// Refuse texts longer than the model's maximum instead of truncating them.
    #[arg(long)]
    pub no_truncate: bool,
    /// Do not L2-normalise the vectors.
    #[arg(long)]
    pub no_normalize: bool,
    /// Print the job as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// A model version the client checked: its signature, and the hash its jobs will name.
pub struct CheckedModel {
    pub key: String,
    pub manifest: Manifest,
    pub hash: [u8; 32],
}

/// The newest published manifest of `model_id` whose publisher signature verifies.
pub fn newest_model(models: &dyn ObjectStore, model_id: &str, trust: &ClientTrust) -> anyhow::Result<CheckedModel> {
    let name = model_id.rsplit('/').next().unwrap_or(model_id);
    let mut versions: Vec<(u64, String)> = models
        .list(&format!("{}{name}/", layout::MODELS_PREFIX))?
        .into_iter()
        .filter_map(|m| layout::manifest_version(&m.key).map(|v| (v, m.key)))
        .collect();
    versions.sort();
    let mut refused = Vec::new();
    for (_, key) in versions.into_iter().rev() {
        let bytes = models.get(&key)?;
        let checked = SignedManifest::decode(&bytes).and_then(|s| s.verify(&trust.model_publisher).map(|m| (m.clone(), s.hash)));
        match checked {
            Ok((manifest, hash)) if manifest.model_id == model_id => return Ok(CheckedModel { key, manifest, hash }),
            Ok((manifest, _)) => refused.push(format!("{key}: names model {}", manifest.model_id)),
            Err(error) => refused.push(format!("{key}: {error}")),
        }
    }
    if refused.is_empty() {
        bail!("model {model_id} is not published (no manifest under {}{name}/)", layout::MODELS_PREFIX)
    }
    bail!("no manifest of {model_id} verifies:\n  {}", refused.join("\n  "))
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

pub fn bar(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_owned());
    bar
}

pub fn run(home: &Home, services: &Services, args: &SubmitArgs) -> anyhow::Result<ClientJob> {
    let trust = ClientTrust::load(home, &args.trust)?;
    trust.warn_if_development();
    let now = cloud::now_ms();
    let enclave = current_enclave(services, &trust, now)?;
    let model = newest_model(services.models.as_ref(), &args.model, &trust)?;
    let result_key = crate::keys::load_result_key(&home.result_key(), true)?;

    let mut corpus_options = CorpusOptions::new(args.model.clone());
    corpus_options.dimensions = Some(model.manifest.dimensions);
    let summary = count_records(&args.file, &corpus_options).with_context(|| format!("reading {}", args.file.display()))?;

    let options = JobOptions {
        truncate: !args.no_truncate,
        normalize: !args.no_normalize,
        dtype: if args.f16 { OutputDtype::F16 } else { OutputDtype::F32 },
        ..JobOptions::default()
    };
    let header = JobHeader {
        fleet_key_id: enclave.fleet.key_id(),
        epoch: enclave.binding.epoch,
        model_id: args.model.clone(),
        manifest_hash: model.hash,
        options,
        result_public_key: result_key.public_key().to_bytes(),
        record_count: summary.records,
        created_ms: now,
    };
    let sealed = envelope::seal_job(&header, &enclave.fleet)?;
    let job_id = JobId(sealed.stream_id);
    let files = JobFiles::new(home, &job_id.to_hex());
    files.create_dir()?;
    files.save_commitment_key(&sealed.commitment_key)?;

    let size = std::fs::metadata(&args.file).map(|m| m.len()).unwrap_or(0);
    let progress = bar(size, "sealing");
    let (sealed_sha256, sealed_size, plaintext_sha256, errors) =
        seal_and_upload(services.jobs.as_ref(), &job_id, sealed, &args.file, corpus_options, &files.local_errors(), progress.clone())?;
    progress.finish_and_clear();
    if errors != summary.errors {
        bail!("the corpus changed while it was being sealed ({} errors on the first pass, {errors} on the second)", summary.errors);
    }

    let job = ClientJob {
        job_id: job_id.to_hex(),
        submitted_ms: now,
        input_file: args.file.display().to_string(),
        form: summary.form.map(|f| f.as_str().to_owned()),
        model_id: args.model.clone(),
        manifest_key: model.key,
        manifest_hash: hex::encode(model.hash),
        epoch: enclave.binding.epoch,
        fleet_key_id: hex::encode(enclave.fleet.key_id()),
        result_key_id: hex::encode(result_key.public_key().key_id()),
        attestation_sha256: hex::encode(Sha256::digest(&enclave.document)),
        development: trust.development,
        records: summary.records,
        local_errors: summary.errors,
        sealed_sha256: hex::encode(sealed_sha256),
        sealed_size,
        plaintext_sha256: hex::encode(plaintext_sha256),
        truncate: options.truncate,
        normalize: options.normalize,
        dtype: options.dtype.as_str().to_owned(),
        precision: options.precision.as_str().to_owned(),
        downloaded: None,
    };
    files.save(&job)?;
    check_accepted(services, &job_id)?;
    if summary.errors > 0 {
        eprintln!("{} line(s) refused locally (never sent): {}", summary.errors, files.local_errors().display());
    }
    Ok(job)
}

type SealOutcome = ([u8; 32], u64, [u8; 32], u64);

/// Second pass over the corpus: records into the sealer, sealed bytes into the object store.
fn seal_and_upload(
    jobs: &dyn ObjectStore,
    job_id: &JobId,
    mut sealed: envelope::Sealed,
    file: &Path,
    corpus_options: CorpusOptions,
    local_errors: &Path,
    progress: ProgressBar,
) -> anyhow::Result<SealOutcome> {
    let input = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let reader = BufReader::with_capacity(1 << 20, CountingReader { inner: input, progress: progress.clone() });
    let mut corpus = CorpusReader::new(reader, corpus_options);
    let mut errors_out = BufWriter::new(File::create(local_errors).with_context(|| format!("creating {}", local_errors.display()))?);
    let writer = jobs.writer(&layout::job_input(job_id), PutCondition::CreateOnly)?;
    let mut out = HashingWriter { inner: BufWriter::with_capacity(1 << 20, writer), hasher: Sha256::new(), written: 0, progress };
    out.write_all(&sealed.preamble)?;

    let mut plaintext_hash = Sha256::new();
    let mut plain = Vec::with_capacity(SEAL_PIECE * 2);
    let mut cipher = Vec::with_capacity(SEAL_PIECE * 2);
    let mut errors = 0u64;
    while let Some(item) = corpus.next_item()? {
        match item {
            CorpusItem::Records { records, .. } => {
                for record in &records {
                    encode_input(record, &mut plain)?;
                }
                if plain.len() >= SEAL_PIECE {
                    plaintext_hash.update(&plain);
                    sealed.sealer.push(&plain, &mut cipher)?;
                    out.write_all(&cipher)?;
                    plain.clear();
                    cipher.clear();
                }
            }
            CorpusItem::Error(error) => {
                errors += 1;
                serde_json::to_writer(&mut errors_out, &error)?;
                errors_out.write_all(b"\n")?;
            }
        }
    }
    plaintext_hash.update(&plain);
    sealed.sealer.push(&plain, &mut cipher)?;
    sealed.sealer.finish(&mut cipher)?;
    out.write_all(&cipher)?;
    errors_out.flush()?;
    out.flush()?;
    let HashingWriter { inner, hasher, written, progress } = out;
    progress.set_message("uploading");
    let writer = inner.into_inner().map_err(|e| anyhow!("uploading the sealed input: {}", e.error()))?;
    writer.commit().context("uploading the sealed input")?;
    Ok((hasher.finalize().into(), written, plaintext_hash.finalize().into(), errors))
}

/// The upload event ran `on-upload`; its verdict is in the status object.
fn check_accepted(services: &Services, job_id: &JobId) -> anyhow::Result<()> {
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
