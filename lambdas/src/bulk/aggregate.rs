//! `bulk-aggregate`: the manifest of a bulk run, from the listing `bulk-list-shards` wrote and
//! each job's own objects (receipt, status), with one word per shard from the workflow.

use cloud::bulk::{Manifest, ManifestShard, ManifestStatus};
use cloud::workflow::JOB_FAILED_ERROR;
use cloud::{layout, ObjectError, ObjectStore, PutCondition};
use protocol::envelope::JobId;
use protocol::receipt_check::ReceiptVerifier;
use receipts_ledger::{receipt_fields, ReceiptRefusal};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{check_bulk_id, distinct_jobs, failed_status, read_listing, strip_check, BulkError};

/// How the state machine left a shard: its task completed successfully, timed out, or failed
/// (a host's `SendTaskFailure`, or a step that kept failing). One word per shard, in the
/// listing's order: all the workflow's state keeps of the Map. The aggregate step trusts none
/// of these: it looks for every shard's receipt itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardStatus {
    Committed,
    TimedOut,
    Failed,
}

/// `bulk-aggregate` input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateInput {
    pub bulk_id: String,
    pub bucket: String,
    pub prefix: String,
    /// One per shard of `bulk/<bulk_id>/shards.json`, in its order.
    pub outcomes: Vec<ShardStatus>,
}

/// `bulk-aggregate` output: the execution's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateOutput {
    pub manifest_key: String,
    pub committed: usize,
    pub timed_out: usize,
    pub failed: usize,
}

const MANIFEST_NOTE: &str = "This manifest signs nothing. Each committed shard's receipt (jobs/<job_id>/receipt.cose) \
     is signed by the enclave that ran it and verifies on its own: `ephem-batch verify <job_id>`.";

/// The generic name of a task's failure, for a failed shard whose job records none.
const TASK_FAILED_ERROR: &str = "States.TaskFailed";

/// `bulk/<bulk_id>/manifest.json`.
pub fn manifest_key(bulk_id: &str) -> String {
    layout::bulk_manifest(bulk_id)
}

/// A reason recorded by a host is kept to this many characters in the manifest.
const MAX_REASON_CHARS: usize = 512;

/// Reads the run's listing back (bounded; it must be this run's, one outcome per shard, each
/// job once), looks for every shard's receipt at `jobs/<job_id>/receipt.cose` however its task
/// ended, verifies each with `check` against the attestation document it names in
/// `attestations`, and writes the manifest. A receipt that verifies makes the shard committed
/// even if its task failed or timed out; a task completed as committed without a receipt is
/// `refused`, as is a receipt that does not verify; either fails the step after the manifest
/// is written, so the run fails loudly (the `BulkRunsFailed` alarm) with the evidence in place.
/// Without a receipt, a failure the job's status records makes the shard `failed` whatever its
/// task said.
pub fn aggregate(
    input: &AggregateInput,
    jobs: &dyn ObjectStore,
    attestations: &dyn ObjectStore,
    check: &ReceiptVerifier,
    now_ms: u64,
) -> Result<AggregateOutput, BulkError> {
    check_bulk_id(&input.bulk_id)?;
    let listing = read_listing(jobs, &input.bulk_id)?;
    let listing_key = layout::bulk_shards(&input.bulk_id);
    if listing.prefix != input.prefix || listing.bucket != input.bucket {
        let message = format!("it lists {} in {}, not {} in {}", listing.prefix, listing.bucket, input.prefix, input.bucket);
        return Err(BulkError::Listing { key: listing_key, message });
    }
    if listing.shards.len() != input.outcomes.len() {
        return Err(BulkError::Outcomes { key: listing_key, listed: listing.shards.len(), outcomes: input.outcomes.len() });
    }
    distinct_jobs(&listing.shards)?;
    let mut shards = Vec::with_capacity(listing.shards.len());
    for (shard, outcome) in listing.shards.iter().zip(&input.outcomes) {
        let job = shard.job_id;
        let status = match (verify_shard(&job, jobs, attestations, check)?, outcome) {
            (Some(found), _) => found,
            (None, ShardStatus::Committed) => ManifestStatus::Refused {
                receipt_key: layout::job_receipt(&job),
                check: "receipt".into(),
                message: "the shard's task was completed as committed, but the store has no receipt".into(),
            },
            (None, outcome) => match failed_status(jobs, &job)? {
                Some(reason) => ManifestStatus::Failed { error: JOB_FAILED_ERROR.into(), reason: Some(reason.chars().take(MAX_REASON_CHARS).collect()) },
                None if *outcome == ShardStatus::Failed => ManifestStatus::Failed { error: TASK_FAILED_ERROR.into(), reason: None },
                None => ManifestStatus::TimedOut,
            },
        };
        shards.push(ManifestShard { key: shard.key.clone(), job_id: job, status });
    }
    let m = manifest(input, check, now_ms, shards);
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

/// The manifest with its totals, over shards of distinct jobs (so each job counts once).
fn manifest(input: &AggregateInput, check: &ReceiptVerifier, now_ms: u64, shards: Vec<ManifestShard>) -> Manifest {
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
                m.records_ok = m.records_ok.saturating_add(*records_ok);
                m.records_failed = m.records_failed.saturating_add(*records_failed);
                m.tokens = m.tokens.saturating_add(*tokens);
            }
            ManifestStatus::TimedOut => m.timed_out += 1,
            ManifestStatus::Failed { .. } => m.failed += 1,
            ManifestStatus::Refused { .. } => m.refused += 1,
        }
    }
    m
}

/// The shard's receipt, verified (`Committed` or `Refused`); `None` when there is none. The
/// receipt and the document it names are host-written: each read at most
/// [`cloud::MAX_SMALL_OBJECT`], and a larger one is refused by name.
fn verify_shard(
    job: &JobId,
    jobs: &dyn ObjectStore,
    attestations: &dyn ObjectStore,
    check: &ReceiptVerifier,
) -> Result<Option<ManifestStatus>, BulkError> {
    let receipt_key = layout::job_receipt(job);
    let leaf = match jobs.get_at_most(&receipt_key, cloud::MAX_SMALL_OBJECT) {
        Ok(leaf) => leaf,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(ObjectError::Rejected { message, .. }) => {
            return Ok(Some(ManifestStatus::Refused { receipt_key, check: "receipt".into(), message }));
        }
        Err(e) => return Err(e.into()),
    };
    verify_leaf(job, &receipt_key, &leaf, attestations, check).map(Some)
}

fn verify_leaf(
    job: &JobId,
    receipt_key: &str,
    leaf: &[u8],
    attestations: &dyn ObjectStore,
    check: &ReceiptVerifier,
) -> Result<ManifestStatus, BulkError> {
    let refused = |check: &str, message: String| ManifestStatus::Refused { receipt_key: receipt_key.to_owned(), check: check.into(), message };
    // The receipt names its document; read it unverified only to know which one to fetch.
    let named = match protocol::receipt::SignedReceipt::decode(leaf) {
        Ok(signed) => signed.receipt.attestation_sha256,
        Err(e) => return Ok(refused("receipt", e.to_string())),
    };
    let document = match attestations.get_at_most(&layout::attestation_by_hash(&named), cloud::MAX_SMALL_OBJECT) {
        Ok(doc) => doc,
        Err(ObjectError::NotFound { .. }) => {
            return Ok(refused("attestation", format!("document {} is not published", hex::encode(named))));
        }
        Err(ObjectError::Rejected { message, .. }) => return Ok(refused("attestation", message)),
        Err(e) => return Err(e.into()),
    };
    // The ledger's checks, all eight: a receipt it would refuse never makes a shard committed.
    let checked = check.verify(leaf, &document).map_err(ReceiptRefusal::from).and_then(|v| Ok((receipt_fields(&v)?, v)));
    let (fields, verified) = match checked {
        Ok(checked) => checked,
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
        pcr0: fields.pcr0,
        records_ok: r.records_ok,
        records_failed: r.records_failed,
        tokens: r.tokens,
        started_ms: r.started_ms,
        finished_ms: r.finished_ms,
    })
}
