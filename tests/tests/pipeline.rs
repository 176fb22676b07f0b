//! The local pipeline end to end, through the real binaries: `dev up` starts the host-poller
//! (which supervises the enclave worker) and the local Lambda runtime; `submit --wait` seals,
//! uploads, waits, downloads, opens and checks; `verify` checks the receipt and its ledger entry.

use std::io::Write;
use std::path::Path;

use serde_json::Value;
use tests::{canary_hits, canary_hits_in, corpus_with_canaries, files_modified_since, process, wait_until, Stack};

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(json).collect()
}

fn unit_vector(value: &Value) -> Vec<f64> {
    let vector: Vec<f64> = value.as_array().expect("an embedding array").iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(vector.len(), 384);
    let norm = vector.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "norm {norm}");
    vector
}

#[test]
fn local_pipeline_end_to_end() {
    // The stack's processes get a temporary directory of their own, scanned with the rest of
    // the host side; the system's is scanned too, for anything that ignored TMPDIR.
    let started = std::time::SystemTime::now();
    let host_tmp = tempfile::tempdir().unwrap();
    let stack = Stack::up_with(&[("TMPDIR", host_tmp.path().as_os_str())]);
    let work = tempfile::tempdir().unwrap();
    for name in ["host-poller", "enclave-worker", "lambdas"] {
        let pid = stack.pid(name).unwrap_or_else(|| panic!("{name} is not running"));
        // Just after exec the kernel may not have set the new environment's bounds yet (a
        // read then returns nothing), so give the process a moment.
        let tmpdir = || process::environment_variable(pid, "TMPDIR");
        wait_until(&format!("{name}'s environment"), std::time::Duration::from_secs(5), || tmpdir().is_some());
        assert_eq!(tmpdir().as_deref().map(Path::new), Some(host_tmp.path()), "{name}'s TMPDIR");
    }

    // --- the example corpus, with canaries that must never appear on the host side ----------
    // Unique to this run, so a hit in a shared directory can only be this run's.
    let nonce = format!("{:x}{:x}", std::process::id(), started.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    let canaries: Vec<String> = (0..3).map(|i| format!("zqxcanary{i}vexillology-{nonce}-{i:04}")).collect();
    let corpus = work.path().join("corpus.jsonl");
    let text = corpus_with_canaries(&corpus, None, &canaries);
    let expected_ids: Vec<String> = text.lines().map(|l| json(l)["id"].as_str().unwrap().to_owned()).collect();

    let out = work.path().join("embeddings.jsonl");
    let report = json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--wait", "-o", out.to_str().unwrap(), "--json"]));
    let job = report["job_id"].as_str().unwrap().to_owned();
    assert_eq!(report["embedded"], expected_ids.len());
    assert_eq!(report["errors"], 0);
    assert_eq!(report["in_ledger"], true);
    let results = lines(&out);
    let ids: Vec<&str> = results.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, expected_ids, "results come back in input order");
    for result in &results {
        unit_vector(&result["embedding"]);
        assert!(result["tokens"].as_u64().unwrap() > 2);
    }
    assert_eq!(std::fs::read_to_string(work.path().join("embeddings.errors.jsonl")).unwrap(), "");

    let verification = json(&stack.ok(&["verify", &job, "--json"]));
    let checks = verification["checks"].as_array().unwrap();
    for name in ["receipt", "receipt_attestation", "input_sha256", "output_sha256", "commitment", "ledger"] {
        let check = checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"));
        assert_eq!(check["passed"], true, "{check}");
    }
    let status = json(&stack.ok(&["status", &job, "--json"]));
    assert_eq!(status["state"], "completed");
    assert!(status["ledger"]["index"].is_u64());

    // --- the ledger check's witnesses: none asked, the operator's key alone is said to sign ----
    let ledger = checks.iter().find(|c| c["name"] == "ledger").unwrap();
    assert!(ledger["detail"].as_str().unwrap().contains("signed by the operator's key only"), "{ledger}");
    // The stack's own witness (dev up) cosigns every checkpoint; a witness nobody asked (its key
    // under another name) never did: with both required, `verify` refuses by name.
    let endpoint = std::fs::read_to_string(stack.home().join("run/witness.url")).unwrap();
    let witness = endpoint.trim().rsplit_once('@').unwrap().0.to_owned();
    let witnessed = json(&stack.ok(&["verify", &job, "--json", "--witness", &witness]));
    let ledger = witnessed["checks"].as_array().unwrap().iter().find(|c| c["name"] == "ledger").unwrap().clone();
    assert!(ledger["passed"] == true && ledger["detail"].as_str().unwrap().contains("cosigned by"), "{ledger}");
    let stranger = {
        use base64::Engine as _;
        use sha2::Digest as _;
        let raw = witness.splitn(3, '+').nth(2).unwrap();
        let name = "witness.example/stranger";
        let key = base64::engine::general_purpose::STANDARD.decode(raw).unwrap();
        let id = sha2::Sha256::digest([name.as_bytes(), b"\n", &key].concat());
        format!("{name}+{}+{raw}", hex::encode(&id[..4]))
    };
    let refused = stack.cli(&["verify", &job, "--json", "--witness", &witness, "--witness", &stranger]);
    assert_eq!(refused.status.code(), Some(1), "{}", stack.describe(&refused));
    let refused = json(&String::from_utf8_lossy(&refused.stdout));
    assert_eq!(refused["ledger_refusal"], "witness_quorum", "{refused}");

    // --- the fleet KMS key: bound in the published document, pinned by the client ---------------
    // `fleet check-key` passes on the home's fleet key and names the key it checked.
    let key_report = json(&stack.ok(&["fleet", "check-key", "--json"]));
    let fleet_key = key_report["key"].as_str().unwrap().to_owned();
    assert!(key_report["checks"].as_array().unwrap().iter().all(|c| c["passed"] == true), "{key_report}");
    let fetched = json(&stack.ok(&["attest", "fetch", "--json"]));
    assert_eq!(fetched["binding"]["kms_key_arn"], fleet_key.as_str(), "{fetched}");
    assert!(fetched["binding"]["not_after_ms"].as_u64().unwrap() > fetched["document"]["timestamp_ms"].as_u64().unwrap());
    // A stack whose document names another KMS key than the one the client pins: refused by name.
    let elsewhere = "arn:aws:kms:local:000000000000:key/0000-not-the-deployments";
    let refused = stack.cli(&["submit", corpus.to_str().unwrap(), "--fleet-key-arn", elsewhere]);
    assert!(!refused.status.success(), "submit sealed to a document naming another KMS key");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("fleet_kms_key") && stderr.contains(&fleet_key), "{stderr}");
    // A key the host could use to wrap material it chose fails check-key, naming why.
    let trust = cloud_local::AttestationTrust {
        root_pem_path: stack.home().join("enclave/dev-root.pem"),
        max_document_age: std::time::Duration::from_secs(300),
    };
    let kms = cloud_local::LocalKms::open(stack.home().join(cloud_local::KMS_DB), trust).unwrap();
    let host_key = kms.create_key(cloud_local::LocalKeyPolicy::unrestricted(), "a key the host made").unwrap();
    let out = stack.cli(&["fleet", "check-key", "--fleet-key-arn", &host_key]);
    assert_eq!(out.status.code(), Some(1), "{}", stack.describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL  key_policy_no_wrapping") && text.contains("FAIL  key_policy_attested_release"), "{text}");

    // --- the ledger: full replay, and an offline bundle checked against a pinned key ---------
    stack.ok(&["ledger", "verify"]);
    let bundle = work.path().join("bundle.json");
    stack.ok(&["ledger", "prove", &job, "-o", bundle.to_str().unwrap()]);
    let ledger_key = stack.home().join("ledger/ledger.pub");
    let dev_root = stack.home().join("enclave/dev-root.pem");
    let verify_bundle = |path: &Path, key: &Path| {
        stack.cli(&[
            "ledger",
            "verify-bundle",
            path.to_str().unwrap(),
            "--ledger-key",
            key.to_str().unwrap(),
            "--development-root",
            dev_root.to_str().unwrap(),
            "--job",
            &job,
        ])
    };
    let out = verify_bundle(&bundle, &ledger_key);
    assert!(out.status.success(), "{}", stack.describe(&out));
    // One hex digit changed in the receipt breaks the bundle.
    let mut tampered: Value = json(&std::fs::read_to_string(&bundle).unwrap());
    let receipt_hex = tampered["receipt"].as_str().unwrap().to_owned();
    let middle = receipt_hex.len() / 2;
    let digit = if &receipt_hex[middle..=middle] == "0" { "1" } else { "0" };
    tampered["receipt"] = format!("{}{digit}{}", &receipt_hex[..middle], &receipt_hex[middle + 1..]).into();
    let tampered_path = work.path().join("tampered.json");
    std::fs::write(&tampered_path, tampered.to_string()).unwrap();
    assert!(!verify_bundle(&tampered_path, &ledger_key).status.success(), "a tampered bundle verified");
    // A ledger key the auditor did not pin is refused, whatever the bundle says.
    let other_key = work.path().join("other.pub");
    let other = "ephem-batch.local/ledger+00000000+AWGtV4aJPr87AawaapmUMG/isbv/qqfxcww0x70jKRXL";
    std::fs::write(&other_key, other).unwrap();
    assert!(!verify_bundle(&bundle, &other_key).status.success(), "a bundle verified under another key");

    // --- blind host: no canary in anything the host side stored or logged ------------------
    let host_side: Vec<_> = ["objects", "queues.sqlite", "queues.sqlite-wal", "kms.sqlite", "ledger", "logs", "enclave", "run"]
        .iter()
        .map(|p| stack.home().join(p))
        .collect();
    let mut hits = Vec::new();
    for path in &host_side {
        if path.is_dir() {
            hits.extend(canary_hits(path, &canaries));
        } else if path.is_file() {
            hits.extend(canary_hits(path.parent().unwrap(), &canaries).into_iter().filter(|(f, _)| f == path));
        }
    }
    hits.extend(canary_hits(host_tmp.path(), &canaries));
    // Anything written to the system's temporary directories during the run, but for this
    // test's own directories (the client's corpus is in `work`).
    let ours = [stack.home(), work.path(), host_tmp.path()];
    for system_tmp in [std::env::temp_dir(), "/tmp".into(), "/var/tmp".into()] {
        hits.extend(canary_hits_in(files_modified_since(&system_tmp, started, &ours), &canaries));
    }
    assert!(hits.is_empty(), "plaintext on the host side: {hits:?}");
    // The scan itself finds a canary where one is (the client's own corpus).
    assert!(!canary_hits(work.path(), &canaries).is_empty());

    // --- bad lines: each is a per-record error, every good record is embedded ---------------
    let bad = work.path().join("bad.jsonl");
    let mut file = std::fs::File::create(&bad).unwrap();
    writeln!(file, r#"{{"id": "good-1", "text": "The first good record."}}"#).unwrap();
    writeln!(file, r#"{{"id": "broken", "text": "unterminated"#).unwrap();
    writeln!(file, r#"{{"id": "no-text"}}"#).unwrap();
    writeln!(file, r#"{{"id": "empty", "text": ""}}"#).unwrap();
    writeln!(file, "{}", serde_json::json!({"id": "huge", "text": "x".repeat(1 << 20)})).unwrap();
    file.write_all(b"{\"id\": \"latin1\", \"text\": \"caf\xe9\"}\n").unwrap();
    writeln!(file, r#"{{"id": "good-1", "text": "A duplicate id."}}"#).unwrap();
    writeln!(file, r#"{{"id": 7, "text": "A numeric id is kept as text."}}"#).unwrap();
    drop(file);
    let bad_out = work.path().join("bad-embeddings.jsonl");
    let report = json(&stack.ok(&["submit", bad.to_str().unwrap(), "--wait", "-o", bad_out.to_str().unwrap(), "--json"]));
    let embedded: Vec<String> = lines(&bad_out).iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(embedded, ["good-1", "7"]);
    let errors = lines(&work.path().join("bad-embeddings.errors.jsonl"));
    let codes: Vec<(Option<&str>, &str)> = errors.iter().map(|e| (e["id"].as_str(), e["code"].as_str().unwrap())).collect();
    for expected in [
        (None, "invalid_json"),
        (Some("no-text"), "missing_text"),
        (Some("empty"), "empty_text"),
        (Some("huge"), "too_large"),
        (Some("latin1"), "invalid_utf8"),
        (Some("good-1"), "duplicate_id"),
    ] {
        assert!(codes.contains(&expected), "{expected:?} not in {codes:?}");
    }
    assert_eq!(report["errors"], 6, "{report}");
    let bad_job = report["job_id"].as_str().unwrap().to_owned();
    stack.ok(&["verify", &bad_job]);

    // --- OpenAI Batch lines come back as OpenAI Batch output lines --------------------------
    let openai = work.path().join("openai.jsonl");
    let request = |id: &str, input: Value| {
        serde_json::json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings",
                           "body": {"model": "all-MiniLM-L6-v2", "input": input}})
        .to_string()
    };
    std::fs::write(
        &openai,
        format!("{}\n{}\n", request("one", "a single string".into()), request("two", serde_json::json!(["first", "second"]))),
    )
    .unwrap();
    let openai_out = work.path().join("openai-out.jsonl");
    stack.ok(&["submit", openai.to_str().unwrap(), "--wait", "-o", openai_out.to_str().unwrap()]);
    let answers = lines(&openai_out);
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[1]["custom_id"], "two");
    let data = answers[1]["response"]["body"]["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    unit_vector(&data[1]["embedding"]);

    // --- a second client cannot open the first client's results -----------------------------
    stack.ok(&["keygen", "--force"]);
    let stolen = work.path().join("stolen.jsonl");
    let out = stack.cli(&["results", &job, "-o", stolen.to_str().unwrap()]);
    assert!(!out.status.success(), "another key opened the results:\n{}", stack.describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("result envelope"), "{stderr}");
    assert!(!stolen.exists(), "nothing is written when the results do not open");
}
