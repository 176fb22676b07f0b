//! Ledger entries: the append request, the indexed fields, the receipt check
//! hook, and the entry hash chain.
//!
//! ```text
//! entry_hash[i] = SHA-256( "ephem-batch/ledger/entry/v1" || 0x00
//!                          || u64be(i)
//!                          || entry_hash[i-1]            (32 zero bytes for i = 0)
//!                          || SHA-256(0x00 || leaf[i])    (the RFC 9162 leaf hash)
//!                          || SHA-256(attestation_document[i]) )
//! ```

use protocol::JobId;
use protocol::receipt_check::ReceiptCheckError;

use crate::merkle::{leaf_hash, Hash};
use sha2::{Digest, Sha256};

/// Domain label of the entry hash (28 bytes, NUL included).
pub const ENTRY_HASH_LABEL: &[u8; 28] = b"ephem-batch/ledger/entry/v1\0";
/// The `prev_hash` of entry 0.
pub const GENESIS_PREV_HASH: Hash = [0; 32];
/// Largest receipt (leaf) accepted.
pub const MAX_LEAF_SIZE: usize = 1 << 20;
/// Largest attestation document accepted.
pub const MAX_ATTESTATION_SIZE: usize = 1 << 20;
/// Longest text field (model id) accepted, in bytes.
pub const MAX_TEXT_FIELD: usize = 256;
/// Longest hex field accepted, in hex digits.
pub const MAX_HEX_FIELD: usize = 256;

/// The chain hash of entry `index`.
pub fn entry_hash(index: u64, prev_hash: &Hash, leaf_hash: &Hash, attestation_sha256: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update(ENTRY_HASH_LABEL);
    h.update(index.to_be_bytes());
    h.update(prev_hash);
    h.update(leaf_hash);
    h.update(attestation_sha256);
    h.finalize().into()
}

/// SHA-256 of an attestation document: its key in the document table.
pub fn attestation_sha256(document: &[u8]) -> Hash {
    Sha256::digest(document).into()
}

/// What a leaf is: a job's receipt, or a usage receipt of online requests (docs/protocol.md
/// §9.5), read from the leaf's own content type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    #[default]
    Job,
    Usage,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Usage => "usage",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "job" => Some(Self::Job),
            "usage" => Some(Self::Usage),
            _ => None,
        }
    }

    pub fn is_job(&self) -> bool {
        *self == Self::Job
    }
}

/// The receipt fields the ledger indexes for compliance queries. Hex fields
/// are lowercase; times are Unix milliseconds.
///
/// `policy` is not the receipt's: it is the id (hex SHA-256 of the signed bytes) of the
/// publisher-signed policy the appender found the receipt's document to satisfy, `None` for a
/// check without an allow-list (and rows appended before there was one). The chain does not
/// cover it, and [`IndexedFields::first_difference`] leaves it out: an auditor's check may hold
/// other policies or none.
///
/// A usage receipt fills the same fields (§9.5): `job_id` is its usage id, `client_key_id` the
/// client label, `start_ms`/`end_ms` its period, `ok_count` the inputs embedded, `failed_count` 0.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexedFields {
    /// Absent in records written before usage receipts: those are all jobs.
    #[serde(default, skip_serializing_if = "EntryKind::is_job")]
    pub kind: EntryKind,
    pub job_id: JobId,
    pub model_id: String,
    pub manifest_hash: String,
    pub pcr0: String,
    pub client_key_id: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub ok_count: u64,
    pub failed_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Which indexed field is wrong, and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("field {field} is empty")]
    Empty { field: &'static str },
    #[error("field {field} is longer than {max} bytes")]
    TooLong { field: &'static str, max: usize },
    #[error("field {field} is not an even number of lowercase hex digits")]
    NotLowerHex { field: &'static str },
    #[error("field {field} contains a control character")]
    ControlCharacter { field: &'static str },
    #[error("field {field} is above {max}")]
    TooBig { field: &'static str, max: u64 },
    #[error("start_ms {start} is after end_ms {end}")]
    TimesReversed { start: u64, end: u64 },
    #[error("field {field} is not a SHA-256 (64 hex digits)")]
    NotSha256 { field: &'static str },
}

fn check_hex(field: &'static str, v: &str) -> Result<(), FieldError> {
    if v.is_empty() {
        return Err(FieldError::Empty { field });
    }
    if v.len() > MAX_HEX_FIELD {
        return Err(FieldError::TooLong { field, max: MAX_HEX_FIELD });
    }
    if !v.len().is_multiple_of(2) || !v.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(FieldError::NotLowerHex { field });
    }
    Ok(())
}

fn check_int(field: &'static str, v: u64) -> Result<(), FieldError> {
    // Stored as SQLite INTEGER (i64).
    if v > i64::MAX as u64 {
        return Err(FieldError::TooBig { field, max: i64::MAX as u64 });
    }
    Ok(())
}

impl IndexedFields {
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.model_id.is_empty() {
            return Err(FieldError::Empty { field: "model_id" });
        }
        if self.model_id.len() > MAX_TEXT_FIELD {
            return Err(FieldError::TooLong { field: "model_id", max: MAX_TEXT_FIELD });
        }
        if self.model_id.chars().any(char::is_control) {
            return Err(FieldError::ControlCharacter { field: "model_id" });
        }
        check_hex("manifest_hash", &self.manifest_hash)?;
        check_hex("pcr0", &self.pcr0)?;
        check_hex("client_key_id", &self.client_key_id)?;
        check_int("start_ms", self.start_ms)?;
        check_int("end_ms", self.end_ms)?;
        check_int("ok_count", self.ok_count)?;
        check_int("failed_count", self.failed_count)?;
        if self.start_ms > self.end_ms {
            return Err(FieldError::TimesReversed { start: self.start_ms, end: self.end_ms });
        }
        if let Some(policy) = &self.policy {
            check_hex("policy", policy)?;
            if policy.len() != 64 {
                return Err(FieldError::NotSha256 { field: "policy" });
            }
        }
        Ok(())
    }

    /// The name of the first receipt field that differs from `other` (`policy` is not one).
    pub fn first_difference(&self, other: &Self) -> Option<&'static str> {
        let pairs: [(&'static str, bool); 10] = [
            ("kind", self.kind == other.kind),
            ("job_id", self.job_id == other.job_id),
            ("model_id", self.model_id == other.model_id),
            ("manifest_hash", self.manifest_hash == other.manifest_hash),
            ("pcr0", self.pcr0 == other.pcr0),
            ("client_key_id", self.client_key_id == other.client_key_id),
            ("start_ms", self.start_ms == other.start_ms),
            ("end_ms", self.end_ms == other.end_ms),
            ("ok_count", self.ok_count == other.ok_count),
            ("failed_count", self.failed_count == other.failed_count),
        ];
        pairs.iter().find(|(_, same)| !same).map(|(name, _)| *name)
    }
}

/// What a caller appends: the receipt's exact COSE_Sign1 bytes (the Merkle
/// leaf), the fields it claims the receipt carries, and the attestation
/// document the receipt names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    pub leaf: Vec<u8>,
    pub fields: IndexedFields,
    pub attestation_document: Vec<u8>,
}

/// Why the ledger refused a receipt. `Display` is `"<check>: <reason>"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptRefusal {
    /// One of the protocol's checks (`receipt`, `attestation`, `policy`, …) failed.
    #[error(transparent)]
    Receipt(#[from] ReceiptCheckError),
    /// The receipt verified, but a value the ledger indexes is out of its limits.
    #[error("fields: {0}")]
    Fields(FieldError),
    /// A ledger handle opened without a receipt check (to sign checkpoints only).
    #[error("receipt_check: this ledger handle does not append")]
    NotAppending,
}

impl ReceiptRefusal {
    /// The name of the failed check (`receipt_signature`, `policy`, `fields`, …).
    pub fn check(&self) -> &'static str {
        match self {
            Self::Receipt(e) => e.check(),
            Self::Fields(_) => "fields",
            Self::NotAppending => "receipt_check",
        }
    }

    /// Refused by the allow-list: the image is genuine but not (yet) one the publisher signed
    /// for, which an operator may fix by allowing it.
    pub fn is_policy(&self) -> bool {
        matches!(self, Self::Receipt(ReceiptCheckError::Policy { .. }))
    }
}

/// Reports carry the refusal as its text (`"<check>: <reason>"`).
impl serde::Serialize for ReceiptRefusal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Verifies a receipt and its attestation binding, and returns the fields
/// the receipt really carries. The real implementation (protocol::receipt)
/// plugs in here; the ledger refuses a request whose claimed fields differ.
pub trait ReceiptCheck: Send + Sync {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, ReceiptRefusal>;
}

/// What a leaf states about itself, read from its bytes alone: the fields the ledger indexes
/// (`policy` is never the leaf's) and the attestation document it names. No signature is
/// checked — that is [`ReceiptCheck`]'s — but a leaf under a signed tree root is bound by the
/// root, so whatever is read from it is bound too. A copy of the ledger rebuilt from elsewhere
/// (the tlog-tiles metadata) takes these values from the leaf, never from the copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafClaims {
    pub fields: IndexedFields,
    pub attestation_sha256: Hash,
}

/// Reads [`LeafClaims`] from a leaf (the protocol's receipts: `receipt_check::ProtocolLeaves`).
pub trait LeafReader: Send + Sync {
    fn read(&self, leaf: &[u8]) -> Result<LeafClaims, String>;
}

/// One check (and its document cache) shared by an appender and its ledger.
impl<T: ReceiptCheck + ?Sized> ReceiptCheck for std::sync::Arc<T> {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, ReceiptRefusal> {
        (**self).check(leaf, attestation_document)
    }
}

/// A stored entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub leaf: Vec<u8>,
    pub fields: IndexedFields,
    pub attestation_sha256: Hash,
    pub prev_hash: Hash,
    pub entry_hash: Hash,
    pub appended_ms: u64,
}

impl Entry {
    /// The RFC 9162 leaf hash of the receipt.
    pub fn leaf_hash(&self) -> Hash {
        leaf_hash(&self.leaf)
    }

    /// The entry hash recomputed from this row's own content.
    pub fn recompute_hash(&self) -> Hash {
        entry_hash(self.index, &self.prev_hash, &self.leaf_hash(), &self.attestation_sha256)
    }
}

#[cfg(test)]
pub(crate) fn sample_fields(job: u64) -> IndexedFields {
    IndexedFields {
        kind: EntryKind::Job,
        job_id: protocol::dev_enclave::job_id(job),
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: "ab".repeat(32),
        pcr0: "cd".repeat(48),
        client_key_id: "ef".repeat(8),
        start_ms: 1_700_000_000_000 + job,
        end_ms: 1_700_000_000_500 + job,
        ok_count: 100,
        failed_count: 1,
        policy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known answer, also in docs/protocol.md §8 (cross-checked with Python hashlib).
    #[test]
    fn entry_hash_known_answer() {
        let leaf = b"receipt-0";
        let att = b"attestation-document";
        let h0 = entry_hash(0, &GENESIS_PREV_HASH, &leaf_hash(leaf), &attestation_sha256(att));
        assert_eq!(hex::encode(h0), "5cb035092484923d3f6dbefd8085126334ff093b7a01ee7467cdd56af710dcec");
        let h1 = entry_hash(1, &h0, &leaf_hash(b"receipt-1"), &attestation_sha256(att));
        assert_eq!(hex::encode(h1), "58f61ce48ee7186df2c9996c84a8ddb451661e21d423272e64c3ecf6244b501f");
    }

    #[test]
    fn label_is_28_bytes_with_nul() {
        assert_eq!(ENTRY_HASH_LABEL.len(), 28);
        assert_eq!(ENTRY_HASH_LABEL[27], 0);
    }

    #[test]
    fn field_validation_names_the_field() {
        let ok = sample_fields(1);
        ok.validate().unwrap();
        // A job id that is not 32 lowercase hex digits does not even decode (a tiles metadata
        // record, a query's filter): the type holds only valid ones.
        let mut json = serde_json::to_value(&ok).unwrap();
        json["job_id"] = "ABCD".into();
        assert!(serde_json::from_value::<IndexedFields>(json).is_err());
        let mut f = ok.clone();
        f.pcr0 = "abc".into();
        assert_eq!(f.validate(), Err(FieldError::NotLowerHex { field: "pcr0" }));
        let mut f = ok.clone();
        f.model_id = String::new();
        assert_eq!(f.validate(), Err(FieldError::Empty { field: "model_id" }));
        let mut f = ok.clone();
        f.model_id = "a\nb".into();
        assert_eq!(f.validate(), Err(FieldError::ControlCharacter { field: "model_id" }));
        let mut f = ok.clone();
        f.ok_count = u64::MAX;
        assert_eq!(f.validate(), Err(FieldError::TooBig { field: "ok_count", max: i64::MAX as u64 }));
        let mut f = ok.clone();
        f.start_ms = f.end_ms + 1;
        assert!(matches!(f.validate(), Err(FieldError::TimesReversed { .. })));
        let mut f = ok.clone();
        f.failed_count = 9;
        assert_eq!(ok.first_difference(&f), Some("failed_count"));
        assert_eq!(ok.first_difference(&ok), None);
        let mut f = ok.clone();
        f.kind = EntryKind::Usage;
        assert_eq!(ok.first_difference(&f), Some("kind"));
        // A record without a kind is a job's; a job's is written without one.
        let json = serde_json::to_value(&ok).unwrap();
        assert!(json.get("kind").is_none());
        assert_eq!(serde_json::to_value(&f).unwrap()["kind"], "usage");
        let mut f = ok.clone();
        f.policy = Some("ab".repeat(32));
        f.validate().unwrap();
        assert_eq!(ok.first_difference(&f), None, "the policy is the appender's, not the receipt's");
        f.policy = Some("ab".repeat(16));
        assert_eq!(f.validate(), Err(FieldError::NotSha256 { field: "policy" }));
        f.policy = Some("AB".repeat(32));
        assert_eq!(f.validate(), Err(FieldError::NotLowerHex { field: "policy" }));
    }
}
