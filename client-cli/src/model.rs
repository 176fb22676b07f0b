//! Onboarding a model (DESIGN.md §7): encrypt a model directory, sign its manifest, upload
//! both, verify what was published. `ephem-batch model encrypt|sign|upload|verify` are one call
//! each; [`publish`] does all of it in one go (`ephem-batch dev up`).
//!
//! A model directory holds `config.json` (`hidden_size` → dimensions, `max_position_embeddings`
//! caps the sequence length), `tokenizer.json` and `model.safetensors`, and optionally
//! `sentence_bert_config.json` (`max_seq_length`, default 256 tokens) and `1_Pooling/config.json`
//! (mean or CLS pooling, default mean). Vectors are always L2-normalised.
//!
//! The data key (32 random bytes) is made here and wrapped with KMS `Encrypt` under the
//! encryption context `{"model_id": <id>, "version": "<decimal>"}`, the context the enclave
//! presents when it asks for the key. The plaintext key never touches the disk.
//!
//! The staging directory that `encrypt`, `sign` and `upload` share:
//!
//! ```text
//! <out>/config.json.sealed        each file sealed with Manifest::file_key / file_stream_id
//! <out>/model.safetensors.sealed
//! <out>/tokenizer.json.sealed
//! <out>/manifest.cbor             the unsigned manifest payload (encrypt)
//! <out>/manifest.cose             the signed manifest (sign)
//! ```
//!
//! In the model store a version lives under `models/<name>/v<version>/` (see
//! [`cloud::layout::model_manifest`]): the sealed files first, then `manifest.cose`, written
//! create-only, so a manifest never names files that are not there and a published version is
//! never replaced — job headers pin a manifest's hash.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use cloud::kms::{EncryptionContext, Kms, KmsError};
use cloud::layout;
use cloud::objects::{ObjectError, ObjectStore, PutCondition};
use ed25519_dalek::{SigningKey, VerifyingKey};
use protocol::envelope::valid_model_id;
use protocol::manifest::{Manifest, ManifestError, ModelFile, Pooling, SignedManifest, manifest_hash};
use protocol::records::MAX_DIMENSIONS;
use protocol::stream::{StreamSealer, sealed_len};
use serde_json::Value;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// The files of a model, in manifest order (sorted by name); the enclave loads exactly these.
pub const MODEL_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];
/// The unsigned manifest payload in a staging directory.
pub const PAYLOAD_FILE: &str = "manifest.cbor";
/// The signed manifest, in a staging directory and in the store.
pub const SIGNED_FILE: &str = layout::MANIFEST_NAME;
/// Sequence length when the directory does not state one.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

const BLOCK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {target}: {source}")]
    Write {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("{}: the model directory has no {name}", dir.display())]
    MissingFile { dir: PathBuf, name: &'static str },
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    #[error("{0:?} is not a valid model id (1 to 128 printable ASCII characters, no spaces)")]
    InvalidModelId(String),
    #[error("{}: the file changed while it was being sealed", path.display())]
    FileChanged { path: PathBuf },
    #[error("the system random source failed: {0}")]
    Random(String),
    #[error("wrapping the model key with KMS key {key_id}: {source}")]
    Kms {
        key_id: String,
        #[source]
        source: KmsError,
    },
    #[error("{}: {source}", path.display())]
    ManifestFile {
        path: PathBuf,
        #[source]
        source: ManifestError,
    },
    #[error("the manifest is refused: {0}")]
    Manifest(#[source] ManifestError),
    #[error("the manifest lists no {0}, which the enclave loads")]
    ManifestLacks(&'static str),
    #[error("{}: {found} bytes, the sealed {name} should have {expected}", path.display())]
    SealedSize { path: PathBuf, name: String, found: u64, expected: u64 },
    #[error("model store: {0}")]
    Object(#[from] ObjectError),
    #[error("{key} already holds another manifest: {model_id} version {version} is published; choose a new version")]
    VersionExists { key: String, model_id: String, version: u64 },
    #[error("the manifest of {model_id} version {version} belongs at {expected}, not {key}")]
    WrongKey { key: String, expected: String, model_id: String, version: u64 },
    #[error("{key} is missing from the model store")]
    MissingObject { key: String },
    #[error("{key} holds {found} bytes, the sealed file should have {expected}")]
    ObjectSize { key: String, found: u64, expected: u64 },
}

/// The encryption context of a model's data key: `{"model_id": <id>, "version": "<decimal>"}`.
pub fn data_key_context(model_id: &str, version: u64) -> EncryptionContext {
    EncryptionContext::from([("model_id".to_owned(), model_id.to_owned()), ("version".to_owned(), version.to_string())])
}

/// `<file>.sealed`: a sealed file's name in a staging directory and in the store.
pub fn sealed_file_name(name: &str) -> String {
    format!("{name}.sealed")
}

/// How the model embeds, as its directory describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSettings {
    pub dimensions: u32,
    pub max_tokens: u32,
    pub pooling: Pooling,
}

fn read_json(path: &Path) -> Result<Option<Value>, ModelError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ModelError::Config { path: path.to_owned(), message: format!("not valid JSON: {e}") }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelError::Io { path: path.to_owned(), source }),
    }
}

/// A positive integer field that fits in u32, if present.
fn positive_field(path: &Path, json: &Value, field: &str) -> Result<Option<u32>, ModelError> {
    match json.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            value.as_u64().filter(|&v| v > 0).and_then(|v| u32::try_from(v).ok()).map(Some).ok_or_else(|| {
                ModelError::Config { path: path.to_owned(), message: format!("\"{field}\" is not a positive integer") }
            })
        }
    }
}

/// Reads dimensions, sequence length and pooling from a model directory.
pub fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config =
        read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let dimensions = positive_field(&config_path, &config, "hidden_size")?
        .ok_or_else(|| ModelError::Config { path: config_path.clone(), message: "no \"hidden_size\"".into() })?;
    if dimensions as usize > MAX_DIMENSIONS {
        return Err(ModelError::Config {
            path: config_path,
            message: format!("\"hidden_size\" {dimensions} exceeds {MAX_DIMENSIONS}"),
        });
    }
    let positions = positive_field(&config_path, &config, "max_position_embeddings")?;

    let sbert_path = dir.join("sentence_bert_config.json");
    let stated = match read_json(&sbert_path)? {
        Some(sbert) => positive_field(&sbert_path, &sbert, "max_seq_length")?,
        None => None,
    };
    // The model cannot take more tokens than it has position embeddings for.
    let max_tokens = stated.unwrap_or(DEFAULT_MAX_TOKENS).min(positions.unwrap_or(u32::MAX));

    let pooling_path = dir.join("1_Pooling").join("config.json");
    let pooling = match read_json(&pooling_path)? {
        None => Pooling::Mean,
        Some(pooling) => {
            let modes: Vec<&str> = pooling
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(key, value)| key.starts_with("pooling_mode_") && value.as_bool() == Some(true))
                .map(|(key, _)| key.as_str())
                .collect();
            match modes.as_slice() {
                ["pooling_mode_mean_tokens"] => Pooling::Mean,
                ["pooling_mode_cls_token"] => Pooling::Cls,
                other => {
                    return Err(ModelError::Config {
                        path: pooling_path,
                        message: format!(
                            "pooling modes {other:?} are not supported (exactly one of mean_tokens, cls_token)"
                        ),
                    });
                }
            }
        }
    };
    Ok(ModelSettings { dimensions, max_tokens, pooling })
}

/// SHA-256 and size of a file, read in blocks.
fn hash_file(path: &Path) -> Result<([u8; 32], u64), ModelError> {
    let io_error = |source| ModelError::Io { path: path.to_owned(), source };
    let mut file = File::open(path).map_err(io_error)?;
    let mut hasher = Sha256::new();
    let mut block = vec![0u8; BLOCK];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut block) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e)),
        };
        hasher.update(&block[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize().into(), size))
}

/// Hashes the files, makes and wraps a data key, and builds the manifest.
fn prepare(
    dir: &Path,
    model_id: &str,
    version: u64,
    kms: &dyn Kms,
    kms_key_id: &str,
) -> Result<(Manifest, Zeroizing<[u8; 32]>), ModelError> {
    if !valid_model_id(model_id) {
        return Err(ModelError::InvalidModelId(model_id.to_owned()));
    }
    let settings = read_settings(dir)?;
    let mut files = Vec::with_capacity(MODEL_FILES.len());
    for name in MODEL_FILES {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(ModelError::MissingFile { dir: dir.to_owned(), name });
        }
        let (sha256, size) = hash_file(&path)?;
        files.push(ModelFile { name: name.to_owned(), sha256, size });
    }
    let mut dek = Zeroizing::new([0u8; 32]);
    getrandom::fill(dek.as_mut()).map_err(|e| ModelError::Random(e.to_string()))?;
    let wrapped_dek = kms
        .encrypt(kms_key_id, dek.as_ref(), &data_key_context(model_id, version))
        .map_err(|source| ModelError::Kms { key_id: kms_key_id.to_owned(), source })?;
    let manifest = Manifest {
        model_id: model_id.to_owned(),
        version,
        files,
        dimensions: settings.dimensions,
        pooling: settings.pooling,
        normalize: true,
        max_tokens: settings.max_tokens,
        kms_key_id: kms_key_id.to_owned(),
        wrapped_dek,
        created_ms: cloud::now_ms(),
    };
    // The payload must pass the checks the enclave applies.
    Manifest::from_payload(&manifest.to_payload()).map_err(ModelError::Manifest)?;
    Ok((manifest, dek))
}

/// Seals one model file into `out` in blocks — the same bytes as [`Manifest::seal_file`], in
/// constant memory — and checks that the file still has the manifest's hash.
fn seal_into(
    manifest: &Manifest,
    dek: &[u8; 32],
    dir: &Path,
    file: &ModelFile,
    out: &mut dyn Write,
    target: &str,
) -> Result<(), ModelError> {
    let path = dir.join(&file.name);
    let io_error = |source| ModelError::Io { path: path.clone(), source };
    let write_error = |source| ModelError::Write { target: target.to_owned(), source };
    let mut input = File::open(&path).map_err(io_error)?;
    let mut sealer = StreamSealer::new(&manifest.file_key(dek, &file.name), manifest.file_stream_id(&file.name));
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut block = Zeroizing::new(vec![0u8; BLOCK]);
    let mut sealed = Vec::with_capacity(BLOCK + BLOCK / 32);
    loop {
        let n = match input.read(&mut block) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e)),
        };
        hasher.update(&block[..n]);
        size += n as u64;
        sealer.push(&block[..n], &mut sealed).map_err(|e| write_error(io::Error::other(e)))?;
        out.write_all(&sealed).map_err(write_error)?;
        sealed.clear();
    }
    sealer.finish(&mut sealed).map_err(|e| write_error(io::Error::other(e)))?;
    out.write_all(&sealed).map_err(write_error)?;
    out.flush().map_err(write_error)?;
    if size != file.size || <[u8; 32]>::from(hasher.finalize()) != file.sha256 {
        return Err(ModelError::FileChanged { path });
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, write: impl FnOnce(&mut File) -> Result<(), ModelError>) -> Result<(), ModelError> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let io_error = |source| ModelError::Io { path: partial.clone(), source };
    let mut file = File::create(&partial).map_err(io_error)?;
    let result = write(&mut file).and_then(|()| file.sync_all().map_err(io_error));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, path).map_err(|source| ModelError::Io { path: path.to_owned(), source })
}

/// `model encrypt`: seals a model directory into `out_dir` (created if needed) and writes the
/// unsigned manifest payload. A signed manifest left there by an earlier run is removed: it no
/// longer matches.
pub fn encrypt(
    dir: &Path,
    model_id: &str,
    version: u64,
    kms: &dyn Kms,
    kms_key_id: &str,
    out_dir: &Path,
) -> Result<Manifest, ModelError> {
    let (manifest, dek) = prepare(dir, model_id, version, kms, kms_key_id)?;
    std::fs::create_dir_all(out_dir).map_err(|source| ModelError::Io { path: out_dir.to_owned(), source })?;
    let stale = out_dir.join(SIGNED_FILE);
    match std::fs::remove_file(&stale) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(ModelError::Io { path: stale, source }),
    }
    for file in &manifest.files {
        let target = out_dir.join(sealed_file_name(&file.name));
        let shown = target.display().to_string();
        write_atomic(&target, |out| {
            let mut out = io::BufWriter::with_capacity(BLOCK, out);
            seal_into(&manifest, &dek, dir, file, &mut out, &shown)
        })?;
    }
    let payload = manifest.to_payload();
    let path = out_dir.join(PAYLOAD_FILE);
    write_atomic(&path, |out| out.write_all(&payload).map_err(|source| ModelError::Io { path: path.clone(), source }))?;
    Ok(manifest)
}

/// A signed manifest and its hash (what job headers pin).
#[derive(Debug, Clone)]
pub struct SignedModel {
    pub manifest: Manifest,
    pub signed: Vec<u8>,
    pub manifest_hash: [u8; 32],
}

/// Checks that every sealed file of `manifest` is in `out_dir` with the sealed size.
fn check_staged(out_dir: &Path, manifest: &Manifest) -> Result<(), ModelError> {
    for file in &manifest.files {
        let path = out_dir.join(sealed_file_name(&file.name));
        let found = std::fs::metadata(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?.len();
        let expected = sealed_len(file.size);
        if found != expected {
            return Err(ModelError::SealedSize { path, name: file.name.clone(), found, expected });
        }
    }
    Ok(())
}

/// `model sign`: signs the manifest payload in `out_dir` and writes `manifest.cose` beside it.
pub fn sign(out_dir: &Path, signing_key: &SigningKey) -> Result<SignedModel, ModelError> {
    let path = out_dir.join(PAYLOAD_FILE);
    let payload = std::fs::read(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
    let manifest = Manifest::from_payload(&payload).map_err(|source| ModelError::ManifestFile { path, source })?;
    check_staged(out_dir, &manifest)?;
    let signed = manifest.sign(signing_key);
    let path = out_dir.join(SIGNED_FILE);
    write_atomic(&path, |out| out.write_all(&signed).map_err(|source| ModelError::Io { path: path.clone(), source }))?;
    Ok(SignedModel { manifest_hash: manifest_hash(&signed), manifest, signed })
}

/// Whether `key` is free for `signed`: `Ok(false)` if it already holds exactly these bytes.
fn claim_version(models: &dyn ObjectStore, key: &str, signed: &[u8], manifest: &Manifest) -> Result<bool, ModelError> {
    let exists = || ModelError::VersionExists {
        key: key.to_owned(),
        model_id: manifest.model_id.clone(),
        version: manifest.version,
    };
    if models.head(key)?.is_none() {
        return Ok(true);
    }
    match models.get(key) {
        Ok(existing) if existing == signed => Ok(false),
        Ok(_) => Err(exists()),
        Err(ObjectError::NotFound { .. }) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Writes the manifest last and create-only; an identical manifest already there is success.
fn commit_manifest(models: &dyn ObjectStore, key: &str, signed: &[u8], manifest: &Manifest) -> Result<(), ModelError> {
    match models.put(key, signed, PutCondition::CreateOnly) {
        Ok(_) => Ok(()),
        // Taken meanwhile: fine if by these very bytes; if it vanished again, try once more.
        Err(ObjectError::AlreadyExists { .. }) => match claim_version(models, key, signed, manifest)? {
            false => Ok(()),
            true => models.put(key, signed, PutCondition::CreateOnly).map(|_| ()).map_err(Into::into),
        },
        Err(e) => Err(e.into()),
    }
}

/// `model upload`: uploads the sealed files of `out_dir`, then its signed manifest, and returns
/// the manifest's key. Uploading the same manifest again is a no-op; another manifest for a
/// published version is refused.
pub fn upload(out_dir: &Path, models: &dyn ObjectStore) -> Result<String, ModelError> {
    let path = out_dir.join(SIGNED_FILE);
    let signed = std::fs::read(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
    let manifest =
        SignedManifest::decode(&signed).map_err(|source| ModelError::ManifestFile { path, source })?.manifest;
    let key = layout::model_manifest(&manifest.model_id, manifest.version);
    if !claim_version(models, &key, &signed, &manifest)? {
        return Ok(key);
    }
    check_staged(out_dir, &manifest)?;
    for file in &manifest.files {
        let path = out_dir.join(sealed_file_name(&file.name));
        let object_key = Manifest::file_object_key(&key, &file.name);
        let mut input = File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let mut writer = models.writer(&object_key, PutCondition::Overwrite)?;
        io::copy(&mut input, &mut writer).map_err(|source| ModelError::Write { target: object_key.clone(), source })?;
        writer.commit()?;
    }
    commit_manifest(models, &key, &signed, &manifest)?;
    Ok(key)
}

/// A manifest whose publisher signature checked out.
#[derive(Debug, Clone)]
pub struct VerifiedModel {
    pub manifest: Manifest,
    pub manifest_hash: [u8; 32],
}

/// `model verify`: checks a signed manifest against the publisher's key and that it names the
/// files the enclave loads. With `uploaded = Some((store, manifest_key))` it also checks that
/// the manifest sits at its version's key and that every sealed file is in the store with the
/// size its plaintext size implies (the enclave checks the hashes as it decrypts).
pub fn verify(
    signed: &[u8],
    publisher: &VerifyingKey,
    uploaded: Option<(&dyn ObjectStore, &str)>,
) -> Result<VerifiedModel, ModelError> {
    let decoded = SignedManifest::decode(signed).map_err(ModelError::Manifest)?;
    let manifest = decoded.verify(publisher).map_err(ModelError::Manifest)?.clone();
    for name in MODEL_FILES {
        if manifest.file(name).is_none() {
            return Err(ModelError::ManifestLacks(name));
        }
    }
    if let Some((store, key)) = uploaded {
        let expected = layout::model_manifest(&manifest.model_id, manifest.version);
        if key != expected {
            return Err(ModelError::WrongKey {
                key: key.to_owned(),
                expected,
                model_id: manifest.model_id.clone(),
                version: manifest.version,
            });
        }
        for file in &manifest.files {
            let object_key = Manifest::file_object_key(key, &file.name);
            let meta = store.head(&object_key)?.ok_or_else(|| ModelError::MissingObject { key: object_key.clone() })?;
            let expected = sealed_len(file.size);
            if meta.size != expected {
                return Err(ModelError::ObjectSize { key: object_key, found: meta.size, expected });
            }
        }
    }
    Ok(VerifiedModel { manifest, manifest_hash: decoded.hash })
}

/// A model version in the store.
#[derive(Debug, Clone)]
pub struct PublishedModel {
    pub manifest_key: String,
    pub manifest_hash: [u8; 32],
    pub manifest: Manifest,
}

/// Encrypts, signs and uploads a model directory in one pass per file, streaming the sealed
/// files straight into the store (no staging directory). Refuses a version already published.
#[allow(clippy::too_many_arguments)]
pub fn publish(
    dir: &Path,
    model_id: &str,
    version: u64,
    kms: &dyn Kms,
    kms_key_id: &str,
    signing_key: &SigningKey,
    models: &dyn ObjectStore,
) -> Result<PublishedModel, ModelError> {
    let manifest_key = layout::model_manifest(model_id, version);
    if models.head(&manifest_key)?.is_some() {
        return Err(ModelError::VersionExists { key: manifest_key, model_id: model_id.to_owned(), version });
    }
    let (manifest, dek) = prepare(dir, model_id, version, kms, kms_key_id)?;
    let signed = manifest.sign(signing_key);
    for file in &manifest.files {
        let object_key = Manifest::file_object_key(&manifest_key, &file.name);
        let mut writer = models.writer(&object_key, PutCondition::Overwrite)?;
        seal_into(&manifest, &dek, dir, file, &mut writer, &object_key)?;
        writer.commit()?;
    }
    commit_manifest(models, &manifest_key, &signed, &manifest)?;
    Ok(PublishedModel { manifest_key, manifest_hash: manifest_hash(&signed), manifest })
}

/// The newest version of `model_id` in the store: the highest `v<version>` with a manifest under
/// the model's prefix. Listing only; [`verify`] the manifest before trusting it.
pub fn latest_manifest(models: &dyn ObjectStore, model_id: &str) -> Result<Option<(String, u64)>, ModelError> {
    // The model's prefix, as the layout spells it: the key of version 0 without "v0/manifest.cose".
    let probe = layout::model_manifest(model_id, 0);
    let prefix = &probe[..probe.len() - format!("v0/{SIGNED_FILE}").len()];
    let latest = models
        .list(prefix)?
        .into_iter()
        .filter_map(|meta| {
            let version = layout::manifest_version(&meta.key)?;
            (layout::model_manifest(model_id, version) == meta.key).then_some((meta.key, version))
        })
        .max_by_key(|(_, version)| *version);
    Ok(latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud::kms::{DataKey, DataKeyPair, Decrypted, Recipient};
    use cloud::objects::{ObjectMeta, ObjectWriter};
    use protocol::stream::StreamOpener;
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Arc, Mutex};

    const KEY: &str = "alias/models";

    /// A wrapped key: (KMS key id, encryption context, plaintext).
    type Wrapped = (String, EncryptionContext, Vec<u8>);

    /// KMS `Encrypt`/`Decrypt` with the context check, in memory.
    #[derive(Default)]
    struct MemKms {
        blobs: Mutex<HashMap<Vec<u8>, Wrapped>>,
    }

    impl Kms for MemKms {
        fn enclave_access(&self) -> Result<cloud::AwsCredentials, KmsError> {
            Err(KmsError::Validation("not in this test".into()))
        }

        fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
            if key_id != KEY {
                return Err(KmsError::NotFound { key_id: key_id.into() });
            }
            let mut blob = vec![0u8; 48];
            getrandom::fill(&mut blob).unwrap();
            self.blobs.lock().unwrap().insert(blob.clone(), (key_id.into(), context.clone(), plaintext.to_vec()));
            Ok(blob)
        }

        fn generate_data_key(
            &self,
            _: &str,
            _: &EncryptionContext,
            _: Option<&Recipient>,
        ) -> Result<DataKey, KmsError> {
            Err(KmsError::Validation("not in this test".into()))
        }

        fn generate_data_key_pair_without_plaintext(
            &self,
            _: &str,
            _: &EncryptionContext,
        ) -> Result<DataKeyPair, KmsError> {
            Err(KmsError::Validation("not in this test".into()))
        }

        fn decrypt(
            &self,
            _: Option<&str>,
            blob: &[u8],
            context: &EncryptionContext,
            _: Option<&Recipient>,
        ) -> Result<Decrypted, KmsError> {
            let blobs = self.blobs.lock().unwrap();
            let (key_id, bound, plaintext) =
                blobs.get(blob).ok_or_else(|| KmsError::InvalidCiphertext("unknown".into()))?;
            if bound != context {
                return Err(KmsError::InvalidCiphertext("context differs".into()));
            }
            Ok(Decrypted {
                key_id: key_id.clone(),
                plaintext: Some(Zeroizing::new(plaintext.clone())),
                ciphertext_for_recipient: None,
            })
        }
    }

    type Objects = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

    #[derive(Default)]
    struct MemStore {
        objects: Objects,
    }

    struct MemWriter {
        objects: Objects,
        key: String,
        bytes: Vec<u8>,
    }

    impl Write for MemWriter {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.bytes.extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn meta(key: &str, bytes: &[u8]) -> ObjectMeta {
        ObjectMeta {
            key: key.into(),
            size: bytes.len() as u64,
            etag: hex::encode(&Sha256::digest(bytes)[..8]),
            modified_ms: 0,
        }
    }

    impl ObjectWriter for MemWriter {
        fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
            let meta = meta(&self.key, &self.bytes);
            self.objects.lock().unwrap().insert(self.key, self.bytes);
            Ok(meta)
        }
    }

    impl ObjectStore for MemStore {
        fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
            let mut objects = self.objects.lock().unwrap();
            if condition == PutCondition::CreateOnly && objects.contains_key(key) {
                return Err(ObjectError::AlreadyExists { key: key.into() });
            }
            objects.insert(key.into(), bytes.to_vec());
            Ok(meta(key, bytes))
        }

        fn writer(&self, key: &str, _: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
            Ok(Box::new(MemWriter { objects: self.objects.clone(), key: key.into(), bytes: Vec::new() }))
        }

        fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
            self.objects.lock().unwrap().get(key).cloned().ok_or_else(|| ObjectError::NotFound { key: key.into() })
        }

        fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
            Ok(Box::new(io::Cursor::new(self.get(key)?)))
        }

        fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
            let bytes = self.get(key)?;
            let start = (offset as usize).min(bytes.len());
            Ok(bytes[start..(start + len as usize).min(bytes.len())].to_vec())
        }

        fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
            Ok(self.objects.lock().unwrap().get(key).map(|bytes| meta(key, bytes)))
        }

        fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
            let objects = self.objects.lock().unwrap();
            Ok(objects.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| meta(k, v)).collect())
        }

        fn delete(&self, key: &str) -> Result<(), ObjectError> {
            self.objects.lock().unwrap().remove(key);
            Ok(())
        }
    }

    const MODEL: &str = "example/tiny-bert";

    /// A model directory with small files; the weights span several STREAM chunks.
    fn tiny_model(dir: &Path) {
        std::fs::write(dir.join("config.json"), br#"{"hidden_size": 8, "max_position_embeddings": 512}"#).unwrap();
        std::fs::write(dir.join("tokenizer.json"), br#"{"version": "1.0"}"#).unwrap();
        let weights: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    }

    fn open_sealed(manifest: &Manifest, dek: &[u8; 32], name: &str, sealed: &[u8]) -> Vec<u8> {
        let mut opener = StreamOpener::new(&manifest.file_key(dek, name), manifest.file_stream_id(name));
        let mut plaintext = Vec::new();
        opener.push(sealed, &mut plaintext).unwrap();
        opener.finish(&mut plaintext).unwrap();
        plaintext
    }

    fn release_dek(kms: &MemKms, manifest: &Manifest) -> [u8; 32] {
        let context = data_key_context(&manifest.model_id, manifest.version);
        let plaintext =
            kms.decrypt(Some(&manifest.kms_key_id), &manifest.wrapped_dek, &context, None).unwrap().plaintext.unwrap();
        plaintext.as_slice().try_into().unwrap()
    }

    #[test]
    fn encrypt_sign_upload_verify_round_trip() {
        let model = tempfile::tempdir().unwrap();
        tiny_model(model.path());
        let staging = tempfile::tempdir().unwrap();
        let out = staging.path().join("sealed");
        let (kms, store) = (MemKms::default(), MemStore::default());
        let publisher = SigningKey::from_bytes(&[7; 32]);

        let manifest = encrypt(model.path(), MODEL, 3, &kms, KEY, &out).unwrap();
        assert_eq!(
            (manifest.dimensions, manifest.max_tokens, manifest.pooling, manifest.normalize),
            (8, 256, Pooling::Mean, true)
        );
        assert_eq!(manifest.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), MODEL_FILES);
        assert_eq!(manifest.file("model.safetensors").unwrap().size, 200_000);
        let signed = sign(&out, &publisher).unwrap();
        assert_eq!(signed.manifest, manifest);
        let key = upload(&out, &store).unwrap();
        assert_eq!(key, "models/tiny-bert/v3/manifest.cose");
        assert_eq!(upload(&out, &store).unwrap(), key, "uploading the same manifest again is a no-op");

        let stored = store.get(&key).unwrap();
        let verified = verify(&stored, &publisher.verifying_key(), Some((&store, &key))).unwrap();
        assert_eq!(verified.manifest, manifest);
        assert_eq!(verified.manifest_hash, signed.manifest_hash);

        // The DEK is released only under {model_id, version}, and opens every stored file.
        let dek = release_dek(&kms, &manifest);
        assert!(kms.decrypt(None, &manifest.wrapped_dek, &data_key_context(MODEL, 4), None).is_err());
        for name in MODEL_FILES {
            let sealed = store.get(&Manifest::file_object_key(&key, name)).unwrap();
            let plaintext = open_sealed(&manifest, &dek, name, &sealed);
            assert_eq!(plaintext, std::fs::read(model.path().join(name)).unwrap(), "{name}");
            assert_eq!(<[u8; 32]>::from(Sha256::digest(&plaintext)), manifest.file(name).unwrap().sha256);
            // Streaming seals exactly what Manifest::seal_file would.
            assert_eq!(sealed, manifest.seal_file(&dek, name, &plaintext), "{name}");
        }
    }

    #[test]
    fn tampered_or_foreign_manifests_are_refused() {
        let model = tempfile::tempdir().unwrap();
        tiny_model(model.path());
        let out = tempfile::tempdir().unwrap();
        let (kms, store) = (MemKms::default(), MemStore::default());
        let publisher = SigningKey::from_bytes(&[7; 32]);
        encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()).unwrap();
        let signed = sign(out.path(), &publisher).unwrap().signed;

        let stranger = SigningKey::from_bytes(&[8; 32]);
        assert!(matches!(verify(&signed, &stranger.verifying_key(), None), Err(ModelError::Manifest(_))));
        let position = signed.windows(8).position(|w| w == b"tiny-ber").unwrap();
        let mut tampered = signed.clone();
        tampered[position] ^= 0x01;
        assert!(matches!(verify(&tampered, &publisher.verifying_key(), None), Err(ModelError::Manifest(_))));
        let mut truncated = signed.clone();
        truncated.pop();
        assert!(verify(&truncated, &publisher.verifying_key(), None).is_err());

        // Not uploaded yet, then at the wrong key, then with a damaged file.
        let key = layout::model_manifest(MODEL, 1);
        assert!(matches!(
            verify(&signed, &publisher.verifying_key(), Some((&store, &key))),
            Err(ModelError::MissingObject { .. })
        ));
        upload(out.path(), &store).unwrap();
        let wrong = layout::model_manifest(MODEL, 2);
        assert!(matches!(
            verify(&signed, &publisher.verifying_key(), Some((&store, &wrong))),
            Err(ModelError::WrongKey { .. })
        ));
        let weights = Manifest::file_object_key(&key, "model.safetensors");
        let mut damaged = store.get(&weights).unwrap();
        damaged.truncate(damaged.len() - 1);
        store.put(&weights, &damaged, PutCondition::Overwrite).unwrap();
        assert!(matches!(
            verify(&signed, &publisher.verifying_key(), Some((&store, &key))),
            Err(ModelError::ObjectSize { .. })
        ));

        // A manifest without a file the enclave loads.
        let mut manifest = Manifest::from_payload(&std::fs::read(out.path().join(PAYLOAD_FILE)).unwrap()).unwrap();
        manifest.files.retain(|f| f.name != "tokenizer.json");
        let partial = manifest.sign(&publisher);
        assert!(matches!(
            verify(&partial, &publisher.verifying_key(), None),
            Err(ModelError::ManifestLacks("tokenizer.json"))
        ));
    }

    #[test]
    fn a_published_version_is_never_replaced() {
        let model = tempfile::tempdir().unwrap();
        tiny_model(model.path());
        let (kms, store) = (MemKms::default(), MemStore::default());
        let publisher = SigningKey::from_bytes(&[7; 32]);
        let first = tempfile::tempdir().unwrap();
        encrypt(model.path(), MODEL, 1, &kms, KEY, first.path()).unwrap();
        sign(first.path(), &publisher).unwrap();
        let key = upload(first.path(), &store).unwrap();
        let before = store.objects.lock().unwrap().clone();

        // Same version, new data key: refused, and nothing in the store changes.
        let second = tempfile::tempdir().unwrap();
        encrypt(model.path(), MODEL, 1, &kms, KEY, second.path()).unwrap();
        sign(second.path(), &publisher).unwrap();
        assert!(matches!(upload(second.path(), &store), Err(ModelError::VersionExists { .. })));
        assert!(matches!(
            publish(model.path(), MODEL, 1, &kms, KEY, &publisher, &store),
            Err(ModelError::VersionExists { .. })
        ));
        assert_eq!(*store.objects.lock().unwrap(), before);
        assert_eq!(latest_manifest(&store, MODEL).unwrap(), Some((key, 1)));
    }

    #[test]
    fn sign_needs_the_sealed_files_and_encrypt_drops_a_stale_signature() {
        let model = tempfile::tempdir().unwrap();
        tiny_model(model.path());
        let out = tempfile::tempdir().unwrap();
        let kms = MemKms::default();
        let publisher = SigningKey::from_bytes(&[7; 32]);
        encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()).unwrap();
        sign(out.path(), &publisher).unwrap();
        encrypt(model.path(), MODEL, 2, &kms, KEY, out.path()).unwrap();
        assert!(!out.path().join(SIGNED_FILE).exists());
        std::fs::remove_file(out.path().join("tokenizer.json.sealed")).unwrap();
        assert!(matches!(sign(out.path(), &publisher), Err(ModelError::Io { .. })));
        assert!(matches!(
            encrypt(model.path(), MODEL, 1, &kms, "alias/other", out.path()),
            Err(ModelError::Kms { .. })
        ));
        assert!(matches!(
            encrypt(model.path(), "has space", 1, &kms, KEY, out.path()),
            Err(ModelError::InvalidModelId(_))
        ));
        std::fs::remove_file(model.path().join("tokenizer.json")).unwrap();
        assert!(matches!(
            encrypt(model.path(), MODEL, 1, &kms, KEY, out.path()),
            Err(ModelError::MissingFile { name: "tokenizer.json", .. })
        ));
    }

    #[test]
    fn settings_come_from_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        tiny_model(dir.path());
        assert_eq!(
            read_settings(dir.path()).unwrap(),
            ModelSettings { dimensions: 8, max_tokens: 256, pooling: Pooling::Mean }
        );
        std::fs::write(
            dir.path().join("sentence_bert_config.json"),
            br#"{"max_seq_length": 128, "do_lower_case": false}"#,
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
        std::fs::write(
            dir.path().join("1_Pooling/config.json"),
            br#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
        )
        .unwrap();
        assert_eq!(
            read_settings(dir.path()).unwrap(),
            ModelSettings { dimensions: 8, max_tokens: 128, pooling: Pooling::Cls }
        );
        std::fs::write(dir.path().join("sentence_bert_config.json"), br#"{"max_seq_length": 4096}"#).unwrap();
        assert_eq!(read_settings(dir.path()).unwrap().max_tokens, 512, "capped at max_position_embeddings");
        std::fs::write(dir.path().join("1_Pooling/config.json"), br#"{"pooling_mode_max_tokens": true}"#).unwrap();
        assert!(matches!(read_settings(dir.path()), Err(ModelError::Config { .. })));
        std::fs::write(dir.path().join("config.json"), br#"{"hidden_size": "384"}"#).unwrap();
        assert!(matches!(read_settings(dir.path()), Err(ModelError::Config { .. })));
        std::fs::write(dir.path().join("config.json"), b"{").unwrap();
        assert!(matches!(read_settings(dir.path()), Err(ModelError::Config { .. })));
    }

    #[test]
    fn publish_and_latest_manifest() {
        let model = tempfile::tempdir().unwrap();
        tiny_model(model.path());
        let (kms, store) = (MemKms::default(), MemStore::default());
        let publisher = SigningKey::from_bytes(&[7; 32]);
        assert_eq!(latest_manifest(&store, MODEL).unwrap(), None);
        let v2 = publish(model.path(), MODEL, 2, &kms, KEY, &publisher, &store).unwrap();
        let v10 = publish(model.path(), MODEL, 10, &kms, KEY, &publisher, &store).unwrap();
        for (key, bytes) in
            [("models/tiny-bert/v99/notes.txt", b"x".as_slice()), ("models/tiny-bert-large/v50/manifest.cose", b"y")]
        {
            store.put(key, bytes, PutCondition::Overwrite).unwrap();
        }
        assert_eq!(latest_manifest(&store, MODEL).unwrap(), Some((v10.manifest_key.clone(), 10)));
        assert_eq!(latest_manifest(&store, "example/other").unwrap(), None);

        let signed = store.get(&v2.manifest_key).unwrap();
        assert_eq!(manifest_hash(&signed), v2.manifest_hash);
        let verified = verify(&signed, &publisher.verifying_key(), Some((&store, &v2.manifest_key))).unwrap();
        let dek = release_dek(&kms, &verified.manifest);
        let sealed = store.get(&Manifest::file_object_key(&v2.manifest_key, "model.safetensors")).unwrap();
        let weights = open_sealed(&verified.manifest, &dek, "model.safetensors", &sealed);
        assert_eq!(weights, std::fs::read(model.path().join("model.safetensors")).unwrap());
    }

    /// The real default model, when scripts/setup-model.sh has installed it.
    #[test]
    fn publishes_the_default_model() {
        let dir = std::env::var_os("EPHEM_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ephem/models/all-MiniLM-L6-v2"));
        if !dir.join("model.safetensors").is_file() {
            eprintln!("skipped: no model at {} (run scripts/setup-model.sh)", dir.display());
            return;
        }
        let (kms, store) = (MemKms::default(), MemStore::default());
        let publisher = protocol::manifest::development_publisher();
        let model_id = "sentence-transformers/all-MiniLM-L6-v2";
        let published = publish(&dir, model_id, 1, &kms, KEY, &publisher, &store).unwrap();
        assert_eq!(published.manifest_key, "models/all-MiniLM-L6-v2/v1/manifest.cose");
        let manifest = &published.manifest;
        assert_eq!((manifest.dimensions, manifest.max_tokens, manifest.pooling), (384, 256, Pooling::Mean));
        assert_eq!(
            hex::encode(manifest.file("model.safetensors").unwrap().sha256),
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
        );
        let signed = store.get(&published.manifest_key).unwrap();
        verify(&signed, &publisher.verifying_key(), Some((&store, &published.manifest_key))).unwrap();
        let dek = release_dek(&kms, manifest);
        let sealed = store.get(&Manifest::file_object_key(&published.manifest_key, "tokenizer.json")).unwrap();
        let tokenizer = open_sealed(manifest, &dek, "tokenizer.json", &sealed);
        assert_eq!(<[u8; 32]>::from(Sha256::digest(&tokenizer)), manifest.file("tokenizer.json").unwrap().sha256);
    }
}
