//! Full replay: recomputes every entry hash, the chain links, every stored
//! tree node and the root at every checkpoint, checks every checkpoint's
//! signature against a pinned key, and (optionally) re-checks every receipt.
//! Each problem is reported with the entry index (or checkpoint size) it is at.

use crate::checkpoint::Checkpoint;
use crate::entry::{attestation_sha256, Entry, ReceiptCheck, ReceiptRefusal, GENESIS_PREV_HASH};
use crate::merkle::{leaf_hash, node_hash, Hash, NodeId, TreeReadError, EMPTY_ROOT};
use crate::note::VerifierKey;
use crate::store::{expected_tree_nodes, LedgerStore, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Distinct attestation documents kept in memory during a replay.
const DOC_CACHE: usize = 64;

/// Most issues collected before the report is cut short.
pub const MAX_ISSUES: usize = 10_000;

/// One problem found by [`verify_ledger`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Issue {
    /// Rows `from..to` are absent (deleted, or renumbered away).
    MissingEntries { from: u64, to: u64 },
    /// A row could not be decoded.
    CorruptRow { index: i64, what: String },
    /// The row's prev_hash is not the stored entry hash of the row before it.
    PrevHashMismatch { index: u64 },
    /// The row's entry hash is not the hash of its own content.
    EntryHashMismatch { index: u64 },
    AttestationMissing { index: u64 },
    /// The stored document no longer hashes to its key.
    AttestationAltered { index: u64 },
    InvalidFields { index: u64, error: String },
    ReceiptRejected { index: u64, reason: ReceiptRefusal },
    /// An indexed field differs from what the receipt says.
    FieldMismatch { index: u64, field: &'static str },
    /// A stored tree node differs from the one recomputed from the leaves
    /// (reported only where its children agree); `index` is its first leaf.
    TreeNodeMismatch { index: u64, level: u8 },
    TreeNodeMissing { index: u64, level: u8 },
    TreeNodeCount { expected: u64, found: u64 },
    /// The checkpoint's signature or text does not verify against the pinned key.
    CheckpointInvalid { size: u64, error: String },
    /// The checkpoint row's size or root column differs from its signed text.
    CheckpointRowMismatch { size: u64 },
    CheckpointBeyondEnd { size: u64, ledger_size: u64 },
    /// The signed root differs from the root recomputed from the entries.
    CheckpointRootMismatch { size: u64 },
}

impl Issue {
    /// The entry index the issue is at (for checkpoints: their size).
    pub fn index(&self) -> Option<u64> {
        use Issue::*;
        match self {
            MissingEntries { from: index, .. }
            | PrevHashMismatch { index }
            | EntryHashMismatch { index }
            | AttestationMissing { index }
            | AttestationAltered { index }
            | InvalidFields { index, .. }
            | ReceiptRejected { index, .. }
            | FieldMismatch { index, .. }
            | TreeNodeMismatch { index, .. }
            | TreeNodeMissing { index, .. } => Some(*index),
            CorruptRow { index, .. } => u64::try_from(*index).ok(),
            CheckpointInvalid { size, .. }
            | CheckpointRowMismatch { size }
            | CheckpointBeyondEnd { size, .. }
            | CheckpointRootMismatch { size } => Some(*size),
            TreeNodeCount { .. } => None,
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Issue::*;
        match self {
            MissingEntries { from, to } => write!(f, "entries {from}..{to} are missing"),
            CorruptRow { index, what } => write!(f, "entry {index}: row is corrupt: {what}"),
            PrevHashMismatch { index } => write!(f, "entry {index}: prev_hash does not link to entry {}", index.wrapping_sub(1)),
            EntryHashMismatch { index } => write!(f, "entry {index}: entry hash does not match its content"),
            AttestationMissing { index } => write!(f, "entry {index}: attestation document is missing"),
            AttestationAltered { index } => write!(f, "entry {index}: attestation document was altered"),
            InvalidFields { index, error } => write!(f, "entry {index}: {error}"),
            ReceiptRejected { index, reason } => write!(f, "entry {index}: receipt rejected: {reason}"),
            FieldMismatch { index, field } => write!(f, "entry {index}: indexed field {field} differs from the receipt"),
            TreeNodeMismatch { index, level } => write!(f, "entry {index}: stored tree node at level {level} differs"),
            TreeNodeMissing { index, level } => write!(f, "entry {index}: tree node at level {level} is missing"),
            TreeNodeCount { expected, found } => write!(f, "{found} tree nodes stored, {expected} expected"),
            CheckpointInvalid { size, error } => write!(f, "checkpoint {size}: {error}"),
            CheckpointRowMismatch { size } => write!(f, "checkpoint {size}: row differs from its signed text"),
            CheckpointBeyondEnd { size, ledger_size } => {
                write!(f, "checkpoint {size}: ledger has only {ledger_size} entries (entries were removed)")
            }
            CheckpointRootMismatch { size } => write!(f, "checkpoint {size}: signed root differs from the entries' root"),
        }
    }
}

/// The outcome of [`verify_ledger`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Entries replayed (one past the highest index seen).
    pub size: u64,
    pub checkpoints: u64,
    pub receipts_checked: bool,
    /// Entries from this index on are covered by no signed checkpoint yet
    /// (their integrity rests on the chain alone until the next checkpoint).
    pub uncheckpointed_from: Option<u64>,
    pub issues: Vec<Issue>,
    /// More than [`MAX_ISSUES`] were found; the rest are not listed.
    pub truncated: bool,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.issues.is_empty()
    }

    /// The entry indexes (or checkpoint sizes) named by the issues, sorted.
    pub fn indexes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.issues.iter().filter_map(Issue::index).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn push(&mut self, issue: Issue) {
        if self.issues.len() < MAX_ISSUES {
            self.issues.push(issue);
        } else {
            self.truncated = true;
        }
    }
}

struct Replay<'a> {
    store: &'a dyn LedgerStore,
    report: VerifyReport,
    /// Compact range: (hash, dirty) of the complete subtrees covering [0, size).
    stack: Vec<(Hash, bool)>,
    size: u64,
    roots_wanted: BTreeMap<u64, Option<Hash>>,
}

impl Replay<'_> {
    fn stored_node(&self, id: NodeId) -> Result<Option<Hash>, StoreError> {
        match self.store.node_hashes(&[id]) {
            Ok(h) => Ok(h.first().copied()),
            Err(TreeReadError::Missing(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Compares a recomputed node with the stored one; returns whether it is dirty.
    fn compare(&mut self, id: NodeId, hash: &Hash, children_dirty: bool) -> Result<bool, StoreError> {
        let index = id.first_leaf();
        match self.stored_node(id)? {
            Some(stored) if stored == *hash => Ok(children_dirty),
            Some(_) => {
                if !children_dirty {
                    self.report.push(Issue::TreeNodeMismatch { index, level: id.level });
                }
                Ok(true)
            }
            None => {
                if !children_dirty {
                    self.report.push(Issue::TreeNodeMissing { index, level: id.level });
                }
                Ok(true)
            }
        }
    }

    /// Pushes leaf `self.size` with hash `leaf` (already known dirty or not).
    fn push_leaf(&mut self, leaf: Hash, dirty: bool) -> Result<(), StoreError> {
        let index = self.size;
        let mut dirty = self.compare(NodeId::new(0, index), &leaf, dirty)?;
        let mut h = leaf;
        let mut level = 0u8;
        while (index >> level) & 1 == 1 {
            let (left, left_dirty) = self.stack.pop().expect("set bit has a subtree");
            h = node_hash(&left, &h);
            level += 1;
            dirty = self.compare(NodeId::new(level, index >> level), &h, dirty || left_dirty)?;
        }
        self.stack.push((h, dirty));
        self.size += 1;
        if self.roots_wanted.contains_key(&self.size) {
            let root = self.root();
            self.roots_wanted.insert(self.size, Some(root));
        }
        Ok(())
    }

    fn root(&self) -> Hash {
        match self.stack.split_last() {
            None => EMPTY_ROOT,
            Some(((last, _), rest)) => rest.iter().rev().fold(*last, |acc, (h, _)| node_hash(h, &acc)),
        }
    }
}

/// Replays the whole ledger. Checkpoints are verified only against `key`
/// (pinned by the caller, never read from the store). With `check`, every
/// receipt is re-verified and its indexed fields compared.
pub fn verify_ledger(
    store: &dyn LedgerStore,
    key: &VerifierKey,
    check: Option<&dyn ReceiptCheck>,
) -> Result<VerifyReport, StoreError> {
    // Checkpoints, entries, nodes and their count of one moment: an append committing
    // between two of these reads would otherwise look like a corrupt ledger.
    let _snapshot = store.read_snapshot()?;
    let checkpoints = store.checkpoints()?;
    let mut r = Replay {
        store,
        report: VerifyReport { receipts_checked: check.is_some(), ..Default::default() },
        stack: Vec::new(),
        size: 0,
        roots_wanted: checkpoints.iter().map(|c| (c.size, None)).collect(),
    };
    r.report.checkpoints = checkpoints.len() as u64;
    let mut prev_stored: Hash = GENESIS_PREV_HASH;
    let mut docs: HashMap<Hash, Option<Vec<u8>>> = HashMap::new();
    let mut failure: Option<StoreError> = None;

    let mut visit = |row: Result<Entry, StoreError>, r: &mut Replay<'_>| -> Result<(), StoreError> {
        let e = match row {
            Ok(e) => e,
            Err(StoreError::CorruptRow { index, what, .. }) => {
                r.report.push(Issue::CorruptRow { index, what: what.to_owned() });
                // The row's leaf cannot be trusted; keep the tree aligned with its stored leaf node.
                if let Ok(i) = u64::try_from(index) {
                    fill_gap(r, i)?;
                    let leaf = r.stored_node(NodeId::new(0, i))?.unwrap_or([0; 32]);
                    r.push_leaf(leaf, true)?;
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        fill_gap(r, e.index)?;
        if e.prev_hash != prev_stored {
            r.report.push(Issue::PrevHashMismatch { index: e.index });
        }
        let recomputed = e.recompute_hash();
        if recomputed != e.entry_hash {
            r.report.push(Issue::EntryHashMismatch { index: e.index });
        }
        prev_stored = e.entry_hash;
        if let Err(error) = e.fields.validate() {
            r.report.push(Issue::InvalidFields { index: e.index, error: error.to_string() });
        }
        // Documents are shared by many entries: keep a few in memory.
        let fetched;
        let doc = match docs.get(&e.attestation_sha256) {
            Some(d) => d,
            None => {
                fetched = store.attestation_document(&e.attestation_sha256)?;
                if docs.len() < DOC_CACHE {
                    docs.insert(e.attestation_sha256, fetched.clone());
                }
                &fetched
            }
        };
        match doc {
            None => r.report.push(Issue::AttestationMissing { index: e.index }),
            Some(doc) => {
                if attestation_sha256(doc) != e.attestation_sha256 {
                    r.report.push(Issue::AttestationAltered { index: e.index });
                } else if let Some(check) = check {
                    match check.check(&e.leaf, doc) {
                        Err(reason) => r.report.push(Issue::ReceiptRejected { index: e.index, reason }),
                        Ok(actual) => {
                            if let Some(field) = e.fields.first_difference(&actual) {
                                r.report.push(Issue::FieldMismatch { index: e.index, field });
                            }
                        }
                    }
                }
            }
        }
        r.push_leaf(leaf_hash(&e.leaf), false)
    };
    store.scan_entries(&mut |row| match visit(row, &mut r) {
        Ok(()) => true,
        Err(e) => {
            failure = Some(e);
            false
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }

    let size = r.size;
    let found = store.tree_node_count()?;
    let expected = expected_tree_nodes(size);
    if found != expected {
        r.report.push(Issue::TreeNodeCount { expected, found });
    }
    let mut latest = 0;
    for cp in &checkpoints {
        match Checkpoint::open(cp.note.as_bytes(), key) {
            Err(e) => r.report.push(Issue::CheckpointInvalid { size: cp.size, error: e.to_string() }),
            Ok(signed) => {
                if signed.size != cp.size || signed.root != cp.root {
                    r.report.push(Issue::CheckpointRowMismatch { size: cp.size });
                }
                if signed.size > size {
                    r.report.push(Issue::CheckpointBeyondEnd { size: signed.size, ledger_size: size });
                } else if r.roots_wanted.get(&signed.size).copied().flatten() != Some(signed.root) {
                    r.report.push(Issue::CheckpointRootMismatch { size: signed.size });
                } else {
                    latest = latest.max(signed.size);
                }
            }
        }
    }
    let mut report = r.report;
    report.size = size;
    report.uncheckpointed_from = (latest < size).then_some(latest);
    Ok(report)
}

/// Reports rows missing before `index` and keeps the tree aligned by
/// replaying their stored leaf nodes (marked dirty: already reported).
fn fill_gap(r: &mut Replay<'_>, index: u64) -> Result<(), StoreError> {
    if index > r.size {
        r.report.push(Issue::MissingEntries { from: r.size, to: index });
        while r.size < index {
            let leaf = r.stored_node(NodeId::new(0, r.size))?.unwrap_or([0; 32]);
            r.push_leaf(leaf, true)?;
        }
    }
    Ok(())
}

/// What one entry proves on its own: the verdict column of the compliance view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum EntryVerdict {
    /// The receipt and its attestation verify, the indexed fields are the receipt's, the
    /// row is intact and links to the one before it, and the receipt is included in the
    /// tree of the signed checkpoint of size `checkpoint`.
    Verified { checkpoint: u64 },
    /// All of the above but the inclusion: no signed checkpoint covers the entry yet.
    NotCheckpointed,
    /// The first thing found wrong.
    Invalid { reason: String },
}

/// Checks one entry without replaying the ledger: its row hash and chain link, its
/// attestation document, the receipt check and the indexed fields, then its inclusion
/// under `checkpoint`, which the caller has opened with the pinned ledger key (so the
/// verdict is only as good as that pin). O(log n) reads.
pub fn verify_entry(
    store: &dyn LedgerStore,
    entry: &Entry,
    check: &dyn ReceiptCheck,
    checkpoint: Option<&Checkpoint>,
) -> Result<EntryVerdict, StoreError> {
    let invalid = |reason: String| Ok(EntryVerdict::Invalid { reason });
    if entry.recompute_hash() != entry.entry_hash {
        return invalid("entry hash does not match the row".into());
    }
    let prev = match entry.index.checked_sub(1) {
        None => Some(GENESIS_PREV_HASH),
        Some(i) => store.entry(i)?.map(|e| e.entry_hash),
    };
    if prev != Some(entry.prev_hash) {
        return invalid(format!("prev_hash does not link to entry {}", entry.index.wrapping_sub(1)));
    }
    let Some(document) = store.attestation_document(&entry.attestation_sha256)? else {
        return invalid("attestation document is missing".into());
    };
    if attestation_sha256(&document) != entry.attestation_sha256 {
        return invalid("attestation document was altered".into());
    }
    match check.check(&entry.leaf, &document) {
        Err(reason) => return invalid(reason.to_string()),
        Ok(actual) => {
            if let Some(field) = entry.fields.first_difference(&actual) {
                return invalid(format!("indexed field {field} differs from the receipt"));
            }
        }
    }
    let Some(cp) = checkpoint.filter(|cp| cp.size > entry.index) else {
        return Ok(EntryVerdict::NotCheckpointed);
    };
    let included = crate::merkle::inclusion_proof(store, entry.index, cp.size)
        .map_err(|e| e.to_string())
        .and_then(|path| {
            crate::merkle::verify_inclusion(entry.index, cp.size, &leaf_hash(&entry.leaf), &path, &cp.root)
                .map_err(|e| e.to_string())
        });
    match included {
        Ok(()) => Ok(EntryVerdict::Verified { checkpoint: cp.size }),
        Err(e) => invalid(format!("not in the tree of signed checkpoint {}: {e}", cp.size)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::SignerKey;
    use crate::store::{CheckpointPolicy, SqliteStore};
    use crate::testing::{test_request, TestReceipts};

    fn ledger() -> (SqliteStore, VerifierKey) {
        let key = SignerKey::from_seed("ledger.test", &[1; 32]).unwrap();
        let mut s = SqliteStore::open_in_memory().unwrap();
        let batch: Vec<_> = (0..6).map(|j| test_request(j, 64)).collect();
        s.append(&batch[..4], &key, &CheckpointPolicy { every_appends: 4, every_ms: u64::MAX }, 1).unwrap();
        s.append(&batch[4..], &key, &CheckpointPolicy { every_appends: 4, every_ms: u64::MAX }, 2).unwrap();
        (s, key.verifier())
    }

    fn verdicts(s: &SqliteStore, cp: Option<&Checkpoint>) -> Vec<EntryVerdict> {
        (0..s.size().unwrap())
            .map(|i| verify_entry(s, &s.entry(i).unwrap().unwrap(), &TestReceipts, cp).unwrap())
            .collect()
    }

    #[test]
    fn entry_verdicts() {
        let (s, key) = ledger();
        let cp = Checkpoint::open(s.latest_checkpoint().unwrap().unwrap().note.as_bytes(), &key).unwrap();
        assert_eq!(cp.size, 4);
        let v = verdicts(&s, Some(&cp));
        assert!(v[..4].iter().all(|v| *v == EntryVerdict::Verified { checkpoint: 4 }), "{v:?}");
        assert!(v[4..].iter().all(|v| *v == EntryVerdict::NotCheckpointed), "{v:?}");
        assert!(verdicts(&s, None).iter().all(|v| *v == EntryVerdict::NotCheckpointed));

        // A checkpoint over another tree (what a forked ledger would show).
        let forged = Checkpoint { root: [7; 32], ..cp.clone() };
        assert!(matches!(&verdicts(&s, Some(&forged))[1], EntryVerdict::Invalid { reason } if reason.starts_with("not in the tree")));

        let c = s.connection();
        c.execute("UPDATE entries SET ok_count = ok_count + 1 WHERE idx = 2", []).unwrap();
        // A row rewritten consistently in itself no longer links to the one before.
        let mut e3 = s.entry(3).unwrap().unwrap();
        e3.prev_hash = [0; 32];
        let h = e3.recompute_hash();
        c.execute("UPDATE entries SET prev_hash = ?1, entry_hash = ?2 WHERE idx = 3", rusqlite::params![&e3.prev_hash[..], &h[..]])
            .unwrap();
        c.execute("UPDATE entries SET leaf = CAST('x' AS BLOB) WHERE idx = 5", []).unwrap();
        let v = verdicts(&s, Some(&cp));
        let reason = |i: usize| match &v[i] {
            EntryVerdict::Invalid { reason } => reason.clone(),
            other => panic!("entry {i}: {other:?}"),
        };
        assert_eq!(reason(2), "indexed field ok_count differs from the receipt");
        assert_eq!(reason(3), "prev_hash does not link to entry 2");
        assert_eq!(reason(5), "entry hash does not match the row");
        assert_eq!(v[0], EntryVerdict::Verified { checkpoint: 4 });
    }
}
