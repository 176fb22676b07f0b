//! The model matrix through the running stack: every folder of `testdata/models/` (BERT,
//! XLM-RoBERTa and MPNet × classic and 6.x configuration forms × mean and CLS pooling) onboarded
//! with the CLI (`model encrypt`, `model sign --development`, `model upload`), then batch jobs with
//! `submit --model` through the enclave worker, each record checked against sentence-transformers
//! on the same files: its token count (the model's own length, 200 or 512, never another's) and
//! its vector at cosine ≥ 0.9999 (f32) and ≥ 0.999 (bf16 where the CPU has it). The 6.x folders'
//! signed default prompt applies when a job names none; `--prompt passage` and `--prompt none`
//! select the others. The `v6-mean` folders are onboarded with Matryoshka lengths, and
//! `--dimensions 16` gives sentence-transformers' `truncate_dim=16` vectors; a length the model
//! does not offer and a prompt it does not name are refused at submit, naming the flag.
//!
//! ModernBERT (`testdata/models/modernbert/`: rotary positions, GeGLU, local and global layers,
//! 8,192 tokens) is checked in the engine the enclave runs, on every text, prompt and pooling of
//! its two folders: token counts equal, cosine ≥ 0.99999 f32 and ≥ 0.999 bf16. ModernBERT and
//! Qwen3 (`testdata/models/qwen3/`), Gemma 3 with its Dense modules (`testdata/models/gemma3/`)
//! NomicBERT (`testdata/models/nomic_bert/`) and GTE (`testdata/models/gte/`) also run as batch
//! jobs through the local stack.

mod matrix;

use std::path::PathBuf;
use std::time::Instant;

use std::sync::Arc;

use enclave_worker::inference::{
    Architecture, Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError,
    ModelFiles,
};
use matrix::{cosine, floats, norm, Run, ARCHITECTURES, FOLDERS, GEMMA3_FOLDERS, GTE_FOLDERS, MODERNBERT_FOLDERS, NOMIC_FOLDERS, QWEN3_FOLDERS};
use protocol::envelope::Precision;
use protocol::manifest::Pooling;
use serde_json::Value;

const F32_MIN_COSINE: f64 = 0.9999;
const BF16_MIN_COSINE: f64 = 0.999;
const MATRYOSHKA_FOLDER: &str = "v6-mean";

fn model_id(arch: &str, folder: &str) -> String {
    format!("test/{arch}-{folder}")
}

/// The Matryoshka lengths offered for a flagged folder: 16 and one more below the hidden size.
fn matryoshka(hidden: u64) -> String {
    if hidden > 32 { "16,32".to_owned() } else { format!("16,{}", hidden - 4) }
}

struct Matrix {
    stack: tests::Stack,
    work: tempfile::TempDir,
    corpus: PathBuf,
    reference: Value,
    texts: Vec<(String, String)>,
    jobs: usize,
}

impl Matrix {
    /// A running local stack and a corpus of `reference`'s texts, one record each, in order.
    fn up(reference: Value) -> Self {
        let texts = matrix::texts(&reference);
        let work = tempfile::tempdir().unwrap();
        let corpus = work.path().join("corpus.jsonl");
        let lines: Vec<String> = texts.iter().map(|(name, text)| serde_json::json!({"id": name, "text": text}).to_string()).collect();
        std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();
        Self { stack: tests::Stack::up(), work, corpus, reference, texts, jobs: 0 }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    fn onboard(&self, arch: &str, folder: &str, tokenizer: &[u8]) {
        let (dir, sealed) = (self.path(&format!("{arch}-{folder}")), self.path(&format!("{arch}-{folder}.sealed")));
        matrix::assemble(arch, folder, tokenizer, &dir);
        let hidden = self.reference["architectures"][arch]["hidden_size"].as_u64().unwrap();
        let lengths = matryoshka(hidden);
        let extra = if folder == MATRYOSHKA_FOLDER { vec!["--matryoshka", lengths.as_str()] } else { Vec::new() };
        self.stack.onboard(&dir, &model_id(arch, folder), &sealed, &extra);
    }

    /// One batch job over every reference text; its records, in order.
    fn job(&mut self, arch: &str, folder: &str, extra: &[&str]) -> Vec<Value> {
        self.jobs += 1;
        let out = self.path(&format!("out-{}.jsonl", self.jobs));
        let id = model_id(arch, folder);
        let mut args = vec!["submit", self.corpus.to_str().unwrap(), "--model", &id, "--wait", "-o", out.to_str().unwrap(), "--json"];
        args.extend(extra);
        let report = tests::json(&self.stack.ok(&args));
        let n = self.texts.len() as u64;
        assert_eq!((report["embedded"].as_u64(), report["errors"].as_u64()), (Some(n), Some(0)), "{id} {extra:?}: {report}");
        // The receipt was checked to state the prompt and length the job asked for.
        assert_eq!(report["verified"], true, "{id} {extra:?}: {report}");
        let records = tests::json_lines(&out);
        assert_eq!(records.len(), self.texts.len(), "{id} {extra:?}");
        for (record, (name, _)) in records.iter().zip(&self.texts) {
            assert_eq!(record["id"].as_str(), Some(name.as_str()), "{id} {extra:?}: records in order");
        }
        records
    }

    /// A submit that must be refused before any job exists; its message.
    fn refused(&self, arch: &str, folder: &str, extra: &[&str]) -> String {
        let id = model_id(arch, folder);
        let out = self.path("refused.jsonl");
        let mut args = vec!["submit", self.corpus.to_str().unwrap(), "--model", &id, "--wait", "-o", out.to_str().unwrap()];
        args.extend(extra);
        let output = self.stack.cli(&args);
        assert!(!output.status.success(), "{id} {extra:?} was accepted:\n{}", self.stack.describe(&output));
        assert!(!out.exists(), "{id} {extra:?}: no output for a refused job");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

/// Every record at the reference's token count and at `bound` to its vector; the lowest cosine.
fn check(records: &[Value], run: &Run, dimensions: u64, bound: f64, label: &str) -> f64 {
    let mut lowest = f64::MAX;
    for (index, record) in records.iter().enumerate() {
        let name = record["id"].as_str().unwrap();
        assert_eq!(record["tokens"].as_u64(), Some(run.tokens[index]), "{label} {name}: cut at the model's own length");
        let vector = floats(&record["embedding"]);
        assert_eq!(vector.len() as u64, dimensions, "{label} {name}");
        let similarity = cosine(&vector, &run.vectors[index]);
        assert!(similarity >= bound, "{label} {name}: cosine {similarity}");
        lowest = lowest.min(similarity);
    }
    lowest
}

fn truncated(vector: &[f32], n: usize) -> Vec<f32> {
    let norm = norm(&vector[..n]) as f32;
    vector[..n].iter().map(|x| x / norm).collect()
}

#[test]
fn every_model_in_the_matrix_serves_batch_jobs_as_sentence_transformers_does() {
    let started = Instant::now();
    let mut m = Matrix::up(matrix::reference());
    for arch in ARCHITECTURES {
        let tokenizer = matrix::tokenizer(&m.reference, arch);
        for folder in FOLDERS {
            m.onboard(arch, folder, &tokenizer);
        }
    }
    eprintln!("onboarded {} models in {:.1}s", ARCHITECTURES.len() * FOLDERS.len(), started.elapsed().as_secs_f64());

    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    let mut cut_at = std::collections::BTreeSet::new();
    for arch in ARCHITECTURES {
        let hidden = m.reference["architectures"][arch]["hidden_size"].as_u64().unwrap();
        for folder in FOLDERS {
            let entry = matrix::folder(&m.reference, arch, folder).clone();
            let label = format!("{arch}/{folder}");
            let limit = entry["max_seq_length"].as_u64().unwrap();
            // No prompt flag: the signed default prompt ("query" in the 6.x folders) or none.
            let default = entry["default_prompt_name"].as_str().unwrap_or("");
            let run = matrix::run(&m.reference, arch, folder, default);
            let records = m.job(arch, folder, &[]);
            let lowest = check(&records, &run, hidden, F32_MIN_COSINE, &label);
            eprintln!("{label} default prompt {default:?} f32: lowest cosine {lowest:.7}");
            let full: Vec<Vec<f32>> = records.iter().map(|r| floats(&r["embedding"])).collect();
            let tokens: Vec<u64> = records.iter().map(|r| r["tokens"].as_u64().unwrap()).collect();
            assert!(tokens.contains(&limit), "{label}: a text cut at its own limit {limit}");
            assert!(tokens.iter().all(|&t| t <= limit), "{label}");
            cut_at.insert(limit);

            if bf16 {
                let records = m.job(arch, folder, &["--precision", "bf16"]);
                let lowest = check(&records, &run, hidden, BF16_MIN_COSINE, &label);
                eprintln!("{label} default prompt bf16: lowest cosine {lowest:.7}");
            }
            if entry["form"] == "v6" {
                for (flag, prompt) in [("passage", "passage"), ("none", "")] {
                    let records = m.job(arch, folder, &["--prompt", flag]);
                    let lowest = check(&records, &matrix::run(&m.reference, arch, folder, prompt), hidden, F32_MIN_COSINE, &label);
                    eprintln!("{label} --prompt {flag} f32: lowest cosine {lowest:.7}");
                }
            } else {
                let refused = m.refused(arch, folder, &["--prompt", "query"]);
                assert!(refused.contains("--prompt"), "{label}: {refused}");
            }
            if folder == MATRYOSHKA_FOLDER {
                // sentence-transformers' truncate_dim=16 with normalisation, for the default prompt.
                let expected: Vec<Vec<f32>> =
                    entry["truncate_dim"][default].as_array().unwrap().iter().map(floats).collect();
                let records = m.job(arch, folder, &["--dimensions", "16"]);
                let run16 = Run { tokens: run.tokens.clone(), vectors: expected };
                let lowest = check(&records, &run16, 16, F32_MIN_COSINE, &label);
                eprintln!("{label} --dimensions 16: lowest cosine {lowest:.7}");
                for (record, vector) in records.iter().zip(&full) {
                    let short = floats(&record["embedding"]);
                    assert!((norm(&short) - 1.0).abs() < 1e-5, "{label}: normalised");
                    let diff = short.iter().zip(truncated(vector, 16)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(diff < 2e-5, "{label} {}: {diff} from the full vector truncated and renormalised", record["id"]);
                }
            } else {
                let refused = m.refused(arch, folder, &["--dimensions", "16"]);
                assert!(refused.contains("--dimensions"), "{label}: {refused}");
            }
        }
    }
    assert_eq!(cut_at.into_iter().collect::<Vec<_>>(), [200, 512], "texts cut at each model's own length");
    let refused = m.refused("xlm-roberta", MATRYOSHKA_FOLDER, &["--prompt", "nosuch"]);
    assert!(refused.contains("--prompt") && refused.contains("nosuch"), "{refused}");
    let refused = m.refused("mpnet", MATRYOSHKA_FOLDER, &["--dimensions", "24"]);
    assert!(refused.contains("--dimensions"), "{refused}");
    eprintln!("{} jobs in {:.1}s", m.jobs, started.elapsed().as_secs_f64());
}


const MODERNBERT_F32_MIN_COSINE: f64 = 0.99999;

/// One ModernBERT folder loaded as the enclave loads a model: its config, the shared weights and
/// tokenizer, the folder's pooling and length.
fn modernbert_engine(entry: &Value, folder: &str, limits: BatchLimits) -> Engine {
    let dir = matrix::data().join("modernbert");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("modernbert/{name}: {e}"));
    let (config, tokenizer, weights) = (read(&format!("{folder}/config.json")), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings {
        pooling: if entry["pooling"] == "cls" { Pooling::Cls } else { Pooling::Mean },
        normalize: entry["normalize"].as_bool().unwrap(),
        max_tokens: entry["max_seq_length"].as_u64().unwrap() as usize,
        dimensions: Some(36),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)
        .unwrap_or_else(|e| panic!("modernbert/{folder}: {e}"));
    assert_eq!(embedder.architecture(), Architecture::ModernBert);
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, limits, ..Default::default() }).unwrap()
}

/// Every text at the reference's token count and at `bound` to its vector; the lowest cosine
/// and its text.
fn check_engine(engine: &Engine, texts: &[&str], run: &Run, options: &EmbedOptions, bound: f64, label: &str) -> (f64, String) {
    let mut lowest = (f64::MAX, String::new());
    for (index, result) in engine.embed_window(texts, options).into_iter().enumerate() {
        let embedding = result.unwrap_or_else(|e| panic!("{label} text {index}: {e}"));
        assert_eq!(u64::from(embedding.tokens), run.tokens[index], "{label} text {index}: token count");
        let similarity = cosine(&embedding.vector, &run.vectors[index]);
        assert!(similarity >= bound, "{label} text {index} ({} tokens): cosine {similarity}", embedding.tokens);
        if similarity < lowest.0 {
            lowest = (similarity, format!("text {index}, {} tokens", embedding.tokens));
        }
    }
    lowest
}

#[test]
fn modernbert_embeds_as_sentence_transformers_does() {
    let reference = matrix::modernbert_reference();
    let names_and_texts = matrix::texts(&reference);
    let texts: Vec<&str> = names_and_texts.iter().map(|(_, t)| t.as_str()).collect();
    let arch = &reference["architectures"]["modernbert"];
    assert_eq!(arch["layer_types"], serde_json::json!(["full_attention", "sliding_attention", "sliding_attention", "full_attention"]));
    let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
    for folder in MODERNBERT_FOLDERS {
        let entry = &arch["folders"][folder];
        let engine = modernbert_engine(entry, folder, BatchLimits::default());
        let tokens = matrix::run(&reference, "modernbert", folder, "").tokens;
        assert!(tokens.contains(&8192), "{folder}: a text cut at 8,192");
        assert!(tokens.iter().filter(|&&t| t > 16).count() >= 10, "{folder}: texts past the local window");
        let mut runs = vec![("".to_owned(), None)];
        for (name, text) in entry["prompts"].as_object().unwrap() {
            runs.push((name.clone(), Some(Arc::<str>::from(text.as_str().unwrap()))));
        }
        for (name, prompt) in runs {
            let run = matrix::run(&reference, "modernbert", folder, &name);
            let label = format!("modernbert/{folder} prompt {name:?}");
            let normalize = entry["normalize"].as_bool().unwrap();
            let options = EmbedOptions { prompt: prompt.clone(), normalize, ..Default::default() };
            let (lowest, at) = check_engine(&engine, &texts, &run, &options, MODERNBERT_F32_MIN_COSINE, &label);
            eprintln!("{label} f32: lowest cosine {lowest:.7} ({at})");
            if bf16 {
                let options = EmbedOptions { precision: Precision::Bf16, ..options };
                let (lowest, at) = check_engine(&engine, &texts, &run, &options, BF16_MIN_COSINE, &label);
                eprintln!("{label} bf16: lowest cosine {lowest:.7} ({at})");
            }
        }
        // int8's bound is measured on BERT only: refused by name.
        let err = engine.embedder().check_precision(Precision::Int8).unwrap_err();
        assert!(
            matches!(&err, InferenceError::UnsupportedPrecisionFor { precision: "int8", architecture: "modernbert" }),
            "{err}"
        );
    }
    if !bf16 {
        eprintln!("modernbert bf16: skipped, this CPU has no AVX-512 BF16");
    }
}

/// ModernBERT through the local stack as a user runs it: `model encrypt` onboards each folder,
/// and a batch job over every reference text — up to 8,192 tokens, one cut there — gives
/// sentence-transformers' vectors and token counts, with the folder's default prompt.
/// A family beyond the matrix, through the local stack: `model encrypt` onboards each of its
/// folders, and batch jobs with the folder's default prompt, with another prompt where the family
/// has one, and at bf16 give sentence-transformers' vectors and token counts, a text cut at each
/// folder's own length; int8 is refused. Returns the stack and the family's tokenizer.
struct Family {
    arch: &'static str,
    reference: fn() -> Value,
    folders: &'static [&'static str],
    /// The reference field with the vectors' width (`dimensions` after Dense modules).
    width: &'static str,
    /// The prompt a second job asks for, given the folder's default: (flag value, prompt name).
    other_prompt: fn(&str) -> Option<(&'static str, &'static str)>,
}

impl Family {
    fn serves_batch_jobs(&self) -> (Matrix, Vec<u8>) {
        let arch = self.arch;
        let mut m = Matrix::up((self.reference)());
        let tokenizer = matrix::tokenizer(&m.reference, arch);
        let width = m.reference["architectures"][arch][self.width].as_u64().unwrap();
        let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
        for folder in self.folders {
            m.onboard(arch, folder, &tokenizer);
            let entry = m.reference["architectures"][arch]["folders"][folder].clone();
            let limit = entry["max_seq_length"].as_u64().unwrap();
            let default = entry["default_prompt_name"].as_str().unwrap_or("");
            let label = format!("{arch}/{folder} (local stack)");
            // No flag (the signed default prompt, if any), then another prompt.
            let mut jobs = vec![(Vec::new(), default)];
            jobs.extend((self.other_prompt)(default).map(|(flag, prompt)| (vec!["--prompt", flag], prompt)));
            for (flags, prompt) in jobs {
                let run = matrix::run(&m.reference, arch, folder, prompt);
                let records = m.job(arch, folder, &flags);
                let lowest = check(&records, &run, width, FAMILY_F32_MIN_COSINE, &label);
                assert!(records.iter().any(|r| r["tokens"] == limit), "{label} {flags:?}: a text cut at {limit} tokens");
                eprintln!("{label} {flags:?} prompt {prompt:?} f32: lowest cosine {lowest:.7}");
            }
            if bf16 {
                let records = m.job(arch, folder, &["--precision", "bf16"]);
                let lowest = check(&records, &matrix::run(&m.reference, arch, folder, default), width, BF16_MIN_COSINE, &label);
                eprintln!("{label} bf16: lowest cosine {lowest:.7}");
            } else {
                eprintln!("{label}: this CPU lacks AVX-512 BF16, bf16 not checked");
            }
            let refused = m.refused(arch, folder, &["--precision", "int8"]);
            assert!(refused.contains("int8"), "{label}: {refused}");
        }
        (m, tokenizer)
    }
}

/// The families' f32 bound: the engine computes them as their reference does, in f32.
const FAMILY_F32_MIN_COSINE: f64 = 0.99999;

/// ModernBERT (rotary positions, GeGLU, local and global layers; a text cut at 8,192 tokens).
#[test]
fn modernbert_serves_batch_jobs_through_the_local_stack() {
    let family = Family {
        arch: "modernbert",
        reference: matrix::modernbert_reference,
        folders: &MODERNBERT_FOLDERS,
        width: "hidden_size",
        other_prompt: |_| None,
    };
    family.serves_batch_jobs();
}

/// Packing changes nothing: rotary places and local windows are per sequence, so each text alone
/// and all of them packed together give the same vectors.
#[test]
fn modernbert_packing_does_not_change_vectors() {
    let reference = matrix::modernbert_reference();
    let names_and_texts = matrix::texts(&reference);
    // The texts below 4,000 tokens, so that many share a pass.
    let texts: Vec<&str> = names_and_texts.iter().map(|(_, t)| t.as_str()).filter(|t| t.len() < 6_000).collect();
    let entry = &reference["architectures"]["modernbert"]["folders"]["v6-mean"];
    let one = modernbert_engine(entry, "v6-mean", BatchLimits { max_batch_size: 1, ..Default::default() });
    let many = modernbert_engine(entry, "v6-mean", BatchLimits { max_batch_size: 64, max_padded_tokens: 1 << 16 });
    let options = EmbedOptions::default();
    let alone = one.embed_window(&texts, &options);
    let packed = many.embed_window(&texts, &options);
    assert!(many.metrics().batches < one.metrics().batches);
    for (index, (a, b)) in alone.into_iter().zip(packed).enumerate() {
        let (a, b) = (a.unwrap().vector, b.unwrap().vector);
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "text {index}: {diff}");
    }
}

/// Qwen3 (a causal decoder, grouped-query attention, last-token pooling, Qwen3-Embedding's
/// instruction prompt), up to each folder's own length (8,192 and 1,000): with `--prompt query`
/// or `--prompt none`, whichever the default is not.
#[test]
fn qwen3_serves_batch_jobs_through_the_local_stack() {
    let family = Family {
        arch: "qwen3",
        reference: matrix::qwen3_reference,
        folders: &QWEN3_FOLDERS,
        width: "hidden_size",
        other_prompt: |default| Some(if default.is_empty() { ("query", "query") } else { ("none", "") }),
    };
    family.serves_batch_jobs();
}

/// Gemma 3 with bidirectional attention, mean pooling and two Dense modules (EmbeddingGemma's
/// pipeline; the Dense modules sealed with the model): the 48 Dense-projected values, up to each
/// folder's own length (2,048 and 1,000), with another of EmbeddingGemma's prompts. Then the host
/// swaps the two sealed Dense files of a freshly onboarded copy: the worker refuses to load it.
#[test]
fn gemma3_serves_batch_jobs_through_the_local_stack() {
    let family = Family {
        arch: "gemma3",
        reference: matrix::gemma3_reference,
        folders: &GEMMA3_FOLDERS,
        width: "dimensions",
        other_prompt: |default| Some(if default.is_empty() { ("query", "query") } else { ("STS", "STS") }),
    };
    let (m, tokenizer) = family.serves_batch_jobs();
    host_swaps_the_dense_files(&m, &tokenizer);
}

/// NomicBERT (rotary positions, SwiGLU, post-norm, nomic-embed-text's task prefixes), with
/// `--prompt search_document`, a text cut at each folder's own length (2,048 and 1,000).
#[test]
fn nomic_bert_serves_batch_jobs_through_the_local_stack() {
    let family = Family {
        arch: "nomic_bert",
        reference: matrix::nomic_reference,
        folders: &NOMIC_FOLDERS,
        width: "hidden_size",
        other_prompt: |_| Some(("search_document", "search_document")),
    };
    family.serves_batch_jobs();
}

/// GTE (rotary positions, biased attention, GeGLU, post-norm; CLS without Normalize, and mean
/// with a default prompt), with `--prompt document`, a text cut at each folder's own length.
#[test]
fn gte_serves_batch_jobs_through_the_local_stack() {
    let family = Family {
        arch: "gte",
        reference: matrix::gte_reference,
        folders: &GTE_FOLDERS,
        width: "hidden_size",
        other_prompt: |_| Some(("document", "document")),
    };
    family.serves_batch_jobs();
}

/// The host holds the sealed files: it swaps `dense.0.safetensors` and `dense.1.safetensors` of a
/// model no worker has loaded yet. Each file is sealed under its own name's key and hashed in the
/// signed manifest, so the worker refuses the model and the job fails; no vector comes back.
fn host_swaps_the_dense_files(m: &Matrix, tokenizer: &[u8]) {
    let (dir, sealed) = (m.path("gemma3-swapped"), m.path("gemma3-swapped.sealed"));
    matrix::assemble("gemma3", "v6-mean", tokenizer, &dir);
    let id = "test/gemma3-swapped";
    m.stack.onboard(&dir, id, &sealed, &[]);
    let stored = |name: &str| {
        let found: Vec<PathBuf> = tests::files_under(m.stack.home())
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("gemma3-swapped") && p.file_name().is_some_and(|f| f.to_string_lossy().starts_with(name)))
            .filter(|p| !p.starts_with(&sealed))
            .collect();
        assert_eq!(found.len(), 1, "{name} in the store: {found:?}");
        found.into_iter().next().unwrap()
    };
    let (first, second) = (stored("dense.0.safetensors"), stored("dense.1.safetensors"));
    let (a, b) = (std::fs::read(&first).unwrap(), std::fs::read(&second).unwrap());
    std::fs::write(&first, &b).unwrap();
    std::fs::write(&second, &a).unwrap();
    let out = m.path("swapped.jsonl");
    let output = m.stack.cli(&["submit", m.corpus.to_str().unwrap(), "--model", id, "--wait", "-o", out.to_str().unwrap(), "--json"]);
    let shown = m.stack.describe(&output);
    let embedded = out.exists() && tests::json_lines(&out).iter().any(|r| r.get("embedding").is_some());
    assert!(!output.status.success() && !embedded, "a model with swapped Dense files served vectors:\n{shown}");
    // The worker names the file that did not open (each is sealed under its own name's stream).
    assert!(shown.contains("dense.0.safetensors"), "the refusal names the swapped file:\n{shown}");
    eprintln!("gemma3 with its Dense files swapped by the host: refused:\n{shown}");
}
