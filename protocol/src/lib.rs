#![forbid(unsafe_code)]
//! ephem-batch formats and cryptography: pure functions, no I/O.

pub mod attestation;
pub mod keys;
