//! What the reference tests share: a reference case as the generator scripts write it, and cosine.
#![allow(dead_code)] // each test file uses part of it

use std::path::PathBuf;

/// One text with sentence-transformers' token count, truncation and vector.
pub struct Case {
    pub name: String,
    pub text: String,
    pub tokens: u32,
    pub truncated: bool,
    pub vector: Vec<f32>,
}

fn floats(value: &serde_json::Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

/// The `cases` array of a reference file.
pub fn cases(reference: &serde_json::Value) -> Vec<Case> {
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_owned(),
            text: c["text"].as_str().unwrap().to_owned(),
            tokens: c["tokens"].as_u64().unwrap() as u32,
            truncated: c["truncated"].as_bool().unwrap(),
            vector: floats(&c["vector"]),
        })
        .collect()
}

/// The model matrix (`tests/testdata/models/`, written by `scripts/make_test_models.py`).
pub fn matrix_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/models"))
}

pub fn matrix_reference() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(matrix_dir().join("reference.json")).unwrap()).unwrap()
}

/// The texts of the matrix with one folder's run (`""`: no prompt, else a prompt's name).
pub fn matrix_cases(reference: &serde_json::Value, arch: &str, folder: &str, run: &str) -> Vec<Case> {
    let run = &reference["architectures"][arch]["folders"][folder]["runs"][run];
    let texts = reference["texts"].as_array().unwrap();
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| Case {
            name: t["name"].as_str().unwrap().to_owned(),
            text: t["text"].as_str().unwrap().to_owned(),
            tokens: run["tokens"][i].as_u64().unwrap() as u32,
            truncated: run["truncated"][i].as_bool().unwrap(),
            vector: floats(&run["vectors"][i]),
        })
        .collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Every case embedded by `engine` with `options`: at the reference's token count and at cosine
/// `bound` to its vector (panicking with `label` otherwise); the lowest cosine and where.
pub fn check_cases(
    engine: &enclave_worker::inference::Engine,
    cases: &[Case],
    options: &enclave_worker::inference::EmbedOptions,
    bound: f64,
    label: &str,
) -> (f64, String) {
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let mut lowest = (f64::MAX, String::new());
    for (case, result) in cases.iter().zip(engine.embed_window(&texts, options)) {
        let embedding = result.unwrap_or_else(|e| panic!("{label} {}: {e}", case.name));
        assert_eq!(embedding.tokens, case.tokens, "{label} {}: token count", case.name);
        let similarity = cosine(&embedding.vector, &case.vector);
        assert!(similarity >= bound, "{label} {} ({} tokens): cosine {similarity}", case.name, case.tokens);
        if similarity < lowest.0 {
            lowest = (similarity, format!("{}, {} tokens", case.name, case.tokens));
        }
    }
    lowest
}

/// A folder's runs: no prompt (`""`), then each of its prompts by name with its text.
pub fn prompt_runs(entry: &serde_json::Value) -> Vec<(String, Option<std::sync::Arc<str>>)> {
    let mut runs = vec![(String::new(), None)];
    for (name, text) in entry["prompts"].as_object().unwrap() {
        runs.push((name.clone(), Some(std::sync::Arc::<str>::from(text.as_str().unwrap()))));
    }
    runs
}
