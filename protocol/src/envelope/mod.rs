//! Sealed envelopes: an HPKE base-mode setup (RFC 9180) to the recipient's key, a readable header
//! that the key schedule authenticates, and a [STREAM](crate::stream) body keyed from the HPKE
//! exporter.
//!
//! ```text
//! preamble := "EPHB" ‖ version 0x01 ‖ kind ‖ header_len (u16 BE) ‖ header ‖ enc ‖ confirmation (32)
//! sealed   := preamble ‖ chunk*
//! ```
//!
//! * kind 0x01 — a job input, sealed to the fleet key: DHKEM(P-256, HKDF-SHA256), enc 65 bytes;
//!   kind 0x02 — a job result, sealed to the client's result key: DHKEM(X25519, HKDF-SHA256),
//!   enc 32 bytes. Both with HKDF-SHA256 and ChaCha20-Poly1305.
//! * HPKE info = label ‖ 0x00 ‖ header, so a changed header yields another key schedule.
//! * confirmation = Export("ephem-batch/v1 header confirmation", 32): a reader holding the right
//!   key learns at once whether the preamble is authentic, before any chunk.
//! * stream id = SHA-256("ephem-batch/v1 stream id" ‖ 0x00 ‖ preamble up to and including enc),
//!   first 16 bytes. The **job id** is the stream id of the job input: nobody chooses it, and no
//!   one can claim a job id before the sealed input exists.
//! * STREAM key = Export("ephem-batch/v1 stream key", 32); plaintext commitment key =
//!   Export("ephem-batch/v1 plaintext commitment", 32) (see [`crate::receipt`]).

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::{DhP256HkdfSha256, X25519HkdfSha256};
use hpke::rand_core::{TryCryptoRng, TryRng};
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::cbor::{CborError, MapBuilder, MapReader};
use crate::keys::{KeyId, key_id};
use crate::stream::{StreamId, StreamOpener, StreamSealer, STREAM_ID_LEN};

pub const MAGIC: &[u8; 4] = b"EPHB";
pub const VERSION: u8 = 1;
/// Largest header accepted (keeps HPKE's info well under its 64 KiB limit).
pub const MAX_HEADER_LEN: usize = 8 * 1024;
pub const CONFIRMATION_LEN: usize = 32;
/// The longest preamble of a job input: fixed part, header, P-256 `enc`, confirmation.
pub const MAX_JOB_PREAMBLE_LEN: usize = 8 + MAX_HEADER_LEN + 65 + CONFIRMATION_LEN;
/// Longest model id.
pub const MAX_MODEL_ID_LEN: usize = 128;
/// Longest vector a model or a job may have.
pub const MAX_DIMENSIONS: usize = 8192;
/// Largest vocabulary a sparse vector may index (every vocabulary the engine loads is below it).
pub const MAX_SPARSE_DIMENSIONS: usize = 1 << 20;

const LABEL_JOB: &[u8] = b"ephem-batch/v1 job input";
const LABEL_RESULT: &[u8] = b"ephem-batch/v1 job result";
const EXPORT_CONFIRMATION: &[u8] = b"ephem-batch/v1 header confirmation";
const EXPORT_STREAM_KEY: &[u8] = b"ephem-batch/v1 stream key";
const EXPORT_COMMITMENT_KEY: &[u8] = b"ephem-batch/v1 plaintext commitment";
const LABEL_STREAM_ID: &[u8] = b"ephem-batch/v1 stream id";

pub(crate) type FleetKem = DhP256HkdfSha256;
type ResultKem = X25519HkdfSha256;

/// Why an envelope was refused; each check has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not an ephem-batch envelope (bad magic)")]
    BadMagic,
    #[error("unsupported envelope version {0}")]
    UnsupportedVersion(u8),
    #[error("wrong envelope kind: expected {expected:?}, found byte {found:#04x}")]
    WrongKind { expected: StreamKind, found: u8 },
    #[error("header length {0} out of range (1..={MAX_HEADER_LEN})")]
    HeaderLength(usize),
    #[error("envelope preamble truncated")]
    TruncatedPreamble,
    #[error("header malformed: {0}")]
    HeaderMalformed(#[from] CborError),
    #[error("header invalid: {0}")]
    HeaderInvalid(&'static str),
    #[error("sealed to another key: header names key {sealed_to}, this key is {ours}")]
    WrongRecipientKey { sealed_to: String, ours: String },
    #[error("job id mismatch: the envelope derives {derived}, but it was presented as {claimed}")]
    JobIdMismatch { derived: String, claimed: String },
    #[error("encapsulated key rejected by HPKE decapsulation")]
    Decapsulation,
    #[error("header authentication failed: the header or encapsulated key was altered, or the sender used another key")]
    HeaderAuthentication,
    #[error("invalid public key")]
    InvalidPublicKey,
    #[error("invalid private key")]
    InvalidPrivateKey,
    #[error("HPKE failure: {0}")]
    Hpke(String),
}

/// What an envelope carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    JobInput = 1,
    JobResult = 2,
}

impl StreamKind {
    fn enc_len(self) -> usize {
        match self {
            StreamKind::JobInput => 65,
            StreamKind::JobResult => 32,
        }
    }

    fn label(self) -> &'static [u8] {
        match self {
            StreamKind::JobInput => LABEL_JOB,
            StreamKind::JobResult => LABEL_RESULT,
        }
    }
}

/// The id of a job: the stream id of its sealed input. Printed as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub StreamId);

impl JobId {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        if text.chars().any(|c| c.is_ascii_uppercase()) {
            return None;
        }
        Some(Self(bytes.try_into().ok()?))
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Text that is not a job id (32 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a job id (32 lowercase hex digits)")]
pub struct InvalidJobId(pub String);

impl std::str::FromStr for JobId {
    type Err = InvalidJobId;

    fn from_str(text: &str) -> Result<Self, InvalidJobId> {
        JobId::from_hex(text).ok_or_else(|| InvalidJobId(text.chars().take(80).collect()))
    }
}

/// In JSON and CBOR a job id is its hex text, as everywhere else it is written.
impl serde::Serialize for JobId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for JobId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------------
// Keys

/// The fleet's HPKE public key (P-256), as published inside attestation documents.
#[derive(Clone, PartialEq, Eq)]
pub struct FleetPublicKey(<FleetKem as Kem>::PublicKey);

/// The fleet's HPKE private key; only enclaves hold it.
#[derive(Clone)]
pub struct FleetSecretKey(<FleetKem as Kem>::PrivateKey);

impl std::fmt::Debug for FleetPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FleetPublicKey({})", hex::encode(self.key_id()))
    }
}

impl std::fmt::Debug for ResultPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResultPublicKey({})", hex::encode(self.key_id()))
    }
}

impl FleetPublicKey {
    pub(crate) fn hpke(&self) -> &<FleetKem as Kem>::PublicKey {
        &self.0
    }

    /// From the 65-byte uncompressed SEC1 encoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        <FleetKem as Kem>::PublicKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| EnvelopeError::InvalidPublicKey)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.to_bytes().to_vec()
    }

    pub fn key_id(&self) -> KeyId {
        key_id(&self.to_bytes())
    }
}

impl FleetSecretKey {
    pub fn generate() -> Self {
        Self(FleetKem::gen_keypair().0)
    }

    /// RFC 9180 DeriveKeyPair: only for tests and known-answer vectors.
    #[doc(hidden)]
    pub fn derive_from_ikm(ikm: &[u8]) -> Self {
        Self(FleetKem::derive_keypair(ikm).0)
    }

    pub(crate) fn hpke(&self) -> &<FleetKem as Kem>::PrivateKey {
        &self.0
    }

    /// From the 32-byte big-endian scalar.
    pub fn from_scalar_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        <FleetKem as Kem>::PrivateKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| EnvelopeError::InvalidPrivateKey)
    }

    /// From a PKCS#8 `PrivateKeyInfo` (what KMS `GenerateDataKeyPair` returns for ECC_NIST_P256).
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, EnvelopeError> {
        use p256::pkcs8::DecodePrivateKey;
        let secret = p256::SecretKey::from_pkcs8_der(der).map_err(|_| EnvelopeError::InvalidPrivateKey)?;
        Self::from_scalar_bytes(&secret.to_bytes())
    }

    pub fn to_scalar_bytes(&self) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(self.0.to_bytes().to_vec())
    }

    /// The public key, derived here rather than taken from anyone.
    pub fn public_key(&self) -> FleetPublicKey {
        FleetPublicKey(FleetKem::sk_to_pk(&self.0))
    }
}

/// A client's result key (X25519): results are sealed to it.
#[derive(Clone, PartialEq, Eq)]
pub struct ResultPublicKey(<ResultKem as Kem>::PublicKey);

#[derive(Clone)]
pub struct ResultSecretKey(<ResultKem as Kem>::PrivateKey);

impl ResultPublicKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        <ResultKem as Kem>::PublicKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| EnvelopeError::InvalidPublicKey)
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(&self.0.to_bytes());
        out
    }

    pub fn key_id(&self) -> KeyId {
        key_id(&self.to_bytes())
    }
}

impl ResultSecretKey {
    pub fn generate() -> Self {
        Self(ResultKem::gen_keypair().0)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        <ResultKem as Kem>::PrivateKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| EnvelopeError::InvalidPrivateKey)
    }

    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(self.0.to_bytes().to_vec())
    }

    pub fn public_key(&self) -> ResultPublicKey {
        ResultPublicKey(ResultKem::sk_to_pk(&self.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Headers

mod options;
pub use options::{JobOptions, MAX_RECORD_BYTES, OutputDtype, OutputKind, Precision, valid_prompt_name};

/// Checks a model id: 1..=128 printable ASCII characters, no spaces.
pub fn valid_model_id(model_id: &str) -> bool {
    !model_id.is_empty()
        && model_id.len() <= MAX_MODEL_ID_LEN
        && model_id.bytes().all(|b| b.is_ascii_graphic())
}

/// The readable, authenticated header of a sealed job input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHeader {
    pub fleet_key_id: KeyId,
    pub epoch: u64,
    pub model_id: String,
    /// SHA-256 of the signed model manifest the client expects (no downgrade to an older one).
    pub manifest_hash: [u8; 32],
    pub options: JobOptions,
    /// The client's X25519 result key.
    pub result_public_key: [u8; 32],
    pub record_count: u64,
    pub created_ms: u64,
}

impl JobHeader {
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::cbor::encode(
            &MapBuilder::new()
                .uint("v", 1)
                .uint("epoch", self.epoch)
                .text("model", &self.model_id)
                .bytes("fleet_key", &self.fleet_key_id)
                .bytes("manifest", &self.manifest_hash)
                .value("options", self.options.to_cbor())
                .uint("records", self.record_count)
                .uint("created_ms", self.created_ms)
                .bytes("result_key", &self.result_public_key)
                .build(),
        )
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(EnvelopeError::HeaderInvalid("unknown header version"));
        }
        let header = Self {
            fleet_key_id: map.array("fleet_key")?,
            epoch: map.uint("epoch")?,
            model_id: map.text("model")?,
            manifest_hash: map.array("manifest")?,
            options: JobOptions::read(map.map("options")?)?,
            result_public_key: map.array("result_key")?,
            record_count: map.uint("records")?,
            created_ms: map.uint("created_ms")?,
        };
        map.finish()?;
        if !valid_model_id(&header.model_id) {
            return Err(EnvelopeError::HeaderInvalid("model id"));
        }
        ResultPublicKey::from_bytes(&header.result_public_key)
            .map_err(|_| EnvelopeError::HeaderInvalid("result key is not an X25519 point"))?;
        Ok(header)
    }
}

/// The readable, authenticated header of a sealed job result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultHeader {
    pub job_id: JobId,
    /// Key id of the client result key the result is sealed to.
    pub result_key_id: KeyId,
    pub attempt: u64,
    pub created_ms: u64,
}

impl ResultHeader {
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::cbor::encode(
            &MapBuilder::new()
                .uint("v", 1)
                .bytes("job", &self.job_id.0)
                .uint("attempt", self.attempt)
                .uint("created_ms", self.created_ms)
                .bytes("result_key", &self.result_key_id)
                .build(),
        )
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let mut map = MapReader::from_bytes(bytes)?;
        if map.uint("v")? != 1 {
            return Err(EnvelopeError::HeaderInvalid("unknown header version"));
        }
        let header = Self {
            job_id: JobId(map.array("job")?),
            result_key_id: map.array("result_key")?,
            attempt: map.uint("attempt")?,
            created_ms: map.uint("created_ms")?,
        };
        map.finish()?;
        Ok(header)
    }
}

// ---------------------------------------------------------------------------------------------
// Preamble

/// The clear part of an envelope, before the chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preamble {
    pub kind: StreamKind,
    pub header: Vec<u8>,
    pub enc: Vec<u8>,
    pub confirmation: [u8; CONFIRMATION_LEN],
}

impl Preamble {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.unconfirmed_bytes();
        out.extend_from_slice(&self.confirmation);
        out
    }

    fn unconfirmed_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.header.len() + self.enc.len() + CONFIRMATION_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.kind as u8);
        // The header length is checked against MAX_HEADER_LEN when the preamble is built.
        out.extend_from_slice(&(self.header.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&self.enc);
        out
    }

    /// The stream id: for a job input, its job id.
    pub fn stream_id(&self) -> StreamId {
        let mut hasher = Sha256::new();
        hasher.update(LABEL_STREAM_ID);
        hasher.update([0u8]);
        hasher.update(self.unconfirmed_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; STREAM_ID_LEN];
        id.copy_from_slice(&digest[..STREAM_ID_LEN]);
        id
    }

    /// Parses a preamble of the expected kind from the front of `bytes`. Returns `Ok(None)` when
    /// more bytes are needed, otherwise the preamble and how many bytes it took.
    pub fn parse(bytes: &[u8], expected: StreamKind) -> Result<Option<(Preamble, usize)>, EnvelopeError> {
        let fixed = 8;
        if bytes.len() < fixed {
            // Reject a wrong magic as early as it can be seen.
            if !MAGIC.starts_with(&bytes[..bytes.len().min(4)]) {
                return Err(EnvelopeError::BadMagic);
            }
            return Ok(None);
        }
        if &bytes[..4] != MAGIC {
            return Err(EnvelopeError::BadMagic);
        }
        if bytes[4] != VERSION {
            return Err(EnvelopeError::UnsupportedVersion(bytes[4]));
        }
        if bytes[5] != expected as u8 {
            return Err(EnvelopeError::WrongKind { expected, found: bytes[5] });
        }
        let header_len = usize::from(u16::from_be_bytes([bytes[6], bytes[7]]));
        if header_len == 0 || header_len > MAX_HEADER_LEN {
            return Err(EnvelopeError::HeaderLength(header_len));
        }
        let total = fixed + header_len + expected.enc_len() + CONFIRMATION_LEN;
        if bytes.len() < total {
            return Ok(None);
        }
        let header = bytes[fixed..fixed + header_len].to_vec();
        let enc = bytes[fixed + header_len..fixed + header_len + expected.enc_len()].to_vec();
        let mut confirmation = [0u8; CONFIRMATION_LEN];
        confirmation.copy_from_slice(&bytes[total - CONFIRMATION_LEN..total]);
        Ok(Some((Preamble { kind: expected, header, enc, confirmation }, total)))
    }

    /// Parses a complete preamble, failing if `bytes` ends inside it.
    pub fn parse_complete(bytes: &[u8], expected: StreamKind) -> Result<(Preamble, usize), EnvelopeError> {
        Self::parse(bytes, expected)?.ok_or(EnvelopeError::TruncatedPreamble)
    }
}

fn info(kind: StreamKind, header: &[u8]) -> Vec<u8> {
    let mut info = Vec::with_capacity(kind.label().len() + 1 + header.len());
    info.extend_from_slice(kind.label());
    info.push(0);
    info.extend_from_slice(header);
    info
}

/// Secrets exported from one HPKE context.
struct Exported {
    confirmation: [u8; CONFIRMATION_LEN],
    stream_key: Zeroizing<[u8; 32]>,
    commitment_key: Zeroizing<[u8; 32]>,
}

fn export_all(export: impl Fn(&[u8], &mut [u8]) -> Result<(), hpke::HpkeError>) -> Result<Exported, EnvelopeError> {
    let mut exported = Exported {
        confirmation: [0; CONFIRMATION_LEN],
        stream_key: Zeroizing::new([0; 32]),
        commitment_key: Zeroizing::new([0; 32]),
    };
    let fail = |e: hpke::HpkeError| EnvelopeError::Hpke(e.to_string());
    export(EXPORT_CONFIRMATION, &mut exported.confirmation).map_err(fail)?;
    export(EXPORT_STREAM_KEY, exported.stream_key.as_mut()).map_err(fail)?;
    export(EXPORT_COMMITMENT_KEY, exported.commitment_key.as_mut()).map_err(fail)?;
    Ok(exported)
}

/// Supplies fixed bytes as "randomness": only for known-answer vectors.
struct FixedIkm<'a>(&'a [u8]);

impl TryRng for FixedIkm<'_> {
    type Error = core::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for (i, byte) in dst.iter_mut().enumerate() {
            *byte = self.0.get(i).copied().unwrap_or(0);
        }
        self.0 = self.0.get(dst.len()..).unwrap_or(&[]);
        Ok(())
    }
}

impl TryCryptoRng for FixedIkm<'_> {}

/// The sender's side of a freshly set up envelope.
pub struct Sealed {
    /// Write these bytes first.
    pub preamble: Vec<u8>,
    pub stream_id: StreamId,
    /// Then push the plaintext through this and write what it emits.
    pub sealer: StreamSealer,
    /// Key for the plaintext commitment a receipt carries.
    pub commitment_key: Zeroizing<[u8; 32]>,
}

fn seal_with<K: Kem>(
    kind: StreamKind,
    header: Vec<u8>,
    recipient: &K::PublicKey,
    ephemeral_ikm: Option<&[u8]>,
) -> Result<Sealed, EnvelopeError> {
    if header.is_empty() || header.len() > MAX_HEADER_LEN {
        return Err(EnvelopeError::HeaderLength(header.len()));
    }
    let info = info(kind, &header);
    let (enc, context) = match ephemeral_ikm {
        Some(ikm) => hpke::setup_sender_with_rng::<ChaCha20Poly1305, HkdfSha256, K>(
            &OpModeS::Base,
            recipient,
            &info,
            &mut FixedIkm(ikm),
        ),
        None => hpke::setup_sender::<ChaCha20Poly1305, HkdfSha256, K>(&OpModeS::Base, recipient, &info),
    }
    .map_err(|e| EnvelopeError::Hpke(e.to_string()))?;
    let exported = export_all(|label, out| context.export(label, out))?;
    let preamble = Preamble { kind, header, enc: enc.to_bytes().to_vec(), confirmation: exported.confirmation };
    let stream_id = preamble.stream_id();
    Ok(Sealed {
        preamble: preamble.to_bytes(),
        stream_id,
        sealer: StreamSealer::new(&exported.stream_key, stream_id),
        commitment_key: exported.commitment_key,
    })
}

/// The recipient's side of an authenticated envelope.
pub struct Opened<H> {
    pub header: H,
    pub stream_id: StreamId,
    pub opener: StreamOpener,
    pub commitment_key: Zeroizing<[u8; 32]>,
}

fn open_with<K: Kem>(preamble: &Preamble, recipient: &K::PrivateKey) -> Result<Opened<()>, EnvelopeError> {
    let enc = K::EncappedKey::from_bytes(&preamble.enc).map_err(|_| EnvelopeError::Decapsulation)?;
    let info = info(preamble.kind, &preamble.header);
    let context =
        hpke::setup_receiver::<ChaCha20Poly1305, HkdfSha256, K>(&OpModeR::Base, recipient, &enc, &info)
            .map_err(|_| EnvelopeError::Decapsulation)?;
    let exported = export_all(|label, out| context.export(label, out))?;
    if !bool::from(exported.confirmation.ct_eq(&preamble.confirmation)) {
        return Err(EnvelopeError::HeaderAuthentication);
    }
    let stream_id = preamble.stream_id();
    Ok(Opened {
        header: (),
        stream_id,
        opener: StreamOpener::new(&exported.stream_key, stream_id),
        commitment_key: exported.commitment_key,
    })
}

/// Seals a job input to the fleet key. The returned stream id is the job id.
pub fn seal_job(header: &JobHeader, fleet: &FleetPublicKey) -> Result<Sealed, EnvelopeError> {
    seal_job_inner(header, fleet, None)
}

/// Like [`seal_job`] with the HPKE ephemeral key derived from `ikm`. Only for known-answer
/// vectors: reusing an ikm reuses the ephemeral key.
#[doc(hidden)]
pub fn seal_job_with_ephemeral_ikm(header: &JobHeader, fleet: &FleetPublicKey, ikm: &[u8; 32]) -> Result<Sealed, EnvelopeError> {
    seal_job_inner(header, fleet, Some(ikm))
}

fn seal_job_inner(header: &JobHeader, fleet: &FleetPublicKey, ikm: Option<&[u8]>) -> Result<Sealed, EnvelopeError> {
    if header.fleet_key_id != fleet.key_id() {
        return Err(EnvelopeError::HeaderInvalid("fleet key id does not match the fleet key"));
    }
    seal_with::<FleetKem>(StreamKind::JobInput, header.to_bytes(), &fleet.0, ikm)
}

/// Opens a job input with the fleet private key. `claimed` is the job id the job was presented
/// under (queue message, object key); it must equal the id the envelope derives.
pub fn open_job(
    preamble: &Preamble,
    fleet: &FleetSecretKey,
    claimed: Option<JobId>,
) -> Result<Opened<JobHeader>, EnvelopeError> {
    let header = JobHeader::from_bytes(&preamble.header)?;
    let ours = fleet.public_key().key_id();
    if header.fleet_key_id != ours {
        return Err(EnvelopeError::WrongRecipientKey { sealed_to: hex::encode(header.fleet_key_id), ours: hex::encode(ours) });
    }
    check_claimed(preamble, claimed)?;
    let opened = open_with::<FleetKem>(preamble, &fleet.0)?;
    Ok(Opened { header, stream_id: opened.stream_id, opener: opened.opener, commitment_key: opened.commitment_key })
}

fn check_claimed(preamble: &Preamble, claimed: Option<JobId>) -> Result<(), EnvelopeError> {
    if let Some(claimed) = claimed {
        let derived = JobId(preamble.stream_id());
        if derived != claimed {
            return Err(EnvelopeError::JobIdMismatch { derived: derived.to_hex(), claimed: claimed.to_hex() });
        }
    }
    Ok(())
}

/// Seals a job result to the client's result key.
pub fn seal_result(header: &ResultHeader, client: &ResultPublicKey) -> Result<Sealed, EnvelopeError> {
    seal_result_inner(header, client, None)
}

#[doc(hidden)]
pub fn seal_result_with_ephemeral_ikm(header: &ResultHeader, client: &ResultPublicKey, ikm: &[u8; 32]) -> Result<Sealed, EnvelopeError> {
    seal_result_inner(header, client, Some(ikm))
}

fn seal_result_inner(header: &ResultHeader, client: &ResultPublicKey, ikm: Option<&[u8]>) -> Result<Sealed, EnvelopeError> {
    if header.result_key_id != client.key_id() {
        return Err(EnvelopeError::HeaderInvalid("result key id does not match the result key"));
    }
    seal_with::<ResultKem>(StreamKind::JobResult, header.to_bytes(), &client.0, ikm)
}

/// Opens a job result with the client's result key, checking it belongs to `expected_job`.
pub fn open_result(
    preamble: &Preamble,
    client: &ResultSecretKey,
    expected_job: Option<JobId>,
) -> Result<Opened<ResultHeader>, EnvelopeError> {
    let header = ResultHeader::from_bytes(&preamble.header)?;
    let ours = client.public_key().key_id();
    if header.result_key_id != ours {
        return Err(EnvelopeError::WrongRecipientKey { sealed_to: hex::encode(header.result_key_id), ours: hex::encode(ours) });
    }
    if let Some(expected) = expected_job
        && header.job_id != expected
    {
        return Err(EnvelopeError::JobIdMismatch { derived: header.job_id.to_hex(), claimed: expected.to_hex() });
    }
    let opened = open_with::<ResultKem>(preamble, &client.0)?;
    Ok(Opened { header, stream_id: opened.stream_id, opener: opened.opener, commitment_key: opened.commitment_key })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod rfc9180;
