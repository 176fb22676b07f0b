//! Qwen3 (a causal decoder pooled by its last token: Qwen3-Embedding's body) in the fused encoder,
//! against sentence-transformers' own `encode()` on a tiny random checkpoint
//! (`tests/testdata/models/qwen3/`, written by `scripts/make_test_models.py --only qwen3`): both
//! folders (the published Qwen3-Embedding layout, cut at 8,192 tokens, and the 6.x form, cut at
//! 1,000), every text (many scripts, typed special tokens, texts past each limit) with no prompt
//! and each prompt (the query instruction and the empty document prompt), at fp32 and bf16.

mod support;

use std::sync::Arc;

use enclave_worker::inference::{
    Architecture, Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings,
    InferenceError, ModelFiles,
};
use protocol::envelope::Precision;
use protocol::manifest::Pooling;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use support::{check_cases, cosine, matrix_cases, prompt_runs};

const F32_MIN_COSINE: f64 = 0.99999;
const BF16_MIN_COSINE: f64 = 0.999;
const FOLDERS: [&str; 2] = ["classic-last", "v6-last"];

fn reference() -> Value {
    let path = support::matrix_dir().join("qwen3/reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// One folder loaded as the enclave loads a model: its config, the shared weights and tokenizer,
/// last-token pooling and the folder's length.
fn engine(entry: &Value, folder: &str, limits: BatchLimits) -> Engine {
    engine_with(entry, folder, limits, &read("model.safetensors"))
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(support::matrix_dir().join("qwen3").join(name)).unwrap_or_else(|e| panic!("qwen3/{name}: {e}"))
}

/// [`engine`] over other weights (the same tensors stored another way).
fn engine_with(entry: &Value, folder: &str, limits: BatchLimits, weights: &[u8]) -> Engine {
    let (config, tokenizer) = (read(&format!("{folder}/config.json")), read("tokenizer.json"));
    assert_eq!(entry["pooling"], "lasttoken");
    let settings = EmbedderSettings {
        pooling: Pooling::LastToken,
        normalize: entry["normalize"].as_bool().unwrap(),
        max_tokens: entry["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(48),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights, dense: &[] }, settings)
        .unwrap_or_else(|e| panic!("qwen3/{folder}: {e}"));
    assert_eq!(embedder.architecture(), Architecture::Qwen3);
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
}


#[test]
fn qwen3_embeds_as_sentence_transformers_does() {
    let reference = reference();
    let arch = &reference["architectures"]["qwen3"];
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    for folder in FOLDERS {
        let entry = &arch["folders"][folder];
        let limit = entry["max_seq_length"].as_u64().unwrap() as u32;
        let engine = engine(entry, folder, BatchLimits::default());
        let runs = prompt_runs(entry);
        for (name, prompt) in runs {
            let cases = matrix_cases(&reference, "qwen3", folder, &name);
            assert!(cases.iter().any(|c| c.truncated && c.tokens == limit), "{folder} {name:?}: a text cut at {limit}");
            assert!(cases.iter().filter(|c| c.tokens > 500).count() >= 3, "{folder} {name:?}: long texts");
            let label = format!("qwen3/{folder} prompt {name:?}");
            let options = EmbedOptions { prompt: prompt.clone(), normalize: true, ..Default::default() };
            let (lowest, at) = check_cases(&engine, &cases, &options, F32_MIN_COSINE, &label);
            eprintln!("{label} f32: lowest cosine {lowest:.7} ({at})");
            if bf16 {
                let options = EmbedOptions { precision: Precision::Bf16, ..options };
                let (lowest, at) = check_cases(&engine, &cases, &options, BF16_MIN_COSINE, &label);
                eprintln!("{label} bf16: lowest cosine {lowest:.7} ({at})");
            }
        }
        // int8's bound is measured on BERT only: refused by name.
        let err = engine.embedder().check_precision(Precision::Int8).unwrap_err();
        assert!(matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture: "qwen3" }), "{err}");
    }
    if !bf16 {
        eprintln!("qwen3 bf16: skipped, this CPU has no AVX-512 BF16");
    }
}

/// Packing changes nothing: causal masks, rotary places and last tokens are per sequence, so each
/// text alone and all of them packed together give the same vectors.
#[test]
fn qwen3_packing_does_not_change_vectors() {
    let reference = reference();
    let entry = &reference["architectures"]["qwen3"]["folders"]["v6-last"];
    let cases = matrix_cases(&reference, "qwen3", "v6-last", "");
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let one = engine(entry, "v6-last", BatchLimits { max_batch_size: 1, ..Default::default() });
    let many = engine(entry, "v6-last", BatchLimits { max_batch_size: 64, max_padded_tokens: 1 << 16 });
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

/// The checkpoint's tensors rounded to a 16-bit float (as torch's `.to(dtype)` rounds: to nearest,
/// ties to even), stored in it, and the same values stored as f32.
fn rounded_copies(weights: &[u8], dtype: Dtype, round: fn(f32) -> [u8; 2], widen: fn([u8; 2]) -> f32) -> (Vec<u8>, Vec<u8>) {
    let file = SafeTensors::deserialize(weights).unwrap();
    let (mut narrow, mut wide) = (Vec::new(), Vec::new());
    for (name, view) in file.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "{name}");
        let halves: Vec<[u8; 2]> = view.data().chunks_exact(4).map(|b| round(f32::from_le_bytes(b.try_into().unwrap()))).collect();
        let widened: Vec<u8> = halves.iter().flat_map(|&h| widen(h).to_le_bytes()).collect();
        narrow.push((name.clone(), view.shape().to_vec(), halves.concat()));
        wide.push((name, view.shape().to_vec(), widened));
    }
    let store = |tensors: &[(String, Vec<usize>, Vec<u8>)], dtype: Dtype| {
        let views = tensors.iter().map(|(name, shape, data)| (name.clone(), TensorView::new(dtype, shape.clone(), data).unwrap()));
        safetensors::serialize(views, None).unwrap()
    };
    (store(&narrow, dtype), store(&wide, Dtype::F32))
}

/// Qwen3-Embedding ships its weights in bf16: a bf16 (or f16) checkpoint is read by widening each
/// value to f32, which is exact, so it embeds bit for bit as the f32 checkpoint of the same values,
/// and within rounding of the f32 reference.
#[test]
fn qwen3_reads_bf16_and_f16_checkpoints() {
    let reference = reference();
    let entry = &reference["architectures"]["qwen3"]["folders"]["v6-last"];
    let cases = matrix_cases(&reference, "qwen3", "v6-last", "");
    let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
    let weights = read("model.safetensors");
    let copies = [
        ("bf16", rounded_copies(&weights, Dtype::BF16, |v| half::bf16::from_f32(v).to_le_bytes(), |b| half::bf16::from_le_bytes(b).to_f32())),
        ("f16", rounded_copies(&weights, Dtype::F16, |v| half::f16::from_f32(v).to_le_bytes(), |b| half::f16::from_le_bytes(b).to_f32())),
    ];
    for (label, (narrow, wide)) in copies {
        assert!(narrow.len() < wide.len() * 6 / 10, "{label}: stored in two bytes a value");
        let options = EmbedOptions::default();
        let stored = engine_with(entry, "v6-last", BatchLimits::default(), &narrow).embed_window(&texts, &options);
        let widened = engine_with(entry, "v6-last", BatchLimits::default(), &wide).embed_window(&texts, &options);
        let mut lowest = f64::MAX;
        for (case, (a, b)) in cases.iter().zip(stored.into_iter().zip(widened)) {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.vector, b.vector, "{label} {}: the stored and the widened checkpoint differ", case.name);
            assert_eq!(a.tokens, case.tokens, "{label} {}", case.name);
            lowest = lowest.min(cosine(&a.vector, &case.vector));
        }
        // Rounding the weights moves the vectors a little from the f32 reference, not far.
        assert!(lowest > 0.99, "{label}: lowest cosine {lowest} to the f32 checkpoint's reference");
        eprintln!("qwen3 {label} checkpoint: bit-equal to its values in f32; lowest cosine to the f32 reference {lowest:.5}");
    }
}
