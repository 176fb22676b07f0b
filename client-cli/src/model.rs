//! Onboarding a model (DESIGN.md §7): encrypt a model directory, sign its manifest, upload
//! both, verify what was published. `ephem-batch model encrypt|sign|upload|verify` are one call
//! each; [`publish`] does all of it in one go (`ephem-batch dev up`).
//!
//! A model directory holds `config.json`, `tokenizer.json` and `model.safetensors` (sealed and
//! loaded by the enclave), each `Dense` module's `config.json` and `model.safetensors` (sealed as
//! `dense.N.config.json` and `dense.N.safetensors`, [`protocol::manifest::dense_file_names`]) and
//! the sentence-transformers configuration that [`read_settings`]
//! turns into the manifest's dimensions, pooling, normalisation, maximum length and prompts, in
//! either configuration form; what the engine cannot compute exactly is refused (docs/models.md).
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
use protocol::manifest::{Manifest, ManifestError, ModelFile, Prompts, SignedManifest, manifest_hash};
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
    #[error("{}: {field} = {found} is refused: {reason}", path.display())]
    Unsupported { path: PathBuf, field: &'static str, found: String, reason: &'static str },
    #[error(
        "{}: no maximum sequence length (sentence_bert_config.json max_seq_length, or tokenizer_config.json model_max_length)",
        dir.display()
    )]
    NoMaxLength { dir: PathBuf },
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

mod settings;
pub use settings::{ModelSettings, read_settings};

fn read_json(path: &Path) -> Result<Option<Value>, ModelError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ModelError::Config { path: path.to_owned(), message: format!("not valid JSON: {e}") }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelError::Io { path: path.to_owned(), source }),
    }
}

/// SHA-256 and size of a file (or converted bytes), read in blocks.
fn hash_source(source: &Source) -> Result<([u8; 32], u64), ModelError> {
    let path = &source.path;
    let io_error = |source| ModelError::Io { path: path.to_owned(), source };
    let mut file = source.open()?;
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

/// What the publisher says of a version beyond its directory: the Matryoshka lengths the model
/// was trained for (nothing in a model directory says so) and the images whose model key the
/// version is sealed to (`Manifest::images`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offering {
    pub matryoshka: Vec<u32>,
    pub images: Vec<[u8; 48]>,
}

/// Where a manifest file's bytes come from: a file of the model directory, or bytes converted
/// from one (bge-m3's heads, `path` their `.pt`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Source {
    path: PathBuf,
    converted: Option<Vec<u8>>,
}

impl Source {
    fn file(path: PathBuf) -> Self {
        Self { path, converted: None }
    }

    fn open(&self) -> Result<Box<dyn Read + '_>, ModelError> {
        match &self.converted {
            Some(bytes) => Ok(Box::new(bytes.as_slice())),
            None => {
                let file = File::open(&self.path).map_err(|source| ModelError::Io { path: self.path.clone(), source })?;
                Ok(Box::new(file))
            }
        }
    }
}

/// Each file the manifest names, with where it is read from in the model directory: the
/// three model files at the root, then each Dense module's two files from its folder, then
/// bge-m3's heads as converted.
fn sources(dir: &Path, settings: &ModelSettings) -> Vec<(String, Source)> {
    let mut sources: Vec<(String, Source)> = MODEL_FILES.iter().map(|name| ((*name).to_owned(), Source::file(dir.join(name)))).collect();
    for (index, folder) in settings.dense.iter().enumerate() {
        let [config, weights] = protocol::manifest::dense_file_names(index);
        sources.push((config, Source::file(dir.join(folder).join("config.json"))));
        sources.push((weights, Source::file(dir.join(folder).join("model.safetensors"))));
    }
    for head in &settings.heads {
        let pt = dir.join(head.file.replace(".safetensors", ".pt"));
        sources.push((head.file.to_owned(), Source { path: pt, converted: Some(head.safetensors.clone()) }));
    }
    sources.sort();
    sources
}

/// A model's files as [`prepare`] hashed them: each manifest name with its source.
type Sources = Vec<(String, Source)>;

/// Hashes the files, makes and wraps a data key, and builds the manifest.
fn prepare(
    dir: &Path,
    model_id: &str,
    version: u64,
    offering: &Offering,
    kms: &dyn Kms,
    kms_key_id: &str,
) -> Result<(Manifest, Zeroizing<[u8; 32]>, Sources), ModelError> {
    if !valid_model_id(model_id) {
        return Err(ModelError::InvalidModelId(model_id.to_owned()));
    }
    let settings = read_settings(dir)?;
    let sources = sources(dir, &settings);
    let mut files = Vec::with_capacity(sources.len());
    for (name, source) in &sources {
        if source.converted.is_none() && !source.path.is_file() {
            let missing = MODEL_FILES.into_iter().find(|m| m == name).unwrap_or("a Dense module's file");
            return Err(ModelError::MissingFile { dir: source.path.parent().unwrap_or(dir).to_owned(), name: missing });
        }
        let (sha256, size) = hash_source(source)?;
        files.push(ModelFile { name: name.clone(), sha256, size });
    }
    let mut dek = Zeroizing::new([0u8; 32]);
    getrandom::fill(dek.as_mut()).map_err(|e| ModelError::Random(e.to_string()))?;
    let wrapped_dek = kms
        .encrypt(kms_key_id, dek.as_ref(), &data_key_context(model_id, version))
        .map_err(|source| ModelError::Kms { key_id: kms_key_id.to_owned(), source })?;
    let outputs = settings.outputs();
    let manifest = Manifest {
        model_id: model_id.to_owned(),
        version,
        files,
        dimensions: settings.dimensions,
        pooling: settings.pooling,
        normalize: settings.normalize,
        max_tokens: settings.max_tokens,
        prompts: Prompts { entries: settings.prompts, default: settings.default_prompt },
        rerank_template: settings.rerank_template,
        matryoshka: {
            let mut lengths = offering.matryoshka.clone();
            lengths.sort_unstable();
            lengths.dedup();
            lengths
        },
        images: {
            let mut images = offering.images.clone();
            images.sort_unstable();
            images.dedup();
            images
        },
        outputs,
        kms_key_id: kms_key_id.to_owned(),
        wrapped_dek,
        created_ms: cloud::now_ms(),
    };
    // The payload must pass the checks the enclave applies.
    Manifest::from_payload(&manifest.to_payload()).map_err(ModelError::Manifest)?;
    Ok((manifest, dek, sources))
}

/// Where [`prepare`] read a manifest file from.
fn source_of<'a>(sources: &'a Sources, name: &str) -> &'a Source {
    sources.iter().find(|(n, _)| n == name).map(|(_, source)| source).expect("every manifest file has a source")
}

/// Seals one model file into `out` in blocks — the same bytes as [`Manifest::seal_file`], in
/// constant memory — and checks that the file still has the manifest's hash.
fn seal_into(
    manifest: &Manifest,
    dek: &[u8; 32],
    source: &Source,
    file: &ModelFile,
    out: &mut dyn Write,
    target: &str,
) -> Result<(), ModelError> {
    let path = source.path.clone();
    let io_error = |source| ModelError::Io { path: path.clone(), source };
    let write_error = |source| ModelError::Write { target: target.to_owned(), source };
    let mut input = source.open()?;
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
    encrypt_offering(dir, model_id, version, &Offering::default(), kms, kms_key_id, out_dir)
}

/// [`encrypt`], the manifest saying what `offering` says.
pub fn encrypt_offering(
    dir: &Path,
    model_id: &str,
    version: u64,
    offering: &Offering,
    kms: &dyn Kms,
    kms_key_id: &str,
    out_dir: &Path,
) -> Result<Manifest, ModelError> {
    let (manifest, dek, sources) = prepare(dir, model_id, version, offering, kms, kms_key_id)?;
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
            seal_into(&manifest, &dek, source_of(&sources, &file.name), file, &mut out, &shown)
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
pub fn publish(
    dir: &Path,
    model_id: &str,
    version: u64,
    kms: &dyn Kms,
    kms_key_id: &str,
    signing_key: &SigningKey,
    models: &dyn ObjectStore,
) -> Result<PublishedModel, ModelError> {
    publish_offering(dir, model_id, version, &Offering::default(), kms, kms_key_id, signing_key, models)
}

/// [`publish`], the manifest saying what `offering` says.
#[allow(clippy::too_many_arguments)]
pub fn publish_offering(
    dir: &Path,
    model_id: &str,
    version: u64,
    offering: &Offering,
    kms: &dyn Kms,
    kms_key_id: &str,
    signing_key: &SigningKey,
    models: &dyn ObjectStore,
) -> Result<PublishedModel, ModelError> {
    let manifest_key = layout::model_manifest(model_id, version);
    if models.head(&manifest_key)?.is_some() {
        return Err(ModelError::VersionExists { key: manifest_key, model_id: model_id.to_owned(), version });
    }
    let (manifest, dek, sources) = prepare(dir, model_id, version, offering, kms, kms_key_id)?;
    let signed = manifest.sign(signing_key);
    for file in &manifest.files {
        let object_key = Manifest::file_object_key(&manifest_key, &file.name);
        let mut writer = models.writer(&object_key, PutCondition::Overwrite)?;
        seal_into(&manifest, &dek, source_of(&sources, &file.name), file, &mut writer, &object_key)?;
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
mod tests;
