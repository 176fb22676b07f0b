//! XLM-RoBERTa and MPNet in the fused encoder, against sentence-transformers' vectors for tiny
//! random checkpoints of each (the `classic-mean` folders of the model matrix,
//! `tests/testdata/models/`, written by `scripts/make_test_models.py`): multilingual texts, a
//! `<pad>` typed into a text, texts between 256 and 512 tokens and texts cut at 512.

mod support;

use std::sync::Arc;

use enclave_worker::inference::{
    Architecture, Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings,
    InferenceError, ModelFiles,
};
use support::{cosine, Case};
use protocol::envelope::{JobOptions, Precision};
use protocol::manifest::Pooling;

const F32_MIN_COSINE: f64 = 0.9999;
const BF16_MIN_COSINE: f64 = 0.999;
/// Mean pooling, Normalize, 512 tokens, no prompts.
const FOLDER: &str = "classic-mean";

struct Model {
    kind: &'static str,
    config: Vec<u8>,
    tokenizer: Vec<u8>,
    weights: Vec<u8>,
    max_tokens: usize,
    dimensions: usize,
    cases: Vec<Case>,
}

fn model(kind: &'static str) -> Model {
    let dir = support::matrix_dir().join(kind);
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{kind}/{name}: {e}"));
    let reference = support::matrix_reference();
    let arch = &reference["architectures"][kind];
    let folder = &arch["folders"][FOLDER];
    assert_eq!(arch["model_type"], kind);
    assert_eq!(folder["pooling"], "mean");
    assert_eq!(folder["normalize"], true);
    Model {
        kind,
        config: read(&format!("{FOLDER}/config.json")),
        tokenizer: read("tokenizer.json"),
        weights: read("model.safetensors"),
        max_tokens: folder["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: arch["hidden_size"].as_u64().unwrap() as usize,
        cases: support::matrix_cases(&reference, kind, FOLDER, ""),
    }
}

impl Model {
    fn files(&self) -> ModelFiles<'_> {
        ModelFiles { config: &self.config, tokenizer: &self.tokenizer, weights: &self.weights, dense: &[] }
    }

    fn settings(&self) -> EmbedderSettings {
        EmbedderSettings {
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens: self.max_tokens,
            dimensions: Some(self.dimensions),
            backend: Backend::Fused,
        }
    }

    fn engine(&self, limits: BatchLimits) -> Engine {
        let embedder = Embedder::load(self.files(), self.settings()).unwrap_or_else(|e| panic!("{}: {e}", self.kind));
        Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
    }

    fn texts(&self) -> Vec<&str> {
        self.cases.iter().map(|c| c.text.as_str()).collect()
    }

    /// Embeds every reference text at `precision` and returns the worst cosine to the reference.
    fn worst_cosine(&self, engine: &Engine, precision: Precision) -> (f64, String) {
        let options = EmbedOptions { precision, ..Default::default() };
        let results = engine.embed_window(&self.texts(), &options);
        let mut worst = (f64::INFINITY, String::new());
        for (case, result) in self.cases.iter().zip(results) {
            let embedding = result.unwrap_or_else(|e| panic!("{} {}: {e}", self.kind, case.name));
            assert_eq!(embedding.tokens, case.tokens, "{} {}: token count", self.kind, case.name);
            assert_eq!(embedding.vector.len(), self.dimensions);
            let c = cosine(&embedding.vector, &case.vector);
            if c < worst.0 {
                worst = (c, case.name.clone());
            }
        }
        worst
    }
}


fn check_reference(kind: &'static str, arch: Architecture) {
    let model = model(kind);
    assert!(model.cases.len() >= 20);
    assert!(model.cases.iter().any(|c| c.truncated && c.tokens as usize == model.max_tokens), "a text cut at 512");
    assert!(model.cases.iter().any(|c| !c.truncated && c.tokens > 256), "a text of 256..512 tokens");
    let engine = model.engine(BatchLimits::default());
    assert_eq!(engine.embedder().architecture(), arch);
    assert_eq!(engine.embedder().backend(), Backend::Fused);
    // tokenizer.json's template: <s> (0) … </s> (2), as sentence-transformers encodes.
    for case in &model.cases {
        let ids = engine.embedder().tokenize(case.text.as_bytes(), true).unwrap().ids;
        assert_eq!((ids[0], ids[ids.len() - 1]), (0, 2), "{kind} {}", case.name);
    }
    let (worst, name) = model.worst_cosine(&engine, Precision::Fp32);
    eprintln!("{kind} f32: worst cosine {worst:.7} ({name})");
    assert!(worst >= F32_MIN_COSINE, "{kind} f32: {name} at {worst}");

    if engine.embedder().supports_precision(Precision::Bf16) {
        let (worst, name) = model.worst_cosine(&engine, Precision::Bf16);
        eprintln!("{kind} bf16: worst cosine {worst:.7} ({name})");
        assert!(worst >= BF16_MIN_COSINE, "{kind} bf16: {name} at {worst}");
    } else {
        eprintln!("{kind} bf16: skipped, this CPU has no AVX-512 BF16");
    }
}

#[test]
fn xlm_roberta_matches_sentence_transformers() {
    check_reference("xlm-roberta", Architecture::XlmRoberta);
}

#[test]
fn mpnet_matches_sentence_transformers() {
    check_reference("mpnet", Architecture::MpNet);
}

/// Packing changes nothing: every text alone and all of them in batches of mixed lengths give
/// the same vectors (MPNet's bias and the offset positions are per sequence, not per batch).
#[test]
fn batching_does_not_change_vectors() {
    for kind in ["xlm-roberta", "mpnet"] {
        let model = model(kind);
        let one = model.engine(BatchLimits { max_batch_size: 1, ..Default::default() });
        let many = model.engine(BatchLimits { max_batch_size: 64, max_padded_tokens: 1 << 16 });
        let options = EmbedOptions::default();
        let alone = one.embed_window(&model.texts(), &options);
        let packed = many.embed_window(&model.texts(), &options);
        assert!(many.metrics().batches < one.metrics().batches);
        for ((case, a), b) in model.cases.iter().zip(alone).zip(packed) {
            let (a, b) = (a.unwrap().vector, b.unwrap().vector);
            let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-5, "{kind} {}: {diff}", case.name);
        }
    }
}

/// int8's accuracy is measured on BERT only: a job asking it of these models is refused, naming
/// the architecture, rather than served at an unmeasured error.
#[test]
fn int8_is_refused_for_them_by_name() {
    for (kind, name) in [("xlm-roberta", "xlm-roberta"), ("mpnet", "mpnet")] {
        let model = model(kind);
        let engine = model.engine(BatchLimits::default());
        let embedder = engine.embedder();
        assert!(!embedder.supports_precision(Precision::Int8));
        let err = embedder.check_precision(Precision::Int8).unwrap_err();
        assert!(
            matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture } if *architecture == name),
            "{err}"
        );
        let job = JobOptions { precision: Precision::Int8, ..JobOptions::default() };
        let err = EmbedOptions::for_job(&job, embedder, &default_manifest()).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
        let tokenized = embedder.tokenize(b"hello", true).unwrap();
        let err = embedder.embed_batch(&[&tokenized], true, Precision::Int8).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// The usable length is the position table less the offset: 514 positions give 512 tokens, and a
/// manifest asking for more is refused at load instead of failing (or worse) on a long text.
#[test]
fn max_tokens_beyond_the_offset_positions_is_refused() {
    for kind in ["xlm-roberta", "mpnet"] {
        let model = model(kind);
        let settings = EmbedderSettings { max_tokens: 513, ..model.settings() };
        let err = Embedder::load(model.files(), settings).unwrap_err();
        assert!(matches!(&err, InferenceError::Settings(m) if m.contains("3..=512")), "{kind}: {err}");
    }
}

/// What a mislabelled config would do, and what is refused: the architecture decides the
/// computation, so an unknown one is refused by name; XLM-RoBERTa weights run as BERT (positions
/// without the offset) give other vectors; MPNet has no computation outside the fused encoder.
#[test]
fn the_architecture_is_read_from_the_config_and_unknown_ones_are_refused() {
    let xlmr = model("xlm-roberta");
    let edit = |model: &Model, f: &dyn Fn(&mut serde_json::Value)| {
        let mut config: serde_json::Value = serde_json::from_slice(&model.config).unwrap();
        f(&mut config);
        serde_json::to_vec(&config).unwrap()
    };
    let load = |model: &Model, config: &[u8], backend: Backend| {
        let files = ModelFiles { config, tokenizer: &model.tokenizer, weights: &model.weights, dense: &[] };
        Embedder::load(files, EmbedderSettings { backend, ..model.settings() })
    };

    for other in ["roberta", "distilbert", "jina_bert", ""] {
        let config = edit(&xlmr, &|c| c["model_type"] = other.into());
        let err = load(&xlmr, &config, Backend::Fused).unwrap_err();
        assert!(
            matches!(&err, InferenceError::UnsupportedArchitecture(m) if m.contains(&format!("{other:?}"))),
            "{other}: {err}"
        );
    }

    // Read as BERT, the same weights give vectors far from the reference.
    let as_bert = edit(&xlmr, &|c| c["model_type"] = "bert".into());
    let embedder = load(&xlmr, &as_bert, Backend::Fused).unwrap();
    assert_eq!(embedder.architecture(), Architecture::Bert);
    let engine = Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() }).unwrap();
    let (worst, _) = xlmr.worst_cosine(&engine, Precision::Fp32);
    assert!(worst < 0.99, "positions without the offset went unnoticed: {worst}");

    // Neither MPNet nor XLM-RoBERTa falls back to candle's BertModel.
    let mpnet = model("mpnet");
    for (model, name) in [(&mpnet, "mpnet"), (&xlmr, "xlm-roberta")] {
        let err = load(model, &model.config, Backend::CandleBert).unwrap_err();
        assert!(matches!(&err, InferenceError::UnsupportedArchitecture(m) if m.starts_with(name)), "{err}");
        let gelu_new = edit(model, &|c| c["hidden_act"] = "gelu_new".into());
        let err = load(model, &gelu_new, Backend::Fused).unwrap_err();
        assert!(err.to_string().contains("hidden_act \"gelu_new\""), "{err}");
    }
    let buckets = edit(&mpnet, &|c| c["relative_attention_num_buckets"] = 64.into());
    let err = load(&mpnet, &buckets, Backend::Fused).unwrap_err();
    assert!(err.to_string().contains("relative_attention_num_buckets"), "{err}");
}

/// A manifest with no prompts and no Matryoshka lengths: what these jobs' options are checked
/// against.
fn default_manifest() -> protocol::manifest::Manifest {
    enclave_worker::dev_model::manifest(1, &[], "local:model", Vec::new(), 0)
}
