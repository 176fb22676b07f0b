//! The model matrix (`testdata/models/`, written by `scripts/make_test_models.py`: BERT,
//! XLM-RoBERTa and MPNet, each in the classic and 6.x configuration forms × mean and CLS
//! pooling), onboarded through the real `model encrypt`/`sign` path and embedded by the enclave's
//! engine from the sealed files with the settings of the signed manifest: every text, with no
//! prompt and with each signed prompt, at sentence-transformers' token count and at cosine
//! ≥ 0.9999 (f32) and ≥ 0.999 (bf16 where the CPU has it) to its vector. Needs the installed
//! tokenizer (scripts/setup-model.sh). The same matrix through the running stack is
//! tests/model_matrix.rs.

mod matrix;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cloud::kms::Kms;
use cloud_local::kms::{AttestationTrust, LocalKeyPolicy, LocalKms};
use enclave_worker::inference::{Backend, DenseFiles, Embedder, EmbedderSettings, ModelFiles};
use ephem_batch_client::model::{self, MODEL_FILES};
use matrix::{cosine, norm, ARCHITECTURES, FOLDERS, GEMMA3_FOLDERS};
use protocol::envelope::Precision;
use protocol::manifest::{Manifest, Pooling, SignedManifest};
use protocol::stream::StreamOpener;
use serde_json::Value;

/// Onboards one model directory: encrypt with a local KMS key, sign, decode the signed manifest,
/// release the data key and open the sealed files as the enclave's loader does.
fn onboard_dir(name: &str, dir: &Path, work: &Path) -> (Manifest, BTreeMap<String, Vec<u8>>) {
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
    // Every file the signed manifest names (the model's three, and each Dense module's two).
    for file in MODEL_FILES {
        assert!(manifest.file(file).is_some(), "{name}: {file}");
    }
    let files = manifest
        .files
        .iter()
        .map(|file| {
            let file = file.name.as_str();
            let sealed = std::fs::read(staging.join(model::sealed_file_name(file))).unwrap();
            let mut opener = StreamOpener::new(&manifest.file_key(&dek, file), manifest.file_stream_id(file));
            let mut plain = Vec::new();
            opener.push(&sealed, &mut plain).unwrap();
            opener.finish(&mut plain).unwrap();
            (file.to_owned(), plain)
        })
        .collect();
    (manifest, files)
}

/// The signed manifest states what sentence-transformers read from the folder.
fn check_manifest(manifest: &Manifest, entry: &Value, dimensions: u64, label: &str) {
    let pooling = match entry["pooling"].as_str().unwrap() {
        "mean" => Pooling::Mean,
        "cls" => Pooling::Cls,
        other => panic!("{label}: pooling {other}"),
    };
    assert_eq!(manifest.pooling, pooling, "{label}");
    assert_eq!(Some(manifest.normalize), entry["normalize"].as_bool(), "{label}");
    assert_eq!(Some(u64::from(manifest.max_tokens)), entry["max_seq_length"].as_u64(), "{label}: the model's own length");
    assert_eq!(u64::from(manifest.dimensions), dimensions, "{label}");
    assert_eq!(manifest.prompts.default.as_deref(), entry["default_prompt_name"].as_str(), "{label}");
    for (name, text) in entry["prompts"].as_object().unwrap() {
        assert_eq!(manifest.prompts.get(name), text.as_str(), "{label}: prompt {name}");
    }
    // The matrix's classic folders have no prompts (2.x wrote none); EmbeddingGemma's has its own.
    if entry["form"] == "classic" && entry["prompts"].as_object().is_none_or(|p| p.is_empty()) {
        assert!(manifest.prompts.get("query").is_none(), "{label}: the classic form has no prompts");
    }
}

#[test]
fn every_folder_embeds_as_sentence_transformers_does() {
    let reference = matrix::reference();
    let texts = matrix::texts(&reference);
    let work = tempfile::tempdir().unwrap();
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    let mut checked = 0;
    for arch in ARCHITECTURES {
        let tokenizer = matrix::tokenizer(&reference, arch);
        let dimensions = reference["architectures"][arch]["hidden_size"].as_u64().unwrap();
        for name in FOLDERS {
            let label = format!("{arch}/{name}");
            let dir = work.path().join(arch).join(name);
            matrix::assemble(arch, name, &tokenizer, &dir);
            let (manifest, files) = onboard_dir(&format!("{arch}-{name}"), &dir, work.path());
            let entry = matrix::folder(&reference, arch, name);
            check_manifest(&manifest, entry, dimensions, &label);
            assert_eq!(manifest.dense_modules().unwrap(), 0, "{label}");
            let [config, weights, tokenizer] = [&files["config.json"], &files["model.safetensors"], &files["tokenizer.json"]];
            let settings = EmbedderSettings { backend: Backend::Fused, ..EmbedderSettings::from_manifest(&manifest) };
            let embedder = Embedder::load(ModelFiles { config, tokenizer, weights, dense: &[] }, settings).unwrap();
            let mut precisions = vec![(Precision::Fp32, 0.9999)];
            if bf16 {
                assert!(embedder.supports_precision(Precision::Bf16), "{label}: bf16 on a CPU that has it");
                precisions.push((Precision::Bf16, 0.999));
            }
            let mut prompts = vec![String::new()];
            prompts.extend(matrix::prompt_names(&reference, arch, name));
            for prompt in &prompts {
                let run = matrix::run(&reference, arch, name, prompt);
                // The signed prompt's text before the text is sentence-transformers' prompt_name.
                let prefix = if prompt.is_empty() { "" } else { manifest.prompts.get(prompt).unwrap() };
                for (precision, bound) in &precisions {
                    let mut lowest = f64::MAX;
                    for (index, (case, text)) in texts.iter().enumerate() {
                        let tokenized = embedder.tokenize(format!("{prefix}{text}").as_bytes(), true).unwrap();
                        assert_eq!(tokenized.tokens() as u64, run.tokens[index], "{label} {case} prompt {prompt:?}");
                        let vector = embedder.embed_batch(&[&tokenized], manifest.normalize, *precision).unwrap().remove(0);
                        assert_eq!(vector.len() as u64, dimensions, "{label}");
                        let similarity = cosine(&vector, &run.vectors[index]);
                        assert!(similarity >= *bound, "{label} {case} prompt {prompt:?} {precision:?}: cosine {similarity}");
                        lowest = lowest.min(similarity);
                        if manifest.normalize {
                            assert!((norm(&vector) - 1.0).abs() < 1e-4, "{label}: normalised");
                        }
                        checked += 1;
                    }
                    eprintln!("{label} prompt {prompt:?} {precision:?}: lowest cosine {lowest:.7}");
                }
            }
            // Cut at the model's own length, never another's: some texts reach it exactly.
            let run = matrix::run(&reference, arch, name, "");
            assert!(run.tokens.iter().any(|&t| t == u64::from(manifest.max_tokens)), "{label}: a text cut at its limit");
            if manifest.max_tokens == 512 {
                assert!(run.tokens.iter().any(|&t| t > 256 && t < 512), "{label}: texts past 256 tokens, not cut");
            }
        }
    }
    eprintln!("{checked} vectors checked");
}

/// What the engine cannot compute is refused at onboarding, naming the field.
#[test]
fn an_mpnet_with_other_buckets_is_refused_at_onboarding() {
    let reference = matrix::reference();
    let work = tempfile::tempdir().unwrap();
    let odd = work.path().join("mpnet-64");
    matrix::assemble("mpnet", "v6-mean", &matrix::tokenizer(&reference, "mpnet"), &odd);
    model::read_settings(&odd).unwrap();
    let config_path = odd.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["relative_attention_num_buckets"] = 64.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let refused = model::read_settings(&odd).unwrap_err().to_string();
    assert!(refused.contains("relative_attention_num_buckets"), "{refused}");
}

/// Gemma 3 with two Dense modules after its mean pooling (`testdata/models/gemma3/`), onboarded
/// through `model encrypt`/`sign`: the signed manifest lists the modules' files (`dense.0.*`,
/// `dense.1.*`) beside the model's three, its dimensions are the last module's output, and the
/// engine loaded from the opened files gives sentence-transformers' vectors for every text and
/// prompt at f32.
#[test]
fn gemma3_folders_embed_from_their_sealed_files_with_their_dense_modules() {
    let reference = matrix::gemma3_reference();
    let texts = matrix::texts(&reference);
    let work = tempfile::tempdir().unwrap();
    let tokenizer = matrix::tokenizer(&reference, "gemma3");
    let dimensions = reference["architectures"]["gemma3"]["dimensions"].as_u64().unwrap();
    for name in GEMMA3_FOLDERS {
        let label = format!("gemma3/{name}");
        let dir = work.path().join("gemma3").join(name);
        matrix::assemble("gemma3", name, &tokenizer, &dir);
        let (manifest, files) = onboard_dir(&format!("gemma3-{name}"), &dir, work.path());
        let entry = matrix::folder(&reference, "gemma3", name);
        check_manifest(&manifest, entry, dimensions, &label);
        assert_eq!(manifest.dense_modules().unwrap(), 2, "{label}");
        assert_eq!(files["dense.1.config.json"], std::fs::read(dir.join("3_Dense/config.json")).unwrap(), "{label}: in pipeline order");
        let dense: Vec<DenseFiles<'_>> = (0..2)
            .map(|i| {
                let [config, weights] = protocol::manifest::dense_file_names(i);
                DenseFiles { config: &files[&config], weights: &files[&weights] }
            })
            .collect();
        let model_files = ModelFiles { config: &files["config.json"], tokenizer: &files["tokenizer.json"], weights: &files["model.safetensors"], dense: &dense };
        let settings = EmbedderSettings { backend: Backend::Fused, ..EmbedderSettings::from_manifest(&manifest) };
        let embedder = Embedder::load(model_files, settings).unwrap();
        let mut prompts = vec![String::new()];
        prompts.extend(matrix::prompt_names(&reference, "gemma3", name));
        for prompt in &prompts {
            let run = matrix::run(&reference, "gemma3", name, prompt);
            let prefix = if prompt.is_empty() { "" } else { manifest.prompts.get(prompt).unwrap() };
            let mut lowest = f64::MAX;
            for (index, (case, text)) in texts.iter().enumerate() {
                let tokenized = embedder.tokenize(format!("{prefix}{text}").as_bytes(), true).unwrap();
                assert_eq!(tokenized.tokens() as u64, run.tokens[index], "{label} {case} prompt {prompt:?}");
                let vector = embedder.embed_batch(&[&tokenized], manifest.normalize, Precision::Fp32).unwrap().remove(0);
                assert_eq!(vector.len() as u64, dimensions, "{label}");
                let similarity = cosine(&vector, &run.vectors[index]);
                assert!(similarity >= 0.99999, "{label} {case} prompt {prompt:?}: cosine {similarity}");
                lowest = lowest.min(similarity);
            }
            eprintln!("{label} prompt {prompt:?}: lowest cosine {lowest:.7}");
        }
    }
}
