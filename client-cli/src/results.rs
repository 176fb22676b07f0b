//! `ephem-batch results JOB -o OUT`: read the committed receipt once and verify it, download the
//! attempt it names, open it with the client's key, write embeddings and errors, and check the
//! output against that receipt and the ids sealed before any file appears under its final name.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cloud::{layout, ObjectError, Services};
use protocol::envelope::{JobId, OutputKind, ResultSecretKey};
use protocol::manifest::SignedManifest;

use crate::corpus::LineError;
use crate::home::Home;
use crate::jobstate::{ClientJob, JobFiles};
use crate::output::{OutputError, OutputFormat, OutputOptions, OutputSummary, OutputWriter, ResultsOf};
use crate::trust::ClientTrust;
use crate::verify::{self, Check, Fetched, Verification};

/// Why results are refused; each names the failed checks.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("the results of job {job} do not verify; nothing written:\n  {}", list(.failed))]
    NotVerified { job: String, failed: Vec<Check> },
    #[error("check `manifest` failed: {detail}")]
    Manifest { detail: String },
}

impl ResultsError {
    /// The names of the failed checks.
    pub fn checks(&self) -> Vec<&'static str> {
        match self {
            ResultsError::NotVerified { failed, .. } => failed.iter().map(|c| c.name).collect(),
            ResultsError::Manifest { .. } => vec!["manifest"],
        }
    }
}

fn list(failed: &[Check]) -> String {
    failed.iter().map(|c| format!("{}: {}", c.name, c.detail)).collect::<Vec<_>>().join("\n  ")
}

/// The failed checks but a ledger check that found the job not in the ledger yet (it may not
/// have caught up); a ledger check that refused what it was shown (`witness_quorum`, `fork`, a
/// refused proof, …) is a failure like any other.
fn refused(job: &JobId, out: &Verification) -> ResultsError {
    let failed = out.failures().into_iter().filter(|c| c.name != "ledger" || out.ledger_refusal.is_some()).cloned().collect();
    ResultsError::NotVerified { job: job.to_hex(), failed }
}

fn refuse_on_failure(job: &JobId, out: &Verification) -> Result<(), ResultsError> {
    match refused(job, out) {
        ResultsError::NotVerified { failed, .. } if failed.is_empty() => Ok(()),
        refusal => Err(refusal),
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"id", "embedding", "tokens"}` lines.
    Jsonl,
    /// OpenAI Batch output lines (for OpenAI Batch input).
    Openai,
    /// A float32 `.npy` matrix plus `<stem>.ids.jsonl`.
    Npy,
    /// Sparse weights as a CSR matrix (`scipy.sparse.load_npz`), or multi-vector records as
    /// `vectors` and `indptr` arrays, plus `<stem>.ids.jsonl`.
    Npz,
}

impl Format {
    pub fn output(self) -> OutputFormat {
        match self {
            Format::Jsonl => OutputFormat::Jsonl,
            Format::Openai => OutputFormat::OpenAi,
            Format::Npy => OutputFormat::Npy,
            Format::Npz => OutputFormat::Npz,
        }
    }

    /// Refuses a format that does not write the job's kind of output, naming both.
    pub fn check_writes(self, kind: OutputKind) -> anyhow::Result<()> {
        if self.output().writes(kind) {
            return Ok(());
        }
        use clap::ValueEnum as _;
        let fitting: Vec<_> =
            Format::value_variants().iter().filter(|f| f.output().writes(kind)).map(|f| f.output().as_str()).collect();
        anyhow::bail!("--format {}: {} output is written as {} (docs/models.md)", self.output().as_str(), kind.as_str(), fitting.join(" or "))
    }
}

/// The format used when none is given: the input's own form.
pub fn default_format(job: &ClientJob) -> Format {
    if job.form.as_deref() == Some("openai") { Format::Openai } else { Format::Jsonl }
}

/// `<input stem>.embeddings.<ext>` beside the input.
pub fn default_output(job: &ClientJob, format: Format) -> PathBuf {
    let input = Path::new(&job.input_file);
    let stem = input.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| job.job_id.to_hex());
    let ext = match format {
        Format::Npy => "npy",
        Format::Npz => "npz",
        Format::Jsonl | Format::Openai => "jsonl",
    };
    input.with_file_name(format!("{stem}.embeddings.{ext}"))
}

pub struct Written {
    pub summary: OutputSummary,
    pub output: PathBuf,
    pub errors: PathBuf,
    pub verification: Verification,
}

pub fn run(
    home: &Home,
    services: &Services,
    trust: &ClientTrust,
    key: &ResultSecretKey,
    job: &JobId,
    output: Option<&Path>,
    format: Option<Format>,
) -> anyhow::Result<Written> {
    let files = JobFiles::new(home, &job.to_hex());
    let state = files.load()?;
    let format = format.unwrap_or_else(|| default_format(&state));
    let output = output.map(Path::to_path_buf).unwrap_or_else(|| default_output(&state, format));
    let kind = output_kind(&state);
    format.check_writes(kind)?;
    // Scores have one value per document of each record, not one length.
    let dimensions = Some(dimensions(services, trust, &state)?).filter(|_| kind != OutputKind::Scores);
    let options = OutputOptions { format: format.output(), model_id: state.model_id.clone(), results_of: ResultsOf::Job(*job), dimensions, kind };
    let mut writer = OutputWriter::create(&output, options)?;
    let appended = append_job(home, services, trust, key, job, &mut writer)?;
    let paths = writer.paths().clone();
    let summary = writer.finish()?;
    let verification = appended.save(home)?;
    Ok(Written { summary, output: paths.output, errors: paths.errors, verification })
}

/// What a job's records hold, as the client sealed it.
pub fn output_kind(state: &ClientJob) -> OutputKind {
    state.output.as_deref().and_then(OutputKind::parse).unwrap_or_default()
}

/// The vectors' length: the Matryoshka length the job asked for, else the model's dimensions
/// from the manifest whose hash the job header pinned, signed by the pinned model publisher (the
/// host controls the bucket it is read from).
pub fn dimensions(services: &Services, trust: &ClientTrust, state: &ClientJob) -> Result<usize, ResultsError> {
    let refuse = |detail: String| ResultsError::Manifest { detail };
    let bytes = services.models.get_at_most(&state.manifest_key, cloud::MAX_SMALL_OBJECT).map_err(|e| refuse(format!("reading {}: {e}", state.manifest_key)))?;
    let signed = SignedManifest::decode(&bytes).map_err(|e| refuse(format!("{}: {e}", state.manifest_key)))?;
    if hex::encode(signed.hash) != state.manifest_hash {
        return Err(refuse(format!("{} hashes to {}, the job pinned {}", state.manifest_key, hex::encode(signed.hash), state.manifest_hash)));
    }
    let manifest = signed.verify(&trust.model_publisher).map_err(|e| refuse(format!("{}: {e}", state.manifest_key)))?;
    if manifest.model_id != state.model_id {
        return Err(refuse(format!("{} names model {}, the job {}", state.manifest_key, manifest.model_id, state.model_id)));
    }
    // bge-m3's sparse and multi-vector outputs have their own widths (the manifest's `outputs`).
    let own = manifest.output_dimensions(output_kind(state)).unwrap_or(manifest.dimensions);
    let dimensions = state.dimensions.unwrap_or(own) as usize;
    // The elements of each vector written: a byte per eight dimensions for the bit forms.
    let dtype = protocol::envelope::OutputDtype::parse(&state.dtype).unwrap_or_default();
    Ok(dtype.elements(dimensions))
}

/// One job's results written to `writer`, verified.
pub struct Appended {
    pub verification: Verification,
    state: ClientJob,
}

impl Appended {
    /// Remembers what was downloaded (call once the output is in place).
    pub fn save(self, home: &Home) -> anyhow::Result<Verification> {
        JobFiles::new(home, &self.state.job_id.to_hex()).save(&self.state)?;
        Ok(self.verification)
    }
}

/// Writes a job's locally refused lines and its records to `writer`, checked against the
/// receipt read once and verified before any of its fields is used. On any failed check (but
/// a ledger that does not hold the job yet) it fails: the caller then drops the writer unfinished, so no file appears
/// under its final name.
pub fn append_job(
    home: &Home,
    services: &Services,
    trust: &ClientTrust,
    key: &ResultSecretKey,
    job: &JobId,
    writer: &mut OutputWriter,
) -> anyhow::Result<Appended> {
    let files = JobFiles::new(home, &job.to_hex());
    let mut state = files.load()?;
    let mut out = Verification::new(job, trust);
    let verified = match verify::fetch_receipt(services, trust, job, &mut out)? {
        Fetched::Verified(verified) => verified,
        Fetched::Missing => {
            let view = crate::status::view(services, job)?;
            bail!("job {job} has no results: it is {}", view.state.as_str());
        }
        Fetched::Refused => return Err(refused(job, &out).into()),
    };
    let receipt = &verified.receipt;
    // Every claim about the input first: no byte of an output is read for a receipt that fails.
    verify::check_sealed(&state, job, receipt, &mut out);
    refuse_on_failure(job, &out)?;
    append_local_errors(home, job, writer)?;
    let size = services.jobs.head(&layout::job_output(job, receipt.attempt))?.map_or(0, |m| m.size);
    let progress = crate::progress::bar(size, "download");
    let opened = crate::opening::open_output(services, job, receipt.attempt, key, Some(state.records), Some(&progress), |record| {
        writer.record(&record).map_err(Into::into)
    });
    progress.finish_and_clear();
    let downloaded = match opened {
        Ok(downloaded) => downloaded,
        Err(error) if local_failure(&error) => return Err(error),
        Err(error) => {
            verify::unopened_output(job, receipt.attempt, &error, &mut out);
            return Err(refused(job, &out).into());
        }
    };
    verify::check_output(&files, &state, receipt, &downloaded, &mut out);
    verify::check_ledger(home, services, trust, job, &verified.bytes, &mut out);
    refuse_on_failure(job, &out)?;
    state.downloaded = Some(downloaded);
    Ok(Appended { verification: out, state })
}

/// Failures of this machine (writing files) or of the transfer, not of the object's content.
fn local_failure(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.is::<OutputError>()
            || cause.is::<std::io::Error>()
            || cause.downcast_ref::<ObjectError>().is_some_and(|e| !matches!(e, ObjectError::NotFound { .. }))
    })
}

/// The lines of `job`'s corpus refused at submission, to `writer`'s errors file.
pub fn append_local_errors(home: &Home, job: &JobId, writer: &mut OutputWriter) -> anyhow::Result<()> {
    for error in read_local_errors(&JobFiles::new(home, &job.to_hex()).local_errors())? {
        writer.line_error(&error)?;
    }
    Ok(())
}

fn read_local_errors(path: &Path) -> anyhow::Result<Vec<LineError>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    std::io::BufReader::new(file)
        .lines()
        .map(|line| {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&line).with_context(|| format!("{}: not a local error line", path.display()))
        })
        .collect()
}
