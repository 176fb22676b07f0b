//! Redrive of the ledger's dead-letter queue through the `cloud` queue port: each message,
//! in the dead-letter queue's order, is sent back to the ledger queue in its own group and then
//! deleted. `ephem-batch ledger redrive` runs it once the operator has fixed what held the
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

use cloud::messages::LedgerMessage;
use protocol::JobId;
use cloud::{Queue, QueueError, Received, SendOptions};

use super::LEDGER_GROUP;

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

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_local::{QueueConfig, SqliteQueue};

    fn queues(dir: &tempfile::TempDir, max_receives: u32) -> (SqliteQueue, SqliteQueue) {
        let db = dir.path().join("queues.sqlite");
        let config = QueueConfig { fifo: true, max_receives: Some(max_receives), dead_letter: Some("ledger-dlq".into()) };
        let source = SqliteQueue::open(&db, "ledger", config).unwrap();
        (source, SqliteQueue::open_existing(&db, "ledger-dlq").unwrap())
    }

    fn send(q: &SqliteQueue, body: &str, dedup: &str) {
        let options = SendOptions { group_id: Some(LEDGER_GROUP.into()), deduplication_id: Some(dedup.into()), ..Default::default() };
        q.send(body, &options).unwrap();
    }

    /// Dead-letters every message of `source` by receiving it `max` times without deleting it.
    fn dead_letter_all(source: &SqliteQueue) {
        while !source.peek().unwrap().is_empty() {
            source.receive(10, Duration::ZERO, Duration::ZERO).unwrap();
        }
    }

    #[test]
    fn dead_letters_go_back_in_order_in_their_group_and_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let (source, dlq) = queues(&dir, 2);
        for n in 0..3 {
            send(&source, &format!("receipt {n}"), &format!("job-{n}"));
        }
        dead_letter_all(&source);
        let dead: Vec<String> = dlq.peek().unwrap().into_iter().map(|m| m.message_id).collect();
        assert_eq!(dead.len(), 3);

        let (report, stopped) = redrive(&dlq, &source, u64::MAX, Duration::ZERO);
        assert!(stopped.is_none());
        assert_eq!(report.moved.iter().map(|m| m.message_id.clone()).collect::<Vec<_>>(), dead);
        assert!(dlq.peek().unwrap().is_empty());
        // All three are back — sent under the dead letters' ids, not the job ids the ledger
        // queue still remembers, which it would have dropped — in order, in their group.
        let back = source.peek().unwrap();
        assert_eq!(back.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["receipt 0", "receipt 1", "receipt 2"]);
        assert!(back.iter().all(|m| m.group_id.as_deref() == Some(LEDGER_GROUP) && m.receive_count == 0));
        // A second run finds nothing.
        assert_eq!(redrive(&dlq, &source, u64::MAX, Duration::ZERO).0.moved, vec![]);
    }

    #[test]
    fn a_limit_moves_the_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let (source, dlq) = queues(&dir, 1);
        for n in 0..3 {
            send(&source, &format!("r{n}"), &format!("j{n}"));
        }
        dead_letter_all(&source);
        assert_eq!(redrive(&dlq, &source, 2, Duration::ZERO).0.moved.len(), 2);
        assert_eq!(source.peek().unwrap().iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["r0", "r1"]);
        assert_eq!(dlq.peek().unwrap().iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["r2"]);
    }

    /// A queue whose sends fail: nothing is deleted from the dead-letter queue, and what was
    /// received is visible again at once.
    struct Refusing(SqliteQueue);

    impl Queue for Refusing {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn send(&self, _: &str, _: &SendOptions) -> Result<String, QueueError> {
            Err(QueueError::Unavailable("injected".into()))
        }
        fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Received>, QueueError> {
            self.0.receive(max, wait, visibility)
        }
        fn change_visibility(&self, handle: &str, visibility: Duration) -> Result<(), QueueError> {
            self.0.change_visibility(handle, visibility)
        }
        fn delete(&self, handle: &str) -> Result<(), QueueError> {
            self.0.delete(handle)
        }
        fn stats(&self) -> Result<cloud::QueueStats, QueueError> {
            self.0.stats()
        }
    }

    #[test]
    fn a_failed_send_leaves_the_dead_letter_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (source, dlq) = queues(&dir, 1);
        send(&source, "r0", "j0");
        dead_letter_all(&source);
        let refusing = Refusing(SqliteQueue::open_existing(dir.path().join("queues.sqlite"), "ledger").unwrap());
        let (report, error) = redrive(&dlq, &refusing, u64::MAX, Duration::ZERO);
        assert!(report.moved.is_empty());
        assert!(matches!(error, Some(RedriveError::Send { .. })), "{error:?}");
        assert_eq!(dlq.peek().unwrap().len(), 1);
        drop(source);
    }
}
