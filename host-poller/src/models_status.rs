//! `<home>/run/worker-models.json`: the models the worker holds under its memory budget, as its
//! last `ModelMemory` answer said, for `ephem-batch dev status`. Informative only, like a job's
//! status: written by control after every pass and every load, replaced whole.

use std::path::Path;

use protocol::frame::ResidentModel;
use serde::{Deserialize, Serialize};

/// The file's name in the home's run directory.
pub const MODELS_STATUS_FILE: &str = "worker-models.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelsStatus {
    pub updated_ms: u64,
    pub budget_bytes: u64,
    pub used_bytes: u64,
    pub models: Vec<HeldModel>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldModel {
    pub model_id: String,
    /// Hex SHA-256 of the signed manifest the worker verified.
    pub manifest_hash: String,
    pub version: u64,
    /// Control's manifest key for it, if control loaded it on this connection.
    pub manifest_key: Option<String>,
    pub bytes: u64,
    pub last_use_ms: u64,
}

impl ModelsStatus {
    /// From the worker's answer; `manifest_key` is control's view (model id → manifest key).
    pub(crate) fn new(budget: u64, models: &[ResidentModel], manifest_key: impl Fn(&str) -> Option<String>) -> Self {
        let models: Vec<HeldModel> = models
            .iter()
            .map(|m| HeldModel {
                model_id: m.model_id.clone(),
                manifest_hash: hex::encode(&m.manifest_hash),
                version: m.version,
                manifest_key: manifest_key(&m.model_id),
                bytes: m.bytes,
                last_use_ms: m.last_use_ms,
            })
            .collect();
        Self { updated_ms: cloud::now_ms(), budget_bytes: budget, used_bytes: models.iter().map(|m| m.bytes).sum(), models }
    }

    /// Writes the file whole: to a temporary name beside it, then renamed over it.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, bytes)?;
        std::fs::rename(&temporary, path)
    }

    pub fn read(path: &Path) -> std::io::Result<Self> {
        serde_json::from_slice(&std::fs::read(path)?).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(MODELS_STATUS_FILE);
        let resident = ResidentModel { model_id: "org/a".into(), manifest_hash: vec![0xab; 32], version: 2, bytes: 7 << 20, last_use_ms: 5 };
        let manifests = BTreeMap::from([("org/a".to_owned(), "models/a/v2/manifest.cose".to_owned())]);
        let status = ModelsStatus::new(64 << 20, &[resident], |id| manifests.get(id).cloned());
        status.write(&path).unwrap();
        let read = ModelsStatus::read(&path).unwrap();
        assert_eq!(read, status);
        assert_eq!(read.used_bytes, 7 << 20);
        assert_eq!(read.models[0].manifest_key.as_deref(), Some("models/a/v2/manifest.cose"));
        assert_eq!(read.models[0].manifest_hash, "ab".repeat(32));
        assert!(!path.with_extension("json.tmp").exists());
    }
}
