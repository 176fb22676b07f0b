//! Offline proof bundles: everything an auditor needs to check that a
//! receipt is in the ledger, verified against a ledger key the auditor pins.
//!
//! JSON (all byte strings lowercase hex):
//! `{"version":1, "receipt", "attestation_document", "leaf_index", "tree_size",
//!   "inclusion_path":[…], "checkpoint", "ledger_key"}`.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::entry::{IndexedFields, ReceiptCheck};
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
    ReceiptRejected(String),
    #[error("job {0} is not in the ledger")]
    UnknownJob(String),
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
pub fn prove(store: &dyn LedgerStore, job_id: &str) -> Result<ProofBundle, BundleError> {
    let entry = store.entry_by_job(job_id)?.ok_or_else(|| BundleError::UnknownJob(job_id.to_owned()))?;
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
