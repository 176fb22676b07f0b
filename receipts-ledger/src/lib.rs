#![forbid(unsafe_code)]
//! The append-only receipts ledger: a hash chain of receipts that is also an
//! RFC 9162 Merkle tree, C2SP signed checkpoints, inclusion and consistency
//! proofs, offline proof bundles, full replay verification, and compliance
//! queries over SQLite; in AWS, the same ledger in an object store in the C2SP
//! tlog-tiles layout ([`store::tiles`]).

pub mod bundle;
pub mod checkpoint;
pub mod cosignature;
pub mod entry;
pub mod ledger;
pub mod local;
pub mod merkle;
pub mod note;
pub mod receipt_check;
pub mod scitt;
pub mod store;
pub mod testing;
pub mod verify;
pub mod witness_client;

pub use bundle::{prove, verify_bundle, verify_bundle_and_receipt, BundleError, ProofBundle, VerifiedBundle};
pub use checkpoint::{Checkpoint, CheckpointError};
pub use cosignature::{CosignatureError, CosignerKey, CosignerSigner, WitnessPolicy, WitnessPolicyError};
pub use entry::{AppendRequest, Entry, EntryKind, FieldError, IndexedFields, LeafClaims, LeafReader, ReceiptCheck, ReceiptRefusal};
pub use ledger::{consistency, CheckedReceipt, Ledger, LedgerError};
pub use local::{LocalError, LocalLedger};
pub use note::{NoteError, NoteSigner, RemoteSigner, SignerKey, VerifierKey};
pub use receipt_check::{append_request, receipt_fields, ProtocolLeaves};
pub use store::{
    AppendOutcome, CheckpointPolicy, LedgerStore, Query, SqliteOptions, SqliteStore, StoreError, StoredCheckpoint,
};
pub use store::{TileError, TileStore};
pub use witness_client::{CosignReport, WitnessClient, WitnessClientError, WitnessEndpoint};
pub use verify::{verify_entry, verify_ledger, EntryVerdict, Issue, VerifyReport};
