//! What the client remembers about a job it submitted (`$EPHEM_HOME/client/jobs/<id>/`): the
//! hashes it will hold the receipt to, and the commitment key (secret: it lets its holder test
//! guesses of the plaintext against the receipt's commitment, so it stays on the client, 0600).
//! `job.json` is 0600 too, and keeps its digests of the plaintext masked ([`MaskedDigest`]).

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use protocol::envelope::JobId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::home::{create_private_dir, read_own, read_private, write_private, Home};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientJob {
    pub job_id: JobId,
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
    /// Hex SHA-256 of the plaintext record stream (for the plaintext commitment); masked in
    /// job.json.
    pub plaintext_sha256: String,
    pub truncate: bool,
    pub normalize: bool,
    pub dtype: String,
    pub precision: String,
    /// The manifest prompt put before every text (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Matryoshka length asked for (`None`: the model's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// Hex SHA-256 of the `int8`/`uint8` ranges sent (their little-endian bytes, as the receipt
    /// carries them); `None` for the other dtypes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges_sha256: Option<String>,
    /// `"sparse"`, `"scores"` or `"multivector"` for such a job (`None`: dense vectors, as before the field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// A sparse job's `top_k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// A multi-vector job's bound on one record's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_record_bytes: Option<u32>,
    /// Hex [`IdsDigest`] of the record ids sealed, in order (`None`: submitted by a client that
    /// kept none, so `record_ids` cannot pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids_sha256: Option<String>,
    /// When the upload that creates the job was acknowledged. The record is written before
    /// the upload; `None` here: the job may or may not exist (the acknowledgement was lost, or
    /// the upload failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded_ms: Option<u64>,
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

    /// Writes job.json (0600, synced, renamed into place, the directory synced) with every
    /// digest of the plaintext masked ([`MASKED_DIGESTS`]).
    pub fn save(&self, job: &ClientJob) -> anyhow::Result<()> {
        self.create_dir()?;
        let key = self.commitment_key()?;
        let mut value = serde_json::to_value(job)?;
        for field in MASKED_DIGESTS {
            field.mask(&mut value, &key)?;
        }
        write_private(&self.state(), &serde_json::to_vec_pretty(&value)?)
    }

    /// Reads job.json back, unmasking its digests. A record no other account may have written
    /// is read; one written before digests were masked, or readable by others, is rewritten
    /// private and masked on the way.
    pub fn load(&self) -> anyhow::Result<ClientJob> {
        let path = self.state();
        let (bytes, mode) = match read_own(&path, 0o022) {
            Ok(read) => read,
            Err(error) if error.is_not_found() => {
                return Err(anyhow!("this client has no record of the job (not submitted from this $EPHEM_HOME): {}", self.dir.display()));
            }
            Err(error) => return Err(error.into()),
        };
        let mut value: serde_json::Value = serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
        let key = self.commitment_key()?;
        let mut legacy = false;
        for field in MASKED_DIGESTS {
            legacy |= field.unmask(&mut value, &key).with_context(|| format!("reading {}", path.display()))?;
        }
        let job: ClientJob = serde_json::from_value(value).with_context(|| format!("reading {}", path.display()))?;
        if legacy || mode & 0o077 != 0 {
            self.save(&job).with_context(|| format!("rewriting {} private and masked", path.display()))?;
        }
        Ok(job)
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

/// A digest of the plaintext job.json keeps only masked. In the clear, anyone who reads the
/// file (another account, a backup) could confirm a guessed corpus, or guessed record ids, by
/// hashing the guess. The mask is HMAC-SHA256(the job's commitment key, label ‖ field): the key
/// is the job's own 0600 secret, so the client reads its digests back (the receipt's commitment
/// needs the input's digest itself, not a keyed hash of it), and a reader without the key learns
/// nothing of them. The key already lets its holder test guesses against the receipt's
/// commitment, so whoever can unmask could do that anyway.
pub struct MaskedDigest {
    /// `None`: a field of the job; else of this object inside it.
    pub within: Option<&'static str>,
    pub field: &'static str,
}

pub const MASKED_DIGESTS: [MaskedDigest; 4] = [
    MaskedDigest { within: None, field: "plaintext_sha256" },
    MaskedDigest { within: None, field: "ids_sha256" },
    MaskedDigest { within: Some("downloaded"), field: "plaintext_sha256" },
    MaskedDigest { within: Some("downloaded"), field: "ids_sha256" },
];

const MASK_LABEL: &[u8] = b"ephem-batch/v1 client job record mask";

impl MaskedDigest {
    fn masked_name(&self) -> String {
        format!("{}_masked", self.field)
    }

    fn name(&self) -> String {
        match self.within {
            Some(within) => format!("{within}.{}", self.field),
            None => self.field.to_owned(),
        }
    }

    fn pad(&self, key: &[u8; 32]) -> [u8; 32] {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(MASK_LABEL);
        mac.update(&[0]);
        mac.update(self.name().as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn object<'v>(&self, value: &'v mut serde_json::Value) -> Option<&'v mut serde_json::Map<String, serde_json::Value>> {
        let job = value.as_object_mut()?;
        match self.within {
            Some(within) => job.get_mut(within)?.as_object_mut(),
            None => Some(job),
        }
    }

    fn xor(&self, hex_digest: &str, key: &[u8; 32]) -> anyhow::Result<String> {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_digest, &mut digest).map_err(|_| anyhow!("{} is not 32 hex bytes", self.name()))?;
        digest.iter_mut().zip(self.pad(key)).for_each(|(d, p)| *d ^= p);
        Ok(hex::encode(digest))
    }

    /// Replaces the field's digest by its masked form, under `<field>_masked`.
    fn mask(&self, value: &mut serde_json::Value, key: &[u8; 32]) -> anyhow::Result<()> {
        let Some(object) = self.object(value) else { return Ok(()) };
        if let Some(serde_json::Value::String(digest)) = object.remove(self.field) {
            let masked = self.xor(&digest, key)?;
            object.insert(self.masked_name(), masked.into());
        }
        Ok(())
    }

    /// The reverse of [`Self::mask`]. `true`: the record held this digest in the clear.
    fn unmask(&self, value: &mut serde_json::Value, key: &[u8; 32]) -> anyhow::Result<bool> {
        let Some(object) = self.object(value) else { return Ok(false) };
        match object.remove(&self.masked_name()) {
            Some(serde_json::Value::String(masked)) => {
                let digest = self.xor(&masked, key)?;
                object.insert(self.field.to_owned(), digest.into());
                Ok(false)
            }
            Some(_) => Err(anyhow!("{} is not 32 hex bytes", self.masked_name())),
            None => Ok(object.contains_key(self.field)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn job(plain: &str, ids: &str) -> ClientJob {
        ClientJob {
            job_id: JobId([0xab; 16]),
            submitted_ms: 1,
            input_file: "corpus.jsonl".into(),
            form: None,
            model_id: "m".into(),
            manifest_key: "models/m/v1/manifest.cose".into(),
            manifest_hash: "11".repeat(32),
            epoch: 1,
            fleet_key_id: "22".repeat(32),
            result_key_id: "33".repeat(32),
            attestation_sha256: "44".repeat(32),
            development: true,
            records: 2,
            local_errors: 0,
            sealed_sha256: "55".repeat(32),
            sealed_size: 10,
            plaintext_sha256: plain.into(),
            truncate: true,
            normalize: true,
            dtype: "f32".into(),
            precision: "fp32".into(),
            prompt: None,
            dimensions: None,
            ranges_sha256: None,
            output: None,
            top_k: None,
            max_record_bytes: None,
            ids_sha256: Some(ids.into()),
            uploaded_ms: Some(2),
            downloaded: None,
        }
    }

    #[test]
    fn a_record_from_before_masking_is_read_and_rewritten_private_and_masked() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(dir.path())).unwrap();
        let files = JobFiles::new(&home, &"ab".repeat(16));
        files.save_commitment_key(&[9; 32]).unwrap();
        let (plain, ids) = ("66".repeat(32), "77".repeat(32));
        let legacy = job(&plain, &ids);
        // As an older client wrote it: digests in the clear, mode 0644.
        let path = home.job_dir(&legacy.job_id.to_hex()).join("job.json");
        std::fs::write(&path, serde_json::to_vec(&legacy).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

        assert_eq!(files.load().unwrap(), legacy);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&plain) && !text.contains(&ids), "{text}");
        assert!(text.contains("plaintext_sha256_masked") && text.contains("ids_sha256_masked"), "{text}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(files.load().unwrap(), legacy, "masked, it reads back the same");

        // Another account may not have written it: group-writable is refused, by name.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
        let error = format!("{:#}", files.load().expect_err("refused"));
        assert!(error.contains("mode 664") && error.contains("job.json"), "{error}");
    }

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
