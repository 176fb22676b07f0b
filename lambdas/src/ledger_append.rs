//! `ledger-append`: a batch from the ledger queue (FIFO, one group, deduplicated by job id) →
//! receipts verified and appended to the ledger, with partial batch failure reporting.
//!
//! Each message is a [`LedgerMessage`]: the receipt's exact COSE bytes (a job's receipt, or a
//! usage receipt of online requests under its usage id, docs/protocol.md §9.5) and the attestation
//! document it names. The ledger's [`receipts_ledger::ReceiptCheck`] verifies the document (at
//! its own time), the binding of the receipt key, the receipt signature, and that the document's
//! measurements satisfy one of the publisher-signed policies the function was given ([`crate::policies`]);
//! the ledger holds at most one entry per job, so a re-delivered message is a no-op. After the
//! append, `jobs/<id>/ledger-proof.json` (the entry's proof bundle),
//! `jobs/<id>/transparent-statement.cbor` (the receipt with its COSE Receipt, for SCITT
//! verifiers) and then `jobs/<id>/ledgered.json` (the index; the input-expiry rule keys off it)
//! are written.
//!
//! Any host can send to the queue, and in a FIFO queue with one group a message that is not
//! done holds back every receipt behind it. So each message gets one [`Verdict`], by [`Fate`]:
//!
//! * **refused** (malformed, a failed check but `policy`, another receipt for a held job): the
//!   same bytes fail the same way every time, so it is acknowledged and logged with its check;
//!   nothing refused takes the job's slot;
//! * **held** (`policy`: no allowed policy admits the image — a squatter, or a new image whose
//!   policy is not uploaded yet): dead-lettered at once, not retried, so that after the operator
//!   uploads the policy `ephem-batch ledger redrive` appends it ([`redrive`]);
//! * **retried** (the stores, the jobs bucket, a panic): back to the queue after a short backoff
//!   chosen from its `ApproximateReceiveCount` ([`RetryBudget`]); on its last receive the delay
//!   is zero, so the queue's redrive policy dead-letters it at once. A poison message leaves
//!   the group within seconds, not after the visibility timeouts.
//!
//! Lambda's event source neither changes visibility nor dead-letters by itself, so
//! [`settle`] does both through the `cloud` queue port, and returns what stays in the queue.
//! [`LedgerFunction`] is the whole function (the ledger on S3, C2SP tlog-tiles with its SQLite
//! index as a cache), which the `lambda_runtime` binary serves and `ephem-batch dev aws-pump`
//! invokes against an emulator.

mod function;
#[cfg(test)]
mod tests;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use base64::Engine as _;
use cloud::layout;
use cloud::messages::{LedgerMessage, Ledgered};
use cloud::{ObjectStore, PutCondition, Queue, SendOptions};
use protocol::envelope::JobId;
use receipts_ledger::{
    AppendOutcome, BundleError, EntryKind, IndexedFields, Ledger, LedgerError, LedgerStore, ReceiptRefusal, StoreError, TileError,
};

pub use function::{queues_of, FunctionConfig, FunctionError, LedgerFunction, DEFAULT_CACHE_DIR};
pub use cloud::redrive::{redrive, RedriveError, RedriveReport};

/// The group receipts travel in; what a dead-lettered message without one is sent back into.
pub use cloud::messages::LEDGER_GROUP;

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("message has no body")]
    NoBody,
    #[error("message body is not a ledger message: {0}")]
    Body(String),
    #[error("field {0} is not base64")]
    Base64(&'static str),
    #[error("receipt refused: {0}")]
    Receipt(ReceiptRefusal),
    #[error("the message names job {message}, the receipt job {receipt}")]
    JobMismatch { message: JobId, receipt: JobId },
    /// The ledger already holds a different valid receipt for the job: two receipts for one job
    /// should never both exist (one commit wins at `jobs/<id>/receipt.cose`), so it is an alarm,
    /// not a success.
    #[error("the ledger holds another receipt for job {job} (entry {index}); this one is not appended")]
    OtherReceipt { job: JobId, index: u64 },
    #[error("ledger: {0}")]
    Ledger(#[from] receipts_ledger::LedgerError),
    #[error("the job's ledger proof: {0}")]
    Proof(#[from] BundleError),
    /// The job's transparent statement could not be made (its COSE Receipt not signed).
    #[error("the job's transparent statement: {0}")]
    Statement(#[from] receipts_ledger::scitt::ScittError),
    #[error("jobs store: {0}")]
    Object(#[from] cloud::ObjectError),
    /// A bug met by these bytes; retried like a failing store, so it leaves the group soon.
    #[error("the append panicked: {0}")]
    Panicked(String),
}

/// What a failure means for its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It can never be appended as it is: acknowledged, logged, never retried.
    Refused,
    /// Refused until the operator acts (check `policy`): dead-lettered at once.
    Held,
    /// It may pass (a store failing): retried within the message's budget.
    Retry,
}

impl AppendError {
    pub fn fate(&self) -> Fate {
        use receipts_ledger::LedgerError as L;
        match self {
            Self::NoBody | Self::Body(_) | Self::Base64(_) | Self::JobMismatch { .. } => Fate::Refused,
            Self::OtherReceipt { .. } => Fate::Refused,
            Self::Receipt(reason) | Self::Ledger(L::ReceiptRejected { reason, .. }) if reason.is_policy() => Fate::Held,
            Self::Receipt(_) | Self::Ledger(L::ReceiptRejected { .. } | L::FieldMismatch { .. } | L::InvalidField { .. }) => {
                Fate::Refused
            }
            Self::Ledger(L::Store(store)) => store_fate(store),
            Self::Ledger(L::Proof(_) | L::BeyondEnd { .. }) | Self::Proof(_) | Self::Statement(_) | Self::Object(_) | Self::Panicked(_) => {
                Fate::Retry
            }
        }
    }

    /// The failed check's name (`policy`, `receipt_signature`, …; `message` for a malformed
    /// message, `store` for an infrastructure failure, `panic` for a bug).
    pub fn check(&self) -> &'static str {
        use receipts_ledger::LedgerError as L;
        match self {
            Self::Receipt(reason) | Self::Ledger(L::ReceiptRejected { reason, .. }) => reason.check(),
            Self::JobMismatch { .. } => "job_id",
            Self::OtherReceipt { .. } => "other_receipt",
            Self::Ledger(L::FieldMismatch { .. } | L::InvalidField { .. }) => "fields",
            Self::Ledger(L::Store(store)) if store_fate(store) == Fate::Refused => "receipt_size",
            Self::NoBody | Self::Body(_) | Self::Base64(_) => "message",
            Self::Panicked(_) => "panic",
            Self::Ledger(_) | Self::Proof(_) | Self::Statement(_) | Self::Object(_) => "store",
        }
    }
}

/// A store error caused by the request's own bytes is final; any other is the store's.
fn store_fate(error: &StoreError) -> Fate {
    match error {
        StoreError::TooLarge { .. } | StoreError::Field(_) | StoreError::IntegerRange { .. } => Fate::Refused,
        StoreError::Tiles(tile) if matches!(**tile, TileError::EntryTooLarge { .. }) => Fate::Refused,
        _ => Fate::Retry,
    }
}

/// How often a message is tried before it leaves the group: the queue's `maxReceiveCount`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBudget {
    pub max_receives: u32,
}

/// Delays before the 2nd, 3rd, … receive of a message that failed (the last one repeats).
pub const RETRY_BACKOFF: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(8)];

impl RetryBudget {
    /// A queue whose redrive limit is unknown: backoff only.
    pub const UNKNOWN: RetryBudget = RetryBudget { max_receives: u32::MAX };

    /// How long a message that failed on its `receive_count`-th receive stays hidden: zero once
    /// the budget is spent, so the queue dead-letters it at the next receive.
    pub fn after(&self, receive_count: u32) -> Duration {
        if receive_count >= self.max_receives {
            return Duration::ZERO;
        }
        let step = receive_count.saturating_sub(1) as usize;
        RETRY_BACKOFF[step.min(RETRY_BACKOFF.len() - 1)]
    }
}

/// What the event source is to do with one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Appended, already held, or refused for good: deleted.
    Done,
    /// Refused until the operator acts: moved to the dead-letter queue now.
    DeadLetter,
    /// Back to the queue, visible again after `after`.
    Retry { after: Duration },
}

/// One message and its verdict.
#[derive(Debug)]
pub struct Handled<'e> {
    pub message: &'e SqsMessage,
    pub verdict: Verdict,
}

/// What became of one message (for metrics and tests).
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Newly appended (not for a job the ledger already held).
    Appended(&'a IndexedFields),
    /// Refused for good: acknowledged, never appended.
    Refused { message_id: &'a str, error: &'a AppendError },
    /// Refused until the operator acts: dead-lettered.
    Held { message_id: &'a str, error: &'a AppendError },
    /// Failed; tried again after `after`.
    Retried { message_id: &'a str, error: &'a AppendError, after: Duration },
}

/// Appends every message of the batch and gives each its [`Verdict`]. Every message is tried:
/// one that fails does not keep the ones after it out of the ledger (the ledger's order is its
/// own; the queue's only decides who waits).
pub fn process<'e, S: LedgerStore>(
    event: &'e SqsEvent,
    ledger: &mut Ledger<S>,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    budget: RetryBudget,
    outcome: &mut dyn FnMut(Outcome<'_>),
) -> Vec<Handled<'e>> {
    let mut handled = Vec::with_capacity(event.records.len());
    for message in &event.records {
        let mut appended = |fields: &IndexedFields| outcome(Outcome::Appended(fields));
        // A panic is a bug these bytes met; it must not take the batch (and the group) with it.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| append_one(message, ledger, jobs, now_ms, &mut appended)))
            .unwrap_or_else(|panic| Err(AppendError::Panicked(panic_text(panic.as_ref()))));
        let id = message.message_id.as_deref().unwrap_or_default();
        let verdict = match result {
            Ok(_) => Verdict::Done,
            Err(error) => match error.fate() {
                Fate::Refused => {
                    tracing::warn!(message = %id, check = error.check(), %error, "receipt refused for good; not retried");
                    outcome(Outcome::Refused { message_id: id, error: &error });
                    Verdict::Done
                }
                Fate::Held => {
                    tracing::error!(alarm = "ledger_receipt_held", message = %id, check = error.check(), %error,
                        "receipt held for the operator; dead-lettered (ephem-batch ledger redrive once its policy is uploaded)");
                    outcome(Outcome::Held { message_id: id, error: &error });
                    Verdict::DeadLetter
                }
                Fate::Retry => {
                    let receives = receive_count(message);
                    let after = budget.after(receives);
                    if matches!(error, AppendError::Panicked(_)) {
                        tracing::error!(alarm = "ledger_append_panicked", message = %id, %error, "the append panicked");
                    }
                    tracing::warn!(message = %id, check = error.check(), %error, receives, retry_after_s = after.as_secs(),
                        "receipt not appended; retried");
                    outcome(Outcome::Retried { message_id: id, error: &error, after });
                    Verdict::Retry { after }
                }
            },
        };
        handled.push(Handled { message, verdict });
    }
    if let Err(error) = ledger.tick(now_ms) {
        tracing::warn!(%error, "checkpoint not signed");
    }
    handled
}

/// [`process`] for an event source that only deletes what is not listed: the response lists
/// every message not done (dead-letters included: without a dead-letter queue to send to, the
/// queue's redrive policy moves them).
pub fn handle<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    jobs: &dyn ObjectStore,
    now_ms: u64,
) -> SqsBatchResponse {
    handle_with(event, ledger, jobs, now_ms, &mut |_| {})
}

/// [`handle`], telling `outcome` of each message.
pub fn handle_with<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    outcome: &mut dyn FnMut(Outcome<'_>),
) -> SqsBatchResponse {
    settle(&process(event, ledger, jobs, now_ms, RetryBudget::UNKNOWN, outcome), None)
}

/// The queues a function settles its verdicts on.
#[derive(Clone)]
pub struct LedgerQueues {
    /// The ledger queue the batch came from.
    pub source: Arc<dyn Queue>,
    /// Where held receipts go (the ledger's dead-letter queue).
    pub dead_letter: Option<Arc<dyn Queue>>,
    pub budget: RetryBudget,
}

/// Carries out the verdicts on `queues` — a retried message's visibility, a held one sent to
/// the dead-letter queue (same body and group; its message id as deduplication id, as SQS does
/// when it dead-letters) — and returns the partial batch response: what stays in the queue.
/// Without queues, nothing is changed and every message not done is listed.
pub fn settle(handled: &[Handled<'_>], queues: Option<&LedgerQueues>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for h in handled {
        let id = h.message.message_id.clone().unwrap_or_default();
        let handle = h.message.receipt_handle.as_deref().unwrap_or_default();
        let stays = match (&h.verdict, queues) {
            (Verdict::Done, _) => false,
            (_, None) => true,
            (Verdict::Retry { after }, Some(q)) => {
                if let Err(error) = q.source.change_visibility(handle, *after) {
                    // It comes back after the queue's own visibility timeout instead.
                    tracing::warn!(message = %id, %error, "visibility not changed");
                }
                true
            }
            (Verdict::DeadLetter, Some(q)) => match &q.dead_letter {
                Some(dlq) => match dead_letter(dlq.as_ref(), h.message) {
                    Ok(()) => false,
                    Err(error) => {
                        tracing::warn!(message = %id, %error, "not dead-lettered; retried");
                        let _ = q.source.change_visibility(handle, q.budget.after(receive_count(h.message)));
                        true
                    }
                },
                None => {
                    // Seen again at once until the queue's redrive policy moves it.
                    let _ = q.source.change_visibility(handle, Duration::ZERO);
                    true
                }
            },
        };
        if stays {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
    }
    response
}

fn dead_letter(dlq: &dyn Queue, message: &SqsMessage) -> Result<(), cloud::QueueError> {
    let id = message.message_id.clone().unwrap_or_default();
    let group = message.attributes.get("MessageGroupId").cloned().unwrap_or_else(|| LEDGER_GROUP.to_owned());
    let options = SendOptions { group_id: Some(group), deduplication_id: Some(id), ..SendOptions::default() };
    dlq.send(message.body.as_deref().unwrap_or_default(), &options).map(|_| ())
}

/// `ApproximateReceiveCount` (1 when absent).
fn receive_count(message: &SqsMessage) -> u32 {
    message.attributes.get("ApproximateReceiveCount").and_then(|n| n.parse().ok()).unwrap_or(1)
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| (*s).to_owned()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default()
}

fn append_one<S: LedgerStore>(
    message: &SqsMessage,
    ledger: &mut Ledger<S>,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    appended: &mut dyn FnMut(&IndexedFields),
) -> Result<u64, AppendError> {
    let body = message.body.as_deref().ok_or(AppendError::NoBody)?;
    let parsed: LedgerMessage = serde_json::from_str(body).map_err(|e| AppendError::Body(e.to_string()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let leaf = b64.decode(&parsed.receipt).map_err(|_| AppendError::Base64("receipt"))?;
    let document = b64.decode(&parsed.attestation_document).map_err(|_| AppendError::Base64("attestation_document"))?;
    let job = parsed.job_id;
    // Checked once, here; the append trusts this check (the ledger's own).
    let checked = ledger.check(leaf, document).map_err(|error| match error {
        LedgerError::ReceiptRejected { reason, .. } => AppendError::Receipt(reason),
        other => other.into(),
    })?;
    let fields = checked.fields().clone();
    if fields.job_id != job {
        return Err(AppendError::JobMismatch { message: job, receipt: fields.job_id });
    }
    let outcome = ledger.append_checked(checked, now_ms)?;
    match outcome {
        AppendOutcome::Appended { .. } => appended(&fields),
        AppendOutcome::Existing { index, same_leaf: false } => {
            // `ledgered.json` must not claim this receipt is in: the entry is another one.
            tracing::error!(alarm = "ledger_holds_another_receipt", job = %job, index, "a second receipt for a ledgered job");
            return Err(AppendError::OtherReceipt { job, index });
        }
        AppendOutcome::Existing { .. } => {}
    }
    // The witnesses' cosignatures before the proof, so the proof carries them.
    cosign(ledger);
    if fields.kind == EntryKind::Usage {
        // A usage receipt has no job objects; its client proves it from the ledger by its id.
        tracing::info!(usage = %job, index = outcome.index(), "usage receipt in the ledger");
        return Ok(outcome.index());
    }
    // The proof first: whoever sees `ledgered.json` finds the proof beside it.
    write_proof(ledger, jobs, &job, now_ms)?;
    let marker = Ledgered { job_id: job, index: outcome.index(), appended_ms: now_ms };
    put_job_object(jobs, &layout::job_ledgered(&job), &serde_json::to_vec_pretty(&marker).expect("serialises"))?;
    tracing::info!(job = %job, index = outcome.index(), "receipt in the ledger");
    Ok(outcome.index())
}

/// Submits the latest checkpoint to the configured witnesses. A witness that refuses or is down
/// does not hold the receipt back: the checkpoint stands without its cosignature, which a client
/// with a witness quorum then refuses, naming the check.
fn cosign<S: LedgerStore>(ledger: &Ledger<S>) {
    match ledger.cosign_latest() {
        None => {}
        Some(Ok(report)) if report.refused.is_empty() => {}
        Some(Ok(report)) => tracing::warn!(alarm = "checkpoint_not_cosigned", size = report.size, refused = ?report.refused, "witnesses did not cosign"),
        Some(Err(error)) => tracing::warn!(alarm = "checkpoint_not_cosigned", %error, "checkpoint not submitted to the witnesses"),
    }
}

/// `jobs/<id>/ledger-proof.json`: the entry proven against the latest checkpoint (signing one
/// first where the store has not yet), checked under the ledger's own key before it is handed out.
fn write_proof<S: LedgerStore>(ledger: &mut Ledger<S>, jobs: &dyn ObjectStore, job: &JobId, now_ms: u64) -> Result<(), AppendError> {
    let bundle = match receipts_ledger::prove(ledger.store(), job) {
        Err(BundleError::NotCheckpointed { .. }) => {
            ledger.checkpoint_now(now_ms)?;
            receipts_ledger::prove(ledger.store(), job)?
        }
        other => other?,
    };
    receipts_ledger::verify_bundle(&bundle, &ledger.verifier())?;
    put_job_object(jobs, &layout::job_ledger_proof(job), bundle.to_json().as_bytes())?;
    // The same entry for verifiers that know SCITT and nothing of this project (§8.13).
    let statement = receipts_ledger::scitt::export(&bundle, &job.to_hex(), ledger.signer())?;
    put_job_object(jobs, &layout::job_transparent_statement(job), &statement)
}

fn put_job_object(jobs: &dyn ObjectStore, key: &str, bytes: &[u8]) -> Result<(), AppendError> {
    match jobs.put(key, bytes, PutCondition::Overwrite) {
        Ok(_) => Ok(()),
        // The entry is in; a deployment that marks inputs otherwise (an object tag) denies
        // this write, and the receipt must not be retried for it.
        Err(error @ cloud::ObjectError::AccessDenied { .. }) => {
            tracing::warn!(key, %error, "job object not written");
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}
