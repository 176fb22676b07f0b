//! `cloud::redrive` over the embedded default's SQLite queues: the ledger's dead letters go back
//! in order, in their group, once; a failed send leaves them where they were.

use std::time::Duration;

use cloud::messages::LEDGER_GROUP;
use cloud::redrive::{redrive, RedriveError};
use cloud::{Queue, QueueError, Received, SendOptions};
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
