//! The bulk workflow on the embedded default, end to end through the real binaries: `submit
//! --bulk --wait` seals a corpus into shards under a store prefix (each shard an ordinary job
//! that `on-upload` creates), the local runtime runs the workflow's own ASL definition (each
//! shard awaited on a task token, completed by the host-poller or the await step), and the
//! client verifies every shard's receipt and writes every record, in order, to one output.

use std::path::Path;

use serde_json::Value;
use tests::{corpus_with_canaries, Stack};

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(json).collect()
}

#[test]
fn local_bulk_end_to_end() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();

    // Eight example records and a canary, then one line refused locally: three shards of three.
    let corpus = work.path().join("corpus.jsonl");
    let mut text = corpus_with_canaries(&corpus, Some(8), &["zqxbulkcanary-0001".to_owned()]);
    let expected_ids: Vec<String> = text.lines().map(|l| json(l)["id"].as_str().unwrap().to_owned()).collect();
    text.push_str("{\"id\": \"broken\", \"text\": \n");
    std::fs::write(&corpus, &text).unwrap();

    let out = work.path().join("embeddings.jsonl");
    let started = std::time::Instant::now();
    let report = json(&stack.ok(&[
        "submit",
        corpus.to_str().unwrap(),
        "--bulk",
        "--shard-records",
        "3",
        "--store",
        "acme",
        "--wait",
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]));
    eprintln!("submit --bulk --wait: {:.1} s", started.elapsed().as_secs_f64());
    let bulk_id = report["bulk_id"].as_str().unwrap().to_owned();
    assert_eq!(report["shards"], 3, "{report}");
    assert_eq!(report["shards_written"], 3, "{report}");
    assert_eq!(report["embedded"], expected_ids.len(), "{report}");
    assert_eq!(report["errors"], 1, "{report}");
    assert_eq!(report["in_ledger"], true, "{report}");

    // Every record, in corpus order, across the shards.
    let results = lines(&out);
    let ids: Vec<&str> = results.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, expected_ids);
    for result in &results {
        assert_eq!(result["embedding"].as_array().unwrap().len(), 384);
    }
    let errors = lines(&work.path().join("embeddings.errors.jsonl"));
    assert_eq!(errors.len(), 1);
    assert_eq!((errors[0]["code"].as_str(), errors[0]["line"].as_u64()), (Some("invalid_json"), Some(10)));

    // The workflow's manifest: three committed shards under the store prefix.
    let status = json(&stack.ok(&["bulk", "status", &bulk_id, "--json"]));
    assert_eq!(status["execution"]["status"], "SUCCEEDED", "{status}");
    assert_eq!(status["manifest"]["committed"], 3, "{status}");
    assert_eq!(status["manifest"]["records_ok"], expected_ids.len(), "{status}");
    assert_eq!(status["prefix"], format!("stores/acme/incoming/{bulk_id}/"));
    let shards = status["shards"].as_array().unwrap();
    assert!(shards.iter().all(|s| s["state"] == "committed"), "{status}");
    let keys: Vec<&str> = shards.iter().map(|s| s["key"].as_str().unwrap()).collect();
    assert_eq!(keys, (0..3).map(|i| format!("stores/acme/incoming/{bulk_id}/part-0000{i}.sealed")).collect::<Vec<_>>());

    // Every receipt verified with `verify`'s checks, the manifest's claims included.
    let verification = json(&stack.ok(&["bulk", "verify", &bulk_id, "--json"]));
    for check in verification["checks"].as_array().unwrap() {
        assert_eq!(check["passed"], true, "{check}");
    }
    let per_shard = verification["shards"].as_array().unwrap();
    assert_eq!(per_shard.len(), 3);
    for shard in per_shard {
        for name in ["receipt_attestation", "input_sha256", "output_sha256", "commitment", "ledger"] {
            let check = shard["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
            assert_eq!(check["passed"], true, "{check}");
        }
    }
    // Each shard is an ordinary job, and says so on its own.
    let job = shards[1]["job_id"].as_str().unwrap();
    stack.ok(&["verify", job]);
    // The hand-off object the await step wrote (the token is host-visible, never a secret).
    let task = stack.home().join("objects/jobs/jobs").join(job).join("bulk-tasks").join(format!("{bulk_id}.json"));
    assert_eq!(json(&std::fs::read_to_string(&task).unwrap())["bulk_id"], bulk_id.as_str());

    // The same results again, as one npy matrix.
    let npy = work.path().join("vectors.npy");
    stack.ok(&["bulk", "results", &bulk_id, "-o", npy.to_str().unwrap(), "--format", "npy"]);
    let header = std::fs::read(&npy).unwrap();
    let header = String::from_utf8_lossy(&header[..128]);
    assert!(header.contains(&format!("'shape': ({}, 384)", expected_ids.len())), "{header}");
}
