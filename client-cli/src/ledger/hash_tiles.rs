//! Consistency proofs from a deployment's hash tiles (`tile/<L>/<N>[.p/<W>]` in the ledger
//! bucket, docs/protocol.md §8.10): what a tenant needs to check a job's checkpoint against the
//! one it saw before, without the ledger's entries (`tile/entries/`, every tenant's receipts).
//!
//! Nothing read here is trusted: a proof computed from altered tiles does not verify against the
//! two signed roots, and the check that asked for it refuses (`consistency`).

use std::collections::HashMap;
use std::sync::Mutex;

use cloud::{ObjectError, ObjectStore};
use receipts_ledger::merkle::{Hash, NodeId, TreeReadError, TreeReader, consistency_proof, node_hash};
use receipts_ledger::store::tiles::layout::{Layout, TILE_HEIGHT, TILE_WIDTH, TileId};

/// The complete subtrees of the tree of `size` leaves, read from its published hash tiles (each
/// tile fetched once).
pub struct HashTiles<'a> {
    objects: &'a dyn ObjectStore,
    layout: Layout,
    size: u64,
    tiles: Mutex<HashMap<TileId, Vec<Hash>>>,
}

impl<'a> HashTiles<'a> {
    pub fn new(objects: &'a dyn ObjectStore, prefix: &str, size: u64) -> Self {
        Self { objects, layout: Layout::new(prefix), size, tiles: Mutex::new(HashMap::new()) }
    }

    /// The hashes of tile `(level, index)` as published for a tree of `self.size` leaves.
    fn tile(&self, level: u8, index: u64) -> Result<Vec<Hash>, TreeReadError> {
        let hashes = self.size >> (u32::from(level) * u32::from(TILE_HEIGHT));
        let width = hashes.saturating_sub(index * TILE_WIDTH).min(TILE_WIDTH);
        if width == 0 {
            return Err(TreeReadError::Missing(NodeId::new(level * TILE_HEIGHT, index * TILE_WIDTH)));
        }
        let id = TileId { level, index, width: width as u16 };
        let mut tiles = self.tiles.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tile) = tiles.get(&id) {
            return Ok(tile.clone());
        }
        let key = self.layout.tile(id);
        let bytes = self.objects.get_at_most(&key, width * 32).map_err(|e| match e {
            ObjectError::NotFound { .. } => TreeReadError::Backend(format!("{key} is not published")),
            e => TreeReadError::Backend(format!("{key}: {e}")),
        })?;
        if bytes.len() as u64 != width * 32 {
            return Err(TreeReadError::Backend(format!("{key} holds {} bytes, not {} hashes", bytes.len(), width)));
        }
        let tile: Vec<Hash> = bytes.chunks_exact(32).map(|c| c.try_into().expect("32 bytes")).collect();
        tiles.insert(id, tile.clone());
        Ok(tile)
    }

    fn node(&self, id: NodeId) -> Result<Hash, TreeReadError> {
        if id.level >= 64 || (id.index.checked_add(1).and_then(|n| n.checked_shl(u32::from(id.level)))).is_none_or(|end| end > self.size) {
            return Err(TreeReadError::Missing(id));
        }
        // The node is the root of 2^r hashes of tile level L, all in one tile.
        let (level, r) = (id.level / TILE_HEIGHT, id.level % TILE_HEIGHT);
        let first = id.index << r;
        let tile = self.tile(level, first / TILE_WIDTH)?;
        let start = (first % TILE_WIDTH) as usize;
        let mut row: Vec<Hash> = tile.get(start..start + (1usize << r)).ok_or(TreeReadError::Missing(id))?.to_vec();
        while row.len() > 1 {
            row = row.chunks_exact(2).map(|pair| node_hash(&pair[0], &pair[1])).collect();
        }
        Ok(row[0])
    }
}

impl TreeReader for HashTiles<'_> {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        ids.iter().map(|id| self.node(*id)).collect()
    }
}

/// The consistency proof from tree size `old` to `new` (a signed size of the ledger), computed
/// from the hash tiles of the ledger under `prefix` in `objects`.
pub fn tiles_consistency(objects: &dyn ObjectStore, prefix: &str, old: u64, new: u64) -> Result<Vec<Hash>, String> {
    consistency_proof(&HashTiles::new(objects, prefix, new), old, new).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use cloud_local::DirObjectStore;
    use receipts_ledger::merkle::{root_at, verify_consistency};
    use receipts_ledger::store::tiles::{Cache, TileOptions, TileStore};
    use receipts_ledger::testing::{TestReceipts, test_request};
    use receipts_ledger::{CheckpointPolicy, Ledger, SignerKey};

    /// Proofs from the tiles equal the appender's own, across tile edges and partial tiles.
    #[test]
    fn proofs_from_hash_tiles_are_the_ledgers() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path()).unwrap());
        let signer = SignerKey::from_seed("ledger.example/tiles", &[9; 32]).unwrap();
        let store = TileStore::open(bucket.clone(), Layout::new(""), Cache::Memory, signer.verifier(), TileOptions::appender())
            .unwrap()
            .with_leaves(Arc::new(TestReceipts));
        let mut ledger = Ledger::new(store, Box::new(TestReceipts), Box::new(signer), CheckpointPolicy::default());
        let mut sizes = Vec::new();
        let mut j = 0;
        for batch in [1u64, 2, 5, 120, 128, 3, 300] {
            let requests: Vec<_> = (j..j + batch).map(|i| test_request(i, 64)).collect();
            ledger.append_batch(&requests, 1 + j).unwrap();
            j += batch;
            sizes.push(j);
        }
        let store = ledger.store();
        for (a, &old) in sizes.iter().enumerate() {
            for &new in &sizes[a..] {
                let proof = tiles_consistency(bucket.as_ref(), "", old, new).unwrap();
                assert_eq!(proof, receipts_ledger::consistency(store, old, new).unwrap(), "{old} -> {new}");
                verify_consistency(old, new, &root_at(store, old).unwrap(), &root_at(store, new).unwrap(), &proof).unwrap();
            }
        }
        // A size the ledger never had has no partial tiles: no proof.
        assert!(tiles_consistency(bucket.as_ref(), "", 2, 7).is_err());
    }
}
