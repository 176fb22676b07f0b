use super::*;
use crate::entry::sample_fields;
use crate::merkle::{inclusion_proof, verify_inclusion, MemoryTree};
use crate::note::SignerKey;

fn req(job: u64) -> AppendRequest {
    AppendRequest {
        leaf: format!("receipt {job}").into_bytes(),
        fields: sample_fields(job),
        attestation_document: format!("doc {}", job % 3).into_bytes(),
    }
}

fn key() -> SignerKey {
    SignerKey::from_seed("ledger.test", &[5; 32]).unwrap()
}

#[test]
fn appends_chain_tree_and_dedupe() {
    let mut s = SqliteStore::open_in_memory().unwrap();
    let k = key();
    let policy = CheckpointPolicy { every_appends: 4, every_ms: u64::MAX };
    let mut mem = MemoryTree::new();
    let mut prev = GENESIS_PREV_HASH;
    for job in 0..10u64 {
        let out = s.append(&[req(job)], &k, &policy, 1000 + job).unwrap();
        let AppendOutcome::Appended { index, entry_hash: eh, checkpoint } = out[0] else { panic!() };
        assert_eq!(index, job);
        mem.push(&req(job).leaf);
        let e = s.entry(index).unwrap().unwrap();
        assert_eq!(e.prev_hash, prev);
        assert_eq!(e.recompute_hash(), eh);
        prev = eh;
        assert_eq!(checkpoint, if (job + 1) % 4 == 0 { Some(job + 1) } else { None });
    }
    assert_eq!(s.size().unwrap(), 10);
    assert_eq!(s.tree_node_count().unwrap(), expected_tree_nodes(10));
    for n in 1..=10 {
        assert_eq!(root_at(&s, n).unwrap(), root_at(&mem, n).unwrap());
    }
    // Dedupe by job id, in separate calls and within one batch.
    let again = s.append(&[req(3), req(10), req(10)], &k, &policy, 2000).unwrap();
    assert_eq!(again[0], AppendOutcome::Existing { index: 3, same_leaf: true });
    assert_eq!(again[1].index(), 10);
    assert_eq!(again[2], AppendOutcome::Existing { index: 10, same_leaf: true });
    let mut other = req(4);
    other.leaf = b"another attempt".to_vec();
    assert_eq!(s.append(&[other], &k, &policy, 2001).unwrap()[0], AppendOutcome::Existing { index: 4, same_leaf: false });
    // Attestation documents are stored once each.
    let docs: i64 = s.conn.query_row("SELECT count(*) FROM attestation_documents", [], |r| r.get(0)).unwrap();
    assert_eq!(docs, 3);
    assert_eq!(s.attestation_document(&attestation_sha256(b"doc 1")).unwrap().unwrap(), b"doc 1");
    // Checkpoints at 4 and 8, each verifiable against the pinned key.
    let cps = s.checkpoints().unwrap();
    assert_eq!(cps.iter().map(|c| c.size).collect::<Vec<_>>(), vec![4, 8]);
    for cp in &cps {
        let parsed = Checkpoint::open(cp.note.as_bytes(), &k.verifier()).unwrap();
        assert_eq!((parsed.size, parsed.root), (cp.size, cp.root));
        assert_eq!(cp.root, root_at(&mem, cp.size).unwrap());
    }
    let p = inclusion_proof(&s, 5, 8).unwrap();
    verify_inclusion(5, 8, &leaf_hash(&req(5).leaf), &p, &cps[1].root).unwrap();
    assert_eq!(s.ledger_key().unwrap().unwrap(), k.verifier().to_string());
}

#[test]
fn time_based_and_forced_checkpoints() {
    let mut s = SqliteStore::open_in_memory().unwrap();
    let k = key();
    let policy = CheckpointPolicy { every_appends: 1000, every_ms: 500 };
    assert_eq!(s.checkpoint(&k, &policy, 0, true).unwrap(), None, "nothing to checkpoint");
    s.append(&[req(0)], &k, &policy, 1000).unwrap();
    assert_eq!(s.checkpoint(&k, &policy, 1499, false).unwrap(), None);
    assert_eq!(s.checkpoint(&k, &policy, 1500, false).unwrap().unwrap().size, 1);
    let out = s.append(&[req(1)], &k, &policy, 1600).unwrap();
    assert_eq!(out[0], AppendOutcome::Appended { index: 1, entry_hash: s.entry(1).unwrap().unwrap().entry_hash, checkpoint: None });
    let out = s.append(&[req(2)], &k, &policy, 2000).unwrap();
    assert!(matches!(out[0], AppendOutcome::Appended { checkpoint: Some(3), .. }));
    assert_eq!(s.checkpoint(&k, &policy, 9000, false).unwrap(), None, "no growth, no checkpoint");
    s.append(&[req(3)], &k, &policy, 2001).unwrap();
    assert_eq!(s.checkpoint(&k, &policy, 2002, true).unwrap().unwrap().size, 4);
}

#[test]
fn refuses_another_key_and_bad_input_atomically() {
    let mut s = SqliteStore::open_in_memory().unwrap();
    let policy = CheckpointPolicy::default();
    s.append(&[req(0)], &key(), &policy, 1).unwrap();
    let other = SignerKey::from_seed("ledger.test", &[6; 32]).unwrap();
    assert!(matches!(s.append(&[req(1)], &other, &policy, 2), Err(StoreError::KeyMismatch { .. })));
    let mut bad = req(2);
    bad.fields.pcr0 = "XY".into();
    // The good first request of the batch is rolled back with the bad one.
    assert!(matches!(s.append(&[req(1), bad], &key(), &policy, 3), Err(StoreError::Field(_))));
    assert_eq!(s.size().unwrap(), 1);
    assert_eq!(s.tree_node_count().unwrap(), 1);
}

#[test]
fn queries_filter_by_fields_and_time() {
    let mut s = SqliteStore::open_in_memory().unwrap();
    let policy = CheckpointPolicy::default();
    let mut reqs: Vec<_> = (0..6).map(req).collect();
    reqs[2].fields.model_id = "other/model".into();
    reqs[4].fields.pcr0 = "00".repeat(48);
    s.append(&reqs, &key(), &policy, 1).unwrap();
    let q = |q: Query| s.query(&q).unwrap().iter().map(|e| e.index).collect::<Vec<_>>();
    assert_eq!(q(Query::default()), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(q(Query { model_id: Some("other/model".into()), ..Default::default() }), vec![2]);
    assert_eq!(q(Query { pcr0: Some("00".repeat(48)), ..Default::default() }), vec![4]);
    assert_eq!(q(Query { job_id: Some(crate::testing::test_job(3)), ..Default::default() }), vec![3]);
    let end = |i: u64| sample_fields(i).end_ms;
    assert_eq!(q(Query { since_ms: Some(end(2)), until_ms: Some(end(4)), ..Default::default() }), vec![2, 3]);
    assert_eq!(q(Query { limit: Some(2), ..Default::default() }), vec![0, 1]);
    assert_eq!(s.entry_by_job(&crate::testing::test_job(5)).unwrap().unwrap().index, 5);
    assert!(s.entry_by_job(&crate::testing::test_job(0xff)).unwrap().is_none());
}

/// A version 2 file (no `kind` column) reads its rows as jobs and is migrated by a writer; a
/// usage entry then has its kind.
#[test]
fn a_version_2_ledger_is_read_then_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    let policy = CheckpointPolicy::default();
    {
        let mut s = SqliteStore::open(&path, &SqliteOptions::default()).unwrap();
        s.append(&[req(0)], &key(), &policy, 1).unwrap();
        s.conn
            .execute_batch("ALTER TABLE entries DROP COLUMN kind; UPDATE meta SET value = '2' WHERE key = 'schema_version';")
            .unwrap();
    }
    let old = SqliteStore::open_read_only(&path, &SqliteOptions::default()).unwrap();
    assert_eq!(old.entry(0).unwrap().unwrap().fields, sample_fields(0));
    drop(old);
    let mut s = SqliteStore::open(&path, &SqliteOptions::default()).unwrap();
    assert_eq!(meta(&s.conn, "schema_version").unwrap().as_deref(), Some(SCHEMA_VERSION));
    let mut usage = req(1);
    usage.fields.kind = EntryKind::Usage;
    s.append(&[usage.clone()], &key(), &policy, 2).unwrap();
    let q = s.query(&Query { kind: Some(EntryKind::Usage), ..Query::default() }).unwrap();
    assert_eq!(q.iter().map(|e| e.fields.clone()).collect::<Vec<_>>(), vec![usage.fields]);
    // The column refuses a kind the code does not know.
    assert!(s.conn.execute("UPDATE entries SET kind = 'other' WHERE idx = 0", []).is_err());
}

/// A version 1 file (no `policy` and no `kind` column) is read as it is and migrated by a writer.
#[test]
fn a_version_1_ledger_is_read_then_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite");
    let policy = CheckpointPolicy::default();
    {
        let mut s = SqliteStore::open(&path, &SqliteOptions::default()).unwrap();
        s.append(&[req(0)], &key(), &policy, 1).unwrap();
        s.conn
            .execute_batch(
                "ALTER TABLE entries DROP COLUMN policy; ALTER TABLE entries DROP COLUMN kind; \
                 UPDATE meta SET value = '1' WHERE key = 'schema_version';",
            )
            .unwrap();
    }
    let old = SqliteStore::open_read_only(&path, &SqliteOptions::default()).unwrap();
    assert_eq!(old.entry(0).unwrap().unwrap().fields, sample_fields(0));
    drop(old);
    let mut s = SqliteStore::open(&path, &SqliteOptions::default()).unwrap();
    assert_eq!(meta(&s.conn, "schema_version").unwrap().as_deref(), Some(SCHEMA_VERSION));
    let mut admitted = req(1);
    admitted.fields.policy = Some("5e".repeat(32));
    s.append(&[admitted.clone()], &key(), &policy, 2).unwrap();
    assert_eq!(s.entry(0).unwrap().unwrap().fields.policy, None, "appended before there was an allow-list");
    assert_eq!(s.entry_by_job(&admitted.fields.job_id).unwrap().unwrap().fields, admitted.fields);
    let q = s.query(&Query::default()).unwrap();
    assert_eq!(q.iter().map(|e| e.fields.policy.clone()).collect::<Vec<_>>(), vec![None, admitted.fields.policy]);
    // Another version is still refused.
    s.conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'", []).unwrap();
    drop(s);
    assert!(matches!(SqliteStore::open(&path, &SqliteOptions::default()), Err(StoreError::SchemaVersion { .. })));
    assert!(matches!(SqliteStore::open_read_only(&path, &SqliteOptions::default()), Err(StoreError::SchemaVersion { .. })));
}
