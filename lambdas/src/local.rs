//! What AWS runs around the handlers, for the embedded default: the SQS event source mapping
//! that feeds `ledger-append` (receive a batch, invoke, delete what succeeded, leave the failures
//! to be retried and dead-lettered), and the lifecycle rule that expires sealed inputs once the
//! ledger holds their receipt.

use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use cloud::messages::Ledgered;
use cloud::{layout, ObjectError, Queue, QueueError, Received, Services};
use protocol::envelope::JobId;
use receipts_ledger::{Ledger, LedgerStore, ReceiptCheck};

/// Lambda's SQS batch size for FIFO sources is at most 10.
const BATCH: usize = 10;
/// How long a failed message stays hidden before its retry.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One round of the ledger queue's event source: returns how many receipts were handled
/// successfully.
pub fn pump_ledger_queue<S: LedgerStore>(
    services: &Services,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    wait: Duration,
) -> Result<usize, QueueError> {
    let queue = services.ledger_queue.as_ref();
    let received = queue.receive(BATCH, wait, Duration::from_secs(60))?;
    if received.is_empty() {
        return Ok(0);
    }
    let event = sqs_event(queue, &received);
    let response = crate::ledger_append::handle(&event, ledger, check, services.jobs.as_ref(), cloud::now_ms());
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

/// The event Lambda would deliver for these messages.
pub fn sqs_event(queue: &dyn Queue, received: &[Received]) -> SqsEvent {
    let records: Vec<serde_json::Value> = received
        .iter()
        .map(|m| {
            serde_json::json!({
                "messageId": m.message_id,
                "receiptHandle": m.receipt_handle,
                "body": m.body,
                "attributes": {
                    "ApproximateReceiveCount": m.receive_count.to_string(),
                    "SentTimestamp": m.sent_ms.to_string(),
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:local:000000000000:{}", queue.name()),
                "awsRegion": "local",
            })
        })
        .collect();
    let records: Vec<SqsMessage> =
        records.into_iter().map(|r| serde_json::from_value(r).expect("the SQS message shape")).collect();
    let mut event = SqsEvent::default();
    event.records = records;
    event
}

/// Deletes the sealed input of every job whose receipt the ledger has held for `retention`.
/// Returns the number of inputs deleted.
pub fn expire_inputs(services: &Services, retention: Duration, now_ms: u64) -> Result<usize, ObjectError> {
    let mut deleted = 0;
    for meta in services.jobs.list(layout::JOBS_PREFIX)? {
        let Some(id) = meta.key.strip_prefix(layout::JOBS_PREFIX).and_then(|k| k.strip_suffix("/ledgered.json")) else {
            continue;
        };
        let Some(job) = JobId::from_hex(id) else { continue };
        let marker: Ledgered = match services.jobs.get(&meta.key) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(marker) => marker,
                Err(_) => continue,
            },
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        };
        if marker.appended_ms + retention.as_millis() as u64 > now_ms {
            continue;
        }
        let input = layout::job_input(&job);
        if services.jobs.head(&input)?.is_some() {
            services.jobs.delete(&input)?;
            tracing::info!(job = %job, "sealed input expired after its receipt reached the ledger");
            deleted += 1;
        }
    }
    Ok(deleted)
}
