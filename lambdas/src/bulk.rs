//! The bulk workflow's Lambda steps (`lambdas/asl/bulk-workflow.asl.json`,
//! docs/operations.md §6): `bulk-list-shards` lists the sealed shards under a store prefix and
//! derives each one's job id; for each shard, `bulk-await-shard` runs as a
//! `lambda:invoke.waitForTaskToken` task — it writes the task token to
//! `jobs/<job_id>/bulk-task.json`, then completes the token itself if the job already ended
//! (the host that ends the job later completes it otherwise: `cloud::workflow`); once every
//! shard's task is closed, `bulk-aggregate` verifies each receipt itself — a host completing a
//! token proves nothing — and writes `bulk/<bulk_id>/manifest.json`, which lists them and signs
//! nothing.

use cloud::messages::{JobState, JobStatus};
use cloud::workflow::{self, BulkTask, BulkTaskError, Completion, JobEnd, TaskTokens};
use cloud::{layout, ObjectError, ObjectStore, PutCondition};
use protocol::envelope::JobId;
use receipts_ledger::{ProtocolReceipts, ReceiptCheckError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::on_upload::{derived_job_id, Config, SHARD_SUFFIX};

/// Shards one run takes: the list travels in the execution state (256 KiB), twice (the
/// listing and the Map's results).
pub const MAX_SHARDS: usize = 1000;
/// Bytes the listing may take in the execution state.
pub const MAX_LISTING_BYTES: usize = 96 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error("bulk id {0:?} is not 1 to 128 characters of A-Z a-z 0-9 . _ -")]
    BulkId(String),
    #[error("prefix {prefix:?} is not under a store prefix ({allowed})")]
    NotAStorePrefix { prefix: String, allowed: String },
    #[error("{count} shards under {prefix} ({bytes} bytes of listing): one run takes at most {MAX_SHARDS} and {MAX_LISTING_BYTES} bytes; split the prefix")]
    TooManyShards { prefix: String, count: usize, bytes: usize },
    #[error("result {index} names job {job_id:?}, which is not 32 hex digits")]
    JobId { index: usize, job_id: String },
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
    pub job_id: String,
}

/// `bulk-list-shards` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOutput {
    pub shards: Vec<Shard>,
    pub shard_count: usize,
}

/// Lists the sealed shards under `input.prefix` (which must lie under a store prefix) and
/// reads each one's job id from its preamble. A shard whose preamble does not parse can never
/// be a job and is left out (logged with the reason); `on-upload` refuses it the same way.
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
            Ok(Ok(job)) => shards.push(Shard { key: meta.key, job_id: job.to_hex() }),
            Ok(Err(reason)) => tracing::warn!(key = %meta.key, %reason, "not a sealed shard; left out of the bulk run"),
            Err(ObjectError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let bytes = serde_json::to_vec(&shards).expect("shards serialise").len();
    if shards.len() > MAX_SHARDS || bytes > MAX_LISTING_BYTES {
        return Err(BulkError::TooManyShards { prefix: prefix.clone(), count: shards.len(), bytes });
    }
    tracing::info!(bulk_id = %input.bulk_id, %prefix, shards = shards.len(), "shards listed");
    Ok(ListOutput { shard_count: shards.len(), shards })
}

/// `bulk-await-shard` input: one Map item, with the task's token (`$$.Task.Token`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitInput {
    pub bulk_id: String,
    pub bucket: String,
    pub key: String,
    pub job_id: String,
    pub task_token: String,
}

/// What `bulk-await-shard` found after writing the token (the workflow ignores it: with
/// `.waitForTaskToken` the task's result is what completes the token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwaitState {
    /// The job has not ended: its host completes the token.
    Waiting,
    /// The job had ended; this step completed the token.
    Completed,
    /// The job had ended and the token was already closed (its host was first).
    AlreadyClosed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitOutput {
    pub job_id: String,
    pub state: AwaitState,
}

/// Writes the token a shard's task waits on, **then** looks for the job's end (the committed
/// receipt, else a failed or cancelled status) and completes the token itself if it finds one.
/// A host writes the end before it reads the token, so whichever order the two run in, one of
/// them completes it.
pub fn await_shard(input: &AwaitInput, jobs: &dyn ObjectStore, tokens: &dyn TaskTokens, now_ms: u64) -> Result<AwaitOutput, BulkError> {
    check_bulk_id(&input.bulk_id)?;
    let job = JobId::from_hex(&input.job_id).ok_or_else(|| BulkError::JobId { index: 0, job_id: input.job_id.clone() })?;
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
    Ok(AwaitOutput { job_id: job.to_hex(), state })
}

/// The recorded reason if the job's (informative) status says it failed or was cancelled.
fn failed_status(jobs: &dyn ObjectStore, job: &JobId) -> Result<Option<String>, BulkError> {
    let bytes = match jobs.get(&layout::job_status(job)) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
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

/// How the state machine left a shard: its task completed successfully, timed out, or failed
/// (a host's `SendTaskFailure`, or a step that kept failing). The aggregate step trusts none
/// of these: it looks for every shard's receipt itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardStatus {
    Committed,
    TimedOut,
    Failed,
}

/// One item of the Map state's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardResult {
    pub key: String,
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_key: Option<String>,
    pub status: ShardStatus,
    /// A failed task's error name (`EphemBatch.JobFailed`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `bulk-aggregate` input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateInput {
    pub bulk_id: String,
    pub bucket: String,
    pub prefix: String,
    pub results: Vec<ShardResult>,
}

/// `bulk-aggregate` output: the execution's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateOutput {
    pub manifest_key: String,
    pub committed: usize,
    pub timed_out: usize,
    pub failed: usize,
}

/// `bulk/<bulk_id>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub bulk_id: String,
    pub bucket: String,
    pub prefix: String,
    pub created_ms: u64,
    pub note: String,
    /// Hex SHA-256 of the attestation root the receipts were verified under.
    pub attestation_root: String,
    pub shards: Vec<ManifestShard>,
    pub committed: usize,
    pub timed_out: usize,
    #[serde(default)]
    pub failed: usize,
    pub refused: usize,
    pub records_ok: u64,
    pub records_failed: u64,
    pub tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum ManifestStatus {
    /// The receipt verified; what it says.
    Committed {
        receipt_key: String,
        receipt_sha256: String,
        input_sha256: String,
        output_sha256: String,
        attempt: u64,
        model_id: String,
        manifest_hash: String,
        attestation_sha256: String,
        pcr0: String,
        records_ok: u64,
        records_failed: u64,
        tokens: u64,
        started_ms: u64,
        finished_ms: u64,
    },
    /// No receipt within the workflow's wait.
    TimedOut,
    /// No receipt; the shard's task failed with `error`. `reason`: what the job's status
    /// records (informative, written by hosts).
    Failed {
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A receipt is there but does not verify; `check` names the failed check.
    Refused { receipt_key: String, check: String, message: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestShard {
    pub key: String,
    pub job_id: String,
    #[serde(flatten)]
    pub status: ManifestStatus,
}

const MANIFEST_NOTE: &str = "This manifest signs nothing. Each committed shard's receipt (jobs/<job_id>/receipt.cose) \
     is signed by the enclave that ran it and verifies on its own: `ephem-batch verify <job_id>`.";

/// `bulk/<bulk_id>/manifest.json`.
pub fn manifest_key(bulk_id: &str) -> String {
    layout::bulk_manifest(bulk_id)
}

/// A reason recorded by a host is kept to this many characters in the manifest.
const MAX_REASON_CHARS: usize = 512;

/// Looks for every shard's receipt at `jobs/<job_id>/receipt.cose` — whatever key the input
/// names and however its task ended — verifies each with `check` against the attestation
/// document it names in `attestations`, and writes the manifest. A receipt that verifies makes
/// the shard committed even if its task failed or timed out; a task completed as committed
/// without a receipt is `refused`, as is a receipt that does not verify; either fails the step
/// after the manifest is written, so the run fails loudly (the `BulkRunsFailed` alarm) with the
/// evidence in place.
pub fn aggregate(
    input: &AggregateInput,
    jobs: &dyn ObjectStore,
    attestations: &dyn ObjectStore,
    check: &ProtocolReceipts,
    now_ms: u64,
) -> Result<AggregateOutput, BulkError> {
    check_bulk_id(&input.bulk_id)?;
    let mut shards = Vec::with_capacity(input.results.len());
    for (index, r) in input.results.iter().enumerate() {
        let job = JobId::from_hex(&r.job_id).ok_or_else(|| BulkError::JobId { index, job_id: r.job_id.clone() })?;
        let status = match (verify_shard(&job, jobs, attestations, check)?, r.status) {
            (Some(found), _) => found,
            (None, ShardStatus::Committed) => ManifestStatus::Refused {
                receipt_key: layout::job_receipt(&job),
                check: "receipt".into(),
                message: "the shard's task was completed as committed, but the store has no receipt".into(),
            },
            (None, ShardStatus::TimedOut) => ManifestStatus::TimedOut,
            (None, ShardStatus::Failed) => ManifestStatus::Failed {
                error: r.error.clone().unwrap_or_else(|| "States.TaskFailed".into()),
                reason: failed_status(jobs, &job)?.map(|reason| reason.chars().take(MAX_REASON_CHARS).collect()),
            },
        };
        shards.push(ManifestShard { key: r.key.clone(), job_id: job.to_hex(), status });
    }
    let mut m = Manifest {
        version: 1,
        bulk_id: input.bulk_id.clone(),
        bucket: input.bucket.clone(),
        prefix: input.prefix.clone(),
        created_ms: now_ms,
        note: MANIFEST_NOTE.into(),
        attestation_root: hex::encode(check.root().sha256()),
        committed: 0,
        timed_out: 0,
        failed: 0,
        refused: 0,
        records_ok: 0,
        records_failed: 0,
        tokens: 0,
        shards,
    };
    for s in &m.shards {
        match &s.status {
            ManifestStatus::Committed { records_ok, records_failed, tokens, .. } => {
                m.committed += 1;
                m.records_ok += records_ok;
                m.records_failed += records_failed;
                m.tokens += tokens;
            }
            ManifestStatus::TimedOut => m.timed_out += 1,
            ManifestStatus::Failed { .. } => m.failed += 1,
            ManifestStatus::Refused { .. } => m.refused += 1,
        }
    }
    let key = manifest_key(&input.bulk_id);
    // A retried step rewrites the same content (but for its time).
    jobs.put(&key, &serde_json::to_vec_pretty(&m).expect("a manifest serialises"), PutCondition::Overwrite)?;
    tracing::info!(bulk_id = %m.bulk_id, committed = m.committed, timed_out = m.timed_out, failed = m.failed, refused = m.refused, "bulk manifest written");
    if let Some(first) = m.shards.iter().find_map(|s| match &s.status {
        ManifestStatus::Refused { check, message, .. } => Some(format!("job {}: {check}: {message}", s.job_id)),
        _ => None,
    }) {
        return Err(BulkError::ReceiptsRefused { refused: m.refused, total: m.shards.len(), manifest_key: key, first });
    }
    Ok(AggregateOutput { manifest_key: key, committed: m.committed, timed_out: m.timed_out, failed: m.failed })
}

/// The shard's receipt, verified (`Committed` or `Refused`); `None` when there is none.
fn verify_shard(
    job: &JobId,
    jobs: &dyn ObjectStore,
    attestations: &dyn ObjectStore,
    check: &ProtocolReceipts,
) -> Result<Option<ManifestStatus>, BulkError> {
    let receipt_key = layout::job_receipt(job);
    let leaf = match jobs.get(&receipt_key) {
        Ok(leaf) => leaf,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    verify_leaf(job, &receipt_key, &leaf, attestations, check).map(Some)
}

fn verify_leaf(
    job: &JobId,
    receipt_key: &str,
    leaf: &[u8],
    attestations: &dyn ObjectStore,
    check: &ProtocolReceipts,
) -> Result<ManifestStatus, BulkError> {
    let refused = |check: &str, message: String| ManifestStatus::Refused { receipt_key: receipt_key.to_owned(), check: check.into(), message };
    // The receipt names its document; read it unverified only to know which one to fetch.
    let named = match protocol::receipt::SignedReceipt::decode(leaf) {
        Ok(signed) => signed.receipt.attestation_sha256,
        Err(e) => return Ok(refused("receipt", e.to_string())),
    };
    let document = match attestations.get(&layout::attestation_by_hash(&named)) {
        Ok(doc) => doc,
        Err(ObjectError::NotFound { .. }) => {
            return Ok(refused("attestation", format!("document {} is not published", hex::encode(named))));
        }
        Err(e) => return Err(e.into()),
    };
    let verified = match check.verify(leaf, &document) {
        Ok(v) => v,
        Err(e) => return Ok(refused(e.check(), strip_check(&e))),
    };
    let r = &verified.receipt;
    if r.job_id != *job {
        return Ok(refused("job_id", format!("the receipt at {receipt_key} is job {}'s", r.job_id)));
    }
    Ok(ManifestStatus::Committed {
        receipt_sha256: hex::encode(Sha256::digest(leaf)),
        receipt_key: receipt_key.to_owned(),
        input_sha256: hex::encode(r.input_sha256),
        output_sha256: hex::encode(r.output_sha256),
        attempt: r.attempt,
        model_id: r.model_id.clone(),
        manifest_hash: hex::encode(r.manifest_hash),
        attestation_sha256: hex::encode(r.attestation_sha256),
        pcr0: verified.fields.pcr0.clone(),
        records_ok: r.records_ok,
        records_failed: r.records_failed,
        tokens: r.tokens,
        started_ms: r.started_ms,
        finished_ms: r.finished_ms,
    })
}

/// The error text without its leading `<check>: `.
fn strip_check(e: &ReceiptCheckError) -> String {
    let text = e.to_string();
    text.strip_prefix(&format!("{}: ", e.check())).map(str::to_owned).unwrap_or(text)
}

fn check_bulk_id(id: &str) -> Result<(), BulkError> {
    let ok = (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != "..";
    if ok { Ok(()) } else { Err(BulkError::BulkId(id.to_owned())) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud::local::DirObjectStore;
    use receipts_ledger::testing::DevEnclave;
    use receipts_ledger::PolicySet;

    const T: u64 = 1_761_955_200_000;

    /// Shard 1's receipt is the genuine image's; shard 2's comes from a host running its own
    /// image on genuine hardware (same root, another PCR0).
    #[test]
    fn bulk_aggregate_refuses_a_shard_receipt_from_another_image() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let attestations = DirObjectStore::open(tmp.path().join("attestations")).unwrap();
        let (genuine, other) = (DevEnclave::new(4, T), DevEnclave::with_image(4, 0xee, T));
        let mut results = Vec::new();
        for (job, enclave) in [(1u64, &genuine), (2, &other)] {
            let id = JobId(u128::from(job).to_be_bytes());
            jobs.put(&layout::job_receipt(&id), &enclave.sign(&enclave.receipt(job)), PutCondition::Overwrite).unwrap();
            let sha: [u8; 32] = Sha256::digest(&enclave.document).into();
            attestations.put(&layout::attestation_by_hash(&sha), &enclave.document, PutCondition::Overwrite).unwrap();
            results.push(ShardResult {
                key: format!("stores/s/incoming/b1/{job}.sealed"),
                job_id: id.to_hex(),
                receipt_key: None,
                status: ShardStatus::Committed,
                error: None,
            });
        }
        let input = AggregateInput { bulk_id: "b1".into(), bucket: "jobs".into(), prefix: "stores/s/incoming/b1/".into(), results };
        let shards = |jobs: &DirObjectStore| -> Vec<ManifestStatus> {
            let m: Manifest = serde_json::from_slice(&jobs.get(&manifest_key("b1")).unwrap()).unwrap();
            m.shards.into_iter().map(|s| s.status).collect()
        };
        // Any image under the root: the other image's receipt counts as committed.
        aggregate(&input, &jobs, &attestations, &ProtocolReceipts::new(genuine.anchor()), T).unwrap();
        assert!(matches!(shards(&jobs)[1], ManifestStatus::Committed { .. }));

        let publisher = ed25519_dalek::SigningKey::from_bytes(&[0x51; 32]);
        let set = PolicySet::verify(&publisher.verifying_key(), vec![("p.json".into(), genuine.policy(&publisher))]).unwrap();
        let check = ProtocolReceipts::enforcing(genuine.anchor(), set).unwrap();
        let err = aggregate(&input, &jobs, &attestations, &check, T).unwrap_err();
        assert!(matches!(&err, BulkError::ReceiptsRefused { refused: 1, total: 2, first, .. } if first.starts_with(&format!("job {}: policy: ", input.results[1].job_id))), "{err}");
        let shards = shards(&jobs);
        assert!(matches!(shards[0], ManifestStatus::Committed { .. }));
        assert!(matches!(&shards[1], ManifestStatus::Refused { check, message, .. } if check == "policy" && message.contains(&"ee".repeat(48))), "{:?}", shards[1]);
    }
}
