//! Sparse output through the running local stack (issue "beyond one dense vector", item 1): the
//! generated SPLADE checkpoint (`testdata/outputs/splade/`, sentence-transformers 6.2's
//! `SparseEncoder` layout) onboarded with `model encrypt`/`sign`/`upload`, then batch jobs with
//! `submit --model`: every record's `{token id: weight}` equals `SparseEncoder.encode()` (same
//! ids, weights within 1e-5), `--top-k 8` equals `max_active_dims=8`, the receipt states the
//! output kind and a client whose record of it differs fails `options`, one sparse record is
//! proven alone, and what the model does not give is refused at submit naming the flag.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tests::{Stack, json_lines};

const MODEL: &str = "test/splade";
const WEIGHT_TOLERANCE: f64 = 1e-5;

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/outputs"))
}


/// A record's weights as (token id, weight) pairs, ascending.
fn weights(record: &Value) -> Vec<(u64, f64)> {
    let map = record["sparse"].as_object().unwrap_or_else(|| panic!("not a sparse record: {record}"));
    let mut pairs: Vec<(u64, f64)> = map.iter().map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap())).collect();
    pairs.sort_by_key(|p| p.0);
    pairs
}

fn expected(pairs: &Value) -> Vec<(u64, f64)> {
    pairs.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect()
}

fn assert_same(ours: &[(u64, f64)], reference: &[(u64, f64)], label: &str) {
    let ids = |v: &[(u64, f64)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(ids(ours), ids(reference), "{label}: token ids");
    for (a, b) in ours.iter().zip(reference) {
        assert!((a.1 - b.1).abs() <= WEIGHT_TOLERANCE, "{label}: token {} weight {} against {}", a.0, a.1, b.1);
    }
}

#[test]
fn splade_jobs_give_sentence_transformers_sparse_weights_and_are_receipted() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    let corpus = work.path().join("corpus.jsonl");
    let reference = tests::reference_corpus(&testdata().join("splade-reference.json"), &corpus);
    let texts = reference["texts"].as_array().unwrap();

    stack.onboard(&testdata().join("splade"), MODEL, &work.path().join("splade.sealed"), &[]);

    let submit = |extra: &[&str], out: &str| -> Value {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--model", MODEL, "--wait", "-o", out, "--json"];
        args.extend_from_slice(extra);
        let report = tests::json(&stack.ok(&args));
        assert_eq!((report["errors"].as_u64(), &report["verified"]), (Some(0), &json!(true)), "{report}");
        report
    };

    // Every nonzero weight, then the 8 largest: as SparseEncoder.encode() gives them.
    let mut proven_job = None;
    for (extra, field) in [(&[][..], "sparse"), (&["--top-k", "8"][..], "top_k")] {
        let out = path(&format!("{field}.jsonl"));
        let report = submit(extra, &out);
        let records = json_lines(Path::new(&out));
        assert_eq!(records.len(), texts.len());
        for (record, text) in records.iter().zip(texts) {
            let label = format!("{field} {}", text["name"]);
            assert_eq!(record["id"], text["name"], "{label}: in order");
            assert_eq!(record["tokens"], text["tokens"], "{label}: token count");
            assert_same(&weights(record), &expected(&text[field]), &label);
        }
        let options = stack.verify_check(report["job_id"].as_str().unwrap(), "options");
        assert_eq!(options["passed"], json!(true), "{options}");
        assert!(options.to_string().contains(&format!("output=sparse top_k={}", if extra.is_empty() { "all" } else { "8" })), "{options}");
        proven_job.get_or_insert((report["job_id"].as_str().unwrap().to_owned(), records));
    }

    // A client whose record of the output kind or top_k differs from the receipt's fails `options`.
    let (job, records) = proven_job.unwrap();
    let state_file = stack.home().join("client/jobs").join(&job).join("job.json");
    let state = std::fs::read_to_string(&state_file).unwrap();
    for (from, to) in [("\"output\": \"sparse\",", ""), ("\"output\": \"sparse\"", "\"output\": \"sparse\", \"top_k\": 8")] {
        let changed = state.replacen(from, to, 1);
        assert_ne!(changed, state, "{from} in the job record");
        std::fs::write(&state_file, changed).unwrap();
        assert_eq!(stack.verify_check(&job, "options")["passed"], json!(false), "{to}");
        std::fs::write(&state_file, &state).unwrap();
    }
    assert_eq!(stack.verify_check(&job, "options")["passed"], json!(true));

    // One sparse record proven alone, offline: the weights proven are the ones written, by
    // vocabulary index (not widened to the vocabulary).
    let record = &records[3];
    let proven = stack.prove_record(&job, record["id"].as_str().unwrap(), &work.path().join("record.json"));
    assert_eq!(proven["proven"]["dimensions"], reference["dimensions"], "{proven}");
    assert_eq!(weights(&proven["proven"]), weights(record), "{proven}");

    // What the model does not give, or the format cannot write, is refused before any upload.
    let refusals: [(&[&str], &str); 4] = [
        (&["--model", MODEL, "--output-kind", "dense"], "--output-kind dense"),
        (&["--output-kind", "sparse"], "--output-kind sparse"),
        (&["--top-k", "8"], "--top-k"),
        (&["--model", MODEL, "--format", "npy"], "--format"),
    ];
    for (extra, named) in refusals {
        let mut args = vec!["submit", corpus.to_str().unwrap()];
        args.extend_from_slice(extra);
        let refused = stack.cli(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains(named), "{named}: {stderr}");
    }
}
