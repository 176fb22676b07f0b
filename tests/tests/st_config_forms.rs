//! Tiny sentence-transformers checkpoints in both configuration forms
//! (`testdata/st-models`, written by `scripts/make_test_models.py`), onboarded through the real
//! `model encrypt`/`sign` path and embedded by the enclave's engine from the sealed files with the
//! settings of the signed manifest: every text at cosine ≥ 0.9999 to sentence-transformers, and
//! the token count it used. Needs the installed tokenizer (scripts/setup-model.sh).

use std::path::{Path, PathBuf};
use std::time::Duration;

use cloud::kms::Kms;
use cloud_local::kms::{AttestationTrust, LocalKeyPolicy, LocalKms};
use enclave_worker::inference::{Backend, Embedder, EmbedderSettings, ModelFiles};
use ephem_batch_client::model::{self, MODEL_FILES};
use protocol::envelope::Precision;
use protocol::manifest::{Manifest, Pooling, SignedManifest};
use protocol::stream::StreamOpener;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/st-models")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// One folder with the shared weights and the installed tokenizer: a model directory.
fn assemble(name: &str, tokenizer: &[u8], dir: &Path) {
    copy_dir(&data().join(name), dir);
    std::fs::copy(data().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("reference.json")).unwrap()).unwrap()
}

fn installed_tokenizer(reference: &Value) -> Vec<u8> {
    let path = tests::model_dir().join("tokenizer.json");
    let tokenizer = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup-model.sh", path.display()));
    assert_eq!(hex::encode(Sha256::digest(&tokenizer)), reference["tokenizer_sha256"].as_str().unwrap(), "the generator's tokenizer");
    tokenizer
}

/// Onboards one folder: encrypt with a local KMS key, sign, decode the signed manifest, release
/// the data key and open the sealed files as the enclave's loader does.
fn onboard(name: &str, tokenizer: &[u8], work: &Path) -> (Manifest, Vec<Vec<u8>>) {
    let dir = work.join(name);
    assemble(name, tokenizer, &dir);
    onboard_dir(name, &dir, work)
}

/// [`onboard`] of a complete model directory.
fn onboard_dir(name: &str, dir: &Path, work: &Path) -> (Manifest, Vec<Vec<u8>>) {
    let trust = AttestationTrust { root_pem_path: work.join("no-root.pem"), max_document_age: Duration::from_secs(300) };
    let kms = LocalKms::open(work.join(format!("{name}.kms.sqlite")), trust).unwrap();
    let key = kms.create_key(LocalKeyPolicy::unrestricted(), "st-config-forms").unwrap();
    let staging = work.join(format!("{name}.sealed"));
    model::encrypt(dir, &format!("test/{name}"), 1, &kms, &key, &staging).unwrap();
    let publisher = protocol::manifest::development_publisher();
    let signed = model::sign(&staging, &publisher).unwrap();
    let manifest = SignedManifest::decode(&signed.signed).unwrap().verify(&publisher.verifying_key()).unwrap().clone();
    let context = model::data_key_context(&manifest.model_id, manifest.version);
    let dek = kms.decrypt(Some(&key), &manifest.wrapped_dek, &context, None).unwrap().plaintext.unwrap();
    let dek: [u8; 32] = dek.as_slice().try_into().unwrap();
    let files = MODEL_FILES
        .iter()
        .map(|file| {
            let sealed = std::fs::read(staging.join(model::sealed_file_name(file))).unwrap();
            let mut opener = StreamOpener::new(&manifest.file_key(&dek, file), manifest.file_stream_id(file));
            let mut plain = Vec::new();
            opener.push(&sealed, &mut plain).unwrap();
            opener.finish(&mut plain).unwrap();
            plain
        })
        .collect();
    (manifest, files)
}

#[test]
fn both_configuration_forms_embed_as_sentence_transformers_does() {
    let reference = reference();
    let tokenizer = installed_tokenizer(&reference);
    let work = tempfile::tempdir().unwrap();
    let expected = [
        ("classic-mean", Pooling::Mean, true, 200),
        ("classic-cls", Pooling::Cls, false, 512),
        ("v6-mean", Pooling::Mean, true, 512),
        ("v6-cls", Pooling::Cls, false, 512),
    ];
    for (name, pooling, normalize, max_tokens) in expected {
        let (manifest, files) = onboard(name, &tokenizer, work.path());
        let entry = &reference["models"][name];
        assert_eq!((manifest.pooling, manifest.normalize, manifest.max_tokens), (pooling, normalize, max_tokens), "{name}");
        assert_eq!(u64::from(manifest.max_tokens), entry["max_seq_length"].as_u64().unwrap(), "{name}");
        let [config, weights, tokenizer] = [&files[0], &files[1], &files[2]];
        let settings = EmbedderSettings { backend: Backend::Fused, ..EmbedderSettings::from_manifest(&manifest) };
        let embedder = Embedder::load(ModelFiles { config, tokenizer, weights }, settings).unwrap();
        // sentence-transformers 6.x also writes empty "query" and "document" prompts; the reference has
        // prompted vectors for the model whose prompts have text.
        let prompt = manifest.prompts.get("query").filter(|_| entry.get("query_vectors").is_some());
        let mut lowest = f64::MAX;
        for (index, case) in entry["cases"].as_array().unwrap().iter().enumerate() {
            let text = case["text"].as_str().unwrap();
            let tokenized = embedder.tokenize(text.as_bytes(), true).unwrap();
            assert_eq!(tokenized.tokens() as u64, case["tokens"].as_u64().unwrap(), "{name} {}", case["name"]);
            let vector = embedder.embed_batch(&[&tokenized], manifest.normalize, Precision::Fp32).unwrap().remove(0);
            let similarity = cosine(&vector, &floats(&case["vector"]));
            assert!(similarity >= 0.9999, "{name} {}: cosine {similarity}", case["name"]);
            lowest = lowest.min(similarity);
            if manifest.normalize {
                let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-4, "{name}: normalised");
            }
            // The signed prompt text, put before the text, gives sentence-transformers' prompt_name="query".
            if let Some(prompt) = prompt {
                let tokenized = embedder.tokenize(format!("{prompt}{text}").as_bytes(), true).unwrap();
                let vector = embedder.embed_batch(&[&tokenized], true, Precision::Fp32).unwrap().remove(0);
                let similarity = cosine(&vector, &floats(&entry["query_vectors"][index]));
                assert!(similarity >= 0.9999, "{name} {} with the query prompt: cosine {similarity}", case["name"]);
            }
        }
        eprintln!("{name}: 1 - lowest cosine = {:.1e} over {} texts", 1.0 - lowest, entry["cases"].as_array().unwrap().len());
        if name.starts_with("v6") {
            // The 6.x form states no max_seq_length: the model's 512, never the old default of 256.
            let long = entry["cases"].as_array().unwrap().iter().filter(|c| c["tokens"].as_u64().unwrap() > 256).count();
            assert!(long >= 2, "{name}: texts embedded past 256 tokens");
        }
    }
    let (manifest, _) = onboard("v6-mean", &tokenizer, &work.path().join("again"));
    assert_eq!(manifest.prompts.default.as_deref(), Some("query"));
    assert_eq!(manifest.prompts.get("passage"), Some("passage: "));
}

/// The real proof: a 6.x-form model onboarded with the CLI (`model encrypt`, `sign --development`,
/// `upload`) into the local stack, and one batch job with `--model` through the enclave worker:
/// every text at sentence-transformers' token count (up to 512, not 256) and vector.
#[test]
fn a_six_form_model_serves_a_batch_job_at_its_own_length() {
    let reference = reference();
    let tokenizer = installed_tokenizer(&reference);
    let stack = tests::Stack::up();
    let work = tempfile::tempdir().unwrap();
    let (dir, sealed) = (work.path().join("v6-mean"), work.path().join("sealed"));
    assemble("v6-mean", &tokenizer, &dir);
    let model_id = "test/v6-mean";
    stack.ok(&["model", "encrypt", dir.to_str().unwrap(), "--model-id", model_id, "--version", "1", "-o", sealed.to_str().unwrap()]);
    stack.ok(&["model", "sign", sealed.to_str().unwrap(), "--development"]);
    stack.ok(&["model", "upload", sealed.to_str().unwrap()]);

    let entry = &reference["models"]["v6-mean"];
    let cases = entry["cases"].as_array().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    let lines: Vec<String> =
        cases.iter().map(|c| serde_json::json!({"id": c["name"], "text": c["text"]}).to_string()).collect();
    std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();
    let out = work.path().join("embeddings.jsonl");
    let report = stack.ok(&["submit", corpus.to_str().unwrap(), "--model", model_id, "--wait", "-o", out.to_str().unwrap(), "--json"]);
    let report = tests::json(&report);
    assert_eq!((report["embedded"].as_u64(), report["errors"].as_u64()), (Some(cases.len() as u64), Some(0)), "{report}");
    let results = tests::json_lines(&out);
    for (result, case) in results.iter().zip(cases) {
        assert_eq!(result["id"], case["name"]);
        assert_eq!(result["tokens"], case["tokens"], "{}", case["name"]);
        let vector = floats(&result["embedding"]);
        assert_eq!(vector.len(), 48, "the onboarded model's dimensions");
        let similarity = cosine(&vector, &floats(&case["vector"]));
        assert!(similarity >= 0.9999, "{}: cosine {similarity}", case["name"]);
    }
    assert!(results.iter().any(|r| r["tokens"].as_u64() == Some(512)), "texts embedded at 512 tokens");
}

/// The multilingual architectures (enclave-worker/testdata/arch-models, from
/// `scripts/make_arch_test_models.py`) onboard too: XLM-RoBERTa's positions after its padding
/// index and MPNet's fixed offset leave 512 of 514 positions, and the engine embeds the sealed
/// files as sentence-transformers does, at f32 and bf16.
#[test]
fn xlm_roberta_and_mpnet_onboard_and_embed_as_sentence_transformers_does() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../enclave-worker/testdata/arch-models");
    let work = tempfile::tempdir().unwrap();
    for name in ["xlm-roberta", "mpnet"] {
        let reference: Value = serde_json::from_slice(&std::fs::read(data.join(format!("{name}.reference.json"))).unwrap()).unwrap();
        let (manifest, files) = onboard_dir(name, &data.join(name), work.path());
        assert_eq!((manifest.pooling, manifest.normalize, manifest.max_tokens), (Pooling::Mean, true, 512), "{name}");
        let [config, weights, tokenizer] = [&files[0], &files[1], &files[2]];
        let settings = EmbedderSettings { backend: Backend::Fused, ..EmbedderSettings::from_manifest(&manifest) };
        let embedder = Embedder::load(ModelFiles { config, tokenizer, weights }, settings).unwrap();
        for (precision, bound) in [(Precision::Fp32, 0.9999), (Precision::Bf16, 0.999)] {
            if precision == Precision::Bf16 && !std::arch::is_x86_feature_detected!("avx512bf16") {
                continue;
            }
            for case in reference["cases"].as_array().unwrap() {
                let tokenized = embedder.tokenize(case["text"].as_str().unwrap().as_bytes(), true).unwrap();
                assert_eq!(tokenized.tokens() as u64, case["tokens"].as_u64().unwrap(), "{name} {}", case["name"]);
                let vector = embedder.embed_batch(&[&tokenized], true, precision).unwrap().remove(0);
                let similarity = cosine(&vector, &floats(&case["vector"]));
                assert!(similarity >= bound, "{name} {} {precision:?}: cosine {similarity}", case["name"]);
            }
        }
    }
    // What the engine cannot compute is refused at onboarding, naming the field.
    let odd = work.path().join("mpnet-64");
    copy_dir(&data.join("mpnet"), &odd);
    let config_path = odd.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["relative_attention_num_buckets"] = 64.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let refused = model::read_settings(&odd).unwrap_err().to_string();
    assert!(refused.contains("relative_attention_num_buckets"), "{refused}");
}
