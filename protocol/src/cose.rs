//! COSE_Sign1 (RFC 9052) with EdDSA over Ed25519, for receipts and model manifests.
//!
//! Layout: tag 18 ‖ [protected = bstr {1: -8, 3: content type, 4: kid}, unprotected = {},
//! payload = bstr, signature = bstr(64)]. The kid is the signer's [key id](crate::keys::key_id).
//! Decoding is strict: the bytes must be exactly what this module would have produced, so a
//! message has one encoding and hashes of it are stable.

use coset::{iana, CoseSign1, CoseSign1Builder, HeaderBuilder, TaggedCborSerializable};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::keys::{key_id, KeyId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoseError {
    #[error("not a COSE_Sign1 structure: {0}")]
    Structure(String),
    #[error("COSE_Sign1 is not in canonical form")]
    NotCanonical,
    #[error("protected header must be {{alg: EdDSA, content type: {expected}, kid}}")]
    Header { expected: &'static str },
    #[error("unprotected header must be empty")]
    UnprotectedHeader,
    #[error("payload missing")]
    NoPayload,
    #[error("signed by key {found}, expected key {expected}")]
    WrongKey { found: String, expected: String },
    #[error("Ed25519 signature does not verify")]
    BadSignature,
}

/// A decoded, not yet verified, COSE_Sign1 message.
#[derive(Debug, Clone)]
pub struct Sign1 {
    pub kid: KeyId,
    pub payload: Vec<u8>,
    message: CoseSign1,
}

pub fn sign(payload: Vec<u8>, content_type: &'static str, key: &SigningKey) -> Vec<u8> {
    let kid = key_id(key.verifying_key().as_bytes());
    let protected = HeaderBuilder::new()
        .algorithm(iana::Algorithm::EdDSA)
        .content_type(content_type.to_owned())
        .key_id(kid.to_vec())
        .build();
    let message = CoseSign1Builder::new()
        .protected(protected)
        .payload(payload)
        .create_signature(b"", |tbs| key.sign(tbs).to_bytes().to_vec())
        .build();
    // Serialising a structure we just built from owned bytes does not fail.
    message.to_tagged_vec().unwrap_or_default()
}

/// The content type a message declares, read without any other check: for dispatching bytes
/// to the strict decoder of their kind, which then checks everything.
pub fn declared_content_type(bytes: &[u8]) -> Option<String> {
    match CoseSign1::from_tagged_slice(bytes).ok()?.protected.header.content_type? {
        coset::ContentType::Text(text) => Some(text),
        coset::ContentType::Assigned(_) => None,
    }
}

impl Sign1 {
    pub fn decode(bytes: &[u8], content_type: &'static str) -> Result<Self, CoseError> {
        let message = CoseSign1::from_tagged_slice(bytes).map_err(|e| CoseError::Structure(e.to_string()))?;
        if message.clone().to_tagged_vec().ok().as_deref() != Some(bytes) {
            return Err(CoseError::NotCanonical);
        }
        let header = &message.protected.header;
        let expected = HeaderBuilder::new()
            .algorithm(iana::Algorithm::EdDSA)
            .content_type(content_type.to_owned())
            .key_id(header.key_id.clone())
            .build();
        if *header != expected {
            return Err(CoseError::Header { expected: content_type });
        }
        let kid: KeyId = header.key_id.clone().try_into().map_err(|_| CoseError::Header { expected: content_type })?;
        if !message.unprotected.is_empty() {
            return Err(CoseError::UnprotectedHeader);
        }
        let payload = message.payload.clone().ok_or(CoseError::NoPayload)?;
        Ok(Self { kid, payload, message })
    }

    /// Checks the kid names `key` and the signature verifies (strict Ed25519: no malleability).
    pub fn verify(&self, key: &VerifyingKey) -> Result<(), CoseError> {
        let expected = key_id(key.as_bytes());
        if expected != self.kid {
            return Err(CoseError::WrongKey { found: hex::encode(self.kid), expected: hex::encode(expected) });
        }
        self.message.verify_signature(b"", |signature, tbs| {
            let signature = Signature::from_slice(signature).map_err(|_| CoseError::BadSignature)?;
            key.verify_strict(tbs, &signature).map_err(|_| CoseError::BadSignature)
        })
    }
}

/// Re-encodes a structure for tests that want to tamper with it.
#[cfg(test)]
pub(crate) fn reencode(message: &Sign1) -> Vec<u8> {
    use coset::CborSerializable;
    message.message.clone().to_vec().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_refusals() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let bytes = sign(b"payload".to_vec(), "application/x-test", &key);
        let message = Sign1::decode(&bytes, "application/x-test").unwrap();
        assert_eq!(message.payload, b"payload");
        message.verify(&key.verifying_key()).unwrap();

        let other = SigningKey::from_bytes(&[2; 32]);
        assert!(matches!(message.verify(&other.verifying_key()), Err(CoseError::WrongKey { .. })));
        assert!(matches!(Sign1::decode(&bytes, "application/x-other"), Err(CoseError::Header { .. })));
        // Untagged form is refused: the canonical form is tagged.
        assert!(Sign1::decode(&reencode(&message), "application/x-test").is_err());

        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let message = Sign1::decode(&flipped, "application/x-test").unwrap();
        assert_eq!(message.verify(&key.verifying_key()), Err(CoseError::BadSignature));
    }
}
