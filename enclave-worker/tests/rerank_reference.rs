//! A cross-encoder in the fused encoder against sentence-transformers' own `CrossEncoder` on a
//! tiny random checkpoint (`tests/testdata/outputs/rerank/`, written by
//! `scripts/make_output_models.py rerank`): every query's scores for the matrix's 24 texts within
//! 1e-4, `rank()`'s order, and every pair's token count (pairs past 128 tokens cut longest-first).

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles};
use protocol::envelope::{OutputKind, Precision};
use protocol::manifest::Pooling;
use protocol::records::{ErrorCode, RerankInput};
use serde_json::Value;

const SCORE_TOLERANCE: f32 = 1e-4;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("rerank-reference.json")).unwrap()).unwrap()
}

fn engine(reference: &Value, pooling: Pooling) -> Result<Engine, InferenceError> {
    let read = |name: &str| std::fs::read(dir().join("rerank").join(name)).unwrap();
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings {
        pooling,
        normalize: false,
        max_tokens: reference["max_length"].as_u64().unwrap() as usize,
        dimensions: Some(36),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)?;
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() })
}

fn records(reference: &Value) -> Vec<Vec<u8>> {
    let documents: Vec<String> = serde_json::from_value(reference["documents"].clone()).unwrap();
    reference["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| RerankInput { query: q["query"].as_str().unwrap().to_owned(), documents: documents.clone() }.to_text())
        .collect()
}

/// Indices by descending score (of equal scores the lower index first, as a stable sort).
fn order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

#[test]
fn rerank_scores_equal_cross_encoder() {
    let reference = reference();
    let engine = engine(&reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let texts = records(&reference);
    let texts: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, ..Default::default() };
    let mut worst = 0f32;
    for (case, result) in reference["queries"].as_array().unwrap().iter().zip(engine.rerank_window(&texts, &options)) {
        let query = case["query"].as_str().unwrap();
        let scored = result.unwrap_or_else(|e| panic!("{query}: {e:?}"));
        let expected: Vec<f32> = case["scores"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        for (i, (a, b)) in scored.vector.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= SCORE_TOLERANCE, "{query} document {i}: {a} against {b}");
            worst = worst.max((a - b).abs());
        }
        let want: Vec<usize> = case["order"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(order(&scored.vector), want, "{query}: rank()'s order");
        let tokens: Vec<u64> = case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(u64::from(scored.tokens), tokens.iter().sum::<u64>(), "{query}: the pairs' tokens");
        for (document, &n) in reference["documents"].as_array().unwrap().iter().zip(&tokens) {
            let pair = engine.embedder().tokenize_pair(query, document.as_str().unwrap(), true).unwrap();
            assert_eq!(pair.tokens() as u64, n, "{query}: a pair's token count");
        }
    }
    eprintln!("rerank: {} queries x 24 documents, largest score difference {worst:e}", texts.len());
}

/// bf16 (the body at bf16, the head f32) keeps the scores close.
#[test]
fn rerank_at_bf16_stays_close() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("rerank bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let reference = reference();
    let engine = engine(&reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let texts = records(&reference);
    let texts: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, precision: Precision::Bf16, ..Default::default() };
    let mut worst = 0f32;
    for (case, result) in reference["queries"].as_array().unwrap().iter().zip(engine.rerank_window(&texts, &options)) {
        for (a, b) in result.unwrap().vector.iter().zip(case["scores"].as_array().unwrap()) {
            worst = worst.max((a - b.as_f64().unwrap() as f32).abs());
        }
    }
    assert!(worst < 0.01, "bf16: a score differs by {worst}");
    eprintln!("rerank bf16: largest score difference {worst:.5}");
}

/// The logit form gives the sigmoid's inverse; bad records fail alone, by name; a BERT
/// cross-encoder is refused by name.
#[test]
fn rerank_logits_bad_records_and_refusals() {
    let reference = reference();
    let texts = records(&reference);
    let first: Vec<&[u8]> = vec![texts[0].as_slice()];
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, ..Default::default() };
    let logits = engine(&reference, Pooling::Rerank { sigmoid: false }).unwrap().rerank_window(&first, &options).remove(0).unwrap();
    for (logit, score) in logits.vector.iter().zip(reference["queries"][0]["scores"].as_array().unwrap()) {
        let sigmoid = 1.0 / (1.0 + (-logit).exp());
        assert!((sigmoid - score.as_f64().unwrap() as f32).abs() <= SCORE_TOLERANCE);
    }

    let engine = engine(&reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let bad: Vec<&[u8]> = vec![b"not json", br#"{"query": "q", "documents": []}"#, br#"{"query": " ", "documents": ["d"]}"#, br#"{"query": "q", "documents": ["d"], "top_n": 1}"#, texts[1].as_slice()];
    let results = engine.rerank_window(&bad, &options);
    let codes: Vec<Option<ErrorCode>> = results.iter().map(|r| r.as_ref().err().map(|f| f.code)).collect();
    assert_eq!(codes, [Some(ErrorCode::InvalidJson), Some(ErrorCode::MissingText), Some(ErrorCode::EmptyText), Some(ErrorCode::InvalidJson), None]);
    assert_eq!(results[4].as_ref().unwrap().vector.len(), 24, "the good record beside them is scored");

    let models = dir().parent().unwrap().join("models/bert");
    let config = std::fs::read(models.join("classic-cls/config.json")).unwrap();
    let weights = std::fs::read(models.join("model.safetensors")).unwrap();
    let tokenizer = std::fs::read(dir().join("rerank/tokenizer.json")).unwrap();
    let settings = EmbedderSettings { pooling: Pooling::Rerank { sigmoid: true }, normalize: false, max_tokens: 128, dimensions: None, backend: Backend::Fused };
    let err = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings).unwrap_err();
    assert!(err.to_string().contains("token type 1"), "{err}");
}
