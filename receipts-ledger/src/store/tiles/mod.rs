//! The ledger in an object store, in the C2SP tlog-tiles layout ([`layout`]), with a local
//! SQLite copy as its index and cache.
//!
//! The object store is the source of truth; SQLite answers queries and proofs. One commit:
//!
//! 1. read `checkpoint` (its etag first, then its text) and bring the cache up to it, from
//!    the published bundles or, for a commit whose appender died before publishing, from its
//!    staging record; finish publishing that commit if it is not complete;
//! 2. append the batch to the cache inside a transaction and sign a checkpoint of the new
//!    tree;
//! 3. write the batch's attestation documents and its staging record (create-only);
//! 4. replace `checkpoint` with `If-Match` on the etag of step 1 — the commit point. Another
//!    appender got there first: roll the cache back and start again at 1;
//! 5. commit the cache, then publish the entry bundles, metadata, hash tiles and the
//!    archived checkpoint (create-only; an existing object must hold the same bytes).
//!
//! Nothing is signed into the store before it wins step 4, so a losing appender leaves only
//! an unsigned staging record behind, never a second signed tree of the same size.
//!
//! Rebuilding the cache trusts only what the signed root binds: the receipts (leaves). The
//! metadata beside them (`ephem/meta/`, staging records) is a cache of what the receipts say —
//! fields, attestation hash, chain hash — and whoever can write the bucket can edit it, so each
//! value is read from the receipt itself ([`LeafReader`]) and a metadata value that differs is
//! ignored and alarmed (`ledger_metadata_altered`, [`TileStore::altered_metadata`]). Only
//! `appended_ms` and `policy`, which no receipt states, come from the metadata, as information.

pub mod bundle;
pub mod layout;
mod sync;

pub use sync::{audit, copy_root, sync, AuditProblem, AuditReport, SyncReport};

use protocol::JobId;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cloud::{ObjectError, ObjectStore, PutCondition};

use self::bundle::{BundleFormatError, EntryMeta, StagedEntry, Staging, MAX_BUNDLED_ENTRY};
use self::layout::{tiles_of, Layout, TileId};
use super::sqlite::{ImportedEntry, SqliteOptions, SqliteStore};
use super::{AppendOutcome, CheckpointPolicy, LedgerStore, Query, StoreError, StoredCheckpoint};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::entry::{attestation_sha256, entry_hash, AppendRequest, Entry, IndexedFields, LeafReader, GENESIS_PREV_HASH};
use crate::merkle::{leaf_hash, root_at, Hash, NodeId, TreeReadError, TreeReader};
use crate::receipt_check::ProtocolLeaves;
use crate::note::{NoteSigner, VerifierKey};

/// Commit attempts before an append gives up on a contended checkpoint.
pub const MAX_COMMIT_ATTEMPTS: u32 = 8;

/// Why the object-store ledger failed; each variant names the object or size concerned.
#[derive(Debug, thiserror::Error)]
pub enum TileError {
    #[error("ledger objects: {0}")]
    Objects(#[from] ObjectError),
    #[error("{key}: {error}")]
    Format { key: String, error: BundleFormatError },
    #[error("{key} already exists with other bytes than this ledger's (tampered, or another ledger's)")]
    Conflict { key: String },
    #[error("{key}: {error}")]
    Checkpoint { key: String, error: CheckpointError },
    /// A leaf under the signed root that this ledger's [`LeafReader`] cannot read: a ledger of
    /// another format, or a store opened with the wrong reader.
    #[error("entry {index} ({key}) is not a receipt this ledger reads: {message}")]
    Leaf { key: String, index: u64, message: String },
    #[error("{key} is not the attestation document it is named after")]
    AttestationHash { key: String },
    #[error("the ledger does not rebuild to the signed root of tree size {size}: an entry or a checkpoint was altered, or the history rewritten")]
    RootMismatch { size: u64 },
    #[error("entry {index} is {size} bytes; tlog-tiles entries are at most {MAX_BUNDLED_ENTRY}")]
    EntryTooLarge { index: u64, size: usize },
    #[error("the checkpoint changed under {attempts} commit attempts in a row; another appender is busy")]
    Contended { attempts: u32 },
    #[error("the staging record {key} of the current checkpoint is missing, and so are its bundles")]
    StagingMissing { key: String },
    /// The store's checkpoint is older than one already signed: someone who can write the bucket
    /// put an old note back. Building on it would sign a fork, so nothing is appended.
    #[error("checkpoint rolled back: the store's checkpoint is of tree size {head}, but {seen_in} is of size {seen}")]
    RolledBack { head: u64, seen: u64, seen_in: String },
    #[error("local cache {path}: {source}")]
    CacheIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<TileError> for StoreError {
    fn from(e: TileError) -> Self {
        match e {
            TileError::Store(e) => e,
            other => StoreError::Tiles(Box::new(other)),
        }
    }
}

impl From<TreeReadError> for TileError {
    fn from(e: TreeReadError) -> Self {
        TileError::Store(e.into())
    }
}

/// Where the SQLite cache lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cache {
    Memory,
    /// A file (with its `-wal`/`-shm` beside it) that may be deleted and rebuilt at any time.
    File(PathBuf),
}

/// The latest checkpoint as read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub size: u64,
    pub root: Hash,
    pub note: String,
    /// What `If-Match` takes to replace exactly this checkpoint.
    pub etag: String,
}

/// A metadata value that differs from what the entry's receipt states: ignored (the receipt's
/// value is used) and alarmed. Only someone who can write the ledger bucket causes one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AlteredMetadata {
    /// The metadata bundle or staging record.
    pub key: String,
    pub index: u64,
    /// `job_id`, `ok_count`, … (the first field that differs), `attestation_sha256`,
    /// `entry_hash`, or `policy` (not a policy id).
    pub field: &'static str,
}

/// How a [`TileStore`] treats its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileOptions {
    /// Copy every archived checkpoint, not only the current one, into the cache.
    pub full_history: bool,
    /// A cache that disagrees with the objects is deleted and rebuilt (an appender's cache);
    /// otherwise the disagreement is an error (an auditor's copy: the ledger may have been
    /// rewritten since it was taken, which is exactly what the copy must expose).
    pub rebuild_on_mismatch: bool,
}

impl TileOptions {
    /// The appender's cache: rebuilt whenever in doubt, current checkpoint only.
    pub fn appender() -> Self {
        Self { full_history: false, rebuild_on_mismatch: true }
    }

    /// An auditor's copy: every checkpoint, and never silently replaced.
    pub fn auditor() -> Self {
        Self { full_history: true, rebuild_on_mismatch: false }
    }
}

/// The ledger in an object store, with its SQLite cache. Reads are served by the cache as of
/// the last [`TileStore::refresh`] (every append refreshes first).
pub struct TileStore {
    objects: Arc<dyn ObjectStore>,
    layout: Layout,
    cache: SqliteStore,
    location: Cache,
    verifier: VerifierKey,
    options: TileOptions,
    /// The tree size whose objects are known to be all published.
    published: Option<u64>,
    /// What the leaves state (their fields, their documents): never the metadata's word.
    leaves: Arc<dyn LeafReader>,
    /// Metadata found altered while reading the store (since opened, or rebuilt).
    altered: Vec<AlteredMetadata>,
}

impl std::fmt::Debug for TileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TileStore").field("layout", &self.layout).field("cache", &self.location).finish()
    }
}

impl TileStore {
    /// Opens the ledger under `layout` in `objects`, whose checkpoints verify under `verifier`
    /// (the appender's own key, or the key an auditor pins). The cache is as it was until
    /// [`TileStore::refresh`] (or an append).
    pub fn open(
        objects: Arc<dyn ObjectStore>,
        layout: Layout,
        location: Cache,
        verifier: VerifierKey,
        options: TileOptions,
    ) -> Result<Self, TileError> {
        let cache = open_cache(&location)?;
        let leaves = Arc::new(ProtocolLeaves);
        Ok(Self { objects, layout, cache, location, verifier, options, published: None, leaves, altered: Vec::new() })
    }

    /// Reads the leaves with `leaves` instead of as protocol receipts (tests' stand-in format).
    pub fn with_leaves(mut self, leaves: Arc<dyn LeafReader>) -> Self {
        self.leaves = leaves;
        self
    }

    /// Metadata values found to differ from their receipts while reading the store: each was
    /// ignored and logged as alarm `ledger_metadata_altered`.
    pub fn altered_metadata(&self) -> &[AlteredMetadata] {
        &self.altered
    }

    pub fn objects(&self) -> &dyn ObjectStore {
        self.objects.as_ref()
    }

    /// The local index.
    pub fn cache(&self) -> &SqliteStore {
        &self.cache
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Reads the current checkpoint and brings the cache up to it (rebuilding the cache from
    /// the objects when it is not a prefix of the ledger). Returns the checkpoint read.
    pub fn refresh(&mut self) -> Result<Option<Head>, TileError> {
        let head = read_head(self.objects.as_ref(), &self.layout, &self.verifier)?;
        match self.catch_up(head.as_ref()) {
            Ok(()) => {}
            Err(error @ (TileError::Store(StoreError::ImportMismatch { .. } | StoreError::KeyMismatch { .. })
            | TileError::RootMismatch { .. }))
                if self.options.rebuild_on_mismatch =>
            {
                tracing::warn!(%error, "the ledger cache disagrees with the objects; rebuilding it");
                self.reset_cache()?;
                self.catch_up(head.as_ref())?;
            }
            Err(other) => return Err(other),
        }
        Ok(head)
    }

    fn catch_up(&mut self, head: Option<&Head>) -> Result<(), TileError> {
        let have = self.cache.size()?;
        let Some(head) = head else {
            // An empty store: a cache with entries belongs to some other ledger.
            return if have == 0 { Ok(()) } else { Err(mismatch(0, "entries without any checkpoint")) };
        };
        if self.cache.ledger_key()?.is_some_and(|k| k != self.verifier.to_string()) {
            return Err(StoreError::KeyMismatch {
                stored: self.cache.ledger_key()?.unwrap_or_default(),
                given: self.verifier.to_string(),
            }
            .into());
        }
        if have > head.size {
            return Err(rolled_back(head, have, "this copy's own last checkpoint".into()));
        }
        if have == head.size {
            if root_at(&self.cache, have)? != head.root {
                return Err(TileError::RootMismatch { size: have });
            }
            if self.cache.checkpoint_at(head.size)?.is_none() {
                let created_ms = self.cache.entry(head.size - 1)?.map_or(0, |e| e.appended_ms);
                let cp = StoredCheckpoint { size: head.size, root: head.root, note: head.note.clone(), created_ms };
                self.cache.import(have, &[], &[cp], &self.verifier.to_string())?;
            }
            return Ok(());
        }
        let mut checkpoints = if have == 0 || self.options.full_history {
            // A copy with no history of its own (a cold start, a fresh auditor) learns from the
            // archive whether a larger tree was ever signed.
            if let Some(seen) = newest_archived(self.objects.as_ref(), &self.layout, &self.verifier, head.size)? {
                return Err(rolled_back(head, seen, format!("the archived checkpoint {}", self.layout.archived_checkpoint(seen))));
            }
            archived_checkpoints(self.objects.as_ref(), &self.layout, &self.verifier, have, head.size)?
        } else {
            Vec::new()
        };
        if checkpoints.last().is_none_or(|c| c.size != head.size) {
            checkpoints.push(StoredCheckpoint { size: head.size, root: head.root, note: head.note.clone(), created_ms: 0 });
        }
        // One bundle at a time, so a rebuild holds at most 256 entries in memory; past what is
        // published (an unfinished commit), the rest comes from the staging record at once.
        let prev = match have.checked_sub(1) {
            Some(last) => self.cache.entry(last)?.ok_or_else(|| mismatch(last, "the copy's last entry is missing"))?.entry_hash,
            None => GENESIS_PREV_HASH,
        };
        let mut reading = Reading {
            objects: self.objects.as_ref(),
            layout: &self.layout,
            leaves: self.leaves.as_ref(),
            documents: Documents::default(),
            prev,
            altered: &mut self.altered,
        };
        let mut at = have;
        while at < head.size {
            let end = ((at / layout::TILE_WIDTH + 1) * layout::TILE_WIDTH).min(head.size);
            let entries = match load_published(&mut reading, at, end) {
                Ok(entries) => entries,
                Err(TileError::Objects(ObjectError::NotFound { .. })) => load_entries(&mut reading, at, head)?,
                Err(e) => return Err(e),
            };
            if entries.is_empty() {
                return Err(mismatch(at, "entries missing below the checkpoint's size"));
            }
            let next = at + entries.len() as u64;
            let covered = checkpoints.iter().take_while(|c| c.size <= next).count();
            let mut now: Vec<StoredCheckpoint> = checkpoints.drain(..covered).collect();
            fill_created_ms(&mut now, at, &entries);
            match self.cache.import(at, &entries, &now, &self.verifier.to_string()) {
                Err(StoreError::ImportMismatch { index, what: "checkpoint root" }) => {
                    return Err(TileError::RootMismatch { size: index });
                }
                other => other?,
            };
            at = next;
        }
        Ok(())
    }

    fn reset_cache(&mut self) -> Result<(), TileError> {
        self.altered.clear();
        if let Cache::File(path) = &self.location {
            self.cache = SqliteStore::open_in_memory()?; // closes the file first
            for suffix in ["", "-wal", "-shm"] {
                let p = PathBuf::from(format!("{}{suffix}", path.display()));
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(TileError::CacheIo { path: p, source }),
                }
            }
        }
        self.cache = open_cache(&self.location)?;
        self.published = None;
        Ok(())
    }

    /// Makes sure every object of the current checkpoint's commit exists (an appender that
    /// died after its commit point left them unwritten).
    fn finish_publishing(&mut self, head: &Head) -> Result<(), TileError> {
        if self.published == Some(head.size) {
            return Ok(());
        }
        if self.objects.head(&self.layout.archived_checkpoint(head.size))?.is_none() {
            let key = self.layout.staging(head.size, &head.root);
            let from = match self.objects.get(&key) {
                Ok(bytes) => Staging::from_bytes(&bytes).map_err(|error| TileError::Format { key, error })?.from,
                Err(ObjectError::NotFound { .. }) => 0, // publish everything; existing objects are compared
                Err(e) => return Err(e.into()),
            };
            tracing::info!(from, to = head.size, "publishing the tiles of a commit its appender left unfinished");
            self.publish(from, head.size)?;
        }
        self.published = Some(head.size);
        Ok(())
    }

    /// Writes the bundles, metadata and tiles that grew from tree size `from` to `to`, then the
    /// archived checkpoint of `to` (last: its presence says the rest is there).
    fn publish(&self, from: u64, to: u64) -> Result<(), TileError> {
        for t in tiles_of(to, from) {
            if t.level == 0 {
                let entries: Vec<Entry> = (t.first()..t.first() + u64::from(t.width))
                    .map(|i| self.cache.entry(i)?.ok_or(StoreError::CorruptRow { table: "entries", index: i as i64, what: "missing" }))
                    .collect::<Result<_, _>>()?;
                let key = self.layout.entries(t);
                let bundle = bundle::encode_entries(entries.iter().map(|e| (e.index, e.leaf.as_slice())))
                    .map_err(|error| TileError::Format { key: key.clone(), error })?;
                put_immutable(self.objects.as_ref(), &key, &bundle)?;
                let meta: Vec<EntryMeta> = entries.iter().map(EntryMeta::of).collect();
                put_immutable(self.objects.as_ref(), &self.layout.meta(t), &bundle::encode_meta(&meta))?;
            }
            put_immutable(self.objects.as_ref(), &self.layout.tile(t), &tile_bytes(&self.cache, t)?)?;
        }
        let cp = self.cache.checkpoint_at(to)?.ok_or(StoreError::CorruptRow {
            table: "checkpoints",
            index: to as i64,
            what: "the committed tree has no checkpoint",
        })?;
        put_immutable(self.objects.as_ref(), &self.layout.archived_checkpoint(to), cp.note.as_bytes())?;
        Ok(())
    }

    /// One commit attempt on top of `head` (steps 2–5 of the module documentation).
    fn try_commit(
        &mut self,
        head: Option<&Head>,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        now_ms: u64,
    ) -> Result<Attempt, TileError> {
        let objects = self.objects.clone();
        let layout = self.layout.clone();
        let mut range = None;
        let mut adopted = false;
        let outcome = self.cache.append_publishing(batch, signer, now_ms, |pending| -> Result<bool, TileError> {
            let mut staged = Vec::new();
            let mut documents = HashSet::new();
            for index in pending.from..pending.to {
                let e = pending.entry(index)?;
                if e.leaf.len() > MAX_BUNDLED_ENTRY {
                    return Err(TileError::EntryTooLarge { index, size: e.leaf.len() });
                }
                if documents.insert(e.attestation_sha256) {
                    let doc = pending.attestation_document(&e.attestation_sha256)?.unwrap_or_default();
                    // Named by its hash, so an existing object is either this document or
                    // damage that every reader detects by hashing.
                    match objects.put(&layout.attestation(&e.attestation_sha256), &doc, PutCondition::CreateOnly) {
                        Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                staged.push(StagedEntry::of(&e));
            }
            let cp = &pending.checkpoint;
            let staging = Staging {
                version: Staging::VERSION,
                from: pending.from,
                size: pending.to,
                root: hex::encode(cp.root),
                entries: staged,
            };
            let key = layout.staging(cp.size, &cp.root);
            match put_immutable(objects.as_ref(), &key, &staging.to_bytes()) {
                Ok(()) => {}
                // An earlier attempt staged the same tree (same root, so the same leaves) with
                // other append times, and did not commit it. Commit that record instead: then
                // every reader rebuilds the same metadata.
                Err(TileError::Conflict { .. }) => adopted = true,
                Err(e) => return Err(e),
            }
            let condition = match head {
                Some(h) => PutCondition::IfMatch(h.etag.clone()),
                None => PutCondition::CreateOnly,
            };
            match objects.put(&layout.checkpoint(), cp.note.as_bytes(), condition) {
                Ok(_) => {
                    range = Some((pending.from, pending.to));
                    Ok(!adopted)
                }
                Err(ObjectError::PreconditionFailed { .. } | ObjectError::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            }
        })?;
        Ok(match (outcome, range) {
            (Some(out), Some((from, to))) => {
                self.publish(from, to)?;
                self.published = Some(to);
                Attempt::Committed(out)
            }
            (Some(out), None) => Attempt::Committed(out), // nothing new
            (None, Some(_)) => Attempt::Again,            // committed someone's staging: re-read it
            (None, None) => {
                tracing::info!("another appender moved the checkpoint first; retrying on top of it");
                Attempt::Again
            }
        })
    }

    fn append_batch(
        &mut self,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        now_ms: u64,
    ) -> Result<Vec<AppendOutcome>, TileError> {
        if signer.verifier() != self.verifier {
            return Err(StoreError::KeyMismatch { stored: self.verifier.to_string(), given: signer.verifier().to_string() }.into());
        }
        for attempt in 1..=MAX_COMMIT_ATTEMPTS {
            let head = self.refresh()?;
            if let Some(head) = &head {
                self.finish_publishing(head)?;
            }
            match self.try_commit(head.as_ref(), batch, signer, now_ms)? {
                Attempt::Committed(out) => return Ok(out),
                Attempt::Again => tracing::debug!(attempt, "commit attempt lost"),
            }
        }
        Err(TileError::Contended { attempts: MAX_COMMIT_ATTEMPTS })
    }
}

enum Attempt {
    Committed(Vec<AppendOutcome>),
    Again,
}

fn rolled_back(head: &Head, seen: u64, seen_in: String) -> TileError {
    let error = TileError::RolledBack { head: head.size, seen, seen_in };
    // An alarm, not a retry: only someone writing the bucket can cause it (docs/operations.md).
    tracing::error!(alarm = "ledger_rolled_back", %error);
    error
}

/// The largest archived checkpoint above `head_size` whose note verifies; an archived object
/// that does not verify proves nothing and is passed over.
fn newest_archived(objects: &dyn ObjectStore, layout: &Layout, verifier: &VerifierKey, head_size: u64) -> Result<Option<u64>, TileError> {
    let mut above: Vec<u64> =
        objects.list(&layout.archive_prefix())?.iter().filter_map(|m| layout.archived_size(&m.key)).filter(|s| *s > head_size).collect();
    above.sort_unstable_by(|a, b| b.cmp(a));
    for size in above {
        let note = match objects.get(&layout.archived_checkpoint(size)) {
            Ok(note) => note,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        if Checkpoint::open(&note, verifier).is_ok_and(|cp| cp.size == size) {
            return Ok(Some(size));
        }
    }
    Ok(None)
}

fn mismatch(index: u64, what: &'static str) -> TileError {
    TileError::Store(StoreError::ImportMismatch { index, what })
}

fn open_cache(location: &Cache) -> Result<SqliteStore, TileError> {
    Ok(match location {
        Cache::Memory => SqliteStore::open_in_memory()?,
        Cache::File(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|source| TileError::CacheIo { path: dir.to_path_buf(), source })?;
            }
            // The cache can always be rebuilt: no need to wait for the disk on every commit.
            SqliteStore::open(path, &SqliteOptions { synchronous_full: false, ..SqliteOptions::default() })?
        }
    })
}

/// Create-only write; an existing object must hold exactly these bytes.
fn put_immutable(objects: &dyn ObjectStore, key: &str, bytes: &[u8]) -> Result<(), TileError> {
    match objects.put(key, bytes, PutCondition::CreateOnly) {
        Ok(_) => Ok(()),
        Err(ObjectError::AlreadyExists { .. }) => {
            if objects.get(key)? == bytes { Ok(()) } else { Err(TileError::Conflict { key: key.to_owned() }) }
        }
        Err(e) => Err(e.into()),
    }
}

/// The hashes a tile holds, from any store of complete subtrees.
pub(crate) fn tile_bytes(tree: &dyn TreeReader, t: TileId) -> Result<Vec<u8>, TreeReadError> {
    let ids: Vec<NodeId> =
        (0..u64::from(t.width)).map(|i| NodeId::new(t.tree_level(), t.first() + i)).collect();
    Ok(tree.node_hashes(&ids)?.concat())
}

/// The current checkpoint, verified under `verifier`; `None` for an empty store. The etag
/// is read before the text, so a checkpoint replaced in between makes the later
/// compare-and-swap fail rather than succeed on stale ground.
pub fn read_head(objects: &dyn ObjectStore, layout: &Layout, verifier: &VerifierKey) -> Result<Option<Head>, TileError> {
    let key = layout.checkpoint();
    let Some(meta) = objects.head(&key)? else { return Ok(None) };
    let note = match objects.get(&key) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let cp = Checkpoint::open(&note, verifier).map_err(|error| TileError::Checkpoint { key: key.clone(), error })?;
    let note = String::from_utf8(note).expect("a verified note is UTF-8");
    Ok(Some(Head { size: cp.size, root: cp.root, note, etag: meta.etag }))
}

/// The signed checkpoints archived for sizes in `(after, up_to]`, in size order.
fn archived_checkpoints(
    objects: &dyn ObjectStore,
    layout: &Layout,
    verifier: &VerifierKey,
    after: u64,
    up_to: u64,
) -> Result<Vec<StoredCheckpoint>, TileError> {
    let mut sizes: Vec<u64> = objects
        .list(&layout.archive_prefix())?
        .iter()
        .filter_map(|m| layout.archived_size(&m.key))
        .filter(|s| *s > after && *s <= up_to)
        .collect();
    sizes.sort_unstable();
    let mut out = Vec::with_capacity(sizes.len());
    for size in sizes {
        let key = layout.archived_checkpoint(size);
        let note = objects.get(&key)?;
        let cp = Checkpoint::open(&note, verifier).map_err(|error| TileError::Checkpoint { key: key.clone(), error })?;
        if cp.size != size {
            return Err(TileError::Checkpoint { key, error: CheckpointError::BadSize(cp.size.to_string()) });
        }
        let note = String::from_utf8(note).expect("a verified note is UTF-8");
        out.push(StoredCheckpoint { size, root: cp.root, note, created_ms: 0 });
    }
    Ok(out)
}

/// A checkpoint was signed in the commit that appended its last entry, at that entry's time.
fn fill_created_ms(checkpoints: &mut [StoredCheckpoint], start: u64, entries: &[ImportedEntry]) {
    for cp in checkpoints {
        if let Some(e) = cp.size.checked_sub(start + 1).and_then(|i| entries.get(i as usize)) {
            cp.created_ms = e.appended_ms;
        }
    }
}

/// Entries `[start, head.size)` with their documents: from the published bundles, or, past
/// what is published, from the head commit's staging record.
fn load_entries(r: &mut Reading<'_>, start: u64, head: &Head) -> Result<Vec<ImportedEntry>, TileError> {
    let (objects, layout) = (r.objects, r.layout);
    match load_published(r, start, head.size) {
        Ok(entries) => Ok(entries),
        Err(TileError::Objects(ObjectError::NotFound { .. })) => {
            let key = layout.staging(head.size, &head.root);
            let staging = match objects.get(&key) {
                Ok(bytes) => Staging::from_bytes(&bytes).map_err(|error| TileError::Format { key: key.clone(), error })?,
                Err(ObjectError::NotFound { .. }) => return Err(TileError::StagingMissing { key }),
                Err(e) => return Err(e.into()),
            };
            let mut entries = if start < staging.from { load_published(r, start, staging.from)? } else { Vec::new() };
            for s in staging.entries.iter().filter(|s| s.meta.index >= start) {
                let leaf = s.leaf().map_err(|error| TileError::Format { key: key.clone(), error })?;
                entries.push(r.imported(leaf, &s.meta, &key)?);
            }
            Ok(entries)
        }
        Err(e) => Err(e),
    }
}

/// Entries `[start, end)` from the bundles published for a tree of `end` leaves.
fn load_published(r: &mut Reading<'_>, start: u64, end: u64) -> Result<Vec<ImportedEntry>, TileError> {
    let mut out = Vec::with_capacity((end - start) as usize);
    for t in layout::bundles_of(end, start) {
        let width = usize::from(t.width);
        let key = r.layout.entries(t);
        let leaves = bundle::decode_entries(&r.objects.get(&key)?, width).map_err(|error| TileError::Format { key, error })?;
        let key = r.layout.meta(t);
        let meta = bundle::decode_meta(&r.objects.get(&key)?, t.first(), width)
            .map_err(|error| TileError::Format { key: key.clone(), error })?;
        for (leaf, m) in leaves.into_iter().zip(&meta).filter(|(_, m)| m.index >= start) {
            out.push(r.imported(leaf, m, &key)?);
        }
    }
    Ok(out)
}

/// One rebuild's reading of the store, entries in index order.
struct Reading<'a> {
    objects: &'a dyn ObjectStore,
    layout: &'a Layout,
    leaves: &'a dyn LeafReader,
    documents: Documents,
    /// The chain hash of the entry before the next one read.
    prev: Hash,
    altered: &'a mut Vec<AlteredMetadata>,
}

impl Reading<'_> {
    /// The entry of `leaf` as its receipt states it; `meta` (from `key`) contributes only
    /// `appended_ms` and `policy`, and every value of it that differs is alarmed.
    fn imported(&mut self, leaf: Vec<u8>, meta: &EntryMeta, key: &str) -> Result<ImportedEntry, TileError> {
        let index = meta.index;
        let claims = self.leaves.read(&leaf).map_err(|message| TileError::Leaf { key: key.to_owned(), index, message })?;
        if let Some(field) = meta.fields.first_difference(&claims.fields) {
            self.alarm(key, index, field);
        }
        if meta.attestation_hash().ok() != Some(claims.attestation_sha256) {
            self.alarm(key, index, "attestation_sha256");
        }
        let mut fields = IndexedFields { policy: meta.fields.policy.clone(), ..claims.fields };
        if fields.policy.is_some() && fields.validate().is_err() {
            self.alarm(key, index, "policy");
            fields.policy = None;
        }
        let chained = entry_hash(index, &self.prev, &leaf_hash(&leaf), &claims.attestation_sha256);
        if meta.chain_hash().ok() != Some(chained) {
            self.alarm(key, index, "entry_hash");
        }
        self.prev = chained;
        let attestation_document = self.documents.get(self.objects, self.layout, &claims.attestation_sha256)?;
        Ok(ImportedEntry { request: AppendRequest { leaf, fields, attestation_document }, appended_ms: meta.appended_ms, entry_hash: chained })
    }

    fn alarm(&mut self, key: &str, index: u64, field: &'static str) {
        // Only a writer of the ledger bucket edits metadata; the receipt's value is used.
        tracing::error!(alarm = "ledger_metadata_altered", key, index, field, "ledger metadata differs from its receipt; ignored");
        self.altered.push(AlteredMetadata { key: key.to_owned(), index, field });
    }
}

/// Attestation documents fetched once each, checked against their names.
#[derive(Default)]
struct Documents(HashMap<Hash, Vec<u8>>);

impl Documents {
    fn get(&mut self, objects: &dyn ObjectStore, layout: &Layout, sha256: &Hash) -> Result<Vec<u8>, TileError> {
        if let Some(doc) = self.0.get(sha256) {
            return Ok(doc.clone());
        }
        let key = layout.attestation(sha256);
        let doc = objects.get(&key)?;
        if attestation_sha256(&doc) != *sha256 {
            return Err(TileError::AttestationHash { key });
        }
        self.0.insert(*sha256, doc.clone());
        Ok(doc)
    }
}

impl TreeReader for TileStore {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        self.cache.node_hashes(ids)
    }
}

/// Appends go to the object store first (see the module documentation); every read is the
/// cache's. Every commit signs a checkpoint — the commit point is one — so the
/// [`CheckpointPolicy`] does not apply.
impl LedgerStore for TileStore {
    fn append(
        &mut self,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        _policy: &CheckpointPolicy,
        now_ms: u64,
    ) -> Result<Vec<AppendOutcome>, StoreError> {
        Ok(self.append_batch(batch, signer, now_ms)?)
    }

    fn checkpoint(
        &mut self,
        _signer: &dyn NoteSigner,
        _policy: &CheckpointPolicy,
        _now_ms: u64,
        _force: bool,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(None)
    }

    fn size(&self) -> Result<u64, StoreError> {
        self.cache.size()
    }
    fn entry(&self, index: u64) -> Result<Option<Entry>, StoreError> {
        self.cache.entry(index)
    }
    fn entry_by_job(&self, job_id: &JobId) -> Result<Option<Entry>, StoreError> {
        self.cache.entry_by_job(job_id)
    }
    fn attestation_document(&self, sha256: &Hash) -> Result<Option<Vec<u8>>, StoreError> {
        self.cache.attestation_document(sha256)
    }
    fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, StoreError> {
        self.cache.checkpoints()
    }
    fn latest_checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.cache.latest_checkpoint()
    }
    fn checkpoint_at(&self, size: u64) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.cache.checkpoint_at(size)
    }
    /// The cache's note, then the store's current `checkpoint` if it is still of `size` (replaced
    /// with `If-Match`, so a newer commit is never overwritten; then the cosignatures go to the
    /// newer checkpoint's turn). The archived checkpoint keeps the ledger's signature alone.
    fn add_cosignatures(&self, size: u64, note: &str) -> Result<(), StoreError> {
        self.cache.add_cosignatures(size, note)?;
        let tile_error = |e: TileError| StoreError::Tiles(Box::new(e));
        let Some(head) = read_head(self.objects.as_ref(), &self.layout, &self.verifier).map_err(tile_error)? else {
            return Ok(());
        };
        if head.size != size {
            tracing::info!(size, current = head.size, "the checkpoint moved on before its cosignatures were published");
            return Ok(());
        }
        if !super::sqlite::adds_only_signatures(&head.note, note) {
            return Err(StoreError::NotSameCheckpoint { size });
        }
        match self.objects.put(&self.layout.checkpoint(), note.as_bytes(), PutCondition::IfMatch(head.etag)) {
            Ok(_) => Ok(()),
            Err(ObjectError::PreconditionFailed { .. }) => {
                tracing::info!(size, "the checkpoint changed before its cosignatures were published");
                Ok(())
            }
            Err(e) => Err(tile_error(e.into())),
        }
    }
    fn ledger_key(&self) -> Result<Option<String>, StoreError> {
        self.cache.ledger_key()
    }
    fn query(&self, query: &Query) -> Result<Vec<Entry>, StoreError> {
        self.cache.query(query)
    }
    fn scan_entries(&self, f: &mut dyn FnMut(Result<Entry, StoreError>) -> bool) -> Result<(), StoreError> {
        self.cache.scan_entries(f)
    }
    fn tree_node_count(&self) -> Result<u64, StoreError> {
        self.cache.tree_node_count()
    }
    fn read_snapshot(&self) -> Result<super::ReadSnapshot<'_>, StoreError> {
        self.cache.read_snapshot()
    }
}

/// The cache file an appender keeps in `dir`.
pub fn cache_file(dir: &Path) -> Cache {
    Cache::File(dir.join(CACHE_FILE))
}

/// Name of an appender's cache file.
pub const CACHE_FILE: &str = "ledger-cache.sqlite";

#[cfg(test)]
mod tests;
