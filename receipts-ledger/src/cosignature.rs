//! C2SP tlog-cosignature, Ed25519 `cosignature/v1` (c2sp.org/tlog-cosignature): a witness's
//! timestamped signature on a checkpoint, carried as one more signature line of its note.
//!
//! ```text
//! signed message: "cosignature/v1\ntime <T>\n" || checkpoint note text
//! key id:         SHA-256(name || 0x0A || 0x04 || 32-byte public key)[:4]
//! signature line: — <name> base64(key id || u64 big-endian T || 64-byte Ed25519 signature)
//! verifier key:   name+hex8(key id)+base64(0x04 || public key)
//! ```
//!
//! A [`WitnessPolicy`] is what a client trusts: witness keys and how many must have cosigned.

use base64::{engine::general_purpose::STANDARD, Engine};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use std::fmt;

use crate::note::{check_key_name, Note, NoteError};

/// Signature type byte of Ed25519 cosignature/v1 keys.
pub const COSIGNATURE_V1_TYPE: u8 = 0x04;
const SIGNER_PREFIX: &str = "PRIVATE+KEY+";
/// Largest timestamp the spec allows (2^63 - 1).
pub const MAX_TIMESTAMP: u64 = i64::MAX as u64;

/// What is wrong with a cosigner key or a cosignature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CosignatureError {
    #[error(transparent)]
    Note(#[from] NoteError),
    #[error("cosigner key is not name+hex8+base64(0x04 || 32 bytes)")]
    KeyShape,
    #[error("cosigner key id {stated:08x} does not match the computed {computed:08x}")]
    KeyIdMismatch { stated: u32, computed: u32 },
    #[error("cosignature by {name} is {len} bytes, not 8 + 64")]
    Length { name: String, len: usize },
    #[error("cosignature by {name} has timestamp {timestamp}, outside 1..=2^63-1")]
    Timestamp { name: String, timestamp: u64 },
    #[error("cosignature by {name} ({id:08x}) does not verify")]
    BadCosignature { name: String, id: u32 },
}

/// The key id of an Ed25519 cosignature/v1 key.
pub fn cosigner_key_id(name: &str, public: &VerifyingKey) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0x0a, COSIGNATURE_V1_TYPE]);
    h.update(public.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// The message a cosignature/v1 signs: header, time line, then the checkpoint's note text.
pub fn signed_message(checkpoint_text: &str, timestamp: u64) -> Vec<u8> {
    format!("cosignature/v1\ntime {timestamp}\n{checkpoint_text}").into_bytes()
}

fn split_key(s: &str) -> Result<(&str, u32, [u8; 32]), CosignatureError> {
    let mut parts = s.splitn(3, '+');
    let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(CosignatureError::KeyShape);
    };
    check_key_name(name)?;
    if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(CosignatureError::KeyShape);
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| CosignatureError::KeyShape)?;
    let key = STANDARD.decode(key).map_err(|_| CosignatureError::KeyShape)?;
    match key.split_first() {
        Some((&COSIGNATURE_V1_TYPE, rest)) => Ok((name, id, rest.try_into().map_err(|_| CosignatureError::KeyShape)?)),
        _ => Err(CosignatureError::KeyShape),
    }
}

/// A witness's public cosigning key.
#[derive(Clone, PartialEq, Eq)]
pub struct CosignerKey {
    name: String,
    id: u32,
    public: VerifyingKey,
}

impl CosignerKey {
    /// Parses `name+hex8(id)+base64(0x04 || public key)`; the id must match.
    pub fn parse(s: &str) -> Result<Self, CosignatureError> {
        let (name, stated, bytes) = split_key(s.trim())?;
        let public = VerifyingKey::from_bytes(&bytes).map_err(|_| NoteError::BadPublicKey)?;
        let computed = cosigner_key_id(name, &public);
        if stated != computed {
            return Err(CosignatureError::KeyIdMismatch { stated, computed });
        }
        Ok(Self { name: name.to_owned(), id: computed, public })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Checks the raw signature bytes of a line already matched to this key (name and id):
    /// returns the cosignature's timestamp.
    pub fn verify(&self, checkpoint_text: &str, raw: &[u8]) -> Result<u64, CosignatureError> {
        let name = self.name.clone();
        if raw.len() != 8 + 64 {
            return Err(CosignatureError::Length { name, len: raw.len() });
        }
        let (time, sig) = raw.split_at(8);
        let timestamp = u64::from_be_bytes(time.try_into().map_err(|_| CosignatureError::KeyShape)?);
        if timestamp == 0 || timestamp > MAX_TIMESTAMP {
            return Err(CosignatureError::Timestamp { name, timestamp });
        }
        let sig = ed25519_dalek::Signature::from_slice(sig).map_err(|_| CosignatureError::BadCosignature {
            name: name.clone(),
            id: self.id,
        })?;
        self.public
            .verify_strict(&signed_message(checkpoint_text, timestamp), &sig)
            .map_err(|_| CosignatureError::BadCosignature { name, id: self.id })?;
        Ok(timestamp)
    }
}

impl fmt::Display for CosignerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut key = vec![COSIGNATURE_V1_TYPE];
        key.extend_from_slice(self.public.as_bytes());
        write!(f, "{}+{:08x}+{}", self.name, self.id, STANDARD.encode(key))
    }
}

impl fmt::Debug for CosignerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CosignerKey({self})")
    }
}

/// A witness's private cosigning key.
pub struct CosignerSigner {
    name: String,
    id: u32,
    key: SigningKey,
}

impl CosignerSigner {
    pub fn from_seed(name: &str, seed: &[u8; 32]) -> Result<Self, CosignatureError> {
        check_key_name(name)?;
        let key = SigningKey::from_bytes(seed);
        Ok(Self { name: name.to_owned(), id: cosigner_key_id(name, &key.verifying_key()), key })
    }

    /// A fresh key from the operating system's random source.
    pub fn generate(name: &str) -> Result<Self, CosignatureError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| NoteError::Signer(e.to_string()))?;
        Self::from_seed(name, &seed)
    }

    /// Parses `PRIVATE+KEY+name+hex8(id)+base64(0x04 || seed)`; the id must match.
    pub fn parse(s: &str) -> Result<Self, CosignatureError> {
        let rest = s.trim().strip_prefix(SIGNER_PREFIX).ok_or(CosignatureError::KeyShape)?;
        let (name, stated, seed) = split_key(rest)?;
        let k = Self::from_seed(name, &seed)?;
        if stated != k.id {
            return Err(CosignatureError::KeyIdMismatch { stated, computed: k.id });
        }
        Ok(k)
    }

    pub fn to_secret_string(&self) -> String {
        let mut key = vec![COSIGNATURE_V1_TYPE];
        key.extend_from_slice(self.key.as_bytes());
        format!("{SIGNER_PREFIX}{}+{:08x}+{}", self.name, self.id, STANDARD.encode(key))
    }

    pub fn verifier(&self) -> CosignerKey {
        CosignerKey { name: self.name.clone(), id: self.id, public: self.key.verifying_key() }
    }

    /// The signature line (`— name base64(...)\n`) cosigning `checkpoint_text` at `timestamp`.
    pub fn cosign(&self, checkpoint_text: &str, timestamp: u64) -> String {
        let sig = self.key.sign(&signed_message(checkpoint_text, timestamp));
        let mut raw = self.id.to_be_bytes().to_vec();
        raw.extend_from_slice(&timestamp.to_be_bytes());
        raw.extend_from_slice(&sig.to_bytes());
        format!("\u{2014} {} {}\n", self.name, STANDARD.encode(raw))
    }
}

impl fmt::Debug for CosignerSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CosignerSigner({}+{:08x}, secret redacted)", self.name, self.id)
    }
}

/// The witnesses among `keys` whose cosignature on `note` verifies, with their timestamps.
/// Lines of unknown keys are ignored; a known key's failing line refuses the note (as a
/// failing signature of a known key does in a signed note).
pub fn verify_cosignatures(note: &Note, keys: &[CosignerKey]) -> Result<Vec<(CosignerKey, u64)>, CosignatureError> {
    let mut out: Vec<(CosignerKey, u64)> = Vec::new();
    for sig in &note.signatures {
        let Some(key) = keys.iter().find(|k| k.name == sig.name && k.id == sig.id) else { continue };
        let timestamp = key.verify(&note.text, &sig.signature)?;
        if !out.iter().any(|(k, _)| k == key) {
            out.push((key.clone(), timestamp));
        }
    }
    Ok(out)
}

/// Adds signature lines to a note, skipping those it already has. `lines` is what a witness
/// answered (one or more `— …\n` lines); the result must still parse as a note.
pub fn add_signature_lines(note: &str, lines: &str) -> Result<String, NoteError> {
    let mut out = note.to_owned();
    for line in lines.lines().filter(|l| !l.is_empty()) {
        if !out.lines().any(|have| have == line) {
            out.push_str(line);
            out.push('\n');
        }
    }
    Note::parse(out.as_bytes())?;
    Ok(out)
}

/// Why a checkpoint fails a witness policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WitnessPolicyError {
    #[error("witness quorum not met: {have} of the trusted witnesses cosigned ({names}), {need} required")]
    QuorumNotMet { have: usize, need: usize, names: String },
    #[error("witness quorum {need} is more than the {keys} trusted witness key(s)")]
    QuorumTooLarge { need: usize, keys: usize },
    #[error("witness cosignature: {0}")]
    Cosignature(#[from] CosignatureError),
}

/// Trusted witness keys and how many of them must cosign a checkpoint.
#[derive(Clone, Debug, Default)]
pub struct WitnessPolicy {
    pub keys: Vec<CosignerKey>,
    pub quorum: usize,
}

impl WitnessPolicy {
    pub fn new(mut keys: Vec<CosignerKey>, quorum: usize) -> Result<Self, WitnessPolicyError> {
        // One witness given twice is still one witness.
        let mut seen = Vec::new();
        keys.retain(|k| if seen.contains(k) { false } else { seen.push(k.clone()); true });
        if quorum > keys.len() {
            return Err(WitnessPolicyError::QuorumTooLarge { need: quorum, keys: keys.len() });
        }
        Ok(Self { keys, quorum })
    }

    /// Whether the policy asks for anything.
    pub fn is_empty(&self) -> bool {
        self.quorum == 0
    }

    /// Checks a signed checkpoint note (whose log signature the caller verifies): returns the
    /// witnesses that cosigned it.
    pub fn check(&self, signed_note: &[u8]) -> Result<Vec<(CosignerKey, u64)>, WitnessPolicyError> {
        let note = Note::parse(signed_note).map_err(CosignatureError::from)?;
        let cosigned = verify_cosignatures(&note, &self.keys)?;
        if cosigned.len() < self.quorum {
            let names: Vec<&str> = cosigned.iter().map(|(k, _)| k.name()).collect();
            return Err(WitnessPolicyError::QuorumNotMet {
                have: cosigned.len(),
                need: self.quorum,
                names: if names.is_empty() { "none".into() } else { names.join(", ") },
            });
        }
        Ok(cosigned)
    }
}

#[cfg(test)]
mod tests;
