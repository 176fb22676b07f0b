//! Gemma 3's text body with bidirectional attention and two Dense modules after mean pooling
//! (EmbeddingGemma's pipeline) in the fused encoder, against sentence-transformers' own `encode()`
//! on a tiny random checkpoint (`tests/testdata/models/gemma3/`, written by
//! `scripts/make_test_models.py --only gemma3`): both folders (the published config form, cut at
//! 2,048 tokens, and the 6.x form, cut at 1,000), every text with no prompt and each of
//! EmbeddingGemma's prompts, at fp32 and bf16. The Dense modules' files are loaded as the enclave
//! loads them: wrong ones are refused by module, file and field.

mod support;

use std::sync::Arc;

use enclave_worker::inference::{
    Architecture, Backend, BatchLimits, DenseFiles, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings,
    InferenceError, ModelFiles,
};
use protocol::envelope::Precision;
use protocol::manifest::Pooling;
use serde_json::Value;
use support::{check_cases, matrix_cases, prompt_runs};

const F32_MIN_COSINE: f64 = 0.99999;
const BF16_MIN_COSINE: f64 = 0.999;
const FOLDERS: [&str; 2] = ["classic-mean", "v6-mean"];
const DENSE: [&str; 2] = ["2_Dense", "3_Dense"];

fn reference() -> Value {
    let path = support::matrix_dir().join("gemma3/reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// One folder's files as bytes: config, tokenizer, weights, and each Dense module's config and weights.
struct Files {
    config: Vec<u8>,
    tokenizer: Vec<u8>,
    weights: Vec<u8>,
    dense: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Files {
    fn read(folder: &str) -> Self {
        let dir = support::matrix_dir().join("gemma3");
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("gemma3/{name}: {e}"));
        Self {
            config: read(&format!("{folder}/config.json")),
            tokenizer: read("tokenizer.json"),
            weights: read("model.safetensors"),
            dense: DENSE.iter().map(|d| (read(&format!("{folder}/{d}/config.json")), read(&format!("{folder}/{d}/model.safetensors")))).collect(),
        }
    }

    fn load(&self, max_tokens: usize) -> Result<Embedder, InferenceError> {
        let dense: Vec<DenseFiles<'_>> = self.dense.iter().map(|(config, weights)| DenseFiles { config, weights }).collect();
        let settings = EmbedderSettings { pooling: Pooling::Mean, normalize: true, max_tokens, dimensions: Some(48), backend: Backend::Fused };
        Embedder::load(ModelFiles { config: &self.config, tokenizer: &self.tokenizer, weights: &self.weights, dense: &dense }, settings)
    }
}

/// One folder loaded as the enclave loads a model: its config, the shared weights and tokenizer,
/// its Dense modules, mean pooling and the folder's length.
fn engine(entry: &Value, folder: &str, limits: BatchLimits) -> Engine {
    assert_eq!(entry["pooling"], "mean");
    let embedder = Files::read(folder).load(entry["max_seq_length"].as_u64().unwrap() as usize).unwrap_or_else(|e| panic!("gemma3/{folder}: {e}"));
    assert_eq!((embedder.architecture(), embedder.dimensions()), (Architecture::Gemma3, 48));
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
}


#[test]
fn gemma3_embeds_as_sentence_transformers_does() {
    let reference = reference();
    let arch = &reference["architectures"]["gemma3"];
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    for folder in FOLDERS {
        let entry = &arch["folders"][folder];
        let limit = entry["max_seq_length"].as_u64().unwrap() as u32;
        let engine = engine(entry, folder, BatchLimits::default());
        let runs = prompt_runs(entry);
        assert_eq!(runs.len(), 5);
        for (name, prompt) in runs {
            let cases = matrix_cases(&reference, "gemma3", folder, &name);
            assert!(cases.iter().any(|c| c.truncated && c.tokens == limit), "{folder} {name:?}: a text cut at {limit}");
            assert!(cases.iter().filter(|c| c.tokens > 400).count() >= 3, "{folder} {name:?}: long texts");
            let label = format!("gemma3/{folder} prompt {name:?}");
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
        assert!(matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture: "gemma3_text" }), "{err}");
    }
    if !bf16 {
        eprintln!("gemma3 bf16: skipped, this CPU has no AVX-512 BF16");
    }
}

/// Packing changes nothing: windows, rotary places and means are per sequence, so each text alone
/// and all of them packed together give the same vectors.
#[test]
fn gemma3_packing_does_not_change_vectors() {
    let reference = reference();
    let entry = &reference["architectures"]["gemma3"]["folders"]["v6-mean"];
    let cases = matrix_cases(&reference, "gemma3", "v6-mean", "");
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

/// Dense modules that do not fit are refused by module, file and field: a non-identity activation,
/// a module the engine does not know a setting of, weights of another shape, the two modules in the
/// other order, one missing (the manifest's dimensions no longer match), a bias the file lacks.
#[test]
fn dense_modules_that_do_not_fit_are_refused_by_name() {
    let files = Files::read("v6-mean");
    let edit = |index: usize, f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut copy = Files::read("v6-mean");
        let mut config: Value = serde_json::from_slice(&copy.dense[index].0).unwrap();
        f(config.as_object_mut().unwrap());
        copy.dense[index].0 = serde_json::to_vec(&config).unwrap();
        copy
    };
    let refused = |files: Files| files.load(1000).map(|_| ()).unwrap_err();
    let by_field = |err: InferenceError, index: usize, file: &str, field: &str| {
        assert!(
            matches!(&err, InferenceError::Dense { index: i, file: f, field: g, .. } if *i == index && *f == file && g == field),
            "{index} {file} {field}: {err}"
        );
    };
    by_field(refused(edit(0, &|c| { c.insert("activation_function".into(), "torch.nn.modules.activation.Tanh".into()); })), 0, "config.json", "activation_function");
    by_field(refused(edit(1, &|c| { c.remove("activation_function"); })), 1, "config.json", "activation_function");
    by_field(refused(edit(1, &|c| { c.insert("use_residual".into(), true.into()); })), 1, "config.json", "use_residual");
    by_field(refused(edit(0, &|c| { c.insert("module_output_name".into(), "token_embeddings".into()); })), 0, "config.json", "module_output_name");
    by_field(refused(edit(0, &|c| { c.insert("bias".into(), true.into()); })), 0, "model.safetensors", "linear");
    by_field(refused(edit(0, &|c| { c.insert("out_features".into(), 97.into()); })), 0, "model.safetensors", "linear");
    // The host cannot change a sealed file, but the files' order is what the engine trusts: the
    // two modules swapped no longer chain (48 → 96 → 48 read as 96 → 48 first).
    let mut swapped = Files::read("v6-mean");
    swapped.dense.swap(0, 1);
    by_field(refused(swapped), 0, "config.json", "in_features");
    // A module dropped: the vectors are 96 wide where the manifest says 48.
    let mut dropped = Files::read("v6-mean");
    dropped.dense.pop();
    assert!(matches!(refused(dropped), InferenceError::Settings(m) if m.contains("96")));
    assert!(files.load(1000).is_ok());
}
