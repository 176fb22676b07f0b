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
use crate::envelope::{JobId, JobOptions, Precision};
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
    /// How a bf16 or int8 job's dense products ran; `None` for fp32 jobs and in receipts of
    /// enclaves from before it.
    pub compute: Option<Compute>,
}

/// The unit that ran a reduced arithmetic's dense products, chosen by the enclave at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeUnit {
    /// AVX-512 vectors (`vdpbf16ps`, `vpdpbusd`).
    Avx512,
    /// AMX tiles (`tdpbf16ps`, `tdpbusd`).
    Amx,
    /// AVX2 vectors, int8 only (`vpmaddwd` on operands widened to i16), on a CPU without
    /// AVX-512 VNNI.
    Avx2,
}

impl ComputeUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512",
            Self::Amx => "amx",
            Self::Avx2 => "avx2",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "avx512" => Some(Self::Avx512),
            "amx" => Some(Self::Amx),
            "avx2" => Some(Self::Avx2),
            _ => None,
        }
    }
}

/// What `options.precision` alone does not say about a bf16 or int8 job: the unit of each
/// reduced arithmetic its products used and, for int8, the short records it computed wider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compute {
    /// The unit of the bf16 products, if the job's mode has any (a bf16 job; an int8 job's
    /// products kept wider, where bf16 is faster than f32 on the enclave's CPU).
    pub bf16: Option<ComputeUnit>,
    /// The unit of the int8 products (int8 jobs).
    pub int8: Option<ComputeUnit>,
    /// int8 jobs: the records computed at a wider precision because they are short.
    pub short: Option<ShortRecords>,
}

/// An int8 job's records of at most `max_tokens` tokens (`[CLS]` and `[SEP]` included) ran every
/// dense product at `precision` (bf16, or fp32 where bf16 is not faster) instead of int8,
/// since int8's accuracy bound does not hold on such short texts; `records` of the job's
/// `records_ok` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortRecords {
    pub max_tokens: u32,
    pub precision: Precision,
    pub records: u64,
}

impl Compute {
    /// `{"units": {"bf16"?: unit, "int8"?: unit}, "short"?: {"tokens", "records", "precision"}}`.
    pub fn to_cbor(&self) -> ciborium::Value {
        let mut units = MapBuilder::new();
        if let Some(unit) = self.bf16 {
            units = units.text("bf16", unit.as_str());
        }
        if let Some(unit) = self.int8 {
            units = units.text("int8", unit.as_str());
        }
        let mut map = MapBuilder::new().value("units", units.build());
        if let Some(short) = &self.short {
            map = map.value(
                "short",
                MapBuilder::new()
                    .uint("tokens", u64::from(short.max_tokens))
                    .uint("records", short.records)
                    .text("precision", short.precision.as_str())
                    .build(),
            );
        }
        map.build()
    }

    /// Strict: no unknown key or unit (nor `avx2` for bf16, which has none), at least one unit, a
    /// short precision of bf16 or fp32.
    pub fn read(mut map: MapReader) -> Result<Self, ReceiptError> {
        let mut units = map.map("units")?;
        let unit = |units: &mut MapReader, key: &'static str| -> Result<Option<ComputeUnit>, ReceiptError> {
            match units.optional(key) {
                None => Ok(None),
                Some(ciborium::Value::Text(text)) => {
                    ComputeUnit::parse(&text).map(Some).ok_or(ReceiptError::Invalid("compute: unknown unit"))
                }
                Some(_) => Err(CborError::WrongType(key).into()),
            }
        };
        let (bf16, int8) = (unit(&mut units, "bf16")?, unit(&mut units, "int8")?);
        units.finish()?;
        if bf16 == Some(ComputeUnit::Avx2) {
            return Err(ReceiptError::Invalid("compute: bf16 has no avx2 unit"));
        }
        if bf16.is_none() && int8.is_none() {
            return Err(ReceiptError::Invalid("compute: no unit"));
        }
        let short = match map.optional("short") {
            None => None,
            Some(value) => {
                let mut short = MapReader::new(value).map_err(|_| CborError::WrongType("short"))?;
                let max_tokens = u32::try_from(short.uint("tokens")?).map_err(|_| CborError::WrongType("tokens"))?;
                let records = short.uint("records")?;
                let precision = match Precision::parse(&short.text("precision")?) {
                    Some(p @ (Precision::Bf16 | Precision::Fp32)) => p,
                    _ => return Err(ReceiptError::Invalid("compute: short precision")),
                };
                short.finish()?;
                Some(ShortRecords { max_tokens, precision, records })
            }
        };
        map.finish()?;
        Ok(Self { bf16, int8, short })
    }

    /// Whether it fits a receipt of a job at `precision` with `records_ok` embedded records:
    /// the job's own arithmetic has its unit, short records only in int8 jobs and never more
    /// than were embedded, at bf16 only with bf16's unit named.
    fn fits(&self, precision: Precision, records_ok: u64) -> bool {
        let own = match precision {
            Precision::Fp32 => false,
            Precision::Bf16 => self.bf16.is_some() && self.int8.is_none() && self.short.is_none(),
            Precision::Int8 => self.int8.is_some(),
        };
        own && self.short.is_none_or(|s| {
            precision == Precision::Int8 && s.records <= records_ok && (s.precision == Precision::Fp32 || self.bf16.is_some())
        })
    }
}

impl Receipt {
    pub fn to_payload(&self) -> Vec<u8> {
        let mut map = MapBuilder::new();
        if let Some(root) = &self.records_root {
            map = map.bytes("records", root);
        }
        if let Some(compute) = &self.compute {
            map = map.value("compute", compute.to_cbor());
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
            compute: match map.optional("compute") {
                None => None,
                Some(value) => Some(Compute::read(MapReader::new(value).map_err(|_| CborError::WrongType("compute"))?)?),
            },
        };
        map.finish()?;
        if receipt.compute.as_ref().is_some_and(|c| !c.fits(receipt.options.precision, receipt.records_ok)) {
            return Err(ReceiptError::Invalid("compute does not fit the job's precision"));
        }
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
            compute: None,
        }
    }

    /// An int8 job's receipt, its short records at bf16.
    fn int8_sample() -> Receipt {
        let mut receipt = sample();
        receipt.options.precision = Precision::Int8;
        receipt.compute = Some(Compute {
            bf16: Some(ComputeUnit::Avx512),
            int8: Some(ComputeUnit::Amx),
            short: Some(ShortRecords { max_tokens: 8, precision: Precision::Bf16, records: 12 }),
        });
        receipt
    }

    /// A payload with `edit` applied to its decoded map, every map's keys put in deterministic
    /// order again.
    fn edited(receipt: &Receipt, edit: impl FnOnce(&mut ciborium::Value)) -> Vec<u8> {
        fn canonical(value: &mut ciborium::Value) {
            if let ciborium::Value::Map(entries) = value {
                entries.iter_mut().for_each(|(_, v)| canonical(v));
                entries.sort_by_key(|(k, _)| {
                    let key = cbor::encode(k);
                    (key.len(), key)
                });
            }
        }
        let mut value = cbor::decode_deterministic(&receipt.to_payload()).unwrap();
        edit(&mut value);
        canonical(&mut value);
        cbor::encode(&value)
    }

    fn text(s: &str) -> ciborium::Value {
        ciborium::Value::Text(s.into())
    }

    /// The value at `path` of nested maps.
    fn at<'v>(value: &'v mut ciborium::Value, path: &[&str]) -> &'v mut ciborium::Value {
        match path.split_first() {
            None => value,
            Some((key, rest)) => {
                let ciborium::Value::Map(entries) = value else { panic!("{key}: not a map") };
                at(&mut entries.iter_mut().find(|(k, _)| *k == text(key)).unwrap().1, rest)
            }
        }
    }

    /// Adds `key: "x"` to the map at `path`.
    fn add_key(value: &mut ciborium::Value, path: &[&str], key: &str) {
        let ciborium::Value::Map(entries) = at(value, path) else { panic!("not a map") };
        entries.push((text(key), text("x")));
    }

    #[test]
    fn compute_round_trips_and_is_absent_unless_set() {
        let receipt = int8_sample();
        assert_eq!(Receipt::from_payload(&receipt.to_payload()).unwrap(), receipt);
        let payload = receipt.to_payload();
        // The nested maps' keys are in deterministic order too (the strict decoder checks it).
        assert!(payload.windows(7).any(|w| w == b"compute"));
        // A receipt without it (fp32, or from an enclave before it) encodes as before: no key.
        assert!(!sample().to_payload().windows(7).any(|w| w == b"compute"));
        // A bf16 job names only bf16's unit; an int8 job without fast bf16 its short records at fp32.
        let mut bf16 = sample();
        bf16.options.precision = Precision::Bf16;
        bf16.compute = Some(Compute { bf16: Some(ComputeUnit::Avx512), int8: None, short: None });
        assert_eq!(Receipt::from_payload(&bf16.to_payload()).unwrap(), bf16);
        let mut no_bf16 = int8_sample();
        no_bf16.compute = Some(Compute {
            bf16: None,
            int8: Some(ComputeUnit::Avx512),
            short: Some(ShortRecords { max_tokens: 8, precision: Precision::Fp32, records: 0 }),
        });
        assert_eq!(Receipt::from_payload(&no_bf16.to_payload()).unwrap(), no_bf16);
        // An int8 job on a CPU without AVX-512 VNNI.
        let avx2 = Receipt { compute: Some(Compute { int8: Some(ComputeUnit::Avx2), ..no_bf16.compute.clone().unwrap() }), ..no_bf16 };
        assert_eq!(Receipt::from_payload(&avx2.to_payload()).unwrap(), avx2);
    }

    #[test]
    fn compute_is_decoded_strictly() {
        let receipt = int8_sample();
        let compute = |receipt: &Receipt| receipt.compute.clone().unwrap();
        let with = |c: Compute| Receipt { compute: Some(c), ..int8_sample() }.to_payload();
        let refused = |payload: &[u8], why: &str| {
            assert!(Receipt::from_payload(payload).is_err(), "{why}: decoded");
        };
        // Facts that do not fit the job.
        refused(&Receipt { options: JobOptions { precision: Precision::Fp32, ..receipt.options.clone() }, ..receipt.clone() }.to_payload(), "an fp32 job with compute");
        refused(&Receipt { options: JobOptions { precision: Precision::Bf16, ..receipt.options.clone() }, ..receipt.clone() }.to_payload(), "a bf16 job with short records");
        refused(&with(Compute { int8: None, ..compute(&receipt) }), "an int8 job without int8's unit");
        refused(&with(Compute { bf16: None, ..compute(&receipt) }), "short records at bf16 without bf16's unit");
        let mut many = compute(&receipt);
        many.short.as_mut().unwrap().records = receipt.records_ok + 1;
        refused(&with(many), "more short records than embedded");
        refused(&with(Compute { bf16: None, int8: None, short: None }), "no unit");
        // Unknown keys, units and precisions, at every level.
        refused(&edited(&receipt, |v| add_key(v, &["compute"], "zz")), "an unknown key in compute");
        refused(&edited(&receipt, |v| add_key(v, &["compute", "units"], "fp16")), "an unknown arithmetic");
        refused(&edited(&receipt, |v| add_key(v, &["compute", "short"], "zz")), "an unknown key in short");
        refused(&edited(&receipt, |v| *at(v, &["compute", "units", "int8"]) = text("gpu")), "an unknown unit");
        refused(&edited(&receipt, |v| *at(v, &["compute", "units", "bf16"]) = text("avx2")), "bf16 on a unit without a bf16 kernel");
        refused(&edited(&receipt, |v| *at(v, &["compute", "short", "precision"]) = text("int8")), "short records at int8");
        refused(&edited(&receipt, |v| *at(v, &["compute"]) = text("avx512")), "compute not a map");
        // The editing itself keeps a receipt that decodes when it changes nothing.
        assert_eq!(Receipt::from_payload(&edited(&receipt, |_| ())).unwrap(), receipt);
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
