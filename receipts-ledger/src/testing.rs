//! Helpers for tests and benchmarks only: a stand-in receipt format and check
//! ([`TestReceipts`]: a JSON object carrying the indexed fields, the attestation
//! document's SHA-256 and padding to a chosen size — not the protocol's receipt),
//! and [`dev_request`], an append request of the protocol's development enclave.

use protocol::dev_enclave::DevEnclave;
use protocol::receipt::ReceiptError;
use protocol::receipt_check::ReceiptCheckError;

use crate::entry::{attestation_sha256, AppendRequest, IndexedFields, LeafClaims, LeafReader, ReceiptCheck, ReceiptRefusal};

/// Accepts leaves made by [`test_request`] whose attestation hash matches.
pub struct TestReceipts;

#[derive(serde::Serialize, serde::Deserialize)]
struct TestLeaf {
    fields: IndexedFields,
    attestation_sha256: String,
    pad: String,
}

impl ReceiptCheck for TestReceipts {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, ReceiptRefusal> {
        let l: TestLeaf = serde_json::from_slice(leaf)
            .map_err(|_| ReceiptCheckError::Receipt(ReceiptError::Invalid("not a test receipt")))?;
        let given = hex::encode(attestation_sha256(attestation_document));
        if l.attestation_sha256 != given {
            return Err(ReceiptCheckError::AttestationHash { named: l.attestation_sha256, given }.into());
        }
        Ok(l.fields)
    }
}

impl LeafReader for TestReceipts {
    fn read(&self, leaf: &[u8]) -> Result<LeafClaims, String> {
        let l: TestLeaf = serde_json::from_slice(leaf).map_err(|e| format!("not a test receipt: {e}"))?;
        let attestation_sha256 = hex::decode(&l.attestation_sha256)
            .ok()
            .and_then(|h| h.try_into().ok())
            .ok_or("test receipt: attestation_sha256 is not 32 bytes of hex")?;
        Ok(LeafClaims { fields: l.fields, attestation_sha256 })
    }
}

/// The id of test job `job`, as the development enclave numbers jobs.
pub use protocol::dev_enclave::job_id as test_job;

/// Fields for test job `job`.
pub fn test_fields(job: u64) -> IndexedFields {
    IndexedFields {
        kind: crate::EntryKind::Job,
        job_id: test_job(job),
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: "ab".repeat(32),
        pcr0: "cd".repeat(48),
        client_key_id: "ef".repeat(8),
        start_ms: 1_700_000_000_000 + job * 1000,
        end_ms: 1_700_000_000_500 + job * 1000,
        ok_count: 1000 + job % 7,
        failed_count: job % 3,
        policy: None,
    }
}

/// A request for test job `job` with a leaf of about `leaf_size` bytes; one
/// of four attestation documents (~4.5 KB, like a real NSM document).
pub fn test_request(job: u64, leaf_size: usize) -> AppendRequest {
    let attestation_document = format!("attestation document {}", job % 4).repeat(200).into_bytes();
    let mut l = TestLeaf {
        fields: test_fields(job),
        attestation_sha256: hex::encode(attestation_sha256(&attestation_document)),
        pad: String::new(),
    };
    let base = serde_json::to_vec(&l).expect("serialisable").len();
    l.pad = "x".repeat(leaf_size.saturating_sub(base));
    AppendRequest { leaf: serde_json::to_vec(&l).expect("serialisable"), fields: l.fields.clone(), attestation_document }
}

/// The append request for test job `job` of `enclave`: its signed receipt, the fields it
/// carries, and the document it names.
pub fn dev_request(enclave: &DevEnclave, job: u64) -> AppendRequest {
    let receipt = enclave.receipt(job);
    AppendRequest {
        leaf: enclave.sign(&receipt),
        fields: crate::receipt_check::indexed_fields(&receipt),
        attestation_document: enclave.document.clone(),
    }
}
