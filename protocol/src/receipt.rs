//! Execution receipts: what the enclave signs when a job finishes (DESIGN.md §5 step 6).
//!
//! A receipt is a [COSE_Sign1](crate::cose) signed with the enclave's per-boot Ed25519 receipt
//! key, content type [`CONTENT_TYPE`], over a deterministic CBOR map (see `docs/protocol.md`).
//! The ledger stores these exact bytes as its leaves, so the schema is frozen by known-answer
//! vectors.

use std::collections::BTreeMap;

use ed25519_dalek::{SigningKey, VerifyingKey};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::cbor::{self, CborError, MapBuilder, MapReader};
use crate::cose::{self, CoseError, Sign1};
use crate::envelope::{JobId, JobOptions};
use crate::keys::KeyId;

pub const CONTENT_TYPE: &str = "application/vnd.ephem-batch.receipt.v1+cbor";
const COMMITMENT_LABEL: &[u8] = b"ephem-batch/v1 plaintext commitment";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt envelope: {0}")]
    Cose(#[from] CoseError),
    #[error("receipt payload: {0}")]
    Payload(#[from] CborError),
    #[error("receipt payload: {0}")]
    Invalid(&'static str),
}

/// What a receipt states about one finished job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub job_id: JobId,
    /// SHA-256 of the sealed input object, byte for byte.
    pub input_sha256: [u8; 32],
    /// SHA-256 of the sealed output object, byte for byte.
    pub output_sha256: [u8; 32],
    pub records_ok: u64,
    pub records_failed: u64,
    pub tokens: u64,
    pub model_id: String,
    pub manifest_hash: [u8; 32],
    pub options: JobOptions,
    pub result_key_id: KeyId,
    pub attempt: u64,
    /// SHA-256 of the published attestation document that binds the receipt key.
    pub attestation_sha256: [u8; 32],
    /// The enclave's measurements, copied from that document (PCR index → value).
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub fleet_key_id: KeyId,
    pub epoch: u64,
    pub started_ms: u64,
    pub finished_ms: u64,
    /// HMAC-SHA256 under the envelope's commitment key; see [`PlaintextCommitment`].
    pub commitment: [u8; 32],
    /// The root of the per-record tree ([`crate::record_tree`]) over the `records_ok` embedded
    /// records; `None` in receipts of enclaves from before it.
    pub records_root: Option<[u8; 32]>,
}

impl Receipt {
    pub fn to_payload(&self) -> Vec<u8> {
        let mut map = MapBuilder::new();
        if let Some(root) = &self.records_root {
            map = map.bytes("records", root);
        }
        cbor::encode(
            &map
                .uint("v", 1)
                .bytes("job", &self.job_id.0)
                .uint("ok", self.records_ok)
                .uint("epoch", self.epoch)
                .text("model", &self.model_id)
                .value("pcrs", cbor::uint_map(&self.pcrs))
                .bytes("input", &self.input_sha256)
                .uint("failed", self.records_failed)
                .bytes("output", &self.output_sha256)
                .uint("tokens", self.tokens)
                .uint("attempt", self.attempt)
                .bytes("manifest", &self.manifest_hash)
                .value("options", self.options.to_cbor())
                .bytes("fleet_key", &self.fleet_key_id)
                .bytes("commitment", &self.commitment)
                .bytes("result_key", &self.result_key_id)
                .uint("started_ms", self.started_ms)
                .bytes("attestation", &self.attestation_sha256)
                .uint("finished_ms", self.finished_ms)
                .build(),
        )
    }

    pub fn from_payload(bytes: &[u8]) -> Result<Self, ReceiptError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(ReceiptError::Invalid("unknown receipt version"));
        }
        let receipt = Self {
            job_id: JobId(map.array("job")?),
            input_sha256: map.array("input")?,
            output_sha256: map.array("output")?,
            records_ok: map.uint("ok")?,
            records_failed: map.uint("failed")?,
            tokens: map.uint("tokens")?,
            model_id: map.text("model")?,
            manifest_hash: map.array("manifest")?,
            options: JobOptions::read(map.map("options")?).map_err(|_| ReceiptError::Invalid("options"))?,
            result_key_id: map.array("result_key")?,
            attempt: map.uint("attempt")?,
            attestation_sha256: map.array("attestation")?,
            pcrs: cbor::read_uint_map(map.take("pcrs")?, "pcrs")?,
            fleet_key_id: map.array("fleet_key")?,
            epoch: map.uint("epoch")?,
            started_ms: map.uint("started_ms")?,
            finished_ms: map.uint("finished_ms")?,
            commitment: map.array("commitment")?,
            records_root: map.optional_array("records")?,
        };
        map.finish()?;
        if receipt.finished_ms < receipt.started_ms {
            return Err(ReceiptError::Invalid("finished before it started"));
        }
        if !crate::envelope::valid_model_id(&receipt.model_id) {
            return Err(ReceiptError::Invalid("model id"));
        }
        Ok(receipt)
    }

    /// Signs with the enclave's receipt key; the result is what the ledger stores.
    pub fn sign(&self, key: &SigningKey) -> Vec<u8> {
        cose::sign(self.to_payload(), CONTENT_TYPE, key)
    }
}

/// A decoded receipt whose signature has not been checked yet.
#[derive(Debug, Clone)]
pub struct SignedReceipt {
    /// Key id of the receipt key that signed it.
    pub kid: KeyId,
    pub receipt: Receipt,
    message: Sign1,
}

impl SignedReceipt {
    pub fn decode(bytes: &[u8]) -> Result<Self, ReceiptError> {
        let message = Sign1::decode(bytes, CONTENT_TYPE)?;
        let receipt = Receipt::from_payload(&message.payload)?;
        Ok(Self { kid: message.kid, receipt, message })
    }

    /// Verifies the signature with the receipt key the attestation document binds.
    pub fn verify(&self, receipt_key: &VerifyingKey) -> Result<&Receipt, ReceiptError> {
        self.message.verify(receipt_key)?;
        Ok(&self.receipt)
    }
}

/// Keyed commitment to a job's plaintext: HMAC-SHA256(k, label ‖ SHA-256(input plaintext) ‖
/// SHA-256(output plaintext)), where k is exported from the job envelope's HPKE context. The
/// client, who sealed the job, can recompute it; without k, nobody can test guesses of the text.
#[derive(Clone, Default)]
pub struct PlaintextCommitment {
    input: Sha256,
    output: Sha256,
}

impl PlaintextCommitment {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds plaintext of the input record stream, in order.
    pub fn input(&mut self, bytes: &[u8]) {
        self.input.update(bytes);
    }

    /// Feeds plaintext of the output record stream, in order.
    pub fn output(&mut self, bytes: &[u8]) {
        self.output.update(bytes);
    }

    pub fn finish(self, key: &[u8; 32]) -> [u8; 32] {
        Self::from_digests(key, &self.input.finalize().into(), &self.output.finalize().into())
    }

    /// The commitment from the two streams' SHA-256 digests (a client that hashed its input
    /// when it sealed, and its output when it opened the result).
    pub fn from_digests(key: &[u8; 32], input_sha256: &[u8; 32], output_sha256: &[u8; 32]) -> [u8; 32] {
        // HMAC accepts keys of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(COMMITMENT_LABEL);
        mac.update(input_sha256);
        mac.update(output_sha256);
        mac.finalize().into_bytes().into()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::envelope::{OutputDtype, Precision};

    pub(crate) fn sample() -> Receipt {
        Receipt {
            job_id: JobId([0x10; 16]),
            input_sha256: [0x21; 32],
            output_sha256: [0x22; 32],
            records_ok: 998,
            records_failed: 2,
            tokens: 89_123,
            model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
            manifest_hash: [0x33; 32],
            options: JobOptions { truncate: true, normalize: true, dtype: OutputDtype::F32, precision: Precision::Fp32, ..JobOptions::default() },
            result_key_id: [0x44; 32],
            attempt: 1,
            attestation_sha256: [0x55; 32],
            pcrs: [(0u8, vec![0xa0; 48]), (1, vec![0xa1; 48]), (2, vec![0xa2; 48])].into_iter().collect(),
            fleet_key_id: [0x66; 32],
            epoch: 7,
            started_ms: 1_760_000_000_000,
            finished_ms: 1_760_000_012_345,
            commitment: [0x77; 32],
            records_root: None,
        }
    }

    #[test]
    fn sign_decode_verify() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let bytes = sample().sign(&key);
        let signed = SignedReceipt::decode(&bytes).unwrap();
        assert_eq!(signed.verify(&key.verifying_key()).unwrap(), &sample());
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(matches!(signed.verify(&other.verifying_key()), Err(ReceiptError::Cose(CoseError::WrongKey { .. }))));
    }

    #[test]
    fn every_payload_byte_is_covered_by_the_signature() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let bytes = sample().sign(&key);
        let payload = sample().to_payload();
        let start = bytes.windows(payload.len()).position(|w| w == payload).unwrap();
        for i in 0..payload.len() {
            let mut tampered = bytes.clone();
            tampered[start + i] ^= 0x01;
            let verified = SignedReceipt::decode(&tampered).and_then(|s| s.verify(&key.verifying_key()).cloned());
            assert!(verified.is_err(), "flipping payload byte {i} went unnoticed");
        }
    }

    #[test]
    fn commitment_depends_on_key_and_both_streams() {
        let mut c = PlaintextCommitment::new();
        c.input(b"in");
        c.output(b"out");
        let a = c.clone().finish(&[1; 32]);
        assert_ne!(a, c.clone().finish(&[2; 32]));
        let mut d = PlaintextCommitment::new();
        d.input(b"in");
        d.output(b"ou");
        assert_ne!(a, d.finish(&[1; 32]));
    }
}
