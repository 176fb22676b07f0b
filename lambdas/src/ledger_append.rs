//! `ledger-append`: a batch from the ledger queue (FIFO, one group, deduplicated by job id) →
//! receipts verified and appended to the ledger, with partial batch failure reporting.
//!
//! Each message is a [`LedgerMessage`]: the receipt's exact COSE bytes and the attestation
//! document it names. The ledger's [`ReceiptCheck`] verifies the document (at its own time), the
//! binding of the receipt key, and the receipt signature; the ledger holds at most one entry per
//! job, so a re-delivered message is a no-op. After the append, `jobs/<id>/ledgered.json` records
//! the index (the input-expiry rule keys off it).

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use base64::Engine as _;
use cloud::layout;
use cloud::messages::{LedgerMessage, Ledgered};
use cloud::{ObjectStore, PutCondition};
use protocol::envelope::JobId;
use receipts_ledger::{AppendRequest, Ledger, LedgerStore, ReceiptCheck};

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("message has no body")]
    NoBody,
    #[error("message body is not a ledger message: {0}")]
    Body(String),
    #[error("field {0} is not base64")]
    Base64(&'static str),
    #[error("job id {0:?} is not 32 hex digits")]
    JobId(String),
    #[error("receipt refused: {0}")]
    Receipt(String),
    #[error("the message names job {message}, the receipt job {receipt}")]
    JobMismatch { message: String, receipt: String },
    #[error("ledger: {0}")]
    Ledger(#[from] receipts_ledger::LedgerError),
    #[error("jobs store: {0}")]
    Object(#[from] cloud::ObjectError),
}

/// Appends every message of the batch; the response lists the ones that failed (they return to
/// the queue and, after the redrive limit, go to the dead-letter queue).
pub fn handle<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in &event.records {
        if let Err(error) = append_one(message, ledger, check, jobs, now_ms) {
            let id = message.message_id.clone().unwrap_or_default();
            tracing::warn!(message = %id, %error, "receipt not appended");
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
    }
    if let Err(error) = ledger.tick(now_ms) {
        tracing::warn!(%error, "checkpoint not signed");
    }
    response
}

fn append_one<S: LedgerStore>(
    message: &SqsMessage,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
) -> Result<u64, AppendError> {
    let body = message.body.as_deref().ok_or(AppendError::NoBody)?;
    let parsed: LedgerMessage = serde_json::from_str(body).map_err(|e| AppendError::Body(e.to_string()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let leaf = b64.decode(&parsed.receipt).map_err(|_| AppendError::Base64("receipt"))?;
    let document = b64.decode(&parsed.attestation_document).map_err(|_| AppendError::Base64("attestation_document"))?;
    let job = JobId::from_hex(&parsed.job_id).ok_or_else(|| AppendError::JobId(parsed.job_id.clone()))?;
    let fields = check.check(&leaf, &document).map_err(AppendError::Receipt)?;
    if fields.job_id != job.to_hex() {
        return Err(AppendError::JobMismatch { message: job.to_hex(), receipt: fields.job_id });
    }
    let outcome = ledger.append(AppendRequest { leaf, fields, attestation_document: document }, now_ms)?;
    let marker = Ledgered { job_id: job.to_hex(), index: outcome.index(), appended_ms: now_ms };
    match jobs.put(&layout::job_ledgered(&job), &serde_json::to_vec_pretty(&marker).expect("serialises"), PutCondition::Overwrite) {
        Ok(_) => {}
        // The entry is in; a deployment that marks inputs otherwise (an object tag) denies
        // this write, and the receipt must not be retried for it.
        Err(error @ cloud::ObjectError::AccessDenied { .. }) => tracing::warn!(job = %job, %error, "ledgered.json not written"),
        Err(error) => return Err(error.into()),
    }
    tracing::info!(job = %job, index = outcome.index(), "receipt in the ledger");
    Ok(outcome.index())
}
