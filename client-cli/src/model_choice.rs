//! Which model version `submit` seals to, against a host that controls what the models bucket
//! shows (docs/protocol.md §5.1). The host cannot forge a publisher signature, but it can
//! delete or withhold the newest manifest, copy an old signed manifest under a newer key, or
//! replay an old minimum. So:
//!
//! * `model_version`: a manifest's signed version must equal the `v<N>` of its key, and the
//!   newest is chosen by signed version;
//! * `model_minimum`: the publisher signs a floor (`models/<name>/minimum.cose`,
//!   `ephem-batch model set-minimum`); a manifest below it is refused;
//! * `model_ratchet`: the client remembers, per publisher and model id, the highest version
//!   (and floor) it has seen and refuses to go below it when the host withholds both;
//! * `model_pin`: `--model-version` / `--manifest-sha256` choose exactly one manifest;
//! * `model_image`: only versions for the image the client attested count (`Manifest::images`:
//!   during an image update the newest version is sealed to the new image's model key, which
//!   the old image's enclaves cannot open).

use std::path::{Path, PathBuf};

use cloud::layout;
use cloud::objects::{ObjectError, ObjectStore, PutCondition};
use ed25519_dalek::{SigningKey, VerifyingKey};
use protocol::manifest::{Manifest, ManifestError, ModelMinimum, SignedManifest, SignedModelMinimum};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::home::Home;

/// The object beside a model's versions that holds the publisher's signed minimum.
pub const MINIMUM_NAME: &str = "minimum.cose";

/// A model version the client checked: its signature, its key, and the hash its jobs will name.
#[derive(Debug, Clone)]
pub struct CheckedModel {
    pub key: String,
    pub manifest: Manifest,
    pub hash: [u8; 32],
}

/// `--model-version` / `--manifest-sha256`: both, when given, must match the chosen manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelPins {
    pub version: Option<u64>,
    pub manifest_sha256: Option<[u8; 32]>,
}

impl ModelPins {
    pub fn parse(version: Option<u64>, manifest_sha256: Option<&str>) -> Result<Self, ModelChoiceError> {
        let manifest_sha256 = manifest_sha256
            .map(|text| hex::decode(text.trim()).ok().and_then(|b| b.try_into().ok()).ok_or(ModelChoiceError::PinSyntax))
            .transpose()?;
        Ok(ModelPins { version, manifest_sha256 })
    }

    fn any(&self) -> bool {
        self.version.is_some() || self.manifest_sha256.is_some()
    }

    fn accepts(&self, model: &CheckedModel) -> bool {
        self.version.is_none_or(|v| v == model.manifest.version) && self.manifest_sha256.is_none_or(|h| h == model.hash)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelChoiceError {
    #[error("model {model_id} is not published (no manifest under {prefix})")]
    NotPublished { model_id: String, prefix: String },
    #[error("no manifest of {model_id} verifies:\n  {}", refused.join("\n  "))]
    NoneVerifies { model_id: String, refused: Vec<String> },
    #[error("check `model_version` failed: {key} holds a manifest signed as version {signed}, not {listed}")]
    Version { key: String, listed: u64, signed: u64 },
    #[error("check `model_minimum` failed: {model_id} v{version} is below the publisher's signed minimum v{minimum} ({source_of})")]
    BelowMinimum { model_id: String, version: u64, minimum: u64, source_of: &'static str },
    #[error("check `model_minimum` failed: {key}: {reason}")]
    BadMinimum { key: String, reason: String },
    #[error(
        "check `model_ratchet` failed: this client has seen {model_id} v{seen} (manifest {seen_hash}), the store now offers \
         v{version} (manifest {hash}); a newer version was withheld or replaced — pin with --model-version or \
         --manifest-sha256 to use it deliberately"
    )]
    Ratchet { model_id: String, seen: u64, seen_hash: String, version: u64, hash: String },
    #[error("check `model_pin` failed: no verified manifest of {model_id} is {wanted}; available: {available}")]
    Pin { model_id: String, wanted: String, available: String },
    #[error(
        "check `model_image` failed: no verified manifest of {model_id} is for the attested image (PCR0 {pcr0}); \
         the versions name only: {available}"
    )]
    NoneForImage { model_id: String, pcr0: String, available: String },
    #[error("--manifest-sha256 must be 64 hex digits")]
    PinSyntax,
    #[error("model ratchet {path}: {message}")]
    RatchetFile { path: PathBuf, message: String },
    #[error(transparent)]
    Store(#[from] ObjectError),
}

impl ModelChoiceError {
    /// The check that failed, for those that are checks.
    pub fn check(&self) -> Option<&'static str> {
        match self {
            Self::Version { .. } => Some("model_version"),
            Self::BelowMinimum { .. } | Self::BadMinimum { .. } => Some("model_minimum"),
            Self::Ratchet { .. } => Some("model_ratchet"),
            Self::Pin { .. } | Self::PinSyntax => Some("model_pin"),
            Self::NoneForImage { .. } => Some("model_image"),
            _ => None,
        }
    }
}

/// `models/<name>/`, as the layout spells it.
fn model_prefix(model_id: &str) -> String {
    let probe = layout::model_manifest(model_id, 0);
    probe[..probe.len() - format!("v0/{}", layout::MANIFEST_NAME).len()].to_owned()
}

pub fn minimum_key(model_id: &str) -> String {
    format!("{}{MINIMUM_NAME}", model_prefix(model_id))
}

/// What this client remembers of one publisher's model (`client/models-seen/<id>.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    model_id: String,
    publisher: String,
    highest_version: u64,
    highest_manifest_sha256: String,
    minimum_version: u64,
}

/// One file per publisher and model, and per image for versions that name their images: an
/// image's versions ratchet among themselves (the old image's clients keep its older version
/// while the new image's move on).
fn ratchet_path(home: &Home, publisher: &VerifyingKey, model_id: &str, image: Option<&[u8]>) -> PathBuf {
    let mut hasher = Sha256::new();
    hasher.update(publisher.as_bytes());
    hasher.update([0]);
    hasher.update(model_id.as_bytes());
    if let Some(pcr0) = image {
        hasher.update([0]);
        hasher.update(pcr0);
    }
    home.root().join("client").join("models-seen").join(format!("{}.json", &hex::encode(hasher.finalize())[..32]))
}

fn read_seen(path: &Path) -> Result<Option<Seen>, ModelChoiceError> {
    let fail = |message: String| ModelChoiceError::RatchetFile { path: path.to_owned(), message };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| fail(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fail(e.to_string())),
    }
}

/// Every manifest listed under `model_id`'s keys whose signature verifies, by signed version.
/// A signed version that differs from its key's is refused outright: it is the host's doing.
fn verified_manifests(models: &dyn ObjectStore, model_id: &str, publisher: &VerifyingKey) -> Result<Vec<CheckedModel>, ModelChoiceError> {
    let prefix = model_prefix(model_id);
    let mut listed: Vec<(u64, String)> = models
        .list(&prefix)?
        .into_iter()
        .filter_map(|m| layout::manifest_version(&m.key).filter(|v| layout::model_manifest(model_id, *v) == m.key).map(|v| (v, m.key)))
        .collect();
    if listed.is_empty() {
        return Err(ModelChoiceError::NotPublished { model_id: model_id.to_owned(), prefix });
    }
    listed.sort();
    let (mut verified, mut refused) = (Vec::new(), Vec::new());
    for (listed_version, key) in listed {
        let bytes = match models.get_at_most(&key, cloud::MAX_SMALL_OBJECT) {
            Ok(bytes) => bytes,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        let checked = SignedManifest::decode(&bytes).and_then(|s| s.verify(publisher).map(|m| (m.clone(), s.hash)));
        match checked {
            Ok((manifest, _)) if manifest.model_id != model_id => refused.push(format!("{key}: names model {}", manifest.model_id)),
            Ok((manifest, _)) if manifest.version != listed_version => {
                return Err(ModelChoiceError::Version { key, listed: listed_version, signed: manifest.version })
            }
            Ok((manifest, hash)) => verified.push(CheckedModel { key, manifest, hash }),
            Err(error) => refused.push(format!("{key}: {error}")),
        }
    }
    if verified.is_empty() {
        return Err(ModelChoiceError::NoneVerifies { model_id: model_id.to_owned(), refused });
    }
    Ok(verified)
}

/// The publisher's signed minimum, if the store shows one. One that is there but does not
/// verify is refused rather than ignored: only the host could have put it there.
fn published_minimum(models: &dyn ObjectStore, model_id: &str, publisher: &VerifyingKey) -> Result<Option<ModelMinimum>, ModelChoiceError> {
    let key = minimum_key(model_id);
    let bytes = match models.get_at_most(&key, cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let bad = |reason: String| ModelChoiceError::BadMinimum { key: key.clone(), reason };
    let minimum = SignedModelMinimum::decode(&bytes).and_then(|s| s.verify(publisher).cloned()).map_err(|e| bad(e.to_string()))?;
    if minimum.model_id != model_id {
        return Err(bad(format!("names model {}", minimum.model_id)));
    }
    Ok(Some(minimum))
}

/// The manifest `submit` seals to for the enclave image measured `image_pcr0`: among the
/// versions for that image, the pinned one, else the newest by signed version; never below the
/// publisher's minimum (published now or seen before), and, unpinned, never below what this
/// client has seen. Remembers what it saw. The development publisher's key is public, so a
/// ratchet on it would protect nothing: it is kept for real publishers only.
pub fn choose_model(
    models: &dyn ObjectStore,
    model_id: &str,
    publisher: &VerifyingKey,
    home: &Home,
    pins: &ModelPins,
    image_pcr0: &[u8],
) -> Result<CheckedModel, ModelChoiceError> {
    let all = verified_manifests(models, model_id, publisher)?;
    let verified: Vec<CheckedModel> = all.iter().filter(|m| m.manifest.is_for_image(image_pcr0)).cloned().collect();
    let Some(newest) = verified.iter().max_by_key(|m| m.manifest.version) else {
        return Err(ModelChoiceError::NoneForImage {
            model_id: model_id.to_owned(),
            pcr0: hex::encode(image_pcr0),
            available: all
                .iter()
                .map(|m| format!("v{} for {}", m.manifest.version, m.manifest.images.iter().map(hex::encode).collect::<Vec<_>>().join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
        });
    };
    let minimum = published_minimum(models, model_id, publisher)?;
    let development = *publisher == protocol::manifest::development_publisher().verifying_key();
    let path = ratchet_path(home, publisher, model_id, (!newest.manifest.images.is_empty()).then_some(image_pcr0));
    let seen = if development { None } else { read_seen(&path)? };

    let chosen = if pins.any() {
        verified.iter().find(|m| pins.accepts(m)).ok_or_else(|| ModelChoiceError::Pin {
            model_id: model_id.to_owned(),
            wanted: [pins.version.map(|v| format!("v{v}")), pins.manifest_sha256.map(|h| format!("manifest {}", hex::encode(h)))]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" with "),
            available: verified.iter().map(|m| format!("v{} ({})", m.manifest.version, hex::encode(m.hash))).collect::<Vec<_>>().join(", "),
        })?
    } else {
        newest
    };

    let published_floor = minimum.as_ref().map_or(0, |m| m.minimum_version);
    let remembered_floor = seen.as_ref().map_or(0, |s| s.minimum_version);
    let (floor, source_of) = if published_floor >= remembered_floor {
        (published_floor, "published")
    } else {
        (remembered_floor, "remembered by this client; the store no longer shows it")
    };
    if chosen.manifest.version < floor {
        return Err(ModelChoiceError::BelowMinimum { model_id: model_id.to_owned(), version: chosen.manifest.version, minimum: floor, source_of });
    }
    if let (Some(seen), false) = (&seen, pins.any()) {
        let replaced = chosen.manifest.version == seen.highest_version && hex::encode(chosen.hash) != seen.highest_manifest_sha256;
        if chosen.manifest.version < seen.highest_version || replaced {
            return Err(ModelChoiceError::Ratchet {
                model_id: model_id.to_owned(),
                seen: seen.highest_version,
                seen_hash: seen.highest_manifest_sha256.clone(),
                version: chosen.manifest.version,
                hash: hex::encode(chosen.hash),
            });
        }
    }
    if !development {
        remember(&path, seen, model_id, publisher, newest, floor)?;
    }
    Ok(chosen.clone())
}

fn remember(path: &Path, seen: Option<Seen>, model_id: &str, publisher: &VerifyingKey, newest: &CheckedModel, floor: u64) -> Result<(), ModelChoiceError> {
    let old = seen.unwrap_or_default();
    let mut new = Seen { model_id: model_id.to_owned(), publisher: hex::encode(publisher.as_bytes()), minimum_version: old.minimum_version.max(floor), ..old.clone() };
    if newest.manifest.version > old.highest_version || old.highest_manifest_sha256.is_empty() {
        new.highest_version = newest.manifest.version;
        new.highest_manifest_sha256 = hex::encode(newest.hash);
    }
    if new == old {
        return Ok(());
    }
    let bytes = serde_json::to_vec_pretty(&new).expect("a ratchet serialises");
    crate::home::write_private(path, &bytes).map_err(|e| ModelChoiceError::RatchetFile { path: path.to_owned(), message: format!("{e:#}") })
}

/// Why a minimum cannot be uploaded.
#[derive(Debug, thiserror::Error)]
pub enum MinimumUploadError {
    #[error("not a signed model minimum: {0}")]
    Decode(#[from] ManifestError),
    #[error("{model_id} v{version} is not published ({key} is missing): clients would refuse every version")]
    NotPublished { model_id: String, version: u64, key: String },
    #[error("{key} already holds minimum v{existing}; a lower one (v{new}) would undo it")]
    Lower { key: String, existing: u64, new: u64 },
    #[error(transparent)]
    Store(#[from] ObjectError),
}

/// `model set-minimum`: the publisher's signed floor for `model_id`.
pub fn sign_minimum(model_id: &str, minimum_version: u64, publisher: &SigningKey, issued_ms: u64) -> Vec<u8> {
    ModelMinimum { model_id: model_id.to_owned(), minimum_version, issued_ms }.sign(publisher)
}

/// Uploads a signed minimum beside the model's versions and returns its key. The version it
/// names must be published, and an existing higher minimum is never lowered.
pub fn upload_minimum(models: &dyn ObjectStore, signed: &[u8]) -> Result<String, MinimumUploadError> {
    let minimum = SignedModelMinimum::decode(signed)?.minimum;
    let manifest_key = layout::model_manifest(&minimum.model_id, minimum.minimum_version);
    if models.head(&manifest_key)?.is_none() {
        return Err(MinimumUploadError::NotPublished { model_id: minimum.model_id, version: minimum.minimum_version, key: manifest_key });
    }
    let key = minimum_key(&minimum.model_id);
    match models.get_at_most(&key, cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => match SignedModelMinimum::decode(&bytes) {
            Ok(existing) if existing.minimum.minimum_version > minimum.minimum_version => {
                return Err(MinimumUploadError::Lower { key, existing: existing.minimum.minimum_version, new: minimum.minimum_version });
            }
            _ => {}
        },
        Err(ObjectError::NotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    models.put(&key, signed, PutCondition::Overwrite)?;
    Ok(key)
}

/// The ids of every model with a manifest the publisher signed (`GET /v1/models` of `serve`).
pub fn published_model_ids(models: &dyn ObjectStore, publisher: &VerifyingKey) -> Result<Vec<String>, ModelChoiceError> {
    let mut ids = std::collections::BTreeSet::new();
    for meta in models.list(layout::MODELS_PREFIX)? {
        if layout::manifest_version(&meta.key).is_none() {
            continue;
        }
        let bytes = match models.get_at_most(&meta.key, cloud::MAX_SMALL_OBJECT) {
            Ok(bytes) => bytes,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        if let Ok(manifest) = SignedManifest::decode(&bytes).and_then(|s| s.verify(publisher).cloned()) {
            ids.insert(manifest.model_id);
        }
    }
    Ok(ids.into_iter().collect())
}
