//! Key identifiers shared by every format.
//!
//! A key id is SHA-256 of the key's raw public encoding: the 65-byte uncompressed SEC1 point for
//! the P-256 fleet key, the 32-byte X25519 point for a client result key, the 32-byte Ed25519 key
//! for a receipt or publisher key. Ids are printed as lowercase hex.

use sha2::{Digest, Sha256};

/// SHA-256 of a public key's raw encoding.
pub type KeyId = [u8; 32];

pub fn key_id(public_key: &[u8]) -> KeyId {
    Sha256::digest(public_key).into()
}
