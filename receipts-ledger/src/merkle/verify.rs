//! Proof verification, step by step as RFC 9162 §2.1.3.2 (inclusion) and
//! §2.1.4.2 (consistency) write it.

use super::{node_hash, Hash};

/// Why a proof was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("leaf index {index} is not below tree size {size}")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("inclusion proof has more elements than the tree has levels")]
    ProofTooLong,
    #[error("inclusion proof ended below the root (too short)")]
    ProofTooShort,
    #[error("recomputed root does not match the expected root")]
    RootMismatch,
    #[error("consistency from size {first} to size {second} is not defined (need 0 < first <= second)")]
    BadSizes { first: u64, second: u64 },
    #[error("consistency proof for equal sizes must be empty")]
    NonEmptyProofForEqualSizes,
    #[error("consistency proof is empty")]
    EmptyProof,
    #[error("recomputed first root does not match root1")]
    FirstRootMismatch,
    #[error("recomputed second root does not match root2")]
    SecondRootMismatch,
}

/// RFC 9162 §2.1.3.2: verifies that `leaf_hash` is leaf `index` of the tree
/// of `size` leaves whose root is `root`.
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf_hash: &Hash,
    proof: &[Hash],
    root: &[u8],
) -> Result<(), VerifyError> {
    if inclusion_root(index, size, leaf_hash, proof)?[..] != *root {
        return Err(VerifyError::RootMismatch);
    }
    Ok(())
}

/// RFC 9162 §2.1.3.2 steps 1–5: the root that `proof` leads to from `leaf_hash` at `index` in a
/// tree of `size` leaves (for a COSE Receipt, whose signature is over that root).
pub fn inclusion_root(index: u64, size: u64, leaf_hash: &Hash, proof: &[Hash]) -> Result<Hash, VerifyError> {
    // 1. leaf_index >= tree_size fails.
    if index >= size {
        return Err(VerifyError::IndexOutOfRange { index, size });
    }
    // 2.-3.
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = *leaf_hash;
    // 4.
    for p in proof {
        // 4a.
        if sn == 0 {
            return Err(VerifyError::ProofTooLong);
        }
        // 4b.
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        // 4c.
        fn_ >>= 1;
        sn >>= 1;
    }
    // 5.
    if sn != 0 {
        return Err(VerifyError::ProofTooShort);
    }
    Ok(r)
}

/// RFC 9162 §2.1.4.2: verifies that the tree of `first` leaves with root
/// `root1` is a prefix of the tree of `second` leaves with root `root2`.
///
/// Roots are taken as byte strings, as the RFC's inputs are: equal sizes
/// compare them as given; otherwise only a 32-byte root can match.
///
/// `first == second` needs an empty proof and equal roots. A proof from the
/// empty tree is refused, `(0, 0)` included: the RFC defines verification only
/// for `0 < first`, and a proof from nothing proves nothing.
pub fn verify_consistency(
    first: u64,
    second: u64,
    root1: &[u8],
    root2: &[u8],
    proof: &[Hash],
) -> Result<(), VerifyError> {
    if first == 0 || first > second {
        return Err(VerifyError::BadSizes { first, second });
    }
    if first == second {
        if !proof.is_empty() {
            return Err(VerifyError::NonEmptyProofForEqualSizes);
        }
        return if root1 == root2 { Ok(()) } else { Err(VerifyError::SecondRootMismatch) };
    }
    // 1.
    if proof.is_empty() {
        return Err(VerifyError::EmptyProof);
    }
    // 2. prepend first_hash when first is a power of two.
    let prepended;
    let path: &[Hash] = if first.is_power_of_two() {
        // A root that is not 32 bytes cannot be the first hash of a valid proof.
        let Ok(first_hash) = <Hash>::try_from(root1) else {
            return Err(VerifyError::FirstRootMismatch);
        };
        prepended = std::iter::once(first_hash).chain(proof.iter().copied()).collect::<Vec<_>>();
        &prepended
    } else {
        proof
    };
    // 3.
    let (mut fn_, mut sn) = (first - 1, second - 1);
    // 4.
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    // 5.
    let (mut fr, mut sr) = (path[0], path[0]);
    // 6.
    for c in &path[1..] {
        // 6a.
        if sn == 0 {
            return Err(VerifyError::ProofTooLong);
        }
        // 6b.
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        // 6c.
        fn_ >>= 1;
        sn >>= 1;
    }
    // 7.
    if sn != 0 {
        return Err(VerifyError::ProofTooShort);
    }
    if fr[..] != *root1 {
        return Err(VerifyError::FirstRootMismatch);
    }
    if sr[..] != *root2 {
        return Err(VerifyError::SecondRootMismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::fixtures;

    /// Hashes in the fixtures that are not 32 bytes cannot even be presented
    /// to the verifier; those vectors count as rejected.
    fn as_hashes(v: &Option<Vec<Vec<u8>>>) -> Option<Vec<Hash>> {
        v.as_ref()
            .map(|p| p.iter().map(|h| <Hash>::try_from(h.as_slice()).ok()).collect::<Option<Vec<_>>>())
            .unwrap_or(Some(vec![]))
    }

    #[test]
    fn all_inclusion_vectors() {
        let vs = fixtures::inclusion_raw();
        assert_eq!(vs.len(), 98);
        let (mut accepted, mut rejected) = (0, 0);
        for v in vs {
            let result = (|| {
                let proof = as_hashes(&v.proof).ok_or("proof element not 32 bytes")?;
                let leaf = <Hash>::try_from(v.leaf_hash.as_slice()).map_err(|_| "leaf hash not 32 bytes")?;
                verify_inclusion(v.leaf_idx, v.tree_size, &leaf, &proof, &v.root).map_err(|_| "rejected")
            })();
            assert_eq!(result.is_err(), v.want_err, "{} ({}): {:?}", v.name, v.desc, result);
            if v.want_err { rejected += 1 } else { accepted += 1 }
        }
        assert_eq!(accepted, 6);
        assert_eq!(accepted + rejected, 98);
    }

    #[test]
    fn all_consistency_vectors() {
        let vs = fixtures::consistency_raw();
        assert_eq!(vs.len(), 98);
        let mut accepted = 0;
        for v in vs {
            let result = (|| {
                let proof = as_hashes(&v.proof).ok_or("proof element not 32 bytes")?;
                verify_consistency(v.size1, v.size2, &v.root1, &v.root2, &proof).map_err(|_| "rejected")
            })();
            assert_eq!(result.is_err(), v.want_err, "{} ({}): {:?}", v.name, v.desc, result);
            if !v.want_err {
                accepted += 1
            }
        }
        assert_eq!(accepted, 6);
    }

    #[test]
    fn zero_zero_is_refused_even_with_equal_roots() {
        let r = crate::merkle::EMPTY_ROOT;
        assert_eq!(verify_consistency(0, 0, &r, &r, &[]), Err(VerifyError::BadSizes { first: 0, second: 0 }));
    }
}
