//! Tree heads, inclusion proofs and consistency proofs (RFC 9162 §2.1.1,
//! §2.1.3.1, §2.1.4.1), planned as lists of complete subtrees and then read
//! from a [`TreeReader`] in one batch.

use super::{node_hash, split_point, Hash, NodeId, TreeReadError, TreeReader, EMPTY_ROOT};

/// Why a tree head or a proof could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    #[error("leaf index {index} is not below tree size {size}")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("no consistency proof from size {first} to size {second} (need 0 < first <= second)")]
    BadSizes { first: u64, second: u64 },
    #[error(transparent)]
    Read(#[from] TreeReadError),
}

/// What to read for a tree head or a proof: each element is the right-fold
/// (`node_hash(a, node_hash(b, …))`) of the listed complete subtrees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProofPlan {
    pub elements: Vec<Vec<NodeId>>,
}

impl ProofPlan {
    /// Every node to read, in plan order (duplicates are not removed).
    pub fn nodes(&self) -> Vec<NodeId> {
        self.elements.iter().flatten().copied().collect()
    }

    /// Reads the plan's nodes in one batch and folds each element.
    pub fn execute(&self, reader: &dyn TreeReader) -> Result<Vec<Hash>, TreeReadError> {
        let ids = self.nodes();
        let hashes = reader.node_hashes(&ids)?;
        if hashes.len() != ids.len() {
            return Err(TreeReadError::Backend(format!(
                "asked for {} node hashes, got {}",
                ids.len(),
                hashes.len()
            )));
        }
        let mut at = 0;
        let mut out = Vec::with_capacity(self.elements.len());
        for element in &self.elements {
            let part = &hashes[at..at + element.len()];
            at += element.len();
            out.push(fold(part));
        }
        Ok(out)
    }
}

/// Right-fold of subtree hashes: `h0` ⊕ (`h1` ⊕ (… ⊕ `hk`)).
fn fold(hashes: &[Hash]) -> Hash {
    let (last, rest) = hashes.split_last().expect("a plan element is never empty");
    rest.iter().rev().fold(*last, |acc, h| node_hash(h, &acc))
}

/// The complete subtrees whose right-fold is MTH(D[lo:hi]) for an RFC 9162
/// subtree range (`lo` aligned to a power of two at least `hi - lo`).
fn range_nodes(mut lo: u64, hi: u64) -> Vec<NodeId> {
    debug_assert!(lo < hi);
    let mut out = Vec::new();
    while lo < hi {
        let align = if lo == 0 { 63 } else { lo.trailing_zeros() };
        let fits = 63 - (hi - lo).leading_zeros();
        let level = align.min(fits);
        out.push(NodeId::new(level as u8, lo >> level));
        lo += 1 << level;
    }
    out
}

/// Plan for the root of the tree of the first `size` leaves (`size >= 1`).
pub fn root_plan(size: u64) -> ProofPlan {
    ProofPlan { elements: vec![range_nodes(0, size)] }
}

/// The tree head (RFC 9162 MTH) of the first `size` leaves.
pub fn root_at(reader: &dyn TreeReader, size: u64) -> Result<Hash, TreeReadError> {
    if size == 0 {
        return Ok(EMPTY_ROOT);
    }
    Ok(root_plan(size).execute(reader)?[0])
}

/// Plan for PATH(index, D[0:size]), leaf end first.
pub fn inclusion_proof_plan(index: u64, size: u64) -> Result<ProofPlan, ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let mut elements = Vec::new();
    let (mut lo, mut hi) = (0u64, size);
    // Walk from the root down, then reverse: the proof lists the leaf end first.
    while hi - lo > 1 {
        let k = split_point(hi - lo);
        if index < lo + k {
            elements.push(range_nodes(lo + k, hi));
            hi = lo + k;
        } else {
            elements.push(range_nodes(lo, lo + k));
            lo += k;
        }
    }
    elements.reverse();
    Ok(ProofPlan { elements })
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves.
pub fn inclusion_proof(reader: &dyn TreeReader, index: u64, size: u64) -> Result<Vec<Hash>, ProofError> {
    Ok(inclusion_proof_plan(index, size)?.execute(reader)?)
}

/// Plan for PROOF(first, D[0:second]) (RFC 9162 §2.1.4.1), `0 < first <= second`.
pub fn consistency_proof_plan(first: u64, second: u64) -> Result<ProofPlan, ProofError> {
    if first == 0 || first > second {
        return Err(ProofError::BadSizes { first, second });
    }
    let mut elements = Vec::new();
    // SUBPROOF(m, D[lo:hi], b), iteratively from the root; elements collected
    // root end first and reversed at the end.
    let (mut m, mut lo, mut hi, mut b) = (first, 0u64, second, true);
    loop {
        if m == hi - lo {
            if !b {
                elements.push(range_nodes(lo, hi));
            }
            break;
        }
        let k = split_point(hi - lo);
        if m <= k {
            elements.push(range_nodes(lo + k, hi));
            hi = lo + k;
        } else {
            elements.push(range_nodes(lo, lo + k));
            m -= k;
            lo += k;
            b = false;
        }
    }
    elements.reverse();
    Ok(ProofPlan { elements })
}

/// The consistency proof between the trees of `first` and `second` leaves.
pub fn consistency_proof(reader: &dyn TreeReader, first: u64, second: u64) -> Result<Vec<Hash>, ProofError> {
    Ok(consistency_proof_plan(first, second)?.execute(reader)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::{fixtures, leaf_hash, verify_consistency, verify_inclusion, MemoryTree};

    /// MTH straight from RFC 9162 §2.1.1, for cross-checking.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => EMPTY_ROOT,
            1 => leaves[0],
            n => {
                let k = split_point(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn path(m: usize, d: &[Hash]) -> Vec<Hash> {
        if d.len() <= 1 {
            return vec![];
        }
        let k = split_point(d.len() as u64) as usize;
        if m < k {
            let mut p = path(m, &d[..k]);
            p.push(mth(&d[k..]));
            p
        } else {
            let mut p = path(m - k, &d[k..]);
            p.push(mth(&d[..k]));
            p
        }
    }

    fn subproof(m: usize, d: &[Hash], b: bool) -> Vec<Hash> {
        if m == d.len() {
            return if b { vec![] } else { vec![mth(d)] };
        }
        let k = split_point(d.len() as u64) as usize;
        if m <= k {
            let mut p = subproof(m, &d[..k], b);
            p.push(mth(&d[k..]));
            p
        } else {
            let mut p = subproof(m - k, &d[k..], false);
            p.push(mth(&d[..k]));
            p
        }
    }

    fn tree(n: usize) -> (MemoryTree, Vec<Hash>) {
        let mut t = MemoryTree::new();
        let mut leaves = Vec::new();
        for i in 0..n {
            let data = (i as u32).to_be_bytes();
            t.push(&data);
            leaves.push(leaf_hash(&data));
        }
        (t, leaves)
    }

    #[test]
    fn roots_and_proofs_match_the_rfc_recursion_up_to_70_leaves() {
        let (t, leaves) = tree(70);
        for n in 1..=70usize {
            let root = root_at(&t, n as u64).unwrap();
            assert_eq!(root, mth(&leaves[..n]), "root {n}");
            for m in 0..n {
                let p = inclusion_proof(&t, m as u64, n as u64).unwrap();
                assert_eq!(p, path(m, &leaves[..n]), "path {m} {n}");
                verify_inclusion(m as u64, n as u64, &leaves[m], &p, &root).unwrap();
            }
            for m in 1..=n {
                let p = consistency_proof(&t, m as u64, n as u64).unwrap();
                assert_eq!(p, subproof(m, &leaves[..n], true), "proof {m} {n}");
                verify_consistency(m as u64, n as u64, &mth(&leaves[..m]), &root, &p).unwrap();
            }
        }
    }

    #[test]
    fn proofs_reproduce_the_fixture_happy_paths() {
        let t8 = fixtures::tree8();
        let mut t = MemoryTree::new();
        for input in &t8.inputs {
            t.push(input);
        }
        for v in fixtures::inclusion().into_iter().filter(|v| !v.want_err) {
            let proof = inclusion_proof(&t, v.leaf_idx, v.tree_size).unwrap();
            assert_eq!(Some(proof), v.proof, "{}", v.name);
        }
        for v in fixtures::consistency().into_iter().filter(|v| !v.want_err) {
            let proof = consistency_proof(&t, v.size1, v.size2).unwrap();
            assert_eq!(Some(proof), v.proof, "{}", v.name);
        }
    }

    #[test]
    fn plans_read_logarithmically_many_nodes() {
        let size = 1_000_003u64;
        for index in [0, 1, 4095, 500_000, size - 1] {
            let n = inclusion_proof_plan(index, size).unwrap().nodes().len();
            assert!(n <= 2 * 21, "index {index}: {n} reads");
        }
        for first in [1, 2, 3, 1000, 524_288, 999_999, size] {
            let n = consistency_proof_plan(first, size).unwrap().nodes().len();
            assert!(n <= 3 * 21, "first {first}: {n} reads");
        }
        assert!(root_plan(size).nodes().len() <= 21);
    }

    /// Known answers for the storage layout, also in docs/protocol.md §8.
    #[test]
    fn plan_known_answers() {
        let n = |l, i| NodeId::new(l, i);
        assert_eq!(root_plan(7).elements, vec![vec![n(2, 0), n(1, 2), n(0, 6)]]);
        assert_eq!(root_plan(8).elements, vec![vec![n(3, 0)]]);
        assert_eq!(
            inclusion_proof_plan(5, 7).unwrap().elements,
            vec![vec![n(0, 4)], vec![n(0, 6)], vec![n(2, 0)]]
        );
        assert_eq!(
            consistency_proof_plan(3, 7).unwrap().elements,
            vec![vec![n(0, 2)], vec![n(0, 3)], vec![n(1, 0)], vec![n(1, 2), n(0, 6)]]
        );
        assert_eq!(consistency_proof_plan(4, 7).unwrap().elements, vec![vec![n(1, 2), n(0, 6)]]);
    }

    #[test]
    fn bad_arguments_are_named() {
        assert!(matches!(inclusion_proof_plan(5, 5), Err(ProofError::IndexOutOfRange { index: 5, size: 5 })));
        assert!(matches!(consistency_proof_plan(0, 5), Err(ProofError::BadSizes { first: 0, second: 5 })));
        assert!(matches!(consistency_proof_plan(6, 5), Err(ProofError::BadSizes { .. })));
        let (t, _) = tree(4);
        assert!(matches!(
            inclusion_proof(&t, 0, 9),
            Err(ProofError::Read(TreeReadError::Missing(_)))
        ));
    }
}
