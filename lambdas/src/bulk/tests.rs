use super::*;
use cloud::bulk::{Manifest, ManifestStatus};
use cloud_local::DirObjectStore;
use protocol::dev_enclave::DevEnclave;
use protocol::attestation::PolicySet;
use protocol::receipt_check::ReceiptVerifier;
use sha2::{Digest, Sha256};

const T: u64 = 1_761_955_200_000;

fn stores() -> (tempfile::TempDir, DirObjectStore, DirObjectStore) {
    let tmp = tempfile::tempdir().unwrap();
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let attestations = DirObjectStore::open(tmp.path().join("attestations")).unwrap();
    (tmp, jobs, attestations)
}

fn job(n: u64) -> JobId {
    protocol::dev_enclave::job_id(n)
}

/// What `bulk-list-shards` writes, planted directly.
fn plant_listing(jobs: &dyn ObjectStore, bulk_id: &str, shards: Vec<Shard>) {
    let listing = Listing { version: 1, bulk_id: bulk_id.into(), bucket: "jobs".into(), prefix: format!("stores/s/incoming/{bulk_id}/"), shards };
    jobs.put(&layout::bulk_shards(bulk_id), &serde_json::to_vec(&listing).unwrap(), PutCondition::Overwrite).unwrap();
}

fn input(bulk_id: &str, outcomes: Vec<ShardStatus>) -> AggregateInput {
    AggregateInput { bulk_id: bulk_id.into(), bucket: "jobs".into(), prefix: format!("stores/s/incoming/{bulk_id}/"), outcomes }
}

fn shard(bulk_id: &str, name: &str, job: &JobId) -> Shard {
    Shard { key: format!("stores/s/incoming/{bulk_id}/{name}.sealed"), job_id: *job }
}

/// Shard 1's receipt is the genuine image's; shard 2's comes from a host running its own
/// image on genuine hardware (same root, another PCR0).
#[test]
fn bulk_aggregate_refuses_a_shard_receipt_from_another_image() {
    let (_tmp, jobs, attestations) = stores();
    let (genuine, other) = (DevEnclave::new(4, T), DevEnclave::with_image(4, 0xee, T));
    let mut shards = Vec::new();
    for (n, enclave) in [(1u64, &genuine), (2, &other)] {
        let id = job(n);
        jobs.put(&layout::job_receipt(&id), &enclave.sign(&enclave.receipt(n)), PutCondition::Overwrite).unwrap();
        let sha: [u8; 32] = Sha256::digest(&enclave.document).into();
        attestations.put(&layout::attestation_by_hash(&sha), &enclave.document, PutCondition::Overwrite).unwrap();
        shards.push(shard("b1", &n.to_string(), &id));
    }
    plant_listing(&jobs, "b1", shards);
    let input = input("b1", vec![ShardStatus::Committed; 2]);
    let statuses = |jobs: &DirObjectStore| -> Vec<ManifestStatus> {
        let m: Manifest = serde_json::from_slice(&jobs.get(&manifest_key("b1")).unwrap()).unwrap();
        m.shards.into_iter().map(|s| s.status).collect()
    };
    // Any image under the root: the other image's receipt counts as committed.
    aggregate(&input, &jobs, &attestations, &ReceiptVerifier::new(genuine.anchor()), T).unwrap();
    assert!(matches!(statuses(&jobs)[1], ManifestStatus::Committed { .. }));

    let publisher = ed25519_dalek::SigningKey::from_bytes(&[0x51; 32]);
    let set = PolicySet::verify(&publisher.verifying_key(), vec![("p.json".into(), genuine.policy(&publisher))]).unwrap();
    let check = ReceiptVerifier::enforcing(genuine.anchor(), set).unwrap();
    let err = aggregate(&input, &jobs, &attestations, &check, T).unwrap_err();
    assert!(matches!(&err, BulkError::ReceiptsRefused { refused: 1, total: 2, first, .. } if first.starts_with(&format!("job {}: policy: ", job(2).to_hex()))), "{err}");
    let statuses = statuses(&jobs);
    assert!(matches!(statuses[0], ManifestStatus::Committed { .. }));
    assert!(matches!(&statuses[1], ManifestStatus::Refused { check, message, .. } if check == "policy" && message.contains(&"ee".repeat(48))), "{:?}", statuses[1]);
}

/// A listing naming one job under two keys (planted: `bulk-list-shards` refuses to write one)
/// would count the job twice in the manifest's totals: refused by name, no manifest.
#[test]
fn a_listing_with_one_job_twice_is_refused_by_name() {
    let (_tmp, jobs, attestations) = stores();
    let enclave = DevEnclave::new(4, T);
    let id = job(7);
    jobs.put(&layout::job_receipt(&id), &enclave.sign(&enclave.receipt(7)), PutCondition::Overwrite).unwrap();
    plant_listing(&jobs, "dup", vec![shard("dup", "a", &id), shard("dup", "copy-of-a", &id)]);
    let err = aggregate(&input("dup", vec![ShardStatus::Committed; 2]), &jobs, &attestations, &ReceiptVerifier::new(enclave.anchor()), T).unwrap_err();
    match &err {
        BulkError::DuplicateJob { job_id, first, second } => {
            assert_eq!(job_id, &id);
            assert!(first.ends_with("/a.sealed") && second.ends_with("/copy-of-a.sealed"), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(jobs.head(&manifest_key("dup")).unwrap().is_none());
}

/// The listing is read bounded and must be this run's, with one outcome per shard.
#[test]
fn the_aggregate_step_reads_only_its_own_bounded_listing() {
    let (_tmp, jobs, attestations) = stores();
    let check = ReceiptVerifier::new(DevEnclave::new(4, T).anchor());
    let run = |input: &AggregateInput| aggregate(input, &jobs, &attestations, &check, T).unwrap_err();

    assert!(matches!(run(&input("none", vec![])), BulkError::Object(ObjectError::NotFound { .. })));
    plant_listing(&jobs, "r", vec![shard("r", "a", &job(1)), shard("r", "b", &job(2))]);
    assert!(matches!(run(&input("r", vec![ShardStatus::TimedOut])), BulkError::Outcomes { listed: 2, outcomes: 1, .. }));
    let elsewhere = AggregateInput { prefix: "stores/s/incoming/other/".into(), ..input("r", vec![ShardStatus::TimedOut; 2]) };
    assert!(matches!(run(&elsewhere), BulkError::Listing { message, .. } if message.contains("stores/s/incoming/other/")));
    // Another run's listing copied under this run's key.
    let theirs = jobs.get(&layout::bulk_shards("r")).unwrap();
    jobs.put(&layout::bulk_shards("mine"), &theirs, PutCondition::Overwrite).unwrap();
    assert!(matches!(run(&input("mine", vec![])), BulkError::Listing { message, .. } if message.contains("\"r\"")));
    // A giant: refused after one ranged read of the limit + 1.
    jobs.put(&layout::bulk_shards("big"), &vec![b' '; 4 << 20], PutCondition::Overwrite).unwrap();
    assert!(matches!(run(&input("big", vec![])), BulkError::Listing { message, .. } if message.contains(&MAX_LISTING_FILE_BYTES.to_string())));
}

/// A host plants a multi-MiB receipt (create-only, so before the genuine one): read at most
/// 4 MiB + 1 and refused by name, not read whole.
#[test]
fn an_oversized_receipt_is_refused_unread() {
    let (_tmp, jobs, attestations) = stores();
    let id = job(3);
    jobs.put(&layout::job_receipt(&id), &vec![0u8; (cloud::MAX_SMALL_OBJECT + 1) as usize], PutCondition::CreateOnly).unwrap();
    plant_listing(&jobs, "big", vec![shard("big", "a", &id)]);
    let check = ReceiptVerifier::new(DevEnclave::new(4, T).anchor());
    let err = aggregate(&input("big", vec![ShardStatus::Committed]), &jobs, &attestations, &check, T).unwrap_err();
    assert!(matches!(&err, BulkError::ReceiptsRefused { refused: 1, first, .. } if first.contains("receipt: larger than")), "{err}");
}

/// The listing is written once: the same listing again (a retried step) is fine, another one
/// under the same bulk id is refused.
#[test]
fn a_bulk_id_lists_one_set_of_shards() {
    let (_tmp, jobs, _) = stores();
    let listing = Listing { version: 1, bulk_id: "once".into(), bucket: "jobs".into(), prefix: "stores/s/a/".into(), shards: vec![shard("once", "a", &job(1))] };
    write_listing(&jobs, &listing).unwrap();
    write_listing(&jobs, &listing).unwrap();
    let other = Listing { prefix: "stores/s/b/".into(), ..listing.clone() };
    assert!(matches!(write_listing(&jobs, &other), Err(BulkError::ListingTaken { prefix, .. }) if prefix == "stores/s/a/"));
    assert_eq!(read_listing(&jobs, "once").unwrap(), listing);
}

/// A receipt that verifies but carries a count the ledger cannot index (its check `fields`)
/// never makes a shard committed: the ledger would refuse it, so the manifest would name a
/// receipt the ledger never holds.
#[test]
fn a_receipt_the_ledger_would_refuse_as_fields_is_refused() {
    let (_tmp, jobs, attestations) = stores();
    let enclave = DevEnclave::new(4, T);
    let id = job(5);
    let mut receipt = enclave.receipt(5);
    receipt.records_ok = u64::MAX;
    jobs.put(&layout::job_receipt(&id), &enclave.sign(&receipt), PutCondition::Overwrite).unwrap();
    let sha: [u8; 32] = Sha256::digest(&enclave.document).into();
    attestations.put(&layout::attestation_by_hash(&sha), &enclave.document, PutCondition::Overwrite).unwrap();
    plant_listing(&jobs, "f", vec![shard("f", "a", &id)]);
    let check = ReceiptVerifier::new(enclave.anchor());
    let err = aggregate(&input("f", vec![ShardStatus::Committed]), &jobs, &attestations, &check, T).unwrap_err();
    assert!(matches!(&err, BulkError::ReceiptsRefused { refused: 1, first, .. } if first.contains("fields: field ok_count is above")), "{err}");
}
