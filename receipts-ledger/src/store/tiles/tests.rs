use protocol::JobId;
use std::sync::{Arc, Mutex};

use cloud::hooked::{Hooked, RaceBeforePut};
use cloud_local::DirObjectStore;
use cloud::{ObjectStore, PutCondition};

use super::layout::{Layout, TileId};
use super::*;
use crate::merkle::{inclusion_proof, leaf_hash, verify_inclusion, MemoryTree};
use crate::note::SignerKey;
use crate::testing::{test_request, TestReceipts};
use crate::Ledger;

fn key() -> SignerKey {
    SignerKey::from_seed("ledger.test/tiles", &[9; 32]).unwrap()
}

/// A store over the stand-in receipts of [`test_request`].
fn test_store(
    objects: Arc<dyn ObjectStore>,
    layout: Layout,
    cache: Cache,
    verifier: crate::note::VerifierKey,
    options: TileOptions,
) -> Result<TileStore, TileError> {
    Ok(TileStore::open(objects, layout, cache, verifier, options)?.with_leaves(Arc::new(TestReceipts)))
}

fn objects() -> (tempfile::TempDir, Arc<DirObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = DirObjectStore::open(dir.path().join("bucket")).unwrap();
    (dir, Arc::new(store))
}

fn appender(objects: Arc<dyn ObjectStore>) -> TileStore {
    test_store(objects, Layout::new(""), Cache::Memory, key().verifier(), TileOptions::appender()).unwrap()
}

fn append(store: &mut TileStore, jobs: std::ops::Range<u64>, now_ms: u64) -> Vec<AppendOutcome> {
    let batch: Vec<AppendRequest> = jobs.map(|j| test_request(j, 200)).collect();
    store.append(&batch, &key(), &CheckpointPolicy::default(), now_ms).unwrap()
}

/// Every entry, as the index holds it.
fn all_entries(store: &dyn LedgerStore) -> Vec<Entry> {
    let mut out = Vec::new();
    store.scan_entries(&mut |e| {
        out.push(e.unwrap());
        true
    })
    .unwrap();
    out
}

#[test]
fn tiles_round_trip() {
    let (_dir, objects) = objects();
    let mut store = appender(objects.clone());
    // Batches that cross a full tile (256) and land on odd widths.
    let mut next = 0;
    for (n, size) in [1u64, 2, 250, 10, 300].into_iter().enumerate() {
        append(&mut store, next..next + size, 1_000 + n as u64);
        next += size;
    }
    assert_eq!(store.size().unwrap(), 563);

    let mut mem = MemoryTree::new();
    for j in 0..next {
        mem.push(&test_request(j, 200).leaf);
    }
    let head = read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap();
    assert_eq!((head.size, head.root), (563, root_at(&mem, 563).unwrap()));

    // The published objects are the spec's: full tiles, partial right edges, entry bundles.
    let layout = Layout::new("");
    let full0 = TileId { level: 0, index: 0, width: 256 };
    let edge0 = TileId { level: 0, index: 2, width: 51 };
    let edge1 = TileId { level: 1, index: 0, width: 2 };
    for t in [full0, TileId { level: 0, index: 1, width: 256 }, edge0, edge1] {
        assert_eq!(objects.get(&layout.tile(t)).unwrap(), tile_bytes(&mem, t).unwrap(), "{}", layout.tile(t));
    }
    let bundle = objects.get(&layout.entries(edge0)).unwrap();
    let leaves = bundle::decode_entries(&bundle, 51).unwrap();
    for (i, leaf) in leaves.iter().enumerate() {
        assert_eq!(leaf, &test_request(512 + i as u64, 200).leaf);
        assert_eq!(leaf_hash(leaf), mem.node_hashes(&[NodeId::new(0, 512 + i as u64)]).unwrap()[0]);
    }
    // Partial tiles of earlier checkpoints stay (1, 3, 253 and 263 entries).
    for width in [1u16, 3, 253] {
        assert!(objects.head(&layout.tile(TileId { level: 0, index: 0, width })).unwrap().is_some());
    }
    // Every commit's checkpoint is archived and verifies.
    let archived: Vec<u64> =
        objects.list(&layout.archive_prefix()).unwrap().iter().filter_map(|m| layout.archived_size(&m.key)).collect();
    assert_eq!(archived.len(), 5);

    // An inclusion proof from the cache verifies against the signed checkpoint.
    let cp = Checkpoint::open(head.note.as_bytes(), &key().verifier()).unwrap();
    let proof = inclusion_proof(&store, 400, cp.size).unwrap();
    verify_inclusion(400, cp.size, &leaf_hash(&test_request(400, 200).leaf), &proof, &cp.root).unwrap();

    // A re-delivered receipt is not appended twice.
    let again = append(&mut store, 5..6, 9_999);
    assert!(matches!(again[0], AppendOutcome::Existing { index: 5, same_leaf: true }));
    assert_eq!(read_head(objects.as_ref(), &layout, &key().verifier()).unwrap().unwrap().size, 563);
}

#[test]
fn a_rebuild_from_the_objects_equals_the_original() {
    let (dir, objects) = objects();
    let mut original = appender(objects.clone());
    for (n, start) in [0u64, 3, 40, 290].into_iter().enumerate() {
        append(&mut original, start..start + [3, 37, 250, 5][n], 10_000 + n as u64 * 7);
    }
    // A cache on disk, rebuilt from nothing by a new appender...
    let path = dir.path().join("cache/ledger-cache.sqlite");
    let mut rebuilt =
        test_store(objects.clone(), Layout::new(""), Cache::File(path.clone()), key().verifier(), TileOptions::auditor())
            .unwrap();
    let report = sync(&mut rebuilt).unwrap();
    assert_eq!((report.from, report.size, report.checkpoints), (0, 295, 4));
    assert_eq!(all_entries(&rebuilt), all_entries(&original));
    assert_eq!(rebuilt.checkpoints().unwrap(), original.checkpoints().unwrap());
    assert_eq!(copy_root(&rebuilt).unwrap(), copy_root(&original).unwrap());
    assert_eq!(rebuilt.ledger_key().unwrap(), Some(key().verifier().to_string()));
    for e in all_entries(&original) {
        assert_eq!(
            rebuilt.attestation_document(&e.attestation_sha256).unwrap(),
            original.attestation_document(&e.attestation_sha256).unwrap()
        );
    }
    let audit = audit(&rebuilt).unwrap();
    assert!(audit.ok(), "{audit:?}");
    assert!(audit.hash_tiles >= 4 && audit.entry_bundles >= 4 && audit.meta_bundles >= 4, "{audit:?}");

    // ... catches up incrementally, and the whole ledger verifies as a ledger.
    append(&mut original, 295..300, 20_000);
    let report = sync(&mut rebuilt).unwrap();
    assert_eq!((report.from, report.size, report.checkpoints), (295, 300, 5));
    assert_eq!(all_entries(&rebuilt), all_entries(&original));
    let verified = crate::verify_ledger(&rebuilt, &key().verifier(), Some(&TestReceipts)).unwrap();
    assert!(verified.issues.is_empty(), "{verified:?}");

    // An appender whose cache file is gone rebuilds it before appending.
    drop(rebuilt);
    std::fs::remove_file(&path).unwrap();
    let mut fresh =
        test_store(objects.clone(), Layout::new(""), Cache::File(path), key().verifier(), TileOptions::appender()).unwrap();
    append(&mut fresh, 300..302, 30_000);
    append(&mut original, 302..303, 30_001);
    assert_eq!(original.size().unwrap(), 303);
    assert_eq!(copy_root(&original).unwrap(), {
        fresh.refresh().unwrap();
        copy_root(&fresh).unwrap()
    });
}

#[test]
fn a_concurrent_appender_loses_the_swap_and_retries() {
    let (_dir, objects) = objects();
    let mut first = appender(objects.clone());
    append(&mut first, 0..3, 1);

    let other = Arc::new(Mutex::new(appender(objects.clone())));
    let racing = other.clone();
    // A second appender commits just before the first one's compare-and-swap of the checkpoint.
    let race = RaceBeforePut::new("checkpoint", move || {
        append(&mut racing.lock().unwrap(), 100..102, 2);
    });
    let interleaved = Arc::new(Hooked::new(objects.clone(), race));
    let mut loser = appender(interleaved.clone());
    let out = append(&mut loser, 3..5, 3);

    assert_eq!(interleaved.hooks.refused(), 1, "the first swap must lose");
    // The loser's entries land after the winner's, nothing is lost or duplicated.
    assert_eq!(out.iter().map(AppendOutcome::index).collect::<Vec<_>>(), vec![5, 6]);
    let jobs: Vec<JobId> = all_entries(&loser).iter().map(|e| e.fields.job_id).collect();
    let want: Vec<JobId> = [0u64, 1, 2, 100, 101, 3, 4].into_iter().map(crate::testing::test_job).collect();
    assert_eq!(jobs, want);
    // Both see the same tree, and the lost attempt left no signed checkpoint behind.
    let mut check = appender(objects.clone());
    check.refresh().unwrap();
    assert_eq!(copy_root(&check).unwrap(), copy_root(&loser).unwrap());
    let sizes: Vec<u64> = objects
        .list(&Layout::new("").archive_prefix())
        .unwrap()
        .iter()
        .filter_map(|m| Layout::new("").archived_size(&m.key))
        .collect();
    assert_eq!({ let mut s = sizes; s.sort(); s }, vec![3, 5, 7]);
    assert!(audit(&check).unwrap().ok());
}

#[test]
fn tampering_is_detected() {
    let (_dir, objects) = objects();
    let mut store = appender(objects.clone());
    append(&mut store, 0..260, 5);
    append(&mut store, 260..270, 6);
    let layout = Layout::new("");

    // A hash tile rewritten: the audit names it.
    let t = TileId { level: 0, index: 0, width: 256 };
    let mut bytes = objects.get(&layout.tile(t)).unwrap();
    bytes[40] ^= 1;
    objects.put(&layout.tile(t), &bytes, PutCondition::Overwrite).unwrap();
    let mut auditor = test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    sync(&mut auditor).unwrap();
    let report = audit(&auditor).unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert_eq!(report.problems[0].key, "tile/0/000");

    // A receipt swapped inside an entry bundle: a fresh copy no longer reaches the signed root.
    let edge = TileId { level: 0, index: 1, width: 14 };
    let mut leaves = bundle::decode_entries(&objects.get(&layout.entries(edge)).unwrap(), 14).unwrap();
    leaves[3] = test_request(9_999, 200).leaf;
    let forged = bundle::encode_entries(leaves.iter().map(|l| (0, l.as_slice()))).unwrap();
    objects.put(&layout.entries(edge), &forged, PutCondition::Overwrite).unwrap();
    let mut fresh = test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    // The rebuilt tree misses the signed root; on the way, the metadata no longer matches the
    // receipt (its fields, and the chain hashes from there on).
    assert!(matches!(sync(&mut fresh), Err(TileError::RootMismatch { size: 260, .. })), "entry bundle forgery not detected");
    assert_eq!(fresh.altered_metadata()[..2], [
        AlteredMetadata { key: layout.meta(edge), index: 259, field: "job_id" },
        AlteredMetadata { key: layout.meta(edge), index: 259, field: "entry_hash" },
    ]);
    // Forging the metadata to match still cannot reach the signed root.
    let t = TileId { level: 0, index: 1, width: 14 };
    let mut meta = bundle::decode_meta(&objects.get(&layout.meta(t)).unwrap(), 256, 14).unwrap();
    let mut prev = fresh_prev(&auditor, 258);
    for m in meta.iter_mut().skip(3) {
        let leaf = &leaves[(m.index - 256) as usize];
        let h = crate::entry::entry_hash(m.index, &prev, &leaf_hash(leaf), &m.attestation_hash().unwrap());
        m.entry_hash = hex::encode(h);
        prev = h;
    }
    meta[3].fields = crate::testing::test_fields(9_999);
    objects.put(&layout.meta(t), &bundle::encode_meta(&meta), PutCondition::Overwrite).unwrap();
    let mut fresh = test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    assert!(matches!(sync(&mut fresh), Err(TileError::RootMismatch { size: 260, .. })), "forged bundle reached the signed root");
    // The earlier copy still audits the forged bundle as different.
    let report = audit(&auditor).unwrap();
    assert!(report.problems.iter().any(|p| p.key == "tile/entries/001.p/14"), "{report:?}");

    // A checkpoint signed by another key is refused outright.
    let other = SignerKey::from_seed("ledger.test/tiles", &[8; 32]).unwrap();
    let note = Checkpoint::new("ledger.test/tiles", 270, copy_root(&auditor).unwrap()).sign(&other).unwrap();
    objects.put(&layout.checkpoint(), note.as_bytes(), PutCondition::Overwrite).unwrap();
    assert!(matches!(sync(&mut auditor), Err(TileError::Checkpoint { .. })));
}

/// The chain hash of entry `index` in a copy.
fn fresh_prev(store: &TileStore, index: u64) -> crate::merkle::Hash {
    store.entry(index).unwrap().unwrap().entry_hash
}

#[test]
fn an_unfinished_commit_is_completed_from_its_staging_record() {
    let (_dir, objects) = objects();
    let mut store = appender(objects.clone());
    append(&mut store, 0..4, 1);
    append(&mut store, 4..9, 2);
    let layout = Layout::new("");
    // The second commit's appender died right after its checkpoint swap: nothing published.
    for t in super::layout::tiles_of(9, 4) {
        objects.delete(&layout.tile(t)).unwrap();
        if t.level == 0 {
            objects.delete(&layout.entries(t)).unwrap();
            objects.delete(&layout.meta(t)).unwrap();
        }
    }
    objects.delete(&layout.archived_checkpoint(9)).unwrap();

    // A reader rebuilds from the staging record...
    let mut reader = test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    assert_eq!(sync(&mut reader).unwrap().size, 9);
    // ... and the next appender publishes the missing objects before its own commit.
    let mut next = appender(objects.clone());
    append(&mut next, 9..10, 3);
    assert!(objects.head(&layout.entries(TileId { level: 0, index: 0, width: 9 })).unwrap().is_some());
    assert!(objects.head(&layout.archived_checkpoint(9)).unwrap().is_some());
    let mut auditor = test_store(objects.clone(), layout, Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    sync(&mut auditor).unwrap();
    assert!(audit(&auditor).unwrap().ok());
}

#[test]
fn receipts_too_large_for_a_bundle_are_refused_before_anything_is_written() {
    let (_dir, objects) = objects();
    let mut store = appender(objects.clone());
    let big = test_request(1, MAX_BUNDLED_ENTRY + 10);
    let err = store.append(&[big], &key(), &CheckpointPolicy::default(), 1).unwrap_err();
    assert!(matches!(err, StoreError::Tiles(ref e) if matches!(**e, TileError::EntryTooLarge { index: 0, .. })), "{err}");
    assert_eq!(store.size().unwrap(), 0);
    assert!(objects.list("").unwrap().is_empty());
}

#[test]
fn the_ledger_appends_through_the_tiles() {
    let (_dir, objects) = objects();
    let store = appender(objects.clone());
    let mut ledger = Ledger::new(store, Box::new(TestReceipts), Box::new(key()), CheckpointPolicy::default());
    for j in 0..3 {
        ledger.append(test_request(j, 100), 50 + j).unwrap();
    }
    assert_eq!(ledger.tick(100).unwrap(), None, "every commit is already a checkpoint");
    let head = read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap();
    assert_eq!(head.size, 3);
    assert_eq!(ledger.store().latest_checkpoint().unwrap().unwrap().note, head.note);
}

/// Someone who can write the ledger bucket (not sign with the ledger key) puts an older, validly
/// signed checkpoint back. Rebuilding from it would make the honest appender sign a tree that
/// diverges from the one already published, dropping entries clients were told were ledgered.
#[test]
fn a_rolled_back_checkpoint_is_refused_by_the_appender_and_by_a_fresh_sync() {
    let (_dir, objects) = objects();
    let layout = Layout::new("");
    let mut store = appender(objects.clone());
    append(&mut store, 0..3, 1_000);
    let old = objects.get(&layout.checkpoint()).unwrap();
    append(&mut store, 3..5, 2_000);
    objects.put(&layout.checkpoint(), &old, PutCondition::Overwrite).unwrap();

    // The appender that signed size 5 refuses to build on size 3, and signs nothing.
    let batch = [test_request(5, 200)];
    let error = store.append(&batch, &key(), &CheckpointPolicy::default(), 3_000).unwrap_err();
    assert!(error.to_string().contains("rolled back"), "{error}");
    assert_eq!(objects.get(&layout.checkpoint()).unwrap(), old, "nothing signed over the rolled-back head");

    // A fresh appender (an empty cache: a Lambda's cold start) sees the archived size-5 checkpoint.
    let mut fresh = appender(objects.clone());
    let error = fresh.append(&batch, &key(), &CheckpointPolicy::default(), 3_000).unwrap_err();
    assert!(error.to_string().contains("rolled back") && error.to_string().contains('5'), "{error}");

    // So does a fresh auditor's sync.
    let mut auditor =
        test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    let error = sync(&mut auditor).unwrap_err();
    assert!(matches!(error, TileError::RolledBack { head: 3, seen: 5, .. }), "{error}");

    // An archived "checkpoint" that does not verify proves nothing and blocks nobody.
    objects.put(&layout.checkpoint(), &objects.get(&layout.archived_checkpoint(5)).unwrap(), PutCondition::Overwrite).unwrap();
    objects.put(&layout.archived_checkpoint(9), b"not a signed note", PutCondition::CreateOnly).unwrap();
    let mut fresh = appender(objects.clone());
    fresh.append(&batch, &key(), &CheckpointPolicy::default(), 3_000).unwrap();
    assert_eq!(fresh.size().unwrap(), 6);
}

/// Someone who can write the ledger bucket (not sign with the ledger key) edits a metadata
/// bundle so that entry 2 claims another job. A rebuild (a Lambda's cold start) that trusted the
/// metadata would hide job 2 — its receipt appended a second time — and squat the claimed job.
/// The fields come from the receipts the signed tree holds; the edit is ignored and alarmed.
#[test]
fn edited_metadata_is_ignored_and_alarmed_never_trusted() {
    let (_dir, objects) = objects();
    let layout = Layout::new("");
    let mut store = appender(objects.clone());
    append(&mut store, 0..5, 1_000);
    let t = TileId { level: 0, index: 0, width: 5 };
    let mut meta = bundle::decode_meta(&objects.get(&layout.meta(t)).unwrap(), 0, 5).unwrap();
    meta[2].fields = crate::testing::test_fields(99);
    meta[3].fields.ok_count += 1_000;
    objects.put(&layout.meta(t), &bundle::encode_meta(&meta), PutCondition::Overwrite).unwrap();

    // A cold start: the receipt of job 2, sent again, is the entry already held, not a new one.
    let mut fresh = appender(objects.clone());
    let again = fresh.append(&[test_request(2, 200)], &key(), &CheckpointPolicy::default(), 2_000).unwrap();
    assert_eq!(again, vec![AppendOutcome::Existing { index: 2, same_leaf: true }]);
    assert_eq!(fresh.size().unwrap(), 5, "job 2 doubled");
    assert!(fresh.entry_by_job(&crate::testing::test_job(99)).unwrap().is_none(), "job 99 squatted");
    assert_eq!(fresh.entry(3).unwrap().unwrap().fields, crate::testing::test_fields(3));
    assert_eq!(all_entries(&fresh), all_entries(&store));
    let key_of = layout.meta(t);
    let alarms: Vec<(String, u64, &str)> = fresh.altered_metadata().iter().map(|a| (a.key.clone(), a.index, a.field)).collect();
    assert_eq!(alarms, vec![(key_of.clone(), 2, "job_id"), (key_of.clone(), 3, "ok_count")]);

    // An auditor's fresh copy holds the receipts' fields too, reports the alarms, and the audit
    // names the edited object.
    let mut auditor = test_store(objects.clone(), layout.clone(), Cache::Memory, key().verifier(), TileOptions::auditor()).unwrap();
    let report = sync(&mut auditor).unwrap();
    assert_eq!(report.altered_metadata.len(), 2, "{report:?}");
    assert_eq!(all_entries(&auditor), all_entries(&store));
    let audit = audit(&auditor).unwrap();
    assert_eq!(audit.problems.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(), vec![key_of.as_str()], "{audit:?}");
}

/// The attestation hash in the metadata is the receipt's own: pointing an entry at another
/// document (and rewriting the chain hashes to match) changes nothing in a rebuild.
#[test]
fn an_edited_attestation_hash_in_the_metadata_is_ignored() {
    let (_dir, objects) = objects();
    let layout = Layout::new("");
    let mut store = appender(objects.clone());
    append(&mut store, 0..4, 1_000);
    let t = TileId { level: 0, index: 0, width: 4 };
    let mut meta = bundle::decode_meta(&objects.get(&layout.meta(t)).unwrap(), 0, 4).unwrap();
    // Entry 1 names job 1's document 1; point it at job 2's document 2 and re-chain from there.
    meta[1].attestation_sha256 = meta[2].attestation_sha256.clone();
    let leaves = bundle::decode_entries(&objects.get(&layout.entries(t)).unwrap(), 4).unwrap();
    let mut prev = store.entry(0).unwrap().unwrap().entry_hash;
    for m in meta.iter_mut().skip(1) {
        let h = crate::entry::entry_hash(m.index, &prev, &leaf_hash(&leaves[m.index as usize]), &m.attestation_hash().unwrap());
        m.entry_hash = hex::encode(h);
        prev = h;
    }
    objects.put(&layout.meta(t), &bundle::encode_meta(&meta), PutCondition::Overwrite).unwrap();
    let mut fresh = appender(objects.clone());
    fresh.refresh().unwrap();
    assert_eq!(all_entries(&fresh), all_entries(&store));
    let alarms: Vec<(u64, &str)> = fresh.altered_metadata().iter().map(|a| (a.index, a.field)).collect();
    assert_eq!(alarms, vec![(1, "attestation_sha256"), (1, "entry_hash"), (2, "entry_hash"), (3, "entry_hash")]);
}

/// Witness cosignatures go on the published `checkpoint` (and the cache), never on the archived
/// one, never onto a newer checkpoint, and never with the signed text changed.
#[test]
fn cosignatures_are_published_on_the_current_checkpoint_only() {
    use crate::cosignature::{add_signature_lines, verify_cosignatures, CosignerSigner};
    let (_dir, objects) = objects();
    let mut store = appender(objects.clone());
    append(&mut store, 0..3, 1_000);
    let head = read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap();
    let witness = CosignerSigner::from_seed("w.tiles.test", &[4; 32]).unwrap();
    let text = crate::note::Note::parse(head.note.as_bytes()).unwrap().text;
    let cosigned = add_signature_lines(&head.note, &witness.cosign(&text, 7)).unwrap();
    store.add_cosignatures(head.size, &cosigned).unwrap();

    let published = read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap();
    assert_eq!(published.note, cosigned);
    let note = crate::note::Note::parse(published.note.as_bytes()).unwrap();
    assert_eq!(verify_cosignatures(&note, &[witness.verifier()]).unwrap().len(), 1);
    assert_eq!(store.latest_checkpoint().unwrap().unwrap().note, cosigned);
    let archived = objects.get(&Layout::new("").archived_checkpoint(head.size)).unwrap();
    assert_eq!(archived, head.note.as_bytes(), "the archive keeps the ledger's own signature");
    // A reader rebuilding from the objects accepts the cosigned checkpoint.
    let mut reader = test_store(objects.clone(), Layout::new(""), Cache::Memory, key().verifier(), TileOptions::appender()).unwrap();
    assert_eq!(reader.refresh().unwrap().unwrap().size, 3);

    // A changed text is refused; cosignatures for an older size leave the newer checkpoint alone.
    let forged = cosigned.replacen(&text.lines().next().unwrap().to_owned(), "another.origin", 1);
    assert!(matches!(store.add_cosignatures(head.size, &forged), Err(StoreError::NotSameCheckpoint { .. })));
    append(&mut store, 3..5, 2_000);
    let newer = read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap();
    store.add_cosignatures(head.size, &cosigned).unwrap();
    assert_eq!(read_head(objects.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap().note, newer.note);
}
