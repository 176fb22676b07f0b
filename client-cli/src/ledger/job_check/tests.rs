//! The operator plays against a tenant's per-job ledger check: it shows a proof whose checkpoint
//! lacks the witnesses' cosignatures, or, after the tenant saw a checkpoint, a proof under
//! another tree (same size, other root; a bigger tree that does not extend it; an older one that
//! is no prefix of it). Each is refused by name and none is remembered; the honest ledger's
//! proofs, older and newer, pass.

use std::sync::Arc;

use super::*;
use cloud::{PutCondition, layout};
use cloud_local::DirObjectStore;
use protocol::dev_enclave::DevEnclave;
use protocol::receipt_check::ReceiptVerifier;
use receipts_ledger::cosignature::{CosignerSigner, add_signature_lines};
use receipts_ledger::store::tiles::{Cache, TileOptions, TileStore, layout::Layout};
use receipts_ledger::testing::{dev_request, test_job};
use receipts_ledger::{CheckpointPolicy, Ledger, SignerKey};

const T: u64 = 1_761_955_200_000;
const ORIGIN: &str = "ledger.example/jobs";

fn id(j: u64) -> JobId {
    test_job(j)
}

/// A deployment's ledger (tlog-tiles in a bucket of its own), signed by the operator's key.
struct Tree {
    bucket: Arc<dyn ObjectStore>,
    ledger: Ledger<TileStore>,
}

impl Tree {
    /// The jobs appended one commit each, in this order.
    fn new(dir: &Path, enclave: &DevEnclave, jobs: &[u64]) -> Tree {
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(dir).unwrap());
        let signer = SignerKey::from_seed(ORIGIN, &[5; 32]).unwrap();
        let store = TileStore::open(bucket.clone(), Layout::new(""), Cache::Memory, signer.verifier(), TileOptions::appender()).unwrap();
        let check = Box::new(ReceiptVerifier::new(enclave.anchor()));
        let mut tree = Tree { bucket, ledger: Ledger::new(store, check, Box::new(signer), CheckpointPolicy::default()) };
        tree.append(enclave, jobs);
        tree
    }

    fn append(&mut self, enclave: &DevEnclave, jobs: &[u64]) {
        for (n, &j) in jobs.iter().enumerate() {
            self.ledger.append(dev_request(enclave, j), T + n as u64).unwrap();
        }
    }

    /// Job `j`'s proof against the latest checkpoint, as ledger-append writes it.
    fn proof(&self, j: u64) -> receipts_ledger::ProofBundle {
        receipts_ledger::prove(self.ledger.store(), &id(j)).unwrap()
    }
}

struct Tenant {
    _tmp: tempfile::TempDir,
    enclave: DevEnclave,
    jobs: DirObjectStore,
    /// Where the tenant remembers checkpoints (its home's copy directory).
    seen: PathBuf,
    key: VerifierKey,
}

impl Tenant {
    fn new() -> Tenant {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let key = SignerKey::from_seed(ORIGIN, &[5; 32]).unwrap().verifier();
        Tenant { seen: tmp.path().join("aws-ledger"), jobs, enclave: DevEnclave::new(4, T), key, _tmp: tmp }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.seen.parent().unwrap().join(name)
    }

    /// The operator writes `bundle` as job `j`'s proof object; the tenant checks it, reading hash
    /// tiles from `tiles` (the ledger bucket the operator serves).
    fn check(&self, j: u64, bundle: &receipts_ledger::ProofBundle, tiles: &Tree, policy: Option<&WitnessPolicy>) -> Result<JobEntry, &'static str> {
        self.jobs.put(&layout::job_ledger_proof(&id(j)), bundle.to_json().as_bytes(), PutCondition::Overwrite).unwrap();
        let receipt = self.enclave.sign(&self.enclave.receipt(j));
        check_job_proof_object(&self.jobs, tiles.bucket.as_ref(), "", &self.seen, &id(j), &receipt, &self.key, policy)
            .unwrap()
            .expect("a proof object")
            .map_err(|r| r.check)
    }

    fn seen_size(&self) -> Option<u64> {
        seen_checkpoint(&self.seen, ORIGIN).unwrap().map(|c| c.size)
    }
}

fn witnesses() -> (CosignerSigner, CosignerSigner) {
    (CosignerSigner::from_seed("w1.example", &[1; 32]).unwrap(), CosignerSigner::from_seed("w2.example", &[2; 32]).unwrap())
}

fn policy(keys: &[&CosignerSigner], quorum: Option<usize>) -> WitnessPolicy {
    WitnessArgs { witnesses: keys.iter().map(|k| k.verifier().to_string()).collect(), quorum }.policy_with(None).unwrap().unwrap()
}

/// The bundle's checkpoint with `witness`'s cosignature added.
fn cosigned(mut bundle: receipts_ledger::ProofBundle, witness: &CosignerSigner) -> receipts_ledger::ProofBundle {
    let text = receipts_ledger::note::Note::parse(bundle.checkpoint.as_bytes()).unwrap().text;
    bundle.checkpoint = add_signature_lines(&bundle.checkpoint, &witness.cosign(&text, 1_700_000_000)).unwrap();
    bundle
}

/// A per-job proof whose checkpoint lacks the required cosignatures is refused
/// (`witness_quorum`), a cosignature that does not verify too (`witness_cosignature`); neither
/// is remembered. With the quorum, the detail names the witnesses; without any witness
/// configured it says the operator's key alone signed.
#[test]
fn a_job_proof_without_the_witness_quorum_is_refused() {
    let t = Tenant::new();
    let honest = Tree::new(&t.dir("ledger"), &t.enclave, &[0, 1, 2]);
    let (w1, w2) = witnesses();
    let both = policy(&[&w1, &w2], None);
    // The operator's signature alone, then one witness of the two required.
    assert_eq!(t.check(2, &honest.proof(2), &honest, Some(&both)), Err("witness_quorum"));
    assert_eq!(t.check(2, &cosigned(honest.proof(2), &w1), &honest, Some(&both)), Err("witness_quorum"));
    // A line under w2's key that does not verify.
    let mut forged = cosigned(honest.proof(2), &w1);
    let line = w2.cosign("another checkpoint\n", 1_700_000_000);
    forged.checkpoint = add_signature_lines(&forged.checkpoint, &line).unwrap();
    assert_eq!(t.check(2, &forged, &honest, Some(&both)), Err("witness_cosignature"));
    assert_eq!(t.seen_size(), None, "a refused checkpoint is never remembered");
    // Both cosignatures: accepted, named, remembered.
    let entry = t.check(2, &cosigned(cosigned(honest.proof(2), &w1), &w2), &honest, Some(&both)).unwrap();
    assert_eq!((entry.leaf_index, entry.tree_size, entry.witnesses.clone()), (2, 3, vec!["w1.example".to_owned(), "w2.example".to_owned()]));
    assert!(entry.describe("p").contains("cosigned by w1.example, w2.example (quorum 2 of 2 witnesses)"), "{}", entry.describe("p"));
    assert_eq!(t.seen_size(), Some(3));
    // One of two is enough when the quorum says so.
    assert!(t.check(2, &cosigned(honest.proof(2), &w2), &honest, Some(&policy(&[&w1, &w2], Some(1)))).is_ok());
    // No witness configured: accepted, and said to rest on the operator's key only.
    let entry = t.check(2, &honest.proof(2), &honest, None).unwrap();
    assert!(entry.describe("p").contains("signed by the operator's key only"), "{}", entry.describe("p"));
    assert!(entry.describe("p").contains("no witness is configured"), "{}", entry.describe("p"));
}

/// After the tenant saw a checkpoint, the operator shows proofs under other trees signed with
/// the same key: refused as `fork` (same size, other root) or `consistency` (a bigger tree that
/// does not extend it, an older one that is no prefix of it), even when the operator serves the
/// forked tree's own tiles. The honest ledger's older and newer proofs pass.
#[test]
fn a_forked_job_proof_after_a_seen_checkpoint_is_refused() {
    let t = Tenant::new();
    let mut honest = Tree::new(&t.dir("ledger"), &t.enclave, &[0, 1]);
    let early = honest.proof(1); // job 1's proof at size 2, written when it was appended
    honest.append(&t.enclave, &[2, 3]);
    let seen = t.check(3, &honest.proof(3), &honest, None).unwrap();
    assert_eq!((seen.tree_size, seen.seen.previous), (4, None));
    // The same four receipts in another order: the same size, another root.
    let fork = Tree::new(&t.dir("fork"), &t.enclave, &[3, 2, 1, 0]);
    assert_eq!(t.check(0, &fork.proof(0), &fork, None), Err("fork"));
    // A bigger tree that does not extend the one seen, with its own tiles served.
    let mut bigger = Tree::new(&t.dir("bigger"), &t.enclave, &[3, 2, 1, 0]);
    bigger.append(&t.enclave, &[4, 5]);
    assert_eq!(t.check(5, &bigger.proof(5), &bigger, None), Err("consistency"));
    assert_eq!(t.check(5, &bigger.proof(5), &honest, None), Err("consistency"));
    // An older tree that is not a prefix of the one seen.
    let older = Tree::new(&t.dir("older"), &t.enclave, &[1, 0]);
    assert_eq!(t.check(1, &older.proof(1), &honest, None), Err("consistency"));
    assert_eq!(t.seen_size(), Some(4), "no refused checkpoint replaced the one seen");
    // The honest ledger: job 1's older proof is a prefix of what was seen, and it grows on.
    let entry = t.check(1, &early, &honest, None).unwrap();
    assert_eq!((entry.tree_size, entry.seen.previous), (2, Some(4)));
    assert!(entry.describe("p").ends_with("a prefix of checkpoint 4 this client saw before"), "{}", entry.describe("p"));
    honest.append(&t.enclave, &[4, 5]);
    let entry = t.check(5, &honest.proof(5), &honest, None).unwrap();
    assert_eq!((entry.tree_size, entry.seen.previous), (6, Some(4)));
    assert_eq!(t.seen_size(), Some(6));
    // Now the bigger fork of size 6 is a fork.
    assert_eq!(t.check(5, &bigger.proof(5), &bigger, None), Err("fork"));
}

/// A local ledger (the home's, or a synced copy): the newest checkpoint with the quorum is used
/// when the latest is not cosigned yet; one without any is refused; a ledger that shrank below a
/// checkpoint seen is a `rollback`.
#[test]
fn a_local_ledger_uses_its_newest_witnessed_checkpoint() {
    use receipts_ledger::testing::{TestReceipts, test_request};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ledger");
    let (w1, _) = witnesses();
    let one = policy(&[&w1], None);
    let open = |dir: &Path| {
        let options = receipts_ledger::local::LocalOptions {
            policy: CheckpointPolicy { every_appends: u64::MAX, every_ms: u64::MAX },
            ..Default::default()
        };
        LocalLedger::open_with(dir, Box::new(TestReceipts), &options).unwrap().0
    };
    let mut ledger = open(&dir);
    let receipt = |j: u64| test_request(j, 64).leaf;
    ledger.append(test_request(0, 64), 1).unwrap();
    ledger.append(test_request(1, 64), 2).unwrap();
    let cp2 = ledger.checkpoint_now(3).unwrap().unwrap();
    let pinned = ledger.verifier();
    assert_eq!(check_job_in_ledger(&dir, &test_job(1), &receipt(1), &pinned, Some(&one)).unwrap().map_err(|r| r.check), Err("witness_quorum"));
    let text = receipts_ledger::note::Note::parse(cp2.note.as_bytes()).unwrap().text;
    ledger.store().add_cosignatures(2, &add_signature_lines(&cp2.note, &w1.cosign(&text, 1_700_000_000)).unwrap()).unwrap();
    ledger.append(test_request(2, 64), 4).unwrap();
    ledger.checkpoint_now(5).unwrap();
    // The latest (3) is not cosigned; job 1 is proven under 2, which is.
    let entry = check_job_in_ledger(&dir, &test_job(1), &receipt(1), &pinned, Some(&one)).unwrap().unwrap();
    assert_eq!((entry.tree_size, entry.witnesses.clone()), (2, vec!["w1.example".to_owned()]));
    // Job 2 is only under 3.
    assert_eq!(check_job_in_ledger(&dir, &test_job(2), &receipt(2), &pinned, Some(&one)).unwrap().map_err(|r| r.check), Err("witness_quorum"));
    // Without witnesses: the latest, remembered.
    let entry = check_job_in_ledger(&dir, &test_job(2), &receipt(2), &pinned, None).unwrap().unwrap();
    assert_eq!((entry.tree_size, entry.seen.previous), (3, Some(2)));
    // Another receipt than the ledger's.
    assert_eq!(check_job_in_ledger(&dir, &test_job(2), b"other", &pinned, None).unwrap().map_err(|r| r.check), Err("receipt"));
    // Not in the ledger yet: not a refusal.
    assert!(check_job_in_ledger(&dir, &test_job(9), &receipt(9), &pinned, None).is_err());
    // The operator replaces the ledger with a shorter one under the same key: a rollback.
    drop(ledger);
    std::fs::remove_file(dir.join(receipts_ledger::local::LEDGER_DB)).unwrap();
    let mut shorter = open(&dir);
    shorter.append(test_request(0, 64), 1).unwrap();
    shorter.append(test_request(1, 64), 2).unwrap();
    shorter.checkpoint_now(3).unwrap();
    assert_eq!(check_job_in_ledger(&dir, &test_job(1), &receipt(1), &pinned, None).unwrap().map_err(|r| r.check), Err("rollback"));
}
