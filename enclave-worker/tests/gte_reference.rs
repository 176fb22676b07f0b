//! GTE (Alibaba's GTE v1.5 / mGTE encoder: post-norm LayerNorm, rotary positions, biased attention,
//! a gated erf-GELU feed-forward, token type 0) in the fused encoder, against sentence-transformers'
//! own `encode()` on a tiny random checkpoint (`tests/testdata/models/gte/`, written by
//! `scripts/make_test_models.py --only gte`): both folders (the classic form with CLS pooling cut at
//! 2,048 tokens, the 6.x form with mean pooling at 1,000), every text with no prompt and each
//! prompt, at fp32 and bf16.

mod support;

use std::sync::Arc;

use enclave_worker::inference::{
    Architecture, Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError,
    ModelFiles,
};
use protocol::envelope::Precision;
use protocol::manifest::Pooling;
use serde_json::Value;
use support::{check_cases, matrix_cases, prompt_runs};

const F32_MIN_COSINE: f64 = 0.99999;
const BF16_MIN_COSINE: f64 = 0.999;
const FOLDERS: [&str; 2] = ["classic-cls", "v6-mean"];

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(support::matrix_dir().join("gte/reference.json")).unwrap()).unwrap()
}

/// One folder loaded as the enclave loads a model: its config, the shared weights and tokenizer,
/// the folder's pooling, normalisation and length.
fn engine(entry: &Value, folder: &str, limits: BatchLimits) -> Engine {
    let dir = support::matrix_dir().join("gte");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("gte/{name}: {e}"));
    let (config, tokenizer, weights) = (read(&format!("{folder}/config.json")), read("tokenizer.json"), read("model.safetensors"));
    let pooling = match entry["pooling"].as_str().unwrap() {
        "cls" => Pooling::Cls,
        "mean" => Pooling::Mean,
        other => panic!("gte/{folder}: pooling {other}"),
    };
    let settings = EmbedderSettings {
        pooling,
        normalize: entry["normalize"].as_bool().unwrap(),
        max_tokens: entry["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(40),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)
        .unwrap_or_else(|e| panic!("gte/{folder}: {e}"));
    assert_eq!(embedder.architecture(), Architecture::Gte);
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
}


#[test]
fn gte_embeds_as_sentence_transformers_does() {
    let reference = reference();
    let arch = &reference["architectures"]["gte"];
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    if !bf16 {
        eprintln!("gte: this CPU lacks AVX-512 BF16, bf16 not checked");
    }
    for folder in FOLDERS {
        let entry = &arch["folders"][folder];
        let limit = entry["max_seq_length"].as_u64().unwrap() as u32;
        let engine = engine(entry, folder, BatchLimits::default());
        let runs = prompt_runs(entry);
        assert_eq!(runs.len(), 3, "{folder}: no prompt, query, document");
        for (name, prompt) in runs {
            let cases = matrix_cases(&reference, "gte", folder, &name);
            assert!(cases.iter().any(|c| c.truncated && c.tokens == limit), "{folder} {name:?}: a text cut at {limit}");
            let label = format!("gte/{folder} prompt {name:?}");
            let options = EmbedOptions { prompt: prompt.clone(), normalize: true, ..Default::default() };
            let (lowest, at) = check_cases(&engine, &cases, &options, F32_MIN_COSINE, &label);
            eprintln!("{label} f32: lowest cosine {lowest:.7} ({at})");
            if bf16 {
                let options = EmbedOptions { precision: Precision::Bf16, ..options };
                let (lowest, at) = check_cases(&engine, &cases, &options, BF16_MIN_COSINE, &label);
                eprintln!("{label} bf16: lowest cosine {lowest:.7} ({at})");
            }
        }
        let err = engine.embedder().check_precision(Precision::Int8).unwrap_err();
        assert!(matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture: "gte" }), "{err}");
    }
}

/// Packing changes nothing: rotary places, CLS and means are per sequence.
#[test]
fn gte_packing_does_not_change_vectors() {
    let reference = reference();
    for folder in FOLDERS {
        let entry = &reference["architectures"]["gte"]["folders"][folder];
        let cases = matrix_cases(&reference, "gte", folder, "");
        let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
        let one = engine(entry, folder, BatchLimits { max_batch_size: 1, ..Default::default() });
        let many = engine(entry, folder, BatchLimits { max_batch_size: 64, max_padded_tokens: 1 << 16 });
        let options = EmbedOptions::default();
        let alone = one.embed_window(&texts, &options);
        let packed = many.embed_window(&texts, &options);
        assert!(many.metrics().batches < one.metrics().batches);
        for (case, (a, b)) in cases.iter().zip(alone.into_iter().zip(packed)) {
            let (a, b) = (a.unwrap().vector, b.unwrap().vector);
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-5, "{folder} {}: {diff}", case.name);
        }
    }
}
