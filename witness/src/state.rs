//! The witness's durable state: per log origin, the latest checkpoint it cosigned (size,
//! root, the note with its cosignature). One JSON file, replaced atomically (a private
//! temporary file written and synced, renamed over the old one, the directory synced)
//! before any cosignature leaves the process.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::{engine::general_purpose::STANDARD, Engine};
use receipts_ledger::merkle::Hash;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a witness state file: {why}")]
    Corrupt { path: PathBuf, why: String },
}

/// What the witness last cosigned for one log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogState {
    pub size: u64,
    /// Base64 of the 32-byte root.
    pub root: String,
    /// The checkpoint note as cosigned (the log's signatures and this witness's cosignature).
    pub checkpoint: String,
}

impl LogState {
    pub fn root_hash(&self) -> Option<Hash> {
        STANDARD.decode(&self.root).ok()?.try_into().ok()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File1 {
    version: u32,
    logs: BTreeMap<String, LogState>,
}

/// The state file and its contents.
#[derive(Debug)]
pub struct State {
    path: PathBuf,
    logs: BTreeMap<String, LogState>,
}

impl State {
    /// Loads the file, or starts empty if there is none. A file that does not parse is an
    /// error: starting empty would let a log roll back.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let io = |source| StateError::Io { path: path.to_path_buf(), source };
        let logs = match fs::read(path) {
            Ok(bytes) => {
                let corrupt = |why: String| StateError::Corrupt { path: path.to_path_buf(), why };
                let file: File1 = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
                if file.version != 1 {
                    return Err(corrupt(format!("version {}", file.version)));
                }
                if let Some((origin, _)) = file.logs.iter().find(|(_, l)| l.root_hash().is_none()) {
                    return Err(corrupt(format!("log {origin:?}: root is not base64 of 32 bytes")));
                }
                file.logs
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io(e)),
        };
        Ok(Self { path: path.to_path_buf(), logs })
    }

    pub fn get(&self, origin: &str) -> Option<&LogState> {
        self.logs.get(origin)
    }

    /// Records `log` for `origin` and writes the file; on failure nothing changes in memory.
    pub fn put(&mut self, origin: &str, log: LogState) -> Result<(), StateError> {
        let previous = self.logs.insert(origin.to_owned(), log);
        if let Err(e) = self.write() {
            match previous {
                Some(p) => self.logs.insert(origin.to_owned(), p),
                None => self.logs.remove(origin),
            };
            return Err(e);
        }
        Ok(())
    }

    fn write(&self) -> Result<(), StateError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { path, source }
        };
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            self.path.file_name().and_then(|n| n.to_str()).unwrap_or("witness-state"),
            std::process::id()
        ));
        let file = File1 { version: 1, logs: self.logs.clone() };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| StateError::Corrupt { path: tmp.clone(), why: e.to_string() })?;
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io(&tmp))?;
        f.write_all(&bytes).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
        fs::rename(&tmp, &self.path).map_err(io(&self.path))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_reopen_and_refuses_a_damaged_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = State::open(&path).unwrap();
        assert!(s.get("o").is_none());
        let log = LogState { size: 3, root: STANDARD.encode([1u8; 32]), checkpoint: "x".into() };
        s.put("o", log.clone()).unwrap();
        assert_eq!(State::open(&path).unwrap().get("o"), Some(&log));
        fs::write(&path, b"{\"version\":1,\"logs\":{\"o\":{\"size\":1,\"root\":\"AA==\",\"checkpoint\":\"\"}}}").unwrap();
        assert!(matches!(State::open(&path), Err(StateError::Corrupt { .. })));
        fs::write(&path, b"{").unwrap();
        assert!(matches!(State::open(&path), Err(StateError::Corrupt { .. })));
    }
}
