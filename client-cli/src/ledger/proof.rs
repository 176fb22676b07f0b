//! A job's own ledger proof: `jobs/<id>/ledger-proof.json`, which the ledger's appender writes
//! beside `ledgered.json` (a proof bundle, docs/protocol.md §8.6). A tenant checks its job's
//! inclusion with it and read access to its own jobs only — not to the ledger bucket, which holds
//! every tenant's rows.
//!
//! Anyone who can write the jobs bucket can write the object, so nothing in it is taken on its
//! word: the checkpoint must carry the pinned ledger key's signature (never the key the bundle
//! names), the inclusion path must lead from the receipt to that checkpoint's root, and the
//! receipt proven must be byte for byte the receipt the client verified for its job. A refusal
//! names its check: `bundle` (the JSON, its version, its hex), `checkpoint`, `tree_size`,
//! `inclusion`, `receipt`.

use cloud::{layout, ObjectError, ObjectStore};
use protocol::envelope::JobId;
use receipts_ledger::bundle::MAX_BUNDLE_SIZE;
use receipts_ledger::{ProofBundle, VerifiedBundle, VerifierKey, verify_bundle};

use super::Refusal;
use super::verify_bundle::bundle_refusal;

/// What a job's proof object says, checked.
pub enum JobProof {
    /// The ledger holds the receipt at `leaf_index` of the checkpoint signed by the pinned key;
    /// `note` is that checkpoint as the proof carries it (with any witnesses' cosignatures).
    Proven { proven: VerifiedBundle, note: String },
    /// No proof object (an appender from before there were any, or not appended yet).
    Absent,
    /// It does not prove the receipt: the check that failed.
    Refused(Refusal),
}

/// Reads and checks `job`'s proof object in `jobs` against the `pinned` ledger key and the
/// `receipt` (the exact bytes the client verified for the job).
pub fn check_job_proof(jobs: &dyn ObjectStore, job: &JobId, receipt: &[u8], pinned: &VerifierKey) -> Result<JobProof, ObjectError> {
    let key = layout::job_ledger_proof(job);
    let bytes = match jobs.get_at_most(&key, MAX_BUNDLE_SIZE as u64) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(JobProof::Absent),
        Err(ObjectError::Rejected { message, .. }) => {
            return Ok(JobProof::Refused(Refusal { check: "bundle", message: format!("{key}: {message}") }));
        }
        Err(e) => return Err(e),
    };
    Ok(match check_proof(&bytes, receipt, pinned) {
        Ok((proven, note)) => JobProof::Proven { proven, note },
        Err(refusal) => JobProof::Refused(refusal),
    })
}

/// Checks proof bundle bytes against the pinned key and the receipt they must prove: what they
/// prove, and the signed checkpoint note they carry.
pub fn check_proof(bytes: &[u8], receipt: &[u8], pinned: &VerifierKey) -> Result<(VerifiedBundle, String), Refusal> {
    let bundle = ProofBundle::from_json(bytes).map_err(|e| bundle_refusal(&e))?;
    let proven = verify_bundle(&bundle, pinned).map_err(|e| bundle_refusal(&e))?;
    if proven.receipt != receipt {
        return Err(Refusal {
            check: "receipt",
            message: format!("the proof is for another receipt (leaf {} of {}), not this job's", proven.leaf_index, proven.checkpoint.size),
        });
    }
    Ok((proven, bundle.checkpoint))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use cloud::PutCondition;
    use cloud_local::DirObjectStore;
    use receipts_ledger::store::tiles::{Cache, TileOptions, TileStore, layout::Layout};
    use protocol::dev_enclave::DevEnclave;
    use receipts_ledger::testing::dev_request;
    use receipts_ledger::{CheckpointPolicy, Ledger, LedgerStore, SignerKey};
    use protocol::receipt_check::ReceiptVerifier;

    const T: u64 = 1_761_955_200_000;

    struct Fixture {
        _tmp: tempfile::TempDir,
        jobs: DirObjectStore,
        enclave: DevEnclave,
        key: VerifierKey,
        proofs: Vec<ProofBundle>,
    }

    /// A deployment's ledger in its own bucket with four receipts, and each job's proof object
    /// in a jobs bucket, as `ledger-append` writes them; the client reads only the jobs bucket.
    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let enclave = DevEnclave::new(4, T);
        let signer = SignerKey::from_seed("ledger.example/proofs", &[5; 32]).unwrap();
        let key = signer.verifier();
        let store = TileStore::open(bucket, Layout::new(""), Cache::Memory, key.clone(), TileOptions::appender()).unwrap();
        let check = Box::new(ReceiptVerifier::new(enclave.anchor()));
        let mut ledger = Ledger::new(store, check, Box::new(signer), CheckpointPolicy::default());
        let mut proofs = Vec::new();
        for j in 0..4 {
            ledger.append(dev_request(&enclave, j), T + j).unwrap();
            let bundle = receipts_ledger::prove(ledger.store(), &receipts_ledger::testing::test_job(j)).unwrap();
            jobs.put(&layout::job_ledger_proof(&id(j)), bundle.to_json().as_bytes(), PutCondition::Overwrite).unwrap();
            proofs.push(bundle);
        }
        assert_eq!(ledger.store().size().unwrap(), 4);
        Fixture { _tmp: tmp, jobs, enclave, key, proofs }
    }

    fn id(j: u64) -> JobId {
        JobId::from_hex(&format!("{j:032x}")).unwrap()
    }

    impl Fixture {
        fn receipt(&self, j: u64) -> Vec<u8> {
            self.enclave.sign(&self.enclave.receipt(j))
        }

        /// A host's edit of job `j`'s proof object, then the client's check.
        fn edited(&self, j: u64, edit: impl FnOnce(&mut ProofBundle)) -> Option<&'static str> {
            let mut bundle = self.proofs[j as usize].clone();
            edit(&mut bundle);
            self.jobs.put(&layout::job_ledger_proof(&id(j)), bundle.to_json().as_bytes(), PutCondition::Overwrite).unwrap();
            match check_job_proof(&self.jobs, &id(j), &self.receipt(j), &self.key).unwrap() {
                JobProof::Proven { .. } => None,
                JobProof::Refused(refusal) => Some(refusal.check),
                JobProof::Absent => Some("absent"),
            }
        }
    }

    #[test]
    fn a_tenant_checks_its_job_with_the_jobs_bucket_alone() {
        let f = fixture();
        for j in 0..4 {
            match check_job_proof(&f.jobs, &id(j), &f.receipt(j), &f.key).unwrap() {
                JobProof::Proven { proven: p, .. } => assert_eq!((p.leaf_index, p.checkpoint.size), (j, j + 1)),
                _ => panic!("job {j} not proven"),
            }
        }
        assert!(matches!(check_job_proof(&f.jobs, &id(9), b"none", &f.key).unwrap(), JobProof::Absent));
    }

    /// A host (or anyone who can write the jobs bucket) edits the proof object: each edit is
    /// refused, named by the check that caught it.
    #[test]
    fn an_edited_proof_object_is_refused_by_name() {
        let f = fixture();
        // Another index: the path no longer leads to the signed root.
        assert_eq!(f.edited(1, |b| b.leaf_index = 2), Some("inclusion"));
        // Another path: a hash changed, or one left out.
        assert_eq!(f.edited(1, |b| b.inclusion_path[0] = "00".repeat(32)), Some("inclusion"));
        assert_eq!(f.edited(1, |b| { b.inclusion_path.pop(); }), Some("inclusion"));
        // A checkpoint signed by another key, the bundle naming that key: the pinned key decides.
        let other = SignerKey::from_seed("ledger.example/proofs", &[6; 32]).unwrap();
        let forged = |b: &mut ProofBundle| {
            let cp = receipts_ledger::Checkpoint::open(b.checkpoint.as_bytes(), &f.key).unwrap();
            b.checkpoint = receipts_ledger::Checkpoint::new("ledger.example/proofs", cp.size, cp.root).sign(&other).unwrap();
            b.ledger_key = other.verifier().to_string();
        };
        assert_eq!(f.edited(1, forged), Some("checkpoint"));
        // A checkpoint of another size than the proof claims.
        assert_eq!(f.edited(1, |b| b.tree_size += 1), Some("tree_size"));
        // Another job's genuine proof in this job's place.
        let someone_elses = f.proofs[2].clone();
        assert_eq!(f.edited(1, |b| *b = someone_elses), Some("receipt"));
        // Not a bundle at all.
        f.jobs.put(&layout::job_ledger_proof(&id(3)), b"{\"version\":1}", PutCondition::Overwrite).unwrap();
        assert!(matches!(check_job_proof(&f.jobs, &id(3), &f.receipt(3), &f.key).unwrap(), JobProof::Refused(r) if r.check == "bundle"));
        // The untouched proof of job 0 still verifies.
        assert_eq!(f.edited(0, |_| {}), None);
    }
}
