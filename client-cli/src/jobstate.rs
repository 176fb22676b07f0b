//! What the client remembers about a job it submitted (`$EPHEM_HOME/client/jobs/<id>/`): the
//! hashes it will hold the receipt to, and the commitment key (secret: it lets its holder test
//! guesses of the plaintext against the receipt's commitment, so it stays on the client, 0600).

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::home::{write_private, Home};

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
    /// Set once the results were downloaded and opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloaded: Option<Downloaded>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downloaded {
    pub attempt: u64,
    /// Hex SHA-256 of the sealed output (the receipt's `output_sha256`).
    pub sealed_sha256: String,
    /// Hex SHA-256 of the plaintext output record stream.
    pub plaintext_sha256: String,
    pub records_ok: u64,
    pub records_failed: u64,
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
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))
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
        let text = Zeroizing::new(std::fs::read_to_string(self.commitment_key_file()).context("reading the job's commitment key")?);
        let mut key = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text.trim(), key.as_mut()).map_err(|_| anyhow!("the job's commitment key is not 32 hex bytes"))?;
        Ok(key)
    }
}
