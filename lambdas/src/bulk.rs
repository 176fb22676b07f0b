//! The bulk workflow's Lambda steps (`lambdas/asl/bulk-workflow.asl.json`,
//! docs/operations.md §6): `bulk-list-shards` lists the sealed shards under a store prefix,
//! derives each one's job id and writes the listing once to `bulk/<bulk_id>/shards.json`; for
//! each shard, `bulk-await-shard` runs as a `lambda:invoke.waitForTaskToken` task — it writes
//! the task token to the run's own slot `jobs/<job_id>/bulk-tasks/<bulk_id>.json`, then
//! completes the token itself if the job already ended (whoever ends the job later completes
//! it otherwise: `cloud::workflow`); once every shard's task is closed, `bulk-aggregate`
//! ([`aggregate`]) reads the listing back, verifies each receipt itself — a host completing a
//! token proves nothing — and writes `bulk/<bulk_id>/manifest.json`, which lists them and
//! signs nothing.
//!
//! The workflow's state holds the listing once (the Map's items, at most [`MAX_LISTING_BYTES`])
//! and one word per shard: never anything that grows with key names or receipts, so a run at
//! the listing cap stays under Step Functions' 256 KiB.

mod aggregate;
#[cfg(test)]
mod tests;

pub use aggregate::{aggregate, manifest_key, AggregateInput, AggregateOutput, ShardStatus};

use std::collections::BTreeMap;

use cloud::messages::{JobState, JobStatus};
use cloud::workflow::{self, BulkTask, BulkTaskError, Completion, JobEnd, TaskTokens};
use cloud::{layout, ObjectError, ObjectStore, PutCondition};
use protocol::envelope::JobId;
use receipts_ledger::ReceiptRefusal;
use serde::{Deserialize, Serialize};

use crate::on_upload::{derived_job_id, Config, SHARD_SUFFIX};

/// The bulk workflow's Amazon States Language definition, as the deployment deploys it
/// (placeholders unfilled): the CDK app reads the same file.
pub const WORKFLOW_DEFINITION: &str = include_str!("../asl/bulk-workflow.asl.json");

/// Shards one run takes: each is a Map item, and an inline Map's history must stay under
/// 25,000 events (docs/operations.md §6).
pub const MAX_SHARDS: usize = 1000;
/// Bytes the listing may take in the execution state (the Map's items; the state's limit is
/// 256 KiB).
pub const MAX_LISTING_BYTES: usize = 96 * 1024;
/// The most `bulk-aggregate` reads of `bulk/<bulk_id>/shards.json`: the shards and a header.
pub const MAX_LISTING_FILE_BYTES: u64 = MAX_LISTING_BYTES as u64 + 4096;

#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error("bulk id {0:?} is not 1 to 128 characters of A-Z a-z 0-9 . _ -")]
    BulkId(String),
    #[error("prefix {prefix:?} is not under a store prefix ({allowed})")]
    NotAStorePrefix { prefix: String, allowed: String },
    #[error("{count} shards under {prefix} ({bytes} bytes of listing): one run takes at most {MAX_SHARDS} and {MAX_LISTING_BYTES} bytes; split the prefix")]
    TooManyShards { prefix: String, count: usize, bytes: usize },
    /// Two shards are one job (a copy of a sealed shard): awaited twice in one run they would
    /// share one task slot, and the manifest would count the job twice.
    #[error("shards {first} and {second} are the same job {job_id}: remove one of them")]
    DuplicateJob { job_id: JobId, first: String, second: String },
    /// The run's listing is written once; this run's shards are not those it holds (the bulk
    /// id was used for another listing).
    #[error("{key} already lists other shards (bulk run {bulk_id} listed {prefix} before): use a new bulk id")]
    ListingTaken { key: String, bulk_id: String, prefix: String },
    #[error("{key} is not this run's listing: {message}")]
    Listing { key: String, message: String },
    #[error("the workflow reported {outcomes} shard outcomes for the {listed} shards of {key}")]
    Outcomes { key: String, listed: usize, outcomes: usize },
    #[error("{refused} of {total} receipts failed verification (see {manifest_key}): {first}")]
    ReceiptsRefused { refused: usize, total: usize, manifest_key: String, first: String },
    #[error("jobs store: {0}")]
    Object(#[from] ObjectError),
    #[error("{0}")]
    Task(#[from] BulkTaskError),
}

/// `bulk-list-shards` input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListInput {
    pub bulk_id: String,
    pub bucket: String,
    pub prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub key: String,
    pub job_id: JobId,
}

/// `bulk-list-shards` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOutput {
    pub shards: Vec<Shard>,
    pub shard_count: usize,
}

/// `bulk/<bulk_id>/shards.json`: the run's shards, in the Map's order. Written once, by
/// `bulk-list-shards` only (create-only, and its role's one write there); `bulk-aggregate`
/// reads it bounded and checks it against its input all the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub version: u32,
    pub bulk_id: String,
    pub bucket: String,
    pub prefix: String,
    pub shards: Vec<Shard>,
}

/// Lists the sealed shards under `input.prefix` (which must lie under a store prefix), reads
/// each one's job id from its preamble, refuses two shards of one job by name, and writes the
/// listing to `bulk/<bulk_id>/shards.json`. A shard whose preamble does not parse can never be
/// a job and is left out (logged with the reason); `on-upload` refuses it the same way.
pub fn list_shards(input: &ListInput, jobs: &dyn ObjectStore, config: &Config) -> Result<ListOutput, BulkError> {
    check_bulk_id(&input.bulk_id)?;
    let prefix = &input.prefix;
    if !config.store_prefixes.iter().any(|p| prefix.starts_with(p.as_str())) {
        return Err(BulkError::NotAStorePrefix { prefix: prefix.clone(), allowed: config.store_prefixes.join(",") });
    }
    let mut shards = Vec::new();
    for meta in jobs.list(prefix)? {
        if !meta.key.ends_with(SHARD_SUFFIX) {
            continue;
        }
        match derived_job_id(jobs, &meta.key) {
            Ok(Ok(job)) => shards.push(Shard { key: meta.key, job_id: job }),
            Ok(Err(reason)) => tracing::warn!(key = %meta.key, %reason, "not a sealed shard; left out of the bulk run"),
            Err(ObjectError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let bytes = serde_json::to_vec(&shards).expect("shards serialise").len();
    if shards.len() > MAX_SHARDS || bytes > MAX_LISTING_BYTES {
        return Err(BulkError::TooManyShards { prefix: prefix.clone(), count: shards.len(), bytes });
    }
    distinct_jobs(&shards)?;
    let listing = Listing { version: 1, bulk_id: input.bulk_id.clone(), bucket: input.bucket.clone(), prefix: prefix.clone(), shards };
    write_listing(jobs, &listing)?;
    tracing::info!(bulk_id = %input.bulk_id, %prefix, shards = listing.shards.len(), "shards listed");
    Ok(ListOutput { shard_count: listing.shards.len(), shards: listing.shards })
}

/// Every job once: the first two shards of one job, by name.
fn distinct_jobs(shards: &[Shard]) -> Result<(), BulkError> {
    let mut seen = BTreeMap::new();
    for shard in shards {
        if let Some(first) = seen.insert(shard.job_id, shard.key.as_str()) {
            return Err(BulkError::DuplicateJob { job_id: shard.job_id, first: first.to_owned(), second: shard.key.clone() });
        }
    }
    Ok(())
}

/// Create-only: a retried step (or a second execution of the same run) finds the same listing
/// there and goes on; another listing under the same bulk id is refused.
fn write_listing(jobs: &dyn ObjectStore, listing: &Listing) -> Result<(), BulkError> {
    let key = layout::bulk_shards(&listing.bulk_id);
    match jobs.put(&key, &serde_json::to_vec(listing).expect("a listing serialises"), PutCondition::CreateOnly) {
        Ok(_) => Ok(()),
        Err(ObjectError::AlreadyExists { .. }) => match read_listing(jobs, &listing.bulk_id) {
            Ok(there) if there == *listing => Ok(()),
            Ok(there) => Err(BulkError::ListingTaken { key, bulk_id: there.bulk_id, prefix: there.prefix }),
            Err(BulkError::Listing { .. }) => Err(BulkError::ListingTaken { key, bulk_id: listing.bulk_id.clone(), prefix: "(unreadable)".into() }),
            Err(e) => Err(e),
        },
        Err(e) => Err(e.into()),
    }
}

/// `bulk/<bulk_id>/shards.json`, read at most [`MAX_LISTING_FILE_BYTES`].
pub fn read_listing(jobs: &dyn ObjectStore, bulk_id: &str) -> Result<Listing, BulkError> {
    let key = layout::bulk_shards(bulk_id);
    let refused = |message: String| BulkError::Listing { key: key.clone(), message };
    let bytes = match jobs.get_at_most(&key, MAX_LISTING_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(ObjectError::Rejected { message, .. }) => return Err(refused(message)),
        Err(e) => return Err(e.into()),
    };
    let listing: Listing = serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))?;
    if listing.version != 1 || listing.bulk_id != bulk_id {
        return Err(refused(format!("version {}, bulk run {:?}", listing.version, listing.bulk_id)));
    }
    Ok(listing)
}

/// `bulk-await-shard` input: one Map item, with the task's token (`$$.Task.Token`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitInput {
    pub bulk_id: String,
    pub bucket: String,
    pub key: String,
    pub job_id: JobId,
    pub task_token: String,
}

/// What `bulk-await-shard` found after writing the token (the workflow ignores it: with
/// `.waitForTaskToken` the task's result is what completes the token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwaitState {
    /// The job has not ended: whoever ends it completes the token.
    Waiting,
    /// The job had ended; this step completed the token.
    Completed,
    /// The job had ended and the token was already closed (its host was first).
    AlreadyClosed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitOutput {
    pub job_id: JobId,
    pub state: AwaitState,
}

/// Writes the token a shard's task waits on into this run's slot, **then** looks for the
/// job's end (the committed receipt, else a failed or cancelled status) and completes the token
/// itself if it finds one. A host writes the end before it reads the slots, so whichever order
/// the two run in, one of them completes it.
pub fn await_shard(input: &AwaitInput, jobs: &dyn ObjectStore, tokens: &dyn TaskTokens, now_ms: u64) -> Result<AwaitOutput, BulkError> {
    check_bulk_id(&input.bulk_id)?;
    let job = input.job_id;
    workflow::write_bulk_task(jobs, &job, &input.bulk_id, &input.task_token, now_ms)?;
    let end = match jobs.head(&layout::job_receipt(&job))? {
        Some(_) => Some(JobEnd::Committed),
        None => failed_status(jobs, &job)?.map(|reason| JobEnd::Failed { reason }),
    };
    let state = match end {
        None => AwaitState::Waiting,
        Some(end) => {
            let task = BulkTask { version: 1, bulk_id: input.bulk_id.clone(), task_token: input.task_token.clone(), written_ms: now_ms };
            match workflow::complete_task(tokens, &task, &job, &end)? {
                Completion::Completed => AwaitState::Completed,
                Completion::AlreadyClosed { .. } => AwaitState::AlreadyClosed,
            }
        }
    };
    tracing::info!(bulk_id = %input.bulk_id, job = %job, key = %input.key, ?state, "shard awaited");
    Ok(AwaitOutput { job_id: job, state })
}

/// The recorded reason if the job's (informative, host-written) status says it failed or was
/// cancelled. Read at most [`cloud::MAX_SMALL_OBJECT`]; an oversized or unreadable status says
/// nothing.
fn failed_status(jobs: &dyn ObjectStore, job: &JobId) -> Result<Option<String>, BulkError> {
    let bytes = match jobs.get_at_most(&layout::job_status(job), cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. } | ObjectError::Rejected { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Ok(status) = serde_json::from_slice::<JobStatus>(&bytes) else { return Ok(None) };
    let reason = |default: &str| status.failure.as_ref().map_or_else(|| default.to_owned(), |f| format!("{}: {}", f.check, f.message));
    Ok(match status.state {
        JobState::Failed => Some(reason("failed (no reason recorded)")),
        JobState::Cancelled => Some("cancelled: the client cancelled the job before it started".to_owned()),
        _ => None,
    })
}

/// The error text without its leading `<check>: `.
fn strip_check(e: &ReceiptRefusal) -> String {
    let text = e.to_string();
    text.strip_prefix(&format!("{}: ", e.check())).map(str::to_owned).unwrap_or(text)
}

fn check_bulk_id(id: &str) -> Result<(), BulkError> {
    if workflow::is_valid_bulk_id(id) { Ok(()) } else { Err(BulkError::BulkId(id.to_owned())) }
}
