//! The tlog-tiles ledger on S3 itself (an emulator: moto, started by `scripts/test-rust.sh`,
//! endpoint in `EPHEM_TEST_AWS_ENDPOINT`): create-only tiles are `If-None-Match: *` puts, the
//! checkpoint swap an `If-Match` put, and both must hold on the real S3 protocol. Skipped, with
//! a note, when no emulator is configured.

use std::sync::{Arc, Mutex};

use cloud_aws::AwsClients;
use cloud::hooked::{Hooked, RaceBeforePut};
use cloud::{ObjectError, ObjectStore, PutCondition};
use receipts_ledger::store::tiles::layout::Layout;
use receipts_ledger::store::tiles::{audit, copy_root, read_head, sync, Cache, TileOptions};
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::{CheckpointPolicy, LedgerStore, SignerKey, TileStore};

fn emulator() -> Option<AwsClients> {
    let Some(endpoint) = std::env::var("EPHEM_TEST_AWS_ENDPOINT").ok().filter(|v| !v.is_empty()) else {
        eprintln!("\n*** SKIPPED: EPHEM_TEST_AWS_ENDPOINT is not set; `make test-aws` starts moto and runs this. ***\n");
        return None;
    };
    Some(AwsClients::connect_emulator(&endpoint, "us-east-1").expect("emulator clients"))
}

fn bucket(clients: &AwsClients) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let name = format!("ledger-tiles-{}-{nanos:x}", std::process::id());
    clients.runtime.block_on(clients.s3.create_bucket().bucket(&name).send()).expect("create bucket");
    name
}

fn key() -> SignerKey {
    SignerKey::from_seed("ledger.test/s3", &[4; 32]).unwrap()
}

fn append(store: &mut TileStore, jobs: std::ops::Range<u64>, now: u64) {
    let batch: Vec<_> = jobs.map(|j| test_request(j, 300)).collect();
    store.append(&batch, &key(), &CheckpointPolicy::default(), now).unwrap();
}

#[test]
fn aws_tiles_on_s3_swap_rebuild_and_audit() {
    let Some(clients) = emulator() else { return };
    let name = bucket(&clients);
    let s3: Arc<dyn ObjectStore> = Arc::new(clients.object_store(&name, ""));
    let open = |objects: Arc<dyn ObjectStore>, options| {
        TileStore::open(objects, Layout::new(""), Cache::Memory, key().verifier(), options).unwrap().with_leaves(Arc::new(TestReceipts))
    };

    let mut first = open(s3.clone(), TileOptions::appender());
    append(&mut first, 0..3, 1);
    append(&mut first, 3..260, 2); // crosses a full tile

    // A second appender commits between the first one's read and its swap: the swap fails on
    // S3's If-Match, and the retry lands on top.
    let racing = Arc::new(Mutex::new(open(s3.clone(), TileOptions::appender())));
    let other = racing.clone();
    // Another appender commits just before this one's compare-and-swap goes out.
    let race = RaceBeforePut::new("checkpoint", move || append(&mut other.lock().unwrap(), 1000..1002, 3));
    let interleaved = Arc::new(Hooked::new(s3.clone(), race));
    let mut loser = open(interleaved.clone(), TileOptions::appender());
    append(&mut loser, 260..263, 4);
    assert_eq!(interleaved.hooks.refused(), 1, "S3 accepted a stale If-Match");
    assert_eq!(loser.size().unwrap(), 265);

    // Create-only really is create-only on S3.
    let tile = "tile/0/000";
    assert!(matches!(s3.put(tile, b"x", PutCondition::CreateOnly), Err(ObjectError::AlreadyExists { .. })));

    // An auditor's copy from the bucket alone equals the appender's, and every object checks out.
    let mut copy = open(s3.clone(), TileOptions::auditor());
    let report = sync(&mut copy).unwrap();
    assert_eq!((report.size, report.checkpoints), (265, 4));
    assert_eq!(copy_root(&copy).unwrap(), copy_root(&loser).unwrap());
    assert_eq!(
        read_head(s3.as_ref(), &Layout::new(""), &key().verifier()).unwrap().unwrap().root,
        copy_root(&copy).unwrap()
    );
    let audited = audit(&copy).unwrap();
    assert!(audited.ok() && audited.hash_tiles >= 5, "{audited:?}");
}
