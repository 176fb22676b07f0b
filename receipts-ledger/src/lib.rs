#![forbid(unsafe_code)]
//! The append-only receipts ledger: storage, hash chain, RFC 9162 Merkle
//! tree, signed checkpoints, proofs, compliance queries.

pub mod merkle;
pub mod note;
pub mod checkpoint;
pub mod entry;
pub mod store;
