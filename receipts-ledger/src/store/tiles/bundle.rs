//! The byte formats of the objects beside the tiles: entry bundles (tlog-tiles), the ledger's
//! per-entry metadata, and staging records.

use base64::{engine::general_purpose::STANDARD, Engine};
use serde::{Deserialize, Serialize};

use crate::entry::{Entry, IndexedFields};
use crate::merkle::Hash;

/// Largest entry a tlog-tiles bundle can hold (u16 length prefix).
pub const MAX_BUNDLED_ENTRY: usize = u16::MAX as usize;

/// Why a bundle or record did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleFormatError {
    #[error("entry bundle ends inside entry {entry}")]
    Truncated { entry: usize },
    #[error("entry bundle holds {found} entries, expected {expected}")]
    Count { found: usize, expected: usize },
    #[error("entry {index} is {size} bytes; a tlog-tiles entry is at most {MAX_BUNDLED_ENTRY}")]
    TooLarge { index: u64, size: usize },
    #[error("{what} is not valid JSON of its schema: {message}")]
    Json { what: &'static str, message: String },
    #[error("{what}: field {field} is not {expected}")]
    Field { what: &'static str, field: &'static str, expected: &'static str },
}

/// Concatenated `u16 BE length ‖ entry`.
pub fn encode_entries<'a>(entries: impl IntoIterator<Item = (u64, &'a [u8])>) -> Result<Vec<u8>, BundleFormatError> {
    let mut out = Vec::new();
    for (index, e) in entries {
        let len = u16::try_from(e.len()).map_err(|_| BundleFormatError::TooLarge { index, size: e.len() })?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(e);
    }
    Ok(out)
}

/// Splits a bundle into exactly `expected` entries.
pub fn decode_entries(bytes: &[u8], expected: usize) -> Result<Vec<Vec<u8>>, BundleFormatError> {
    let mut out = Vec::with_capacity(expected);
    let mut rest = bytes;
    while !rest.is_empty() {
        let entry = out.len();
        let (len, tail) = rest.split_first_chunk::<2>().ok_or(BundleFormatError::Truncated { entry })?;
        let len = usize::from(u16::from_be_bytes(*len));
        if tail.len() < len {
            return Err(BundleFormatError::Truncated { entry });
        }
        out.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    if out.len() != expected {
        return Err(BundleFormatError::Count { found: out.len(), expected });
    }
    Ok(out)
}

/// What the ledger keeps about an entry besides its leaf: enough to rebuild the index and
/// the hash chain, and to cross-check the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryMeta {
    pub index: u64,
    /// Hex SHA-256 of the attestation document (stored under `ephem/attestations/`).
    pub attestation_sha256: String,
    pub appended_ms: u64,
    pub fields: IndexedFields,
    /// Hex chain hash; a rebuild recomputes it and must find this value.
    pub entry_hash: String,
}

impl EntryMeta {
    pub fn of(e: &Entry) -> Self {
        Self {
            index: e.index,
            attestation_sha256: hex::encode(e.attestation_sha256),
            appended_ms: e.appended_ms,
            fields: e.fields.clone(),
            entry_hash: hex::encode(e.entry_hash),
        }
    }

    pub fn attestation_hash(&self) -> Result<Hash, BundleFormatError> {
        hash_field("entry metadata", "attestation_sha256", &self.attestation_sha256)
    }

    pub fn chain_hash(&self) -> Result<Hash, BundleFormatError> {
        hash_field("entry metadata", "entry_hash", &self.entry_hash)
    }
}

/// The metadata bundle beside an entry bundle: a JSON array of [`EntryMeta`].
pub fn encode_meta(meta: &[EntryMeta]) -> Vec<u8> {
    serde_json::to_vec(meta).expect("entry metadata serialises")
}

pub fn decode_meta(bytes: &[u8], first: u64, expected: usize) -> Result<Vec<EntryMeta>, BundleFormatError> {
    let meta: Vec<EntryMeta> = serde_json::from_slice(bytes)
        .map_err(|e| BundleFormatError::Json { what: "metadata bundle", message: e.to_string() })?;
    if meta.len() != expected {
        return Err(BundleFormatError::Count { found: meta.len(), expected });
    }
    if meta.iter().enumerate().any(|(i, m)| m.index != first + i as u64) {
        return Err(BundleFormatError::Field { what: "metadata bundle", field: "index", expected: "consecutive" });
    }
    Ok(meta)
}

/// A commit's new entries, written before the checkpoint that commits them, so that
/// whoever finds that checkpoint can publish its tiles even if the appender died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    pub version: u32,
    /// Tree size before the commit.
    pub from: u64,
    /// Tree size after it.
    pub size: u64,
    /// Hex root of the tree of `size` leaves.
    pub root: String,
    pub entries: Vec<StagedEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedEntry {
    /// The receipt, base64.
    pub leaf: String,
    #[serde(flatten)]
    pub meta: EntryMeta,
}

impl StagedEntry {
    pub fn of(e: &Entry) -> Self {
        Self { leaf: STANDARD.encode(&e.leaf), meta: EntryMeta::of(e) }
    }

    pub fn leaf(&self) -> Result<Vec<u8>, BundleFormatError> {
        STANDARD
            .decode(&self.leaf)
            .map_err(|_| BundleFormatError::Field { what: "staging record", field: "leaf", expected: "base64" })
    }
}

impl Staging {
    pub const VERSION: u32 = 1;

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a staging record serialises")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, BundleFormatError> {
        let s: Staging = serde_json::from_slice(bytes)
            .map_err(|e| BundleFormatError::Json { what: "staging record", message: e.to_string() })?;
        let consistent = s.version == Self::VERSION
            && s.size >= s.from
            && s.entries.len() as u64 == s.size - s.from
            && s.entries.iter().enumerate().all(|(i, e)| e.meta.index == s.from + i as u64);
        if !consistent {
            return Err(BundleFormatError::Field { what: "staging record", field: "entries", expected: "from..size" });
        }
        Ok(s)
    }

    pub fn root_hash(&self) -> Result<Hash, BundleFormatError> {
        hash_field("staging record", "root", &self.root)
    }
}

fn hash_field(what: &'static str, field: &'static str, value: &str) -> Result<Hash, BundleFormatError> {
    hex::decode(value)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or(BundleFormatError::Field { what, field, expected: "32 bytes of hex" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_bundles_round_trip_and_refuse_damage() {
        let entries: Vec<Vec<u8>> = vec![b"a".to_vec(), Vec::new(), vec![7; 300]];
        let bundle = encode_entries(entries.iter().enumerate().map(|(i, e)| (i as u64, e.as_slice()))).unwrap();
        assert_eq!(&bundle[..3], &[0, 1, b'a']);
        assert_eq!(decode_entries(&bundle, 3).unwrap(), entries);
        assert_eq!(decode_entries(&bundle, 2), Err(BundleFormatError::Count { found: 3, expected: 2 }));
        assert_eq!(decode_entries(&bundle[..bundle.len() - 1], 3), Err(BundleFormatError::Truncated { entry: 2 }));
        assert_eq!(decode_entries(&[0], 1), Err(BundleFormatError::Truncated { entry: 0 }));
        let big = vec![0u8; MAX_BUNDLED_ENTRY + 1];
        assert_eq!(
            encode_entries([(9, big.as_slice())]),
            Err(BundleFormatError::TooLarge { index: 9, size: MAX_BUNDLED_ENTRY + 1 })
        );
    }
}
