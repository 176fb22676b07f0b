//! Test helpers: a committed model directory of `tests/testdata/outputs`, copied so that a test
//! can change one file, and the field a refusal names.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::super::ModelError;

pub(super) fn copy_of(name: &str) -> tempfile::TempDir {
    let from = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs")).join(name);
    let dir = tempfile::tempdir().unwrap();
    for entry in walk(&from) {
        let to = dir.path().join(entry.strip_prefix(&from).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&entry, to).unwrap();
    }
    dir
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

/// Rewrites one JSON file of `dir`.
pub(super) fn edit(dir: &Path, name: &str, change: impl FnOnce(&mut Value)) {
    let path = dir.join(name);
    let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    change(&mut json);
    std::fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
}

/// The field `read_settings` refuses `dir` by.
pub(super) fn refused_field(dir: &Path) -> &'static str {
    match super::read_settings(dir) {
        Err(ModelError::Unsupported { field, .. }) => field,
        other => panic!("expected a refusal by field, got {other:?}"),
    }
}
