//! What this client has accepted about each fleet KMS key: the digest of the key evidence a
//! verified genesis carried (trust on first use). A key policy can never change and a key never
//! gains grants once checked, so a different answer for the same ARN means someone lies about
//! the key: it is refused by name (`fleet_key_evidence_changed`) until `ephem-batch fleet
//! check-key --recheck` forgets what was remembered.

use std::collections::BTreeMap;
use std::path::PathBuf;

use protocol::kms_arn::KmsKeyArn;
use serde::{Deserialize, Serialize};

use crate::home::{self, Home};

/// The file, in the client's home.
const FILE: &str = "fleet-keys-seen.json";

#[derive(Debug, thiserror::Error)]
pub enum KeyMemoryError {
    #[error(
        "fleet_key_evidence_changed: fleet KMS key {arn} was accepted with key evidence {remembered}, \
         and a genesis now shows {now}: a key's policy and grants never change; \
         run `ephem-batch fleet check-key --recheck` after finding out why"
    )]
    Changed { arn: String, remembered: String, now: String },
    #[error("remembered fleet keys ({path}): {message}")]
    File { path: String, message: String },
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Remembered {
    keys: BTreeMap<String, Seen>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seen {
    evidence_sha256: String,
    first_seen_ms: u64,
}

/// The per-ARN memory of one client home.
#[derive(Debug, Clone)]
pub struct KeyMemory {
    path: PathBuf,
}

impl KeyMemory {
    pub fn of(home: &Home) -> KeyMemory {
        KeyMemory { path: home.root().join(FILE) }
    }

    /// Accepts `digest` for `arn`: remembered on first sight, compared afterwards.
    pub fn accept(&self, arn: &KmsKeyArn, digest: &[u8; 32], now_ms: u64) -> Result<(), KeyMemoryError> {
        let mut remembered = self.read()?;
        let now = hex::encode(digest);
        match remembered.keys.get(arn.as_str()) {
            Some(seen) if seen.evidence_sha256 == now => Ok(()),
            Some(seen) => Err(KeyMemoryError::Changed { arn: arn.to_string(), remembered: seen.evidence_sha256.clone(), now }),
            None => {
                remembered.keys.insert(arn.to_string(), Seen { evidence_sha256: now, first_seen_ms: now_ms });
                self.write(&remembered)
            }
        }
    }

    /// Forgets `arn`; `true` if it was remembered.
    pub fn forget(&self, arn: &KmsKeyArn) -> Result<bool, KeyMemoryError> {
        let mut remembered = self.read()?;
        let forgotten = remembered.keys.remove(arn.as_str()).is_some();
        if forgotten {
            self.write(&remembered)?;
        }
        Ok(forgotten)
    }

    fn read(&self) -> Result<Remembered, KeyMemoryError> {
        match home::read_private(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| self.error(e)),
            Err(error) if error.is_not_found() => Ok(Remembered::default()),
            Err(error) => Err(self.error(error)),
        }
    }

    fn write(&self, remembered: &Remembered) -> Result<(), KeyMemoryError> {
        let text = serde_json::to_vec_pretty(remembered).map_err(|e| self.error(e))?;
        home::write_private(&self.path, &text).map_err(|e| self.error(format!("{e:#}")))
    }

    fn error(&self, message: impl std::fmt::Display) -> KeyMemoryError {
        KeyMemoryError::File { path: self.path.display().to_string(), message: message.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_answer_for_the_same_key_is_refused_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let memory = KeyMemory::of(&Home::resolve(Some(dir.path())).unwrap());
        let arn: KmsKeyArn = "arn:aws:kms:eu-west-1:123456789012:key/k".parse().unwrap();
        let other: KmsKeyArn = "arn:aws:kms:eu-west-1:123456789012:key/l".parse().unwrap();
        memory.accept(&arn, &[1; 32], 5).unwrap();
        memory.accept(&arn, &[1; 32], 6).unwrap();
        memory.accept(&other, &[2; 32], 6).unwrap();
        let error = memory.accept(&arn, &[2; 32], 7).unwrap_err();
        assert!(error.to_string().starts_with("fleet_key_evidence_changed: "), "{error}");
        assert!(memory.forget(&arn).unwrap());
        assert!(!memory.forget(&arn).unwrap());
        memory.accept(&arn, &[2; 32], 8).unwrap();
    }
}
