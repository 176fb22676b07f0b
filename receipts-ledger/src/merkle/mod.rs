//! RFC 9162 Merkle tree: hashing, tree heads and proof generation from a
//! store of complete-subtree hashes.
//!
//! A *complete subtree* `(level, index)` covers leaves
//! `[index << level, (index + 1) << level)`. Every RFC 9162 subtree that a tree
//! head or a proof needs is either complete or the right edge of a tree, and a
//! right edge is the right-fold of at most 64 complete subtrees (the binary
//! digits of its size). So a store that can look up the hash of any complete
//! subtree answers every tree head and proof with O(log n) lookups, in one
//! batch ([`TreeReader::node_hashes`]).

mod compact;
mod memory;
mod proof;
mod verify;

pub use compact::CompactRange;
pub use memory::MemoryTree;
pub use proof::{
    consistency_proof, consistency_proof_plan, inclusion_proof, inclusion_proof_plan, root_at,
    root_plan, ProofError, ProofPlan,
};
pub use verify::{inclusion_root, verify_consistency, verify_inclusion, VerifyError};

use sha2::{Digest, Sha256};

/// A SHA-256 output.
pub type Hash = [u8; 32];

/// SHA-256 of the empty string: the root of the empty tree (RFC 9162 §2.1.1).
pub const EMPTY_ROOT: Hash = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

/// RFC 9162 leaf hash: `SHA-256(0x00 || entry)`.
pub fn leaf_hash(entry: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0x00]);
    h.update(entry);
    h.finalize().into()
}

/// RFC 9162 interior node hash: `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// A complete subtree: `2^level` leaves starting at leaf `index << level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId {
    pub level: u8,
    pub index: u64,
}

impl NodeId {
    pub const fn new(level: u8, index: u64) -> Self {
        Self { level, index }
    }

    /// The first leaf this subtree covers.
    pub fn first_leaf(&self) -> u64 {
        self.index << self.level
    }
}

/// Why a store could not answer a node lookup.
#[derive(Debug, thiserror::Error)]
pub enum TreeReadError {
    #[error("tree node (level {}, index {}) is not stored", .0.level, .0.index)]
    Missing(NodeId),
    #[error("tree storage failed: {0}")]
    Backend(String),
}

/// Read access to the hashes of complete subtrees. SQLite rows, S3 tiles or
/// an in-memory vector can all serve it.
pub trait TreeReader {
    /// The hash of each requested complete subtree, in request order.
    fn node_hashes(&self, ids: &[NodeId]) -> Result<Vec<Hash>, TreeReadError>;
}

/// The complete subtrees that a newly appended leaf `index` completes, from
/// level 1 upward: each is `(id, left child, right child)`, where the right
/// child of the first is the leaf itself. A writer stores the leaf hash at
/// `(0, index)` and then, in order, `node_hash(left, right)` for each.
pub fn completed_by_append(index: u64) -> impl Iterator<Item = (NodeId, NodeId, NodeId)> {
    let levels = (!index).trailing_zeros().min(63) as u8; // number of trailing one bits
    (0..levels).map(move |l| {
        let right = NodeId::new(l, index >> l);
        let left = NodeId::new(l, (index >> l) - 1);
        (NodeId::new(l + 1, index >> (l + 1)), left, right)
    })
}

/// Largest power of two strictly less than `n` (`n >= 2`).
pub(crate) fn split_point(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1u64 << (63 - (n - 1).leading_zeros())
}

#[cfg(test)]
pub(crate) mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_root_is_sha256_of_nothing() {
        assert_eq!(EMPTY_ROOT, <[u8; 32]>::from(Sha256::digest(b"")));
    }

    #[test]
    fn tree8_leaf_hashes_and_roots() {
        let t = fixtures::tree8();
        let mut tree = MemoryTree::new();
        assert_eq!(root_at(&tree, 0).unwrap(), t.roots[0]);
        for (i, input) in t.inputs.iter().enumerate() {
            assert_eq!(leaf_hash(input), t.leaf_hashes[i], "leaf {i}");
            tree.push(input);
            assert_eq!(root_at(&tree, tree.size()).unwrap(), t.roots[i + 1], "root of size {}", i + 1);
        }
        // Every smaller tree head is still answerable from the larger store.
        for n in 0..=8u64 {
            assert_eq!(root_at(&tree, n).unwrap(), t.roots[n as usize]);
        }
    }

    #[test]
    fn completed_by_append_lists_parents() {
        assert_eq!(completed_by_append(0).count(), 0);
        let v: Vec<_> = completed_by_append(3).collect();
        assert_eq!(
            v,
            vec![
                (NodeId::new(1, 1), NodeId::new(0, 2), NodeId::new(0, 3)),
                (NodeId::new(2, 0), NodeId::new(1, 0), NodeId::new(1, 1)),
            ]
        );
        assert_eq!(completed_by_append(6).count(), 0);
        assert_eq!(completed_by_append(7).count(), 3);
    }

    #[test]
    fn split_point_is_largest_power_below() {
        assert_eq!(split_point(2), 1);
        assert_eq!(split_point(3), 2);
        assert_eq!(split_point(4), 2);
        assert_eq!(split_point(5), 4);
        assert_eq!(split_point(1 << 40), 1 << 39);
        assert_eq!(split_point((1 << 40) + 1), 1 << 40);
    }
}
