//! Multi-vector output through the running local stack (issue "beyond one dense vector", item
//! 2): the generated ColBERT checkpoint (`testdata/outputs/colbert/`, sentence-transformers 6.2's
//! `MultiVectorEncoder` layout) onboarded with `model encrypt`/`sign`/`upload`, then batch jobs
//! with `submit --model`: every record's vectors match `MultiVectorEncoder.encode()` (same count,
//! cosine ≥ 0.9999 each), a record over `--max-record-bytes` fails alone into the errors file,
//! the receipt states the output kind and bound and a client whose record of them differs fails
//! `options`, one record is proven alone, and what the model does not give is refused at submit.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tests::{Stack, json_lines};

const MODEL: &str = "test/colbert";
const MIN_COSINE: f64 = 0.9999;

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/outputs"))
}

fn rows(value: &Value) -> Vec<Vec<f64>> {
    value.as_array().unwrap_or_else(|| panic!("not a list of vectors: {value}")).iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

fn assert_same(ours: &[Vec<f64>], reference: &[Vec<f64>], label: &str) {
    assert_eq!(ours.len(), reference.len(), "{label}: vector count");
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        let c = cosine(a, b);
        assert!(c >= MIN_COSINE, "{label}: token {i} cosine {c}");
        let norm = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{label}: token {i} norm {norm}");
    }
}

#[test]
fn colbert_jobs_give_sentence_transformers_vectors_and_are_receipted() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    let corpus = work.path().join("corpus.jsonl");
    let reference = tests::reference_corpus(&testdata().join("colbert-reference.json"), &corpus);
    let texts = reference["texts"].as_array().unwrap();

    stack.onboard(&testdata().join("colbert"), MODEL, &work.path().join("colbert.sealed"), &[]);

    let submit = |extra: &[&str], out: &str| -> Value {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--model", MODEL, "--wait", "-o", out, "--json"];
        args.extend_from_slice(extra);
        let report = tests::json(&stack.ok(&args));
        assert_eq!(report["verified"], json!(true), "{report}");
        report
    };

    // The default bound (1 MiB) holds every text: all as MultiVectorEncoder.encode() gives them.
    let out = path("multi.jsonl");
    let report = submit(&["--output-kind", "multivector"], &out);
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    let records = json_lines(Path::new(&out));
    assert_eq!(records.len(), texts.len());
    for (record, text) in records.iter().zip(texts) {
        let label = text["name"].as_str().unwrap();
        assert_eq!(record["id"], text["name"], "{label}: in order");
        assert_eq!(record["tokens"], text["tokens"], "{label}: token count");
        assert_same(&rows(&record["vectors"]), &rows(&text["vectors"]), label);
    }
    let job = report["job_id"].as_str().unwrap().to_owned();
    let options = stack.verify_check(&job, "options");
    assert_eq!(options["passed"], json!(true), "{options}");
    assert!(options.to_string().contains("output=multivector max_record_bytes=1048576"), "{options}");

    // A bound of 64 vectors: the longer texts fail alone, named, the others are written.
    let bound = 64 * reference["dimensions"].as_u64().unwrap() * 4;
    let capped = path("capped.jsonl");
    let report = submit(&["--max-record-bytes", &bound.to_string()], &capped);
    let long: Vec<&str> = texts.iter().filter(|t| t["tokens"].as_u64().unwrap() > 64).map(|t| t["name"].as_str().unwrap()).collect();
    assert!(!long.is_empty() && long.len() < texts.len(), "{long:?}");
    assert_eq!(report["errors"].as_u64(), Some(long.len() as u64), "{report}");
    let errors = json_lines(&work.path().join("capped.errors.jsonl"));
    let failed: Vec<(&str, &str)> = errors.iter().map(|e| (e["id"].as_str().unwrap(), e["code"].as_str().unwrap())).collect();
    assert_eq!(failed, long.iter().map(|&n| (n, "output_too_large")).collect::<Vec<_>>());
    assert_eq!(json_lines(Path::new(&capped)).len(), texts.len() - long.len());
    let capped_job = report["job_id"].as_str().unwrap();
    assert!(stack.verify_check(capped_job, "options").to_string().contains(&format!("max_record_bytes={bound}")));

    // A client whose record of the output kind or the bound differs from the receipt's fails `options`.
    let state_file = stack.home().join("client/jobs").join(&job).join("job.json");
    let state = std::fs::read_to_string(&state_file).unwrap();
    for (from, to) in [("\"output\": \"multivector\"", "\"output\": \"sparse\""), ("\"max_record_bytes\": 1048576", "\"max_record_bytes\": 4096")] {
        let changed = state.replacen(from, to, 1);
        assert_ne!(changed, state, "{from} in the job record");
        std::fs::write(&state_file, changed).unwrap();
        assert_eq!(stack.verify_check(&job, "options")["passed"], json!(false), "{to}");
        std::fs::write(&state_file, &state).unwrap();
    }
    assert_eq!(stack.verify_check(&job, "options")["passed"], json!(true));

    // One record proven alone, offline: its rows are the ones written.
    let record = &records[3];
    let proven = stack.prove_record(&job, record["id"].as_str().unwrap(), &work.path().join("record.json"));
    assert_eq!(rows(&proven["proven"]["vectors"]), rows(&record["vectors"]), "{proven}");
    assert_eq!(proven["proven"]["dimensions"], reference["dimensions"], "{proven}");

    // What the model does not give, or the format cannot write, is refused before any upload.
    let refusals: [(&[&str], &str); 4] = [
        (&["--model", MODEL, "--output-kind", "dense"], "--output-kind dense"),
        (&["--model", MODEL, "--top-k", "8"], "--top-k"),
        (&["--model", MODEL, "--format", "npy"], "--format"),
        (&["--max-record-bytes", "4096"], "--max-record-bytes"),
    ];
    for (extra, named) in refusals {
        let mut args = vec!["submit", corpus.to_str().unwrap()];
        args.extend_from_slice(extra);
        let refused = stack.cli(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains(named), "{named}: {stderr}");
    }
}
