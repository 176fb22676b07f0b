//! An auditor's side: a local SQLite copy brought up to the store's checkpoint ([`sync`]),
//! and a check of every published tile, bundle and metadata record against that copy
//! ([`audit`]).
//!
//! The copy only ever grows: new entries are added on top of the ones it holds and must
//! reach the new checkpoint's signed root, which proves the new tree extends the old one.
//! A store whose history was rewritten since the last sync fails here instead of replacing
//! the copy.

use super::bundle::{self, EntryMeta};
use super::layout::{TileId, TileKey};
use super::{tile_bytes, AlteredMetadata, Head, TileError, TileStore};
use crate::merkle::Hash;
use crate::store::{LedgerStore, SqliteStore};

/// What a sync did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SyncReport {
    /// Entries before and after.
    pub from: u64,
    pub size: u64,
    /// Hex root of the checkpoint synced to (none for an empty store).
    pub root: Option<String>,
    pub checkpoints: u64,
    /// Metadata found to differ from its receipts during this sync (ignored, alarmed).
    pub altered_metadata: Vec<AlteredMetadata>,
}

/// Brings `store`'s cache (an auditor's copy: [`super::TileOptions::auditor`]) up to the
/// store's current checkpoint.
pub fn sync(store: &mut TileStore) -> Result<SyncReport, TileError> {
    let from = store.cache.size()?;
    let seen = store.altered.len();
    let head: Option<Head> = store.refresh()?;
    // The size and the checkpoint count of one moment (another sync of this copy may commit).
    let snapshot = store.cache.read_snapshot()?;
    let (size, checkpoints) = (store.cache.size()?, store.cache.checkpoints()?.len() as u64);
    drop(snapshot);
    Ok(SyncReport {
        from,
        size,
        root: head.map(|h| hex::encode(h.root)),
        checkpoints,
        altered_metadata: store.altered.get(seen..).unwrap_or_default().to_vec(),
    })
}

/// One object that does not match the ledger.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AuditProblem {
    pub key: String,
    pub problem: String,
}

/// What an audit looked at.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditReport {
    pub hash_tiles: u64,
    pub entry_bundles: u64,
    pub meta_bundles: u64,
    /// Objects past the copy's tree size (published after the sync): not checked.
    pub beyond: u64,
    pub problems: Vec<AuditProblem>,
}

impl AuditReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Compares every object under `tile/` and `ephem/meta/` with the copy in `store`'s cache:
/// hash tiles with the rebuilt tree, entry bundles with the receipts, metadata with the
/// index. Superseded partial tiles are checked too: each was once served for a checkpoint.
pub fn audit(store: &TileStore) -> Result<AuditReport, TileError> {
    let cache = &store.cache;
    // Every object is compared with one moment of the copy.
    let _snapshot = cache.read_snapshot()?;
    let size = cache.size()?;
    let layout = &store.layout;
    let objects = store.objects.as_ref();
    let mut report = AuditReport::default();
    let problem = |report: &mut AuditReport, key: &str, text: String| {
        report.problems.push(AuditProblem { key: key.to_owned(), problem: text });
    };
    for meta in objects.list(&layout.tiles_prefix())? {
        let key = meta.key;
        let Some(parsed) = layout.parse_tile_key(&key) else {
            problem(&mut report, &key, "not a tlog-tiles name".into());
            continue;
        };
        let t = match parsed {
            TileKey::Hashes(t) | TileKey::Entries(t) => t,
        };
        if !within(t, size) {
            report.beyond += 1;
            continue;
        }
        let found = objects.get(&key)?;
        match parsed {
            TileKey::Hashes(t) => {
                report.hash_tiles += 1;
                if found != tile_bytes(cache, t)? {
                    problem(&mut report, &key, format!("hashes differ from the ledger's level-{} tile {}", t.level, t.index));
                }
            }
            TileKey::Entries(t) => {
                report.entry_bundles += 1;
                let leaves: Vec<Vec<u8>> = entries(cache, t)?.into_iter().map(|e| e.leaf).collect();
                let expected = bundle::encode_entries(leaves.iter().enumerate().map(|(i, l)| (t.first() + i as u64, l.as_slice())))
                    .map_err(|error| TileError::Format { key: key.clone(), error })?;
                if found != expected {
                    problem(&mut report, &key, format!("receipts differ from entries {}..{}", t.first(), t.first() + u64::from(t.width)));
                }
            }
        }
    }
    for meta in objects.list(&format!("{}ephem/meta/", layout.prefix()))? {
        let key = meta.key;
        // Metadata bundles share the entry bundles' coordinates.
        let entries_key = format!("{}tile/entries/{}", layout.prefix(), &key[format!("{}ephem/meta/", layout.prefix()).len()..]);
        let Some(TileKey::Entries(t)) = layout.parse_tile_key(&entries_key) else {
            problem(&mut report, &key, "not a metadata bundle name".into());
            continue;
        };
        if !within(t, size) {
            report.beyond += 1;
            continue;
        }
        report.meta_bundles += 1;
        let expected: Vec<EntryMeta> = entries(cache, t)?.iter().map(EntryMeta::of).collect();
        match bundle::decode_meta(&objects.get(&key)?, t.first(), usize::from(t.width)) {
            Ok(found) if found == expected => {}
            Ok(_) => problem(&mut report, &key, "metadata differs from the ledger's index".into()),
            Err(e) => problem(&mut report, &key, e.to_string()),
        }
    }
    Ok(report)
}

/// Whether a tree of `size` leaves has all the hashes of tile `t`.
fn within(t: TileId, size: u64) -> bool {
    let hashes = size >> u32::from(t.tree_level());
    t.first() + u64::from(t.width) <= hashes
}

fn entries(cache: &SqliteStore, t: TileId) -> Result<Vec<crate::entry::Entry>, TileError> {
    (t.first()..t.first() + u64::from(t.width))
        .map(|i| {
            cache.entry(i)?.ok_or_else(|| {
                TileError::Store(crate::store::StoreError::CorruptRow { table: "entries", index: i as i64, what: "missing" })
            })
        })
        .collect()
}

/// The root of `store`'s copy at its size, for reports.
pub fn copy_root(store: &TileStore) -> Result<Hash, TileError> {
    Ok(crate::merkle::root_at(&store.cache, store.cache.size()?)?)
}
