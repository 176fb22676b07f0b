//! The model matrix (`tests/testdata/models/`, written by `scripts/make_test_models.py`): per
//! architecture one random checkpoint, saved in four folders (classic and 6.x configuration
//! forms × mean and CLS pooling) that share its weights and tokenizer, and sentence-transformers'
//! reference vectors and token counts for every folder and prompt.
#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

pub const ARCHITECTURES: [&str; 3] = ["bert", "xlm-roberta", "mpnet"];
pub const FOLDERS: [&str; 4] = ["classic-mean", "classic-cls", "v6-mean", "v6-cls"];

pub fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/models")
}

pub fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("reference.json")).unwrap()).unwrap()
}

/// `reference.json`'s entry for one folder.
pub fn folder<'a>(reference: &'a Value, arch: &str, folder: &str) -> &'a Value {
    let entry = &reference["architectures"][arch]["folders"][folder];
    assert!(entry.is_object(), "{arch}/{folder}: not in reference.json");
    entry
}

/// (name, text) of every reference text, in order.
pub fn texts(reference: &Value) -> Vec<(String, String)> {
    reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_owned(), t["text"].as_str().unwrap().to_owned()))
        .collect()
}

/// sentence-transformers' token counts and vectors for one folder and prompt (`""`: none).
pub struct Run {
    pub tokens: Vec<u64>,
    pub vectors: Vec<Vec<f32>>,
}

pub fn run(reference: &Value, arch: &str, name: &str, prompt: &str) -> Run {
    let entry = &folder(reference, arch, name)["runs"][prompt];
    assert!(entry.is_object(), "{arch}/{name}: no run for prompt {prompt:?}");
    Run {
        tokens: entry["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect(),
        vectors: entry["vectors"].as_array().unwrap().iter().map(floats).collect(),
    }
}

/// The prompt names a folder has reference vectors for (its signed prompts with text).
pub fn prompt_names(reference: &Value, arch: &str, name: &str) -> Vec<String> {
    folder(reference, arch, name)["prompts"].as_object().unwrap().keys().cloned().collect()
}

/// The tokenizer the generator used: BERT's is the installed all-MiniLM-L6-v2 one (not
/// committed), the others' are beside their weights. Both checked by SHA-256.
pub fn tokenizer(reference: &Value, arch: &str) -> Vec<u8> {
    let path = if arch == "bert" { tests::model_dir().join("tokenizer.json") } else { data().join(arch).join("tokenizer.json") };
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup-model.sh", path.display()));
    let expected = reference["architectures"][arch]["tokenizer_sha256"].as_str().unwrap();
    assert_eq!(hex::encode(Sha256::digest(&bytes)), expected, "{arch}: the generator's tokenizer");
    bytes
}

/// One folder with its architecture's weights and tokenizer: a model directory.
pub fn assemble(arch: &str, name: &str, tokenizer: &[u8], dir: &Path) {
    copy_dir(&data().join(arch).join(name), dir);
    std::fs::copy(data().join(arch).join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

pub fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "vector lengths");
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

pub fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
}

/// ModernBERT's part of the matrix (`testdata/models/modernbert/`): its own reference file, with
/// the same layout as `reference.json` and one more text, cut at 8,192 tokens.
pub const MODERNBERT_FOLDERS: [&str; 2] = ["v6-mean", "classic-cls"];

pub fn modernbert_reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("modernbert/reference.json")).unwrap()).unwrap()
}

/// Qwen3's part (`testdata/models/qwen3/`): its own reference file, the same layout, two folders
/// with last-token pooling and Qwen3-Embedding's prompts.
pub const QWEN3_FOLDERS: [&str; 2] = ["classic-last", "v6-last"];

pub fn qwen3_reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("qwen3/reference.json")).unwrap()).unwrap()
}

/// Gemma 3's part (`testdata/models/gemma3/`): its own reference file, the same layout, two
/// folders with mean pooling, two Dense modules and EmbeddingGemma's prompts.
pub const GEMMA3_FOLDERS: [&str; 2] = ["classic-mean", "v6-mean"];

pub fn gemma3_reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("gemma3/reference.json")).unwrap()).unwrap()
}

/// NomicBERT's part (`testdata/models/nomic_bert/`): its own reference file, the same layout, two
/// folders with mean pooling and nomic-embed-text's prompts.
pub const NOMIC_FOLDERS: [&str; 2] = ["classic-mean", "v6-mean"];

pub fn nomic_reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("nomic_bert/reference.json")).unwrap()).unwrap()
}

/// GTE's part (`testdata/models/gte/`): its own reference file, the same layout, two folders (CLS
/// without Normalize as gte-base-en-v1.5, mean with Normalize and a default prompt).
pub const GTE_FOLDERS: [&str; 2] = ["classic-cls", "v6-mean"];

pub fn gte_reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("gte/reference.json")).unwrap()).unwrap()
}
