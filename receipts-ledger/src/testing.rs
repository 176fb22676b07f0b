//! A stand-in receipt format and check for tests and benchmarks only (it is
//! not the protocol's receipt): a JSON object carrying the indexed fields, the
//! attestation document's SHA-256 and padding to a chosen size.

use crate::entry::{attestation_sha256, AppendRequest, IndexedFields, ReceiptCheck};

/// Accepts leaves made by [`test_request`] whose attestation hash matches.
pub struct TestReceipts;

#[derive(serde::Serialize, serde::Deserialize)]
struct TestLeaf {
    fields: IndexedFields,
    attestation_sha256: String,
    pad: String,
}

impl ReceiptCheck for TestReceipts {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, String> {
        let l: TestLeaf = serde_json::from_slice(leaf).map_err(|e| format!("not a test receipt: {e}"))?;
        if l.attestation_sha256 != hex::encode(attestation_sha256(attestation_document)) {
            return Err("receipt names another attestation document".into());
        }
        Ok(l.fields)
    }
}

/// Fields for test job `job`.
pub fn test_fields(job: u64) -> IndexedFields {
    IndexedFields {
        job_id: format!("{job:032x}"),
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: "ab".repeat(32),
        pcr0: "cd".repeat(48),
        client_key_id: "ef".repeat(8),
        start_ms: 1_700_000_000_000 + job * 1000,
        end_ms: 1_700_000_000_500 + job * 1000,
        ok_count: 1000 + job % 7,
        failed_count: job % 3,
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
