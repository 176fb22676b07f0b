//! Redrive of the ledger's dead-letter queue through the [`Queue`] port: each message,
//! in the dead-letter queue's order, is sent back to the ledger queue in its own group and then
//! deleted. `ephem-batch ledger redrive` runs it (and `lambdas::ledger_append` re-exports it) once the operator has fixed what held the
//! receipts (a policy uploaded, a store back); the appender then appends them in that order.
//!
//! SQS's own redrive (`StartMessageMoveTask`) also moves FIFO dead letters, but an emulator
//! (moto 5.2.5) does not implement it and the embedded default has no SQS; this works on both.
//!
//! The deduplication id sent is the one the dead-letter queue reports — for a FIFO queue SQS
//! replaces the sender's with the original message id when it dead-letters — or else the
//! message id: never the job id the host sent, which the ledger queue may still remember for
//! five minutes and would silently drop. A redrive stopped between a send and its delete sends
//! the same id again, which the queue drops within five minutes and the ledger ignores after.

use std::time::Duration;

use protocol::JobId;

use crate::messages::{LedgerMessage, LEDGER_GROUP};
use crate::{Queue, QueueError, Received, SendOptions};

/// How long a message received from the dead-letter queue stays hidden while it is moved.
const MOVING: Duration = Duration::from_secs(60);

/// One message sent back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Redriven {
    /// Its id in the dead-letter queue.
    pub message_id: String,
    /// The job its body names, when it is a ledger message.
    pub job_id: Option<JobId>,
    pub receive_count: u32,
}

/// What a redrive moved, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RedriveReport {
    pub moved: Vec<Redriven>,
}

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error("receiving from {queue}: {source}")]
    Receive {
        queue: String,
        #[source]
        source: QueueError,
    },
    #[error("sending message {message_id} back to {queue}: {source}; it stays in the dead-letter queue")]
    Send {
        message_id: String,
        queue: String,
        #[source]
        source: QueueError,
    },
    #[error(
        "deleting message {message_id} from {queue} after sending it back: {source}; a second redrive sends it again, which the ledger ignores"
    )]
    Delete {
        message_id: String,
        queue: String,
        #[source]
        source: QueueError,
    },
}

/// Moves up to `limit` messages from `dead_letter` back to `source` (see the module
/// documentation); stops at the first that cannot be moved, leaving it and those after it
/// where they were, and says why. `wait`: how long the first receive waits for a message.
pub fn redrive(dead_letter: &dyn Queue, source: &dyn Queue, limit: u64, wait: Duration) -> (RedriveReport, Option<RedriveError>) {
    let mut report = RedriveReport::default();
    let stopped = redrive_into(dead_letter, source, limit, wait, &mut report).err();
    (report, stopped)
}

fn redrive_into(
    dead_letter: &dyn Queue,
    source: &dyn Queue,
    limit: u64,
    wait: Duration,
    report: &mut RedriveReport,
) -> Result<(), RedriveError> {
    let mut wait = wait;
    while (report.moved.len() as u64) < limit {
        let want = (limit - report.moved.len() as u64).min(10) as usize;
        let batch = dead_letter
            .receive(want, wait, MOVING)
            .map_err(|source| RedriveError::Receive { queue: dead_letter.name().to_owned(), source })?;
        if batch.is_empty() {
            break;
        }
        wait = Duration::ZERO;
        for (n, message) in batch.iter().enumerate() {
            if let Err(error) = move_one(dead_letter, source, message) {
                // Keep the order: the rest of the batch is not sent, and visible again now.
                for rest in &batch[n + 1..] {
                    let _ = dead_letter.change_visibility(&rest.receipt_handle, Duration::ZERO);
                }
                return Err(error);
            }
            let job_id = serde_json::from_str::<LedgerMessage>(&message.body).ok().map(|m| m.job_id);
            tracing::info!(message = %message.message_id, job = job_id.map_or_else(|| "-".to_owned(), |j| j.to_hex()), "dead letter sent back");
            report.moved.push(Redriven { message_id: message.message_id.clone(), job_id, receive_count: message.receive_count });
        }
    }
    Ok(())
}

fn move_one(dead_letter: &dyn Queue, source: &dyn Queue, message: &Received) -> Result<(), RedriveError> {
    let options = SendOptions {
        group_id: Some(message.group_id.clone().unwrap_or_else(|| LEDGER_GROUP.to_owned())),
        deduplication_id: Some(message.deduplication_id.clone().unwrap_or_else(|| message.message_id.clone())),
        ..SendOptions::default()
    };
    source.send(&message.body, &options).map_err(|e| RedriveError::Send {
        message_id: message.message_id.clone(),
        queue: source.name().to_owned(),
        source: e,
    })?;
    dead_letter.delete(&message.receipt_handle).map_err(|e| RedriveError::Delete {
        message_id: message.message_id.clone(),
        queue: dead_letter.name().to_owned(),
        source: e,
    })
}
