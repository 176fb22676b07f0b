//! The fleet key of one epoch as the rotation step stores it (`fleet-keys/epoch-<N>.json`): the
//! public key and the private key wrapped by KMS (`GenerateDataKeyPairWithoutPlaintext`, key spec
//! ECC_NIST_P256, encryption context {"epoch": N, "not_after": unix ms}). Only enclaves can
//! unwrap it (KMS `Decrypt` with `Recipient`).
//!
//! ```json
//! {"epoch": 3, "not_after_ms": 1767225600000, "kms_key_id": "…",
//!  "public_key": "04…(65 bytes, hex)", "wrapped_private_key": "…(hex)"}
//! ```
//!
//! Everything in this record comes through the untrusted host. The enclave uses it only to ask
//! KMS; it derives the public key from the private key KMS releases and checks it against
//! `public_key`, and it refuses an epoch whose `not_after` has passed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::envelope::FleetPublicKey;
use crate::key_checks::KeyEvidence;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochRecordError {
    #[error("fleet epoch record is not valid JSON: {0}")]
    Json(String),
    #[error("fleet epoch record: {0}")]
    Invalid(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochRecord {
    pub epoch: u64,
    pub not_after_ms: u64,
    pub kms_key_id: String,
    /// Uncompressed SEC1 P-256 point, hex.
    pub public_key: String,
    /// KMS `PrivateKeyCiphertextBlob`, hex.
    pub wrapped_private_key: String,
}

impl EpochRecord {
    pub fn from_json(bytes: &[u8]) -> Result<Self, EpochRecordError> {
        let record: Self = serde_json::from_slice(bytes).map_err(|e| EpochRecordError::Json(e.to_string()))?;
        record.public_key()?;
        record.wrapped()?;
        Ok(record)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn public_key(&self) -> Result<FleetPublicKey, EpochRecordError> {
        let bytes = hex::decode(&self.public_key).map_err(|_| EpochRecordError::Invalid("public_key is not hex"))?;
        FleetPublicKey::from_bytes(&bytes).map_err(|_| EpochRecordError::Invalid("public_key is not a P-256 point"))
    }

    pub fn wrapped(&self) -> Result<Vec<u8>, EpochRecordError> {
        let bytes = hex::decode(&self.wrapped_private_key)
            .map_err(|_| EpochRecordError::Invalid("wrapped_private_key is not hex"))?;
        if bytes.is_empty() {
            return Err(EpochRecordError::Invalid("wrapped_private_key is empty"));
        }
        Ok(bytes)
    }

    /// The KMS encryption context the key was generated under.
    pub fn encryption_context(&self) -> BTreeMap<String, String> {
        encryption_context(self.epoch, self.not_after_ms)
    }
}

/// {"epoch": N, "not_after": ms}, both decimal.
pub fn encryption_context(epoch: u64, not_after_ms: u64) -> BTreeMap<String, String> {
    [("epoch".to_owned(), epoch.to_string()), ("not_after".to_owned(), not_after_ms.to_string())].into_iter().collect()
}

/// How an epoch came to be, when an enclave created it (`fleet-genesis/epoch-<N>.json`,
/// docs/protocol.md §7.3.1): the enclave's attestation document whose `user_data` is the genesis
/// binding, and what KMS said about the key (whose digest that binding carries). A client seals
/// only to an epoch that has one; everything in it is checked, nothing trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochGenesis {
    pub epoch: u64,
    /// The genesis attestation document (COSE_Sign1), hex.
    pub document: String,
    pub key_evidence: KeyEvidence,
}

impl EpochGenesis {
    pub fn from_json(bytes: &[u8]) -> Result<Self, EpochRecordError> {
        let genesis: Self = serde_json::from_slice(bytes).map_err(|e| EpochRecordError::Json(e.to_string()))?;
        genesis.document_bytes()?;
        Ok(genesis)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn document_bytes(&self) -> Result<Vec<u8>, EpochRecordError> {
        hex::decode(&self.document).map_err(|_| EpochRecordError::Invalid("genesis document is not hex"))
    }
}

/// The longest an epoch may last from its creation (and from any document binding it): a
/// client refuses a binding whose `not_after` is further out, an enclave creates none such.
pub const MAX_EPOCH_LIFETIME_MS: u64 = 30 * 24 * 3600 * 1000;

/// Where epochs' geneses are stored.
pub const GENESIS_PREFIX: &str = "fleet-genesis/";

/// Object key of an epoch's genesis.
pub fn genesis_object_key(epoch: u64) -> String {
    format!("{GENESIS_PREFIX}epoch-{epoch}.json")
}

/// Object key of an epoch's record.
pub fn epoch_object_key(epoch: u64) -> String {
    format!("fleet-keys/epoch-{epoch}.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::FleetSecretKey;

    #[test]
    fn round_trip_and_refusals() {
        let key = FleetSecretKey::generate();
        let record = EpochRecord {
            epoch: 3,
            not_after_ms: 10,
            kms_key_id: "k".into(),
            public_key: hex::encode(key.public_key().to_bytes()),
            wrapped_private_key: "00ff".into(),
        };
        let parsed = EpochRecord::from_json(record.to_json().as_bytes()).unwrap();
        assert_eq!(parsed, record);
        assert_eq!(parsed.public_key().unwrap(), key.public_key());
        assert_eq!(parsed.encryption_context()["not_after"], "10");
        let mut bad = record.clone();
        bad.public_key = "04".into();
        assert!(EpochRecord::from_json(bad.to_json().as_bytes()).is_err());
        assert!(EpochRecord::from_json(br#"{"epoch":1}"#).is_err());
    }
}
