//! Several processes appending to one SQLite ledger never fork the chain,
//! and killing a process mid-append never leaves a torn entry.
//!
//! The children are this test binary itself, re-run with `child_appender` as
//! the only test and its orders in environment variables.

mod common;

use common::*;
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::{verify_ledger, CheckpointPolicy, LedgerStore, SqliteOptions, SqliteStore};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_DB: &str = "LEDGER_TEST_CHILD_DB";
const CHILD_JOBS: &str = "LEDGER_TEST_CHILD_JOBS";
const CHILD_BATCH: &str = "LEDGER_TEST_CHILD_BATCH";

/// Not a test on its own: does nothing unless started as a child.
#[test]
fn child_appender() {
    let Ok(db) = std::env::var(CHILD_DB) else { return };
    let spec = std::env::var(CHILD_JOBS).unwrap();
    let jobs: Vec<u64> = match spec.split_once("..") {
        Some((a, b)) => (a.parse().unwrap()..b.parse().unwrap()).collect(),
        None => spec.split(',').map(|j| j.parse().unwrap()).collect(),
    };
    let batch: usize = std::env::var(CHILD_BATCH).map(|b| b.parse().unwrap()).unwrap_or(1);
    let mut l = open_ledger(Path::new(&db), CheckpointPolicy { every_appends: 5, every_ms: 50 });
    for chunk in jobs.chunks(batch) {
        let reqs: Vec<_> = chunk.iter().map(|&j| test_request(j, 600)).collect();
        l.append_batch(&reqs, now_ms()).unwrap();
    }
}

/// `jobs`: comma-separated job numbers, or a range `a..b`.
fn spawn_child(db: &Path, jobs: &str, batch: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_appender", "--test-threads=1", "--nocapture"])
        .env(CHILD_DB, db)
        .env(CHILD_JOBS, jobs)
        .env(CHILD_BATCH, batch.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn assert_sound(db: &Path) -> u64 {
    let store = SqliteStore::open(db, &SqliteOptions::default()).unwrap();
    let ok: String = store.connection().query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok");
    let report = verify_ledger(&store, &pinned(), Some(&TestReceipts)).unwrap();
    assert!(report.is_ok(), "{:#?}", report.issues);
    // Every checkpoint is a prefix of the one after it.
    let cps = store.checkpoints().unwrap();
    for w in cps.windows(2) {
        let p = receipts_ledger::consistency(&store, w[0].size, w[1].size).unwrap();
        receipts_ledger::merkle::verify_consistency(w[0].size, w[1].size, &w[0].root, &w[1].root, &p).unwrap();
    }
    report.size
}

#[test]
fn concurrent_processes_never_fork_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    // Create the schema first so the children only race on appends.
    drop(SqliteStore::open(&db, &SqliteOptions::default()).unwrap());
    const JOBS: u64 = 60;
    // Four processes offer overlapping job sets in different orders.
    let children: Vec<Child> = (0..4u64)
        .map(|k| {
            let mut jobs: Vec<u64> = (0..JOBS).filter(|j| (j + k) % 4 != 0).collect();
            jobs.rotate_left((k * 11) as usize);
            if k % 2 == 1 {
                jobs.reverse();
            }
            let jobs: Vec<String> = jobs.iter().map(u64::to_string).collect();
            spawn_child(&db, &jobs.join(","), 1 + k as usize % 3)
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(assert_sound(&db), JOBS, "every job exactly once");
    let store = SqliteStore::open(&db, &SqliteOptions::default()).unwrap();
    for j in 0..JOBS {
        let e = store.entry_by_job(&receipts_ledger::testing::test_job(j)).unwrap().unwrap();
        assert_eq!(e.leaf, test_request(j, 600).leaf);
    }
}

#[test]
fn killed_appender_never_leaves_a_torn_entry() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    drop(SqliteStore::open(&db, &SqliteOptions::default()).unwrap());
    let mut next_job = 0u64;
    let mut last_size = 0;
    for round in 0..6u64 {
        let jobs = format!("{next_job}..{}", next_job + 100_000);
        next_job += 100_000;
        let mut child = spawn_child(&db, &jobs, 1 + (round as usize % 4));
        // Let it append for a while, then SIGKILL it wherever it is.
        let store = SqliteStore::open(&db, &SqliteOptions::default()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.size().unwrap() < last_size + 5 + round * 3 {
            assert!(Instant::now() < deadline, "child made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        child.kill().unwrap();
        child.wait().unwrap();
        drop(store);
        let size = assert_sound(&db);
        assert!(size > last_size);
        last_size = size;
    }
}
