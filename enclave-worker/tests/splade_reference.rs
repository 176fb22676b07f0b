//! SPLADE sparse output in the fused encoder against sentence-transformers' own `SparseEncoder`
//! on a tiny random checkpoint (`tests/testdata/outputs/splade/`, written by
//! `scripts/make_output_models.py`): every text (many scripts, texts cut at 512 tokens), every
//! nonzero weight at the same token id within 1e-5, and `top_k` equal to `max_active_dims`.

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles};
use protocol::envelope::{OutputDtype, OutputKind, Precision};
use protocol::manifest::Pooling;
use protocol::records::{OutputRecord, SparseVector, Vector};
use serde_json::Value;

const WEIGHT_TOLERANCE: f32 = 1e-5;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("splade-reference.json")).unwrap()).unwrap()
}

fn engine(reference: &Value, pooling: Pooling) -> Result<Engine, InferenceError> {
    let read = |name: &str| std::fs::read(dir().join("splade").join(name)).unwrap();
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings {
        pooling,
        normalize: false,
        max_tokens: reference["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(reference["dimensions"].as_u64().unwrap() as usize),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)?;
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() })
}

fn pairs(value: &Value) -> (Vec<u32>, Vec<f32>) {
    value.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32)).unzip()
}

/// The same token ids, each weight within the tolerance; the largest difference.
fn compare(ours: &SparseVector, expected: &Value, label: &str) -> f32 {
    let (indices, values) = pairs(expected);
    assert_eq!(ours.indices, indices, "{label}: token ids");
    let worst = ours.values.iter().zip(&values).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= WEIGHT_TOLERANCE, "{label}: a weight differs by {worst}");
    worst
}

#[test]
fn splade_weights_equal_sentence_transformers() {
    let reference = reference();
    let engine = engine(&reference, Pooling::Splade).unwrap();
    let texts: Vec<&Value> = reference["texts"].as_array().unwrap().iter().collect();
    let inputs: Vec<&str> = texts.iter().map(|t| t["text"].as_str().unwrap()).collect();
    assert!(texts.iter().any(|t| t["truncated"].as_bool().unwrap()), "a text cut at the model's length");
    let top_k = reference["top_k"].as_u64().unwrap() as u32;
    let (mut worst, mut active) = (0f32, Vec::new());
    for (k, field) in [(None, "sparse"), (Some(top_k), "top_k")] {
        let options = EmbedOptions { normalize: false, output: OutputKind::Sparse, top_k: k, ..Default::default() };
        for (text, result) in texts.iter().zip(engine.embed_window(&inputs, &options)) {
            let name = text["name"].as_str().unwrap();
            let embedding = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(u64::from(embedding.tokens), text["tokens"].as_u64().unwrap(), "{name}: token count");
            let OutputRecord::Embedding { vector: Vector::Sparse(sparse), .. } = embedding.into_output(name.into(), OutputDtype::F32, &options) else {
                panic!("{name}: not a sparse record");
            };
            assert_eq!(sparse.dimensions as u64, reference["dimensions"].as_u64().unwrap());
            worst = worst.max(compare(&sparse, &text[field], &format!("{name} {field}")));
            active.push(sparse.indices.len());
        }
    }
    eprintln!("splade: {} texts, {} to {} weights each, largest difference {worst:e}", texts.len(), active.iter().min().unwrap(), active.iter().max().unwrap());
}

/// bf16 computes the body at bf16 (the head stays f32): the same weights within bf16's bound.
#[test]
fn splade_at_bf16_stays_close() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("splade bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let reference = reference();
    let engine = engine(&reference, Pooling::Splade).unwrap();
    let texts: Vec<&str> = reference["texts"].as_array().unwrap().iter().map(|t| t["text"].as_str().unwrap()).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Sparse, precision: Precision::Bf16, ..Default::default() };
    let mut lowest = f64::MAX;
    for (text, result) in reference["texts"].as_array().unwrap().iter().zip(engine.embed_window(&texts, &options)) {
        let (indices, values) = pairs(&text["sparse"]);
        let expected = SparseVector { dimensions: reference["dimensions"].as_u64().unwrap() as u32, indices, values }.to_dense();
        let ours = result.unwrap().vector;
        let dot: f64 = ours.iter().zip(&expected).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        lowest = lowest.min(dot / (norm(&ours) * norm(&expected)));
    }
    assert!(lowest >= 0.999, "bf16: lowest cosine {lowest}");
    eprintln!("splade bf16: lowest cosine {lowest:.5}");
}

/// A SPLADE head is a BERT masked-language-model head: a mean-pooled model asked for it, or a
/// checkpoint without `cls.predictions`, is refused by name.
#[test]
fn splade_needs_the_masked_language_model_head() {
    let reference = reference();
    let models = dir().parent().unwrap().join("models/mpnet");
    let read = |name: &str| std::fs::read(models.join(name)).unwrap();
    let settings = EmbedderSettings { pooling: Pooling::Splade, normalize: false, max_tokens: 128, dimensions: None, backend: Backend::Fused };
    let (config, tokenizer, weights) = (read("classic-mean/config.json"), read("tokenizer.json"), read("model.safetensors"));
    let err = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings).unwrap_err();
    assert!(matches!(err, InferenceError::UnsupportedArchitecture(_)), "{err}");
    // The SPLADE checkpoint pooled by its mean gives one dense vector of its hidden size.
    let err = engine(&reference, Pooling::Mean).unwrap_err();
    assert!(err.to_string().contains("the model's vectors have 24"), "{err}");
}
