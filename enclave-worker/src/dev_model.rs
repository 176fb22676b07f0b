//! The default model as the worker's tests and benchmarks publish it (feature `dev`): its files
//! read from the directory `scripts/setup-model.sh` fills, described by a manifest of the model's
//! shape and sealed under one data key — once, here, instead of in every test and benchmark. The
//! client's `model publish` does the same for real deployments, from the model's own settings.

use std::path::{Path, PathBuf};

use protocol::manifest::{Manifest, ModelFile, Pooling};
use sha2::{Digest, Sha256};

pub const MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// The files a model directory holds, in manifest order.
pub const FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// `$EPHEM_MODEL_DIR`, else the project's `.ephem/models/all-MiniLM-L6-v2`.
pub fn model_dir() -> PathBuf {
    std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../.ephem/models/all-MiniLM-L6-v2").into())
}

/// The model's files, read whole; a missing one names the script that fetches them.
pub fn read_files(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    FILES
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(name))
                .unwrap_or_else(|e| panic!("{}/{name}: {e} (run scripts/setup-model.sh)", dir.display()));
            (name, bytes)
        })
        .collect()
}

/// The manifest of these files for version `version` of the default model (384 dimensions, mean
/// pooling, normalised, 256 tokens), its data key wrapped as `wrapped_dek` under `kms_key_id`.
pub fn manifest(version: u64, files: &[(&str, Vec<u8>)], kms_key_id: &str, wrapped_dek: Vec<u8>, created_ms: u64) -> Manifest {
    Manifest {
        model_id: MODEL_ID.into(),
        version,
        files: files
            .iter()
            .map(|(name, bytes)| ModelFile { name: (*name).into(), sha256: Sha256::digest(bytes).into(), size: bytes.len() as u64 })
            .collect(),
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: kms_key_id.into(),
        wrapped_dek,
        created_ms,
    }
}

/// Each file sealed under `dek` for `manifest`: (name, ciphertext), in manifest order.
pub fn seal(manifest: &Manifest, dek: &[u8; 32], files: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    files.iter().map(|(name, bytes)| ((*name).to_owned(), manifest.seal_file(dek, name, bytes))).collect()
}
