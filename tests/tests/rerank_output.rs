//! Reranking through the running local stack (issue "beyond one dense vector", item 3, batch):
//! the generated cross-encoder (`testdata/outputs/rerank/`, sentence-transformers 6.2's
//! `CrossEncoder` layout) onboarded with `model encrypt`/`sign`/`upload`, then a batch job of
//! `{"id", "query", "documents"}` lines: every record's scores equal `CrossEncoder.predict()`
//! within 1e-4 and in `rank()`'s order, its tokens those of its pairs; the receipt states the
//! output kind and a client whose record of it differs fails `options`; one record proven alone;
//! a bad line fails alone; what the model does not give is refused at submit naming the flag.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tests::{Stack, json_lines};

const MODEL: &str = "test/rerank";
const SCORE_TOLERANCE: f64 = 1e-4;

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/outputs"))
}

fn options_check(stack: &Stack, job: &str) -> Value {
    let verification = tests::json(&String::from_utf8_lossy(&stack.cli(&["verify", job, "--json"]).stdout));
    verification["checks"].as_array().unwrap().iter().find(|c| c["name"] == "options").cloned().unwrap()
}

fn floats(value: &Value) -> Vec<f64> {
    value.as_array().unwrap_or_else(|| panic!("not an array: {value}")).iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn rerank_jobs_score_as_cross_encoder_and_are_receipted() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    let reference: Value = serde_json::from_slice(&std::fs::read(testdata().join("rerank-reference.json")).unwrap()).unwrap();
    let queries = reference["queries"].as_array().unwrap();
    let corpus = work.path().join("pairs.jsonl");
    let mut lines: Vec<String> =
        queries.iter().enumerate().map(|(i, q)| json!({"id": format!("q{i}"), "query": q["query"], "documents": reference["documents"]}).to_string()).collect();
    lines.insert(2, json!({"id": "bad", "query": "q", "documents": "not a list"}).to_string());
    std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();

    let sealed = path("rerank.sealed");
    let dir = testdata().join("rerank");
    stack.ok(&["model", "encrypt", dir.to_str().unwrap(), "--model-id", MODEL, "--version", "1", "-o", &sealed]);
    stack.ok(&["model", "sign", &sealed, "--development"]);
    stack.ok(&["model", "upload", &sealed]);

    let out = path("scores.jsonl");
    let report = tests::json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--model", MODEL, "--wait", "-o", &out, "--json"]));
    assert_eq!((report["embedded"].as_u64(), report["errors"].as_u64(), &report["verified"]), (Some(4), Some(1), &json!(true)), "{report}");
    let errors = json_lines(&work.path().join("scores.errors.jsonl"));
    assert_eq!((errors[0]["id"].as_str(), errors[0]["code"].as_str()), (Some("bad"), Some("invalid_text")), "{errors:?}");
    let records = json_lines(Path::new(&out));
    let mut worst = 0f64;
    for (record, case) in records.iter().zip(queries) {
        let (scores, expected) = (floats(&record["scores"]), floats(&case["scores"]));
        assert_eq!(scores.len(), expected.len(), "{record}");
        for (a, b) in scores.iter().zip(&expected) {
            worst = worst.max((a - b).abs());
        }
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let want: Vec<usize> = case["order"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(order, want, "{}: rank()'s order", case["query"]);
        let tokens: u64 = case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum();
        assert_eq!(record["tokens"].as_u64(), Some(tokens), "{}", case["query"]);
    }
    assert!(worst <= SCORE_TOLERANCE, "a score differs by {worst}");

    // The receipt states the output kind; a client record that says otherwise fails `options`.
    let job = report["job_id"].as_str().unwrap();
    let options = options_check(&stack, job);
    assert_eq!(options["passed"], json!(true), "{options}");
    assert!(options.to_string().contains("output=scores"), "{options}");
    let state_file = stack.home().join("client/jobs").join(job).join("job.json");
    let state = std::fs::read_to_string(&state_file).unwrap();
    let changed = state.replacen("\"output\": \"scores\"", "\"output\": \"sparse\"", 1);
    assert_ne!(changed, state);
    std::fs::write(&state_file, changed).unwrap();
    assert_eq!(options_check(&stack, job)["passed"], json!(false));
    std::fs::write(&state_file, &state).unwrap();

    // One record's scores proven alone, offline.
    let bundle = path("record.json");
    stack.ok(&["ledger", "prove-record", job, "q1", "-o", &bundle]);
    let proven = tests::json(&stack.ok(&[
        "ledger", "verify-record", &bundle,
        "--ledger-key", stack.home().join("ledger/ledger.pub").to_str().unwrap(),
        "--development-root", stack.home().join("enclave/dev-root.pem").to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(proven["valid"], json!(true), "{proven}");
    assert_eq!(floats(&proven["proven"]["vector"]), floats(&records[1]["scores"]), "{proven}");

    // What the model does not give, or the format cannot write, is refused before any upload.
    let refusals: [(&[&str], &str); 2] =
        [(&["--model", MODEL, "--output-kind", "dense"], "--output-kind dense"), (&["--model", MODEL, "--format", "npy"], "--format")];
    for (extra, named) in refusals {
        let mut args = vec!["submit", corpus.to_str().unwrap()];
        args.extend_from_slice(extra);
        let refused = stack.cli(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains(named), "{named}: {stderr}");
    }
}
