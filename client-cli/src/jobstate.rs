//! What the client remembers about a job it submitted (`$EPHEM_HOME/client/jobs/<id>/`): the
//! hashes it will hold the receipt to, and the commitment key (secret: it lets its holder test
//! guesses of the plaintext against the receipt's commitment, so it stays on the client, 0600).

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::home::{create_private_dir, read_private, write_private, Home};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientJob {
    pub job_id: String,
    pub submitted_ms: u64,
    pub input_file: String,
    /// `plain` or `openai`; `None` when no line was accepted.
    pub form: Option<String>,
    pub model_id: String,
    pub manifest_key: String,
    /// Hex SHA-256 of the signed manifest the job names.
    pub manifest_hash: String,
    pub epoch: u64,
    pub fleet_key_id: String,
    pub result_key_id: String,
    /// Hex SHA-256 of the attestation document the client trusted when it sealed.
    pub attestation_sha256: String,
    pub development: bool,
    pub records: u64,
    pub local_errors: u64,
    /// Hex SHA-256 of the sealed object, byte for byte (the receipt's `input_sha256`).
    pub sealed_sha256: String,
    pub sealed_size: u64,
    /// Hex SHA-256 of the plaintext record stream (for the plaintext commitment).
    pub plaintext_sha256: String,
    pub truncate: bool,
    pub normalize: bool,
    pub dtype: String,
    pub precision: String,
    /// Hex [`IdsDigest`] of the record ids sealed, in order (`None`: submitted by a client that
    /// kept none, so `record_ids` cannot pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids_sha256: Option<String>,
    /// Set once the results were downloaded and opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloaded: Option<Downloaded>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downloaded {
    /// The attempt the opened output's authenticated header names.
    pub attempt: u64,
    /// Hex SHA-256 of the sealed output (the receipt's `output_sha256`).
    pub sealed_sha256: String,
    /// Hex SHA-256 of the plaintext output record stream.
    pub plaintext_sha256: String,
    pub records_ok: u64,
    pub records_failed: u64,
    /// Hex [`IdsDigest`] of the output records' ids, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids_sha256: Option<String>,
}

/// SHA-256 over record ids in order, each as its length (u64 big-endian) then its UTF-8 bytes:
/// the length prefix keeps `["ab", "c"]` and `["a", "bc"]` apart.
#[derive(Clone, Default)]
pub struct IdsDigest(Sha256);

impl IdsDigest {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, id: &str) {
        self.0.update((id.len() as u64).to_be_bytes());
        self.0.update(id.as_bytes());
    }

    /// Hex, as the job state keeps it.
    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

pub struct JobFiles {
    dir: PathBuf,
}

impl JobFiles {
    pub fn new(home: &Home, job_id: &str) -> Self {
        Self { dir: home.job_dir(job_id) }
    }

    pub fn local_errors(&self) -> PathBuf {
        self.dir.join("local-errors.jsonl")
    }

    fn state(&self) -> PathBuf {
        self.dir.join("job.json")
    }

    fn commitment_key_file(&self) -> PathBuf {
        self.dir.join("commitment.key")
    }

    pub fn create_dir(&self) -> anyhow::Result<()> {
        create_private_dir(&self.dir)
    }

    pub fn save(&self, job: &ClientJob) -> anyhow::Result<()> {
        self.create_dir()?;
        let tmp = self.state().with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(job)?).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.state()).with_context(|| format!("writing {}", self.state().display()))
    }

    pub fn load(&self) -> anyhow::Result<ClientJob> {
        let bytes = std::fs::read(self.state()).map_err(|_| {
            anyhow!("this client has no record of the job (not submitted from this $EPHEM_HOME): {}", self.dir.display())
        })?;
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", self.state().display()))
    }

    pub fn save_commitment_key(&self, key: &[u8; 32]) -> anyhow::Result<()> {
        write_private(&self.commitment_key_file(), hex::encode(key).as_bytes())
    }

    pub fn commitment_key(&self) -> anyhow::Result<Zeroizing<[u8; 32]>> {
        let bytes = read_private(&self.commitment_key_file()).context("reading the job's commitment key")?;
        let mut key = Zeroizing::new([0u8; 32]);
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| hex::decode_to_slice(text.trim(), key.as_mut()).ok())
            .ok_or_else(|| anyhow!("the job's commitment key is not 32 hex bytes"))?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::IdsDigest;

    fn digest(ids: &[&str]) -> String {
        let mut d = IdsDigest::new();
        ids.iter().for_each(|id| d.push(id));
        d.finish()
    }

    #[test]
    fn ids_digest_keeps_order_and_boundaries() {
        assert_eq!(digest(&["a", "b"]), digest(&["a", "b"]));
        assert_ne!(digest(&["a", "b"]), digest(&["b", "a"]), "order");
        assert_ne!(digest(&["ab", "c"]), digest(&["a", "bc"]), "boundaries");
        assert_ne!(digest(&["a", ""]), digest(&["a"]), "an empty id counts");
        // SHA-256 of u64 BE 1 ‖ "a": pins the encoding submit and results share.
        let expected = <sha2::Sha256 as sha2::Digest>::digest([0, 0, 0, 0, 0, 0, 0, 1, b'a']);
        assert_eq!(digest(&["a"]), hex::encode(expected));
    }
}
