//! Opening the SQLite files of the embedded default the same way everywhere: WAL (readers never
//! block the writer), a busy timeout (several processes share one file), full sync (a message
//! or a key that was acknowledged survives a crash).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

/// How long a statement waits for another process's write transaction.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (creating if needed) a database file. `private`: create it readable by the owner only
/// (SQLite gives its `-wal` and `-shm` files the same mode).
pub fn open(path: &Path, private: bool) -> rusqlite::Result<Connection> {
    if private {
        create_private(path);
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Switching to WAL needs a moment of exclusive access, which another process opening the
    // same new file may hold; the busy handler does not cover it everywhere, so retry.
    let mut attempt = 0;
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0)) {
            Ok(_) => break,
            Err(e) if is_busy(&e) && attempt < 100 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// How long opening keeps retrying when another process holds the file: a process killed in
/// the middle of a write leaves SQLite a recovery to run, during which some steps of opening
/// answer "database is locked" at once instead of waiting in the busy handler.
const OPEN_RETRY_FOR: Duration = Duration::from_secs(30);

/// Opens a database and runs `setup` (schema, configuration rows) in one immediate
/// transaction; the whole sequence is tried again while the file is busy.
pub fn open_with_setup(
    path: &Path,
    private: bool,
    setup: impl Fn(&Transaction<'_>) -> rusqlite::Result<()>,
) -> rusqlite::Result<Connection> {
    let deadline = std::time::Instant::now() + OPEN_RETRY_FOR;
    loop {
        let attempt = open(path, private).and_then(|mut conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            setup(&tx)?;
            tx.commit()?;
            Ok(conn)
        });
        match attempt {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

pub fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
}

#[cfg(unix)]
fn create_private(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    // Best effort: if this fails, Connection::open reports the real problem.
    let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
}

#[cfg(not(unix))]
fn create_private(_path: &Path) {}
