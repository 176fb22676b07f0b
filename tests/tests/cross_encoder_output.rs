//! Cross-encoders of two kinds through the running local stack, each generated checkpoint
//! (sentence-transformers 6.2's `CrossEncoder` layout) onboarded with `model encrypt`/`sign`/
//! `upload`, a batch job of `{"id", "query", "documents"}` lines whose scores equal
//! `CrossEncoder.predict()` within 1e-4 in `rank()`'s order with its pairs' tokens, verified
//! (`options` says `output=scores`), one record proven alone; then `serve`'s `POST /v1/rerank`
//! gives the same top 5 to a plain HTTP client:
//! - a BERT cross-encoder (`testdata/outputs/rerank-bert/`, ms-marco-MiniLM's shape: `[CLS] query
//!   [SEP] document [SEP]`, the document and its `[SEP]` of token type 1, BERT's pooler then
//!   `classifier`);
//! - the Qwen3 reranker (`testdata/outputs/rerank-qwen3/`, Qwen3-Reranker-0.6B's form: a
//!   `Qwen3ForCausalLM` scored by its last position's "yes" logit less its "no" logit, each pair
//!   rendered through the chat template; 60 of the 96 pairs cut at 256).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tests::{Serve, Stack, http_exchange, json_lines, wait_until};

const SCORE_TOLERANCE: f64 = 1e-4;

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/outputs"))
}

fn floats(value: &Value) -> Vec<f64> {
    value.as_array().unwrap_or_else(|| panic!("not an array: {value}")).iter().map(|x| x.as_f64().unwrap()).collect()
}

fn order(case: &Value) -> Vec<u64> {
    case["order"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn tokens(case: &Value) -> u64 {
    case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum()
}

/// The cross-encoder generated under `testdata/outputs/<folder>/` (and its
/// `<folder>-reference.json`) onboarded, scored in one batch job, receipted, one record proven, and
/// asked online through `serve`.
fn jobs_score_as_cross_encoder(folder: &str, label: &str) {
    let model = format!("test/{folder}");
    let model = model.as_str();
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    let reference: Value = serde_json::from_slice(&std::fs::read(testdata().join(format!("{folder}-reference.json"))).unwrap()).unwrap();
    let queries = reference["queries"].as_array().unwrap();
    let corpus = work.path().join("pairs.jsonl");
    let lines: Vec<String> =
        queries.iter().enumerate().map(|(i, q)| json!({"id": format!("q{i}"), "query": q["query"], "documents": reference["documents"]}).to_string()).collect();
    std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();

    stack.onboard(&testdata().join(folder), model, &work.path().join(format!("{folder}.sealed")), &[]);

    let out = path("scores.jsonl");
    let report = tests::json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--model", model, "--wait", "-o", &out, "--json"]));
    assert_eq!((report["embedded"].as_u64(), report["errors"].as_u64(), &report["verified"]), (Some(4), Some(0), &json!(true)), "{report}");
    let records = json_lines(Path::new(&out));
    assert_eq!(records.len(), queries.len());
    let mut worst = 0f64;
    for (record, case) in records.iter().zip(queries) {
        let (scores, expected) = (floats(&record["scores"]), floats(&case["scores"]));
        assert_eq!(scores.len(), expected.len(), "{record}");
        for (a, b) in scores.iter().zip(&expected) {
            worst = worst.max((a - b).abs());
        }
        let mut got: Vec<u64> = (0..scores.len() as u64).collect();
        got.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        assert_eq!(got, order(case), "{}: rank()'s order", case["query"]);
        assert_eq!(record["tokens"].as_u64(), Some(tokens(case)), "{}", case["query"]);
    }
    assert!(worst <= SCORE_TOLERANCE, "a score differs by {worst}");
    eprintln!("{label} rerank job: largest score difference {worst:e}");

    let job = report["job_id"].as_str().unwrap();
    let options = stack.verify_check(job, "options");
    assert!(options["passed"] == json!(true) && options.to_string().contains("output=scores"), "{options}");
    let proven = stack.prove_record(job, "q2", &work.path().join("record.json"));
    assert_eq!(floats(&proven["proven"]["scores"]), floats(&records[2]["scores"]), "{proven}");

    // Online: a plain HTTP client gets the top 5 of the second query (Russian).
    let proxy = Serve::start(&stack, &[]);
    let case = &queries[1];
    let request = json!({"model": model, "query": case["query"], "documents": reference["documents"], "top_n": 5});
    let mut answer = Value::Null;
    wait_until(&format!("the enclave to load the onboarded {label}"), Duration::from_secs(90), || {
        let (status, body) = http_exchange(proxy.port, "POST", "/v1/rerank", "application/json", request.to_string().as_bytes());
        let body: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
        if status != 200 && status != 404 {
            panic!("{status}: {body}");
        }
        answer = body;
        status == 200
    });
    let results = answer["results"].as_array().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(results.iter().map(|r| r["index"].as_u64().unwrap()).collect::<Vec<_>>(), order(case)[..5], "{answer}");
    let expected = floats(&case["scores"]);
    for r in results {
        let score = r["relevance_score"].as_f64().unwrap();
        assert!((score - expected[r["index"].as_u64().unwrap() as usize]).abs() <= SCORE_TOLERANCE, "{r}");
    }
    assert_eq!(answer["usage"]["total_tokens"].as_u64(), Some(tokens(case)), "{answer}");
}

#[test]
fn bert_rerank_jobs_score_as_cross_encoder() {
    jobs_score_as_cross_encoder("rerank-bert", "BERT cross-encoder");
}

#[test]
fn qwen3_rerank_jobs_score_as_cross_encoder() {
    jobs_score_as_cross_encoder("rerank-qwen3", "Qwen3 reranker");
}
