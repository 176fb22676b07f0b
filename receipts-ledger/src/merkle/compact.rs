//! A compact range: the O(log n) complete-subtree hashes covering leaves
//! `[0, n)`, enough to compute the root and extend the tree by one leaf.
//! Used to replay a ledger without storing its tree.

use super::{node_hash, Hash, NodeId, EMPTY_ROOT};

#[derive(Clone, Debug, Default)]
pub struct CompactRange {
    size: u64,
    /// Hashes of the complete subtrees of the binary decomposition of
    /// `size`, largest (leftmost) first.
    stack: Vec<Hash>,
}

impl CompactRange {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf hash; calls `completed` for every complete subtree the
    /// leaf completes (the leaf itself at level 0 first, then its parents).
    pub fn push(&mut self, leaf: Hash, mut completed: impl FnMut(NodeId, &Hash)) {
        let index = self.size;
        completed(NodeId::new(0, index), &leaf);
        let mut h = leaf;
        let mut level = 0u8;
        while (index >> level) & 1 == 1 {
            let left = self.stack.pop().expect("a set bit has a subtree on the stack");
            h = node_hash(&left, &h);
            level += 1;
            completed(NodeId::new(level, index >> level), &h);
        }
        self.stack.push(h);
        self.size += 1;
    }

    /// The RFC 9162 root of the leaves pushed so far.
    pub fn root(&self) -> Hash {
        match self.stack.split_last() {
            None => EMPTY_ROOT,
            Some((last, rest)) => rest.iter().rev().fold(*last, |acc, h| node_hash(h, &acc)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::{fixtures, leaf_hash, root_at, MemoryTree, TreeReader};

    #[test]
    fn roots_match_tree8_and_stored_nodes() {
        let t8 = fixtures::tree8();
        let mut c = CompactRange::new();
        let mut m = MemoryTree::new();
        assert_eq!(c.root(), t8.roots[0]);
        for (i, input) in t8.inputs.iter().enumerate() {
            m.push(input);
            c.push(leaf_hash(input), |id, h| assert_eq!(m.node_hashes(&[id]).unwrap()[0], *h));
            assert_eq!(c.root(), t8.roots[i + 1]);
        }
        let mut m = MemoryTree::new();
        let mut c = CompactRange::new();
        for i in 0..100u32 {
            m.push(&i.to_le_bytes());
            c.push(leaf_hash(&i.to_le_bytes()), |_, _| {});
            assert_eq!(c.root(), root_at(&m, c.size()).unwrap());
        }
    }
}
