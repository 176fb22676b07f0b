//! Usage receipts: what the enclave signs about the online requests it served for one client
//! label, model and precision during one period (docs/protocol.md §9.5). No text, no vector: counts
//! and a hash commitment a client holding its own requests and responses can recompute.
//!
//! Like a job receipt, a COSE_Sign1 by the enclave's per-boot receipt key, content type
//! [`CONTENT_TYPE`], over a deterministic CBOR map; the ledger stores these exact bytes.

use std::collections::BTreeMap;

use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::cbor::{self, MapBuilder, MapReader};
use crate::cose::{self, Sign1};
use crate::envelope::{valid_model_id, Precision};
use crate::keys::KeyId;
use crate::online::ClientLabel;
use crate::receipt::ReceiptError;

pub const CONTENT_TYPE: &str = "application/vnd.ephem-batch.usage.v1+cbor";
const COMMITMENT_LABEL: &[u8] = b"ephem-batch/v1 usage commitment";

/// What one usage receipt states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReceipt {
    pub client: ClientLabel,
    pub model_id: String,
    pub manifest_hash: [u8; 32],
    pub precision: Precision,
    /// The period: `[start, end)`, ms since the UNIX epoch, enclave time.
    pub period_start_ms: u64,
    pub period_end_ms: u64,
    /// Requests answered (successes and OpenAI-shaped errors alike).
    pub requests: u64,
    /// Inputs embedded and the tokens they had.
    pub inputs: u64,
    pub tokens: u64,
    /// [`UsageCommitment`] over every answered request and its response, in order.
    pub commitment: [u8; 32],
    /// This enclave's count of usage receipts before this one: a gap shows a withheld receipt.
    pub sequence: u64,
    pub attestation_sha256: [u8; 32],
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub fleet_key_id: KeyId,
    pub epoch: u64,
}

impl UsageReceipt {
    pub fn to_payload(&self) -> Vec<u8> {
        cbor::encode(
            &MapBuilder::new()
                .uint("v", 1)
                .bytes("client", &self.client.0)
                .text("model", &self.model_id)
                .bytes("manifest", &self.manifest_hash)
                .text("precision", self.precision.as_str())
                .uint("start_ms", self.period_start_ms)
                .uint("end_ms", self.period_end_ms)
                .uint("requests", self.requests)
                .uint("inputs", self.inputs)
                .uint("tokens", self.tokens)
                .bytes("commitment", &self.commitment)
                .uint("sequence", self.sequence)
                .bytes("attestation", &self.attestation_sha256)
                .value("pcrs", cbor::uint_map(&self.pcrs))
                .bytes("fleet_key", &self.fleet_key_id)
                .uint("epoch", self.epoch)
                .build(),
        )
    }

    pub fn from_payload(bytes: &[u8]) -> Result<Self, ReceiptError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(ReceiptError::Invalid("unknown usage receipt version"));
        }
        let precision = Precision::parse(&map.text("precision")?).ok_or(ReceiptError::Invalid("precision"))?;
        let receipt = Self {
            client: ClientLabel(map.array("client")?),
            model_id: map.text("model")?,
            manifest_hash: map.array("manifest")?,
            precision,
            period_start_ms: map.uint("start_ms")?,
            period_end_ms: map.uint("end_ms")?,
            requests: map.uint("requests")?,
            inputs: map.uint("inputs")?,
            tokens: map.uint("tokens")?,
            commitment: map.array("commitment")?,
            sequence: map.uint("sequence")?,
            attestation_sha256: map.array("attestation")?,
            pcrs: cbor::read_uint_map(map.take("pcrs")?, "pcrs")?,
            fleet_key_id: map.array("fleet_key")?,
            epoch: map.uint("epoch")?,
        };
        map.finish()?;
        if receipt.period_end_ms <= receipt.period_start_ms {
            return Err(ReceiptError::Invalid("period ends before it starts"));
        }
        if !valid_model_id(&receipt.model_id) {
            return Err(ReceiptError::Invalid("model id"));
        }
        Ok(receipt)
    }

    pub fn sign(&self, key: &SigningKey) -> Vec<u8> {
        cose::sign(self.to_payload(), CONTENT_TYPE, key)
    }

    /// A stable id for the ledger: the receipt key's id and the sequence number name one receipt.
    pub fn usage_id(receipt_key_id: &KeyId, sequence: u64) -> [u8; 16] {
        let digest = Sha256::new()
            .chain_update(b"ephem-batch/v1 usage id")
            .chain_update(receipt_key_id)
            .chain_update(sequence.to_be_bytes())
            .finalize();
        digest[..16].try_into().unwrap_or_default()
    }
}

/// Whether `leaf` declares itself a usage receipt (nothing else checked): which strict decoder
/// a ledger leaf goes to. Anything else goes to the job receipt's, which refuses what it is not.
pub fn is_usage_receipt(leaf: &[u8]) -> bool {
    cose::declared_content_type(leaf).as_deref() == Some(CONTENT_TYPE)
}

/// A decoded usage receipt whose signature has not been checked yet.
#[derive(Debug, Clone)]
pub struct SignedUsageReceipt {
    pub kid: KeyId,
    pub receipt: UsageReceipt,
    message: Sign1,
}

impl SignedUsageReceipt {
    pub fn decode(bytes: &[u8]) -> Result<Self, ReceiptError> {
        let message = Sign1::decode(bytes, CONTENT_TYPE)?;
        let receipt = UsageReceipt::from_payload(&message.payload)?;
        Ok(Self { kid: message.kid, receipt, message })
    }

    pub fn verify(&self, receipt_key: &VerifyingKey) -> Result<&UsageReceipt, ReceiptError> {
        self.message.verify(receipt_key)?;
        Ok(&self.receipt)
    }

    pub fn usage_id(&self) -> [u8; 16] {
        UsageReceipt::usage_id(&self.kid, self.receipt.sequence)
    }
}

/// `c₀ = 0³²`, `cᵢ = SHA-256(label ‖ cᵢ₋₁ ‖ SHA-256(requestᵢ) ‖ SHA-256(responseᵢ))` over the
/// Binary HTTP plaintexts: order and content of every exchange, recomputable by their client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsageCommitment(pub [u8; 32]);

impl UsageCommitment {
    pub fn absorb(&mut self, request: &[u8], response: &[u8]) {
        self.absorb_digests(&Sha256::digest(request).into(), &Sha256::digest(response).into());
    }

    /// [`UsageCommitment::absorb`] from the exchange's SHA-256 digests (what a client logs).
    pub fn absorb_digests(&mut self, request: &[u8; 32], response: &[u8; 32]) {
        self.0 = Sha256::new().chain_update(COMMITMENT_LABEL).chain_update(self.0).chain_update(request).chain_update(response).finalize().into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> UsageReceipt {
        UsageReceipt {
            client: ClientLabel([3; 32]),
            model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
            manifest_hash: [4; 32],
            precision: Precision::Bf16,
            period_start_ms: 60_000,
            period_end_ms: 120_000,
            requests: 5,
            inputs: 9,
            tokens: 70,
            commitment: [5; 32],
            sequence: 2,
            attestation_sha256: [6; 32],
            pcrs: [(0u8, vec![7; 48])].into_iter().collect(),
            fleet_key_id: [8; 32],
            epoch: 1,
        }
    }

    #[test]
    fn signs_verifies_and_refuses_another_key_or_a_changed_byte() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let bytes = sample().sign(&key);
        let signed = SignedUsageReceipt::decode(&bytes).unwrap();
        assert_eq!(signed.verify(&key.verifying_key()).unwrap(), &sample());
        assert!(signed.verify(&SigningKey::from_bytes(&[2; 32]).verifying_key()).is_err());
        let mut tampered = bytes.clone();
        let at = tampered.len() - 70;
        tampered[at] ^= 1;
        assert!(SignedUsageReceipt::decode(&tampered).and_then(|s| s.verify(&key.verifying_key()).cloned()).is_err());
        // A job receipt's content type is not a usage receipt's, and the other way round.
        assert!(crate::receipt::SignedReceipt::decode(&bytes).is_err());
        assert!(is_usage_receipt(&bytes));
        assert!(!is_usage_receipt(&crate::cose::sign(b"x".to_vec(), crate::receipt::CONTENT_TYPE, &key)));
        assert!(!is_usage_receipt(b"not cose"));
        assert_ne!(signed.usage_id(), UsageReceipt::usage_id(&signed.kid, 3));
    }

    #[test]
    fn commitment_depends_on_order_and_content() {
        let mut a = UsageCommitment::default();
        a.absorb(b"q1", b"r1");
        a.absorb(b"q2", b"r2");
        let mut b = UsageCommitment::default();
        b.absorb(b"q2", b"r2");
        b.absorb(b"q1", b"r1");
        assert_ne!(a, b);
        let mut c = UsageCommitment::default();
        c.absorb(b"q1", b"r1");
        c.absorb(b"q2", b"r3");
        assert_ne!(a, c);
    }

    #[test]
    fn an_empty_period_is_refused() {
        let mut receipt = sample();
        receipt.period_end_ms = receipt.period_start_ms;
        assert!(UsageReceipt::from_payload(&receipt.to_payload()).is_err());
    }
}
