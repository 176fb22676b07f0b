//! `ephem-batch submit --bulk` and `ephem-batch bulk status | results | verify`.
//!
//! A bulk submission seals the corpus into shards — each an ordinary job, sealed and
//! remembered exactly as `submit` does — and uploads them under a store prefix
//! (`stores/<store>/incoming/<bulk_id>/part-NNNNN.sealed`), where `on-upload` turns each one
//! into its job. It then starts the bulk workflow with `{bulk_id, prefix}`: Step Functions on
//! AWS, the local runtime's interpreter of the same definition in the embedded default. The
//! workflow ends by writing `bulk/<bulk_id>/manifest.json`, which signs nothing: `bulk
//! verify` checks every shard's receipt with `verify`'s own checks, and `bulk results` writes
//! every shard's embeddings, verified, to one output.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use cloud::bulk::{Manifest, ManifestStatus};
use cloud::messages::JobState;
use cloud::{layout, ExecutionStatus, ObjectError, Services};
use protocol::envelope::{JobId, OutputKind, ResultSecretKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::Opened;
use crate::home::Home;
use crate::jobstate::JobFiles;
use crate::output::{OutputOptions, OutputSummary, OutputWriter, ResultsOf};
use crate::results::{self, Format};
use crate::submit::{self, SubmitArgs};
use crate::trust::{ClientTrust, TrustArgs};
use crate::verify::{verify_job, Check, Verification};

#[derive(Subcommand, Debug)]
pub enum BulkCommand {
    /// Where a bulk run stands: its execution, its manifest, or its shards' jobs.
    Status {
        bulk_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Download, open and check every shard's results, written to one output.
    Results(BulkResultsArgs),
    /// Check the manifest against the shards this client sealed, and every shard's receipt
    /// with `verify`'s checks.
    Verify {
        bulk_id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: TrustArgs,
    },
}

#[derive(Args, Debug)]
pub struct BulkResultsArgs {
    pub bulk_id: String,
    /// Output file (default: beside the input, `<stem>.embeddings.<ext>`).
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Write the committed shards' results even if some shard did not commit.
    #[arg(long)]
    pub partial: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// What the client remembers about a bulk submission (`client/bulks/<bulk_id>/bulk.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkRecord {
    pub bulk_id: String,
    pub store: String,
    pub prefix: String,
    pub input_file: String,
    pub submitted_ms: u64,
    pub records: u64,
    pub local_errors: u64,
    pub shards: Vec<BulkShard>,
    /// The workflow execution (an ARN on AWS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkShard {
    pub key: String,
    pub job_id: JobId,
    pub records: u64,
    pub local_errors: u64,
}

impl BulkRecord {
    fn path(home: &Home, bulk_id: &str) -> PathBuf {
        home.bulk_dir(bulk_id).join("bulk.json")
    }

    pub fn load(home: &Home, bulk_id: &str) -> anyhow::Result<BulkRecord> {
        check_name(bulk_id, "bulk id", 80)?;
        let path = Self::path(home, bulk_id);
        let bytes = std::fs::read(&path)
            .map_err(|_| anyhow!("this client has no record of bulk run {bulk_id} (not submitted from this $EPHEM_HOME)"))?;
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))
    }

    fn save(&self, home: &Home) -> anyhow::Result<()> {
        let path = Self::path(home, &self.bulk_id);
        std::fs::create_dir_all(home.bulk_dir(&self.bulk_id))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    fn job(&self, index: usize) -> JobId {
        self.shards[index].job_id
    }
}

/// Names that become object keys and execution names: `A-Z a-z 0-9 - _`, 1 to `max`.
fn check_name(name: &str, what: &str, max: usize) -> anyhow::Result<()> {
    let ok = (1..=max).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { bail!("{what} {name:?} is not 1 to {max} characters of A-Z a-z 0-9 - _") }
}

/// `bulk-<unix seconds>-<8 hex digits>`: a valid execution name, and sorts by time.
pub fn new_bulk_id() -> anyhow::Result<String> {
    let mut random = [0u8; 4];
    getrandom::fill(&mut random).map_err(|e| anyhow!("random number generator: {e}"))?;
    Ok(format!("bulk-{}-{}", cloud::now_ms() / 1000, hex::encode(random)))
}

/// `stores/<store>/incoming/`: where a store's sealed shards become jobs.
pub fn store_prefix(store: &str) -> anyhow::Result<String> {
    check_name(store, "store name", 64)?;
    Ok(format!("stores/{store}/incoming/"))
}

/// Seals and uploads the shards, then starts the workflow over them.
pub fn submit(home: &Home, opened: &Opened, args: &SubmitArgs) -> anyhow::Result<BulkRecord> {
    let services = &opened.services;
    let workflow = services.bulk_workflow.clone().ok_or_else(|| {
        anyhow!("this deployment names no bulk workflow: BulkStateMachineArn in the stack outputs, or EPHEM_BULK_STATE_MACHINE_ARN")
    })?;
    let store = store_prefix(&args.store)?;
    // The shards become jobs only under a prefix on-upload is notified for.
    let accepted = match &opened.aws {
        Some(aws) => aws.settings().store_prefixes.clone(),
        None => Some(cloud_local::STORE_PREFIX.to_owned()),
    };
    match accepted {
        Some(list) if !list.split(',').map(str::trim).any(|p| !p.is_empty() && store.starts_with(p)) => {
            bail!("the deployment turns shards into jobs only under {list} (StorePrefixes); {store} is not under one")
        }
        Some(_) => {}
        None => eprintln!("note: the stack outputs name no StorePrefixes; shards go to {store}, which on-upload must be notified for"),
    }
    if opened.local.is_some() && home.running("lambdas").is_none() {
        bail!("the local runtime that runs bulk workflows is not running: `ephem-batch dev up` first");
    }
    let bulk_id = new_bulk_id()?;
    let prefix = format!("{store}{bulk_id}/");
    let sealed = submit::seal_bulk(home, services, args, &prefix, args.shard_records)?;
    let mut record = BulkRecord {
        bulk_id: bulk_id.clone(),
        store: args.store.clone(),
        prefix: prefix.clone(),
        input_file: args.file.display().to_string(),
        submitted_ms: sealed.sealing.now_ms,
        records: sealed.shards.iter().map(|(_, j)| j.records).sum(),
        local_errors: sealed.shards.iter().map(|(_, j)| j.local_errors).sum(),
        shards: sealed
            .shards
            .iter()
            .map(|(key, job)| {
                Ok(BulkShard { key: key.clone(), job_id: job.job_id, records: job.records, local_errors: job.local_errors })
            })
            .collect::<anyhow::Result<_>>()?,
        execution: None,
    };
    record.save(home)?;
    check_shards_accepted(services, &record)?;
    let input = serde_json::json!({ "bulk_id": bulk_id, "prefix": prefix }).to_string();
    let execution = workflow.start(&bulk_id, &input).context("starting the bulk workflow")?;
    record.execution = Some(execution);
    record.save(home)?;
    if record.local_errors > 0 {
        eprintln!("{} line(s) refused locally (never sent); they are listed with the results", record.local_errors);
    }
    Ok(record)
}

/// Every shard became its job (on-upload wrote its status), or one was refused.
fn check_shards_accepted(services: &Services, record: &BulkRecord) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut waiting: Vec<usize> = (0..record.shards.len()).collect();
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for index in waiting {
            let job = record.job(index);
            match crate::status::read_status(services, &job)? {
                Some(status) if status.state == JobState::Failed => {
                    let failure = status.failure.map(|f| format!("check `{}` failed: {}", f.check, f.message)).unwrap_or_default();
                    bail!("shard {} (job {job}) was refused on upload: {failure}", record.shards[index].key);
                }
                Some(_) => {}
                None => still.push(index),
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            if Instant::now() > deadline {
                eprintln!("note: {} shard(s) have not been acknowledged as jobs yet; the workflow waits for them", waiting.len());
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// Follows the execution until it ends; the manifest, if it was written.
pub fn wait(services: &Services, record: &BulkRecord) -> anyhow::Result<(cloud::Execution, Option<Manifest>)> {
    let workflow = services.bulk_workflow.as_ref().ok_or_else(|| anyhow!("this deployment names no bulk workflow"))?;
    let execution = record.execution.as_deref().ok_or_else(|| anyhow!("bulk run {} was never started", record.bulk_id))?;
    let bar = indicatif::ProgressBar::new(record.shards.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>10} [{bar:30}] {pos}/{len} shards {elapsed}").expect("a valid template").progress_chars("=> "),
    );
    bar.set_message("embedding");
    let mut committed = vec![false; record.shards.len()];
    let described = loop {
        let described = workflow.describe(execution)?;
        for (index, done) in committed.iter_mut().enumerate().filter(|(_, d)| !**d) {
            *done = services.jobs.head(&layout::job_receipt(&record.job(index)))?.is_some();
        }
        bar.set_position(committed.iter().filter(|d| **d).count() as u64);
        if described.status.is_done() {
            break described;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    bar.finish_and_clear();
    Ok((described, read_manifest(services, &record.bulk_id)?))
}

/// `bulk/<bulk_id>/manifest.json`, if written.
pub fn read_manifest(services: &Services, bulk_id: &str) -> anyhow::Result<Option<Manifest>> {
    let key = layout::bulk_manifest(bulk_id);
    match services.jobs.get_at_most(&key, cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("{key} is not a bulk manifest"))?)),
        Err(ObjectError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// The manifest lists exactly the shards this client sealed, in the same order.
fn manifest_matches(record: &BulkRecord, manifest: &Manifest) -> Result<(), String> {
    let ours: Vec<(&str, JobId)> = record.shards.iter().map(|s| (s.key.as_str(), s.job_id)).collect();
    let theirs: Vec<(&str, JobId)> = manifest.shards.iter().map(|s| (s.key.as_str(), s.job_id)).collect();
    if manifest.bulk_id != record.bulk_id || manifest.prefix != record.prefix {
        return Err(format!("the manifest is bulk run {} over {}, not {} over {}", manifest.bulk_id, manifest.prefix, record.bulk_id, record.prefix));
    }
    if ours != theirs {
        let missing = ours.iter().filter(|s| !theirs.contains(s)).count();
        let extra = theirs.iter().filter(|s| !ours.contains(s)).count();
        return Err(format!("the manifest lists {} shards, {missing} of this client's missing and {extra} it did not seal", theirs.len()));
    }
    Ok(())
}

fn status_word(status: &ManifestStatus) -> &'static str {
    match status {
        ManifestStatus::Committed { .. } => "committed",
        ManifestStatus::TimedOut => "timed_out",
        ManifestStatus::Failed { .. } => "failed",
        ManifestStatus::Refused { .. } => "refused",
    }
}

/// `bulk status`: the execution, the manifest if written, else each shard's job.
pub fn status(home: &Home, services: &Services, bulk_id: &str, json: bool) -> anyhow::Result<()> {
    let record = BulkRecord::load(home, bulk_id)?;
    let execution = match (&record.execution, &services.bulk_workflow) {
        (Some(id), Some(workflow)) => Some(workflow.describe(id)?),
        _ => None,
    };
    let manifest = read_manifest(services, bulk_id)?;
    let mut shards = Vec::new();
    for (index, shard) in record.shards.iter().enumerate() {
        let state = match manifest.as_ref().and_then(|m| m.shards.iter().find(|s| s.job_id == shard.job_id)) {
            Some(listed) => status_word(&listed.status).to_owned(),
            None => crate::status::view(services, &record.job(index)).map(|v| v.state.as_str().to_owned()).unwrap_or_else(|e| e.to_string()),
        };
        shards.push(serde_json::json!({"key": shard.key, "job_id": shard.job_id, "records": shard.records, "state": state}));
    }
    if json {
        let value = serde_json::json!({
            "bulk_id": record.bulk_id,
            "prefix": record.prefix,
            "execution": execution,
            "manifest_key": manifest.as_ref().map(|_| layout::bulk_manifest(bulk_id)),
            "manifest": manifest.as_ref().map(|m| serde_json::json!({
                "committed": m.committed, "timed_out": m.timed_out, "failed": m.failed, "refused": m.refused,
                "records_ok": m.records_ok, "records_failed": m.records_failed, "tokens": m.tokens,
            })),
            "shards": shards,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("bulk      {}", record.bulk_id);
    println!("prefix    {}", record.prefix);
    println!("records   {} in {} shards ({} refused locally)", record.records, record.shards.len(), record.local_errors);
    match &execution {
        Some(e) => {
            let why = e.error.as_deref().map(|err| format!(": {err}: {}", e.cause.as_deref().unwrap_or(""))).unwrap_or_default();
            println!("workflow  {}{why}", e.status.as_str());
        }
        None => println!("workflow  {}", if record.execution.is_some() { "(no workflow reachable)" } else { "not started" }),
    }
    match &manifest {
        Some(m) => println!(
            "manifest  {}: {} committed, {} timed out, {} failed, {} refused; {} records embedded, {} failed",
            layout::bulk_manifest(bulk_id),
            m.committed,
            m.timed_out,
            m.failed,
            m.refused,
            m.records_ok,
            m.records_failed
        ),
        None => println!("manifest  not yet"),
    }
    for shard in &shards {
        println!("  {} {} {}", shard["job_id"].as_str().unwrap_or(""), shard["state"].as_str().unwrap_or(""), shard["key"].as_str().unwrap_or(""));
    }
    Ok(())
}

/// What `bulk results` wrote.
pub struct BulkWritten {
    pub summary: OutputSummary,
    pub output: PathBuf,
    pub errors: PathBuf,
    /// Shards whose results are in the output.
    pub shards_written: usize,
    /// Shards that did not commit (only with `partial`).
    pub shards_missing: Vec<String>,
    pub development_root: bool,
    /// Shards whose receipt the ledger does not hold yet.
    pub not_in_ledger: usize,
}

/// Where and how `bulk results` writes.
#[derive(Debug, Clone, Default)]
pub struct OutputChoice {
    /// Default: beside the input, `<stem>.embeddings.<ext>`.
    pub output: Option<PathBuf>,
    pub format: Option<Format>,
    /// Write the committed shards' results even if some shard did not commit.
    pub partial: bool,
}

/// Every committed shard's results, verified, into one output, in shard (= corpus) order.
pub fn results(
    home: &Home,
    services: &Services,
    trust: &ClientTrust,
    key: &ResultSecretKey,
    bulk_id: &str,
    choice: &OutputChoice,
) -> anyhow::Result<BulkWritten> {
    let (output, format, partial) = (choice.output.as_deref(), choice.format, choice.partial);
    let record = BulkRecord::load(home, bulk_id)?;
    let manifest = read_manifest(services, bulk_id)?
        .ok_or_else(|| anyhow!("bulk run {bulk_id} has no manifest yet (`ephem-batch bulk status {bulk_id}`)"))?;
    manifest_matches(&record, &manifest).map_err(|e| anyhow!("bulk run {bulk_id}: {e}"))?;
    let first = JobFiles::new(home, &record.shards[0].job_id.to_hex()).load()?;
    let format = format.unwrap_or_else(|| results::default_format(&first));
    let output = output.map(Path::to_path_buf).unwrap_or_else(|| results::default_output(&first, format));
    let committed: Vec<bool> = manifest.shards.iter().map(|s| matches!(s.status, ManifestStatus::Committed { .. })).collect();
    let missing: Vec<String> = record
        .shards
        .iter()
        .zip(&manifest.shards)
        .filter(|(_, m)| !matches!(m.status, ManifestStatus::Committed { .. }))
        .map(|(s, m)| format!("{} ({})", s.job_id, status_word(&m.status)))
        .collect();
    if !missing.is_empty() && !partial {
        bail!("{} of {} shards did not commit: {}; nothing written (--partial writes the others)", missing.len(), record.shards.len(), missing.join(", "));
    }
    let kind = results::output_kind(&first);
    format.check_writes(kind)?;
    // The OpenAI ids derive from the bulk id, as a job's from its job id.
    let options = OutputOptions {
        format: format.output(),
        model_id: first.model_id.clone(),
        results_of: ResultsOf::Bulk(bulk_id.to_owned()),
        dimensions: Some(results::dimensions(services, trust, &first)?).filter(|_| kind != OutputKind::Scores),
        kind,
    };
    let mut writer = OutputWriter::create(&output, options)?;
    let mut appended = Vec::new();
    for (index, done) in committed.iter().enumerate() {
        let job = record.job(index);
        if *done {
            appended.push(results::append_job(home, services, trust, key, &job, &mut writer)?);
        } else {
            results::append_local_errors(home, &job, &mut writer)?;
        }
    }
    let paths = writer.paths().clone();
    let summary = writer.finish()?;
    let mut not_in_ledger = 0;
    let shards_written = appended.len();
    for shard in appended {
        let verification = shard.save(home)?;
        if verification.checks.iter().any(|c| c.name == "ledger" && !c.passed) {
            not_in_ledger += 1;
        }
    }
    Ok(BulkWritten {
        summary,
        output: paths.output,
        errors: paths.errors,
        shards_written,
        shards_missing: missing,
        development_root: trust.development,
        not_in_ledger,
    })
}

/// `bulk verify`: the manifest's claims and every shard's receipt.
#[derive(Debug, Serialize)]
pub struct BulkVerification {
    pub bulk_id: String,
    pub development_root: bool,
    pub checks: Vec<Check>,
    pub shards: Vec<Verification>,
}

impl BulkVerification {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed) && !self.shards.is_empty() && self.shards.iter().all(Verification::passed)
    }

    pub fn print(&self) {
        for check in &self.checks {
            println!("{}  {:20} {}", if check.passed { "ok  " } else { "FAIL" }, check.name, check.detail);
        }
        for shard in &self.shards {
            let failed: Vec<String> = shard.failures().iter().map(|c| format!("{}: {}", c.name, c.detail)).collect();
            if failed.is_empty() {
                println!("ok    job {} ({} checks)", shard.job_id, shard.checks.len());
            } else {
                println!("FAIL  job {}: {}", shard.job_id, failed.join("; "));
            }
        }
        if self.passed() {
            println!("verified{}", if self.development_root { " (DEVELOPMENT root)" } else { "" });
        }
    }
}

pub fn verify(home: &Home, services: &Services, trust: &ClientTrust, key: &ResultSecretKey, bulk_id: &str) -> anyhow::Result<BulkVerification> {
    let record = BulkRecord::load(home, bulk_id)?;
    let mut out = BulkVerification { bulk_id: bulk_id.to_owned(), development_root: trust.development, checks: Vec::new(), shards: Vec::new() };
    let mut check = |name: &'static str, passed: bool, detail: String| out.checks.push(Check { name, passed, detail });
    let manifest = match read_manifest(services, bulk_id) {
        Ok(Some(m)) => m,
        Ok(None) => {
            check("manifest", false, format!("{} is not written (the run has not ended)", layout::bulk_manifest(bulk_id)));
            return Ok(out);
        }
        Err(e) => {
            check("manifest", false, e.to_string());
            return Ok(out);
        }
    };
    check("manifest", true, format!("{} (signs nothing: each receipt is checked below)", layout::bulk_manifest(bulk_id)));
    let matches = manifest_matches(&record, &manifest);
    check("shards", matches.is_ok(), matches.err().unwrap_or_else(|| format!("the {} shards this client sealed", record.shards.len())));
    let not_committed: Vec<String> =
        manifest.shards.iter().filter(|s| !matches!(s.status, ManifestStatus::Committed { .. })).map(|s| format!("{} {}", s.job_id, status_word(&s.status))).collect();
    check(
        "committed",
        not_committed.is_empty(),
        if not_committed.is_empty() { format!("all {} shards", manifest.shards.len()) } else { not_committed.join(", ") },
    );
    // What the manifest says of each receipt must be what is committed.
    let mut differing = Vec::new();
    for shard in &manifest.shards {
        if let ManifestStatus::Committed { receipt_sha256, .. } = &shard.status {
            let job = shard.job_id;
            let committed = services.jobs.get_at_most(&layout::job_receipt(&job), cloud::MAX_SMALL_OBJECT).ok().map(|b| hex::encode(Sha256::digest(&b)));
            if committed.as_deref() != Some(receipt_sha256.as_str()) {
                differing.push(shard.job_id.to_hex());
            }
        }
    }
    check("receipt_sha256", differing.is_empty(), if differing.is_empty() { "the manifest names the committed receipts".into() } else { differing.join(", ") });
    for index in 0..record.shards.len() {
        let job = record.job(index);
        out.shards.push(verify_job(home, services, trust, &job, key, None)?);
    }
    Ok(out)
}

/// `bulk …` subcommands.
pub fn run(home: &Home, services: &Services, command: BulkCommand) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match command {
        BulkCommand::Status { bulk_id, json } => {
            status(home, services, &bulk_id, json)?;
            Ok(ExitCode::SUCCESS)
        }
        BulkCommand::Results(args) => {
            let trust = ClientTrust::load(home, &args.trust)?;
            trust.warn_if_development();
            let key = crate::keys::load_result_key(&home.result_key(), false)?;
            let started = Instant::now();
            let choice = OutputChoice { output: args.output.clone(), format: args.format, partial: args.partial };
            let written = results(home, services, &trust, &key, &args.bulk_id, &choice)?;
            report(&args.bulk_id, &written, started.elapsed(), false);
            Ok(if written.shards_missing.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        BulkCommand::Verify { bulk_id, json, trust } => {
            let trust = ClientTrust::load(home, &trust)?;
            trust.warn_if_development();
            let key = crate::keys::load_result_key(&home.result_key(), false)?;
            let outcome = verify(home, services, &trust, &key, &bulk_id)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                outcome.print();
            }
            Ok(if outcome.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

/// What `bulk results` (and `submit --bulk --wait`) prints.
pub fn report(bulk_id: &str, written: &BulkWritten, elapsed: Duration, json: bool) {
    let s = &written.summary;
    if json {
        let value = serde_json::json!({
            "bulk_id": bulk_id,
            "shards": written.shards_written + written.shards_missing.len(),
            "shards_written": written.shards_written,
            "shards_missing": written.shards_missing,
            "embedded": s.records,
            "errors": s.errors,
            "tokens": s.tokens,
            "seconds": elapsed.as_secs_f64(),
            "output": written.output,
            "errors_file": written.errors,
            "verified": true,
            "in_ledger": written.not_in_ledger == 0,
        });
        println!("{value}");
        return;
    }
    println!("bulk {bulk_id}");
    println!("  shards    {} written{}", written.shards_written, if written.shards_missing.is_empty() { String::new() } else { format!(", {} missing: {}", written.shards_missing.len(), written.shards_missing.join(", ")) });
    println!("  embedded  {} records, {} tokens, {} dimensions", s.records, s.tokens, s.dimensions.unwrap_or(0));
    println!("  errors    {} ({})", s.errors, written.errors.display());
    println!("  output    {}", written.output.display());
    println!("  receipts  every shard's verified{}", if written.development_root { " (DEVELOPMENT root)" } else { "" });
    println!(
        "  ledger    {}",
        if written.not_in_ledger == 0 { "every entry verified".to_owned() } else { format!("{} shard(s) not yet in the ledger (see `ephem-batch bulk verify`)", written.not_in_ledger) }
    );
    println!("  seconds   {:.1}", elapsed.as_secs_f64());
}

/// Waits for the ledger to hold every committed shard's receipt (as `submit --wait` does for one job).
pub fn wait_for_ledger(services: &Services, record: &BulkRecord, manifest: &Manifest) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    for shard in manifest.shards.iter().filter(|s| matches!(s.status, ManifestStatus::Committed { .. })) {
        let job = shard.job_id;
        while crate::status::view(services, &job)?.ledger.is_none() {
            if Instant::now() > deadline {
                eprintln!("note: the ledger has not appended every receipt of bulk run {} yet", record.bulk_id);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// `submit --bulk --wait` after the workflow ended: the execution's verdict.
pub fn check_execution(record: &BulkRecord, execution: &cloud::Execution, manifest: Option<&Manifest>) -> anyhow::Result<()> {
    match (execution.status, manifest) {
        (ExecutionStatus::Succeeded, Some(_)) => Ok(()),
        (ExecutionStatus::Succeeded, None) => bail!("bulk run {} succeeded but wrote no manifest", record.bulk_id),
        (status, manifest) => bail!(
            "bulk run {} ended {}: {}: {}{}",
            record.bulk_id,
            status.as_str(),
            execution.error.as_deref().unwrap_or("no error recorded"),
            execution.cause.as_deref().unwrap_or(""),
            if manifest.is_some() { format!(" (the manifest {} is written)", layout::bulk_manifest(&record.bulk_id)) } else { String::new() }
        ),
    }
}
