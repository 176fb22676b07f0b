//! The ledger's receipt check: the protocol's ([`ReceiptVerifier`], checks 1–7 of
//! `protocol::receipt_check`) and the ledger's own eighth, `fields`: the values it indexes fit
//! its limits. The ledger checks each receipt once (`Ledger::check`), and the check's typed
//! refusal is what its errors carry.
//!
//! A leaf is a job receipt or a usage receipt (docs/protocol.md §9.5), told apart by the content
//! type it declares; each then passes its own strict decoding and the same checks 2–7.

use protocol::receipt::{Receipt, SignedReceipt};
use protocol::receipt_check::{ReceiptVerifier, VerifiedReceipt, VerifiedUsage};
use protocol::usage::{is_usage_receipt, SignedUsageReceipt, UsageReceipt};
use protocol::JobId;

use crate::entry::{AppendRequest, EntryKind, IndexedFields, LeafClaims, LeafReader, ReceiptCheck, ReceiptRefusal};

impl ReceiptCheck for ReceiptVerifier {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, ReceiptRefusal> {
        if is_usage_receipt(leaf) {
            return usage_fields(&self.verify_usage(leaf, attestation_document)?);
        }
        receipt_fields(&self.verify(leaf, attestation_document)?)
    }
}

/// Check 8 for a verified usage receipt.
pub fn usage_fields(verified: &VerifiedUsage) -> Result<IndexedFields, ReceiptRefusal> {
    let mut fields = indexed_usage_fields(verified.usage_id, &verified.usage);
    fields.policy = verified.policy.map(hex::encode);
    fields.validate().map_err(ReceiptRefusal::Fields)?;
    Ok(fields)
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
        if is_usage_receipt(leaf) {
            let signed = SignedUsageReceipt::decode(leaf).map_err(|e| e.to_string())?;
            let fields = indexed_usage_fields(JobId(signed.usage_id()), &signed.receipt);
            return Ok(LeafClaims { fields, attestation_sha256: signed.receipt.attestation_sha256 });
        }
        let receipt = SignedReceipt::decode(leaf).map_err(|e| e.to_string())?.receipt;
        Ok(LeafClaims { fields: indexed_fields(&receipt), attestation_sha256: receipt.attestation_sha256 })
    }
}

/// The fields the ledger indexes, as `receipt` states them (lowercase hex).
pub fn indexed_fields(receipt: &Receipt) -> IndexedFields {
    IndexedFields {
        kind: EntryKind::Job,
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

/// The fields a usage receipt fills (§9.5): its usage id for the job id, the client label for the
/// client key id, its period, and the inputs it embedded as `ok_count`.
pub fn indexed_usage_fields(usage_id: JobId, usage: &UsageReceipt) -> IndexedFields {
    IndexedFields {
        kind: EntryKind::Usage,
        job_id: usage_id,
        model_id: usage.model_id.clone(),
        manifest_hash: hex::encode(usage.manifest_hash),
        pcr0: usage.pcrs.get(&0).map(hex::encode).unwrap_or_default(),
        client_key_id: usage.client.to_hex(),
        start_ms: usage.period_start_ms,
        end_ms: usage.period_end_ms,
        ok_count: usage.inputs,
        failed_count: 0,
        policy: None,
    }
}

#[cfg(test)]
mod tests;
