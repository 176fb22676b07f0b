//! The CMS EnvelopedData (RFC 5652) that KMS returns as `CiphertextForRecipient`, read and written
//! in exactly the shape real KMS uses: **BER** with indefinite lengths on the outer structures, a
//! constructed, chunked encrypted content, one KeyTransRecipientInfo (version 2, subjectKeyIdentifier)
//! whose key is wrapped with RSAES-OAEP (SHA-256, MGF1-SHA-256), and AES-256-CBC content with
//! PKCS#7 padding.
//!
//! AES-CBC carries no MAC and the RSA key is public, so this layer authenticates nothing: anyone
//! who sees the attestation document can seal *some* content to it. Callers must authenticate
//! what comes out (model DEKs open AEAD-sealed, hash-checked files; fleet keys are checked against
//! their published public key).
//!
//! The reader accepts only that profile; anything else — another algorithm, a second recipient,
//! a DER/BER construct outside it — is refused with the field named. The RSA key that opens an
//! envelope is meant to be used once (see DESIGN.md §3: a one-shot key leaves no decryption
//! oracle for a hostile host to query).

use aes::cipher::{block_padding::Pkcs7, BlockModeDecrypt, BlockModeEncrypt, KeyIvInit};
use rsa::{Oaep, RsaPrivateKey, RsaPublicKey};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Largest envelope accepted (a data key or a PKCS#8 private key fits many times over).
pub const MAX_ENVELOPE_LEN: usize = 64 * 1024;
const MAX_DEPTH: usize = 12;

const OID_ENVELOPED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x03];
const OID_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01];
const OID_RSAES_OAEP: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x07];
const OID_MGF1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x08];
const OID_SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
const OID_AES256_CBC: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x01, 0x2a];

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const NULL: u8 = 0x05;
const OID: u8 = 0x06;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmsError {
    #[error("CMS envelope of {0} bytes exceeds {MAX_ENVELOPE_LEN}")]
    TooLarge(usize),
    #[error("BER malformed at offset {offset}: {what}")]
    Ber { offset: usize, what: &'static str },
    #[error("CMS structure: expected {0}")]
    Structure(&'static str),
    #[error("unsupported CMS profile: {0}")]
    Unsupported(&'static str),
    #[error("RSA-OAEP unwrap of the content key failed")]
    KeyUnwrap,
    #[error("AES-256-CBC content decryption failed (bad padding)")]
    ContentDecryption,
    #[error("RSA public key: {0}")]
    PublicKey(String),
}

/// A BER element.
#[derive(Debug)]
struct Element<'a> {
    tag: u8,
    body: Body<'a>,
}

#[derive(Debug)]
enum Body<'a> {
    Primitive(&'a [u8]),
    Constructed(Vec<Element<'a>>),
}

fn ber_error(offset: usize, what: &'static str) -> CmsError {
    CmsError::Ber { offset, what }
}

/// Parses one element at `*at`; returns it and advances `*at`.
fn parse_element<'a>(bytes: &'a [u8], at: &mut usize, depth: usize) -> Result<Element<'a>, CmsError> {
    let offset = *at;
    if depth > MAX_DEPTH {
        return Err(ber_error(offset, "nested too deeply"));
    }
    let tag = *bytes.get(*at).ok_or(ber_error(offset, "missing tag"))?;
    if tag & 0x1f == 0x1f {
        return Err(ber_error(offset, "high tag numbers are not used by this profile"));
    }
    *at += 1;
    let first = *bytes.get(*at).ok_or(ber_error(offset, "missing length"))?;
    *at += 1;
    let constructed = tag & 0x20 != 0;
    let length = match first {
        0x80 => None,
        n if n < 0x80 => Some(usize::from(n)),
        n => {
            let count = usize::from(n & 0x7f);
            if count > 3 {
                return Err(ber_error(offset, "length too large"));
            }
            let mut len = 0usize;
            for _ in 0..count {
                let b = *bytes.get(*at).ok_or(ber_error(offset, "truncated length"))?;
                *at += 1;
                len = (len << 8) | usize::from(b);
            }
            Some(len)
        }
    };
    match (constructed, length) {
        (false, None) => Err(ber_error(offset, "indefinite length on a primitive")),
        (false, Some(len)) => {
            let end = at.checked_add(len).filter(|&e| e <= bytes.len()).ok_or(ber_error(offset, "truncated content"))?;
            let body = Body::Primitive(&bytes[*at..end]);
            *at = end;
            Ok(Element { tag, body })
        }
        (true, Some(len)) => {
            let end = at.checked_add(len).filter(|&e| e <= bytes.len()).ok_or(ber_error(offset, "truncated content"))?;
            let inner = &bytes[..end];
            let mut children = Vec::new();
            while *at < end {
                children.push(parse_element(inner, at, depth + 1)?);
            }
            Ok(Element { tag, body: Body::Constructed(children) })
        }
        (true, None) => {
            let mut children = Vec::new();
            loop {
                match bytes.get(*at..*at + 2) {
                    Some([0, 0]) => {
                        *at += 2;
                        break;
                    }
                    Some(_) => children.push(parse_element(bytes, at, depth + 1)?),
                    None => return Err(ber_error(offset, "missing end-of-contents")),
                }
            }
            Ok(Element { tag, body: Body::Constructed(children) })
        }
    }
}

impl<'a> Element<'a> {
    fn expect(&self, tag: u8, what: &'static str) -> Result<&Self, CmsError> {
        if self.tag == tag { Ok(self) } else { Err(CmsError::Structure(what)) }
    }

    fn children(&self, what: &'static str) -> Result<&[Element<'a>], CmsError> {
        match &self.body {
            Body::Constructed(children) => Ok(children),
            Body::Primitive(_) => Err(CmsError::Structure(what)),
        }
    }

    fn primitive(&self, what: &'static str) -> Result<&'a [u8], CmsError> {
        match self.body {
            Body::Primitive(bytes) => Ok(bytes),
            Body::Constructed(_) => Err(CmsError::Structure(what)),
        }
    }

    /// An OCTET STRING's value, primitive or constructed from primitive chunks (BER).
    fn octets(&self, what: &'static str) -> Result<Vec<u8>, CmsError> {
        match &self.body {
            Body::Primitive(bytes) => Ok(bytes.to_vec()),
            Body::Constructed(chunks) => {
                let mut out = Vec::new();
                for chunk in chunks {
                    out.extend_from_slice(chunk.expect(OCTET_STRING, what)?.primitive(what)?);
                }
                Ok(out)
            }
        }
    }

    fn is_oid(&self, oid: &[u8]) -> bool {
        self.tag == OID && matches!(self.body, Body::Primitive(b) if b == oid)
    }
}

fn child<'e, 'a>(children: &'e [Element<'a>], index: usize, what: &'static str) -> Result<&'e Element<'a>, CmsError> {
    children.get(index).ok_or(CmsError::Structure(what))
}

/// An AlgorithmIdentifier for SHA-256: parameters absent or NULL.
fn is_sha256(alg: &Element<'_>) -> Result<bool, CmsError> {
    let parts = alg.expect(SEQUENCE, "hash AlgorithmIdentifier")?.children("hash AlgorithmIdentifier")?;
    Ok(match parts {
        [oid] => oid.is_oid(OID_SHA256),
        [oid, null] => oid.is_oid(OID_SHA256) && null.tag == NULL && matches!(null.body, Body::Primitive([])),
        _ => false,
    })
}

/// The parts of a `CiphertextForRecipient` envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopedData {
    pub subject_key_identifier: Vec<u8>,
    pub encrypted_key: Vec<u8>,
    pub iv: [u8; 16],
    pub encrypted_content: Vec<u8>,
}

impl EnvelopedData {
    /// Parses the BER envelope, checking every field of the profile.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmsError> {
        if bytes.len() > MAX_ENVELOPE_LEN {
            return Err(CmsError::TooLarge(bytes.len()));
        }
        let mut at = 0;
        let root = parse_element(bytes, &mut at, 0)?;
        if at != bytes.len() {
            return Err(ber_error(at, "trailing bytes"));
        }
        let content_info = root.expect(SEQUENCE, "ContentInfo SEQUENCE")?.children("ContentInfo")?;
        if !child(content_info, 0, "contentType")?.is_oid(OID_ENVELOPED_DATA) {
            return Err(CmsError::Unsupported("content type is not envelopedData"));
        }
        let explicit = child(content_info, 1, "[0] content")?.expect(0xa0, "[0] content")?.children("[0] content")?;
        let [enveloped] = explicit else { return Err(CmsError::Structure("one EnvelopedData")) };
        let fields = enveloped.expect(SEQUENCE, "EnvelopedData SEQUENCE")?.children("EnvelopedData")?;
        let [version, recipients, encrypted_content_info] = fields else {
            return Err(CmsError::Unsupported("EnvelopedData with originatorInfo or unprotectedAttrs"));
        };
        if version.expect(INTEGER, "version")?.primitive("version")? != [2] {
            return Err(CmsError::Unsupported("EnvelopedData version other than 2"));
        }
        let [recipient] = recipients.expect(SET, "RecipientInfos SET")?.children("RecipientInfos")? else {
            return Err(CmsError::Unsupported("not exactly one recipient"));
        };
        let ktri = recipient.expect(SEQUENCE, "KeyTransRecipientInfo")?.children("KeyTransRecipientInfo")?;
        let [kt_version, rid, key_alg, encrypted_key] = ktri else {
            return Err(CmsError::Structure("KeyTransRecipientInfo fields"));
        };
        if kt_version.expect(INTEGER, "ktri version")?.primitive("ktri version")? != [2] {
            return Err(CmsError::Unsupported("KeyTransRecipientInfo version other than 2"));
        }
        let subject_key_identifier = rid.expect(0x80, "subjectKeyIdentifier [0]")?.primitive("subjectKeyIdentifier")?.to_vec();
        Self::check_oaep(key_alg)?;
        let encrypted_key = encrypted_key.expect(OCTET_STRING, "encryptedKey")?.octets("encryptedKey")?;

        let eci = encrypted_content_info.expect(SEQUENCE, "EncryptedContentInfo")?.children("EncryptedContentInfo")?;
        let [content_type, content_alg, content] = eci else {
            return Err(CmsError::Structure("EncryptedContentInfo with encrypted content"));
        };
        if !content_type.is_oid(OID_DATA) {
            return Err(CmsError::Unsupported("encrypted content type is not data"));
        }
        let alg = content_alg.expect(SEQUENCE, "contentEncryptionAlgorithm")?.children("contentEncryptionAlgorithm")?;
        let [alg_oid, iv] = alg else { return Err(CmsError::Structure("AES-CBC parameters")) };
        if !alg_oid.is_oid(OID_AES256_CBC) {
            return Err(CmsError::Unsupported("content encryption is not AES-256-CBC"));
        }
        let iv: [u8; 16] = iv
            .expect(OCTET_STRING, "IV")?
            .primitive("IV")?
            .try_into()
            .map_err(|_| CmsError::Structure("16-byte IV"))?;
        // [0] IMPLICIT OCTET STRING: primitive (0x80) or constructed (0xa0) chunks.
        let encrypted_content = match content.tag {
            0x80 | 0xa0 => content.octets("encryptedContent")?,
            _ => return Err(CmsError::Structure("[0] encryptedContent")),
        };
        if encrypted_content.is_empty() || encrypted_content.len() % 16 != 0 {
            return Err(CmsError::Structure("encrypted content of whole AES blocks"));
        }
        Ok(Self { subject_key_identifier, encrypted_key, iv, encrypted_content })
    }

    fn check_oaep(alg: &Element<'_>) -> Result<(), CmsError> {
        let parts = alg.expect(SEQUENCE, "keyEncryptionAlgorithm")?.children("keyEncryptionAlgorithm")?;
        let [oid, params] = parts else { return Err(CmsError::Unsupported("RSAES-OAEP without explicit parameters")) };
        if !oid.is_oid(OID_RSAES_OAEP) {
            return Err(CmsError::Unsupported("key encryption is not RSAES-OAEP"));
        }
        let params = params.expect(SEQUENCE, "RSAES-OAEP-params")?.children("RSAES-OAEP-params")?;
        let [hash, mgf] = params else { return Err(CmsError::Unsupported("OAEP parameters other than hash and MGF")) };
        let [hash_alg] = hash.expect(0xa0, "[0] hashAlgorithm")?.children("hashAlgorithm")? else {
            return Err(CmsError::Structure("hashAlgorithm"));
        };
        if !is_sha256(hash_alg)? {
            return Err(CmsError::Unsupported("OAEP hash is not SHA-256"));
        }
        let [mgf_alg] = mgf.expect(0xa1, "[1] maskGenAlgorithm")?.children("maskGenAlgorithm")? else {
            return Err(CmsError::Structure("maskGenAlgorithm"));
        };
        let mgf_parts = mgf_alg.expect(SEQUENCE, "MGF AlgorithmIdentifier")?.children("MGF")?;
        let [mgf_oid, mgf_hash] = mgf_parts else { return Err(CmsError::Structure("MGF1 parameters")) };
        if !mgf_oid.is_oid(OID_MGF1) || !is_sha256(mgf_hash)? {
            return Err(CmsError::Unsupported("MGF is not MGF1 with SHA-256"));
        }
        Ok(())
    }

    /// Unwraps the content key with `key` and decrypts the content.
    pub fn decrypt(&self, key: &RsaPrivateKey) -> Result<Zeroizing<Vec<u8>>, CmsError> {
        let content_key = Zeroizing::new(
            key.decrypt(Oaep::<Sha256>::new(), &self.encrypted_key).map_err(|_| CmsError::KeyUnwrap)?,
        );
        let content_key: &[u8; 32] = content_key.as_slice().try_into().map_err(|_| CmsError::KeyUnwrap)?;
        let decryptor = cbc::Decryptor::<aes::Aes256>::new(content_key.into(), &self.iv.into());
        decryptor
            .decrypt_padded_vec::<Pkcs7>(&self.encrypted_content)
            .map(Zeroizing::new)
            .map_err(|_| CmsError::ContentDecryption)
    }
}

/// Parses and opens a `CiphertextForRecipient` with the one-shot RSA key.
pub fn open(envelope: &[u8], key: &RsaPrivateKey) -> Result<Zeroizing<Vec<u8>>, CmsError> {
    EnvelopedData::parse(envelope)?.decrypt(key)
}

// -------------------------------------------------------------------------------------------
// Writing, for the local KMS stand-in: the same BER shape as real KMS.

fn definite(tag: u8, content: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    let len = content.len();
    match len {
        0..=0x7f => out.push(len as u8),
        0x80..=0xff => out.extend_from_slice(&[0x81, len as u8]),
        0x100..=0xffff => out.extend_from_slice(&[0x82, (len >> 8) as u8, len as u8]),
        _ => out.extend_from_slice(&[0x83, (len >> 16) as u8, (len >> 8) as u8, len as u8]),
    }
    out.extend_from_slice(content);
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    definite(tag, content, &mut out);
    out
}

fn indefinite(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![tag, 0x80];
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// Key id KMS-style recipients use for an RSA public key: SHA-256 of its SPKI DER.
pub fn subject_key_identifier(public_key_der: &[u8]) -> [u8; 32] {
    Sha256::digest(public_key_der).into()
}

/// Seals `plaintext` to the RSA key in `recipient_spki_der` (an attestation document's
/// `public_key`), as KMS does for a `Recipient` request.
pub fn seal<R: rsa::rand_core::CryptoRng + ?Sized>(
    recipient_spki_der: &[u8],
    plaintext: &[u8],
    rng: &mut R,
) -> Result<Vec<u8>, CmsError> {
    use rsa::pkcs8::DecodePublicKey;
    let public = RsaPublicKey::from_public_key_der(recipient_spki_der).map_err(|e| CmsError::PublicKey(e.to_string()))?;
    let mut content_key = Zeroizing::new([0u8; 32]);
    let mut iv = [0u8; 16];
    rng.fill_bytes(content_key.as_mut());
    rng.fill_bytes(&mut iv);
    let encrypted_key = public
        .encrypt(rng, Oaep::<Sha256>::new(), content_key.as_ref())
        .map_err(|e| CmsError::PublicKey(e.to_string()))?;
    let key_array: &[u8; 32] = &content_key;
    let ciphertext = cbc::Encryptor::<aes::Aes256>::new(key_array.into(), &iv.into())
        .encrypt_padded_vec::<Pkcs7>(plaintext);

    let sha256 = tlv(SEQUENCE, &[tlv(OID, OID_SHA256), tlv(NULL, &[])].concat());
    let oaep_params = tlv(
        SEQUENCE,
        &[tlv(0xa0, &sha256), tlv(0xa1, &tlv(SEQUENCE, &[tlv(OID, OID_MGF1), sha256.clone()].concat()))].concat(),
    );
    let key_alg = tlv(SEQUENCE, &[tlv(OID, OID_RSAES_OAEP), oaep_params].concat());
    let ktri = tlv(
        SEQUENCE,
        &[
            tlv(INTEGER, &[2]),
            tlv(0x80, &subject_key_identifier(recipient_spki_der)),
            key_alg,
            tlv(OCTET_STRING, &encrypted_key),
        ]
        .concat(),
    );
    let content_alg = tlv(SEQUENCE, &[tlv(OID, OID_AES256_CBC), tlv(OCTET_STRING, &iv)].concat());
    let chunks: Vec<Vec<u8>> = ciphertext.chunks(1024).map(|c| tlv(OCTET_STRING, c)).collect();
    let chunk_refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let encrypted_content_info = indefinite(
        SEQUENCE,
        &[&tlv(OID, OID_DATA), &content_alg, &indefinite(0xa0, &chunk_refs)],
    );
    let enveloped = indefinite(SEQUENCE, &[&tlv(INTEGER, &[2]), &tlv(SET, &ktri), &encrypted_content_info]);
    Ok(indefinite(SEQUENCE, &[&tlv(OID, OID_ENVELOPED_DATA), &indefinite(0xa0, &[&enveloped])]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsa::pkcs8::EncodePublicKey;

    fn fixture() -> Vec<u8> {
        let dir = std::env::var_os("EPHEM_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures").into());
        std::fs::read(dir.join("kms-cms/kms_ciphertext_for_recipient_1.ber")).expect("kms-cms fixture (set EPHEM_FIXTURES)")
    }

    fn rng() -> rsa::rand_core::UnwrapErr<getrandom::SysRng> {
        rsa::rand_core::UnwrapErr(getrandom::SysRng)
    }

    #[test]
    fn parses_the_real_kms_envelope() {
        let envelope = EnvelopedData::parse(&fixture()).unwrap();
        assert_eq!(envelope.subject_key_identifier.len(), 32);
        assert_eq!(envelope.encrypted_key.len(), 256);
        assert_eq!(hex::encode(envelope.iv), "37343df1470df625eeb6f4bfd2f1acc3");
        assert_eq!(hex::encode(&envelope.encrypted_content), "cc74adf65d973c8b72cd51e1b927f0f0");
    }

    #[test]
    fn every_truncation_and_byte_flip_of_the_real_envelope_is_handled() {
        let bytes = fixture();
        for cut in 0..bytes.len() {
            assert!(EnvelopedData::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x01;
            let _ = EnvelopedData::parse(&flipped);
        }
    }

    #[test]
    fn sealed_envelopes_have_the_kms_shape_and_open() {
        let key = RsaPrivateKey::new(&mut rng(), 2048).unwrap();
        let spki = key.to_public_key().to_public_key_der().unwrap();
        let envelope = seal(spki.as_bytes(), b"thirty-two bytes of a data key!!", &mut rng()).unwrap();
        // Same outer shape as the real one: indefinite SEQUENCE, OID envelopedData, indefinite [0].
        assert_eq!(&envelope[..4], &fixture()[..4]);
        let parsed = EnvelopedData::parse(&envelope).unwrap();
        assert_eq!(parsed.subject_key_identifier, subject_key_identifier(spki.as_bytes()));
        assert_eq!(&*open(&envelope, &key).unwrap(), b"thirty-two bytes of a data key!!");

        let other = RsaPrivateKey::new(&mut rng(), 2048).unwrap();
        assert_eq!(open(&envelope, &other), Err(CmsError::KeyUnwrap));
        let mut wrong_key = envelope.clone();
        let at = wrong_key.windows(256).position(|w| w == parsed.encrypted_key.as_slice()).unwrap();
        wrong_key[at + 7] ^= 1;
        assert_eq!(open(&wrong_key, &key), Err(CmsError::KeyUnwrap));
    }
}
