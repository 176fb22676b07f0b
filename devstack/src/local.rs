//! What AWS runs around the handlers, for the embedded default: the SQS event source mappings
//! that feed `ledger-append` and `job-dead-letter` (receive a batch, invoke, delete what
//! succeeded, leave the failures to be retried), Lambda's asynchronous invocation of `on-upload`
//! (its retries, then the failure record to the on-failure destination), and the lifecycle rule
//! that expires sealed inputs once the ledger holds their receipt.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambdas::sqs_event::sqs_event;
use cloud_local::CreatedHook;
use cloud::{layout, ObjectError, ObjectMeta, Queue, QueueError, SendOptions, Services};
use protocol::envelope::JobId;
use receipts_ledger::{Ledger, LedgerStore, StoreError};

use lambdas::on_upload::{self, Config};

/// Lambda's SQS batch size for FIFO sources is at most 10.
const BATCH: usize = 10;
/// How long a failed message stays hidden before its retry.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Lambda invokes an asynchronous event three times in all (`retryAttempts: 2`, cdk/lib/lambdas.ts);
/// locally the retries wait this long before each (Lambda waits a minute, then two).
pub const UPLOAD_RETRY_DELAYS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];

/// One round of the ledger queue's event source: returns how many receipts were handled
/// successfully.
pub fn pump_ledger_queue<S: LedgerStore>(
    services: &Services,
    ledger: &mut Ledger<S>,
    wait: Duration,
) -> Result<usize, QueueError> {
    use lambdas::ledger_append::{process, settle, LedgerQueues, RetryBudget};
    let queue = services.ledger_queue.as_ref();
    let received = queue.receive(BATCH, wait, Duration::from_secs(60))?;
    if received.is_empty() {
        return Ok(0);
    }
    let event = sqs_event(queue, &received);
    // The function settles what it did not finish (backoff, dead letter), as in AWS.
    let budget = RetryBudget { max_receives: cloud_local::MAX_RECEIVES };
    let queues = LedgerQueues { source: services.ledger_queue.clone(), dead_letter: None, budget };
    let handled = process(&event, ledger, services.jobs.as_ref(), cloud::now_ms(), budget, &mut |_| {});
    let response = settle(&handled, Some(&queues));
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    let mut succeeded = 0;
    for message in received.iter().filter(|m| !failed.contains(&m.message_id.as_str())) {
        queue.delete(&message.receipt_handle)?;
        succeeded += 1;
    }
    Ok(succeeded)
}

/// One round of `job-dead-letter`'s event source on `queue` (on-upload's failures, or the jobs
/// DLQ): returns how many records were handled.
pub fn pump_dead_letters(services: &Services, config: &Config, queue: &dyn Queue, wait: Duration) -> Result<usize, QueueError> {
    pump(queue, wait, |event| lambdas::dead_letter::handle(event, services, config))
}

/// Receives a batch, invokes `function` with Lambda's event, deletes what succeeded and hides
/// what failed for [`RETRY_AFTER`]. Returns the number that succeeded.
fn pump(queue: &dyn Queue, wait: Duration, function: impl FnOnce(&SqsEvent) -> SqsBatchResponse) -> Result<usize, QueueError> {
    let received = queue.receive(BATCH, wait, Duration::from_secs(60))?;
    if received.is_empty() {
        return Ok(0);
    }
    let response = function(&sqs_event(queue, &received));
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    let mut succeeded = 0;
    for message in &received {
        if failed.contains(&message.message_id.as_str()) {
            queue.change_visibility(&message.receipt_handle, RETRY_AFTER)?;
        } else {
            queue.delete(&message.receipt_handle)?;
            succeeded += 1;
        }
    }
    Ok(succeeded)
}

/// `on-upload` as Lambda invokes it for an S3 notification, for the jobs store's created hook:
/// tried, then tried again after each of `retry_delays`; when every try failed, the failure
/// record goes to `failures` (the function's on-failure destination) and the hook succeeds —
/// the record, not the store's own hook retries, carries the upload on.
pub fn on_upload_hook(services: Services, config: Config, failures: Arc<dyn Queue>, retry_delays: Vec<Duration>) -> CreatedHook {
    Arc::new(move |meta: &ObjectMeta| {
        let event = on_upload::object_created_event("jobs", &meta.key, meta.size, &meta.etag);
        let mut outcome = on_upload::handle_with(&event, &services, &config);
        for delay in &retry_delays {
            let Err(error) = &outcome else { break };
            tracing::warn!(key = %meta.key, %error, "on-upload failed; retrying");
            std::thread::sleep(*delay);
            outcome = on_upload::handle_with(&event, &services, &config);
        }
        let Err(error) = outcome else { return Ok(()) };
        let invocations = retry_delays.len() as u32 + 1;
        tracing::error!(key = %meta.key, %error, invocations, "on-upload gave up; the failure record goes to its on-failure destination");
        let record = lambdas::dead_letter::failure_record(&event, "RetriesExhausted", invocations, &error.to_string());
        failures.send(&record, &SendOptions::default()).map(drop).map_err(|e| format!("on-upload failed ({error}) and its failure record was not sent: {e}"))
    })
}


/// Why a round of input expiry stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExpiryError {
    #[error("jobs store: {0}")]
    Objects(#[from] ObjectError),
    #[error("ledger: {0}")]
    Ledger(#[from] StoreError),
}

/// Deletes the sealed input of every job whose receipt the ledger has held for `retention`.
/// `jobs/<id>/ledgered.json` only says which jobs to look up: whoever may write the jobs store
/// can write one, with any time in it. Whether the ledger holds the job's receipt, and since
/// when, is the ledger's own entry for the job. Returns the number of inputs deleted.
pub fn expire_inputs(services: &Services, ledger: &dyn LedgerStore, retention: Duration, now_ms: u64) -> Result<usize, ExpiryError> {
    let mut deleted = 0;
    for meta in services.jobs.list(layout::JOBS_PREFIX)? {
        let Some(id) = meta.key.strip_prefix(layout::JOBS_PREFIX).and_then(|k| k.strip_suffix("/ledgered.json")) else {
            continue;
        };
        let Some(job) = JobId::from_hex(id) else { continue };
        let Some(entry) = ledger.entry_by_job(&job)?.filter(|entry| entry.fields.kind.is_job()) else {
            tracing::warn!(job = %job, "ledgered.json names a job whose receipt the ledger does not hold: its input is kept");
            continue;
        };
        if entry.appended_ms.saturating_add(retention.as_millis() as u64) > now_ms {
            continue;
        }
        let input = layout::job_input(&job);
        if services.jobs.head(&input)?.is_some() {
            services.jobs.delete(&input)?;
            tracing::info!(job = %job, index = entry.index, "sealed input expired after its receipt reached the ledger");
            deleted += 1;
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests;
