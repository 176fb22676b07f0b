//! Matryoshka lengths and prompts through the running local stack, on the real model: a publisher
//! offers shorter lengths in the signed manifest (`model encrypt --matryoshka`), a batch job
//! asks for one with `submit --dimensions`, an online request with OpenAI's `dimensions`, and
//! both get the first N values of the full vector, normalised again; what the manifest does not
//! offer is refused by name, at submit and in the enclave.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{json_lines, short_corpus, wait_until, Serve, Stack};

const MODEL: &str = "test/minilm-matryoshka";

fn embeddings(path: &std::path::Path) -> Vec<Vec<f64>> {
    json_lines(path).iter().map(|r| r["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect()
}

/// The first `n` values of `full`, normalised: what a Matryoshka length must return.
fn shortened(full: &[f64], n: usize) -> Vec<f64> {
    let norm = full[..n].iter().map(|v| v * v).sum::<f64>().sqrt();
    full[..n].iter().map(|v| v / norm).collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
    assert!(worst < 1e-5, "{what}: differs by {worst}");
}

#[test]
fn matryoshka_lengths_are_served_as_the_manifest_offers_them_in_batch_and_online() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let sealed = work.path().join("sealed");
    stack.onboard(&tests::model_dir(), MODEL, &sealed, &["--matryoshka", "256,128"]);

    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "matryoshka", 6);
    let submit = |extra: &[&str], out: &std::path::Path| -> Value {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--model", MODEL, "--wait", "-o", out.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        tests::json(&stack.ok(&args))
    };
    let (full_out, short_out) = (work.path().join("full.jsonl"), work.path().join("short.jsonl"));
    submit(&[], &full_out);
    let report = submit(&["--dimensions", "128"], &short_out);
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    let full = embeddings(&full_out);
    let short = embeddings(&short_out);
    assert_eq!(full[0].len(), 384);
    for (i, (short, full)) in short.iter().zip(&full).enumerate() {
        assert_close(short, &shortened(full, 128), &format!("record {i}"));
        let norm = short.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "record {i}: norm {norm}");
    }
    // The receipt states the length, and the client checks it against what it sealed.
    assert_eq!(report["verified"], json!(true), "{report}");
    let verification = tests::json(&stack.ok(&["verify", report["job_id"].as_str().unwrap(), "--json"]));
    let options = verification["checks"].as_array().unwrap().iter().find(|c| c["name"] == "options").cloned().unwrap();
    assert_eq!(options["passed"], json!(true), "{options}");
    assert!(options.to_string().contains("dimensions=128"), "{options}");

    // What the manifest does not offer is refused at submit, naming the flag.
    for (extra, named) in [(&["--dimensions", "100"][..], "--dimensions 100"), (&["--prompt", "query"][..], "--prompt \"query\"")] {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--model", MODEL];
        args.extend_from_slice(extra);
        let refused = stack.cli(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains(named), "{named}: {stderr}");
    }

    // Online: OpenAI's `dimensions` maps to the same lengths, through the enclave.
    let proxy = Serve::start(&stack, &[]);
    let texts: Vec<String> = json_lines(&corpus).iter().map(|r| r["text"].as_str().unwrap().to_owned()).collect();
    let mut answer = Value::Null;
    wait_until("the enclave to load the onboarded model", Duration::from_secs(90), || {
        let (status, body) = proxy.embeddings(&json!({"input": texts, "model": MODEL, "dimensions": 128}));
        answer = body;
        status == 200
    });
    for (i, (online, short)) in answer["data"].as_array().unwrap().iter().zip(&short).enumerate() {
        let online: Vec<f64> = online["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_close(&online, short, &format!("online record {i}"));
    }
    let (status, body) = proxy.embeddings(&json!({"input": "x", "model": MODEL, "dimensions": 100}));
    assert_eq!((status, body["error"]["param"].clone(), body["error"]["code"].clone()), (400, json!("dimensions"), json!("unsupported_dimensions")), "{body}");
    let (status, body) = proxy.embeddings(&json!({"input": "x", "model": MODEL, "prompt_name": "query"}));
    assert_eq!((status, body["error"]["code"].clone()), (400, json!("unknown_prompt_name")), "{body}");
    let (status, body) = proxy.embeddings(&json!({"input": "x", "model": MODEL, "dimensions": 384, "prompt_name": "none"}));
    assert_eq!(status, 200, "the model's own length, no prompt: {body}");
}
