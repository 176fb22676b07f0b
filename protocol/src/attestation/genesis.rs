//! The genesis binding: the `user_data` of the document an enclave makes when it has created a
//! fleet epoch itself (docs/protocol.md §7.3.1). It says: "KMS generated this P-256 key pair inside
//! my TLS session, under this KMS key, for this epoch, after I read the key's metadata, policy
//! and grants (the evidence with this digest) and found that only an enclave of my image can ever
//! have its private key." A client that verifies such a document of its measured image needs
//! no AWS credentials and no word from the operator to trust the fleet key it names.
//!
//! Encoding: deterministic CBOR, a map with unsigned integer keys in ascending order:
//!
//! ```text
//! {
//!   0: "ephem-batch/fleet-genesis/1",  ; a text label: never a `UserDataBinding` (whose 0 is a uint)
//!   1: bstr(65),   ; fleet public key, uncompressed SEC1 P-256
//!   3: uint,       ; epoch
//!   4: uint,       ; not_after, ms since the UNIX epoch
//!   5: tstr,       ; ARN of the KMS key that generated the pair, as KMS answered it
//!   6: bstr(32),   ; SHA-256 digest of the key evidence (`key_checks::KeyEvidence::digest`)
//! }
//! ```
//!
//! Decoding accepts exactly what [`GenesisBinding::encode`] produces.

use super::binding::{BindingError, FLEET_KEY_LEN, UserDataBinding};
use super::cbor::{self, Value};
use super::verify::VerifyOptions;
use crate::fleet::{EpochGenesis, MAX_EPOCH_LIFETIME_MS};
use crate::key_checks;
use crate::keys::key_id;
use crate::kms_arn::KmsKeyArn;

/// The label under key 0.
pub const GENESIS_LABEL: &str = "ephem-batch/fleet-genesis/1";

const KEY_LABEL: u64 = 0;
const KEY_FLEET: u64 = 1;
const KEY_EPOCH: u64 = 3;
const KEY_NOT_AFTER: u64 = 4;
const KEY_KMS_KEY: u64 = 5;
const KEY_EVIDENCE: u64 = 6;
const KEYS: [u64; 6] = [KEY_LABEL, KEY_FLEET, KEY_EPOCH, KEY_NOT_AFTER, KEY_KMS_KEY, KEY_EVIDENCE];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenesisBinding {
    pub fleet_public_key: [u8; FLEET_KEY_LEN],
    pub epoch: u64,
    pub not_after_ms: u64,
    pub kms_key: KmsKeyArn,
    pub evidence_digest: [u8; 32],
}

impl GenesisBinding {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = cbor::Writer::new();
        w.map(KEYS.len())
            .unsigned(KEY_LABEL)
            .text(GENESIS_LABEL)
            .unsigned(KEY_FLEET)
            .bytes(&self.fleet_public_key)
            .unsigned(KEY_EPOCH)
            .unsigned(self.epoch)
            .unsigned(KEY_NOT_AFTER)
            .unsigned(self.not_after_ms)
            .unsigned(KEY_KMS_KEY)
            .text(self.kms_key.as_str())
            .unsigned(KEY_EVIDENCE)
            .bytes(&self.evidence_digest);
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, BindingError> {
        let value = cbor::decode(bytes)?;
        let Value::Map(entries) = &value else {
            return Err(BindingError::NotMap(value.kind()));
        };
        for (k, _) in entries {
            match k {
                Value::Unsigned(n) if KEYS.contains(n) => {}
                Value::Unsigned(n) => return Err(BindingError::UnknownKey(n.to_string())),
                other => return Err(BindingError::UnknownKey(format!("a {}", other.kind()))),
            }
        }
        let get = |key: u64| {
            entries.iter().find(|(k, _)| *k == Value::Unsigned(key)).map(|(_, v)| v).ok_or(BindingError::MissingKey(key))
        };
        let wrong = |key: u64, expected: &'static str, found: &Value<'_>| BindingError::WrongType { key, expected, found: found.kind() };
        match get(KEY_LABEL)? {
            Value::Text(GENESIS_LABEL) => {}
            other => return Err(wrong(KEY_LABEL, "the genesis label", other)),
        }
        let fleet_public_key = match get(KEY_FLEET)? {
            Value::Bytes(b) => <[u8; FLEET_KEY_LEN]>::try_from(*b).map_err(|_| BindingError::FleetKeyLength(b.len()))?,
            other => return Err(wrong(KEY_FLEET, "byte string", other)),
        };
        if p256::PublicKey::from_sec1_bytes(&fleet_public_key).is_err() || fleet_public_key[0] != 0x04 {
            return Err(BindingError::InvalidFleetKey);
        }
        let unsigned = |key: u64| match get(key)? {
            Value::Unsigned(n) => Ok(*n),
            other => Err(wrong(key, "unsigned integer", other)),
        };
        let kms_key = match get(KEY_KMS_KEY)? {
            Value::Text(t) => t.parse::<KmsKeyArn>()?,
            other => return Err(wrong(KEY_KMS_KEY, "text string", other)),
        };
        let evidence_digest = match get(KEY_EVIDENCE)? {
            Value::Bytes(b) => <[u8; 32]>::try_from(*b).map_err(|_| wrong(KEY_EVIDENCE, "32-byte string", &Value::Bytes(b)))?,
            other => return Err(wrong(KEY_EVIDENCE, "byte string", other)),
        };
        let binding = GenesisBinding {
            fleet_public_key,
            epoch: unsigned(KEY_EPOCH)?,
            not_after_ms: unsigned(KEY_NOT_AFTER)?,
            kms_key,
            evidence_digest,
        };
        if binding.encode() != bytes {
            return Err(BindingError::NonCanonical);
        }
        Ok(binding)
    }
}

/// Why a fleet key's genesis does not vouch for it. Each variant names the check that failed
/// ([`GenesisError::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenesisError {
    /// The epoch has no genesis: its key was not created by an enclave of the image.
    #[error("fleet_key_genesis: epoch {0} has no genesis: its key was made outside an enclave, by whoever wrote its record")]
    Missing(u64),
    /// The stored genesis is not readable.
    #[error("fleet_key_genesis: {0}")]
    Unreadable(String),
    /// The genesis document fails the policy (its own check named).
    #[error("fleet_key_genesis_document: check `{check}` failed: {reason}")]
    Document { check: &'static str, reason: String },
    /// The document's `user_data` is not a genesis binding.
    #[error("fleet_key_genesis: the document's user_data is not a genesis binding: {0}")]
    NotGenesis(BindingError),
    /// The genesis is about another key, epoch, end or KMS key than the binding in use.
    #[error("fleet_key_genesis: the genesis names {field} {genesis}, the published binding {bound}")]
    Mismatch { field: &'static str, genesis: String, bound: String },
    /// The evidence stored beside the document is not what the enclave read.
    #[error("fleet_key_evidence: the stored key evidence does not have the digest the genesis document binds")]
    EvidenceDigest,
    /// The evidence fails the key checks as this client reads them.
    #[error("fleet_key_checks: {0}")]
    KeyChecks(String),
    /// The epoch lasts longer than any epoch may, from its genesis or its document.
    #[error("fleet_epoch_lifetime: epoch {epoch} ends at {not_after_ms} ms, more than {max_days} days after {from_ms} ms")]
    Lifetime { epoch: u64, not_after_ms: u64, from_ms: u64, max_days: u64 },
    /// The epoch has ended by the client's clock.
    #[error("fleet_epoch_expired: epoch {epoch} ended at {not_after_ms} ms; it is now {now_ms} ms")]
    Expired { epoch: u64, not_after_ms: u64, now_ms: u64 },
}

impl GenesisError {
    pub fn check(&self) -> &'static str {
        match self {
            GenesisError::Missing(_) | GenesisError::Unreadable(_) | GenesisError::NotGenesis(_) | GenesisError::Mismatch { .. } => {
                "fleet_key_genesis"
            }
            GenesisError::Document { .. } => "fleet_key_genesis_document",
            GenesisError::EvidenceDigest => "fleet_key_evidence",
            GenesisError::KeyChecks(_) => "fleet_key_checks",
            GenesisError::Lifetime { .. } => "fleet_epoch_lifetime",
            GenesisError::Expired { .. } => "fleet_epoch_expired",
        }
    }
}

/// `fleet_epoch_expired` and `fleet_epoch_lifetime` of a binding in a document dated
/// `document_ms`, at `now_ms`.
pub fn check_epoch_lifetime(binding: &UserDataBinding, document_ms: u64, now_ms: u64) -> Result<(), GenesisError> {
    if binding.not_after_ms <= now_ms {
        return Err(GenesisError::Expired { epoch: binding.epoch, not_after_ms: binding.not_after_ms, now_ms });
    }
    lifetime(binding.epoch, binding.not_after_ms, document_ms)
}

fn lifetime(epoch: u64, not_after_ms: u64, from_ms: u64) -> Result<(), GenesisError> {
    if not_after_ms.saturating_sub(from_ms) > MAX_EPOCH_LIFETIME_MS {
        return Err(GenesisError::Lifetime { epoch, not_after_ms, from_ms, max_days: MAX_EPOCH_LIFETIME_MS / 86_400_000 });
    }
    Ok(())
}

/// Checks that `genesis` vouches for the fleet key of `binding` (docs/protocol.md §7.3.1): its
/// document passes `options` (the client's signed policy, at the document's own time), its
/// `user_data` is a genesis binding naming the same key, epoch, end and KMS key, the stored
/// evidence has the digest it binds, and that evidence passes the key checks for the document's
/// own PCR0. Returns the genesis binding.
pub fn check_genesis(genesis: &EpochGenesis, binding: &UserDataBinding, options: &VerifyOptions) -> Result<GenesisBinding, GenesisError> {
    let document = genesis.document_bytes().map_err(|e| GenesisError::Unreadable(e.to_string()))?;
    let verified = super::verify(&document, options)
        .map_err(|e| GenesisError::Document { check: e.check().as_str(), reason: e.reason().to_string() })?;
    let user_data = verified.document.user_data.as_deref().unwrap_or_default();
    let born = GenesisBinding::decode(user_data).map_err(GenesisError::NotGenesis)?;
    let mismatch = |field, genesis: String, bound: String| Err(GenesisError::Mismatch { field, genesis, bound });
    if born.fleet_public_key != binding.fleet_public_key {
        return mismatch("fleet key", hex::encode(key_id(&born.fleet_public_key)), hex::encode(binding.fleet_key_id()));
    }
    if born.epoch != binding.epoch || genesis.epoch != binding.epoch {
        return mismatch("epoch", born.epoch.to_string(), binding.epoch.to_string());
    }
    if born.not_after_ms != binding.not_after_ms {
        return mismatch("not_after", born.not_after_ms.to_string(), binding.not_after_ms.to_string());
    }
    if born.kms_key != binding.kms_key {
        return mismatch("KMS key", born.kms_key.to_string(), binding.kms_key.to_string());
    }
    lifetime(born.epoch, born.not_after_ms, verified.document.timestamp_ms)?;
    if genesis.key_evidence.digest() != born.evidence_digest {
        return Err(GenesisError::EvidenceDigest);
    }
    let pcr0 = verified.document.pcr(0).unwrap_or_default();
    let report = key_checks::evaluate(&genesis.key_evidence, &born.kms_key, pcr0);
    if !report.passed() {
        return Err(GenesisError::KeyChecks(report.failures()));
    }
    Ok(born)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::{UserDataBinding, vectors};

    fn sample() -> GenesisBinding {
        let b = vectors::binding_sample();
        GenesisBinding {
            fleet_public_key: b.fleet_public_key,
            epoch: b.epoch,
            not_after_ms: b.not_after_ms,
            kms_key: b.kms_key,
            evidence_digest: [7; 32],
        }
    }

    #[test]
    fn round_trip_and_strictness() {
        let g = sample();
        let bytes = g.encode();
        assert_eq!(GenesisBinding::decode(&bytes).unwrap(), g);
        // Neither binding can be read as the other.
        assert!(UserDataBinding::decode(&bytes).is_err());
        assert!(GenesisBinding::decode(&vectors::binding_sample().encode()).is_err());
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(GenesisBinding::decode(&trailing).is_err());
        let mut bad_point = g.clone();
        bad_point.fleet_public_key[64] ^= 1;
        assert_eq!(GenesisBinding::decode(&bad_point.encode()), Err(BindingError::InvalidFleetKey));
    }
}
