//! Storage of entries, attestation documents, tree nodes and checkpoints
//! behind one trait; SQLite is the embedded implementation.

mod sqlite;
pub mod tiles;

pub use sqlite::{ImportedEntry, Pending, SqliteOptions, SqliteStore};
pub use tiles::{TileError, TileStore};

use protocol::JobId;
use crate::checkpoint::CheckpointError;
use crate::entry::{AppendRequest, Entry, EntryKind, FieldError};
use crate::merkle::{Hash, TreeReadError, TreeReader};
use crate::note::NoteSigner;

/// When to sign a new checkpoint: after `every_appends` new entries, or when
/// `every_ms` have passed since the last checkpoint (or since the first entry,
/// before any checkpoint) and there is at least one new entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    pub every_appends: u64,
    pub every_ms: u64,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self { every_appends: 256, every_ms: 10_000 }
    }
}

impl CheckpointPolicy {
    /// Whether a tree of `size` leaves needs a checkpoint now. `last` is the
    /// latest checkpoint's (size, created_ms); `first_append_ms` the time the
    /// first entry was appended.
    pub fn due(&self, size: u64, last: Option<(u64, u64)>, first_append_ms: u64, now_ms: u64) -> bool {
        let (last_size, since_ms) = last.unwrap_or((0, first_append_ms));
        size > last_size && (size - last_size >= self.every_appends || now_ms.saturating_sub(since_ms) >= self.every_ms)
    }
}

/// A signed checkpoint as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub size: u64,
    pub root: Hash,
    /// The full signed note text.
    pub note: String,
    pub created_ms: u64,
}

/// What an append did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// A new entry at `index`; `checkpoint` is the size of the checkpoint
    /// signed in the same transaction, if one was.
    Appended { index: u64, entry_hash: Hash, checkpoint: Option<u64> },
    /// The job was already in the ledger: nothing changed. `same_leaf` tells
    /// whether the stored receipt is byte-identical to the one offered.
    Existing { index: u64, same_leaf: bool },
}

impl AppendOutcome {
    pub fn index(&self) -> u64 {
        match self {
            Self::Appended { index, .. } | Self::Existing { index, .. } => *index,
        }
    }
}

/// Compliance query; every given filter must match. Times filter `end_ms`
/// in `[since_ms, until_ms)`. Results in index order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pub job_id: Option<JobId>,
    pub model_id: Option<String>,
    pub pcr0: Option<String>,
    pub client_key_id: Option<String>,
    /// Jobs only, or online usage only (`ledger query --online`).
    pub kind: Option<EntryKind>,
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
    pub limit: Option<u64>,
}

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{table} row {index}: {what}")]
    CorruptRow { table: &'static str, index: i64, what: &'static str },
    #[error(transparent)]
    Tree(#[from] TreeReadError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error("{what} is {size} bytes, more than {max}")]
    TooLarge { what: &'static str, size: usize, max: usize },
    #[error("{what} {value} does not fit in an SQLite integer")]
    IntegerRange { what: &'static str, value: u64 },
    #[error("ledger is signed by {stored}, not by the given key {given}")]
    KeyMismatch { stored: String, given: String },
    #[error("database refused WAL journal mode (got {mode:?}); is it on a network file system?")]
    NotWal { mode: String },
    #[error("ledger schema version {found:?} is not supported (want {want})")]
    SchemaVersion { found: String, want: &'static str },
    #[error("import starts at entry {start}, but the ledger has {size} entries")]
    ImportGap { size: u64, start: u64 },
    #[error("imported entry {index}: the {what} differs from the rebuilt ledger's")]
    ImportMismatch { index: u64, what: &'static str },
    #[error(transparent)]
    Tiles(#[from] Box<TileError>),
    #[error("the note offered for checkpoint {size} is not the stored one with signature lines added")]
    NotSameCheckpoint { size: u64 },
}

/// The ledger's storage. Every `append` is one atomic, serialised write
/// transaction: either all of a batch (entries, tree nodes, a checkpoint)
/// is stored or none of it.
pub trait LedgerStore: TreeReader {
    /// Appends each request not already present by job id, extends the
    /// chain and the tree, and signs a checkpoint if `policy` says one is due.
    /// Requests must already be validated and checked (see [`crate::Ledger`]).
    fn append(
        &mut self,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        policy: &CheckpointPolicy,
        now_ms: u64,
    ) -> Result<Vec<AppendOutcome>, StoreError>;

    /// Signs a checkpoint if one is due (or, with `force`, whenever the tree
    /// grew since the last one).
    fn checkpoint(
        &mut self,
        signer: &dyn NoteSigner,
        policy: &CheckpointPolicy,
        now_ms: u64,
        force: bool,
    ) -> Result<Option<StoredCheckpoint>, StoreError>;

    /// Number of entries (= tree size).
    fn size(&self) -> Result<u64, StoreError>;
    fn entry(&self, index: u64) -> Result<Option<Entry>, StoreError>;
    fn entry_by_job(&self, job_id: &JobId) -> Result<Option<Entry>, StoreError>;
    fn attestation_document(&self, sha256: &Hash) -> Result<Option<Vec<u8>>, StoreError>;
    /// All checkpoints, by increasing size.
    fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, StoreError>;
    fn latest_checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError>;
    fn checkpoint_at(&self, size: u64) -> Result<Option<StoredCheckpoint>, StoreError>;
    /// The verifier key string recorded by the first append (informative:
    /// verification always takes a pinned key).
    fn ledger_key(&self) -> Result<Option<String>, StoreError>;
    fn query(&self, query: &Query) -> Result<Vec<Entry>, StoreError>;
    /// Visits every entry row in storage order (by stored index); a row that
    /// cannot be decoded is passed as an error. Stops when `f` returns false.
    fn scan_entries(&self, f: &mut dyn FnMut(Result<Entry, StoreError>) -> bool) -> Result<(), StoreError>;
    /// Number of stored tree nodes.
    fn tree_node_count(&self) -> Result<u64, StoreError>;
    /// Starts one read transaction: until the returned guard drops, every read through this
    /// store sees the ledger as it was at one moment, whatever commits meanwhile. A reader
    /// that checks entries, nodes and checkpoints against one another takes one, else an
    /// append between two of its reads looks like corruption. Inside another snapshot, the
    /// outer one holds.
    fn read_snapshot(&self) -> Result<ReadSnapshot<'_>, StoreError>;
    /// Replaces the note of the checkpoint of `size` with `note`: the same checkpoint text with
    /// every stored signature line, and only lines added (witness cosignatures), or
    /// [`StoreError::NotSameCheckpoint`]. Nothing signed can change this way.
    fn add_cosignatures(&self, size: u64, note: &str) -> Result<(), StoreError>;
}

/// One read transaction on a store's connection, ended when dropped (see
/// [`LedgerStore::read_snapshot`]). Holds no lock against writers: SQLite's WAL keeps the
/// snapshot's pages readable while appends commit.
#[must_use = "the snapshot ends when this guard is dropped"]
pub struct ReadSnapshot<'a> {
    /// `None` when nested in a transaction already open on the connection.
    conn: Option<&'a rusqlite::Connection>,
}

impl<'a> ReadSnapshot<'a> {
    /// Begins a read transaction on `conn` and takes its snapshot now (SQLite takes it at the
    /// first read, not at `BEGIN`).
    pub(crate) fn begin(conn: &'a rusqlite::Connection) -> Result<Self, StoreError> {
        if !conn.is_autocommit() {
            return Ok(Self { conn: None });
        }
        conn.execute_batch("BEGIN DEFERRED")?;
        let guard = Self { conn: Some(conn) };
        conn.query_row("SELECT count(*) FROM meta", [], |_| Ok(()))?;
        Ok(guard)
    }
}

impl Drop for ReadSnapshot<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn {
            // A read transaction has nothing to lose: ending it cannot fail in a way that matters.
            let _ = conn.execute_batch("COMMIT");
        }
    }
}

/// Number of complete subtrees of a tree of `size` leaves.
pub fn expected_tree_nodes(size: u64) -> u64 {
    (0..64).map(|l| size >> l).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_due() {
        let p = CheckpointPolicy { every_appends: 10, every_ms: 1000 };
        assert!(!p.due(0, None, 0, 5000));
        assert!(!p.due(5, None, 100, 1099));
        assert!(p.due(5, None, 100, 1100));
        assert!(p.due(10, None, 100, 100));
        assert!(!p.due(15, Some((10, 2000)), 0, 2500));
        assert!(p.due(20, Some((10, 2000)), 0, 2500));
        assert!(p.due(11, Some((10, 2000)), 0, 3000));
        assert!(!p.due(10, Some((10, 2000)), 0, 9000));
    }

    #[test]
    fn node_counts() {
        assert_eq!(expected_tree_nodes(0), 0);
        assert_eq!(expected_tree_nodes(1), 1);
        assert_eq!(expected_tree_nodes(8), 15);
        assert_eq!(expected_tree_nodes(7), 7 + 3 + 1);
    }
}
