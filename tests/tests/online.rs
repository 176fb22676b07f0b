//! Query-time embeddings through the running local stack: `ephem-batch serve` speaking OpenAI's
//! API, the host's relay carrying Oblivious HTTP it cannot read, the enclave answering with the
//! batch path's vectors.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{canary_hits, corpus_with_canaries, http_exchange, wait_until, Serve, Stack};

const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

fn vectors(body: &Value) -> Vec<Vec<f64>> {
    body["data"].as_array().unwrap().iter().map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect()
}

#[test]
fn serve_answers_openai_requests_with_the_batch_vectors_and_the_host_never_sees_the_text() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let nonce = format!("{:x}", std::process::id());
    let online_canary = format!("zqxonline-vexillology-{nonce}-query");

    // The batch path's vectors for a few texts, the canary among them.
    let corpus = work.path().join("corpus.jsonl");
    let text = corpus_with_canaries(&corpus, Some(4), &[online_canary.clone()]);
    let texts: Vec<String> = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["text"].as_str().unwrap().to_owned()).collect();
    let out = work.path().join("embeddings.jsonl");
    stack.ok(&["submit", corpus.to_str().unwrap(), "--wait", "-o", out.to_str().unwrap()]);
    let batch: Vec<Vec<f64>> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();

    // The same texts online. The batch job's input is the client's: only online traffic may
    // carry this canary from here on, so the scan below looks at what the online path left.
    let proxy = Serve::start(&stack, &[]);
    let (status, body) = http_exchange(proxy.port, "POST", "/v1/embeddings", "application/json", json!({"input": texts, "model": MODEL}).to_string().as_bytes());
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    for (online, batch) in vectors(&body).iter().zip(&batch) {
        let cosine: f64 = online.iter().zip(batch).map(|(a, b)| a * b).sum();
        assert!(cosine > 0.9999, "online and batch differ: {cosine}");
    }
    let (status, models) = http_exchange(proxy.port, "GET", "/v1/models", "application/json", b"");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&models).contains(MODEL));

    // Errors in OpenAI's shape.
    let (status, body) = http_exchange(proxy.port, "POST", "/v1/embeddings", "application/json", json!({"input": [1, 2], "model": MODEL}).to_string().as_bytes());
    assert_eq!((status, serde_json::from_slice::<Value>(&body).unwrap()["error"]["code"].clone()), (400, json!("unsupported_input")));

    // The enclave's usage receipts for these requests reach the ledger (the local stack collects
    // them every 2 s): counts and a commitment, no text; they verify like job receipts.
    let mut usage = Vec::new();
    wait_until("usage receipts in the ledger", Duration::from_secs(60), || {
        usage = tests::json(&stack.ok(&["ledger", "query", "--online", "--json"])).as_array().unwrap().clone();
        usage.iter().map(|r| r["ok_count"].as_u64().unwrap()).sum::<u64>() >= texts.len() as u64
    });
    for row in &usage {
        assert_eq!((row["kind"].as_str(), row["model_id"].as_str()), (Some("usage"), Some(MODEL)), "{row}");
        assert!(row["tokens"].as_u64().unwrap() > 0 && row["usage"]["requests"].as_u64().unwrap() >= 1, "{row}");
        assert_ne!(row["verdict"], "invalid", "{row}");
    }
    let jobs = tests::json(&stack.ok(&["ledger", "query", "--jobs", "--json"]));
    assert!(jobs.as_array().unwrap().iter().all(|r| r["kind"] == "job"), "{jobs}");
    stack.ok(&["ledger", "verify"]);
    // The client's own log of those exchanges reconciles with the receipts: every account it
    // sent into has a receipt with its count and commitment.
    let reconciled = tests::json(&stack.ok(&["ledger", "reconcile-usage", "--json"]));
    assert_eq!(reconciled["passed"], true, "{reconciled}");
    let periods = reconciled["periods"].as_array().unwrap();
    assert!(!periods.is_empty() && periods.iter().all(|p| p["outcome"] == "matched"), "{reconciled}");

    // The relay refuses what does not open, naming the check; it never answers an unopened request.
    let relay = stack.ok(&["dev", "status", "--json"]);
    let relay = serde_json::from_str::<Value>(&relay).unwrap()["online_relay"].as_str().expect("dev status names the relay").to_owned();
    let relay_port: u16 = relay.trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().parse().unwrap();
    let mut garbage = vec![1u8, 0, 0x10, 0, 1, 0, 3];
    garbage.extend(std::iter::repeat_n(7u8, 120));
    let (status, problem) = http_exchange(relay_port, "POST", "/v1/ohttp", "message/ohttp-req", &garbage);
    assert_eq!(status, 400);
    assert_eq!(serde_json::from_slice::<Value>(&problem).unwrap()["check"], "encapsulation");

    // No host-side byte carries the online text: the home's logs, runtime files and stores
    // (everything but the client's own directory, where the batch corpus's copy lives).
    let client_dir = stack.home().join("client");
    let hits: Vec<_> = canary_hits(stack.home(), std::slice::from_ref(&online_canary))
        .into_iter()
        .filter(|(file, _)| !file.starts_with(&client_dir))
        .collect();
    assert!(hits.is_empty(), "the canary is on the host side: {hits:?}");

    // A client whose policy the fleet's document fails sends nothing and names the check.
    drop(proxy);
    let elsewhere = "arn:aws:kms:local:000000000000:key/0000-not-the-deployments";
    let refusing = Serve::start(&stack, &["--fleet-key-arn", elsewhere]);
    let (status, body) = http_exchange(refusing.port, "POST", "/v1/embeddings", "application/json", json!({"input": "x", "model": MODEL}).to_string().as_bytes());
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["error"]["type"].as_str()), (503, Some("attestation_error")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("fleet_kms_key"), "{body}");
}
