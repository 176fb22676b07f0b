//! Oblivious HTTP (RFC 9458) between a client and the enclave, relayed by a host that sees only
//! ciphertext (docs/protocol.md §9).
//!
//! The gateway key of an epoch is that epoch's fleet key, so the key configuration is a function
//! of what a verified attestation document already binds: key id `epoch mod 256`, KEM
//! DHKEM(P-256, HKDF-SHA256), KDF HKDF-SHA256, AEAD ChaCha20Poly1305 — the suite the job
//! envelopes use. HPKE's `info` keeps the two uses apart: a request's context is keyed by
//! `"message/bhttp request" ‖ 0 ‖ header`, an envelope's by its own label, so no ciphertext of one
//! opens as the other.
//!
//! Request: `header(7) ‖ enc(65) ‖ Seal(request)`. Response: `nonce(32) ‖ Seal'(response)`, under
//! a key and nonce derived from the request context's exported secret (RFC 9458 §4.4).

use chacha20poly1305::aead::Aead;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use hkdf::Hkdf;
use hpke::kdf::HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::envelope::{FleetKem, FleetPublicKey, FleetSecretKey};

/// DHKEM(P-256, HKDF-SHA256).
pub const KEM_ID: u16 = 0x0010;
/// HKDF-SHA256.
pub const KDF_ID: u16 = 0x0001;
/// ChaCha20Poly1305.
pub const AEAD_ID: u16 = 0x0003;
/// `Content-Type` of an encapsulated request and response, and of a key configuration list.
pub const REQUEST_MEDIA_TYPE: &str = "message/ohttp-req";
pub const RESPONSE_MEDIA_TYPE: &str = "message/ohttp-res";
pub const KEYS_MEDIA_TYPE: &str = "application/ohttp-keys";

const HEADER_LEN: usize = 7;
const ENC_LEN: usize = 65;
const INFO_REQUEST: &[u8] = b"message/bhttp request";
const LABEL_RESPONSE: &[u8] = b"message/bhttp response";
/// max(Nn, Nk) of ChaCha20Poly1305.
const RESPONSE_NONCE_LEN: usize = 32;
const AEAD_KEY_LEN: usize = 32;
const AEAD_NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Why an encapsulated message was refused; each check has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OhttpError {
    #[error("encapsulated request of {0} bytes is shorter than its header, key and tag")]
    RequestTooShort(usize),
    #[error("key id {found} names no key held (expected {expected})")]
    UnknownKeyId { found: u8, expected: u8 },
    #[error("unsupported suite: KEM {kem:#06x}, KDF {kdf:#06x}, AEAD {aead:#06x}")]
    UnsupportedSuite { kem: u16, kdf: u16, aead: u16 },
    #[error("the encapsulated key is not a P-256 point")]
    EncapsulatedKey,
    #[error("the request does not decrypt under this key (tampered, or sealed to another key)")]
    RequestAuthentication,
    #[error("encapsulated response of {0} bytes is shorter than its nonce and tag")]
    ResponseTooShort(usize),
    #[error("the response does not decrypt (tampered, or not the answer to this request)")]
    ResponseAuthentication,
    #[error("HPKE: {0}")]
    Hpke(String),
    #[error("key configuration: {0}")]
    KeyConfig(&'static str),
}

/// The gateway key configuration of one epoch (RFC 9458 §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyConfig {
    pub key_id: u8,
    pub public_key: FleetPublicKey,
}

impl KeyConfig {
    /// The configuration of an epoch's fleet key, as a verified binding names them.
    pub fn for_epoch(epoch: u64, public_key: FleetPublicKey) -> Self {
        Self { key_id: key_id(epoch), public_key }
    }

    /// `key_id(8) ‖ kem(16) ‖ public key ‖ suites length(16) ‖ (kdf(16) ‖ aead(16))`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.key_id];
        out.extend_from_slice(&KEM_ID.to_be_bytes());
        out.extend_from_slice(&self.public_key.to_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&KDF_ID.to_be_bytes());
        out.extend_from_slice(&AEAD_ID.to_be_bytes());
        out
    }

    /// One configuration of the `application/ohttp-keys` list form (length-prefixed).
    pub fn encode_list(&self) -> Vec<u8> {
        let config = self.encode();
        let mut out = (config.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&config);
        out
    }

    /// Parses [`KeyConfig::encode`]'s form; other suites are refused.
    pub fn decode(bytes: &[u8]) -> Result<Self, OhttpError> {
        let invalid = OhttpError::KeyConfig;
        let (&key_id, rest) = bytes.split_first().ok_or(invalid("empty"))?;
        let kem = u16::from_be_bytes(rest.get(..2).ok_or(invalid("no KEM"))?.try_into().unwrap_or_default());
        let rest = &rest[2..];
        if kem != KEM_ID {
            return Err(invalid("KEM is not DHKEM(P-256, HKDF-SHA256)"));
        }
        let key = rest.get(..ENC_LEN).ok_or(invalid("public key too short"))?;
        let public_key = FleetPublicKey::from_bytes(key).map_err(|_| invalid("public key is not a P-256 point"))?;
        if rest[ENC_LEN..] != [0, 4, 0, 1, 0, 3] {
            return Err(invalid("symmetric suites are not exactly HKDF-SHA256 with ChaCha20Poly1305"));
        }
        Ok(Self { key_id, public_key })
    }

    fn header(&self) -> [u8; HEADER_LEN] {
        header(self.key_id)
    }
}

/// The key id of an epoch: the epochs alive at once are a few consecutive numbers, so their low
/// bytes differ.
pub fn key_id(epoch: u64) -> u8 {
    (epoch % 256) as u8
}

fn header(key_id: u8) -> [u8; HEADER_LEN] {
    let mut header = [key_id, 0, 0, 0, 0, 0, 0];
    header[1..3].copy_from_slice(&KEM_ID.to_be_bytes());
    header[3..5].copy_from_slice(&KDF_ID.to_be_bytes());
    header[5..7].copy_from_slice(&AEAD_ID.to_be_bytes());
    header
}

fn request_info(header: &[u8; HEADER_LEN]) -> Vec<u8> {
    let mut info = INFO_REQUEST.to_vec();
    info.push(0);
    info.extend_from_slice(header);
    info
}

/// The key id an encapsulated request names (read before choosing the epoch's key).
pub fn request_key_id(encapsulated: &[u8]) -> Result<u8, OhttpError> {
    encapsulated.first().copied().ok_or(OhttpError::RequestTooShort(0))
}

/// What the client keeps to open the answer to its request.
pub struct ResponseOpener {
    enc: Vec<u8>,
    secret: Zeroizing<[u8; RESPONSE_NONCE_LEN]>,
}

/// Encapsulates `request` (Binary HTTP) to the gateway key.
pub fn encapsulate_request(config: &KeyConfig, request: &[u8]) -> Result<(Vec<u8>, ResponseOpener), OhttpError> {
    let header = config.header();
    let (enc, mut context) = hpke::setup_sender::<hpke::aead::ChaCha20Poly1305, HkdfSha256, FleetKem>(
        &OpModeS::Base,
        config.public_key.hpke(),
        &request_info(&header),
    )
    .map_err(|e| OhttpError::Hpke(e.to_string()))?;
    let ciphertext = context.seal(request, b"").map_err(|e| OhttpError::Hpke(e.to_string()))?;
    let mut secret = Zeroizing::new([0u8; RESPONSE_NONCE_LEN]);
    context.export(LABEL_RESPONSE, secret.as_mut()).map_err(|e| OhttpError::Hpke(e.to_string()))?;
    let enc = enc.to_bytes().to_vec();
    let mut out = Vec::with_capacity(HEADER_LEN + enc.len() + ciphertext.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&enc);
    out.extend_from_slice(&ciphertext);
    Ok((out, ResponseOpener { enc, secret }))
}

impl ResponseOpener {
    /// Opens the gateway's answer.
    pub fn open(&self, encapsulated: &[u8]) -> Result<Vec<u8>, OhttpError> {
        if encapsulated.len() < RESPONSE_NONCE_LEN + TAG_LEN {
            return Err(OhttpError::ResponseTooShort(encapsulated.len()));
        }
        let (nonce, ciphertext) = encapsulated.split_at(RESPONSE_NONCE_LEN);
        response_aead(self.secret.as_ref(), &self.enc, nonce)
            .decrypt(&aead_nonce(self.secret.as_ref(), &self.enc, nonce), ciphertext)
            .map_err(|_| OhttpError::ResponseAuthentication)
    }
}

/// What the gateway keeps to answer a request it opened.
pub struct ResponseSealer {
    enc: Vec<u8>,
    secret: Zeroizing<[u8; RESPONSE_NONCE_LEN]>,
}

impl ResponseSealer {
    /// The request's encapsulated key: unique per request, so it is what a replay cache keeps.
    pub fn encapsulated_key(&self) -> &[u8] {
        &self.enc
    }

    /// Encapsulates the answer with a fresh random nonce.
    pub fn seal(&self, response: &[u8]) -> Result<Vec<u8>, OhttpError> {
        let mut nonce = [0u8; RESPONSE_NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| OhttpError::Hpke(format!("randomness: {e}")))?;
        self.seal_with_nonce(response, &nonce)
    }

    fn seal_with_nonce(&self, response: &[u8], nonce: &[u8; RESPONSE_NONCE_LEN]) -> Result<Vec<u8>, OhttpError> {
        let ciphertext = response_aead(self.secret.as_ref(), &self.enc, nonce)
            .encrypt(&aead_nonce(self.secret.as_ref(), &self.enc, nonce), response)
            .map_err(|e| OhttpError::Hpke(e.to_string()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ciphertext);
        Ok(out)
    }
}

/// Opens an encapsulated request with the key of the epoch whose id `expected_key_id` is.
pub fn decapsulate_request(
    secret: &FleetSecretKey,
    expected_key_id: u8,
    encapsulated: &[u8],
) -> Result<(Vec<u8>, ResponseSealer), OhttpError> {
    if encapsulated.len() < HEADER_LEN + ENC_LEN + TAG_LEN {
        return Err(OhttpError::RequestTooShort(encapsulated.len()));
    }
    let (header, rest) = encapsulated.split_at(HEADER_LEN);
    let found = header[0];
    if found != expected_key_id {
        return Err(OhttpError::UnknownKeyId { found, expected: expected_key_id });
    }
    let suite = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    let (kem, kdf, aead) = (suite(1), suite(3), suite(5));
    if (kem, kdf, aead) != (KEM_ID, KDF_ID, AEAD_ID) {
        return Err(OhttpError::UnsupportedSuite { kem, kdf, aead });
    }
    let (enc, ciphertext) = rest.split_at(ENC_LEN);
    let encapped =
        <FleetKem as Kem>::EncappedKey::from_bytes(enc).map_err(|_| OhttpError::EncapsulatedKey)?;
    let header: [u8; HEADER_LEN] = header.try_into().map_err(|_| OhttpError::RequestTooShort(encapsulated.len()))?;
    let mut context = hpke::setup_receiver::<hpke::aead::ChaCha20Poly1305, HkdfSha256, FleetKem>(
        &OpModeR::Base,
        secret.hpke(),
        &encapped,
        &request_info(&header),
    )
    .map_err(|_| OhttpError::RequestAuthentication)?;
    let request = context.open(ciphertext, b"").map_err(|_| OhttpError::RequestAuthentication)?;
    let mut exported = Zeroizing::new([0u8; RESPONSE_NONCE_LEN]);
    context.export(LABEL_RESPONSE, exported.as_mut()).map_err(|e| OhttpError::Hpke(e.to_string()))?;
    Ok((request, ResponseSealer { enc: enc.to_vec(), secret: exported }))
}

fn response_prk(secret: &[u8], enc: &[u8], nonce: &[u8]) -> Hkdf<Sha256> {
    let mut salt = enc.to_vec();
    salt.extend_from_slice(nonce);
    Hkdf::<Sha256>::new(Some(&salt), secret)
}

fn response_aead(secret: &[u8], enc: &[u8], nonce: &[u8]) -> ChaCha20Poly1305 {
    let mut key = Zeroizing::new([0u8; AEAD_KEY_LEN]);
    // 32 bytes is far below HKDF-SHA256's limit, so expand cannot fail.
    let _ = response_prk(secret, enc, nonce).expand(b"key", key.as_mut());
    ChaCha20Poly1305::new(&(*key).into())
}

fn aead_nonce(secret: &[u8], enc: &[u8], nonce: &[u8]) -> chacha20poly1305::Nonce {
    let mut out = [0u8; AEAD_NONCE_LEN];
    let _ = response_prk(secret, enc, nonce).expand(b"nonce", &mut out);
    out.into()
}

#[cfg(test)]
mod tests;
