//! Tampering with a real SQLite ledger file is reported with the entry index.

mod common;

use common::*;
use receipts_ledger::entry::{entry_hash, GENESIS_PREV_HASH};
use receipts_ledger::merkle::{leaf_hash, MemoryTree, NodeId, TreeReader};
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::{verify_ledger, CheckpointPolicy, Issue, LedgerStore, SqliteOptions, SqliteStore, VerifyReport};
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

const N: u64 = 40;

fn build() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    let mut l = open_ledger(&path, CheckpointPolicy { every_appends: 8, every_ms: u64::MAX });
    for j in 0..N {
        l.append(test_request(j, 600), 1_000 + j).unwrap();
    }
    let r = verify(&path);
    assert!(r.is_ok(), "{:?}", r.issues);
    assert_eq!((r.size, r.checkpoints, r.uncheckpointed_from), (N, 5, None));
    (dir, path)
}

fn verify(path: &Path) -> VerifyReport {
    let store = SqliteStore::open_read_only(path, &SqliteOptions::default()).unwrap();
    verify_ledger(&store, &pinned(), Some(&TestReceipts)).unwrap()
}

fn tamper(path: &Path, f: impl FnOnce(&Connection)) -> VerifyReport {
    {
        let c = Connection::open(path).unwrap();
        f(&c);
    }
    let r = verify(path);
    assert!(!r.is_ok(), "tampering went unnoticed");
    for i in &r.issues {
        eprintln!("  {i}");
    }
    r
}

#[test]
fn edited_leaf_byte_is_named() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        let mut leaf: Vec<u8> = c.query_row("SELECT leaf FROM entries WHERE idx = 17", [], |r| r.get(0)).unwrap();
        leaf[300] ^= 0x01;
        c.execute("UPDATE entries SET leaf = ?1 WHERE idx = 17", [leaf]).unwrap();
    });
    assert!(r.issues.contains(&Issue::EntryHashMismatch { index: 17 }));
    assert!(r.issues.contains(&Issue::TreeNodeMismatch { index: 17, level: 0 }));
    assert!(r.issues.contains(&Issue::CheckpointRootMismatch { size: 24 }));
    assert_eq!(r.indexes()[0], 17);
    assert!(!r.issues.contains(&Issue::CheckpointRootMismatch { size: 16 }));
}

#[test]
fn rewritten_history_is_caught_by_the_signed_checkpoints() {
    // A thorough attacker edits leaf 17 and recomputes every later entry hash
    // and every tree node: the chain and tree are self-consistent again, but
    // the signed checkpoints are not.
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        let mut rows: Vec<(Vec<u8>, Vec<u8>)> = c
            .prepare("SELECT leaf, attestation_sha256 FROM entries ORDER BY idx")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let pos = rows[17].0.iter().position(|&b| b == b'x').unwrap();
        rows[17].0[pos] = b'y';
        let mut prev = GENESIS_PREV_HASH;
        let mut tree = MemoryTree::new();
        for (i, (leaf, att)) in rows.iter().enumerate() {
            let h = entry_hash(i as u64, &prev, &leaf_hash(leaf), &att.clone().try_into().unwrap());
            c.execute(
                "UPDATE entries SET leaf = ?1, prev_hash = ?2, entry_hash = ?3 WHERE idx = ?4",
                params![leaf, &prev[..], &h[..], i as i64],
            )
            .unwrap();
            prev = h;
            tree.push(leaf);
        }
        for level in 0..8u8 {
            for idx in 0..(N >> level) {
                let h = tree.node_hashes(&[NodeId::new(level, idx)]).unwrap()[0];
                c.execute("UPDATE tree_nodes SET hash = ?1 WHERE level = ?2 AND idx = ?3", params![&h[..], level, idx as i64])
                    .unwrap();
            }
        }
    });
    for size in [24, 32, 40] {
        assert!(r.issues.contains(&Issue::CheckpointRootMismatch { size }), "checkpoint {size}");
    }
    assert!(!r.issues.contains(&Issue::CheckpointRootMismatch { size: 16 }));
    // Only the padding changed, so the receipt check has nothing to say: the
    // signed checkpoints alone expose the rewrite.
    assert!(r.issues.iter().all(|i| matches!(i, Issue::CheckpointRootMismatch { .. })), "{:?}", r.issues);
}

#[test]
fn deleted_row_is_named() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        c.execute("DELETE FROM entries WHERE idx = 9", []).unwrap();
    });
    assert!(r.issues.contains(&Issue::MissingEntries { from: 9, to: 10 }));
    assert!(r.issues.contains(&Issue::PrevHashMismatch { index: 10 }));
    assert_eq!(r.indexes()[0], 9);
}

#[test]
fn deleted_tail_is_named_by_the_checkpoint_that_covered_it() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        c.execute("DELETE FROM entries WHERE idx >= 37", []).unwrap();
        c.execute("DELETE FROM tree_nodes WHERE (idx + 1) << level > 37", []).unwrap();
    });
    assert_eq!(r.issues, vec![Issue::CheckpointBeyondEnd { size: 40, ledger_size: 37 }]);
}

#[test]
fn swapped_rows_are_named() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        c.execute_batch(
            "UPDATE entries SET idx = 1000000 WHERE idx = 5;
             UPDATE entries SET idx = 5 WHERE idx = 6;
             UPDATE entries SET idx = 6 WHERE idx = 1000000;",
        )
        .unwrap();
    });
    for i in [5, 6] {
        assert!(r.issues.contains(&Issue::EntryHashMismatch { index: i }), "entry {i}");
        assert!(r.issues.contains(&Issue::PrevHashMismatch { index: i }), "entry {i}");
        assert!(r.issues.contains(&Issue::TreeNodeMismatch { index: i, level: 0 }), "entry {i}");
    }
    assert_eq!(r.indexes()[0], 5);
}

#[test]
fn inserted_row_is_named() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        // Make room at 12 and insert a well-formed, correctly chained entry.
        c.execute_batch(
            "UPDATE entries SET idx = idx + 1000000 WHERE idx >= 12;
             UPDATE entries SET idx = idx - 1000000 + 1 WHERE idx >= 1000000;",
        )
        .unwrap();
        let forged = test_request(999, 600);
        let (prev, att): (Vec<u8>, Vec<u8>) = c
            .query_row("SELECT entry_hash, attestation_sha256 FROM entries WHERE idx = 11", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        let prev: [u8; 32] = prev.try_into().unwrap();
        let h = entry_hash(12, &prev, &leaf_hash(&forged.leaf), &att.clone().try_into().unwrap());
        let f = &forged.fields;
        c.execute(
            "INSERT INTO entries (idx, job_id, model_id, manifest_hash, pcr0, client_key_id, start_ms, end_ms, ok_count, \
             failed_count, leaf, attestation_sha256, prev_hash, entry_hash, appended_ms) \
             VALUES (12, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0)",
            params![
                f.job_id.to_hex(), f.model_id, f.manifest_hash, f.pcr0, f.client_key_id, f.start_ms as i64, f.end_ms as i64,
                f.ok_count as i64, f.failed_count as i64, forged.leaf, att, &prev[..], &h[..]
            ],
        )
        .unwrap();
    });
    assert!(r.issues.contains(&Issue::TreeNodeMismatch { index: 12, level: 0 }));
    assert!(r.issues.contains(&Issue::EntryHashMismatch { index: 13 }));
    assert_eq!(r.indexes()[0], 12);
}

#[test]
fn edited_index_field_attestation_and_checkpoint_are_named() {
    let (_d, path) = build();
    let r = tamper(&path, |c| {
        c.execute("UPDATE entries SET pcr0 = ?1 WHERE idx = 3", ["00".repeat(48)]).unwrap();
    });
    assert_eq!(r.issues, vec![Issue::FieldMismatch { index: 3, field: "pcr0" }]);

    let (_d, path) = build();
    let r = tamper(&path, |c| {
        c.execute("UPDATE attestation_documents SET document = CAST('evil' AS BLOB) WHERE sha256 = (SELECT attestation_sha256 FROM entries WHERE idx = 2)", [])
            .unwrap();
    });
    let altered: Vec<u64> = r.issues.iter().filter(|i| matches!(i, Issue::AttestationAltered { .. })).filter_map(Issue::index).collect();
    assert_eq!(altered, (0..N).filter(|j| j % 4 == 2).collect::<Vec<_>>());

    let (_d, path) = build();
    let r = tamper(&path, |c| {
        let note: String = c.query_row("SELECT note FROM checkpoints WHERE tree_size = 16", [], |r| r.get(0)).unwrap();
        let mut lines: Vec<&str> = note.split('\n').collect();
        let bad = if lines[2].starts_with('A') { lines[2].replacen('A', "B", 1) } else { format!("A{}", &lines[2][1..]) };
        lines[2] = &bad;
        c.execute("UPDATE checkpoints SET note = ?1 WHERE tree_size = 16", [lines.join("\n")]).unwrap();
    });
    assert!(matches!(r.issues.as_slice(), [Issue::CheckpointInvalid { size: 16, .. }]), "{:?}", r.issues);
}

#[test]
fn verify_without_the_pinned_key_fails_every_checkpoint() {
    let (_d, path) = build();
    let store = SqliteStore::open(&path, &SqliteOptions::default()).unwrap();
    let other = receipts_ledger::SignerKey::from_seed(ORIGIN, &[1; 32]).unwrap().verifier();
    let r = verify_ledger(&store, &other, None).unwrap();
    assert_eq!(r.issues.len(), 5);
    assert!(r.issues.iter().all(|i| matches!(i, Issue::CheckpointInvalid { .. })));
    assert_eq!(store.size().unwrap(), N);
}

#[test]
fn read_only_store_refuses_appends() {
    let (_d, path) = build();
    let mut store = SqliteStore::open_read_only(&path, &SqliteOptions::default()).unwrap();
    assert_eq!(store.size().unwrap(), N);
    let r = store.append(&[test_request(N, 600)], &signer(), &CheckpointPolicy::default(), 0);
    assert!(matches!(r, Err(receipts_ledger::StoreError::Sqlite(_))));
    assert!(SqliteStore::open_read_only(&path.with_extension("missing"), &SqliteOptions::default()).is_err());
}
