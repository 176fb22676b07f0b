//! Offline proof bundles: everything an auditor needs to check that a
//! receipt is in the ledger, verified against a ledger key the auditor pins.
//!
//! JSON (all byte strings lowercase hex):
//! `{"version":1, "receipt", "attestation_document", "leaf_index", "tree_size",
//!   "inclusion_path":[…], "checkpoint", "ledger_key"}`.

use protocol::JobId;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::entry::{IndexedFields, ReceiptCheck, ReceiptRefusal};
use crate::merkle::{inclusion_proof, leaf_hash, verify_inclusion, Hash, ProofError, VerifyError};
use crate::note::VerifierKey;
use crate::store::{LedgerStore, StoreError};

/// The bundle format version this code writes and reads.
pub const BUNDLE_VERSION: u32 = 1;
/// Largest bundle JSON accepted.
pub const MAX_BUNDLE_SIZE: usize = 8 << 20;
/// Longest inclusion path accepted (a tree of 2^64 leaves has 64 levels).
pub const MAX_PATH_LEN: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofBundle {
    pub version: u32,
    /// The receipt's exact COSE_Sign1 bytes (the Merkle leaf).
    pub receipt: String,
    /// The attestation document the receipt names.
    pub attestation_document: String,
    pub leaf_index: u64,
    pub tree_size: u64,
    /// RFC 9162 inclusion path, leaf end first, 32-byte hashes.
    pub inclusion_path: Vec<String>,
    /// The signed checkpoint note (tlog-checkpoint in a signed note) of `tree_size`.
    pub checkpoint: String,
    /// The ledger's verifier key string — informative only: verification
    /// uses the key the auditor pins.
    pub ledger_key: String,
}

/// Why a bundle could not be made or did not verify.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("bundle JSON: {0}")]
    Json(String),
    #[error("bundle is {size} bytes, more than {max}")]
    TooLarge { size: usize, max: usize },
    #[error("bundle version {0} is not supported")]
    Version(u32),
    #[error("bundle field {field} is not lowercase hex")]
    Hex { field: &'static str },
    #[error("inclusion path element {0} is not a 32-byte hash")]
    PathElement(usize),
    #[error("inclusion path has more than {MAX_PATH_LEN} elements")]
    PathTooLong,
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("bundle tree size {bundle} differs from the checkpoint's {checkpoint}")]
    SizeMismatch { bundle: u64, checkpoint: u64 },
    #[error("inclusion proof: {0}")]
    Inclusion(#[from] VerifyError),
    #[error("receipt check failed: {0}")]
    ReceiptRejected(ReceiptRefusal),
    #[error("job {0} is not in the ledger")]
    UnknownJob(JobId),
    #[error("entry {index} is not covered by a checkpoint yet (latest checkpoint size {latest})")]
    NotCheckpointed { index: u64, latest: u64 },
    #[error("entry {index}: attestation document is missing from the ledger")]
    AttestationMissing { index: u64 },
    #[error("ledger has no signing key recorded")]
    NoLedgerKey,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Proof(#[from] ProofError),
}

/// What a verified bundle proves: `receipt` is leaf `leaf_index` of the tree
/// whose signed checkpoint is `checkpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedBundle {
    pub leaf_index: u64,
    pub checkpoint: Checkpoint,
    pub receipt: Vec<u8>,
    pub attestation_document: Vec<u8>,
    /// Whether the key the bundle names is the pinned key (if not, the bundle
    /// still verified under the pinned key; the named one was ignored).
    pub bundle_key_matches_pinned: bool,
}

fn lower_hex(field: &'static str, s: &str) -> Result<Vec<u8>, BundleError> {
    if !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(BundleError::Hex { field });
    }
    hex::decode(s).map_err(|_| BundleError::Hex { field })
}

impl ProofBundle {
    pub fn from_json(bytes: &[u8]) -> Result<Self, BundleError> {
        if bytes.len() > MAX_BUNDLE_SIZE {
            return Err(BundleError::TooLarge { size: bytes.len(), max: MAX_BUNDLE_SIZE });
        }
        serde_json::from_slice(bytes).map_err(|e| BundleError::Json(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a bundle always serialises")
    }
}

/// Builds the bundle for `job_id` against the latest checkpoint.
pub fn prove(store: &dyn LedgerStore, job_id: &JobId) -> Result<ProofBundle, BundleError> {
    let entry = store.entry_by_job(job_id)?.ok_or(BundleError::UnknownJob(*job_id))?;
    let cp = store.latest_checkpoint()?;
    let latest = cp.as_ref().map_or(0, |c| c.size);
    let cp = cp
        .filter(|c| c.size > entry.index)
        .ok_or(BundleError::NotCheckpointed { index: entry.index, latest })?;
    let doc = store
        .attestation_document(&entry.attestation_sha256)?
        .ok_or(BundleError::AttestationMissing { index: entry.index })?;
    let path = inclusion_proof(store, entry.index, cp.size)?;
    Ok(ProofBundle {
        version: BUNDLE_VERSION,
        receipt: hex::encode(&entry.leaf),
        attestation_document: hex::encode(doc),
        leaf_index: entry.index,
        tree_size: cp.size,
        inclusion_path: path.iter().map(hex::encode).collect(),
        checkpoint: cp.note,
        ledger_key: store.ledger_key()?.ok_or(BundleError::NoLedgerKey)?,
    })
}

/// Verifies a bundle offline. Only `pinned` is trusted: the checkpoint must
/// carry its valid signature; the key named in the bundle is ignored.
pub fn verify_bundle(bundle: &ProofBundle, pinned: &VerifierKey) -> Result<VerifiedBundle, BundleError> {
    if bundle.version != BUNDLE_VERSION {
        return Err(BundleError::Version(bundle.version));
    }
    let receipt = lower_hex("receipt", &bundle.receipt)?;
    let attestation_document = lower_hex("attestation_document", &bundle.attestation_document)?;
    if bundle.inclusion_path.len() > MAX_PATH_LEN {
        return Err(BundleError::PathTooLong);
    }
    let path = bundle
        .inclusion_path
        .iter()
        .enumerate()
        .map(|(i, h)| lower_hex("inclusion_path", h)?.try_into().map_err(|_| BundleError::PathElement(i)))
        .collect::<Result<Vec<Hash>, _>>()?;
    let checkpoint = Checkpoint::open(bundle.checkpoint.as_bytes(), pinned)?;
    if checkpoint.size != bundle.tree_size {
        return Err(BundleError::SizeMismatch { bundle: bundle.tree_size, checkpoint: checkpoint.size });
    }
    verify_inclusion(bundle.leaf_index, bundle.tree_size, &leaf_hash(&receipt), &path, &checkpoint.root)?;
    Ok(VerifiedBundle {
        leaf_index: bundle.leaf_index,
        checkpoint,
        receipt,
        attestation_document,
        bundle_key_matches_pinned: VerifierKey::parse(&bundle.ledger_key).is_ok_and(|k| k == *pinned),
    })
}

/// [`verify_bundle`], then the receipt check (receipt signature and its
/// binding to the attestation document); returns the receipt's fields.
pub fn verify_bundle_and_receipt(
    bundle: &ProofBundle,
    pinned: &VerifierKey,
    check: &dyn ReceiptCheck,
) -> Result<(VerifiedBundle, IndexedFields), BundleError> {
    let v = verify_bundle(bundle, pinned)?;
    let fields = check.check(&v.receipt, &v.attestation_document).map_err(BundleError::ReceiptRejected)?;
    Ok((v, fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{sample_fields, AppendRequest};
    use crate::note::{NoteError, SignerKey};
    use crate::store::{CheckpointPolicy, SqliteStore};

    const ORIGIN: &str = "ledger.ephem-batch.example/test";

    fn two_leaf_ledger() -> (SqliteStore, SignerKey) {
        let key = SignerKey::from_seed(ORIGIN, &[0x42; 32]).unwrap();
        let mut s = SqliteStore::open_in_memory().unwrap();
        let reqs: Vec<_> = (0..2)
            .map(|i| AppendRequest {
                leaf: format!("receipt-{i}").into_bytes(),
                fields: sample_fields(i),
                attestation_document: b"attestation-document".to_vec(),
            })
            .collect();
        let policy = CheckpointPolicy { every_appends: 2, every_ms: u64::MAX };
        s.append(&reqs, &key, &policy, 1).unwrap();
        (s, key)
    }

    /// Known answer, also in docs/protocol.md §8 (cross-checked with Python
    /// hashlib + cryptography).
    #[test]
    fn known_answer_bundle() {
        let (s, key) = two_leaf_ledger();
        let b = prove(&s, &crate::testing::test_job(1)).unwrap();
        let want = ProofBundle {
            version: 1,
            receipt: "726563656970742d31".into(),
            attestation_document: "6174746573746174696f6e2d646f63756d656e74".into(),
            leaf_index: 1,
            tree_size: 2,
            inclusion_path: vec!["30ffcce68ded5ce2353dcb4cac3e9b97e8bfac59c144302ea341014fd0560f06".into()],
            checkpoint: "ledger.ephem-batch.example/test\n2\npPO3R2Ik9m8BlBdMIs8FfM6VfZTYI0tf31lCC6Yy878=\n\n\
                \u{2014} ledger.ephem-batch.example/test cJJfLVoDnxVnr5lOoTop1WR2tFyrEpzwX060fxH+aKXHWULgsMiDKX66EBC0mlVEhk/UoArfzHOqKSSCaP/Q+bsZMgY=\n"
                .into(),
            ledger_key: "ledger.ephem-batch.example/test+70925f2d+ASFS+NGbeR0kRTJC4V8uq2y3z/p7al7TAJeWDgaYgdsS".into(),
        };
        assert_eq!(b, want);
        let v = verify_bundle(&ProofBundle::from_json(b.to_json().as_bytes()).unwrap(), &key.verifier()).unwrap();
        assert_eq!(hex::encode(v.checkpoint.root), "a4f3b7476224f66f0194174c22cf057cce957d94d8234b5fdf59420ba632f3bf");
        assert!(v.bundle_key_matches_pinned);
        assert_eq!(v.receipt, b"receipt-1");
    }

    fn flip_hex_digit(s: &str, at: usize) -> String {
        let mut b = s.as_bytes().to_vec();
        b[at] = if b[at] == b'0' { b'1' } else { b'0' };
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn any_changed_hex_digit_fails() {
        let (s, key) = two_leaf_ledger();
        let pinned = key.verifier();
        let good = prove(&s, &crate::testing::test_job(0)).unwrap();
        verify_bundle(&good, &pinned).unwrap();
        for i in 0..good.receipt.len() {
            let mut b = good.clone();
            b.receipt = flip_hex_digit(&b.receipt, i);
            assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Inclusion(_))), "receipt digit {i}");
        }
        for i in 0..64 {
            let mut b = good.clone();
            b.inclusion_path[0] = flip_hex_digit(&b.inclusion_path[0], i);
            assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Inclusion(_))), "path digit {i}");
        }
        let mut b = good.clone();
        b.receipt = b.receipt.to_uppercase();
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Hex { field: "receipt" })));
        let mut b = good.clone();
        b.leaf_index = 1;
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Inclusion(_))));
        let mut b = good.clone();
        b.tree_size = 3;
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::SizeMismatch { bundle: 3, checkpoint: 2 })));
        let mut b = good.clone();
        b.checkpoint = b.checkpoint.replacen("\n2\n", "\n3\n", 1);
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Checkpoint(_))));
        let mut b = good.clone();
        b.inclusion_path.push(b.inclusion_path[0].clone());
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Inclusion(_))));
        let mut b = good.clone();
        b.inclusion_path[0].pop();
        assert!(matches!(verify_bundle(&b, &pinned), Err(BundleError::Hex { .. } | BundleError::PathElement(0))));
    }

    #[test]
    fn only_the_pinned_key_is_trusted() {
        let (s, key) = two_leaf_ledger();
        let good = prove(&s, &crate::testing::test_job(1)).unwrap();
        // An attacker re-signs a checkpoint over a forged tree with their own
        // key under the same origin, and names that key in the bundle.
        let evil = SignerKey::from_seed(ORIGIN, &[0x66; 32]).unwrap();
        let forged_receipt = b"forged".to_vec();
        let cp = Checkpoint::new(ORIGIN, 1, leaf_hash(&forged_receipt));
        let forged = ProofBundle {
            receipt: hex::encode(&forged_receipt),
            leaf_index: 0,
            tree_size: 1,
            inclusion_path: vec![],
            checkpoint: cp.sign(&evil).unwrap(),
            ledger_key: evil.verifier().to_string(),
            ..good.clone()
        };
        verify_bundle(&forged, &evil.verifier()).unwrap();
        assert!(matches!(
            verify_bundle(&forged, &key.verifier()),
            Err(BundleError::Checkpoint(CheckpointError::Note(NoteError::NoKnownSignature)))
        ));
        // The real bundle naming another key still verifies under the pinned key.
        let renamed = ProofBundle { ledger_key: evil.verifier().to_string(), ..good };
        let v = verify_bundle(&renamed, &key.verifier()).unwrap();
        assert!(!v.bundle_key_matches_pinned);
    }

    #[test]
    fn json_is_strict_and_unproven_jobs_are_named() {
        let (mut s, key) = two_leaf_ledger();
        let good = prove(&s, &crate::testing::test_job(1)).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&good.to_json()).unwrap();
        v["extra"] = 1.into();
        assert!(matches!(ProofBundle::from_json(v.to_string().as_bytes()), Err(BundleError::Json(_))));
        assert!(matches!(ProofBundle::from_json(b"{}"), Err(BundleError::Json(_))));
        assert!(matches!(prove(&s, &crate::testing::test_job(0xff)), Err(BundleError::UnknownJob(_))));
        let req = AppendRequest { leaf: b"receipt-2".to_vec(), fields: sample_fields(2), attestation_document: b"d".to_vec() };
        s.append(&[req], &key, &CheckpointPolicy { every_appends: 2, every_ms: u64::MAX }, 2).unwrap();
        assert!(matches!(
            prove(&s, &crate::testing::test_job(2)),
            Err(BundleError::NotCheckpointed { index: 2, latest: 2 })
        ));
    }
}
