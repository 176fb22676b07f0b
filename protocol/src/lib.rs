#![forbid(unsafe_code)]
//! ephem-batch formats and cryptography: pure functions, no I/O.
//!
//! Every format here is specified in `docs/protocol.md`, whose known-answer vectors are checked
//! by this crate's tests.

pub mod attestation;
pub mod cancel;
pub mod cbor;
pub mod cms;
pub mod cose;
#[cfg(feature = "dev-issuer")]
pub mod dev_enclave;
pub mod envelope;
pub mod failed_check;
pub mod fleet;
pub mod frame;
pub mod key_checks;
pub mod keys;
pub mod kms_api;
pub mod kms_arn;
pub mod manifest;
pub mod ohttp;
pub mod online;
pub mod quantize;
pub mod receipt;
pub mod receipt_check;
pub mod record_tree;
pub mod records;
pub mod stream;
pub mod usage;

pub use envelope::JobId;
pub use failed_check::FailedCheck;
