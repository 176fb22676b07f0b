//! The ledger's receipt check: the protocol's ([`ReceiptVerifier`], checks 1–7 of
//! `protocol::receipt_check`) and the ledger's own eighth, `fields`: the values it indexes fit
//! its limits. The ledger checks each receipt once (`Ledger::check`), and the check's typed
//! refusal is what its errors carry.

use protocol::receipt::{Receipt, SignedReceipt};
use protocol::receipt_check::{ReceiptVerifier, VerifiedReceipt};

use crate::entry::{AppendRequest, IndexedFields, LeafClaims, LeafReader, ReceiptCheck, ReceiptRefusal};

impl ReceiptCheck for ReceiptVerifier {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, ReceiptRefusal> {
        receipt_fields(&self.verify(leaf, attestation_document)?)
    }
}

/// Check 8, `fields`: what the ledger indexes for a verified receipt, with the policy its check
/// found.
pub fn receipt_fields(verified: &VerifiedReceipt) -> Result<IndexedFields, ReceiptRefusal> {
    let mut fields = indexed_fields(&verified.receipt);
    fields.policy = verified.policy.map(hex::encode);
    fields.validate().map_err(ReceiptRefusal::Fields)?;
    Ok(fields)
}

/// A checked append request for `leaf` (the fields are the receipt's own).
pub fn append_request(
    check: &ReceiptVerifier,
    leaf: Vec<u8>,
    attestation_document: Vec<u8>,
) -> Result<AppendRequest, ReceiptRefusal> {
    let fields = check.check(&leaf, &attestation_document)?;
    Ok(AppendRequest { leaf, fields, attestation_document })
}

/// [`LeafReader`] over protocol receipts: the fields and the document a receipt states, decoded
/// strictly (check 1), its signature not checked.
pub struct ProtocolLeaves;

impl LeafReader for ProtocolLeaves {
    fn read(&self, leaf: &[u8]) -> Result<LeafClaims, String> {
        let receipt = SignedReceipt::decode(leaf).map_err(|e| e.to_string())?.receipt;
        Ok(LeafClaims { fields: indexed_fields(&receipt), attestation_sha256: receipt.attestation_sha256 })
    }
}

/// The fields the ledger indexes, as `receipt` states them (lowercase hex).
pub fn indexed_fields(receipt: &Receipt) -> IndexedFields {
    IndexedFields {
        job_id: receipt.job_id,
        model_id: receipt.model_id.clone(),
        manifest_hash: hex::encode(receipt.manifest_hash),
        pcr0: receipt.pcrs.get(&0).map(hex::encode).unwrap_or_default(),
        client_key_id: hex::encode(receipt.result_key_id),
        start_ms: receipt.started_ms,
        end_ms: receipt.finished_ms,
        ok_count: receipt.records_ok,
        failed_count: receipt.records_failed,
        policy: None,
    }
}

#[cfg(test)]
mod tests;
