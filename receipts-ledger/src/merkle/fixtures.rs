//! Loads the shared Merkle fixtures (test only). The directory comes from
//! `EPHEM_FIXTURES`, defaulting to `shared/fixtures` beside the repository.

use super::Hash;
use base64::{engine::general_purpose::STANDARD, Engine};
use serde_json::Value;
use std::path::PathBuf;

pub fn dir() -> PathBuf {
    std::env::var_os("EPHEM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")))
}

pub fn load(rel: &str) -> Value {
    let path = dir().join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {} (set EPHEM_FIXTURES): {e}", path.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn b64(v: &Value) -> Vec<u8> {
    STANDARD.decode(v.as_str().expect("base64 string")).expect("fixture base64")
}

fn h32(bytes: Vec<u8>) -> Hash {
    bytes.try_into().expect("32-byte hash")
}

fn b64_list(v: &Value) -> Option<Vec<Vec<u8>>> {
    v.as_array().map(|a| a.iter().map(b64).collect())
}

/// `proof: null` is an empty proof; `None` if an element is not 32 bytes.
fn as_hashes(p: &Option<Vec<Vec<u8>>>) -> Option<Vec<Hash>> {
    match p {
        None => Some(vec![]),
        Some(p) => p.iter().map(|h| <Hash>::try_from(h.as_slice()).ok()).collect(),
    }
}

pub struct Tree8 {
    pub inputs: Vec<Vec<u8>>,
    pub leaf_hashes: Vec<Hash>,
    pub roots: Vec<Hash>,
}

pub fn tree8() -> Tree8 {
    let v = load("merkle/rfc6962_vectors.json");
    let t = &v["tree8"];
    let hexes = |k: &str| -> Vec<Vec<u8>> {
        t[k].as_array().unwrap().iter().map(|h| hex::decode(h.as_str().unwrap()).unwrap()).collect()
    };
    Tree8 {
        inputs: hexes("leaf_inputs_hex"),
        leaf_hashes: hexes("leaf_hashes_hex").into_iter().map(h32).collect(),
        roots: hexes("root_by_size_hex").into_iter().map(h32).collect(),
    }
}

pub struct RawInclusion {
    pub name: String,
    pub desc: String,
    pub leaf_idx: u64,
    pub tree_size: u64,
    pub root: Vec<u8>,
    pub leaf_hash: Vec<u8>,
    pub proof: Option<Vec<Vec<u8>>>,
    pub want_err: bool,
}

pub struct RawConsistency {
    pub name: String,
    pub desc: String,
    pub size1: u64,
    pub size2: u64,
    pub root1: Vec<u8>,
    pub root2: Vec<u8>,
    pub proof: Option<Vec<Vec<u8>>>,
    pub want_err: bool,
}

pub fn inclusion_raw() -> Vec<RawInclusion> {
    let v = load("merkle/rfc6962_vectors.json");
    v["inclusion"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, c)| RawInclusion {
            name: name.clone(),
            desc: c["desc"].as_str().unwrap_or("").to_owned(),
            leaf_idx: c["leafIdx"].as_u64().unwrap(),
            tree_size: c["treeSize"].as_u64().unwrap(),
            root: b64(&c["root"]),
            leaf_hash: b64(&c["leafHash"]),
            proof: b64_list(&c["proof"]),
            want_err: c["wantErr"].as_bool().unwrap(),
        })
        .collect()
}

pub fn consistency_raw() -> Vec<RawConsistency> {
    let v = load("merkle/rfc6962_vectors.json");
    v["consistency"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, c)| RawConsistency {
            name: name.clone(),
            desc: c["desc"].as_str().unwrap_or("").to_owned(),
            size1: c["size1"].as_u64().unwrap(),
            size2: c["size2"].as_u64().unwrap(),
            root1: b64(&c["root1"]),
            root2: b64(&c["root2"]),
            proof: b64_list(&c["proof"]),
            want_err: c["wantErr"].as_bool().unwrap(),
        })
        .collect()
}

pub struct Inclusion {
    pub name: String,
    pub leaf_idx: u64,
    pub tree_size: u64,
    pub proof: Option<Vec<Hash>>,
    pub want_err: bool,
}

pub struct Consistency {
    pub name: String,
    pub size1: u64,
    pub size2: u64,
    pub proof: Option<Vec<Hash>>,
    pub want_err: bool,
}

pub fn inclusion() -> Vec<Inclusion> {
    inclusion_raw()
        .into_iter()
        .map(|r| Inclusion {
            proof: as_hashes(&r.proof),
            name: r.name,
            leaf_idx: r.leaf_idx,
            tree_size: r.tree_size,
            want_err: r.want_err,
        })
        .collect()
}

pub fn consistency() -> Vec<Consistency> {
    consistency_raw()
        .into_iter()
        .map(|r| Consistency {
            proof: as_hashes(&r.proof),
            name: r.name,
            size1: r.size1,
            size2: r.size2,
            want_err: r.want_err,
        })
        .collect()
}
