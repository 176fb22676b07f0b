//! Reranking through the running local stack (issue "beyond one dense vector", item 3, batch):
//! the generated cross-encoder (`testdata/outputs/rerank/`, sentence-transformers 6.2's
//! `CrossEncoder` layout) onboarded with `model encrypt`/`sign`/`upload`, then a batch job of
//! `{"id", "query", "documents"}` lines: every record's scores equal `CrossEncoder.predict()`
//! within 1e-4 and in `rank()`'s order, its tokens those of its pairs; the receipt states the
//! output kind and a client whose record of it differs fails `options`; one record proven alone;
//! a bad line fails alone; what the model does not give is refused at submit naming the flag.
//! Online, `serve`'s `POST /v1/rerank` answers a plain HTTP client in the shape the rerank APIs
//! share (`query`, `documents`, `top_n` → `results` of `index` and `relevance_score`), with the
//! same scores, and its usage reaches `ledger query --online`.

use std::path::{Path, PathBuf};

use std::time::Duration;

use serde_json::{Value, json};
use tests::{Serve, Stack, http_exchange, json_lines, wait_until};

const MODEL: &str = "test/rerank";
const SCORE_TOLERANCE: f64 = 1e-4;

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/outputs"))
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

    stack.onboard(&testdata().join("rerank"), MODEL, &work.path().join("rerank.sealed"), &[]);

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
    let options = stack.verify_check(job, "options");
    assert_eq!(options["passed"], json!(true), "{options}");
    assert!(options.to_string().contains("output=scores"), "{options}");
    let state_file = stack.home().join("client/jobs").join(job).join("job.json");
    let state = std::fs::read_to_string(&state_file).unwrap();
    let changed = state.replacen("\"output\": \"scores\"", "\"output\": \"sparse\"", 1);
    assert_ne!(changed, state);
    std::fs::write(&state_file, changed).unwrap();
    assert_eq!(stack.verify_check(job, "options")["passed"], json!(false));
    std::fs::write(&state_file, &state).unwrap();

    // One record's scores proven alone, offline.
    let proven = stack.prove_record(job, "q1", &work.path().join("record.json"));
    assert_eq!(floats(&proven["proven"]["scores"]), floats(&records[1]["scores"]), "{proven}");

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

    // Online through serve: a plain HTTP client, the shared rerank shape.
    let proxy = Serve::start(&stack, &[]);
    let case = &queries[0];
    let request = json!({"model": MODEL, "query": case["query"], "documents": reference["documents"], "top_n": 5});
    let post = |request: &Value| {
        let (status, body) = http_exchange(proxy.port, "POST", "/v1/rerank", "application/json", request.to_string().as_bytes());
        (status, serde_json::from_slice::<Value>(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body))))
    };
    let mut answer = Value::Null;
    wait_until("the enclave to load the onboarded cross-encoder", Duration::from_secs(90), || {
        let (status, body) = post(&request);
        if status != 200 && status != 404 {
            panic!("{status}: {body}");
        }
        answer = body;
        status == 200
    });
    let results = answer["results"].as_array().unwrap_or_else(|| panic!("{answer}"));
    let want: Vec<u64> = case["order"].as_array().unwrap().iter().take(5).map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(results.iter().map(|r| r["index"].as_u64().unwrap()).collect::<Vec<_>>(), want, "{answer}");
    let expected = floats(&case["scores"]);
    for r in results {
        let score = r["relevance_score"].as_f64().unwrap();
        assert!((score - expected[r["index"].as_u64().unwrap() as usize]).abs() <= SCORE_TOLERANCE, "{r}");
    }
    let tokens: u64 = case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum();
    assert_eq!(answer["usage"]["total_tokens"].as_u64(), Some(tokens), "{answer}");
    // Refusals in OpenAI's error shape, by field: an embedding request to a cross-encoder, a
    // rerank request to an embedding model, documents sent back.
    let (status, body) = http_exchange(proxy.port, "POST", "/v1/embeddings", "application/json", json!({"input": "x", "model": MODEL}).to_string().as_bytes());
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["error"]["code"].clone()), (400, json!("unsupported_output")), "{body}");
    let (status, body) = post(&json!({"model": "sentence-transformers/all-MiniLM-L6-v2", "query": "q", "documents": ["d"]}));
    assert!(status >= 400 && body["error"]["code"].is_string(), "{status} {body}");
    let (status, body) = post(&json!({"model": MODEL, "query": "q", "documents": ["d"], "return_documents": true}));
    assert_eq!((status, body["error"]["param"].clone()), (400, json!("return_documents")), "{body}");

    // The enclave's usage receipt for the rerank requests reaches the ledger: one input per document.
    let mut usage = Vec::new();
    wait_until("usage receipts of the rerank requests in the ledger", Duration::from_secs(60), || {
        usage = tests::json(&stack.ok(&["ledger", "query", "--online", "--json"])).as_array().unwrap().clone();
        usage.iter().any(|r| r["model_id"] == MODEL && r["tokens"].as_u64() >= Some(tokens))
    });
    let row = usage.iter().find(|r| r["model_id"] == MODEL).unwrap();
    assert_ne!(row["verdict"], "invalid", "{row}");
}
