//! The SQLite ledger store: WAL, one writer at a time (`BEGIN IMMEDIATE`),
//! every append batch one transaction.

use protocol::JobId;

#[cfg(test)]
use super::expected_tree_nodes;
use super::{
    AppendOutcome, CheckpointPolicy, LedgerStore, Query, ReadSnapshot, StoreError, StoredCheckpoint,
};
use crate::checkpoint::Checkpoint;
use crate::entry::{
    EntryKind,
    attestation_sha256, entry_hash, AppendRequest, Entry, IndexedFields, GENESIS_PREV_HASH, MAX_ATTESTATION_SIZE,
    MAX_LEAF_SIZE,
};
use crate::merkle::{completed_by_append, leaf_hash, node_hash, root_at, Hash, NodeId, TreeReadError, TreeReader};
use crate::note::{Note, NoteSigner};
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// 2 added `entries.policy` (the id of the attestation policy the appender enforced; NULL for
/// rows appended before, or without an allow-list); 3 added `entries.kind` (`job` or `usage`,
/// every older row a job's). An older file is migrated when opened for writing and read as it is.
const SCHEMA_VERSION: &str = "3";
const SCHEMA_VERSION_2: &str = "2";
const SCHEMA_VERSION_1: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attestation_documents (
  sha256   BLOB PRIMARY KEY CHECK (length(sha256) = 32),
  document BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
  idx                INTEGER PRIMARY KEY CHECK (idx >= 0),
  job_id             TEXT NOT NULL UNIQUE,
  model_id           TEXT NOT NULL,
  manifest_hash      TEXT NOT NULL,
  pcr0               TEXT NOT NULL,
  client_key_id      TEXT NOT NULL,
  start_ms           INTEGER NOT NULL,
  end_ms             INTEGER NOT NULL,
  ok_count           INTEGER NOT NULL,
  failed_count       INTEGER NOT NULL,
  leaf               BLOB NOT NULL,
  attestation_sha256 BLOB NOT NULL REFERENCES attestation_documents (sha256),
  prev_hash          BLOB NOT NULL,
  entry_hash         BLOB NOT NULL,
  appended_ms        INTEGER NOT NULL,
  policy             TEXT,
  kind               TEXT NOT NULL DEFAULT 'job' CHECK (kind IN ('job', 'usage'))
);
CREATE INDEX IF NOT EXISTS entries_by_model  ON entries (model_id, end_ms);
CREATE INDEX IF NOT EXISTS entries_by_pcr0   ON entries (pcr0, end_ms);
CREATE INDEX IF NOT EXISTS entries_by_client ON entries (client_key_id, end_ms);
CREATE INDEX IF NOT EXISTS entries_by_end    ON entries (end_ms);
CREATE TABLE IF NOT EXISTS tree_nodes (
  level INTEGER NOT NULL CHECK (level BETWEEN 0 AND 63),
  idx   INTEGER NOT NULL CHECK (idx >= 0),
  hash  BLOB NOT NULL CHECK (length(hash) = 32),
  PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
  tree_size  INTEGER PRIMARY KEY CHECK (tree_size > 0),
  root       BLOB NOT NULL CHECK (length(root) = 32),
  note       TEXT NOT NULL,
  created_ms INTEGER NOT NULL
);
";

const ENTRY_COLUMNS: &str = "idx, job_id, model_id, manifest_hash, pcr0, client_key_id, start_ms, end_ms, \
     ok_count, failed_count, leaf, attestation_sha256, prev_hash, entry_hash, appended_ms, policy, kind";
/// The same, from a version 2 file opened read-only.
const ENTRY_COLUMNS_V2: &str = "idx, job_id, model_id, manifest_hash, pcr0, client_key_id, start_ms, end_ms, \
     ok_count, failed_count, leaf, attestation_sha256, prev_hash, entry_hash, appended_ms, policy, 'job' AS kind";
/// The same, from a version 1 file opened read-only.
const ENTRY_COLUMNS_V1: &str = "idx, job_id, model_id, manifest_hash, pcr0, client_key_id, start_ms, end_ms, \
     ok_count, failed_count, leaf, attestation_sha256, prev_hash, entry_hash, appended_ms, NULL AS policy, \
     'job' AS kind";

/// How the database is opened.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// `PRAGMA synchronous=FULL` (durable once `append` returns) when true,
    /// `NORMAL` (may lose the last commits on power loss, never tears) when false.
    pub synchronous_full: bool,
    /// How long a writer waits for another writer's transaction.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self { synchronous_full: true, busy_timeout: Duration::from_secs(30) }
    }
}

/// A ledger in one SQLite file.
pub struct SqliteStore {
    conn: Connection,
    /// What selects an entry row ([`ENTRY_COLUMNS`], or [`ENTRY_COLUMNS_V1`] read-only).
    columns: &'static str,
}

fn to_i64(what: &'static str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::IntegerRange { what, value: v })
}

fn hash_col(row: &Row<'_>, col: &str, table: &'static str, index: i64) -> Result<Hash, StoreError> {
    let v: Vec<u8> = row.get(col)?;
    v.try_into().map_err(|_| StoreError::CorruptRow { table, index, what: "a hash column is not 32 bytes" })
}

fn u64_col(row: &Row<'_>, col: &str, table: &'static str, index: i64) -> Result<u64, StoreError> {
    let v: i64 = row.get(col)?;
    u64::try_from(v).map_err(|_| StoreError::CorruptRow { table, index, what: "an integer column is negative" })
}

fn entry_from_row(row: &Row<'_>) -> Result<Entry, StoreError> {
    let idx: i64 = row.get("idx")?;
    let t = "entries";
    Ok(Entry {
        index: u64::try_from(idx).map_err(|_| StoreError::CorruptRow { table: t, index: idx, what: "negative index" })?,
        leaf: row.get("leaf")?,
        fields: IndexedFields {
            kind: EntryKind::parse(&row.get::<_, String>("kind")?)
                .ok_or(StoreError::CorruptRow { table: t, index: idx, what: "kind is neither job nor usage" })?,
            job_id: row
                .get::<_, String>("job_id")?
                .parse()
                .map_err(|_| StoreError::CorruptRow { table: t, index: idx, what: "job_id is not a job id" })?,
            model_id: row.get("model_id")?,
            manifest_hash: row.get("manifest_hash")?,
            pcr0: row.get("pcr0")?,
            client_key_id: row.get("client_key_id")?,
            start_ms: u64_col(row, "start_ms", t, idx)?,
            end_ms: u64_col(row, "end_ms", t, idx)?,
            ok_count: u64_col(row, "ok_count", t, idx)?,
            failed_count: u64_col(row, "failed_count", t, idx)?,
            policy: row.get("policy")?,
        },
        attestation_sha256: hash_col(row, "attestation_sha256", t, idx)?,
        prev_hash: hash_col(row, "prev_hash", t, idx)?,
        entry_hash: hash_col(row, "entry_hash", t, idx)?,
        appended_ms: u64_col(row, "appended_ms", t, idx)?,
    })
}

fn checkpoint_from_row(row: &Row<'_>) -> Result<StoredCheckpoint, StoreError> {
    let size: i64 = row.get("tree_size")?;
    let t = "checkpoints";
    Ok(StoredCheckpoint {
        size: u64::try_from(size).map_err(|_| StoreError::CorruptRow { table: t, index: size, what: "negative size" })?,
        root: hash_col(row, "root", t, size)?,
        note: row.get("note")?,
        created_ms: u64_col(row, "created_ms", t, size)?,
    })
}

/// Tree node lookups on a connection (inside or outside a transaction).
struct SqlTree<'c>(&'c Connection);

impl TreeReader for SqlTree<'_> {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        let backend = |e: rusqlite::Error| TreeReadError::Backend(e.to_string());
        let mut stmt = self.0.prepare_cached("SELECT hash FROM tree_nodes WHERE level = ?1 AND idx = ?2").map_err(backend)?;
        ids.iter()
            .map(|&id| {
                let idx = i64::try_from(id.index).map_err(|_| TreeReadError::Missing(id))?;
                let v: Option<Vec<u8>> =
                    stmt.query_row(params![id.level, idx], |r| r.get(0)).optional().map_err(backend)?;
                let v = v.ok_or(TreeReadError::Missing(id))?;
                v.try_into().map_err(|_| TreeReadError::Backend(format!("tree node {id:?} is not 32 bytes")))
            })
            .collect()
    }
}

fn meta(conn: &Connection, key: &str) -> Result<Option<String>, StoreError> {
    Ok(conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
}

fn tip(tx: &Connection) -> Result<(u64, Hash), StoreError> {
    let last = tx
        .query_row("SELECT idx, entry_hash FROM entries ORDER BY idx DESC LIMIT 1", [], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
        })
        .optional()?;
    match last {
        None => Ok((0, GENESIS_PREV_HASH)),
        Some((idx, h)) => {
            let bad = |what| StoreError::CorruptRow { table: "entries", index: idx, what };
            let next = u64::try_from(idx).map_err(|_| bad("negative index"))? + 1;
            Ok((next, h.try_into().map_err(|_| bad("entry_hash is not 32 bytes"))?))
        }
    }
}

/// Records the signer's key on first use; refuses another key later.
fn bind_key(tx: &Connection, signer: &dyn NoteSigner) -> Result<(), StoreError> {
    let given = signer.verifier().to_string();
    match meta(tx, "ledger_key")? {
        Some(stored) if stored != given => Err(StoreError::KeyMismatch { stored, given }),
        Some(_) => Ok(()),
        None => {
            tx.execute("INSERT INTO meta (key, value) VALUES ('ledger_key', ?1)", [&given])?;
            Ok(())
        }
    }
}

fn latest_checkpoint(conn: &Connection) -> Result<Option<StoredCheckpoint>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT * FROM checkpoints ORDER BY tree_size DESC LIMIT 1")?;
    let mut rows = stmt.query([])?;
    match rows.next()? {
        Some(r) => Ok(Some(checkpoint_from_row(r)?)),
        None => Ok(None),
    }
}

/// Signs and stores a checkpoint of the current tree if due.
fn checkpoint_in(
    tx: &Connection,
    signer: &dyn NoteSigner,
    policy: &CheckpointPolicy,
    now_ms: u64,
    force: bool,
) -> Result<Option<StoredCheckpoint>, StoreError> {
    let (size, _) = tip(tx)?;
    if size == 0 {
        return Ok(None);
    }
    let last = latest_checkpoint(tx)?;
    let first_ms: i64 = tx.query_row("SELECT appended_ms FROM entries ORDER BY idx LIMIT 1", [], |r| r.get(0))?;
    let due = match &last {
        Some(cp) if force => size > cp.size,
        None if force => true,
        _ => policy.due(size, last.as_ref().map(|c| (c.size, c.created_ms)), first_ms.max(0) as u64, now_ms),
    };
    if !due {
        return Ok(None);
    }
    bind_key(tx, signer)?;
    let root = root_at(&SqlTree(tx), size)?;
    let note = Checkpoint::new(signer.key_name(), size, root).sign(signer)?;
    tx.execute(
        "INSERT INTO checkpoints (tree_size, root, note, created_ms) VALUES (?1, ?2, ?3, ?4)",
        params![to_i64("tree size", size)?, &root[..], &note, to_i64("now_ms", now_ms)?],
    )?;
    Ok(Some(StoredCheckpoint { size, root, note, created_ms: now_ms }))
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger at `path`. Opening is tried again while another
    /// process holds the file (up to the busy timeout): switching a new file to WAL needs a moment
    /// of exclusive access, and SQLite answers "locked" at once there instead of waiting in the
    /// busy handler, so several processes opening one new ledger would otherwise fail.
    pub fn open(path: &Path, options: &SqliteOptions) -> Result<Self, StoreError> {
        let deadline = std::time::Instant::now() + options.busy_timeout;
        loop {
            match Self::open_once(path, options) {
                Err(StoreError::Sqlite(e)) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn open_once(path: &Path, options: &SqliteOptions) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(options.busy_timeout)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
            return Err(StoreError::NotWal { mode });
        }
        conn.pragma_update(None, "synchronous", if options.synchronous_full { "FULL" } else { "NORMAL" })?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let store = Self { conn, columns: ENTRY_COLUMNS };
        store.init_schema()?;
        Ok(store)
    }

    /// Opens an existing ledger read-only (queries, proofs, verification);
    /// appends fail.
    pub fn open_read_only(path: &Path, options: &SqliteOptions) -> Result<Self, StoreError> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(options.busy_timeout)?;
        let columns = match meta(&conn, "schema_version")?.unwrap_or_default() {
            v if v == SCHEMA_VERSION => ENTRY_COLUMNS,
            v if v == SCHEMA_VERSION_2 => ENTRY_COLUMNS_V2,
            v if v == SCHEMA_VERSION_1 => ENTRY_COLUMNS_V1,
            found => return Err(StoreError::SchemaVersion { found, want: SCHEMA_VERSION }),
        };
        Ok(Self { conn, columns })
    }

    /// An in-memory ledger (tests and tools).
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let conn = Connection::open_in_memory()?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let store = Self { conn, columns: ENTRY_COLUMNS };
        store.init_schema()?;
        Ok(store)
    }

    fn init_schema(&self) -> Result<(), StoreError> {
        let tx = self.write_txn()?;
        tx.execute_batch(SCHEMA)?;
        tx.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?1)", [SCHEMA_VERSION])?;
        // Same transaction as the version bump: a crash leaves the old version, unchanged.
        if meta(&tx, "schema_version")?.as_deref() == Some(SCHEMA_VERSION_1) {
            tx.execute_batch("ALTER TABLE entries ADD COLUMN policy TEXT")?;
            tx.execute("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", [SCHEMA_VERSION_2])?;
        }
        if meta(&tx, "schema_version")?.as_deref() == Some(SCHEMA_VERSION_2) {
            tx.execute_batch(
                "ALTER TABLE entries ADD COLUMN kind TEXT NOT NULL DEFAULT 'job' CHECK (kind IN ('job', 'usage'))",
            )?;
            tx.execute("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", [SCHEMA_VERSION])?;
        }
        let found = meta(&tx, "schema_version")?.unwrap_or_default();
        if found != SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion { found, want: SCHEMA_VERSION });
        }
        tx.commit()?;
        Ok(())
    }

    /// `BEGIN IMMEDIATE`: takes the write lock up front, so two writers
    /// never both read the same chain tip.
    fn write_txn(&self) -> Result<Transaction<'_>, StoreError> {
        Ok(Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)?)
    }

    /// The underlying connection, for read-only tools and tests.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    fn append_one(tx: &Connection, req: &AppendRequest, now_ms: u64, next: &mut (u64, Hash)) -> Result<AppendOutcome, StoreError> {
        req.fields.validate()?;
        if req.leaf.len() > MAX_LEAF_SIZE {
            return Err(StoreError::TooLarge { what: "receipt", size: req.leaf.len(), max: MAX_LEAF_SIZE });
        }
        if req.attestation_document.len() > MAX_ATTESTATION_SIZE {
            return Err(StoreError::TooLarge {
                what: "attestation document",
                size: req.attestation_document.len(),
                max: MAX_ATTESTATION_SIZE,
            });
        }
        let existing = tx
            .prepare_cached("SELECT idx, leaf FROM entries WHERE job_id = ?1")?
            .query_row([req.fields.job_id.to_hex()], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
            .optional()?;
        if let Some((idx, leaf)) = existing {
            return Ok(AppendOutcome::Existing { index: idx.max(0) as u64, same_leaf: leaf == req.leaf });
        }
        let (index, prev) = *next;
        let att = attestation_sha256(&req.attestation_document);
        tx.prepare_cached("INSERT OR IGNORE INTO attestation_documents (sha256, document) VALUES (?1, ?2)")?
            .execute(params![&att[..], &req.attestation_document])?;
        let lh = leaf_hash(&req.leaf);
        let eh = entry_hash(index, &prev, &lh, &att);
        let f = &req.fields;
        tx.prepare_cached(
            "INSERT INTO entries (idx, job_id, model_id, manifest_hash, pcr0, client_key_id, start_ms, end_ms, \
             ok_count, failed_count, leaf, attestation_sha256, prev_hash, entry_hash, appended_ms, policy, kind) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
        )?
        .execute(params![
            to_i64("index", index)?,
            f.job_id.to_hex(),
            f.model_id,
            f.manifest_hash,
            f.pcr0,
            f.client_key_id,
            to_i64("start_ms", f.start_ms)?,
            to_i64("end_ms", f.end_ms)?,
            to_i64("ok_count", f.ok_count)?,
            to_i64("failed_count", f.failed_count)?,
            req.leaf,
            &att[..],
            &prev[..],
            &eh[..],
            to_i64("now_ms", now_ms)?,
            f.policy,
            f.kind.as_str(),
        ])?;
        let mut insert = tx.prepare_cached("INSERT INTO tree_nodes (level, idx, hash) VALUES (?1, ?2, ?3)")?;
        insert.execute(params![0u8, to_i64("index", index)?, &lh[..]])?;
        let mut right = lh;
        for (id, left, _) in completed_by_append(index) {
            let l = SqlTree(tx).node_hashes(&[left])?[0];
            right = node_hash(&l, &right);
            insert.execute(params![id.level, to_i64("node index", id.index)?, &right[..]])?;
        }
        *next = (index + 1, eh);
        Ok(AppendOutcome::Appended { index, entry_hash: eh, checkpoint: None })
    }
}

/// An append that is written but not yet committed: what [`SqliteStore::append_publishing`]
/// shows the caller before it decides whether the transaction commits.
pub struct Pending<'t> {
    tx: &'t Connection,
    /// Tree size before the batch.
    pub from: u64,
    /// Tree size after it.
    pub to: u64,
    /// The checkpoint of the new tree, signed inside the transaction.
    pub checkpoint: StoredCheckpoint,
}

impl Pending<'_> {
    /// An entry, as the transaction sees it (old or new).
    pub fn entry(&self, index: u64) -> Result<Entry, StoreError> {
        let mut stmt = self.tx.prepare_cached(&format!("SELECT {ENTRY_COLUMNS} FROM entries WHERE idx = ?1"))?;
        let mut rows = stmt.query([to_i64("index", index)?])?;
        match rows.next()? {
            Some(row) => entry_from_row(row),
            None => Err(StoreError::CorruptRow { table: "entries", index: index as i64, what: "missing inside the tree" }),
        }
    }

    pub fn attestation_document(&self, sha256: &Hash) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .tx
            .prepare_cached("SELECT document FROM attestation_documents WHERE sha256 = ?1")?
            .query_row([&sha256[..]], |r| r.get(0))
            .optional()?)
    }
}

impl TreeReader for Pending<'_> {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        SqlTree(self.tx).node_hashes(ids)
    }
}

/// An entry copied from another copy of the ledger (the object store): the leaf, the fields
/// and the document as they were appended, and the chain hash the copy claims.
#[derive(Clone, Debug)]
pub struct ImportedEntry {
    pub request: AppendRequest,
    pub appended_ms: u64,
    pub entry_hash: Hash,
}

impl SqliteStore {
    /// Appends `batch` and signs a checkpoint of the new tree inside one write transaction,
    /// then lets `publish` see the result: the transaction commits if `publish` returns
    /// `Ok(true)` and rolls back otherwise (`Ok(None)` for `Ok(false)`). A batch that adds
    /// nothing (every job already present) commits without calling `publish`.
    ///
    /// This is how a copy elsewhere (the tiles in an object store) stays the source of truth:
    /// the local rows exist only if the remote commit happened.
    pub fn append_publishing<E: From<StoreError>>(
        &mut self,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        now_ms: u64,
        publish: impl FnOnce(&Pending<'_>) -> Result<bool, E>,
    ) -> Result<Option<Vec<AppendOutcome>>, E> {
        let tx = self.write_txn()?;
        let mut next = tip(&tx)?;
        let from = next.0;
        let mut out = Vec::with_capacity(batch.len());
        for req in batch {
            out.push(Self::append_one(&tx, req, now_ms, &mut next)?);
        }
        if next.0 == from {
            tx.commit().map_err(StoreError::from)?;
            return Ok(Some(out));
        }
        bind_key(&tx, signer)?;
        let policy = CheckpointPolicy { every_appends: 1, every_ms: 0 };
        let checkpoint = checkpoint_in(&tx, signer, &policy, now_ms, true)?
            .ok_or(StoreError::CorruptRow { table: "checkpoints", index: next.0 as i64, what: "not signed" })?;
        if let Some(AppendOutcome::Appended { checkpoint: cp, .. }) =
            out.iter_mut().rev().find(|o| matches!(o, AppendOutcome::Appended { .. }))
        {
            *cp = Some(checkpoint.size);
        }
        let pending = Pending { tx: &tx, from, to: next.0, checkpoint };
        if !publish(&pending)? {
            return Ok(None); // dropping the transaction rolls it back
        }
        tx.commit().map_err(StoreError::from)?;
        Ok(Some(out))
    }

    /// Adds entries copied from elsewhere, starting at index `start` (the current size), and
    /// the checkpoints that cover them, in one transaction. Every chain hash must equal the
    /// one the copy claims and every checkpoint's root the rebuilt tree's, else nothing is
    /// kept. `ledger_key` is recorded as the ledger's key (it must match a recorded one).
    pub fn import(
        &mut self,
        start: u64,
        entries: &[ImportedEntry],
        checkpoints: &[StoredCheckpoint],
        ledger_key: &str,
    ) -> Result<u64, StoreError> {
        let tx = self.write_txn()?;
        let mut next = tip(&tx)?;
        if next.0 != start {
            return Err(StoreError::ImportGap { size: next.0, start });
        }
        match meta(&tx, "ledger_key")? {
            Some(stored) if stored != ledger_key => {
                return Err(StoreError::KeyMismatch { stored, given: ledger_key.to_owned() });
            }
            Some(_) => {}
            None => {
                tx.execute("INSERT INTO meta (key, value) VALUES ('ledger_key', ?1)", [ledger_key])?;
            }
        }
        let mut checkpoints = checkpoints.iter().peekable();
        for e in entries {
            let index = next.0;
            match Self::append_one(&tx, &e.request, e.appended_ms, &mut next)? {
                AppendOutcome::Appended { entry_hash, .. } if entry_hash == e.entry_hash => {}
                AppendOutcome::Appended { .. } => return Err(StoreError::ImportMismatch { index, what: "chain hash" }),
                AppendOutcome::Existing { .. } => return Err(StoreError::ImportMismatch { index, what: "duplicate job id" }),
            }
            while let Some(cp) = checkpoints.next_if(|cp| cp.size <= next.0) {
                insert_checkpoint(&tx, cp)?;
            }
        }
        for cp in checkpoints {
            insert_checkpoint(&tx, cp)?;
        }
        tx.commit()?;
        Ok(next.0)
    }
}

/// Stores a checkpoint whose root must be the tree's at its size.
fn insert_checkpoint(tx: &Connection, cp: &StoredCheckpoint) -> Result<(), StoreError> {
    let (size, _) = tip(tx)?;
    if cp.size > size {
        return Err(StoreError::ImportMismatch { index: cp.size, what: "checkpoint beyond the imported entries" });
    }
    if root_at(&SqlTree(tx), cp.size)? != cp.root {
        return Err(StoreError::ImportMismatch { index: cp.size, what: "checkpoint root" });
    }
    tx.execute(
        "INSERT OR IGNORE INTO checkpoints (tree_size, root, note, created_ms) VALUES (?1, ?2, ?3, ?4)",
        params![to_i64("tree size", cp.size)?, &cp.root[..], &cp.note, to_i64("created_ms", cp.created_ms)?],
    )?;
    Ok(())
}

impl TreeReader for SqliteStore {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        SqlTree(&self.conn).node_hashes(ids)
    }
}

impl LedgerStore for SqliteStore {
    /// Replaces the note of the checkpoint of `size` with `note`, which must be the same
    /// checkpoint text with every stored signature line and only lines added (witness
    /// cosignatures): nothing signed can change this way.
    fn add_cosignatures(&self, size: u64, note: &str) -> Result<(), StoreError> {
        let tx = self.write_txn()?;
        let stored: String = tx.query_row(
            "SELECT note FROM checkpoints WHERE tree_size = ?1",
            [to_i64("tree size", size)?],
            |r| r.get(0),
        )?;
        if !adds_only_signatures(&stored, note) {
            return Err(StoreError::NotSameCheckpoint { size });
        }
        tx.execute("UPDATE checkpoints SET note = ?2 WHERE tree_size = ?1", params![to_i64("tree size", size)?, note])?;
        tx.commit()?;
        Ok(())
    }

    fn append(
        &mut self,
        batch: &[AppendRequest],
        signer: &dyn NoteSigner,
        policy: &CheckpointPolicy,
        now_ms: u64,
    ) -> Result<Vec<AppendOutcome>, StoreError> {
        let tx = self.write_txn()?;
        let mut next = tip(&tx)?;
        let mut out = Vec::with_capacity(batch.len());
        for req in batch {
            out.push(Self::append_one(&tx, req, now_ms, &mut next)?);
        }
        if out.iter().any(|o| matches!(o, AppendOutcome::Appended { .. })) {
            bind_key(&tx, signer)?;
            if let Some(cp) = checkpoint_in(&tx, signer, policy, now_ms, false)?
                && let Some(AppendOutcome::Appended { checkpoint, .. }) =
                    out.iter_mut().rev().find(|o| matches!(o, AppendOutcome::Appended { .. }))
            {
                *checkpoint = Some(cp.size);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    fn checkpoint(
        &mut self,
        signer: &dyn NoteSigner,
        policy: &CheckpointPolicy,
        now_ms: u64,
        force: bool,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let tx = self.write_txn()?;
        let cp = checkpoint_in(&tx, signer, policy, now_ms, force)?;
        tx.commit()?;
        Ok(cp)
    }

    fn size(&self) -> Result<u64, StoreError> {
        Ok(tip(&self.conn)?.0)
    }

    fn entry(&self, index: u64) -> Result<Option<Entry>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {} FROM entries WHERE idx = ?1", self.columns))?;
        let mut rows = stmt.query([to_i64("index", index)?])?;
        rows.next()?.map(entry_from_row).transpose()
    }

    fn entry_by_job(&self, job_id: &JobId) -> Result<Option<Entry>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!("SELECT {} FROM entries WHERE job_id = ?1", self.columns))?;
        let mut rows = stmt.query([job_id.to_hex()])?;
        rows.next()?.map(entry_from_row).transpose()
    }

    fn attestation_document(&self, sha256: &Hash) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT document FROM attestation_documents WHERE sha256 = ?1")?
            .query_row([&sha256[..]], |r| r.get(0))
            .optional()?)
    }

    fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, StoreError> {
        let mut stmt = self.conn.prepare_cached("SELECT * FROM checkpoints ORDER BY tree_size")?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(checkpoint_from_row(r)?);
        }
        Ok(out)
    }

    fn latest_checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        latest_checkpoint(&self.conn)
    }

    fn checkpoint_at(&self, size: u64) -> Result<Option<StoredCheckpoint>, StoreError> {
        let mut stmt = self.conn.prepare_cached("SELECT * FROM checkpoints WHERE tree_size = ?1")?;
        let mut rows = stmt.query([to_i64("tree size", size)?])?;
        rows.next()?.map(checkpoint_from_row).transpose()
    }

    fn ledger_key(&self) -> Result<Option<String>, StoreError> {
        meta(&self.conn, "ledger_key")
    }

    fn query(&self, q: &Query) -> Result<Vec<Entry>, StoreError> {
        use rusqlite::types::Value;
        let mut sql = format!("SELECT {} FROM entries WHERE 1 = 1", self.columns);
        let mut args: Vec<Value> = Vec::new();
        for (col, v) in [
            ("job_id", &q.job_id.map(|j| j.to_hex())),
            ("model_id", &q.model_id),
            ("pcr0", &q.pcr0),
            ("client_key_id", &q.client_key_id),
            ("kind", &q.kind.map(|k| k.as_str().to_owned())),
        ] {
            if let Some(v) = v {
                args.push(Value::Text(v.clone()));
                sql.push_str(&format!(" AND {col} = ?{}", args.len()));
            }
        }
        if let Some(t) = q.since_ms {
            args.push(Value::Integer(to_i64("since_ms", t)?));
            sql.push_str(&format!(" AND end_ms >= ?{}", args.len()));
        }
        if let Some(t) = q.until_ms {
            args.push(Value::Integer(to_i64("until_ms", t)?));
            sql.push_str(&format!(" AND end_ms < ?{}", args.len()));
        }
        sql.push_str(" ORDER BY idx");
        if let Some(n) = q.limit {
            args.push(Value::Integer(to_i64("limit", n)?));
            sql.push_str(&format!(" LIMIT ?{}", args.len()));
        }
        let mut stmt = self.conn.prepare(&sql)?;
        let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(entry_from_row(r)?);
        }
        Ok(out)
    }

    fn scan_entries(&self, f: &mut dyn FnMut(Result<Entry, StoreError>) -> bool) -> Result<(), StoreError> {
        // One read transaction (the caller's, if it holds one): a consistent snapshot even
        // while others append.
        let snapshot = self.read_snapshot()?;
        {
            let mut stmt = self.conn.prepare(&format!("SELECT {} FROM entries ORDER BY idx", self.columns))?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                if !f(entry_from_row(r)) {
                    break;
                }
            }
        }
        drop(snapshot);
        Ok(())
    }

    fn read_snapshot(&self) -> Result<ReadSnapshot<'_>, StoreError> {
        ReadSnapshot::begin(&self.conn)
    }

    fn tree_node_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row("SELECT count(*) FROM tree_nodes", [], |r| r.get(0))?;
        Ok(n.max(0) as u64)
    }
}

/// `new` is the note `stored` with every signature line kept and only lines added.
pub(super) fn adds_only_signatures(stored: &str, new: &str) -> bool {
    match (Note::parse(stored.as_bytes()), Note::parse(new.as_bytes())) {
        (Ok(old), Ok(new)) => old.text == new.text && old.signatures.iter().all(|s| new.signatures.contains(s)),
        _ => false,
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

#[cfg(test)]
mod tests;
