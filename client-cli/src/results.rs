//! `ephem-batch results JOB -o OUT`: download the attempt the committed receipt names, open it
//! with the client's key, write embeddings and errors, and check the receipt against what was
//! uploaded and downloaded before any file appears under its final name.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use cloud::{layout, Services};
use protocol::envelope::{JobId, ResultSecretKey};
use protocol::receipt::SignedReceipt;

use crate::corpus::LineError;
use crate::home::Home;
use crate::jobstate::{ClientJob, JobFiles};
use crate::output::{OutputFormat, OutputOptions, OutputSummary, OutputWriter};
use crate::trust::ClientTrust;
use crate::verify::{verify_job, Verification};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"id", "embedding", "tokens"}` lines.
    Jsonl,
    /// OpenAI Batch output lines (for OpenAI Batch input).
    Openai,
    /// A float32 `.npy` matrix plus `<stem>.ids.jsonl`.
    Npy,
}

impl Format {
    pub fn output(self) -> OutputFormat {
        match self {
            Format::Jsonl => OutputFormat::Jsonl,
            Format::Openai => OutputFormat::OpenAi,
            Format::Npy => OutputFormat::Npy,
        }
    }
}

/// The format used when none is given: the input's own form.
pub fn default_format(job: &ClientJob) -> Format {
    if job.form.as_deref() == Some("openai") { Format::Openai } else { Format::Jsonl }
}

/// `<input stem>.embeddings.<ext>` beside the input.
pub fn default_output(job: &ClientJob, format: Format) -> PathBuf {
    let input = Path::new(&job.input_file);
    let stem = input.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| job.job_id.clone());
    let ext = if format == Format::Npy { "npy" } else { "jsonl" };
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
    let mut writer = OutputWriter::create(
        &output,
        OutputOptions { format: format.output(), model_id: state.model_id.clone(), job_id: job.to_hex(), dimensions: dimensions(services, &state) },
    )?;
    let appended = append_job(home, services, trust, key, job, &mut writer)?;
    let paths = writer.paths().clone();
    let summary = writer.finish()?;
    let verification = appended.save(home)?;
    Ok(Written { summary, output: paths.output, errors: paths.errors, verification })
}

/// The model's dimensions, from the manifest the job names (if it can be read).
pub fn dimensions(services: &Services, state: &ClientJob) -> Option<usize> {
    services
        .models
        .get(&state.manifest_key)
        .ok()
        .and_then(|b| protocol::manifest::SignedManifest::decode(&b).ok())
        .map(|m| m.manifest.dimensions as usize)
}

/// One job's results written to `writer`, verified.
pub struct Appended {
    pub verification: Verification,
    state: ClientJob,
}

impl Appended {
    /// Remembers what was downloaded (call once the output is in place).
    pub fn save(self, home: &Home) -> anyhow::Result<Verification> {
        JobFiles::new(home, &self.state.job_id).save(&self.state)?;
        Ok(self.verification)
    }
}

/// Writes a job's locally refused lines and its records to `writer`, then checks the receipt
/// against what was uploaded and downloaded. On any failed check (but the ledger's) it fails:
/// the caller then drops the writer unfinished, so no file appears under its final name.
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
    let receipt = match services.jobs.get(&layout::job_receipt(job)) {
        Ok(bytes) => SignedReceipt::decode(&bytes).context("the committed receipt")?.receipt,
        Err(cloud::ObjectError::NotFound { .. }) => {
            let view = crate::status::view(services, job)?;
            bail!("job {job} has no results: it is {}", view.state.as_str());
        }
        Err(error) => return Err(error.into()),
    };
    append_local_errors(home, job, writer)?;
    let size = services.jobs.head(&layout::job_output(job, receipt.attempt))?.map_or(0, |m| m.size);
    let progress = crate::submit::bar(size, "download");
    let downloaded = crate::opening::open_output(services, job, receipt.attempt, key, Some(state.records), Some(&progress), |record| {
        writer.record(&record).map_err(Into::into)
    })?;
    progress.finish_and_clear();

    let verification = verify_job(home, services, trust, job, key, Some(downloaded.clone()))?;
    let fatal: Vec<String> =
        verification.failures().into_iter().filter(|c| c.name != "ledger").map(|c| format!("{}: {}", c.name, c.detail)).collect();
    if !fatal.is_empty() {
        return Err(anyhow!("the results of job {job} do not verify; nothing written:\n  {}", fatal.join("\n  ")));
    }
    state.downloaded = Some(downloaded);
    Ok(Appended { verification, state })
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
