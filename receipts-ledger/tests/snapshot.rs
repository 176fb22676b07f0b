//! A verifier beside a live appender: every reader that checks the ledger sees it at one
//! moment, so a healthy ledger never verifies as corrupt while appends commit.
//!
//! An appender thread commits one entry per transaction (its own connection, as another
//! process would) while the test replays the ledger again and again on a read-only
//! connection. Before the reads shared one snapshot, an append between the entry scan and
//! the node count gave "7 tree nodes stored, 4 expected".

mod common;

use common::*;
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::{verify_ledger, CheckpointPolicy, LedgerStore, SqliteOptions, SqliteStore};
use std::sync::atomic::{AtomicBool, Ordering};

/// Replays while the appender runs; the appender stops once this many replays are done.
const ROUNDS: usize = 300;
/// The appender stops here: a replay is linear in the ledger, so an unbounded appender made the
/// test quadratic (minutes on a loaded machine).
const MAX_APPENDS: u64 = 3_000;
/// Replays that must have raced the appender for the test to mean anything.
const MIN_RACED_ROUNDS: usize = 20;
/// The appender's pause between commits.
const PACE: std::time::Duration = std::time::Duration::from_micros(500);

#[test]
fn verify_beside_a_live_appender_reports_nothing_false() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    drop(SqliteStore::open(&db, &SqliteOptions::default()).unwrap());
    let done = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let (false_reports, appended, raced) = std::thread::scope(|s| {
        let appender = s.spawn(|| {
            // Small receipts and frequent checkpoints: many commits, each changing entries,
            // nodes and (often) checkpoints together.
            let mut l = open_ledger(&db, CheckpointPolicy { every_appends: 3, every_ms: 0 });
            let mut job = 0u64;
            while !done.load(Ordering::Relaxed) && job < MAX_APPENDS {
                l.append(test_request(job, 64), now_ms()).unwrap();
                job += 1;
                // A commit every ~half millisecond: many land inside every replay, and the
                // ledger stays small enough for hundreds of replays.
                std::thread::sleep(PACE);
            }
            finished.store(true, Ordering::Relaxed);
            job
        });
        let store = SqliteStore::open_read_only(&db, &SqliteOptions::default()).unwrap();
        let mut false_reports = Vec::new();
        let mut raced = 0;
        for round in 0..ROUNDS {
            let racing = !finished.load(Ordering::Relaxed);
            let report = verify_ledger(&store, &pinned(), Some(&TestReceipts)).unwrap();
            if !report.is_ok() {
                false_reports.push((round, report.size, report.issues));
            }
            if racing {
                raced += 1;
            } else {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        (false_reports, appender.join().unwrap(), raced)
    });
    let report = verify_ledger(
        &SqliteStore::open_read_only(&db, &SqliteOptions::default()).unwrap(),
        &pinned(),
        Some(&TestReceipts),
    )
    .unwrap();
    assert!(report.is_ok(), "{:?}", report.issues);
    assert_eq!(report.size, appended);
    assert!(raced >= MIN_RACED_ROUNDS, "only {raced} replays ran while the appender appended ({appended} entries)");
    let shown: Vec<String> = false_reports
        .iter()
        .take(5)
        .map(|(round, size, issues)| format!("round {round} at {size} entries: {}", issues.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))
        .collect();
    assert!(false_reports.is_empty(), "{} of {raced} replays reported a healthy ledger corrupt: {shown:#?}", false_reports.len());
}

/// Everything one replay reads is of one moment: its checkpoints, entries and nodes agree with
/// the store's size at that moment, however the appender races it.
#[test]
fn the_latest_checkpoint_and_the_replay_agree_under_appends() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.sqlite");
    drop(SqliteStore::open(&db, &SqliteOptions::default()).unwrap());
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let appender = s.spawn(|| {
            let mut l = open_ledger(&db, CheckpointPolicy { every_appends: 1, every_ms: 0 });
            let mut job = 0u64;
            while !done.load(Ordering::Relaxed) {
                l.append(test_request(job, 64), now_ms()).unwrap();
                job += 1;
                std::thread::sleep(PACE);
            }
        });
        let store = SqliteStore::open_read_only(&db, &SqliteOptions::default()).unwrap();
        let mut mixed = 0;
        for _ in 0..ROUNDS {
            let snapshot = store.read_snapshot().unwrap();
            let size = store.size().unwrap();
            std::thread::yield_now();
            let latest = store.latest_checkpoint().unwrap().map_or(0, |c| c.size);
            let nodes = store.tree_node_count().unwrap();
            if latest != size || nodes != receipts_ledger::store::expected_tree_nodes(size) {
                mixed += 1;
            }
            drop(snapshot);
        }
        done.store(true, Ordering::Relaxed);
        appender.join().unwrap();
        assert_eq!(mixed, 0, "{mixed} of {ROUNDS} snapshots mixed two moments");
    });
}
