//! An in-memory tree of complete-subtree hashes (tests, tools, replay).

use super::{completed_by_append, leaf_hash, node_hash, Hash, NodeId, TreeReadError, TreeReader};

/// Keeps every complete subtree hash, level by level.
#[derive(Clone, Debug, Default)]
pub struct MemoryTree {
    levels: Vec<Vec<Hash>>,
}

impl MemoryTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of leaves.
    pub fn size(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// Appends a leaf entry (hashed with [`leaf_hash`]).
    pub fn push(&mut self, entry: &[u8]) {
        self.push_leaf_hash(leaf_hash(entry));
    }

    /// Appends an already hashed leaf and stores every subtree it completes.
    pub fn push_leaf_hash(&mut self, hash: Hash) {
        let index = self.size();
        self.set(NodeId::new(0, index), hash);
        for (id, left, right) in completed_by_append(index) {
            let h = node_hash(&self.get(left).expect("left sibling stored"), &self.get(right).expect("stored"));
            self.set(id, h);
        }
    }

    fn get(&self, id: NodeId) -> Option<Hash> {
        self.levels.get(id.level as usize)?.get(usize::try_from(id.index).ok()?).copied()
    }

    fn set(&mut self, id: NodeId, hash: Hash) {
        let level = id.level as usize;
        if self.levels.len() <= level {
            self.levels.resize(level + 1, Vec::new());
        }
        debug_assert_eq!(self.levels[level].len() as u64, id.index);
        self.levels[level].push(hash);
    }
}

impl TreeReader for MemoryTree {
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError> {
        ids.iter().map(|&id| self.get(id).ok_or(TreeReadError::Missing(id))).collect()
    }
}
