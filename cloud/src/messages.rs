//! The JSON bodies that travel on the queues. Nothing in them is trusted by the enclave: the
//! job message only tells a host which object to relay; the enclave checks the sealed bytes.

use base64::Engine;
use protocol::envelope::JobId;
use serde::{Deserialize, Serialize};

use crate::SendOptions;

/// On the job queue, sent by `on-upload` after it checked the sealed header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMessage {
    /// Derived from the envelope, checked by `on-upload` against the object key.
    pub job_id: JobId,
    pub input_key: String,
    pub input_size: u64,
    pub model_id: String,
    /// Hex SHA-256 of the signed manifest the client expects.
    pub manifest_hash: String,
    pub epoch: u64,
    pub record_count: u64,
    pub created_ms: u64,
    /// Receives the job spent before a host handed it over as a fresh message (a job sealed to
    /// an epoch only another image's hosts hold, during an image update): attempts go on
    /// counting from here, so no attempt number is used twice. Absent when zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub earlier_receives: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// On the ledger queue, sent by a host after it committed a receipt (or by `job-dead-letter`
/// for a committed job whose host stopped before it did).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerMessage {
    pub job_id: JobId,
    /// The receipt's exact COSE bytes, base64 (standard alphabet, padded).
    pub receipt: String,
    /// The attestation document the receipt names, base64.
    pub attestation_document: String,
}

/// The FIFO ledger queue's one message group: the ledger is a single sequence.
pub const LEDGER_GROUP: &str = "ledger";

impl LedgerMessage {
    pub fn new(job: &JobId, receipt: &[u8], attestation_document: &[u8]) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        LedgerMessage { job_id: *job, receipt: b64.encode(receipt), attestation_document: b64.encode(attestation_document) }
    }

    /// How a job's receipt is sent: in the ledger's group, deduplicated by the job id (a receipt
    /// sent twice within five minutes is delivered once; the ledger ignores a job it holds).
    pub fn send_options(job: &JobId) -> SendOptions {
        SendOptions { group_id: Some(LEDGER_GROUP.to_owned()), deduplication_id: Some(job.to_hex()), delay: std::time::Duration::ZERO }
    }
}

/// Where a job stands, as hosts and handlers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    InProgress,
    Completed,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::InProgress => "in_progress",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed | JobState::Cancelled)
    }
}

/// What failed, named as the enclave or the host named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The check that failed (`envelope`, `stream`, `model_manifest`, `header`, `dead_letter`, …).
    pub check: String,
    pub message: String,
}

/// The check of a job whose upload `on-upload` never turned into a job message: the
/// dead-letter consumer (`job-dead-letter`) ends it failed with this check.
pub const UPLOAD_UNPROCESSED: &str = "upload_unprocessed";
/// The check of a job whose message the job queue dead-lettered with no end recorded.
pub const DEAD_LETTERED: &str = "dead_lettered";

/// `jobs/<id>/status.json`: informative only — the receipt is the truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    pub job_id: JobId,
    pub state: JobState,
    pub updated_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Records the client sealed (from the header).
    pub records_total: u64,
    /// Records the enclave has processed so far.
    #[serde(default)]
    pub records_done: u64,
    #[serde(default)]
    pub tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_ok: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_failed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_key: Option<String>,
}

impl JobStatus {
    pub fn new(job_id: JobId, state: JobState, records_total: u64) -> Self {
        Self {
            job_id,
            state,
            updated_ms: crate::now_ms(),
            attempt: None,
            host: None,
            records_total,
            records_done: 0,
            tokens: 0,
            records_ok: None,
            records_failed: None,
            failure: None,
            output_key: None,
        }
    }
}

/// `jobs/<id>/ledgered.json`: the ledger holds the job's receipt at this index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledgered {
    pub job_id: JobId,
    pub index: u64,
    pub appended_ms: u64,
}
