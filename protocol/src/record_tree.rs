//! Per-record commitments (docs/protocol.md §4.2): the enclave puts into each job receipt the
//! root of an RFC 9162 Merkle tree over one leaf per embedded record, so that a client can later
//! prove that one id's vector came out of the job — to someone who sees only that record.
//!
//! ```text
//! record_key_i  = HMAC-SHA256(commitment_key, "ephem-batch/v1 record key" ‖ u64be(i))
//! leaf_i        = "ephem-batch/v1 record" ‖ u64be(i) ‖ SHA-256(id)
//!                 ‖ HMAC-SHA256(record_key_i, text) ‖ SHA-256(output record bytes)
//! records_root  = MTH(leaf_0 … leaf_{n-1})        (RFC 9162 §2.1, leaf hash SHA-256(0x00 ‖ leaf))
//! ```
//!
//! `i` counts the job's embedded records (the `Embedding` output records, in output order); the
//! commitment key is the job's (§2), so only its client and the enclave can compute `record_key_i`,
//! and revealing one record's key reveals nothing of another's text.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::records::{encode_output, OutputRecord, RecordError};

const RECORD_KEY_LABEL: &[u8] = b"ephem-batch/v1 record key";
const RECORD_LEAF_LABEL: &[u8] = b"ephem-batch/v1 record";

type Hash = [u8; 32];

fn hmac(key: &[u8], parts: &[&[u8]]) -> Hash {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The key that opens record `index`'s text commitment (and only that one).
pub fn record_key(commitment_key: &[u8; 32], index: u64) -> Hash {
    hmac(commitment_key, &[RECORD_KEY_LABEL, &index.to_be_bytes()])
}

/// One record's leaf, from what its opening reveals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLeaf {
    pub index: u64,
    pub id_sha256: Hash,
    pub text_commitment: Hash,
    pub output_sha256: Hash,
}

impl RecordLeaf {
    /// The leaf of embedded record `index`: its input text and its output record.
    pub fn new(record_key: &Hash, index: u64, text: &[u8], output: &OutputRecord) -> Result<Self, RecordError> {
        let mut encoded = Vec::new();
        encode_output(output, &mut encoded)?;
        Ok(Self::from_encoded(record_key, index, output.id(), text, &encoded))
    }

    /// [`RecordLeaf::new`] from the output record as encoded in the job's output stream.
    pub fn from_encoded(record_key: &Hash, index: u64, id: &str, text: &[u8], encoded_output: &[u8]) -> Self {
        Self {
            index,
            id_sha256: Sha256::digest(id.as_bytes()).into(),
            text_commitment: hmac(record_key, &[text]),
            output_sha256: Sha256::digest(encoded_output).into(),
        }
    }

    /// The leaf's bytes (what the tree hashes as `SHA-256(0x00 ‖ bytes)`).
    pub fn to_bytes(&self) -> Vec<u8> {
        [RECORD_LEAF_LABEL, &self.index.to_be_bytes(), &self.id_sha256, &self.text_commitment, &self.output_sha256].concat()
    }

    /// The RFC 9162 leaf hash.
    pub fn hash(&self) -> Hash {
        Sha256::new().chain_update([0x00]).chain_update(self.to_bytes()).finalize().into()
    }
}

/// The root of the records' tree, computed as the leaves arrive in constant memory per level:
/// the roots of the complete subtrees so far, largest first (a compact range).
#[derive(Debug, Clone, Default)]
pub struct RecordTree {
    size: u64,
    /// `(height, root)` of each complete subtree, strictly decreasing heights.
    subtrees: Vec<(u32, Hash)>,
}

fn node(left: &Hash, right: &Hash) -> Hash {
    Sha256::new().chain_update([0x01]).chain_update(left).chain_update(right).finalize().into()
}

impl RecordTree {
    pub fn push(&mut self, leaf_hash: Hash) {
        let mut carry = (0u32, leaf_hash);
        while let Some(&(height, left)) = self.subtrees.last() {
            if height != carry.0 {
                break;
            }
            self.subtrees.pop();
            carry = (height + 1, node(&left, &carry.1));
        }
        self.subtrees.push(carry);
        self.size += 1;
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// MTH of the leaves pushed: the complete subtrees folded from the right (RFC 9162 splits at
    /// the largest power of two, which is exactly the left one of each pair).
    pub fn root(&self) -> Hash {
        let mut iter = self.subtrees.iter().rev();
        let Some(&(_, mut acc)) = iter.next() else { return Sha256::digest([]).into() };
        for (_, left) in iter {
            acc = node(left, &acc);
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Vector;

    /// MTH straight from RFC 9162 §2.1.1's recursive definition.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => Sha256::digest([]).into(),
            1 => leaves[0],
            n => {
                let k = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
                node(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    #[test]
    fn the_streamed_root_is_rfc_9162s_for_every_size() {
        let mut tree = RecordTree::default();
        let mut leaves = Vec::new();
        assert_eq!(tree.root(), mth(&leaves));
        for i in 0..70u8 {
            let leaf: Hash = Sha256::digest([i]).into();
            leaves.push(leaf);
            tree.push(leaf);
            assert_eq!(tree.root(), mth(&leaves), "size {}", i + 1);
        }
        assert_eq!(tree.size(), 70);
    }

    #[test]
    fn a_leaf_binds_index_id_text_and_output() {
        let key = record_key(&[7; 32], 3);
        assert_ne!(key, record_key(&[7; 32], 4));
        assert_ne!(key, record_key(&[8; 32], 3));
        let output = OutputRecord::Embedding { id: "doc-1".into(), tokens: 4, vector: Vector::F32(vec![0.5, -0.25]) };
        let leaf = RecordLeaf::new(&key, 3, b"hello", &output).unwrap();
        let other_vector = OutputRecord::Embedding { id: "doc-1".into(), tokens: 4, vector: Vector::F32(vec![0.5, -0.5]) };
        let other_id = OutputRecord::Embedding { id: "doc-2".into(), tokens: 4, vector: Vector::F32(vec![0.5, -0.25]) };
        for other in [
            RecordLeaf::new(&key, 4, b"hello", &output).unwrap(),
            RecordLeaf::new(&key, 3, b"hello!", &output).unwrap(),
            RecordLeaf::new(&key, 3, b"hello", &other_vector).unwrap(),
            RecordLeaf::new(&key, 3, b"hello", &other_id).unwrap(),
            RecordLeaf::new(&record_key(&[7; 32], 4), 3, b"hello", &output).unwrap(),
        ] {
            assert_ne!(leaf.hash(), other.hash());
        }
    }
}
