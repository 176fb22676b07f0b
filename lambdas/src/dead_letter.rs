//! `job-dead-letter`: the end of the jobs nobody else will end. Two queues feed it:
//!
//! - **on-upload's on-failure destination.** Lambda gives up on an asynchronous invocation
//!   after its retries, or when the event waited longer than its maximum age, and sends a
//!   record wrapping the S3 event (`requestPayload`). No job message was sent, so no host will
//!   ever see the upload: the job ends `failed`, check [`UPLOAD_UNPROCESSED`].
//! - **The jobs DLQ.** The queue gave up on a job message after its last allowed receive. A
//!   host that fails a job on that receive writes the failure itself; one that died holding the
//!   message wrote nothing: the job ends `failed`, check [`DEAD_LETTERED`].
//!
//! The failed status is written only over a job that has not ended: a committed receipt or a
//! final status (completed, failed, cancelled) stays, and the write is conditional (create-only,
//! or If-Match the version read), so a host's end written meanwhile is never overwritten. Then a
//! bulk run waiting for the job has its task completed with how the job ended
//! ([`workflow::complete_bulk_task`]), as a host would have. A record that names no job (an
//! object outside the job inputs, a shard whose header does not parse, an unreadable body) is
//! logged at error level and consumed: there is nothing to mark.

use aws_lambda_events::s3::S3Event;
use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use cloud::messages::{Failure, JobMessage, JobState, JobStatus, LedgerMessage};
use cloud::workflow::{self, BulkTaskError, JobEnd};
use cloud::{layout, ObjectError, ObjectStore, PutCondition, QueueError, Services, MAX_SMALL_OBJECT};
use protocol::envelope::JobId;
use protocol::receipt::SignedReceipt;
use serde_json::Value;

use crate::on_upload::{self, Config};

/// The checks this consumer ends a job with (the client reads them too: `cloud::messages`).
pub use cloud::messages::{DEAD_LETTERED, UPLOAD_UNPROCESSED};

/// A status larger than this is not one a writer of this deployment made: read no more of it.
const STATUS_READ_LIMIT: u64 = 64 * 1024;
/// Conditional writes lost to another writer before this gives up (and the record is retried).
const WRITE_ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("completing the bulk task: {0}")]
    Task(#[from] BulkTaskError),
    #[error("sending the receipt to the ledger queue: {0}")]
    Queue(#[from] QueueError),
    #[error("the status of job {job} changed {WRITE_ATTEMPTS} times while it was being marked failed")]
    Contended { job: JobId },
}

/// What a record on the dead-letter consumer's queues is.
#[derive(Debug, Clone, PartialEq)]
pub enum DeadLetter {
    /// Lambda's on-failure record of an on-upload invocation: the S3 event and why it failed.
    Upload { event: S3Event, reason: String },
    /// A job message from the jobs DLQ.
    Job { message: JobMessage },
    /// Neither: nothing names a job.
    Unreadable { reason: String },
}

impl DeadLetter {
    /// Reads a queue message's body.
    pub fn parse(body: &str) -> DeadLetter {
        let value: Value = match serde_json::from_str(body) {
            Ok(value) => value,
            Err(error) => return DeadLetter::Unreadable { reason: format!("not JSON: {error}") },
        };
        if let Some(payload) = value.get("requestPayload") {
            return match serde_json::from_value::<S3Event>(payload.clone()) {
                Ok(event) => DeadLetter::Upload { event, reason: failure_reason(&value) },
                Err(error) => DeadLetter::Unreadable { reason: format!("a failure record without an S3 event: {error}") },
            };
        }
        match serde_json::from_value::<JobMessage>(value) {
            Ok(message) => DeadLetter::Job { message },
            Err(error) => DeadLetter::Unreadable { reason: format!("neither a failure record nor a job message: {error}") },
        }
    }
}

/// Why Lambda gave up, from a failure record: the function's last error, or the condition
/// (`RetriesExhausted`, `EventAgeExceeded`) and how often it was invoked.
fn failure_reason(record: &Value) -> String {
    let context = &record["requestContext"];
    let condition = context["condition"].as_str().unwrap_or("unknown condition");
    let invocations = context["approximateInvokeCount"].as_u64().unwrap_or(0);
    let error = record["responsePayload"]["errorMessage"].as_str();
    match error {
        Some(error) => format!("on-upload gave up after {invocations} invocation(s) ({condition}): {error}"),
        None => format!("on-upload gave up after {invocations} invocation(s) ({condition})"),
    }
}

/// The failure record Lambda sends to an asynchronous invocation's on-failure destination
/// (the shape AWS documents); the embedded default sends the same for its on-upload hook.
pub fn failure_record(event: &S3Event, condition: &str, invocations: u32, error: &str) -> String {
    serde_json::json!({
        "version": "1.0",
        "timestamp": protocol::attestation::format_ms(cloud::now_ms()),
        "requestContext": {
            "requestId": format!("local-{}", cloud::now_ms()),
            "functionArn": "local:function:on-upload",
            "condition": condition,
            "approximateInvokeCount": invocations,
        },
        "requestPayload": event,
        "responseContext": { "statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled" },
        "responsePayload": { "errorType": "EphemBatch.OnUploadError", "errorMessage": error },
    })
    .to_string()
}

/// What handling one record did, per job it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job's status is now failed with `check`.
    MarkedFailed { job_id: JobId, check: &'static str },
    /// The job had ended already (receipt committed, or a final status): left as it was.
    AlreadyEnded { job_id: JobId, state: JobState },
    /// The job's receipt is committed and the ledger does not hold it (its host stopped before
    /// it sent it): sent to the ledger queue, as the host would have.
    ReceiptSentToLedger { job_id: JobId },
    /// A shard whose job input exists: that input's own event ends the job.
    InputExists { job_id: JobId },
    /// Nothing to attach a status to.
    Unattributable { reason: String },
}

/// One SQS batch of either queue. A record that hit an error (the store or Step Functions
/// unreachable, a status that kept changing) is reported failed and comes back later.
pub fn handle(event: &SqsEvent, services: &Services, config: &Config) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for record in &event.records {
        let id = record.message_id.clone().unwrap_or_default();
        let outcomes = handle_body(record.body.as_deref().unwrap_or_default(), services, config);
        match outcomes {
            Ok(outcomes) => outcomes.iter().for_each(log_outcome),
            Err(error) => {
                tracing::warn!(message = %id, %error, "dead letter not handled; retried");
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = id;
                response.batch_item_failures.push(failure);
            }
        }
    }
    response
}

fn log_outcome(outcome: &Outcome) {
    match outcome {
        Outcome::MarkedFailed { job_id, check } => tracing::warn!(job = %job_id, check, "job marked failed"),
        Outcome::AlreadyEnded { job_id, state } => tracing::info!(job = %job_id, state = state.as_str(), "job had ended already"),
        Outcome::ReceiptSentToLedger { job_id } => tracing::warn!(job = %job_id, "job had ended; its receipt is sent to the ledger"),
        Outcome::InputExists { job_id } => tracing::info!(job = %job_id, "the shard's job input exists; its own event ends the job"),
        Outcome::Unattributable { reason } => tracing::error!(%reason, "a dead letter names no job; nothing marked"),
    }
}

/// One queue message.
pub fn handle_body(body: &str, services: &Services, config: &Config) -> Result<Vec<Outcome>, DeadLetterError> {
    match DeadLetter::parse(body) {
        DeadLetter::Upload { event, reason } => {
            let mut outcomes = Vec::new();
            for record in &event.records {
                let Some(raw) = record.s3.object.key.as_deref() else { continue };
                outcomes.push(end_upload(&on_upload::url_decode(raw), &reason, services, config)?);
            }
            Ok(outcomes)
        }
        DeadLetter::Job { message } => {
            let job = message.job_id;
            let reason = "the job queue dead-lettered the job's message after its last allowed receive, and no end was recorded \
                          (the host holding it stopped)";
            Ok(vec![end_job(&job, DEAD_LETTERED, reason, services)?])
        }
        DeadLetter::Unreadable { reason } => Ok(vec![Outcome::Unattributable { reason }]),
    }
}

/// An upload on-upload gave up on: a job input names its job; a shard's header derives it.
fn end_upload(key: &str, reason: &str, services: &Services, config: &Config) -> Result<Outcome, DeadLetterError> {
    let unattributable = |why: String| Ok(Outcome::Unattributable { reason: format!("{key}: {why} ({reason})") });
    if let Some(job) = layout::job_of_input_key(key) {
        return end_job(&job, UPLOAD_UNPROCESSED, reason, services);
    }
    if config.shard_prefix(key).is_none() {
        return unattributable("neither a job input nor a shard under a store prefix".into());
    }
    let job = match on_upload::derived_job_id(services.jobs.as_ref(), key) {
        Ok(Ok(job)) => job,
        Ok(Err(message)) => return unattributable(format!("the shard's header does not parse: {message}")),
        Err(ObjectError::NotFound { .. }) => return unattributable("the shard is gone".into()),
        Err(error) => return Err(error.into()),
    };
    if services.jobs.head(&layout::job_input(&job))?.is_some() {
        return Ok(Outcome::InputExists { job_id: job });
    }
    end_job(&job, UPLOAD_UNPROCESSED, reason, services)
}

/// Marks `job` failed unless it ended, then completes a waiting bulk task with its end.
fn end_job(job: &JobId, check: &'static str, message: &str, services: &Services) -> Result<Outcome, DeadLetterError> {
    let failure = Failure { check: check.to_owned(), message: message.to_owned() };
    let (outcome, end) = match mark_failed(services.jobs.as_ref(), job, failure)? {
        Marked::Failed => (Outcome::MarkedFailed { job_id: *job, check }, JobEnd::Failed { reason: format!("{check}: {message}") }),
        Marked::Ended { state, failure } => {
            let end = match (state, failure) {
                (JobState::Completed, _) => JobEnd::Committed,
                (_, Some(f)) => JobEnd::Failed { reason: format!("{}: {}", f.check, f.message) },
                (state, None) => JobEnd::Failed { reason: state.as_str().to_owned() },
            };
            let outcome = match state {
                JobState::Completed if send_receipt_to_ledger(job, services)? => Outcome::ReceiptSentToLedger { job_id: *job },
                state => Outcome::AlreadyEnded { job_id: *job, state },
            };
            (outcome, end)
        }
    };
    // A host that ended the job may have died before it completed the task: completing it
    // again finds it closed, which is no error.
    if let Some(tokens) = services.task_tokens.as_deref() {
        match workflow::complete_bulk_task(services.jobs.as_ref(), tokens, job, &end) {
            Ok(completion) => tracing::info!(job = %job, ?completion, "a waiting bulk task is completed with the job's end"),
            Err(error) if error.is_access_denied() => {
                tracing::warn!(job = %job, %error, "bulk task not completed; the run waits for its timeout");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(outcome)
}

/// Sends the committed receipt of `job` to the ledger queue unless the ledger holds the job
/// (`ledgered.json`): a host that died after committing, on the message's last receive, sent
/// nothing, and no later delivery would. The appender verifies it like any receipt; a second
/// send of one it holds is a quiet success. `false` when there was nothing to send.
fn send_receipt_to_ledger(job: &JobId, services: &Services) -> Result<bool, DeadLetterError> {
    if services.jobs.head(&layout::job_ledgered(job))?.is_some() {
        return Ok(false);
    }
    let receipt_bytes = match services.jobs.get_at_most(&layout::job_receipt(job), MAX_SMALL_OBJECT) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(false),
        Err(ObjectError::Rejected { message, .. }) => {
            tracing::error!(job = %job, %message, "the committed receipt is not one an enclave signed; not sent to the ledger");
            return Ok(false);
        }
        Err(error) => return Err(error.into()),
    };
    let receipt = match SignedReceipt::decode(&receipt_bytes) {
        Ok(signed) if signed.receipt.job_id == *job => signed.receipt,
        Ok(_) | Err(_) => {
            tracing::error!(job = %job, "the committed receipt does not decode as this job's; not sent to the ledger");
            return Ok(false);
        }
    };
    let document_key = layout::attestation_by_hash(&receipt.attestation_sha256);
    let document = match services.attestations.get_at_most(&document_key, MAX_SMALL_OBJECT) {
        Ok(document) => document,
        Err(error @ (ObjectError::NotFound { .. } | ObjectError::Rejected { .. })) => {
            tracing::error!(job = %job, %error, "the attestation document the receipt names is not published; not sent to the ledger");
            return Ok(false);
        }
        Err(error) => return Err(error.into()),
    };
    let body = serde_json::to_string(&LedgerMessage::new(job, &receipt_bytes, &document)).expect("a ledger message serialises");
    services.ledger_queue.send(&body, &LedgerMessage::send_options(job))?;
    tracing::info!(job = %job, "a committed receipt the ledger did not hold is sent to it");
    Ok(true)
}

/// How [`mark_failed`] left the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marked {
    /// This call wrote the failed status.
    Failed,
    /// The job had ended (`Completed` also when only the receipt says so).
    Ended { state: JobState, failure: Option<Failure> },
}

/// Writes `jobs/<id>/status.json` = failed with `failure`, unless the job has ended: a
/// committed receipt or a final status wins. Create-only where there is no status, If-Match
/// the version read where there is one; a write lost to another writer looks again.
pub fn mark_failed(jobs: &dyn ObjectStore, job: &JobId, failure: Failure) -> Result<Marked, DeadLetterError> {
    let key = layout::job_status(job);
    for _ in 0..WRITE_ATTEMPTS {
        if jobs.head(&layout::job_receipt(job))?.is_some() {
            return Ok(Marked::Ended { state: JobState::Completed, failure: None });
        }
        let mut status = JobStatus::new(*job, JobState::Failed, 0);
        let condition = match jobs.head(&key)? {
            None => PutCondition::CreateOnly,
            Some(meta) => {
                let bytes = match jobs.read_range(&key, 0, STATUS_READ_LIMIT + 1) {
                    Ok(bytes) => bytes,
                    Err(ObjectError::NotFound { .. }) => continue,
                    Err(error) => return Err(error.into()),
                };
                // A status that does not parse is replaced; one that does keeps its counts.
                if let Some(current) = (bytes.len() as u64 <= STATUS_READ_LIMIT)
                    .then(|| serde_json::from_slice::<JobStatus>(&bytes).ok())
                    .flatten()
                {
                    if current.state.is_final() {
                        return Ok(Marked::Ended { state: current.state, failure: current.failure });
                    }
                    status = JobStatus { state: JobState::Failed, failure: None, updated_ms: cloud::now_ms(), ..current };
                }
                PutCondition::IfMatch(meta.etag)
            }
        };
        status.failure = Some(failure.clone());
        let bytes = serde_json::to_vec_pretty(&status).expect("a status serialises");
        match jobs.put(&key, &bytes, condition) {
            Ok(_) => return Ok(Marked::Failed),
            Err(ObjectError::AlreadyExists { .. } | ObjectError::PreconditionFailed { .. } | ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(DeadLetterError::Contended { job: *job })
}

#[cfg(test)]
mod tests;
