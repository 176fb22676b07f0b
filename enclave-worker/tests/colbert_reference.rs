//! ColBERT multi-vector output in the fused encoder against sentence-transformers' own
//! `MultiVectorEncoder` on a tiny random checkpoint (`tests/testdata/outputs/colbert/`, written by
//! `scripts/make_output_models.py`): every text (many scripts, one cut at 512 tokens) gives one
//! vector per token, the same count, each unit-length and at cosine ≥ 0.9999 to the reference's
//! vector at the same position. A record over the job's byte bound fails alone.

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, DenseFiles, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles, MultiVectorOutput};
use protocol::envelope::{OutputDtype, OutputKind, Precision};
use protocol::manifest::Pooling;
use protocol::records::{ErrorCode, OutputRecord, Vector};
use serde_json::Value;

const MIN_COSINE: f64 = 0.9999;
/// bf16's bound, as for the other heads (the body's products round to 8 bits of mantissa).
const MIN_COSINE_BF16: f64 = 0.999;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("colbert-reference.json")).unwrap()).unwrap()
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join("colbert").join(name)).unwrap()
}

fn engine(reference: &Value, pooling: Pooling, dense_config: &[u8]) -> Result<Engine, InferenceError> {
    let (config, tokenizer, weights, dense) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"), read("1_Dense/model.safetensors"));
    let settings = EmbedderSettings {
        pooling,
        normalize: false,
        max_tokens: reference["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(reference["dimensions"].as_u64().unwrap() as usize),
        backend: Backend::Fused,
    };
    let dense = [DenseFiles { config: dense_config, weights: &dense }];
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &dense }, settings)?;
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() })
}

fn options(reference: &Value, precision: Precision, max_record_bytes: u32) -> EmbedOptions {
    let dimensions = reference["dimensions"].as_u64().unwrap() as usize;
    EmbedOptions {
        normalize: false,
        output: OutputKind::MultiVector,
        precision,
        multivector: Some(MultiVectorOutput { dimensions, max_record_bytes }),
        ..Default::default()
    }
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let norm_a = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let norm_b = b.iter().map(|x| x.powi(2)).sum::<f64>().sqrt();
    dot / (norm_a * norm_b)
}

/// Every text's records against the reference: (lowest cosine, largest |norm − 1|, counts).
fn compare(reference: &Value, precision: Precision, min_cosine: f64) -> (f64, f64, Vec<usize>) {
    let engine = engine(reference, Pooling::MultiVector, &read("1_Dense/config.json")).unwrap();
    let texts: Vec<&Value> = reference["texts"].as_array().unwrap().iter().collect();
    let inputs: Vec<&str> = texts.iter().map(|t| t["text"].as_str().unwrap()).collect();
    let options = options(reference, precision, 1 << 20);
    let (mut lowest, mut worst_norm, mut counts) = (f64::MAX, 0f64, Vec::new());
    for (text, result) in texts.iter().zip(engine.embed_window(&inputs, &options)) {
        let name = text["name"].as_str().unwrap();
        let embedding = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens = text["tokens"].as_u64().unwrap();
        assert_eq!(u64::from(embedding.tokens), tokens, "{name}: token count");
        let OutputRecord::Embedding { vector: Vector::Multi(multi), .. } = embedding.into_output(name.into(), OutputDtype::F32, &options) else {
            panic!("{name}: not a multi-vector record");
        };
        let expected = text["vectors"].as_array().unwrap();
        assert_eq!(multi.count(), expected.len(), "{name}: vector count");
        assert_eq!(multi.count() as u64, tokens, "{name}: one vector per token");
        for (i, (ours, theirs)) in multi.rows().zip(expected).enumerate() {
            let theirs: Vec<f64> = theirs.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let c = cosine(ours, &theirs);
            assert!(c >= min_cosine, "{name} token {i}: cosine {c} at {precision:?}");
            lowest = lowest.min(c);
            let norm = ours.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            worst_norm = worst_norm.max((norm - 1.0).abs());
        }
        counts.push(multi.count());
    }
    // Unit length as the reference's: an unnormalised head keeps every cosine but not this.
    assert!(worst_norm < 1e-5, "a vector's norm is off by {worst_norm}");
    (lowest, worst_norm, counts)
}

#[test]
fn colbert_vectors_equal_sentence_transformers() {
    let reference = reference();
    assert!(reference["texts"].as_array().unwrap().iter().any(|t| t["truncated"].as_bool().unwrap()), "a text cut at the model's length");
    let (lowest, norm, counts) = compare(&reference, Precision::Fp32, MIN_COSINE);
    eprintln!(
        "colbert: {} texts, {} to {} vectors each, lowest cosine 1 - {:e}, largest |norm - 1| {norm:e}",
        counts.len(),
        counts.iter().min().unwrap(),
        counts.iter().max().unwrap(),
        1.0 - lowest
    );
}

/// bf16 computes the body at bf16 (the head stays f32): every vector still within the bound.
#[test]
fn colbert_at_bf16_stays_close() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("colbert bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let (lowest, _, _) = compare(&reference(), Precision::Bf16, MIN_COSINE_BF16);
    eprintln!("colbert bf16: lowest cosine {lowest:.7}");
}

/// A record whose vectors exceed the job's bound fails alone, named; the others are written.
#[test]
fn a_record_over_the_byte_bound_fails_alone() {
    let reference = reference();
    let engine = engine(&reference, Pooling::MultiVector, &read("1_Dense/config.json")).unwrap();
    let texts = ["short", &"a longer text with many more tokens than the short one ".repeat(4)];
    // Room for 12 vectors of 16 f32.
    let options = options(&reference, Precision::Fp32, 12 * 16 * 4);
    let outputs: Vec<OutputRecord> =
        engine.embed_window(&texts, &options).into_iter().enumerate().map(|(i, r)| r.unwrap().into_output(format!("r{i}"), OutputDtype::F32, &options)).collect();
    assert!(matches!(&outputs[0], OutputRecord::Embedding { vector: Vector::Multi(m), .. } if m.count() <= 12), "{:?}", outputs[0]);
    let OutputRecord::Error { code, message, .. } = &outputs[1] else { panic!("{:?}", outputs[1]) };
    assert_eq!(*code, ErrorCode::OutputTooLarge);
    assert!(message.contains("max_record_bytes 768"), "{message}");
}

/// The projection must map the token states with the identity activation; a missing module, a
/// pooled one or another activation is refused by field.
#[test]
fn colbert_projection_is_checked_by_field() {
    let reference = reference();
    let config = String::from_utf8(read("1_Dense/config.json")).unwrap();
    let pooled = config.replace("\"token_embeddings\"", "\"sentence_embedding\"");
    let err = engine(&reference, Pooling::MultiVector, pooled.as_bytes()).unwrap_err();
    assert!(matches!(&err, InferenceError::Dense { field, .. } if field == "module_input_name" || field == "module_output_name"), "{err}");
    let tanh = config.replace("torch.nn.modules.linear.Identity", "torch.nn.modules.activation.Tanh");
    let err = engine(&reference, Pooling::MultiVector, tanh.as_bytes()).unwrap_err();
    assert!(matches!(&err, InferenceError::Dense { field, .. } if field == "activation_function"), "{err}");
    // The same checkpoint mean-pooled would read the projection as a pooled Dense module.
    let err = engine(&reference, Pooling::Mean, config.as_bytes()).unwrap_err();
    assert!(matches!(&err, InferenceError::Dense { field, .. } if field.starts_with("module_")), "{err}");
}
