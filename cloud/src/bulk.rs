//! `bulk/<bulk_id>/manifest.json`: what a bulk run's `bulk-aggregate` step writes
//! (`lambdas::bulk`) and the client reads (`ephem-batch bulk status | results | verify`). It
//! signs nothing: each committed shard's receipt verifies on its own.

use protocol::envelope::JobId;
use serde::{Deserialize, Serialize};

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
    /// No receipt, and no recorded failure, within the workflow's wait.
    TimedOut,
    /// No receipt. `error`: `EphemBatch.JobFailed` when the job's status records the failure
    /// (`reason`: what it records — informative, written by hosts), else `States.TaskFailed`
    /// (the shard's task failed; its error's name is in the execution's history).
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
    pub job_id: JobId,
    #[serde(flatten)]
    pub status: ManifestStatus,
}

