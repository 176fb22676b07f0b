//! The `user_data` key binding (DESIGN.md §3/§4): which fleet key and receipt key an enclave
//! holds, for which epoch. A client trusts a fleet key only through a verified document that
//! carries this binding.
//!
//! Encoding: deterministic CBOR (RFC 8949 §4.2.1), a map with unsigned integer keys in ascending
//! order, shortest heads:
//!
//! ```text
//! {
//!   0: 1,            ; version (uint), only 1 is defined
//!   1: bstr(65),     ; fleet public key: uncompressed SEC1 P-256 point (0x04 ‖ X ‖ Y)
//!   2: bstr(32),     ; receipt public key: Ed25519
//!   3: uint,         ; fleet key epoch
//! }
//! ```
//!
//! Decoding accepts exactly the bytes [`UserDataBinding::encode`] produces: anything else
//! (unknown version, missing or extra keys, wrong lengths, invalid points, non-shortest or
//! reordered encodings, trailing bytes) is an error.

use super::cbor::{self, Value};
use crate::keys::{KeyId, key_id};

/// The only binding version defined.
pub const BINDING_VERSION: u64 = 1;
/// Length of an uncompressed SEC1 P-256 point.
pub const FLEET_KEY_LEN: usize = 65;
/// Length of an Ed25519 public key.
pub const RECEIPT_KEY_LEN: usize = 32;

const KEY_VERSION: u64 = 0;
const KEY_FLEET: u64 = 1;
const KEY_RECEIPT: u64 = 2;
const KEY_EPOCH: u64 = 3;

/// The keys an enclave publishes in its attestation document's `user_data`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDataBinding {
    /// HPKE fleet public key, uncompressed SEC1 P-256 (65 bytes, first byte 0x04).
    pub fleet_public_key: [u8; FLEET_KEY_LEN],
    /// Ed25519 receipt public key.
    pub receipt_public_key: [u8; RECEIPT_KEY_LEN],
    /// Fleet key epoch.
    pub epoch: u64,
}

/// Why bytes are not a key binding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("not well-formed CBOR: {0}")]
    Cbor(#[from] cbor::CborError),
    #[error("is a {0}, not a map")]
    NotMap(&'static str),
    #[error("unknown binding version {0} (only 1 is defined)")]
    UnknownVersion(u64),
    #[error("missing key {0}")]
    MissingKey(u64),
    #[error("unexpected map key ({0})")]
    UnknownKey(String),
    #[error("key {key} is a {found}, expected a {expected}")]
    WrongType { key: u64, expected: &'static str, found: &'static str },
    #[error("fleet public key is {0} bytes; expected 65 (uncompressed SEC1 P-256)")]
    FleetKeyLength(usize),
    #[error("fleet public key is not a valid uncompressed P-256 point")]
    InvalidFleetKey,
    #[error("receipt public key is {0} bytes; expected 32 (Ed25519)")]
    ReceiptKeyLength(usize),
    #[error("receipt public key is not a valid Ed25519 point")]
    InvalidReceiptKey,
    #[error("not the deterministic encoding (keys out of order or non-shortest heads)")]
    NonCanonical,
}

impl UserDataBinding {
    /// Builds a binding, checking both keys are valid points.
    pub fn new(
        fleet_public_key: [u8; FLEET_KEY_LEN],
        receipt_public_key: [u8; RECEIPT_KEY_LEN],
        epoch: u64,
    ) -> Result<Self, BindingError> {
        check_fleet_key(&fleet_public_key)?;
        check_receipt_key(&receipt_public_key)?;
        Ok(UserDataBinding { fleet_public_key, receipt_public_key, epoch })
    }

    /// The deterministic CBOR encoding (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = cbor::Writer::new();
        w.map(4)
            .unsigned(KEY_VERSION)
            .unsigned(BINDING_VERSION)
            .unsigned(KEY_FLEET)
            .bytes(&self.fleet_public_key)
            .unsigned(KEY_RECEIPT)
            .bytes(&self.receipt_public_key)
            .unsigned(KEY_EPOCH)
            .unsigned(self.epoch);
        w.into_bytes()
    }

    /// Strict decoding: the inverse of [`encode`](Self::encode) and nothing else.
    pub fn decode(bytes: &[u8]) -> Result<Self, BindingError> {
        let value = cbor::decode(bytes)?;
        let Value::Map(entries) = &value else {
            return Err(BindingError::NotMap(value.kind()));
        };
        let get = |key: u64| {
            entries
                .iter()
                .find(|(k, _)| *k == Value::Unsigned(key))
                .map(|(_, v)| v)
                .ok_or(BindingError::MissingKey(key))
        };
        match get(KEY_VERSION)? {
            Value::Unsigned(BINDING_VERSION) => {}
            Value::Unsigned(v) => return Err(BindingError::UnknownVersion(*v)),
            other => return Err(wrong(KEY_VERSION, "unsigned integer", other)),
        }
        for (k, _) in entries {
            match k {
                Value::Unsigned(KEY_VERSION | KEY_FLEET | KEY_RECEIPT | KEY_EPOCH) => {}
                Value::Unsigned(n) => return Err(BindingError::UnknownKey(n.to_string())),
                other => return Err(BindingError::UnknownKey(format!("a {}", other.kind()))),
            }
        }
        let fleet = match get(KEY_FLEET)? {
            Value::Bytes(b) => <[u8; FLEET_KEY_LEN]>::try_from(*b).map_err(|_| BindingError::FleetKeyLength(b.len()))?,
            other => return Err(wrong(KEY_FLEET, "byte string", other)),
        };
        let receipt = match get(KEY_RECEIPT)? {
            Value::Bytes(b) => {
                <[u8; RECEIPT_KEY_LEN]>::try_from(*b).map_err(|_| BindingError::ReceiptKeyLength(b.len()))?
            }
            other => return Err(wrong(KEY_RECEIPT, "byte string", other)),
        };
        let epoch = match get(KEY_EPOCH)? {
            Value::Unsigned(e) => *e,
            other => return Err(wrong(KEY_EPOCH, "unsigned integer", other)),
        };
        let binding = UserDataBinding::new(fleet, receipt, epoch)?;
        if binding.encode() != bytes {
            return Err(BindingError::NonCanonical);
        }
        Ok(binding)
    }

    /// Key id of the fleet key (SHA-256 of the 65-byte point).
    pub fn fleet_key_id(&self) -> KeyId {
        key_id(&self.fleet_public_key)
    }

    /// Key id of the receipt key (SHA-256 of the 32-byte key).
    pub fn receipt_key_id(&self) -> KeyId {
        key_id(&self.receipt_public_key)
    }
}

fn wrong(key: u64, expected: &'static str, found: &Value<'_>) -> BindingError {
    BindingError::WrongType { key, expected, found: found.kind() }
}

fn check_fleet_key(key: &[u8; FLEET_KEY_LEN]) -> Result<(), BindingError> {
    if key.first() != Some(&0x04) {
        return Err(BindingError::InvalidFleetKey);
    }
    p256::PublicKey::from_sec1_bytes(key).map(|_| ()).map_err(|_| BindingError::InvalidFleetKey)
}

fn check_receipt_key(key: &[u8; RECEIPT_KEY_LEN]) -> Result<(), BindingError> {
    ed25519_dalek::VerifyingKey::from_bytes(key).map(|_| ()).map_err(|_| BindingError::InvalidReceiptKey)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::vectors;

    fn sample() -> UserDataBinding {
        vectors::binding_sample()
    }

    #[test]
    fn known_answer_vector() {
        let b = sample();
        assert_eq!(hex::encode(b.encode()), vectors::BINDING_HEX);
        assert_eq!(UserDataBinding::decode(&b.encode()).unwrap(), b);
        assert_eq!(hex::encode(b.fleet_key_id()), vectors::BINDING_FLEET_KEY_ID_HEX);
        assert_eq!(hex::encode(b.receipt_key_id()), vectors::BINDING_RECEIPT_KEY_ID_HEX);
    }

    fn encode_with(f: impl FnOnce(&mut cbor::Writer)) -> Vec<u8> {
        let mut w = cbor::Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn strict_decoding() {
        let b = sample();
        let good = b.encode();
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(UserDataBinding::decode(&trailing), Err(BindingError::Cbor(_))));

        let v2 = encode_with(|w| {
            w.map(4).unsigned(0).unsigned(2).unsigned(1).bytes(&b.fleet_public_key);
            w.unsigned(2).bytes(&b.receipt_public_key).unsigned(3).unsigned(1);
        });
        assert_eq!(UserDataBinding::decode(&v2), Err(BindingError::UnknownVersion(2)));

        let short_fleet = encode_with(|w| {
            w.map(4).unsigned(0).unsigned(1).unsigned(1).bytes(&b.fleet_public_key[..64]);
            w.unsigned(2).bytes(&b.receipt_public_key).unsigned(3).unsigned(1);
        });
        assert_eq!(UserDataBinding::decode(&short_fleet), Err(BindingError::FleetKeyLength(64)));

        let long_receipt = encode_with(|w| {
            w.map(4).unsigned(0).unsigned(1).unsigned(1).bytes(&b.fleet_public_key);
            w.unsigned(2).bytes(&[0u8; 33]).unsigned(3).unsigned(1);
        });
        assert_eq!(UserDataBinding::decode(&long_receipt), Err(BindingError::ReceiptKeyLength(33)));

        let mut bad_point = b.fleet_public_key;
        bad_point[64] ^= 1;
        let bad = encode_with(|w| {
            w.map(4).unsigned(0).unsigned(1).unsigned(1).bytes(&bad_point);
            w.unsigned(2).bytes(&b.receipt_public_key).unsigned(3).unsigned(1);
        });
        assert_eq!(UserDataBinding::decode(&bad), Err(BindingError::InvalidFleetKey));

        let mut compressed = [0u8; 65];
        compressed[0] = 0x02;
        assert_eq!(UserDataBinding::new(compressed, b.receipt_public_key, 1), Err(BindingError::InvalidFleetKey));

        let extra = encode_with(|w| {
            w.map(5).unsigned(0).unsigned(1).unsigned(1).bytes(&b.fleet_public_key);
            w.unsigned(2).bytes(&b.receipt_public_key).unsigned(3).unsigned(1).unsigned(4).null();
        });
        assert_eq!(UserDataBinding::decode(&extra), Err(BindingError::UnknownKey("4".into())));

        let missing = encode_with(|w| {
            w.map(3).unsigned(0).unsigned(1).unsigned(1).bytes(&b.fleet_public_key);
            w.unsigned(2).bytes(&b.receipt_public_key);
        });
        assert_eq!(UserDataBinding::decode(&missing), Err(BindingError::MissingKey(3)));

        let reordered = encode_with(|w| {
            w.map(4).unsigned(3).unsigned(b.epoch).unsigned(0).unsigned(1);
            w.unsigned(1).bytes(&b.fleet_public_key).unsigned(2).bytes(&b.receipt_public_key);
        });
        assert_eq!(UserDataBinding::decode(&reordered), Err(BindingError::NonCanonical));

        // Non-shortest head for the version (0x18 0x01 instead of 0x01).
        let mut long_head = vec![0xa4, 0x00, 0x18, 0x01];
        long_head.extend_from_slice(&good[3..]);
        assert_eq!(UserDataBinding::decode(&long_head), Err(BindingError::NonCanonical));

        assert!(matches!(UserDataBinding::decode(&[0x80]), Err(BindingError::NotMap("array"))));
        assert!(matches!(UserDataBinding::decode(b""), Err(BindingError::Cbor(_))));
    }
}
