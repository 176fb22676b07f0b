//! bge-m3's three outputs in the fused encoder against FlagEmbedding's own `BGEM3FlagModel` on a
//! tiny random checkpoint (`tests/testdata/outputs/bgem3/`, its heads as `model encrypt` seals
//! them in `bgem3-heads/`, both written by `scripts/make_output_models_bgem3.py`): every text's
//! lexical weights have the same token ids and are within 1e-5 (all of them, and the 8 largest);
//! its ColBERT vectors are one per token after the first, unit-length, each at cosine ≥ 0.9999 to
//! the reference's; its dense vector (CLS, normalised) is unchanged by the heads.

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, HeadFiles, InferenceError, ModelFiles, MultiVectorOutput};
use protocol::envelope::{OutputDtype, OutputKind, Precision};
use protocol::manifest::Pooling;
use protocol::records::{OutputRecord, SparseVector, Vector};
use serde_json::Value;

const MAX_WEIGHT_DIFFERENCE: f64 = 1e-5;
const MIN_COSINE: f64 = 0.9999;
/// bf16's bounds, as for the other heads (the body's products round to 8 bits of mantissa).
const MIN_COSINE_BF16: f64 = 0.999;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("bgem3-reference.json")).unwrap()).unwrap()
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap()
}

fn engine(reference: &Value, heads: HeadFiles<'_>) -> Result<Engine, InferenceError> {
    let (config, tokenizer, weights) = (read("bgem3/config.json"), read("bgem3/tokenizer.json"), read("bgem3/model.safetensors"));
    let settings = EmbedderSettings {
        pooling: Pooling::Cls,
        normalize: true,
        max_tokens: reference["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(reference["hidden_size"].as_u64().unwrap() as usize),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)?.with_heads(heads)?;
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() })
}

fn both_heads(reference: &Value) -> Engine {
    let (lexical, colbert) = (read("bgem3-heads/sparse_linear.safetensors"), read("bgem3-heads/colbert_linear.safetensors"));
    engine(reference, HeadFiles { lexical: Some(&lexical), colbert: Some(&colbert) }).unwrap()
}

fn options(output: OutputKind, precision: Precision, top_k: Option<u32>, reference: &Value) -> EmbedOptions {
    let dimensions = reference["colbert_dimensions"].as_u64().unwrap() as usize;
    EmbedOptions {
        normalize: output == OutputKind::Dense,
        output,
        precision,
        top_k,
        multivector: (output == OutputKind::MultiVector).then_some(MultiVectorOutput { dimensions, max_record_bytes: 1 << 20 }),
        ..Default::default()
    }
}

fn texts(reference: &Value) -> (Vec<&Value>, Vec<&str>) {
    let texts: Vec<&Value> = reference["texts"].as_array().unwrap().iter().collect();
    let inputs = texts.iter().map(|t| t["text"].as_str().unwrap()).collect();
    (texts, inputs)
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let norm_a = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let norm_b = b.iter().map(|x| x.powi(2)).sum::<f64>().sqrt();
    dot / (norm_a * norm_b)
}

/// Every text's sparse record: (largest weight difference over the same ids, lowest cosine of the
/// weights as vectors, active ids per text). With `exact`, the ids must be the reference's.
fn compare_sparse(reference: &Value, engine: &Engine, precision: Precision, key: &str, top_k: Option<u32>, exact: bool) -> (f64, f64, Vec<usize>) {
    let (texts, inputs) = texts(reference);
    let options = options(OutputKind::Sparse, precision, top_k, reference);
    let vocabulary = reference["vocab_size"].as_u64().unwrap() as u32;
    let (mut largest, mut lowest, mut active) = (0f64, f64::MAX, Vec::new());
    for (text, result) in texts.iter().zip(engine.embed_window(&inputs, &options)) {
        let name = text["name"].as_str().unwrap();
        let embedding = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(u64::from(embedding.tokens), text["tokens"].as_u64().unwrap(), "{name}: token count");
        let OutputRecord::Embedding { vector: Vector::Sparse(ours), .. } = embedding.into_output(name.into(), OutputDtype::F32, &options) else {
            panic!("{name}: not a sparse record");
        };
        assert_eq!(ours.dimensions, vocabulary, "{name}: the vocabulary's width");
        let theirs: Vec<(u32, f64)> = text[key].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap())).collect();
        if exact {
            let ids: Vec<u32> = theirs.iter().map(|(i, _)| *i).collect();
            assert_eq!(ours.indices, ids, "{name}: token ids");
            for ((_, theirs), ours) in theirs.iter().zip(&ours.values) {
                largest = largest.max((f64::from(*ours) - theirs).abs());
            }
        }
        let dense_theirs = SparseVector { dimensions: vocabulary, indices: theirs.iter().map(|p| p.0).collect(), values: theirs.iter().map(|p| p.1 as f32).collect() }.to_dense();
        let wide: Vec<f64> = dense_theirs.iter().map(|v| f64::from(*v)).collect();
        lowest = lowest.min(cosine(&ours.to_dense(), &wide));
        active.push(ours.indices.len());
    }
    (largest, lowest, active)
}

#[test]
fn lexical_weights_equal_flagembedding() {
    let reference = reference();
    let engine = both_heads(&reference);
    let (largest, lowest, active) = compare_sparse(&reference, &engine, Precision::Fp32, "sparse", None, true);
    assert!(largest <= MAX_WEIGHT_DIFFERENCE, "a weight differs by {largest:e}");
    let top_k = reference["top_k"].as_u64().unwrap() as u32;
    let (largest_top, _, kept) = compare_sparse(&reference, &engine, Precision::Fp32, "top_k", Some(top_k), true);
    assert!(largest_top <= MAX_WEIGHT_DIFFERENCE && kept.iter().all(|&k| k <= top_k as usize));
    eprintln!(
        "bgem3 lexical: {} texts, {} to {} ids each, largest weight difference {largest:e}, lowest cosine 1 - {:e}; top {top_k}: same ids",
        active.len(),
        active.iter().min().unwrap(),
        active.iter().max().unwrap(),
        1.0 - lowest
    );
}

/// Every text's ColBERT record: (lowest cosine, largest |norm − 1|, vectors per text).
fn compare_colbert(reference: &Value, engine: &Engine, precision: Precision, min_cosine: f64) -> (f64, f64, Vec<usize>) {
    let (texts, inputs) = texts(reference);
    let options = options(OutputKind::MultiVector, precision, None, reference);
    let (mut lowest, mut worst_norm, mut counts) = (f64::MAX, 0f64, Vec::new());
    for (text, result) in texts.iter().zip(engine.embed_window(&inputs, &options)) {
        let name = text["name"].as_str().unwrap();
        let embedding = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let OutputRecord::Embedding { vector: Vector::Multi(multi), .. } = embedding.into_output(name.into(), OutputDtype::F32, &options) else {
            panic!("{name}: not a multi-vector record");
        };
        let expected = text["colbert"].as_array().unwrap();
        assert_eq!(multi.count(), expected.len(), "{name}: vector count");
        assert_eq!(multi.count() as u64 + 1, text["tokens"].as_u64().unwrap(), "{name}: one vector per token after the first");
        for (i, (ours, theirs)) in multi.rows().zip(expected).enumerate() {
            let theirs: Vec<f64> = theirs.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let c = cosine(ours, &theirs);
            assert!(c >= min_cosine, "{name} token {}: cosine {c} at {precision:?}", i + 1);
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
fn colbert_vectors_equal_flagembedding() {
    let reference = reference();
    assert!(reference["texts"].as_array().unwrap().iter().any(|t| t["truncated"].as_bool().unwrap()), "a text cut at the model's length");
    let (lowest, norm, counts) = compare_colbert(&reference, &both_heads(&reference), Precision::Fp32, MIN_COSINE);
    eprintln!(
        "bgem3 colbert: {} texts, {} to {} vectors each, lowest cosine 1 - {:e}, largest |norm - 1| {norm:e}",
        counts.len(),
        counts.iter().min().unwrap(),
        counts.iter().max().unwrap(),
        1.0 - lowest
    );
}

/// The dense output (CLS, normalised) is FlagEmbedding's `dense_vecs`, with or without the heads.
#[test]
fn dense_vectors_are_unchanged_by_the_heads() {
    let reference = reference();
    let (texts, inputs) = texts(&reference);
    let lexical = read("bgem3-heads/sparse_linear.safetensors");
    for engine in [both_heads(&reference), engine(&reference, HeadFiles { lexical: Some(&lexical), colbert: None }).unwrap()] {
        let options = options(OutputKind::Dense, Precision::Fp32, None, &reference);
        let mut lowest = f64::MAX;
        for (text, result) in texts.iter().zip(engine.embed_window(&inputs, &options)) {
            let theirs: Vec<f64> = text["dense"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            lowest = lowest.min(cosine(&result.unwrap().vector, &theirs));
        }
        assert!(lowest >= MIN_COSINE, "dense: lowest cosine {lowest}");
        eprintln!("bgem3 dense: lowest cosine 1 - {:e}", 1.0 - lowest);
    }
}

/// bf16 computes the body at bf16 (the heads stay f32): the weights' and vectors' cosines within
/// bf16's bound (a weight near zero may cross it, so the ids are not compared).
#[test]
fn bgem3_at_bf16_stays_close() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("bgem3 bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let reference = reference();
    let engine = both_heads(&reference);
    let (_, sparse, _) = compare_sparse(&reference, &engine, Precision::Bf16, "sparse", None, false);
    assert!(sparse >= MIN_COSINE_BF16, "bf16 lexical weights: lowest cosine {sparse}");
    let (colbert, _, _) = compare_colbert(&reference, &engine, Precision::Bf16, MIN_COSINE_BF16);
    eprintln!("bgem3 bf16: lexical lowest cosine {sparse:.6}, colbert lowest cosine {colbert:.6}");
}

/// A model without a head does not compute its output: refused by name when a job asks for it.
#[test]
fn an_output_without_its_head_is_refused() {
    let reference = reference();
    let colbert = read("bgem3-heads/colbert_linear.safetensors");
    let engine = engine(&reference, HeadFiles { lexical: None, colbert: Some(&colbert) }).unwrap();
    assert_eq!(engine.embedder().output_dimensions(OutputKind::Sparse), None);
    assert_eq!(engine.embedder().output_dimensions(OutputKind::MultiVector), Some(36));
    let options = options(OutputKind::Sparse, Precision::Fp32, None, &reference);
    let failed = engine.embed_window(&["a text"], &options).remove(0).unwrap_err();
    assert!(failed.message.contains("no sparse output"), "{failed}");
    // Heads swapped: the lexical file where the ColBERT head belongs is refused by its shape.
    let err = engine_err(&reference, HeadFiles { lexical: Some(&colbert), colbert: None });
    assert!(err.contains("sparse_linear.safetensors") && err.contains("shape"), "{err}");
}

fn engine_err(reference: &Value, heads: HeadFiles<'_>) -> String {
    match engine(reference, heads) {
        Ok(_) => "loaded".into(),
        Err(e) => e.to_string(),
    }
}

/// The signed manifest says which outputs a job may ask for, and the loaded heads must agree: a
/// job header asking sparse output of a model whose manifest does not offer it, or whose lexical
/// head was not loaded, or ColBERT vectors of another width than the manifest's, is refused by
/// name before anything is embedded.
#[test]
fn a_job_asking_an_output_the_manifest_does_not_offer_is_refused_by_name() {
    use protocol::envelope::JobOptions;
    use protocol::manifest::Manifest;
    let reference = reference();
    let vocabulary = reference["vocab_size"].as_u64().unwrap() as u32;
    let manifest = |outputs: Vec<(OutputKind, u32)>| Manifest {
        model_id: "test/bgem3".into(),
        version: 1,
        files: Vec::new(),
        dimensions: 36,
        pooling: Pooling::Cls,
        normalize: true,
        max_tokens: 512,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs,
        rerank_template: None,
        kms_key_id: "local:model".into(),
        wrapped_dek: Vec::new(),
        created_ms: 0,
    };
    let job = |output: OutputKind| JobOptions {
        output,
        normalize: output == OutputKind::Dense,
        max_record_bytes: (output == OutputKind::MultiVector).then_some(1 << 20),
        ..JobOptions::default()
    };
    let offered = manifest(vec![(OutputKind::MultiVector, 36), (OutputKind::Sparse, vocabulary)]);
    let both = both_heads(&reference);
    for kind in [OutputKind::Dense, OutputKind::Sparse, OutputKind::MultiVector] {
        let options = EmbedOptions::for_job(&job(kind), both.embedder(), &offered).unwrap();
        assert_eq!(options.output, kind);
    }
    let refused = |options: JobOptions, engine: &Engine, manifest: &Manifest| match EmbedOptions::for_job(&options, engine.embedder(), manifest) {
        Err(e @ InferenceError::OutputNotOffered { .. }) => e.to_string(),
        other => panic!("{other:?}"),
    };
    // The heads are loaded but the manifest offers dense vectors only.
    let message = refused(job(OutputKind::Sparse), &both, &manifest(Vec::new()));
    assert!(message.contains("output sparse") && message.contains("gives dense"), "{message}");
    assert!(refused(job(OutputKind::Scores), &both, &offered).contains("output scores"));
    // The manifest offers sparse output but the model was loaded without its lexical head.
    let colbert = read("bgem3-heads/colbert_linear.safetensors");
    let lean = engine(&reference, HeadFiles { lexical: None, colbert: Some(&colbert) }).unwrap();
    assert!(refused(job(OutputKind::Sparse), &lean, &offered).contains("output sparse"));
    // A ColBERT head of another width than the manifest says (the lexical file in its place).
    let lexical = read("bgem3-heads/sparse_linear.safetensors");
    let narrow = engine(&reference, HeadFiles { lexical: None, colbert: Some(&lexical) }).unwrap();
    assert_eq!(narrow.embedder().output_dimensions(OutputKind::MultiVector), Some(1));
    assert!(refused(job(OutputKind::MultiVector), &narrow, &offered).contains("output multivector"));
}
