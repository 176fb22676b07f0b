//! The `user_data` key binding (DESIGN.md §3/§4): which fleet key and receipt key an enclave
//! holds, for which epoch, until when, and which KMS key released the fleet key. A client trusts
//! a fleet key only through a verified document that carries this binding **and names its
//! deployment's KMS key**: the genuine enclave will unwrap a key from any KMS key the host points
//! it at, so the KMS key is what tells a deployment's fleet key from one the host made.
//!
//! Encoding: deterministic CBOR (RFC 8949 §4.2.1), a map with unsigned integer keys in ascending
//! order, shortest heads:
//!
//! ```text
//! {
//!   0: 2,            ; version (uint), only 2 is defined (1 named no KMS key)
//!   1: bstr(65),     ; fleet public key: uncompressed SEC1 P-256 point (0x04 ‖ X ‖ Y)
//!   2: bstr(32),     ; receipt public key: Ed25519
//!   3: uint,         ; fleet key epoch
//!   4: uint,         ; the epoch's not_after, ms since the UNIX epoch
//!   5: tstr,         ; ARN of the KMS key that released the fleet key, as KMS answered it
//! }
//! ```
//!
//! Decoding accepts exactly the bytes [`UserDataBinding::encode`] produces: anything else
//! (unknown version, missing or extra keys, wrong lengths, invalid points, non-shortest or
//! reordered encodings, trailing bytes) is an error.

use super::cbor::{self, Value};
use crate::keys::{KeyId, key_id};
use crate::kms_arn::{KmsKeyArn, KmsKeyArnError};

/// The only binding version defined.
pub const BINDING_VERSION: u64 = 2;
/// Length of an uncompressed SEC1 P-256 point.
pub const FLEET_KEY_LEN: usize = 65;
/// Length of an Ed25519 public key.
pub const RECEIPT_KEY_LEN: usize = 32;

const KEY_VERSION: u64 = 0;
const KEY_FLEET: u64 = 1;
const KEY_RECEIPT: u64 = 2;
const KEY_EPOCH: u64 = 3;
const KEY_NOT_AFTER: u64 = 4;
const KEY_KMS_KEY: u64 = 5;
const KEYS: [u64; 6] = [KEY_VERSION, KEY_FLEET, KEY_RECEIPT, KEY_EPOCH, KEY_NOT_AFTER, KEY_KMS_KEY];

/// The keys an enclave publishes in its attestation document's `user_data`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDataBinding {
    /// HPKE fleet public key, uncompressed SEC1 P-256 (65 bytes, first byte 0x04).
    pub fleet_public_key: [u8; FLEET_KEY_LEN],
    /// Ed25519 receipt public key.
    pub receipt_public_key: [u8; RECEIPT_KEY_LEN],
    /// Fleet key epoch.
    pub epoch: u64,
    /// End of the epoch (the `not_after` of its KMS encryption context), ms since the UNIX epoch.
    pub not_after_ms: u64,
    /// The KMS key that released the fleet key, as KMS named it inside the enclave's own TLS
    /// session.
    pub kms_key: KmsKeyArn,
}

/// Why bytes are not a key binding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error("not well-formed CBOR: {0}")]
    Cbor(#[from] cbor::CborError),
    #[error("is a {0}, not a map")]
    NotMap(&'static str),
    #[error("unknown binding version {0} (only 2 is defined)")]
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
    #[error("KMS key: {0}")]
    KmsKey(#[from] KmsKeyArnError),
    #[error("not the deterministic encoding (keys out of order or non-shortest heads)")]
    NonCanonical,
}

impl UserDataBinding {
    /// Builds a binding, checking both keys are valid points.
    pub fn new(
        fleet_public_key: [u8; FLEET_KEY_LEN],
        receipt_public_key: [u8; RECEIPT_KEY_LEN],
        epoch: u64,
        not_after_ms: u64,
        kms_key: KmsKeyArn,
    ) -> Result<Self, BindingError> {
        check_fleet_key(&fleet_public_key)?;
        check_receipt_key(&receipt_public_key)?;
        Ok(UserDataBinding { fleet_public_key, receipt_public_key, epoch, not_after_ms, kms_key })
    }

    /// The deterministic CBOR encoding (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = cbor::Writer::new();
        w.map(KEYS.len())
            .unsigned(KEY_VERSION)
            .unsigned(BINDING_VERSION)
            .unsigned(KEY_FLEET)
            .bytes(&self.fleet_public_key)
            .unsigned(KEY_RECEIPT)
            .bytes(&self.receipt_public_key)
            .unsigned(KEY_EPOCH)
            .unsigned(self.epoch)
            .unsigned(KEY_NOT_AFTER)
            .unsigned(self.not_after_ms)
            .unsigned(KEY_KMS_KEY)
            .text(self.kms_key.as_str());
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
                Value::Unsigned(n) if KEYS.contains(n) => {}
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
        let unsigned = |key: u64| match get(key)? {
            Value::Unsigned(n) => Ok(*n),
            other => Err(wrong(key, "unsigned integer", other)),
        };
        let epoch = unsigned(KEY_EPOCH)?;
        let not_after_ms = unsigned(KEY_NOT_AFTER)?;
        let kms_key = match get(KEY_KMS_KEY)? {
            Value::Text(t) => t.parse::<KmsKeyArn>()?,
            other => return Err(wrong(KEY_KMS_KEY, "text string", other)),
        };
        let binding = UserDataBinding::new(fleet, receipt, epoch, not_after_ms, kms_key)?;
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

    /// The sample's map with entries replaced (`Some`) or left out (`None`), in the given order.
    fn encode_entries(entries: &[(u64, Option<&dyn Fn(&mut cbor::Writer)>)]) -> Vec<u8> {
        encode_with(|w| {
            w.map(entries.iter().filter(|(_, v)| v.is_some()).count());
            for (key, value) in entries {
                if let Some(value) = value {
                    w.unsigned(*key);
                    value(w);
                }
            }
        })
    }

    #[test]
    fn strict_decoding() {
        let b = sample();
        let good = b.encode();
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(UserDataBinding::decode(&trailing), Err(BindingError::Cbor(_))));

        let fleet = |w: &mut cbor::Writer| {
            w.bytes(&b.fleet_public_key);
        };
        let receipt = |w: &mut cbor::Writer| {
            w.bytes(&b.receipt_public_key);
        };
        let epoch = |w: &mut cbor::Writer| {
            w.unsigned(b.epoch);
        };
        let not_after = |w: &mut cbor::Writer| {
            w.unsigned(b.not_after_ms);
        };
        let kms = |w: &mut cbor::Writer| {
            w.text(b.kms_key.as_str());
        };
        let v2 = |w: &mut cbor::Writer| {
            w.unsigned(2);
        };
        let with = |key: u64, value: Option<&dyn Fn(&mut cbor::Writer)>| {
            let all: [(u64, Option<&dyn Fn(&mut cbor::Writer)>); 6] =
                [(0, Some(&v2)), (1, Some(&fleet)), (2, Some(&receipt)), (3, Some(&epoch)), (4, Some(&not_after)), (5, Some(&kms))];
            let entries: Vec<_> = all.into_iter().map(|(k, v)| if k == key { (k, value) } else { (k, v) }).collect();
            UserDataBinding::decode(&encode_entries(&entries))
        };
        assert_eq!(with(99, None), Ok(b.clone()), "the helper rebuilds the sample");

        let v1 = |w: &mut cbor::Writer| {
            w.unsigned(1);
        };
        assert_eq!(with(0, Some(&v1)), Err(BindingError::UnknownVersion(1)), "version 1 named no KMS key");
        let short_fleet = |w: &mut cbor::Writer| {
            w.bytes(&b.fleet_public_key[..64]);
        };
        assert_eq!(with(1, Some(&short_fleet)), Err(BindingError::FleetKeyLength(64)));
        let long_receipt = |w: &mut cbor::Writer| {
            w.bytes(&[0u8; 33]);
        };
        assert_eq!(with(2, Some(&long_receipt)), Err(BindingError::ReceiptKeyLength(33)));
        let mut bad_point = b.fleet_public_key;
        bad_point[64] ^= 1;
        let bad_fleet = |w: &mut cbor::Writer| {
            w.bytes(&bad_point);
        };
        assert_eq!(with(1, Some(&bad_fleet)), Err(BindingError::InvalidFleetKey));
        let alias = |w: &mut cbor::Writer| {
            w.text("alias/ephem-fleet");
        };
        assert!(matches!(with(5, Some(&alias)), Err(BindingError::KmsKey(_))), "an alias pins nothing");
        let kms_as_bytes = |w: &mut cbor::Writer| {
            w.bytes(b.kms_key.as_str().as_bytes());
        };
        assert!(matches!(with(5, Some(&kms_as_bytes)), Err(BindingError::WrongType { key: 5, .. })));
        assert_eq!(with(4, None), Err(BindingError::MissingKey(4)));
        assert_eq!(with(5, None), Err(BindingError::MissingKey(5)));

        let mut compressed = [0u8; 65];
        compressed[0] = 0x02;
        assert_eq!(
            UserDataBinding::new(compressed, b.receipt_public_key, 1, 2, b.kms_key.clone()),
            Err(BindingError::InvalidFleetKey)
        );

        let extra = encode_with(|w| {
            w.map(7).unsigned(0).unsigned(2).unsigned(1).bytes(&b.fleet_public_key);
            w.unsigned(2).bytes(&b.receipt_public_key).unsigned(3).unsigned(b.epoch);
            w.unsigned(4).unsigned(b.not_after_ms).unsigned(5).text(b.kms_key.as_str()).unsigned(6).null();
        });
        assert_eq!(UserDataBinding::decode(&extra), Err(BindingError::UnknownKey("6".into())));

        let reordered = encode_entries(&[
            (3, Some(&epoch)),
            (0, Some(&v2)),
            (1, Some(&fleet)),
            (2, Some(&receipt)),
            (4, Some(&not_after)),
            (5, Some(&kms)),
        ]);
        assert_eq!(UserDataBinding::decode(&reordered), Err(BindingError::NonCanonical));

        // Non-shortest head for the version (0x18 0x02 instead of 0x02).
        let mut long_head = vec![0xa6, 0x00, 0x18, 0x02];
        long_head.extend_from_slice(&good[3..]);
        assert_eq!(UserDataBinding::decode(&long_head), Err(BindingError::NonCanonical));

        assert!(matches!(UserDataBinding::decode(&[0x80]), Err(BindingError::NotMap("array"))));
        assert!(matches!(UserDataBinding::decode(b""), Err(BindingError::Cbor(_))));
    }
}
