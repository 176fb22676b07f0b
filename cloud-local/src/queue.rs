//! [`SqliteQueue`]: SQS's semantics in one SQLite file that several processes share.
//!
//! Several queues live in one file (table `messages`, one row per message, tagged with its
//! queue). Every operation is one transaction — `BEGIN IMMEDIATE` when it writes — so two
//! consumers, in threads or processes, never receive the same message at once.
//!
//! A message's state follows from two columns: it is *visible* when `visible_at_ms` has passed,
//! *in flight* when it has been received and `visible_at_ms` is still ahead, *delayed* when it
//! has never been received and `visible_at_ms` is ahead (a send with `delay`).
//!
//! Receipt handles are `<message id>.<random>`, fresh on every receive; only the latest one of a
//! message is valid, so a consumer whose message was delivered again meanwhile learns it
//! ([`QueueError::InvalidReceiptHandle`]) instead of deleting someone else's delivery.
//!
//! Dead letters as SQS's redrive policy: a message already received `max_receives` times moves
//! to the dead-letter queue (same file) at the next receive that would return it, keeping its id,
//! body and receive count.
//!
//! FIFO queues: every message has a group; a group's oldest message is the only one that can
//! be received, and not while it is in flight, so a group is processed in order, one message
//! at a time. A deduplication id drops a repeated send for five minutes, even after the first
//! message was deleted.
//!
//! Standard queues with groups are SQS fair queues: a group is a tenant, and a receive returns
//! first the messages of the tenants with the fewest messages in flight (no order, a share).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::sqlite;
use cloud::now_ms;
use cloud::queue::{Queue, QueueError, QueueStats, Received, SendOptions};

/// SQS's limits, enforced here so that code written against the local queue works on SQS.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
pub const MAX_RECEIVE_BATCH: usize = 10;
pub const MAX_WAIT: Duration = Duration::from_secs(20);
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
pub const MAX_ID_LEN: usize = 128;
/// How long a FIFO deduplication id is remembered.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(5 * 60);
/// How often a long poll looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(75);

/// A queue's type and redrive policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueConfig {
    pub fifo: bool,
    /// Receives after which a message goes to `dead_letter` (with it, or not at all).
    pub max_receives: Option<u32>,
    /// The dead-letter queue's name, in the same file.
    pub dead_letter: Option<String>,
}

/// A message as [`SqliteQueue::peek`] shows it (read-only; for tests and status tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedMessage {
    pub message_id: String,
    pub body: String,
    pub group_id: Option<String>,
    pub sent_ms: u64,
    pub receive_count: u32,
    pub state: MessageState,
    /// When the message becomes (or became) visible.
    pub visible_at_ms: u64,
    /// For a dead letter: the queue it came from.
    pub dead_lettered_from: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Visible,
    InFlight,
    Delayed,
}

/// One queue in a SQLite file (see the module documentation).
pub struct SqliteQueue {
    name: String,
    path: PathBuf,
    config: QueueConfig,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteQueue").field("name", &self.name).field("path", &self.path).field("config", &self.config).finish()
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS queues (
    name         TEXT PRIMARY KEY,
    fifo         INTEGER NOT NULL,
    max_receives INTEGER,
    dead_letter  TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    queue              TEXT NOT NULL,
    message_id         TEXT NOT NULL UNIQUE,
    body               TEXT NOT NULL,
    group_id           TEXT,
    sent_ms            INTEGER NOT NULL,
    visible_at_ms      INTEGER NOT NULL,
    receive_count      INTEGER NOT NULL DEFAULT 0,
    receipt_handle     TEXT,
    dead_lettered_from TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_visibility ON messages (queue, visible_at_ms, seq);
CREATE INDEX IF NOT EXISTS messages_by_group ON messages (queue, group_id, seq);
CREATE TABLE IF NOT EXISTS dedup (
    queue      TEXT NOT NULL,
    dedup_id   TEXT NOT NULL,
    message_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, dedup_id)
);
";

impl SqliteQueue {
    /// Opens queue `name` in `db_path` (creating the file, the tables and the queue as
    /// needed) and records `config` for it. A named dead-letter queue that does not exist yet
    /// is created with the same type and no redrive of its own.
    pub fn open(db_path: impl AsRef<Path>, name: &str, config: QueueConfig) -> Result<SqliteQueue, QueueError> {
        let path = db_path.as_ref().to_path_buf();
        validate_name(name)?;
        let bad_config = |why: &str| Err(QueueError::InvalidMessage(format!("queue {name}: {why}")));
        match (&config.max_receives, &config.dead_letter) {
            (Some(0), _) => return bad_config("max_receives must be at least 1"),
            (Some(_), None) | (None, Some(_)) => {
                return bad_config("max_receives and dead_letter go together (SQS redrive policy)");
            }
            (Some(_), Some(dlq)) if dlq == name => return bad_config("a queue cannot be its own dead-letter queue"),
            (Some(_), Some(dlq)) => validate_name(dlq)?,
            (None, None) => {}
        }
        let conn = sqlite::open_with_setup(&path, false, |tx| {
            tx.execute_batch(SCHEMA)?;
            tx.execute(
                "INSERT INTO queues (name, fifo, max_receives, dead_letter) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET fifo = ?2, max_receives = ?3, dead_letter = ?4",
                params![name, config.fifo, config.max_receives, config.dead_letter],
            )?;
            if let Some(dlq) = &config.dead_letter {
                tx.execute(
                    "INSERT INTO queues (name, fifo) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
                    params![dlq, config.fifo],
                )?;
            }
            Ok(())
        })
        .map_err(|e| db_error(&path, e))?;
        Ok(SqliteQueue { name: name.to_owned(), path, config, conn: Mutex::new(conn) })
    }

    /// Opens a queue that some process created, with the configuration recorded for it
    /// (status tools, DLQ inspection).
    pub fn open_existing(db_path: impl AsRef<Path>, name: &str) -> Result<SqliteQueue, QueueError> {
        let path = db_path.as_ref().to_path_buf();
        let no_such = || QueueError::NoSuchQueue { queue: name.to_owned() };
        if !path.exists() {
            return Err(no_such());
        }
        let conn = sqlite::open(&path, false).map_err(|e| db_error(&path, e))?;
        let config = conn
            .query_row("SELECT fifo, max_receives, dead_letter FROM queues WHERE name = ?1", [name], |row| {
                Ok(QueueConfig { fifo: row.get(0)?, max_receives: row.get(1)?, dead_letter: row.get(2)? })
            })
            .optional()
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.contains("no such table") => no_such(),
                e => db_error(&path, e),
            })?
            .ok_or_else(no_such)?;
        Ok(SqliteQueue { name: name.to_owned(), path, config, conn: Mutex::new(conn) })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every message of this queue in send order, without changing anything.
    pub fn peek(&self) -> Result<Vec<QueuedMessage>, QueueError> {
        let conn = self.conn();
        let now = db_ms(now_ms());
        let mut stmt = conn
            .prepare(
                "SELECT message_id, body, group_id, sent_ms, receive_count, visible_at_ms, dead_lettered_from
                 FROM messages WHERE queue = ?1 ORDER BY seq",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map([&self.name], |row| {
                let receive_count: u32 = row.get(4)?;
                let visible_at_ms: i64 = row.get(5)?;
                let state = if visible_at_ms <= now {
                    MessageState::Visible
                } else if receive_count > 0 {
                    MessageState::InFlight
                } else {
                    MessageState::Delayed
                };
                Ok(QueuedMessage {
                    message_id: row.get(0)?,
                    body: row.get(1)?,
                    group_id: row.get(2)?,
                    sent_ms: from_db_ms(row.get(3)?),
                    receive_count,
                    state,
                    visible_at_ms: from_db_ms(visible_at_ms),
                    dead_lettered_from: row.get(6)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.db(e))
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn db(&self, e: rusqlite::Error) -> QueueError {
        db_error(&self.path, e)
    }

    fn check_send(&self, body: &str, options: &SendOptions) -> Result<(), QueueError> {
        let refuse = |why: String| Err(QueueError::InvalidMessage(format!("queue {}: {why}", self.name)));
        if body.len() > MAX_BODY_BYTES {
            return refuse(format!("body is {} bytes; at most {MAX_BODY_BYTES}", body.len()));
        }
        if self.config.fifo {
            match &options.group_id {
                None => return refuse("a FIFO queue needs a message group id".into()),
                Some(g) => validate_id("group id", g).or_else(refuse)?,
            }
            if let Some(d) = &options.deduplication_id {
                validate_id("deduplication id", d).or_else(refuse)?;
            }
            if !options.delay.is_zero() {
                return refuse("per-message delay is for standard queues only".into());
            }
        } else {
            // On a standard queue a group is a tenant (SQS fair queues): no order, only a share.
            if let Some(g) = &options.group_id {
                validate_id("group id", g).or_else(refuse)?;
            }
            if options.deduplication_id.is_some() {
                return refuse("a deduplication id is for FIFO queues only".into());
            }
            if options.delay > MAX_DELAY {
                return refuse(format!("delay {:?} exceeds 15 minutes", options.delay));
            }
        }
        Ok(())
    }

    /// One receive attempt: a single write transaction.
    fn receive_once(&self, max: usize, visibility: Duration) -> Result<Vec<Received>, QueueError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.db(e))?;
        let now = db_ms(now_ms());
        let visible_until = now.saturating_add(duration_ms(visibility));
        let sql = if self.config.fifo {
            // Only the oldest message of each group, and only while it is visible.
            "SELECT seq, message_id, body, sent_ms, receive_count, group_id FROM messages m
             WHERE queue = ?1 AND visible_at_ms <= ?2
               AND NOT EXISTS (SELECT 1 FROM messages o
                               WHERE o.queue = ?1 AND o.group_id = m.group_id AND o.seq < m.seq)
             ORDER BY seq LIMIT ?3"
        } else {
            // Fair queues: the first messages of the tenants with the fewest in flight go first,
            // so one tenant's backlog does not delay another's message (ungrouped messages are
            // each their own tenant).
            "WITH busy AS (
                 SELECT group_id, COUNT(*) AS in_flight FROM messages
                 WHERE queue = ?1 AND group_id IS NOT NULL AND visible_at_ms > ?2 AND receive_count > 0
                 GROUP BY group_id),
             ready AS (
                 SELECT seq, message_id, body, sent_ms, receive_count, group_id,
                        ROW_NUMBER() OVER (PARTITION BY COALESCE(group_id, message_id) ORDER BY seq) AS nth
                 FROM messages WHERE queue = ?1 AND visible_at_ms <= ?2)
             SELECT r.seq, r.message_id, r.body, r.sent_ms, r.receive_count, r.group_id
             FROM ready r LEFT JOIN busy b ON b.group_id = r.group_id
             ORDER BY COALESCE(b.in_flight, 0) + r.nth, r.seq LIMIT ?3"
        };
        let mut out: Vec<Received> = Vec::new();
        let mut taken: HashSet<i64> = HashSet::new();
        loop {
            // With a zero visibility a delivered message stays visible: skip what we took.
            let limit = (max - out.len() + taken.len()) as i64;
            let candidates: Vec<(i64, String, String, i64, u32, Option<String>)> = {
                let mut stmt = tx.prepare_cached(sql).map_err(|e| self.db(e))?;
                let rows = stmt
                    .query_map(params![self.name, now, limit], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                    })
                    .map_err(|e| self.db(e))?;
                rows.collect::<Result<_, _>>().map_err(|e| self.db(e))?
            };
            let mut moved = 0;
            for (seq, message_id, body, sent_ms, receive_count, group_id) in candidates {
                if out.len() == max {
                    break;
                }
                if taken.contains(&seq) {
                    continue;
                }
                if let (Some(limit), Some(dlq)) = (self.config.max_receives, &self.config.dead_letter)
                    && receive_count >= limit
                {
                    tx.execute(
                        "UPDATE messages SET queue = ?1, visible_at_ms = ?2, receipt_handle = NULL,
                                             dead_lettered_from = ?3 WHERE seq = ?4",
                        params![dlq, now, self.name, seq],
                    )
                    .map_err(|e| self.db(e))?;
                    moved += 1;
                    continue;
                }
                let handle = format!("{message_id}.{}", random_hex(16)?);
                tx.execute(
                    "UPDATE messages SET visible_at_ms = ?1, receive_count = receive_count + 1, receipt_handle = ?2
                     WHERE seq = ?3",
                    params![visible_until, handle, seq],
                )
                .map_err(|e| self.db(e))?;
                taken.insert(seq);
                out.push(Received {
                    message_id,
                    receipt_handle: handle,
                    body,
                    receive_count: receive_count.saturating_add(1),
                    sent_ms: from_db_ms(sent_ms),
                    group_id,
                    // Not kept per message; SQS's FIFO dead-letter queue reports the message id.
                    deduplication_id: None,
                });
            }
            // Another pass only when dead letters made room (a FIFO group's next message may
            // now be its head).
            if moved == 0 || out.len() == max {
                break;
            }
        }
        tx.commit().map_err(|e| self.db(e))?;
        Ok(out)
    }

    /// Finds the message a handle was issued for and checks that the handle is its latest.
    /// `Ok(None)`: the message no longer exists.
    fn current_delivery(&self, tx: &rusqlite::Transaction<'_>, handle: &str) -> Result<Option<i64>, QueueError> {
        let invalid = |why: String| QueueError::InvalidReceiptHandle(format!("queue {}: {why}", self.name));
        let Some((message_id, _)) = handle.split_once('.') else {
            return Err(invalid(format!("{handle:?} is not a receipt handle")));
        };
        let row: Option<(i64, String, Option<String>)> = tx
            .query_row(
                "SELECT seq, queue, receipt_handle FROM messages WHERE message_id = ?1",
                [message_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(|e| self.db(e))?;
        match row {
            None => Ok(None),
            Some((_, queue, _)) if queue != self.name => {
                Err(invalid(format!("message {message_id} has moved to queue {queue}")))
            }
            Some((_, _, current)) if current.as_deref() != Some(handle) => {
                Err(invalid(format!("message {message_id} was received again since this handle was issued")))
            }
            Some((seq, _, _)) => Ok(Some(seq)),
        }
    }
}

impl Queue for SqliteQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn send(&self, body: &str, options: &SendOptions) -> Result<String, QueueError> {
        self.check_send(body, options)?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.db(e))?;
        let now = db_ms(now_ms());
        let dedup = options.deduplication_id.as_deref().filter(|_| self.config.fifo);
        if let Some(dedup_id) = dedup {
            tx.execute("DELETE FROM dedup WHERE queue = ?1 AND expires_ms <= ?2", params![self.name, now])
                .map_err(|e| self.db(e))?;
            let first: Option<String> = tx
                .query_row(
                    "SELECT message_id FROM dedup WHERE queue = ?1 AND dedup_id = ?2",
                    params![self.name, dedup_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| self.db(e))?;
            if let Some(first) = first {
                return Ok(first); // accepted and dropped, as SQS does (the transaction rolls back)
            }
        }
        let message_id = new_message_id()?;
        tx.execute(
            "INSERT INTO messages (queue, message_id, body, group_id, sent_ms, visible_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![self.name, message_id, body, options.group_id, now, now.saturating_add(duration_ms(options.delay))],
        )
        .map_err(|e| self.db(e))?;
        if let Some(dedup_id) = dedup {
            tx.execute(
                "INSERT INTO dedup (queue, dedup_id, message_id, expires_ms) VALUES (?1, ?2, ?3, ?4)",
                params![self.name, dedup_id, message_id, now.saturating_add(duration_ms(DEDUP_WINDOW))],
            )
            .map_err(|e| self.db(e))?;
        }
        tx.commit().map_err(|e| self.db(e))?;
        Ok(message_id)
    }

    fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Received>, QueueError> {
        let refuse = |why: String| Err(QueueError::InvalidMessage(format!("queue {} receive: {why}", self.name)));
        if max == 0 || max > MAX_RECEIVE_BATCH {
            return refuse(format!("max must be 1..={MAX_RECEIVE_BATCH}, not {max}"));
        }
        if wait > MAX_WAIT {
            return refuse(format!("wait {wait:?} exceeds 20 s"));
        }
        if visibility > MAX_VISIBILITY {
            return refuse(format!("visibility {visibility:?} exceeds 12 h"));
        }
        let deadline = Instant::now() + wait;
        loop {
            let received = self.receive_once(max, visibility)?;
            let left = deadline.saturating_duration_since(Instant::now());
            if !received.is_empty() || left.is_zero() {
                return Ok(received);
            }
            std::thread::sleep(left.min(POLL_INTERVAL));
        }
    }

    fn change_visibility(&self, receipt_handle: &str, visibility: Duration) -> Result<(), QueueError> {
        if visibility > MAX_VISIBILITY {
            return Err(QueueError::InvalidMessage(format!(
                "queue {}: visibility {visibility:?} exceeds 12 h",
                self.name
            )));
        }
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.db(e))?;
        let Some(seq) = self.current_delivery(&tx, receipt_handle)? else {
            return Err(QueueError::InvalidReceiptHandle(format!(
                "queue {}: the message of this handle was deleted",
                self.name
            )));
        };
        let visible_at = db_ms(now_ms()).saturating_add(duration_ms(visibility));
        tx.execute("UPDATE messages SET visible_at_ms = ?1 WHERE seq = ?2", params![visible_at, seq])
            .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    fn delete(&self, receipt_handle: &str) -> Result<(), QueueError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| self.db(e))?;
        // Deleting an already deleted message succeeds, as on SQS.
        if let Some(seq) = self.current_delivery(&tx, receipt_handle)? {
            tx.execute("DELETE FROM messages WHERE seq = ?1", [seq]).map_err(|e| self.db(e))?;
        }
        tx.commit().map_err(|e| self.db(e))
    }

    fn stats(&self) -> Result<QueueStats, QueueError> {
        let conn = self.conn();
        conn.query_row(
            "SELECT COALESCE(SUM(visible_at_ms <= ?2), 0),
                    COALESCE(SUM(visible_at_ms > ?2 AND receive_count > 0), 0),
                    COALESCE(SUM(visible_at_ms > ?2 AND receive_count = 0), 0)
             FROM messages WHERE queue = ?1",
            params![self.name, db_ms(now_ms())],
            |r| {
                let count = |i: usize| r.get::<_, i64>(i).map(|n| u64::try_from(n).unwrap_or(0));
                Ok(QueueStats { visible: count(0)?, in_flight: count(1)?, delayed: count(2)? })
            },
        )
        .map_err(|e| self.db(e))
    }
}

fn db_error(path: &Path, e: rusqlite::Error) -> QueueError {
    // Busy after the timeout, I/O, a locked file: all worth retrying from the caller's view.
    QueueError::Unavailable(format!("queue database {}: {e}", path.display()))
}

fn validate_name(name: &str) -> Result<(), QueueError> {
    // SQS: 1..=80 characters of [A-Za-z0-9_-], FIFO names ending in ".fifo".
    let ok = !name.is_empty()
        && name.len() <= 80
        && name.strip_suffix(".fifo").unwrap_or(name).bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { Err(QueueError::InvalidMessage(format!("{name:?} is not a valid queue name"))) }
}

fn validate_id(what: &str, id: &str) -> Result<(), String> {
    // SQS: 1..=128 characters of printable ASCII.
    if id.is_empty() || id.len() > MAX_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{what} must be 1..={MAX_ID_LEN} printable ASCII characters"));
    }
    Ok(())
}

/// Times are stored as SQLite integers (i64 ms).
fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn db_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn from_db_ms(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0)
}

fn random_hex(len: usize) -> Result<String, QueueError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| QueueError::Unavailable(format!("random number generator: {e}")))?;
    Ok(hex::encode(bytes))
}

/// A random id shaped like SQS's (a UUID).
fn new_message_id() -> Result<String, QueueError> {
    let h = random_hex(16)?;
    Ok(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    const LONG: Duration = Duration::from_secs(60);
    const NO_WAIT: Duration = Duration::ZERO;

    fn standard() -> QueueConfig {
        QueueConfig { fifo: false, max_receives: Some(3), dead_letter: Some("dlq".into()) }
    }

    fn fifo() -> QueueConfig {
        QueueConfig { fifo: true, max_receives: Some(3), dead_letter: Some("fifo-dlq".into()) }
    }

    fn open(dir: &tempfile::TempDir, name: &str, config: QueueConfig) -> SqliteQueue {
        SqliteQueue::open(dir.path().join("queues.sqlite"), name, config).unwrap()
    }

    fn group(g: &str) -> SendOptions {
        SendOptions { group_id: Some(g.into()), ..Default::default() }
    }

    fn bodies(r: &[Received]) -> Vec<&str> {
        r.iter().map(|m| m.body.as_str()).collect()
    }

    #[test]
    fn send_receive_delete() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        let id = q.send("hello", &SendOptions::default()).unwrap();
        assert_eq!(q.stats().unwrap(), QueueStats { visible: 1, in_flight: 0, delayed: 0 });
        let got = q.receive(10, NO_WAIT, LONG).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message_id, id);
        assert_eq!(got[0].body, "hello");
        assert_eq!(got[0].receive_count, 1);
        assert!(got[0].receipt_handle.starts_with(&id));
        assert_eq!(q.stats().unwrap(), QueueStats { visible: 0, in_flight: 1, delayed: 0 });
        assert!(q.receive(10, NO_WAIT, LONG).unwrap().is_empty(), "in flight: hidden");
        q.delete(&got[0].receipt_handle).unwrap();
        q.delete(&got[0].receipt_handle).unwrap(); // again: Ok, as on SQS
        assert_eq!(q.stats().unwrap(), QueueStats::default());
        assert!(matches!(
            q.change_visibility(&got[0].receipt_handle, Duration::ZERO),
            Err(QueueError::InvalidReceiptHandle(_))
        ));
        assert!(matches!(q.delete("garbage"), Err(QueueError::InvalidReceiptHandle(_))));
    }

    #[test]
    fn batches_keep_send_order_and_respect_max() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        for i in 0..5 {
            q.send(&format!("m{i}"), &SendOptions::default()).unwrap();
        }
        assert_eq!(bodies(&q.receive(3, NO_WAIT, LONG).unwrap()), ["m0", "m1", "m2"]);
        assert_eq!(bodies(&q.receive(10, NO_WAIT, LONG).unwrap()), ["m3", "m4"]);
        assert!(matches!(q.receive(0, NO_WAIT, LONG), Err(QueueError::InvalidMessage(_))));
        assert!(matches!(q.receive(11, NO_WAIT, LONG), Err(QueueError::InvalidMessage(_))));
    }

    /// One tenant queues a backlog, another one job after it: with the backlog's first jobs in
    /// flight, the second tenant's job is the next one a host receives, not the 51st.
    #[test]
    fn a_tenants_backlog_does_not_delay_another_tenants_message() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        for i in 0..50 {
            q.send(&format!("a{i}"), &group("tenant-a")).unwrap();
        }
        q.send("b0", &group("tenant-b")).unwrap();
        q.send("anon", &SendOptions::default()).unwrap();
        assert_eq!(bodies(&q.receive(1, NO_WAIT, LONG).unwrap()), ["a0"]);
        assert_eq!(bodies(&q.receive(2, NO_WAIT, LONG).unwrap()), ["b0", "anon"]);
        assert_eq!(bodies(&q.receive(2, NO_WAIT, LONG).unwrap()), ["a1", "a2"]);
        // A batch takes from every tenant before it takes a tenant's second message.
        q.send("b1", &group("tenant-b")).unwrap();
        q.send("c0", &group("tenant-c")).unwrap();
        assert_eq!(bodies(&q.receive(3, NO_WAIT, LONG).unwrap()), ["c0", "b1", "a3"]);
        assert!(matches!(q.send("x", &group("not a valid id")), Err(QueueError::InvalidMessage(_))));
    }

    #[test]
    fn visibility_timeout_redelivers_with_a_new_handle_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        q.send("job", &SendOptions::default()).unwrap();
        let first = q.receive(1, NO_WAIT, Duration::from_millis(100)).unwrap().remove(0);
        std::thread::sleep(Duration::from_millis(150));
        let second = q.receive(1, NO_WAIT, LONG).unwrap().remove(0);
        assert_eq!(second.message_id, first.message_id);
        assert_eq!(second.receive_count, 2);
        assert_ne!(second.receipt_handle, first.receipt_handle);
        // The first consumer's handle is stale now: it must not touch the new delivery.
        for result in [q.delete(&first.receipt_handle), q.change_visibility(&first.receipt_handle, LONG)] {
            match result {
                Err(QueueError::InvalidReceiptHandle(m)) => assert!(m.contains("received again"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(q.stats().unwrap().in_flight, 1);
        q.delete(&second.receipt_handle).unwrap();
        assert!(q.peek().unwrap().is_empty());
    }

    #[test]
    fn change_visibility_extends_and_releases() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        q.send("job", &SendOptions::default()).unwrap();
        let m = q.receive(1, NO_WAIT, Duration::from_millis(100)).unwrap().remove(0);
        q.change_visibility(&m.receipt_handle, LONG).unwrap(); // a host extending while it works
        std::thread::sleep(Duration::from_millis(150));
        assert!(q.receive(1, NO_WAIT, LONG).unwrap().is_empty(), "extended: still hidden");
        q.change_visibility(&m.receipt_handle, Duration::ZERO).unwrap(); // give it back now
        assert_eq!(q.stats().unwrap().visible, 1);
        let again = q.receive(1, NO_WAIT, LONG).unwrap().remove(0);
        assert_eq!(again.receive_count, 2);
        assert!(matches!(
            q.change_visibility(&again.receipt_handle, Duration::from_secs(13 * 3600)),
            Err(QueueError::InvalidMessage(_))
        ));
    }

    #[test]
    fn delayed_messages_appear_later() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        q.send("later", &SendOptions { delay: Duration::from_millis(150), ..Default::default() }).unwrap();
        assert_eq!(q.stats().unwrap(), QueueStats { visible: 0, in_flight: 0, delayed: 1 });
        assert_eq!(q.peek().unwrap()[0].state, MessageState::Delayed);
        assert!(q.receive(1, NO_WAIT, LONG).unwrap().is_empty());
        // Long polling picks it up once the delay has passed.
        let started = Instant::now();
        let got = q.receive(1, Duration::from_secs(2), LONG).unwrap();
        assert_eq!(bodies(&got), ["later"]);
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(matches!(
            q.send("x", &SendOptions { delay: Duration::from_secs(901), ..Default::default() }),
            Err(QueueError::InvalidMessage(_))
        ));
    }

    #[test]
    fn long_poll_waits_for_a_send_from_another_handle() {
        let dir = tempfile::tempdir().unwrap();
        let consumer = open(&dir, "jobs", standard());
        let producer = open(&dir, "jobs", standard());
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            producer.send("late", &SendOptions::default()).unwrap();
        });
        let started = Instant::now();
        let got = consumer.receive(1, Duration::from_secs(5), LONG).unwrap();
        assert_eq!(bodies(&got), ["late"]);
        assert!(started.elapsed() >= Duration::from_millis(150));
        sender.join().unwrap();
        // And an empty long poll returns after the wait.
        let started = Instant::now();
        assert!(consumer.receive(1, Duration::from_millis(200), LONG).unwrap().is_empty());
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn dead_letter_after_max_receives() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", standard());
        let dlq = SqliteQueue::open_existing(dir.path().join("queues.sqlite"), "dlq").unwrap();
        assert_eq!(dlq.config(), &QueueConfig::default(), "created with the source queue, no redrive");
        let id = q.send("poison", &SendOptions::default()).unwrap();
        q.send("fine", &SendOptions::default()).unwrap();
        for n in 1..=3 {
            let got = q.receive(1, NO_WAIT, Duration::ZERO).unwrap();
            assert_eq!(bodies(&got), ["poison"]);
            assert_eq!(got[0].receive_count, n);
        }
        // The fourth attempt moves it and returns the next message instead.
        let got = q.receive(10, NO_WAIT, LONG).unwrap();
        assert_eq!(bodies(&got), ["fine"]);
        let dead = dlq.peek().unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].message_id, id);
        assert_eq!(dead[0].receive_count, 3);
        assert_eq!(dead[0].dead_lettered_from.as_deref(), Some("jobs"));
        assert_eq!(dlq.stats().unwrap().visible, 1);
        let from_dlq = dlq.receive(1, NO_WAIT, LONG).unwrap().remove(0);
        assert_eq!((from_dlq.body.as_str(), from_dlq.receive_count), ("poison", 4));
        dlq.delete(&from_dlq.receipt_handle).unwrap();
    }

    #[test]
    fn a_stale_handle_cannot_touch_a_dead_letter() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "jobs", QueueConfig { max_receives: Some(1), ..standard() });
        q.send("x", &SendOptions::default()).unwrap();
        let m = q.receive(1, NO_WAIT, Duration::ZERO).unwrap().remove(0);
        assert!(q.receive(1, NO_WAIT, LONG).unwrap().is_empty(), "moved to the DLQ");
        match q.delete(&m.receipt_handle) {
            Err(QueueError::InvalidReceiptHandle(msg)) => assert!(msg.contains("moved to queue dlq"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fifo_groups_are_ordered_and_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "ledger", fifo());
        for i in 0..3 {
            q.send(&format!("a{i}"), &group("a")).unwrap();
            q.send(&format!("b{i}"), &group("b")).unwrap();
        }
        // One message per group in flight: a batch takes only the heads.
        let first = q.receive(10, NO_WAIT, LONG).unwrap();
        assert_eq!(bodies(&first), ["a0", "b0"]);
        assert_eq!(first.iter().map(|m| m.group_id.as_deref()).collect::<Vec<_>>(), [Some("a"), Some("b")]);
        assert!(q.receive(10, NO_WAIT, LONG).unwrap().is_empty(), "both groups blocked");
        q.delete(&first[0].receipt_handle).unwrap();
        assert_eq!(bodies(&q.receive(10, NO_WAIT, LONG).unwrap()), ["a1"]);
        // A group whose head went back to the queue delivers the same head again, not b1.
        q.change_visibility(&first[1].receipt_handle, Duration::ZERO).unwrap();
        let again = q.receive(10, NO_WAIT, LONG).unwrap();
        assert_eq!(bodies(&again), ["b0"]);
        assert_eq!(again[0].receive_count, 2);
    }

    #[test]
    fn fifo_dead_letter_unblocks_the_group_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "ledger", QueueConfig { max_receives: Some(1), ..fifo() });
        q.send("a0", &group("a")).unwrap();
        q.send("a1", &group("a")).unwrap();
        let m = q.receive(10, NO_WAIT, Duration::ZERO).unwrap();
        assert_eq!(bodies(&m), ["a0"]);
        // a0 has had its receive: this attempt moves it and delivers a1 in the same call.
        assert_eq!(bodies(&q.receive(10, NO_WAIT, LONG).unwrap()), ["a1"]);
        let dlq = SqliteQueue::open_existing(q.path(), "fifo-dlq").unwrap();
        assert!(dlq.config().fifo);
        let dead = dlq.peek().unwrap();
        assert_eq!((dead[0].body.as_str(), dead[0].group_id.as_deref()), ("a0", Some("a")));
    }

    #[test]
    fn fifo_deduplication() {
        let dir = tempfile::tempdir().unwrap();
        let q = open(&dir, "ledger", fifo());
        let opts = SendOptions { deduplication_id: Some("job-1".into()), ..group("g") };
        let first = q.send("receipt", &opts).unwrap();
        assert_eq!(q.send("receipt again", &opts).unwrap(), first);
        assert_eq!(q.peek().unwrap().len(), 1);
        // Still deduplicated after the first one was consumed and deleted.
        let m = q.receive(1, NO_WAIT, LONG).unwrap().remove(0);
        q.delete(&m.receipt_handle).unwrap();
        assert_eq!(q.send("receipt", &opts).unwrap(), first);
        assert!(q.peek().unwrap().is_empty());
        // Another id, or another queue, is not a duplicate.
        let other = q.send("r2", &SendOptions { deduplication_id: Some("job-2".into()), ..group("g") }).unwrap();
        assert_ne!(other, first);
        let q2 = open(&dir, "ledger2", fifo());
        assert_ne!(q2.send("receipt", &opts).unwrap(), first);
    }

    #[test]
    fn send_options_are_checked_per_queue_type() {
        let dir = tempfile::tempdir().unwrap();
        let f = open(&dir, "ledger", fifo());
        let s = open(&dir, "jobs", standard());
        let refused = |r: Result<String, QueueError>| matches!(r, Err(QueueError::InvalidMessage(_)));
        assert!(refused(f.send("x", &SendOptions::default())), "FIFO without a group");
        assert!(refused(f.send("x", &SendOptions { delay: Duration::from_secs(1), ..group("g") })));
        assert!(refused(f.send("x", &group(""))));
        assert!(refused(f.send("x", &group(&"g".repeat(129)))));
        assert!(s.send("x", &group("g")).is_ok(), "a group on a standard queue is a fair-queue tenant");
        assert!(refused(s.send("x", &group(""))));
        assert!(refused(s.send("x", &SendOptions { deduplication_id: Some("d".into()), ..Default::default() })));
        assert!(refused(s.send(&"x".repeat(MAX_BODY_BYTES + 1), &SendOptions::default())));
        assert!(s.send(&"x".repeat(MAX_BODY_BYTES), &SendOptions::default()).is_ok());
        assert!(matches!(
            SqliteQueue::open(s.path(), "q", QueueConfig { max_receives: Some(3), ..Default::default() }),
            Err(QueueError::InvalidMessage(_))
        ));
        assert!(matches!(
            SqliteQueue::open_existing(s.path(), "never-created"),
            Err(QueueError::NoSuchQueue { .. })
        ));
    }

    #[test]
    fn queues_in_one_file_are_separate() {
        let dir = tempfile::tempdir().unwrap();
        let a = open(&dir, "a", QueueConfig::default());
        let b = open(&dir, "b", QueueConfig::default());
        a.send("for a", &SendOptions::default()).unwrap();
        assert!(b.receive(10, NO_WAIT, LONG).unwrap().is_empty());
        let m = a.receive(1, NO_WAIT, LONG).unwrap().remove(0);
        assert!(matches!(b.delete(&m.receipt_handle), Err(QueueError::InvalidReceiptHandle(_))));
        a.delete(&m.receipt_handle).unwrap();
    }

    /// Two handles on one file behave like two processes: every message is delivered exactly
    /// once while its visibility lasts, and nothing is lost.
    #[test]
    fn competing_consumers_on_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("queues.sqlite");
        let producer = open(&dir, "jobs", standard());
        let total = 200;
        for i in 0..total {
            producer.send(&i.to_string(), &SendOptions::default()).unwrap();
        }
        let consumers = 4;
        let barrier = Arc::new(Barrier::new(consumers));
        let handles: Vec<_> = (0..consumers)
            .map(|_| {
                let q = SqliteQueue::open(&path, "jobs", standard()).unwrap();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut seen = Vec::new();
                    loop {
                        let got = q.receive(3, Duration::from_millis(100), LONG).unwrap();
                        if got.is_empty() {
                            return seen;
                        }
                        for m in got {
                            assert_eq!(m.receive_count, 1, "delivered twice within its visibility");
                            q.delete(&m.receipt_handle).unwrap();
                            seen.push(m.body.parse::<u32>().unwrap());
                        }
                    }
                })
            })
            .collect();
        let mut all: Vec<u32> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..total).collect::<Vec<_>>());
        assert_eq!(producer.stats().unwrap(), QueueStats::default());
    }
}
