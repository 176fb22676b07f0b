//! C2SP signed notes with Ed25519 signatures (c2sp.org/signed-note).
//!
//! A note is `text` (ending in a newline), a blank line, and one or more lines
//! `— <key name> base64(key id (4 bytes, big endian) || signature)`. The key id
//! of an Ed25519 key is `SHA-256(name || 0x0A || 0x01 || public key)[:4]`.
//! Verifier keys are written `name+hex8(id)+base64(0x01 || public key)`,
//! signer keys `PRIVATE+KEY+name+hex8(id)+base64(0x01 || seed)`.

use base64::{engine::general_purpose::STANDARD, Engine};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use std::fmt;

/// Largest note this parser looks at, in bytes.
pub const MAX_NOTE_SIZE: usize = 256 * 1024;
/// Most signature lines accepted in one note (the spec asks for at least 16).
pub const MAX_SIGNATURES: usize = 64;
/// Signature type byte of Ed25519 note signatures.
pub const ED25519_TYPE: u8 = 0x01;

const SIG_PREFIX: &str = "\u{2014} ";
const SIGNER_PREFIX: &str = "PRIVATE+KEY+";

/// Everything that can be wrong with a key string, a note or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("note is {size} bytes, more than the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("note is not valid UTF-8")]
    NotUtf8,
    #[error("note contains control character {byte:#04x} at byte {offset}")]
    ControlCharacter { byte: u8, offset: usize },
    #[error("note text does not end with a newline")]
    NoFinalNewline,
    #[error("note has no blank line before its signatures")]
    NoSignatureBlock,
    #[error("note has no signature lines")]
    NoSignatures,
    #[error("note has more than {max} signature lines")]
    TooManySignatures { max: usize },
    #[error("signature line {line} does not start with an em dash and a space")]
    SignatureLinePrefix { line: usize },
    #[error("signature line {line} is not `— <name> <base64>`")]
    SignatureLineShape { line: usize },
    #[error("signature line {line}: signature is not canonical padded base64")]
    SignatureBase64 { line: usize },
    #[error("signature line {line}: signature is shorter than 5 bytes")]
    SignatureTooShort { line: usize },
    #[error("key name {0:?} is empty or contains a space or '+'")]
    BadKeyName(String),
    #[error("key string does not have the form name+hex8+base64")]
    KeyShape,
    #[error("key id is not 8 lowercase hex digits")]
    KeyIdHex,
    #[error("key material is not canonical padded base64")]
    KeyBase64,
    #[error("key material is not 0x01 followed by 32 bytes (Ed25519)")]
    KeyType,
    #[error("Ed25519 public key is not a valid point")]
    BadPublicKey,
    #[error("key id {stated:08x} in the key string does not match the computed {computed:08x}")]
    KeyIdMismatch { stated: u32, computed: u32 },
    #[error("signature by {name} ({id:08x}) does not verify")]
    BadSignature { name: String, id: u32 },
    #[error("no signature by a known key")]
    NoKnownSignature,
    #[error("signer failed: {0}")]
    Signer(String),
}

/// The key id of an Ed25519 note key.
pub fn key_id(name: &str, public: &VerifyingKey) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0x0a, ED25519_TYPE]);
    h.update(public.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// Key names are non-empty, with no Unicode space and no '+'.
pub fn check_key_name(name: &str) -> Result<(), NoteError> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '+' || c.is_control()) {
        return Err(NoteError::BadKeyName(name.to_owned()));
    }
    Ok(())
}

/// Splits `name+hex8+base64` and checks name and id syntax.
fn split_key(s: &str) -> Result<(&str, u32, Vec<u8>), NoteError> {
    let mut parts = s.splitn(3, '+');
    let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NoteError::KeyShape);
    };
    check_key_name(name)?;
    if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(NoteError::KeyIdHex);
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| NoteError::KeyIdHex)?;
    let key = STANDARD.decode(key).map_err(|_| NoteError::KeyBase64)?;
    if key.len() != 33 || key[0] != ED25519_TYPE {
        return Err(NoteError::KeyType);
    }
    Ok((name, id, key[1..].to_vec()))
}

/// A public note key: name, id and Ed25519 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct VerifierKey {
    name: String,
    id: u32,
    public: VerifyingKey,
}

impl VerifierKey {
    pub fn new(name: &str, public: VerifyingKey) -> Result<Self, NoteError> {
        check_key_name(name)?;
        Ok(Self { name: name.to_owned(), id: key_id(name, &public), public })
    }

    /// Parses `name+hex8(id)+base64(0x01 || public key)`; the id must match.
    pub fn parse(s: &str) -> Result<Self, NoteError> {
        let (name, stated, key) = split_key(s)?;
        let bytes: [u8; 32] = key.try_into().map_err(|_| NoteError::KeyType)?;
        let public = VerifyingKey::from_bytes(&bytes).map_err(|_| NoteError::BadPublicKey)?;
        let computed = key_id(name, &public);
        if stated != computed {
            return Err(NoteError::KeyIdMismatch { stated, computed });
        }
        Ok(Self { name: name.to_owned(), id: computed, public })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn public_key(&self) -> &VerifyingKey {
        &self.public
    }

    /// Verifies an Ed25519 signature over `msg` (strict: no small-order keys,
    /// canonical encodings only).
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(sig) = ed25519_dalek::Signature::from_slice(sig) else { return false };
        self.public.verify_strict(msg, &sig).is_ok()
    }
}

impl fmt::Display for VerifierKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut key = vec![ED25519_TYPE];
        key.extend_from_slice(self.public.as_bytes());
        write!(f, "{}+{:08x}+{}", self.name, self.id, STANDARD.encode(key))
    }
}

impl fmt::Debug for VerifierKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifierKey({self})")
    }
}

/// Anything that can sign notes: a local Ed25519 key now, a KMS key later.
pub trait NoteSigner: Send + Sync {
    fn key_name(&self) -> &str;
    fn key_id(&self) -> u32;
    /// Signs `msg`, returning the raw signature (64 bytes for Ed25519).
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, NoteError>;
    /// The public key that verifies this signer's signatures.
    fn verifier(&self) -> VerifierKey;
}

/// A private Ed25519 note key held in memory.
pub struct SignerKey {
    name: String,
    id: u32,
    key: SigningKey,
}

impl SignerKey {
    /// A fresh key from the operating system's random source.
    pub fn generate(name: &str) -> Result<Self, NoteError> {
        check_key_name(name)?;
        let mut rng = rand_core::UnwrapErr(getrandom::SysRng);
        let key = SigningKey::generate(&mut rng);
        Ok(Self::from_signing_key(name, key))
    }

    fn from_signing_key(name: &str, key: SigningKey) -> Self {
        Self { name: name.to_owned(), id: key_id(name, &key.verifying_key()), key }
    }

    /// A key from its 32-byte Ed25519 seed.
    pub fn from_seed(name: &str, seed: &[u8; 32]) -> Result<Self, NoteError> {
        check_key_name(name)?;
        Ok(Self::from_signing_key(name, SigningKey::from_bytes(seed)))
    }

    /// Parses `PRIVATE+KEY+name+hex8(id)+base64(0x01 || seed)`; the id must match.
    pub fn parse(s: &str) -> Result<Self, NoteError> {
        let rest = s.strip_prefix(SIGNER_PREFIX).ok_or(NoteError::KeyShape)?;
        let (name, stated, seed) = split_key(rest)?;
        let seed: [u8; 32] = seed.try_into().map_err(|_| NoteError::KeyType)?;
        let k = Self::from_seed(name, &seed)?;
        if stated != k.id {
            return Err(NoteError::KeyIdMismatch { stated, computed: k.id });
        }
        Ok(k)
    }

    /// The public half.
    pub fn verifier(&self) -> VerifierKey {
        VerifierKey { name: self.name.clone(), id: self.id, public: self.key.verifying_key() }
    }

    /// The secret key string (keep it secret).
    pub fn to_secret_string(&self) -> String {
        let mut key = vec![ED25519_TYPE];
        key.extend_from_slice(self.key.as_bytes());
        format!("{SIGNER_PREFIX}{}+{:08x}+{}", self.name, self.id, STANDARD.encode(key))
    }
}

impl fmt::Debug for SignerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SignerKey({}+{:08x}, secret redacted)", self.name, self.id)
    }
}

impl NoteSigner for SignerKey {
    fn key_name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, NoteError> {
        Ok(self.key.sign(msg).to_bytes().to_vec())
    }
    fn verifier(&self) -> VerifierKey {
        SignerKey::verifier(self)
    }
}

/// Signs with a key held elsewhere (a KMS Ed25519 key): `sign` returns the raw signature.
/// Every signature is verified with the known public key before it is used, so a wrong key
/// or a wrong algorithm fails at once instead of producing checkpoints nobody can verify.
pub struct RemoteSigner {
    verifier: VerifierKey,
    sign: SignFn,
}

/// The remote signing call: message in, raw signature (or what went wrong) out.
pub type SignFn = Box<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

impl RemoteSigner {
    /// `public` is the Ed25519 public key of the remote key (KMS `GetPublicKey`).
    pub fn new(
        name: &str,
        public: &[u8; 32],
        sign: SignFn,
    ) -> Result<Self, NoteError> {
        let public = VerifyingKey::from_bytes(public).map_err(|_| NoteError::BadPublicKey)?;
        Ok(Self { verifier: VerifierKey::new(name, public)?, sign })
    }
}

impl fmt::Debug for RemoteSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteSigner({})", self.verifier)
    }
}

impl NoteSigner for RemoteSigner {
    fn key_name(&self) -> &str {
        self.verifier.name()
    }
    fn key_id(&self) -> u32 {
        self.verifier.id()
    }
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, NoteError> {
        let signature = (self.sign)(msg).map_err(NoteError::Signer)?;
        if !self.verifier.verify(msg, &signature) {
            return Err(NoteError::Signer(format!("the remote key's signature does not verify under {}", self.verifier)));
        }
        Ok(signature)
    }
    fn verifier(&self) -> VerifierKey {
        self.verifier.clone()
    }
}

/// One signature line of a note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteSignature {
    pub name: String,
    pub id: u32,
    /// The signature proper, without the 4-byte key id.
    pub signature: Vec<u8>,
}

/// A structurally valid, *unverified* note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The signed text, final newline included.
    pub text: String,
    pub signatures: Vec<NoteSignature>,
}

fn check_text_chars(s: &str, base: usize) -> Result<(), NoteError> {
    match s.bytes().enumerate().find(|&(_, b)| b < 0x20 && b != b'\n') {
        Some((offset, byte)) => Err(NoteError::ControlCharacter { byte, offset: base + offset }),
        None => Ok(()),
    }
}

/// Checks that `text` can be the text of a note.
pub fn check_text(text: &str) -> Result<(), NoteError> {
    if text.len() > MAX_NOTE_SIZE {
        return Err(NoteError::TooLarge { size: text.len(), max: MAX_NOTE_SIZE });
    }
    check_text_chars(text, 0)?;
    if !text.ends_with('\n') {
        return Err(NoteError::NoFinalNewline);
    }
    Ok(())
}

impl Note {
    /// Parses a note's structure without verifying anything.
    pub fn parse(bytes: &[u8]) -> Result<Self, NoteError> {
        if bytes.len() > MAX_NOTE_SIZE {
            return Err(NoteError::TooLarge { size: bytes.len(), max: MAX_NOTE_SIZE });
        }
        let s = std::str::from_utf8(bytes).map_err(|_| NoteError::NotUtf8)?;
        check_text_chars(s, 0)?;
        if !s.ends_with('\n') {
            return Err(NoteError::NoFinalNewline);
        }
        // The text is separated from the signatures by the last blank line.
        let split = s.rfind("\n\n").ok_or(NoteError::NoSignatureBlock)?;
        let (text, sigs) = (&s[..split + 1], &s[split + 2..]);
        if sigs.is_empty() {
            return Err(NoteError::NoSignatures);
        }
        let mut signatures = Vec::new();
        for (n, line) in sigs.strip_suffix('\n').unwrap_or(sigs).split('\n').enumerate() {
            let line_no = n + 1;
            if signatures.len() == MAX_SIGNATURES {
                return Err(NoteError::TooManySignatures { max: MAX_SIGNATURES });
            }
            let rest = line.strip_prefix(SIG_PREFIX).ok_or(NoteError::SignatureLinePrefix { line: line_no })?;
            let (name, b64) = rest.split_once(' ').ok_or(NoteError::SignatureLineShape { line: line_no })?;
            if check_key_name(name).is_err() || b64.is_empty() || b64.contains(' ') {
                return Err(NoteError::SignatureLineShape { line: line_no });
            }
            let raw = STANDARD.decode(b64).map_err(|_| NoteError::SignatureBase64 { line: line_no })?;
            if raw.len() < 5 {
                return Err(NoteError::SignatureTooShort { line: line_no });
            }
            signatures.push(NoteSignature {
                name: name.to_owned(),
                id: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
                signature: raw[4..].to_vec(),
            });
        }
        Ok(Self { text: text.to_owned(), signatures })
    }

    /// Verifies the note against the trusted keys. Signatures from unknown
    /// keys (name or id differ) are ignored; a failing signature from a known
    /// key rejects the note; at least one known key must have signed.
    /// Returns the keys that verified.
    pub fn verify(&self, trusted: &[VerifierKey]) -> Result<Vec<VerifierKey>, NoteError> {
        let mut verified: Vec<VerifierKey> = Vec::new();
        for sig in &self.signatures {
            let Some(key) = trusted.iter().find(|k| k.name == sig.name && k.id == sig.id) else {
                continue;
            };
            if !key.verify(self.text.as_bytes(), &sig.signature) {
                return Err(NoteError::BadSignature { name: sig.name.clone(), id: sig.id });
            }
            if !verified.contains(key) {
                verified.push(key.clone());
            }
        }
        if verified.is_empty() {
            return Err(NoteError::NoKnownSignature);
        }
        Ok(verified)
    }
}

/// Parses and verifies a note, returning its text.
pub fn open(note: &[u8], trusted: &[VerifierKey]) -> Result<String, NoteError> {
    let note = Note::parse(note)?;
    note.verify(trusted)?;
    Ok(note.text)
}

/// Signs `text` with each signer, producing the full note.
pub fn sign(text: &str, signers: &[&dyn NoteSigner]) -> Result<String, NoteError> {
    check_text(text)?;
    if signers.is_empty() {
        return Err(NoteError::NoSignatures);
    }
    let mut out = String::with_capacity(text.len() + 1 + signers.len() * 110);
    out.push_str(text);
    out.push('\n');
    for s in signers {
        check_key_name(s.key_name())?;
        let mut raw = s.key_id().to_be_bytes().to_vec();
        raw.extend_from_slice(&s.sign(text.as_bytes())?);
        out.push_str(SIG_PREFIX);
        out.push_str(s.key_name());
        out.push(' ');
        out.push_str(&STANDARD.encode(raw));
        out.push('\n');
    }
    if out.len() > MAX_NOTE_SIZE {
        return Err(NoteError::TooLarge { size: out.len(), max: MAX_NOTE_SIZE });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn remote_signatures_are_checked_before_use() {
        let local = SignerKey::from_seed("ledger.example/remote", &[3; 32]).unwrap();
        let public = local.verifier().public_key().to_bytes();
        let good = RemoteSigner::new("ledger.example/remote", &public, Box::new(move |m| Ok(local.sign(m).unwrap()))).unwrap();
        assert_eq!(good.key_id(), key_id("ledger.example/remote", good.verifier().public_key()));
        let signed = sign("text\n", &[&good]).unwrap();
        open(signed.as_bytes(), &[good.verifier()]).unwrap();

        let other = SignerKey::from_seed("x", &[4; 32]).unwrap();
        let wrong = RemoteSigner::new("ledger.example/remote", &public, Box::new(move |m| Ok(other.sign(m).unwrap()))).unwrap();
        assert!(matches!(wrong.sign(b"m"), Err(NoteError::Signer(_))));
        let failing = RemoteSigner::new("ledger.example/remote", &public, Box::new(|_| Err("throttled".into()))).unwrap();
        assert_eq!(failing.sign(b"m"), Err(NoteError::Signer("throttled".into())));
    }

    use super::*;
    use crate::merkle::fixtures;

    struct Vector {
        vkey: String,
        skey: Option<String>,
        text: Option<String>,
        note: String,
        valid: bool,
    }

    fn vectors() -> Vec<Vector> {
        let v = fixtures::load("merkle/signed_note_vectors.json");
        v["vectors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| Vector {
                vkey: x["vkey"].as_str().unwrap().to_owned(),
                skey: x["skey"].as_str().map(str::to_owned),
                text: x["text"].as_str().map(str::to_owned),
                note: x["note"].as_str().unwrap().to_owned(),
                valid: x["expect"].as_str().unwrap() == "valid",
            })
            .collect()
    }

    #[test]
    fn signed_note_fixture_vectors() {
        let vs = vectors();
        assert_eq!(vs.len(), 3);
        for v in &vs {
            let key = VerifierKey::parse(&v.vkey).unwrap();
            assert_eq!(key.to_string(), v.vkey, "verifier key round trip");
            let r = open(v.note.as_bytes(), std::slice::from_ref(&key));
            assert_eq!(r.is_ok(), v.valid, "{:?}: {r:?}", v.vkey);
            if let (Ok(text), Some(want)) = (&r, &v.text) {
                assert_eq!(text, want);
            }
            if !v.valid {
                assert!(matches!(r, Err(NoteError::BadSignature { .. })));
            }
            if let (Some(skey), Some(text)) = (&v.skey, &v.text) {
                let signer = SignerKey::parse(skey).unwrap();
                assert_eq!(signer.to_secret_string(), *skey);
                assert_eq!(signer.verifier(), key);
                // Ed25519 is deterministic: byte-for-byte the same note.
                assert_eq!(sign(text, &[&signer]).unwrap(), v.note);
            }
        }
    }

    #[test]
    fn key_id_known_answer() {
        let k = VerifierKey::parse("example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k").unwrap();
        assert_eq!(k.id(), 0x530d903a);
        assert_eq!(key_id("example.com/foo", k.public_key()), 0x530d903a);
        assert_eq!(
            VerifierKey::parse("example.com/foo+530d903b+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"),
            Err(NoteError::KeyIdMismatch { stated: 0x530d903b, computed: 0x530d903a })
        );
        assert_eq!(
            VerifierKey::parse("example.com/foo+530D903A+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"),
            Err(NoteError::KeyIdHex)
        );
    }

    #[test]
    fn unknown_keys_are_ignored_known_failures_reject() {
        let a = SignerKey::from_seed("a.example/log", &[1; 32]).unwrap();
        let b = SignerKey::from_seed("b.example/witness", &[2; 32]).unwrap();
        let note = sign("hello\n", &[&a, &b]).unwrap();
        assert!(open(note.as_bytes(), &[a.verifier()]).is_ok());
        assert!(open(note.as_bytes(), &[b.verifier()]).is_ok());
        let c = SignerKey::from_seed("c.example", &[3; 32]).unwrap();
        assert_eq!(open(note.as_bytes(), &[c.verifier()]), Err(NoteError::NoKnownSignature));
        // Same name, other key: the id differs, so it is an unknown key.
        let a2 = SignerKey::from_seed("a.example/log", &[9; 32]).unwrap();
        assert_eq!(open(note.as_bytes(), &[a2.verifier()]), Err(NoteError::NoKnownSignature));
        // A known key whose signature fails rejects the note even if another verifies.
        let tampered = note.replace("hello", "hellO");
        assert!(matches!(
            open(tampered.as_bytes(), &[a.verifier(), b.verifier()]),
            Err(NoteError::BadSignature { .. })
        ));
    }

    #[test]
    fn strict_parsing_names_the_problem() {
        let k = SignerKey::from_seed("k", &[7; 32]).unwrap();
        let good = sign("a\n\nb\n", &[&k]).unwrap();
        assert_eq!(open(good.as_bytes(), &[k.verifier()]).unwrap(), "a\n\nb\n");
        let sig_line = good.rsplit_once("\n\n").unwrap().1;
        let cases: Vec<(Vec<u8>, NoteError)> = vec![
            (b"a\n".to_vec(), NoteError::NoSignatureBlock),
            (b"a\n\n".to_vec(), NoteError::NoSignatures),
            (good.trim_end().as_bytes().to_vec(), NoteError::NoFinalNewline),
            (good.replace('\u{2014}', "-").into_bytes(), NoteError::SignatureLinePrefix { line: 1 }),
            (good.replace("\n\n\u{2014}", "\r\n\n\u{2014}").into_bytes(), NoteError::ControlCharacter { byte: 13, offset: 4 }),
            (format!("a\n\n{}", sig_line.replace(' ', "  ")).into_bytes(), NoteError::SignatureLineShape { line: 1 }),
            (format!("a\n\n{}", sig_line.replace('=', "")).into_bytes(), NoteError::SignatureBase64 { line: 1 }),
            (b"a\n\n\xe2\x80\x94 k AAAA\n".to_vec(), NoteError::SignatureTooShort { line: 1 }),
            (b"a\n\n\xe2\x80\x94 k+x AAAAAAA=\n".to_vec(), NoteError::SignatureLineShape { line: 1 }),
            (b"\xff\n\n".to_vec(), NoteError::NotUtf8),
            (vec![b'a'; MAX_NOTE_SIZE + 1], NoteError::TooLarge { size: MAX_NOTE_SIZE + 1, max: MAX_NOTE_SIZE }),
        ];
        for (input, want) in cases {
            assert_eq!(open(&input, &[k.verifier()]), Err(want), "{:?}", String::from_utf8_lossy(&input));
        }
        let many = format!("a\n\n{}", sig_line.repeat(MAX_SIGNATURES + 1));
        assert_eq!(Note::parse(many.as_bytes()), Err(NoteError::TooManySignatures { max: MAX_SIGNATURES }));
        let sixteen = format!("a\n\n{}", sig_line.repeat(16));
        assert_eq!(Note::parse(sixteen.as_bytes()).unwrap().signatures.len(), 16);
        assert_eq!(sign("no newline", &[&k]), Err(NoteError::NoFinalNewline));
        assert!(SignerKey::generate("has space").is_err());
        assert!(SignerKey::generate("plus+sign").is_err());
    }

    #[test]
    fn generated_keys_round_trip() {
        let k = SignerKey::generate("ledger.example/receipts").unwrap();
        let again = SignerKey::parse(&k.to_secret_string()).unwrap();
        assert_eq!(again.verifier(), k.verifier());
        assert_eq!(VerifierKey::parse(&k.verifier().to_string()).unwrap(), k.verifier());
        assert!(!format!("{k:?}").contains(&k.to_secret_string()[20..]));
    }

    #[test]
    fn parser_never_panics_on_mutations() {
        let k = SignerKey::from_seed("k", &[7; 32]).unwrap();
        let good = sign("origin\n5\nAAAA\n", &[&k]).unwrap().into_bytes();
        // Every single-byte truncation, deletion and substitution.
        for i in 0..good.len() {
            let _ = Note::parse(&good[..i]);
            let mut d = good.clone();
            d.remove(i);
            let _ = open(&d, &[k.verifier()]);
            for b in [0u8, b'\n', b' ', 0x80, 0xe2, b'+', b'='] {
                let mut m = good.clone();
                m[i] = b;
                let _ = open(&m, &[k.verifier()]);
            }
        }
    }
}
