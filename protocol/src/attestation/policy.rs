//! The attestation policy file (DESIGN.md §4, §11): what a client expects of an enclave, signed
//! by the image publisher whose Ed25519 key the client pins — never by the operator.
//!
//! JSON (UTF-8, unknown fields refused, duplicate keys refused):
//!
//! ```json
//! {
//!   "version": 1,
//!   "root": "aws-nitro-g1",                 // or one PEM CERTIFICATE block
//!   "pcrs": { "0": "<hex>", "1": "<hex>", "2": "<hex>", "8": "<hex>" },
//!   "allow_debug": false,                   // optional, default false
//!   "max_age_s": 3600,                      // optional, default 3600
//!   "publisher_key_id": "<64 hex>",         // SHA-256 of the publisher's Ed25519 key
//!   "signature": "<128 hex>"                // Ed25519 over the canonical bytes below
//! }
//! ```
//!
//! PCR keys are decimal indices 0..=31 without leading zeros; PCR0, PCR1 and PCR2 are required;
//! values are 32, 48 or 64 bytes of hex.
//!
//! The signature covers canonical bytes that do not depend on JSON formatting: the
//! deterministic CBOR encoding of the array
//!
//! ```text
//! [ "ephem-batch attestation policy",   ; text, domain separation
//!   1,                                  ; version
//!   h'…',                               ; SHA-256 of the trusted root's DER (32 bytes)
//!   { 0: h'…', 1: h'…', … },            ; PCR index (uint) → value, ascending indices
//!   false,                              ; allow_debug
//!   3600,                               ; max_age_s
//!   h'…' ]                              ; publisher key id (32 bytes)
//! ```
//!
//! so `"root": "aws-nitro-g1"` and the AWS root's PEM sign the same bytes.

use std::collections::BTreeMap;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::cbor;
use super::document::MAX_PCR_INDEX;
use super::roots::{AWS_NITRO_ROOT_G1_NAME, RootKind, TrustAnchor, TrustAnchorError};
use super::verify::{DEFAULT_MAX_AGE_S, VerifyOptions};
use crate::keys::{KeyId, key_id};

/// The only policy version defined.
pub const POLICY_VERSION: u64 = 1;
/// First element of the signed array.
pub const POLICY_CONTEXT: &str = "ephem-batch attestation policy";
/// PCRs every policy must pin (image, kernel+bootstrap, application).
pub const REQUIRED_PCRS: [u8; 3] = [0, 1, 2];

/// What a client expects of an enclave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub root: TrustAnchor,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub allow_debug: bool,
    pub max_age_s: u64,
}

/// A policy with its publisher's signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedPolicy {
    pub policy: Policy,
    pub publisher_key_id: KeyId,
    pub signature: [u8; 64],
}

/// Why a policy file is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("policy JSON: {0}")]
    Json(String),
    #[error("policy version {0} is not supported (only 1)")]
    UnsupportedVersion(u64),
    #[error("policy root: {0}")]
    Root(#[from] TrustAnchorError),
    #[error("PCR key {0:?} is not a decimal index 0..=31")]
    PcrIndex(String),
    #[error("PCR{0} is not hex")]
    PcrHex(u8),
    #[error("PCR{index} is {len} bytes; a PCR is 32, 48 or 64 bytes")]
    PcrLength { index: u8, len: usize },
    #[error("policy does not pin PCR{0} (PCR0, PCR1 and PCR2 are required)")]
    MissingPcr(u8),
    #[error("max_age_s must be at least 1")]
    ZeroMaxAge,
    #[error("publisher_key_id is not 32 bytes of hex")]
    KeyId,
    #[error("signature is not 64 bytes of hex")]
    SignatureEncoding,
    #[error("policy is signed by publisher key {signed_by}, not the pinned publisher key {pinned}")]
    WrongPublisher { signed_by: String, pinned: String },
    #[error("publisher signature does not verify")]
    BadSignature,
    #[error("the pinned publisher key is not a valid Ed25519 public key")]
    InvalidPublisherKey,
}

impl Policy {
    /// A policy for the AWS root with the given PCRs, debug refused, default max age.
    pub fn aws(pcrs: BTreeMap<u8, Vec<u8>>) -> Policy {
        Policy { root: TrustAnchor::aws_nitro_g1(), pcrs, allow_debug: false, max_age_s: DEFAULT_MAX_AGE_S }
    }

    /// Checks the rules a policy file must follow (required PCRs, lengths, max age).
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (index, value) in &self.pcrs {
            if *index > MAX_PCR_INDEX {
                return Err(PolicyError::PcrIndex(index.to_string()));
            }
            if ![32, 48, 64].contains(&value.len()) {
                return Err(PolicyError::PcrLength { index: *index, len: value.len() });
            }
        }
        if let Some(missing) = REQUIRED_PCRS.iter().find(|i| !self.pcrs.contains_key(i)) {
            return Err(PolicyError::MissingPcr(*missing));
        }
        if self.max_age_s == 0 {
            return Err(PolicyError::ZeroMaxAge);
        }
        Ok(())
    }

    /// The canonical bytes the publisher signs (see the module documentation).
    pub fn signed_bytes(&self, publisher_key_id: &KeyId) -> Vec<u8> {
        let mut w = cbor::Writer::new();
        w.array(7).text(POLICY_CONTEXT).unsigned(POLICY_VERSION).bytes(&self.root.sha256());
        w.map(self.pcrs.len());
        for (index, value) in &self.pcrs {
            w.unsigned(u64::from(*index)).bytes(value);
        }
        w.bool(self.allow_debug).unsigned(self.max_age_s).bytes(publisher_key_id);
        w.into_bytes()
    }

    /// Signs the policy with the publisher's key (Ed25519, deterministic).
    pub fn sign(self, publisher: &SigningKey) -> Result<SignedPolicy, PolicyError> {
        self.validate()?;
        let publisher_key_id = key_id(publisher.verifying_key().as_bytes());
        let signature = publisher.sign(&self.signed_bytes(&publisher_key_id)).to_bytes();
        Ok(SignedPolicy { policy: self, publisher_key_id, signature })
    }

    /// Verification options for this policy at `now_ms` (nonce and binding left to the caller).
    pub fn verify_options(&self, now_ms: u64) -> VerifyOptions {
        let mut options = VerifyOptions::new(self.root.clone(), now_ms);
        options.expected_pcrs = self.pcrs.clone();
        options.allow_debug = self.allow_debug;
        options.max_age_s = self.max_age_s;
        options
    }
}

impl SignedPolicy {
    /// Parses a policy file. This does **not** verify the signature: call
    /// [`verify`](Self::verify) with the pinned publisher key before using the policy.
    pub fn from_json(text: &str) -> Result<SignedPolicy, PolicyError> {
        let (policy, raw) = parse_policy_json(text)?;
        let publisher_key_id = raw
            .publisher_key_id
            .and_then(|id| hex::decode(id).ok())
            .and_then(|b| KeyId::try_from(b).ok())
            .ok_or(PolicyError::KeyId)?;
        let signature = raw
            .signature
            .and_then(|sig| hex::decode(sig).ok())
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or(PolicyError::SignatureEncoding)?;
        Ok(SignedPolicy { policy, publisher_key_id, signature })
    }

    /// The policy file text (pretty-printed JSON, fields in the documented order, PCRs in
    /// ascending numeric order, lowercase hex, trailing newline).
    pub fn to_json(&self) -> String {
        let root = match self.policy.root.kind() {
            RootKind::AwsNitroG1 => AWS_NITRO_ROOT_G1_NAME.to_owned(),
            _ => self.policy.root.to_pem(),
        };
        let out = PolicyJsonOut {
            version: POLICY_VERSION,
            root,
            pcrs: PcrsOut(&self.policy.pcrs),
            allow_debug: self.policy.allow_debug,
            max_age_s: self.policy.max_age_s,
            publisher_key_id: hex::encode(self.publisher_key_id),
            signature: hex::encode(self.signature),
        };
        let mut text = serde_json::to_string_pretty(&out).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Verifies the publisher signature with the pinned publisher key and returns the policy.
    pub fn verify(&self, publisher: &VerifyingKey) -> Result<&Policy, PolicyError> {
        let pinned = key_id(publisher.as_bytes());
        if pinned != self.publisher_key_id {
            return Err(PolicyError::WrongPublisher {
                signed_by: hex::encode(self.publisher_key_id),
                pinned: hex::encode(pinned),
            });
        }
        self.policy.validate()?;
        let signature = ed25519_dalek::Signature::from_bytes(&self.signature);
        publisher
            .verify_strict(&self.policy.signed_bytes(&self.publisher_key_id), &signature)
            .map_err(|_| PolicyError::BadSignature)?;
        Ok(&self.policy)
    }
}

impl SignedPolicy {
    /// [`verify`](Self::verify) with the pinned publisher key given as its 32 raw bytes.
    pub fn verify_with_key_bytes(&self, publisher: &[u8; 32]) -> Result<&Policy, PolicyError> {
        let key = VerifyingKey::from_bytes(publisher).map_err(|_| PolicyError::InvalidPublisherKey)?;
        self.verify(&key)
    }
}

fn parse_index(key: &str) -> Result<u8, PolicyError> {
    let canonical = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) && (key == "0" || !key.starts_with('0'));
    match key.parse::<u8>() {
        Ok(i) if canonical && i <= MAX_PCR_INDEX => Ok(i),
        _ => Err(PolicyError::PcrIndex(key.chars().take(10).collect())),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyJson {
    version: u64,
    root: String,
    pcrs: UniqueMap,
    #[serde(default)]
    allow_debug: bool,
    #[serde(default)]
    max_age_s: Option<u64>,
    #[serde(default)]
    publisher_key_id: Option<String>,
    #[serde(default)]
    signature: Option<String>,
}

/// Parses the policy fields of a policy file; the signature fields are left to the caller.
fn parse_policy_json(text: &str) -> Result<(Policy, PolicyJson), PolicyError> {
    let raw: PolicyJson = serde_json::from_str(text).map_err(|e| PolicyError::Json(e.to_string()))?;
    if raw.version != POLICY_VERSION {
        return Err(PolicyError::UnsupportedVersion(raw.version));
    }
    let root = if raw.root == AWS_NITRO_ROOT_G1_NAME {
        TrustAnchor::aws_nitro_g1()
    } else {
        TrustAnchor::from_pem(&raw.root)?
    };
    let mut pcrs = BTreeMap::new();
    for (key, value) in &raw.pcrs.0 {
        let index = parse_index(key)?;
        let bytes = hex::decode(value).map_err(|_| PolicyError::PcrHex(index))?;
        pcrs.insert(index, bytes);
    }
    let policy = Policy { root, pcrs, allow_debug: raw.allow_debug, max_age_s: raw.max_age_s.unwrap_or(DEFAULT_MAX_AGE_S) };
    policy.validate()?;
    Ok((policy, raw))
}

impl Policy {
    /// Reads a policy file that is not signed yet (what a release step writes before
    /// `ephem-batch policy sign`). Signature fields, if present, are ignored.
    pub fn from_unsigned_json(text: &str) -> Result<Policy, PolicyError> {
        parse_policy_json(text).map(|(policy, _)| policy)
    }
}

/// A JSON object of string values that refuses duplicate keys.
struct UniqueMap(Vec<(String, String)>);

impl<'de> Deserialize<'de> for UniqueMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UniqueMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of PCR index → hex string")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueMap, A::Error> {
                let mut out: Vec<(String, String)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(de::Error::custom(format_args!("duplicate PCR key {k:?}")));
                    }
                    if out.len() >= 32 {
                        return Err(de::Error::custom("more than 32 PCRs"));
                    }
                    out.push((k, v));
                }
                Ok(UniqueMap(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

#[derive(Serialize)]
struct PolicyJsonOut<'a> {
    version: u64,
    root: String,
    pcrs: PcrsOut<'a>,
    allow_debug: bool,
    max_age_s: u64,
    publisher_key_id: String,
    signature: String,
}

struct PcrsOut<'a>(&'a BTreeMap<u8, Vec<u8>>);

impl Serialize for PcrsOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (index, value) in self.0 {
            map.serialize_entry(&index.to_string(), &hex::encode(value))?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::vectors;

    #[test]
    fn known_answer_vector() {
        let (policy, key) = vectors::policy_sample();
        let kid = key_id(key.verifying_key().as_bytes());
        assert_eq!(hex::encode(policy.signed_bytes(&kid)), vectors::POLICY_SIGNED_BYTES_HEX);
        let signed = policy.clone().sign(&key).unwrap();
        assert_eq!(hex::encode(signed.signature), vectors::POLICY_SIGNATURE_HEX);
        assert_eq!(signed.to_json(), vectors::POLICY_JSON);
        let parsed = SignedPolicy::from_json(vectors::POLICY_JSON).unwrap();
        assert_eq!(parsed, signed);
        assert_eq!(parsed.verify(&key.verifying_key()).unwrap(), &policy);
        assert_eq!(parsed.verify_with_key_bytes(key.verifying_key().as_bytes()).unwrap(), &policy);
    }

    #[test]
    fn signature_binds_every_field() {
        let (policy, key) = vectors::policy_sample();
        let signed = policy.sign(&key).unwrap();
        let vk = key.verifying_key();
        type Mutation = Box<dyn Fn(&mut SignedPolicy)>;
        let mutations: Vec<Mutation> = vec![
            Box::new(|s| s.policy.allow_debug = true),
            Box::new(|s| s.policy.max_age_s += 1),
            Box::new(|s| {
                s.policy.pcrs.insert(8, vec![0; 48]);
            }),
            Box::new(|s| s.policy.pcrs.get_mut(&0).unwrap()[0] ^= 1),
            Box::new(|s| s.signature[0] ^= 1),
        ];
        for m in mutations {
            let mut s = signed.clone();
            m(&mut s);
            assert_eq!(s.verify(&vk), Err(PolicyError::BadSignature));
        }
        let other = SigningKey::from_bytes(&[9; 32]);
        assert!(matches!(signed.verify(&other.verifying_key()), Err(PolicyError::WrongPublisher { .. })));
    }

    #[test]
    fn aws_root_name_and_pem_sign_the_same_bytes() {
        let (policy, key) = vectors::policy_sample();
        let kid = key_id(key.verifying_key().as_bytes());
        let json = policy.clone().sign(&key).unwrap().to_json();
        let pem = crate::attestation::roots::AWS_NITRO_ROOT_G1_PEM.replace('\n', "\\n");
        let with_pem = json.replace("\"aws-nitro-g1\"", &format!("\"{pem}\""));
        assert_ne!(json, with_pem);
        let parsed = SignedPolicy::from_json(&with_pem).unwrap();
        assert_eq!(parsed.policy.signed_bytes(&kid), policy.signed_bytes(&kid));
        assert!(parsed.verify(&key.verifying_key()).is_ok());
    }

    #[test]
    fn rejects_malformed_files() {
        let (policy, key) = vectors::policy_sample();
        let json = policy.sign(&key).unwrap().to_json();
        let cases: Vec<(String, &str)> = vec![
            (json.replace("\"version\": 1", "\"version\": 2"), "version 2"),
            (json.replace("\"allow_debug\"", "\"allow_debug\": false, \"extra\""), "unknown field"),
            (json.replace("\"1\":", "\"01\":"), "\"01\""),
            (json.replace("\"2\":", "\"32\":"), "\"32\""),
            (json.replace("\"1\":", "\"0\":"), "duplicate PCR key"),
            (json.replace("\"2\": \"", "\"2\": \"00"), "PCR2 is 49 bytes"),
            (json.replace("\"2\": \"", "\"2\": \"0"), "PCR2 is not hex"),
            (json.replace("\"max_age_s\": 600", "\"max_age_s\": 0"), "max_age_s"),
            (json.replace("\"aws-nitro-g1\"", "\"aws-nitro-g2\""), "root"),
            (json.replace("\"publisher_key_id\": \"", "\"publisher_key_id\": \"00"), "publisher_key_id"),
            (json.replace("\"signature\": \"", "\"signature\": \"zz"), "signature"),
        ];
        for (text, needle) in cases {
            let err = SignedPolicy::from_json(&text).unwrap_err();
            assert!(err.to_string().contains(needle), "{err} should mention {needle}");
        }
        let missing = json.replace("\"2\": \"", "\"3\": \"");
        assert_eq!(SignedPolicy::from_json(&missing).unwrap_err(), PolicyError::MissingPcr(2));
    }

    #[test]
    fn defaults() {
        let (policy, key) = vectors::policy_sample();
        let json = policy.sign(&key).unwrap().to_json();
        let stripped = json.replace("  \"allow_debug\": false,\n", "").replace("  \"max_age_s\": 600,\n", "");
        let parsed = SignedPolicy::from_json(&stripped).unwrap();
        assert!(!parsed.policy.allow_debug);
        assert_eq!(parsed.policy.max_age_s, 3600);
        let opts = parsed.policy.verify_options(5);
        assert_eq!((opts.now_ms, opts.max_age_s, opts.expected_pcrs.len()), (5, 3600, 3));
    }
}
