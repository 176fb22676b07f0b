//! Errors: one variant per verifier check, each carrying an enum that says exactly what failed.
//!
//! `AttestationError`'s `Display` is `"<check>: <reason>"`, e.g.
//! `signature: ES384 signature does not verify with the leaf key`.

use core::fmt;

use super::binding::BindingError;
use super::cbor::CborError;
use super::check::CheckName;

/// Which certificate of the document an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertRole {
    /// The `certificate` field (the document signer).
    Leaf,
    /// `cabundle[i]` (0 = the root).
    Bundle(usize),
}

impl fmt::Display for CertRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertRole::Leaf => f.write_str("leaf certificate"),
            CertRole::Bundle(i) => write!(f, "cabundle[{i}]"),
        }
    }
}

/// The first check that failed, with its reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttestationError {
    #[error("cbor: {0}")]
    Cbor(#[from] CborStageError),
    #[error("cose_structure: {0}")]
    CoseStructure(#[from] StructureError),
    #[error("alg_es384: {0}")]
    Algorithm(#[from] AlgorithmError),
    #[error("signature: {0}")]
    Signature(#[from] SignatureError),
    #[error("chain: {0}")]
    Chain(#[from] ChainError),
    #[error("root_pinned: {0}")]
    RootPinned(#[from] RootPinError),
    #[error("validity: {0}")]
    Validity(#[from] ValidityError),
    #[error("pcr_policy: {0}")]
    PcrPolicy(#[from] PcrPolicyError),
    #[error("debug_mode: {0}")]
    DebugMode(#[from] DebugModeError),
    #[error("freshness: {0}")]
    Freshness(#[from] FreshnessError),
    #[error("nonce: {0}")]
    Nonce(#[from] NonceError),
    #[error("user_data_binding: {0}")]
    UserDataBinding(#[from] UserDataBindingError),
    #[error("fleet_kms_key: {0}")]
    FleetKmsKey(#[from] FleetKmsKeyError),
}

impl AttestationError {
    /// The check that failed.
    pub fn check(&self) -> CheckName {
        match self {
            AttestationError::Cbor(_) => CheckName::Cbor,
            AttestationError::CoseStructure(_) => CheckName::CoseStructure,
            AttestationError::Algorithm(_) => CheckName::AlgEs384,
            AttestationError::Signature(_) => CheckName::Signature,
            AttestationError::Chain(_) => CheckName::Chain,
            AttestationError::RootPinned(_) => CheckName::RootPinned,
            AttestationError::Validity(_) => CheckName::Validity,
            AttestationError::PcrPolicy(_) => CheckName::PcrPolicy,
            AttestationError::DebugMode(_) => CheckName::DebugMode,
            AttestationError::Freshness(_) => CheckName::Freshness,
            AttestationError::Nonce(_) => CheckName::Nonce,
            AttestationError::UserDataBinding(_) => CheckName::UserDataBinding,
            AttestationError::FleetKmsKey(_) => CheckName::FleetKmsKey,
        }
    }

    /// The reason alone, without the `"<check>: "` prefix.
    pub fn reason(&self) -> String {
        match self {
            AttestationError::Cbor(e) => e.to_string(),
            AttestationError::CoseStructure(e) => e.to_string(),
            AttestationError::Algorithm(e) => e.to_string(),
            AttestationError::Signature(e) => e.to_string(),
            AttestationError::Chain(e) => e.to_string(),
            AttestationError::RootPinned(e) => e.to_string(),
            AttestationError::Validity(e) => e.to_string(),
            AttestationError::PcrPolicy(e) => e.to_string(),
            AttestationError::DebugMode(e) => e.to_string(),
            AttestationError::Freshness(e) => e.to_string(),
            AttestationError::Nonce(e) => e.to_string(),
            AttestationError::UserDataBinding(e) => e.to_string(),
            AttestationError::FleetKmsKey(e) => e.to_string(),
        }
    }
}

/// Which CBOR layer failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CborPart {
    Document,
    ProtectedHeader,
    Payload,
}

impl fmt::Display for CborPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CborPart::Document => "document",
            CborPart::ProtectedHeader => "protected header",
            CborPart::Payload => "payload",
        })
    }
}

/// `cbor`: a layer is not well-formed CBOR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{part} is not well-formed CBOR: {error}")]
pub struct CborStageError {
    pub part: CborPart,
    pub error: CborError,
}

/// `cose_structure`: the COSE_Sign1 envelope or the Nitro payload has the wrong shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StructureError {
    #[error("document is a {0}, not a COSE_Sign1 array")]
    NotArray(&'static str),
    #[error("document carries tag {0}; only untagged or tag 18 (COSE_Sign1) is accepted")]
    UnexpectedTag(u64),
    #[error("COSE_Sign1 array has {0} elements, not 4")]
    ArrayLength(usize),
    #[error("protected header is a {0}, not a byte string")]
    ProtectedNotBytes(&'static str),
    #[error("protected header is {0}")]
    ProtectedHeader(String),
    #[error("unprotected header is {0}; it must be an empty map")]
    UnprotectedNotMap(&'static str),
    #[error("unprotected header has {0} entries; it must be an empty map")]
    UnprotectedNotEmpty(usize),
    #[error("payload is {0}, not an embedded byte string")]
    PayloadNotBytes(&'static str),
    #[error("signature is a {0}, not a byte string")]
    SignatureNotBytes(&'static str),
    #[error("payload: {0}")]
    Payload(PayloadError),
}

/// The payload map does not follow the Nitro attestation document schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("is a {0}, not a map")]
    NotMap(&'static str),
    #[error("map key is a {0}, not a text string")]
    NonTextKey(&'static str),
    #[error("unknown field {0:?}")]
    UnknownField(String),
    #[error("missing field {0:?}")]
    Missing(&'static str),
    #[error("{field} is a {found}, expected a {expected}")]
    WrongType { field: &'static str, expected: &'static str, found: &'static str },
    #[error("module_id is empty")]
    EmptyModuleId,
    #[error("module_id is {0} bytes long (at most 256)")]
    ModuleIdTooLong(usize),
    #[error("digest is {0:?}, not \"SHA384\"")]
    Digest(String),
    #[error("timestamp is zero")]
    ZeroTimestamp,
    #[error("pcrs is empty")]
    NoPcrs,
    #[error("PCR index {0} is outside 0..=31")]
    PcrIndex(i128),
    #[error("PCR{index} is {len} bytes; a PCR is 32, 48 or 64 bytes")]
    PcrLength { index: u8, len: usize },
    #[error("certificate is {0} bytes; it must be 1..=1024")]
    CertificateLength(usize),
    #[error("cabundle is empty")]
    EmptyCabundle,
    #[error("cabundle has {0} entries (at most 16)")]
    CabundleTooLong(usize),
    #[error("cabundle[{index}] is {len} bytes; it must be 1..=1024")]
    CabundleEntryLength { index: usize, len: usize },
    #[error("{field} is {len} bytes; it must be 0..=1024")]
    AuxTooLong { field: &'static str, len: usize },
}

/// `alg_es384`: the protected header does not name ES384.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmError {
    #[error("protected header alg is {0}{name}; only -35 (ES384) is accepted", name = alg_name(*.0))]
    NotEs384(i128),
    #[error("protected header is not the canonical encoding a1 01 38 22 of {{1: -35}}")]
    NonCanonicalHeader,
}

fn alg_name(alg: i128) -> &'static str {
    match alg {
        -7 => " (ES256)",
        -36 => " (ES512)",
        -8 => " (EdDSA)",
        -37 => " (PS256)",
        _ => "",
    }
}

/// What is wrong with a certificate's public key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("public key algorithm is {0}, not id-ecPublicKey")]
    NotEcPublicKey(String),
    #[error("EC key is on curve {0}, not P-384 (secp384r1)")]
    NotP384(String),
    #[error("EC key has no named-curve parameter")]
    NoCurve,
    #[error("EC public key is not a valid P-384 point")]
    InvalidPoint,
}

/// A certificate that x509 parsing refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{role} is not a valid X.509 DER certificate: {reason}")]
pub struct CertParseError {
    pub role: CertRole,
    pub reason: String,
}

/// `signature`: the COSE signature does not verify with the leaf certificate's key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature is {0} bytes; ES384 needs 96 (r‖s)")]
    Length(usize),
    #[error("signature r or s is zero or not below the P-384 group order")]
    Scalars,
    #[error("{0}")]
    LeafCertificate(CertParseError),
    #[error("leaf certificate key: {0}")]
    LeafKey(KeyError),
    #[error("ES384 signature does not verify with the leaf key")]
    Mismatch,
}

/// `chain`: a link `cabundle[0]` → … → leaf is broken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("{0}")]
    Parse(CertParseError),
    #[error("{role}'s issuer ({issuer}) is not the subject of {issuer_role} ({subject})")]
    IssuerMismatch { role: CertRole, issuer: String, issuer_role: CertRole, subject: String },
    #[error("{role} is signed with {oid}, not ecdsa-with-SHA384 (1.2.840.10045.4.3.3)")]
    SignatureAlgorithm { role: CertRole, oid: String },
    #[error("{role}: the signature algorithm inside the TBS differs from the outer one")]
    AlgorithmMismatch { role: CertRole },
    #[error("{role} key: {reason}")]
    IssuerKey { role: CertRole, reason: KeyError },
    #[error("{role}'s signature does not verify with the key of {issuer_role}")]
    BadSignature { role: CertRole, issuer_role: CertRole },
    #[error("{role} is not a v3 certificate")]
    NotV3 { role: CertRole },
    #[error("{role} issues a certificate but its basic constraints {reason}")]
    NotCa { role: CertRole, reason: &'static str },
    #[error("{role}'s key usage lacks {usage}")]
    KeyUsage { role: CertRole, usage: &'static str },
    #[error("{role} allows a path length of {path_len} but {below} CA certificate(s) follow it")]
    PathLength { role: CertRole, path_len: u8, below: usize },
    #[error("{role} carries an unrecognised critical extension {oid}")]
    UnknownCriticalExtension { role: CertRole, oid: String },
    #[error("{role} has a malformed {extension} extension")]
    MalformedExtension { role: CertRole, extension: &'static str },
}

/// `root_pinned`: `cabundle[0]` is not the trusted root.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "cabundle[0] ({subject}, SHA-256 {sha256}) is not byte-identical to the pinned root {expected_label} (SHA-256 {expected_sha256})"
)]
pub struct RootPinError {
    pub subject: String,
    pub sha256: String,
    pub expected_label: String,
    pub expected_sha256: String,
}

/// `validity`: a certificate is not valid at the verification time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidityError {
    #[error("{role} ({subject}) is not valid before {not_before}; verification time is {now}")]
    NotYetValid { role: CertRole, subject: String, not_before: String, now: String },
    #[error("{role} ({subject}) expired at {not_after}; verification time is {now}")]
    Expired { role: CertRole, subject: String, not_after: String, now: String },
}

/// `pcr_policy`: a measurement differs from the expected one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PcrPolicyError {
    #[error("PCR{index} is absent from the document; expected {expected}")]
    Missing { index: u8, expected: String },
    #[error("PCR{index} is {actual}; expected {expected}")]
    Mismatch { index: u8, expected: String, actual: String },
}

/// `debug_mode`: the enclave runs in debug mode and the policy does not allow it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugModeError {
    #[error("PCR0, PCR1 and PCR2 are all zero: the enclave runs in debug mode (its memory is readable by the host); refused without allow_debug")]
    Debug,
    #[error("PCR{0} is absent, so debug mode cannot be ruled out; refused without allow_debug")]
    PcrAbsent(u8),
}

/// `freshness`: the document is too old or from the future.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreshnessError {
    #[error("document is {age_s} s old (timestamp {timestamp}, now {now}); at most {max_age_s} s allowed")]
    TooOld { age_s: u64, max_age_s: u64, timestamp: String, now: String },
    #[error("document timestamp {timestamp} is {ahead_ms} ms ahead of now ({now}); at most {max_skew_s} s of clock skew allowed")]
    InFuture { ahead_ms: u64, max_skew_s: u64, timestamp: String, now: String },
}

/// `nonce`: the document does not carry the expected nonce.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NonceError {
    #[error("document carries no nonce; expected {expected}")]
    Missing { expected: String },
    #[error("document nonce is {actual}; expected {expected}")]
    Mismatch { expected: String, actual: String },
}

/// `user_data_binding`: `user_data` is not our key binding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UserDataBindingError {
    #[error("document carries no user_data")]
    Absent,
    #[error("user_data is not a key binding: {0}")]
    Decode(#[from] BindingError),
}

/// `fleet_kms_key`: the fleet key was released by a KMS key other than the deployment's — a key
/// the host may own, under which it could have wrapped a private key it keeps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the fleet key was released by KMS key {bound}, not by the deployment's {expected}")]
pub struct FleetKmsKeyError {
    pub expected: String,
    pub bound: String,
}
