#![forbid(unsafe_code)]
//! Everything that runs inside the Nitro enclave: NSM access, key release, model loading, inference, sealing results, signing receipts.
pub mod inference;
