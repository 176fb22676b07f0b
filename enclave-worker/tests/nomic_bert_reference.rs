//! NomicBERT (nomic-embed-text's body: post-norm LayerNorm, rotary positions, SwiGLU, no linear
//! biases) in the fused encoder, against sentence-transformers' own `encode()` on a tiny random
//! checkpoint (`tests/testdata/models/nomic_bert/`, written by `scripts/make_test_models.py --only
//! nomic_bert`): both folders (the classic form cut at 2,048 tokens, the 6.x form at 1,000), every
//! text with no prompt and each of nomic-embed-text's prompts, at fp32 and bf16.

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
const FOLDERS: [&str; 2] = ["classic-mean", "v6-mean"];

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(support::matrix_dir().join("nomic_bert/reference.json")).unwrap()).unwrap()
}

/// One folder loaded as the enclave loads a model: its config, the shared weights and tokenizer,
/// mean pooling and the folder's length.
fn engine(entry: &Value, folder: &str, limits: BatchLimits) -> Engine {
    let dir = support::matrix_dir().join("nomic_bert");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("nomic_bert/{name}: {e}"));
    let (config, tokenizer, weights) = (read(&format!("{folder}/config.json")), read("tokenizer.json"), read("model.safetensors"));
    assert_eq!(entry["pooling"], "mean");
    let settings = EmbedderSettings {
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: entry["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(36),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)
        .unwrap_or_else(|e| panic!("nomic_bert/{folder}: {e}"));
    assert_eq!(embedder.architecture(), Architecture::NomicBert);
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
}


#[test]
fn nomic_bert_embeds_as_sentence_transformers_does() {
    let reference = reference();
    let arch = &reference["architectures"]["nomic_bert"];
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    for folder in FOLDERS {
        let entry = &arch["folders"][folder];
        let limit = entry["max_seq_length"].as_u64().unwrap() as u32;
        let engine = engine(entry, folder, BatchLimits::default());
        let runs = prompt_runs(entry);
        for (name, prompt) in runs {
            let cases = matrix_cases(&reference, "nomic_bert", folder, &name);
            assert!(cases.iter().any(|c| c.truncated && c.tokens == limit), "{folder} {name:?}: a text cut at {limit}");
            let label = format!("nomic_bert/{folder} prompt {name:?}");
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
        assert!(matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture: "nomic_bert" }), "{err}");
    }
}

/// Packing changes nothing: rotary places and means are per sequence.
#[test]
fn nomic_bert_packing_does_not_change_vectors() {
    let reference = reference();
    let entry = &reference["architectures"]["nomic_bert"]["folders"]["v6-mean"];
    let cases = matrix_cases(&reference, "nomic_bert", "v6-mean", "");
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let one = engine(entry, "v6-mean", BatchLimits { max_batch_size: 1, ..Default::default() });
    let many = engine(entry, "v6-mean", BatchLimits { max_batch_size: 64, max_padded_tokens: 1 << 16 });
    let options = EmbedOptions::default();
    let alone = one.embed_window(&texts, &options);
    let packed = many.embed_window(&texts, &options);
    assert!(many.metrics().batches < one.metrics().batches);
    for (case, (a, b)) in cases.iter().zip(alone.into_iter().zip(packed)) {
        let (a, b) = (a.unwrap().vector, b.unwrap().vector);
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "{}: {diff}", case.name);
    }
}
