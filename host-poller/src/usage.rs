//! Usage receipts of online requests, which the enclave sends unasked on the control channel
//! (docs/protocol.md §9.5). Delivering them to the ledger comes later; for now the host counts
//! them and logs their sizes — a receipt is signed and public, but a host has no reason to parse it.

use std::sync::atomic::{AtomicU64, Ordering};

static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// One receipt and the attestation document that vouches for its signing key.
pub(crate) fn received(receipt: &[u8], attestation_document: &[u8]) {
    let count = RECEIVED.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::info!(receipt_bytes = receipt.len(), document_bytes = attestation_document.len(), count, "usage receipt from the worker");
}

/// Receipts received since the process started.
pub fn received_count() -> u64 {
    RECEIVED.load(Ordering::Relaxed)
}
