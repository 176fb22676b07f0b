//! One delivery of a job message, from receive to delete (DESIGN.md §5 steps 4–7).
//!
//! Every step is idempotent by job id, because delivery is at-least-once: a committed receipt
//! ends the job (a later delivery only makes sure the ledger heard of it), each attempt writes
//! its own output object, and the receipt is written create-only, so the first finished attempt
//! wins. The message is deleted only once output and receipt are durable; until then a crash
//! anywhere just means another delivery.
//!
//! When a job ends (receipt committed, failed for good, dead-lettered, cancelled) and a bulk
//! run waits for it (a slot under `jobs/<id>/bulk-tasks/`), the host completes that run's task token
//! after writing the end (`cloud::workflow`): the workflow's await step writes the token before
//! it looks for the end, so one of the two always completes it.

use std::sync::Arc;
use std::time::Duration;

use cloud::messages::{Failure, JobMessage, LedgerMessage};
use cloud::workflow::JobEnd;
use cloud::{layout, Completion, ObjectError, ObjectWriter, PutCondition, QueueError, Received, SendOptions, Services};
use protocol::cancel;
use protocol::FailedCheck;
use protocol::envelope::JobId;
use protocol::receipt::{Receipt, SignedReceipt};
use sha2::{Digest, Sha256};

use cloud::MAX_SMALL_OBJECT;
use crate::control;
use crate::heartbeat::Heartbeat;
use crate::job::{Attempt, AttemptError, Verdict};
use crate::relay::Relay;
use crate::retry;
use crate::shared::Shared;
use crate::status::{self, StatusBoard};
use crate::worker_link::WorkerEndpoint;

/// Whether a read found nothing: S3 answers an absent key with 404 only to a caller allowed
/// `s3:ListBucket` on it, else 403, and how an account evaluates the host's prefix-conditioned
/// grant is not something a job may hang on. Nothing is lost by reading 403 as absent here: the
/// receipt's commit is create-only, so a job already done is found done there.
fn absent(error: &ObjectError) -> bool {
    matches!(error, ObjectError::NotFound { .. } | ObjectError::AccessDenied { .. })
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Receipt committed by this delivery, message deleted.
    Completed,
    /// The receipt was already committed: no rework.
    Duplicate,
    /// This attempt finished, but another one had committed its receipt first.
    LostRace,
    Cancelled,
    /// Failed for good (`check` as the worker named it); message deleted.
    Failed { check: FailedCheck },
    /// Left in the queue for another attempt.
    Retry { check: String },
    /// Failed on the queue's last allowed receive: the queue moves it to the dead-letter queue.
    DeadLettered { check: String },
    /// Handed back to the queue at once (shutdown).
    Released,
    /// Sealed to an epoch only another host holds: sent again as a fresh message for it
    /// (`crate::handover`), visible after `delay`; this one deleted.
    HandedOver { holder: String, delay: Duration },
    /// The body is not a job message; left for the dead-letter queue.
    Unreadable,
}

pub(crate) struct Settings {
    pub host_id: String,
    pub visibility: Duration,
    pub max_receives: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub stall_timeout: Duration,
}

/// What every delivery needs.
pub(crate) struct Context {
    pub services: Services,
    pub endpoint: WorkerEndpoint,
    pub relay: Arc<Relay>,
    pub shared: Arc<Shared>,
    pub settings: Settings,
}

#[derive(Debug, thiserror::Error)]
enum LedgerSendError {
    #[error("the attestation document the receipt names: {0}")]
    Attestation(ObjectError),
    #[error("ledger queue: {0}")]
    Queue(QueueError),
}

/// Handles one received message to the end.
pub(crate) fn handle(ctx: &Context, received: Received) -> Disposition {
    // A job id that is not 32 lowercase hex digits fails the parse: the message is unreadable.
    let message = match serde_json::from_str::<JobMessage>(&received.body) {
        Ok(message) => message,
        Err(error) => {
            // Nothing to attach a status to; the dead-letter queue is where an operator looks.
            tracing::error!(message_id = received.message_id, reason = %error, "unreadable job message");
            let delay = retry::jittered(retry::exponential(ctx.settings.retry_base, received.receive_count, ctx.settings.retry_max));
            set_visibility(ctx, &received, delay);
            return Disposition::Unreadable;
        }
    };
    let job = message.job_id;
    let span = tracing::info_span!("job", job = %job, receive = received.receive_count);
    let _entered = span.enter();
    let heartbeat =
        Heartbeat::start(Arc::clone(&ctx.services.job_queue), received.receipt_handle.clone(), job.to_hex(), ctx.settings.visibility);
    let status = StatusBoard::new(Arc::clone(&ctx.services.jobs), &job, message.record_count, &ctx.settings.host_id);
    let mut delivery = Delivery { ctx, received, message, job, heartbeat, status };
    let disposition = delivery.run();
    tracing::info!(?disposition, "delivery done");
    disposition
}

struct Delivery<'a> {
    ctx: &'a Context,
    received: Received,
    message: JobMessage,
    job: JobId,
    heartbeat: Heartbeat,
    status: StatusBoard,
}

impl Delivery<'_> {
    fn run(&mut self) -> Disposition {
        let jobs = &self.ctx.services.jobs;
        match retry::transient("get receipt", || jobs.get_at_most(&layout::job_receipt(&self.job), MAX_SMALL_OBJECT)) {
            Ok(receipt) => return self.duplicate(receipt, Disposition::Duplicate),
            Err(error) if absent(&error) => {}
            Err(error) => return self.retry("object_store", error.to_string()),
        }
        match self.cancel_signed() {
            Ok(true) => {
                self.heartbeat.stop();
                self.delete_message();
                self.status.cancelled();
                self.complete_bulk_task(&JobEnd::Failed { reason: "cancelled: the client cancelled the job before it started".into() });
                return Disposition::Cancelled;
            }
            Ok(false) => {}
            Err(error) => return self.retry("object_store", error.to_string()),
        }

        // Under a model memory budget the worker may not hold this job's model yet.
        let ctx = self.ctx;
        crate::residency::ensure_model(&ctx.services, &ctx.shared, ctx.settings.stall_timeout, &self.job, &self.message.model_id);

        let attempt = u64::from(self.received.receive_count) + u64::from(self.message.earlier_receives);
        self.status.in_progress(attempt);
        let output_key = layout::job_output(&self.job, attempt);
        let writer = match retry::transient("open output", || jobs.writer(&output_key, PutCondition::CreateOnly)) {
            Ok(writer) => writer,
            Err(error) => return self.retry("output", error.to_string()),
        };
        // The key follows from the job id; the message's copy is informative (and untrusted).
        let input_key = layout::job_input(&self.job);
        if self.message.input_key != input_key {
            tracing::warn!(claimed = self.message.input_key, "job message names another input key; using the job's own");
        }
        let runner = Attempt {
            endpoint: &self.ctx.endpoint,
            shared: &self.ctx.shared,
            jobs,
            input_key: &input_key,
            job: &self.job,
            attempt,
            stall_timeout: self.ctx.settings.stall_timeout,
        };
        let status = &mut self.status;
        let result = runner.run(writer, &mut |records, tokens| status.progress(records, tokens));
        match result {
            Ok(Verdict::Done { receipt, output, output_bytes }) => {
                tracing::info!(output_bytes, "worker finished the job");
                self.commit(receipt, output, attempt)
            }
            Ok(Verdict::Failed { check, message }) => self.refused(check, message),
            Err(AttemptError::Aborted) => self.release(),
            Err(error) => {
                if matches!(error, AttemptError::Link(_) | AttemptError::Unexpected(_) | AttemptError::Stalled(_)) {
                    // The worker may have been replaced: let control look.
                    self.ctx.shared.request_rescan();
                }
                tracing::warn!(%error, "attempt lost");
                self.retry(error.check(), error.to_string())
            }
        }
    }

    /// Whether `cancel.json` is the submitter's: anyone who can write the bucket can put one,
    /// so it counts only if its signature verifies against the result key in the job's own
    /// header (whose bytes the job id commits to). Any other is logged and the job runs.
    fn cancel_signed(&self) -> Result<bool, ObjectError> {
        let jobs = &self.ctx.services.jobs;
        let body = match retry::transient("get cancel", || jobs.get_at_most(&layout::job_cancel(&self.job), cancel::MAX_CANCEL_LEN)) {
            Ok(body) => body,
            Err(error) if absent(&error) => return Ok(false),
            Err(ObjectError::Rejected { message, .. }) => {
                tracing::warn!(check = "cancel", message, "cancel.json ignored; the job runs");
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        let input = match retry::transient("read input header", || jobs.read_range(&layout::job_input(&self.job), 0, cancel::INPUT_PREFIX_LEN)) {
            Ok(input) => input,
            // No input to name the key: nothing to run either, the attempt says so.
            Err(ObjectError::NotFound { .. }) => return Ok(false),
            Err(error) => return Err(error),
        };
        match cancel::check(&input, &self.job, &body) {
            Ok(()) => Ok(true),
            Err(error) => {
                tracing::warn!(check = "cancel", %error, "cancel.json is not the submitter's; ignored, the job runs");
                Ok(false)
            }
        }
    }

    /// The worker refused the job.
    fn refused(&mut self, check: FailedCheck, message: String) -> Disposition {
        tracing::warn!(check = check.as_str(), message, "worker refused the job");
        if check == FailedCheck::FleetKey {
            if let Some(handed) = self.hand_over(&message) {
                return handed;
            }
        }
        if check.needs_control() {
            self.ctx.shared.request_rescan();
            return self.retry(check.as_str(), message);
        }
        if check == FailedCheck::ModelManifest && self.manifest_not_loaded_yet() {
            self.ctx.shared.request_rescan();
            return self.retry(check.as_str(), format!("{message} (the newest manifest is not loaded yet)"));
        }
        if check.is_permanent() {
            self.heartbeat.stop();
            self.delete_message();
            let reason = format!("{check}: {message}");
            self.status.failed(Failure { check: check.as_str().to_owned(), message });
            self.complete_bulk_task(&JobEnd::Failed { reason });
            return Disposition::Failed { check };
        }
        self.retry(check.as_str(), message)
    }

    /// Hands the job to the live host that holds its epoch (`crate::handover`): a fresh copy of
    /// the message, then this one deleted. `None`: no such host, or the job has been received
    /// too often; it then goes the ordinary way.
    fn hand_over(&mut self, refusal: &str) -> Option<Disposition> {
        let receives = self.message.earlier_receives.saturating_add(self.received.receive_count);
        if receives >= crate::handover::MAX_EARLIER_RECEIVES {
            return None;
        }
        let holder = match crate::handover::live_holder(&self.ctx.services, self.message.epoch, &self.ctx.settings.host_id, cloud::now_ms()) {
            Ok(Some(holder)) => holder,
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(%error, "cannot look for the epoch's holder");
                return None;
            }
        };
        let copy = JobMessage { earlier_receives: receives, ..self.message.clone() };
        let body = serde_json::to_string(&copy).expect("a job message serialises");
        let delay = crate::handover::handover_delay(receives);
        let options = SendOptions { delay, ..SendOptions::default() };
        let queue = &self.ctx.services.job_queue;
        if let Err(error) = retry::transient("hand the job over", || queue.send(&body, &options)) {
            tracing::warn!(%error, "job not handed over");
            return None;
        }
        self.heartbeat.stop();
        self.delete_message();
        tracing::info!(epoch = self.message.epoch, holder, refusal, "job handed over to the host that holds its epoch");
        let message = format!("{refusal}; handed over to the host that holds epoch {} ({holder})", self.message.epoch);
        self.status.retrying(Some(Failure { check: FailedCheck::FleetKey.as_str().to_owned(), message }));
        Some(Disposition::HandedOver { holder, delay })
    }

    /// A job naming the newest manifest in the store, refused by a worker that runs an older
    /// one, waits for control to load the new one; any other manifest mismatch is final.
    fn manifest_not_loaded_yet(&self) -> bool {
        let models = &*self.ctx.services.models;
        let Ok(Some(key)) = control::newest_manifest(models, &self.message.model_id) else { return false };
        let Ok(bytes) = retry::transient("get manifest", || models.get_at_most(&key, MAX_SMALL_OBJECT)) else { return false };
        hex::encode(Sha256::digest(&bytes)) == self.message.manifest_hash.to_ascii_lowercase()
    }

    /// Commits output then receipt; on success, tells the ledger and deletes the message.
    fn commit(&mut self, receipt_bytes: Vec<u8>, output: Box<dyn ObjectWriter>, attempt: u64) -> Disposition {
        let receipt = match SignedReceipt::decode(&receipt_bytes) {
            Ok(signed) if signed.receipt.job_id == self.job && signed.receipt.attempt == attempt => signed.receipt,
            Ok(_) => return self.retry("receipt", "the worker's receipt names another job or attempt".into()),
            Err(error) => return self.retry("receipt", format!("the worker's receipt does not decode: {error}")),
        };
        let jobs = &self.ctx.services.jobs;
        let output_key = layout::job_output(&self.job, attempt);
        if let Err(error) = output.commit() {
            return self.retry("output", error.to_string());
        }
        let receipt_key = layout::job_receipt(&self.job);
        match retry::transient("commit receipt", || jobs.put(&receipt_key, &receipt_bytes, PutCondition::CreateOnly)) {
            Ok(_) => {}
            Err(ObjectError::AlreadyExists { .. }) => match retry::transient("get receipt", || jobs.get_at_most(&receipt_key, MAX_SMALL_OBJECT)) {
                // A try of ours that timed out had in fact gone through.
                Ok(existing) if existing == receipt_bytes => {}
                Ok(existing) => {
                    tracing::info!("another attempt committed its receipt first; discarding this one's output");
                    if let Err(error) = retry::transient("delete output", || jobs.delete(&output_key)) {
                        tracing::warn!(key = output_key, %error, "losing attempt's output not deleted");
                    }
                    return self.duplicate(existing, Disposition::LostRace);
                }
                Err(error) => return self.retry("receipt_commit", error.to_string()),
            },
            Err(error) => return self.retry("receipt_commit", error.to_string()),
        }
        tracing::info!(ok = receipt.records_ok, failed = receipt.records_failed, "receipt committed");
        // Output and receipt are durable: the job is done whatever happens next.
        let task_done = self.complete_bulk_task(&JobEnd::Committed);
        match self.send_to_ledger(&receipt_bytes, &receipt) {
            Ok(()) if task_done => {
                self.heartbeat.stop();
                self.delete_message();
            }
            Ok(()) => {
                // The next delivery (a duplicate: no rework) completes the bulk run's token.
                self.heartbeat.stop();
                set_visibility(self.ctx, &self.received, self.backoff());
            }
            Err(error) => self.ledger_pending(&error),
        }
        self.status.completed(&receipt, output_key);
        Disposition::Completed
    }

    /// The receipt is committed already: make sure the ledger has it, delete the message, and
    /// make the status say so. No rework.
    fn duplicate(&mut self, receipt_bytes: Vec<u8>, disposition: Disposition) -> Disposition {
        let receipt = match SignedReceipt::decode(&receipt_bytes) {
            Ok(signed) => Some(signed.receipt),
            Err(error) => {
                tracing::error!(%error, "the committed receipt does not decode; nothing to redo");
                None
            }
        };
        // A delivery that committed and then died may not have completed the token.
        self.complete_bulk_task(&JobEnd::Committed);
        let jobs = &self.ctx.services.jobs;
        let ledgered = matches!(retry::transient("head ledgered", || jobs.head(&layout::job_ledgered(&self.job))), Ok(Some(_)));
        if let (false, Some(receipt)) = (ledgered, &receipt) {
            // The ledger deduplicates by job id: sending again is harmless, not sending could
            // leave a processed job out of the ledger.
            if let Err(error) = self.send_to_ledger(&receipt_bytes, receipt) {
                self.ledger_pending(&error);
                return disposition;
            }
        }
        self.heartbeat.stop();
        self.delete_message();
        if let Some(receipt) = receipt {
            let stored = status::read(&**jobs, &self.job);
            if stored.is_none_or(|s| s.state != cloud::messages::JobState::Completed) {
                self.status.completed(&receipt, layout::job_output(&self.job, receipt.attempt));
            }
        }
        disposition
    }

    /// After the job's end is written: completes the token of a bulk run waiting for the job,
    /// if any. `false` only when that failed and another try may succeed.
    fn complete_bulk_task(&self, end: &JobEnd) -> bool {
        let Some(tokens) = &self.ctx.services.task_tokens else { return true };
        let jobs = &*self.ctx.services.jobs;
        let outcome = retry::transient("complete bulk task", || cloud::workflow::complete_bulk_task(jobs, tokens.as_ref(), &self.job, end));
        match outcome {
            Ok(None) => true,
            Ok(Some(Completion::Completed)) => {
                tracing::info!(?end, "bulk run's task completed");
                true
            }
            Ok(Some(Completion::AlreadyClosed { code })) => {
                tracing::info!(code, "bulk run's task was already closed");
                true
            }
            Err(error) => {
                tracing::warn!(%error, "bulk run's task not completed");
                !error.is_transient()
            }
        }
    }

    fn send_to_ledger(&self, receipt_bytes: &[u8], receipt: &Receipt) -> Result<(), LedgerSendError> {
        let document = self.ctx.relay.attestation_document(&receipt.attestation_sha256).map_err(LedgerSendError::Attestation)?;
        let message = LedgerMessage::new(&self.job, receipt_bytes, &document);
        let body = serde_json::to_string(&message).expect("a ledger message serialises");
        let options = LedgerMessage::send_options(&self.job);
        let queue = &self.ctx.services.ledger_queue;
        retry::transient("send to ledger", || queue.send(&body, &options)).map_err(LedgerSendError::Queue)?;
        tracing::info!("receipt sent to the ledger queue");
        Ok(())
    }

    /// The receipt is committed but the ledger has not heard of it: keep the message, so that
    /// its next delivery (a duplicate) sends the receipt again.
    fn ledger_pending(&mut self, error: &LedgerSendError) {
        self.heartbeat.stop();
        if self.received.receive_count >= self.ctx.settings.max_receives {
            tracing::error!(%error, "receipt committed but not sent to the ledger, and the message is on its last receive");
        } else {
            tracing::warn!(%error, "receipt committed but not sent to the ledger; the next delivery sends it");
        }
        set_visibility(self.ctx, &self.received, self.backoff());
    }

    /// Leaves the message for another attempt, or records the dead letter on the last one.
    fn retry(&mut self, check: &str, message: String) -> Disposition {
        self.heartbeat.stop();
        let receives = self.received.receive_count;
        let max = self.ctx.settings.max_receives;
        if receives >= max {
            let failure = Failure { check: "dead_letter".into(), message: format!("{check}: {message} (receive {receives} of {max})") };
            tracing::error!(check, message, "job failed on its last allowed receive; the queue dead-letters it");
            let reason = format!("dead_letter: {}", failure.message);
            self.status.failed(failure);
            self.complete_bulk_task(&JobEnd::Failed { reason });
            // Visible at once: the queue moves it to the dead-letter queue at its next receive.
            set_visibility(self.ctx, &self.received, Duration::ZERO);
            return Disposition::DeadLettered { check: check.to_owned() };
        }
        self.status.retrying(Some(Failure { check: check.to_owned(), message }));
        set_visibility(self.ctx, &self.received, self.backoff());
        Disposition::Retry { check: check.to_owned() }
    }

    /// Hands the message back at once (the host is shutting down).
    fn release(&mut self) -> Disposition {
        self.heartbeat.stop();
        set_visibility(self.ctx, &self.received, Duration::ZERO);
        self.status.retrying(None);
        Disposition::Released
    }

    fn backoff(&self) -> Duration {
        let settings = &self.ctx.settings;
        retry::jittered(retry::exponential(settings.retry_base, self.received.receive_count, settings.retry_max))
    }

    fn delete_message(&self) {
        let queue = &self.ctx.services.job_queue;
        match retry::transient("delete message", || queue.delete(&self.received.receipt_handle)) {
            Ok(()) => {}
            // Redelivered meanwhile: that delivery finds the receipt and deletes it.
            Err(QueueError::InvalidReceiptHandle(_)) => tracing::info!("message was redelivered meanwhile; not deleted here"),
            Err(error) => tracing::warn!(%error, "message not deleted; its next delivery will find the job done"),
        }
    }
}

/// Makes a received message visible again after `delay`.
pub(crate) fn set_visibility(ctx: &Context, received: &Received, delay: Duration) {
    let queue = &ctx.services.job_queue;
    match retry::transient("change visibility", || queue.change_visibility(&received.receipt_handle, delay)) {
        Ok(()) | Err(QueueError::InvalidReceiptHandle(_)) => {}
        Err(error) => tracing::warn!(message_id = received.message_id, %error, "visibility not changed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_has_no_check_names_of_its_own_for_what_the_worker_reports() {
        // The host's own failure names (a lost attempt) are never taken for a worker's check.
        for name in ["stalled", "input", "output", "released", "dead_letter"] {
            assert!(name.parse::<FailedCheck>().is_err(), "{name}");
        }
    }
}
