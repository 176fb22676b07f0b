#![allow(dead_code)]
//! Shared helpers for the integration tests.

use receipts_ledger::testing::TestReceipts;
use receipts_ledger::{CheckpointPolicy, Ledger, SignerKey, SqliteOptions, SqliteStore, VerifierKey};
use std::path::Path;

pub const ORIGIN: &str = "ledger.ephem-batch.example/test";

pub fn signer() -> SignerKey {
    SignerKey::from_seed(ORIGIN, &[0x42; 32]).unwrap()
}

pub fn pinned() -> VerifierKey {
    signer().verifier()
}

pub fn open_ledger(path: &Path, policy: CheckpointPolicy) -> Ledger<SqliteStore> {
    let store = SqliteStore::open(path, &SqliteOptions::default()).unwrap();
    Ledger::new(store, Box::new(TestReceipts), Box::new(signer()), policy)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}
