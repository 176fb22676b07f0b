//! The inference engine against committed reference vectors
//! (`testdata/reference_embeddings.json`, written by `scripts/reference_embeddings.py`), and the
//! properties batching must keep. Needs the model: `bash scripts/setup-model.sh` (or set
//! `EPHEM_MODEL_DIR`).

mod support;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use enclave_worker::inference::{
    Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles,
};
use support::{cosine, Case};
use protocol::envelope::{JobOptions, OutputDtype, Precision};
use protocol::records::{ErrorCode, InputRecord, OutputRecord, Vector};

struct Reference {
    engine: String,
    cases: Vec<Case>,
    errors: Vec<(String, String, String)>,
}

fn model_dir() -> PathBuf {
    std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ephem/models/all-MiniLM-L6-v2")))
}

fn read_model_file(name: &str) -> Vec<u8> {
    let path = model_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}. Install the model first: bash scripts/setup-model.sh (or set EPHEM_MODEL_DIR)", path.display())
    })
}

struct ModelBytes {
    config: Vec<u8>,
    tokenizer: Vec<u8>,
    weights: Vec<u8>,
}

fn model_bytes() -> &'static ModelBytes {
    static BYTES: OnceLock<ModelBytes> = OnceLock::new();
    BYTES.get_or_init(|| ModelBytes {
        config: read_model_file("config.json"),
        tokenizer: read_model_file("tokenizer.json"),
        weights: read_model_file("model.safetensors"),
    })
}

fn load(backend: Backend) -> Arc<Embedder> {
    let bytes = model_bytes();
    let files = ModelFiles { config: &bytes.config, tokenizer: &bytes.tokenizer, weights: &bytes.weights, dense: &[] };
    let embedder =
        Embedder::load(files, EmbedderSettings { backend, ..Default::default() }).expect("load all-MiniLM-L6-v2");
    assert_eq!(embedder.backend(), backend);
    Arc::new(embedder)
}

/// The default (fused) backend.
fn embedder() -> Arc<Embedder> {
    static EMBEDDER: OnceLock<Arc<Embedder>> = OnceLock::new();
    EMBEDDER.get_or_init(|| load(Backend::Fused)).clone()
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::new(embedder(), EngineSettings::default()).unwrap())
}

/// candle-transformers' BertModel over padded batches.
fn candle_embedder() -> Arc<Embedder> {
    static EMBEDDER: OnceLock<Arc<Embedder>> = OnceLock::new();
    EMBEDDER.get_or_init(|| load(Backend::CandleBert)).clone()
}

fn candle_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::new(candle_embedder(), EngineSettings::default()).unwrap())
}

fn engines() -> [(&'static str, &'static Engine); 2] {
    [("fused", engine()), ("candle-bert", candle_engine())]
}

fn reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let raw = include_str!("../testdata/reference_embeddings.json");
        let doc: serde_json::Value = serde_json::from_str(raw).unwrap();
        let cases = support::cases(&doc);
        let errors = doc["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap().to_owned();
                (s("name"), s("text"), s("code"))
            })
            .collect();
        Reference { engine: doc["engine"].as_str().unwrap().to_owned(), cases, errors }
    })
}

/// Issue 23's bound for int8 on every reference text, to the reference and to fp32: measured
/// 0.99914 for both (median 0.99951) on all-MiniLM-L6-v2 with 8 exact channels per int8 product
/// and the FFN output in int8 in the four layers the calibration set allows, bf16 in the first
/// two (0.99946 with it in bf16 everywhere, 0.99782 with all four products plain int8). ONNX Runtime's
/// dynamic int8 reaches 0.985–0.987 to sentence-transformers on the benchmark corpus.
const INT8_MIN_COSINE: f64 = 0.999;


fn texts() -> Vec<&'static str> {
    reference().cases.iter().map(|c| c.text.as_str()).collect()
}

#[test]
fn every_reference_vector_matches() {
    let reference = reference();
    assert!(reference.cases.len() >= 16);
    for (backend, engine) in engines() {
        let results = engine.embed_window(&texts(), &EmbedOptions::default());
        let mut min = (f64::INFINITY, String::new());
        for (case, result) in reference.cases.iter().zip(&results) {
            let embedding = result.as_ref().unwrap_or_else(|e| panic!("{backend} {}: {e}", case.name));
            assert_eq!(embedding.vector.len(), 384, "{}", case.name);
            assert_eq!(embedding.tokens, case.tokens, "{backend} {}: token count", case.name);
            let cos = cosine(&embedding.vector, &case.vector);
            let norm: f64 = embedding.vector.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{backend} {}: norm {norm}", case.name);
            println!(
                "{backend:<11} {:<18} {:>4} tokens{} cosine {cos:.12} (1 - cos = {:.1e})",
                case.name,
                case.tokens,
                if case.truncated { " (truncated)" } else { "" },
                1.0 - cos
            );
            if cos < min.0 {
                min = (cos, case.name.clone());
            }
        }
        println!(
            "{backend}: min cosine to the reference ({}): {:.12} ({}; 1 - cos = {:.1e})",
            reference.engine,
            min.0,
            min.1,
            1.0 - min.0
        );
        assert!(min.0 >= 0.9999, "{backend}: min cosine {:.9} on {}", min.0, min.1);
    }
    // Cases that exercise the tokenizer trap and truncation are present.
    assert!(reference.cases.iter().any(|c| c.truncated && c.tokens == 256));
    assert!(reference.cases.iter().any(|c| c.tokens > 128 && c.tokens < 256));
    assert!(reference.cases.iter().any(|c| c.tokens == 128));
}

#[test]
fn known_sentence_transformers_value() {
    // STACK.md §5: sentence-transformers, normalize_embeddings=True.
    let expected = [0.08204813f32, 0.0360555, -0.00389286, -0.0048811, 0.02565121];
    let result = engine().embed_window(&["What is the capital of France?"], &EmbedOptions::default());
    let vector = &result[0].as_ref().unwrap().vector;
    for (got, want) in vector.iter().zip(expected) {
        assert!((got - want).abs() < 1e-6, "{:?} vs {expected:?}", &vector[..5]);
    }
}

#[test]
fn batching_does_not_change_results() {
    let texts = texts();
    let options = EmbedOptions::default();
    for (backend, engine) in engines() {
        let alone: Vec<Vec<f32>> =
            texts.iter().map(|t| engine.embed_window(&[*t], &options).remove(0).unwrap().vector).collect();
        let together = engine.embed_window(&texts, &options);
        // A deterministic shuffle, plus duplicates, in one window.
        let mut order: Vec<usize> = (0..texts.len()).map(|i| (i * 7 + 3) % texts.len()).collect();
        order.extend([0, 3, 16 % texts.len()]);
        let shuffled_texts: Vec<&str> = order.iter().map(|&i| texts[i]).collect();
        let shuffled = engine.embed_window(&shuffled_texts, &options);
        // Tiny budget: many small batches with different companions.
        let small = Engine::new(
            if backend == "fused" { embedder() } else { candle_embedder() },
            EngineSettings {
                threads: 1,
                limits: BatchLimits { max_padded_tokens: 300, max_batch_size: 3 },
                ..Default::default()
            },
        )
        .unwrap();
        let small_batches = small.embed_window(&texts, &options);

        let mut min = f64::INFINITY;
        for (i, single) in alone.iter().enumerate() {
            min = min.min(cosine(single, &together[i].as_ref().unwrap().vector));
            min = min.min(cosine(single, &small_batches[i].as_ref().unwrap().vector));
        }
        for (position, &i) in order.iter().enumerate() {
            min = min.min(cosine(&alone[i], &shuffled[position].as_ref().unwrap().vector));
        }
        println!("{backend}: min cosine alone vs batched/shuffled: {min:.12} (1 - cos = {:.1e})", 1.0 - min);
        assert!(min >= 0.99999, "{backend}: batching changed a vector: min cosine {min}");
        assert!(small.metrics().batches > 5);
    }
}

#[test]
fn empty_and_invalid_texts_are_per_record_errors() {
    let reference = reference();
    assert!(!reference.errors.is_empty());
    let mut texts: Vec<Vec<u8>> = reference.errors.iter().map(|(_, text, _)| text.as_bytes().to_vec()).collect();
    texts.push(b"\x00\x01\x02".to_vec()); // control characters only: nothing left after normalisation
    texts.push(b"caf\xc3".to_vec()); // truncated UTF-8
    texts.push(b"fine".to_vec());
    texts.push(vec![b'a'; protocol::records::MAX_TEXT_LEN + 1]); // over the enclave's text limit
    let results = engine().embed_window(&texts, &EmbedOptions::default());
    for ((name, _, code), result) in reference.errors.iter().zip(&results) {
        assert_eq!(code, "empty_text");
        assert_eq!(result.as_ref().unwrap_err().code, ErrorCode::EmptyText, "{name}");
    }
    let n = reference.errors.len();
    assert_eq!(results[n].as_ref().unwrap_err().code, ErrorCode::EmptyText);
    assert_eq!(results[n + 1].as_ref().unwrap_err().code, ErrorCode::InvalidUtf8);
    assert_eq!(results[n + 2].as_ref().unwrap().tokens, 3);
    assert_eq!(results[n + 3].as_ref().unwrap_err().code, ErrorCode::TooLarge);
}

#[test]
fn truncation_off_refuses_long_texts() {
    let reference = reference();
    let long = reference.cases.iter().find(|c| c.truncated).expect("a truncated case");
    let exact = reference.cases.iter().find(|c| c.tokens == 128).expect("a 128-token case");
    let job = JobOptions { truncate: false, ..Default::default() };
    let options = EmbedOptions::for_job(&job, engine().embedder(), &default_manifest()).unwrap();
    let results = engine().embed_window(&[long.text.as_str(), exact.text.as_str()], &options);
    let failure = results[0].as_ref().unwrap_err();
    assert_eq!(failure.code, ErrorCode::TooManyTokens, "{failure}");
    assert_eq!(results[1].as_ref().unwrap().tokens, 128);
    let truncated = engine().embed_window(&[long.text.as_str()], &EmbedOptions::default());
    assert_eq!(truncated[0].as_ref().unwrap().tokens, 256);
}

/// int8 runs only on the fused encoder with AVX-512 VNNI or AVX2, bf16 only on the fused encoder:
/// elsewhere the job is refused by name, never served at another precision.
#[test]
fn reduced_precisions_are_refused_where_they_cannot_run() {
    let job = JobOptions { precision: Precision::Int8, ..Default::default() };
    let refused = EmbedOptions::for_job(&job, candle_engine().embedder(), &default_manifest()).unwrap_err();
    assert!(refused.to_string().contains("int8"), "candle-bert: {refused}");
    match EmbedOptions::for_job(&job, engine().embedder(), &default_manifest()) {
        Ok(options) => assert_eq!(options.precision, Precision::Int8),
        Err(refused) => {
            assert!(!int8_kernel_here(), "int8 refused on a CPU that has an int8 kernel");
            assert!(refused.to_string().contains("int8"), "fused: {refused}");
        }
    }
    let job = JobOptions { precision: Precision::Bf16, ..Default::default() };
    assert!(EmbedOptions::for_job(&job, candle_engine().embedder(), &default_manifest()).is_err(), "bf16 on the candle backend");
}

/// A prompt is the text put before each text, as sentence-transformers joins them (so the vector
/// is exactly that of the joined string); a Matryoshka length keeps the first values of the
/// pooled vector and normalises them again.
#[test]
fn prompts_and_matryoshka_lengths_shape_the_vectors_as_asked() {
    let mut manifest = default_manifest();
    manifest.prompts.entries = vec![("query".into(), "query: ".into())];
    manifest.matryoshka = vec![128];
    let text = "How many people live in Paris?";
    let asked = JobOptions { prompt: Some("query".into()), dimensions: Some(128), ..Default::default() };
    let options = EmbedOptions::for_job(&asked, engine().embedder(), &manifest).unwrap();
    let shaped = engine().embed_window(&[text], &options).remove(0).unwrap();
    let joined = engine().embed_window(&[format!("query: {text}")], &EmbedOptions::default()).remove(0).unwrap();
    assert_eq!(shaped.tokens, joined.tokens, "the prompt's tokens are the model's input too");
    assert!(shaped.tokens > engine().embed_window(&[text], &EmbedOptions::default())[0].as_ref().unwrap().tokens);
    assert_eq!(shaped.vector.len(), 128);
    let norm: f64 = joined.vector[..128].iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    for (got, full) in shaped.vector.iter().zip(&joined.vector[..128]) {
        assert!((f64::from(*got) - f64::from(*full) / norm).abs() < 1e-6, "truncated and renormalised");
    }
    let unnormalised = EmbedOptions { normalize: false, ..options.clone() };
    let raw = engine().embed_window(&[text], &unnormalised).remove(0).unwrap();
    assert_eq!(raw.vector.len(), 128, "without normalisation: the first 128 values as they are");

    // What the manifest does not offer is refused by name, never served otherwise.
    let unknown = JobOptions { prompt: Some("passage".into()), ..Default::default() };
    let refused = EmbedOptions::for_job(&unknown, engine().embedder(), &manifest).unwrap_err();
    assert!(matches!(&refused, InferenceError::UnknownPrompt(name) if name == "passage"), "{refused}");
    let short = JobOptions { dimensions: Some(64), ..Default::default() };
    let refused = EmbedOptions::for_job(&short, engine().embedder(), &manifest).unwrap_err();
    assert!(matches!(&refused, InferenceError::DimensionsNotOffered { asked: 64, offered } if offered == &[128, 384]), "{refused}");
    let own = JobOptions { dimensions: Some(384), ..Default::default() };
    assert!(EmbedOptions::for_job(&own, engine().embedder(), &default_manifest()).is_ok(), "the model's own length");
}

/// Whether this CPU has one of int8's kernels: AVX-512 VNNI's, or AVX2's.
fn int8_kernel_here() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni") || (std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
}

/// int8 (VNNI or AVX2 kernels in the dense layers, weights per output channel, activations per token)
/// stays within its measured bound of the sentence-transformers reference and of our own fp32
/// vectors on every reference text.
#[test]
fn int8_stays_within_its_bound_on_every_reference_text() {
    let job = JobOptions { precision: Precision::Int8, ..Default::default() };
    let Ok(options) = EmbedOptions::for_job(&job, engine().embedder(), &default_manifest()) else {
        assert!(!int8_kernel_here(), "int8 refused on a CPU that has an int8 kernel");
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2, so int8 jobs are refused");
        return;
    };
    let reference = reference();
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let int8 = engine().embed_window(&texts, &options);
    let fp32 = engine().embed_window(&texts, &EmbedOptions::default());
    let (mut to_reference, mut to_fp32) = (Vec::new(), Vec::new());
    for ((case, int8), fp32) in reference.cases.iter().zip(&int8).zip(&fp32) {
        let (int8, fp32) = (int8.as_ref().unwrap(), fp32.as_ref().unwrap());
        assert_eq!(int8.tokens, case.tokens, "{}", case.name);
        // A short text runs wider: at fp32 where bf16 is not faster, so exactly fp32's vector.
        if engine().embedder().precision_for(Precision::Int8, int8.tokens as usize) == Precision::Fp32 {
            assert_eq!(int8.vector, fp32.vector, "{}: a short text at fp32", case.name);
        } else {
            assert_ne!(int8.vector, fp32.vector, "{}: int8 computed exactly the fp32 vector", case.name);
        }
        to_reference.push((cosine(&int8.vector, &case.vector), case.name.as_str()));
        to_fp32.push((cosine(&int8.vector, &fp32.vector), case.name.as_str()));
    }
    for (what, cosines) in [("sentence-transformers", &mut to_reference), ("our fp32", &mut to_fp32)] {
        cosines.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (min, name) = cosines[0];
        eprintln!("int8 to {what}: min cosine {min:.6} ({name}), median {:.6}", cosines[cosines.len() / 2].0);
        assert!(min >= INT8_MIN_COSINE, "int8 to {what}: minimum cosine {min:.6} on {name}");
    }
}

/// bf16 (AVX-512 BF16 kernels in the dense layers) stays at cosine ≥ 0.999 to the
/// sentence-transformers reference on every reference text, and to our own fp32 vectors.
#[test]
fn bf16_stays_within_its_bound_on_every_reference_text() {
    let job = JobOptions { precision: Precision::Bf16, ..Default::default() };
    let Ok(options) = EmbedOptions::for_job(&job, engine().embedder(), &default_manifest()) else {
        assert!(!std::arch::is_x86_feature_detected!("avx512bf16"), "bf16 refused on a CPU that has it");
        eprintln!("skipped: this CPU has no AVX-512 BF16, so bf16 jobs are refused");
        return;
    };
    let reference = reference();
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let bf16 = engine().embed_window(&texts, &options);
    let fp32 = engine().embed_window(&texts, &EmbedOptions::default());
    let mut worst = (1.0f64, "");
    for ((case, bf16), fp32) in reference.cases.iter().zip(&bf16).zip(&fp32) {
        let (bf16, fp32) = (bf16.as_ref().unwrap(), fp32.as_ref().unwrap());
        assert_eq!(bf16.tokens, case.tokens, "{}", case.name);
        for c in [cosine(&bf16.vector, &case.vector), cosine(&bf16.vector, &fp32.vector)] {
            if c < worst.0 {
                worst = (c, &case.name);
            }
        }
        assert_ne!(bf16.vector, fp32.vector, "{}: bf16 computed exactly the fp32 vector", case.name);
    }
    eprintln!("bf16: minimum cosine {:.6} ({})", worst.0, worst.1);
    assert!(worst.0 >= 0.999, "bf16 minimum cosine {:.6} on {}", worst.0, worst.1);
}

#[test]
fn unnormalised_vectors_are_the_mean_pooled_states() {
    let options = EmbedOptions { truncate: true, normalize: false, ..Default::default() };
    let raw = engine().embed_window(&["What is the capital of France?"], &options).remove(0).unwrap();
    let norm: f64 = raw.vector.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "expected an unnormalised vector, norm {norm}");
    let reference = &reference().cases[0].vector;
    assert!(cosine(&raw.vector, reference) >= 0.9999);
}

#[test]
fn stream_keeps_input_order_through_small_windows() {
    let texts = texts();
    let mut records: Vec<InputRecord> = Vec::new();
    for round in 0..3 {
        for (i, text) in texts.iter().enumerate() {
            records.push(InputRecord { id: format!("r{round}-{i}"), text: text.as_bytes().to_vec() });
        }
        records.push(InputRecord { id: format!("r{round}-empty"), text: Vec::new() });
    }
    let engine =
        Engine::new(embedder(), EngineSettings { threads: 2, window_records: 5, ..Default::default() }).unwrap();
    let mut outputs: Vec<OutputRecord> = Vec::new();
    let emitted = engine
        .embed_stream(records.clone(), &EmbedOptions::default(), OutputDtype::F16, |o| {
            outputs.push(o);
            Ok::<(), ()>(())
        })
        .unwrap();
    assert_eq!(emitted as usize, records.len());
    let ids: Vec<&str> = outputs.iter().map(OutputRecord::id).collect();
    let expected: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, expected);
    let metrics = engine.metrics();
    assert_eq!(metrics.windows as usize, records.len().div_ceil(5));
    assert_eq!(metrics.failed, 3);
    assert_eq!(metrics.documents as usize, records.len() - 3);
    assert!(metrics.padded_tokens >= metrics.real_tokens);
    for (record, output) in records.iter().zip(&outputs) {
        match output {
            OutputRecord::Embedding { tokens, vector: Vector::F16(bits), .. } => {
                let case = reference().cases.iter().find(|c| c.text.as_bytes() == record.text).unwrap();
                assert_eq!(*tokens, case.tokens);
                let widened = Vector::F16(bits.clone()).to_f32();
                assert!(cosine(&widened, &case.vector) > 0.9999);
            }
            OutputRecord::Error { code, .. } => assert_eq!(*code, ErrorCode::EmptyText, "{}", record.id),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A manifest with no prompts and no Matryoshka lengths: what these jobs' options are checked
/// against.
fn default_manifest() -> protocol::manifest::Manifest {
    enclave_worker::dev_model::manifest(1, &[], "local:model", Vec::new(), 0)
}
