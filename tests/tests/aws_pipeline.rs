//! The pipeline with `--backend aws` against an AWS emulator (moto), through the real binaries:
//! resources created by the emulator's CloudFormation from the CDK app's synthesized template
//! (`scripts/emulator-stack.sh deploy`: its bucket and queue names, redrive policies,
//! notification filters and outputs); `ephem-batch --backend aws dev up` starts the
//! host-poller in aws mode (spawning the local enclave worker with its development NSM) and the
//! pump that stands in for the Lambdas — S3's upload event, as moto delivers it to an SQS queue,
//! goes to the real `on-upload` handler, and the ledger queue's messages go to the
//! `ledger-append` function the Lambda binary serves (the ledger in the S3 ledger bucket,
//! tlog-tiles) as the SQS event Lambda would build.
//!
//! **KMS is the project's local KMS here (`--kms local`), not moto's**: moto's KMS accepts
//! `Recipient` and ignores it (it would hand the host plaintext) and has no
//! `GenerateDataKeyPair*`, and only the local KMS can check the development worker's
//! attestation. S3 and SQS — objects, conditional writes, multipart, notifications,
//! visibility, redrive, FIFO — are the emulator's.
//!
//! One stack, three phases: a job end to end (`verify` exits 0); a job whose first delivery is
//! abandoned, redelivered after its visibility timeout; messages that fail on every delivery,
//! dead-lettered by the template's redrive policy (five receives) and taken from the DLQ by
//! `job-dead-letter`.

use std::path::Path;
use std::time::Duration;

use cloud::messages::JobMessage;
use cloud::{layout, ObjectStore, Queue, SendOptions};
use serde_json::Value;
use tests::aws::{endpoint, AwsStack};
use tests::{canary_hits, corpus_with_canaries};

/// The template's redrive limit of the job queue (cdk/lib/queues.ts `JOB_MAX_RECEIVES`).
const JOB_MAX_RECEIVES: u32 = 5;

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn exists(store: &dyn ObjectStore, key: &str) -> bool {
    store.head(key).unwrap().is_some()
}

/// Copies every object of `store` under `dir` (for the canary scan).
fn dump(store: &dyn ObjectStore, dir: &Path) {
    for meta in store.list("").unwrap() {
        let path = dir.join(meta.key.replace('/', "__"));
        std::fs::write(path, store.get(&meta.key).unwrap()).unwrap();
    }
}

#[test]
fn aws_pipeline_end_to_end_redelivery_and_dead_letters() {
    let Some(endpoint) = endpoint() else { return };
    let stack = AwsStack::deploy(&endpoint);
    stack.up();
    let cloud = stack.cloud();
    let services = cloud.services();
    assert_eq!(cloud.job_queue().max_receives().unwrap(), Some(JOB_MAX_RECEIVES), "the job queue's redrive policy is the template's");
    let work = tempfile::tempdir().unwrap();

    // --- 1. a job end to end ------------------------------------------------------------------
    let canaries: Vec<String> = (0..2).map(|i| format!("zqxcanary{i}aws-ornithopter-{i:04}")).collect();
    let corpus = work.path().join("corpus.jsonl");
    let text = corpus_with_canaries(&corpus, Some(60), &canaries);
    let expected_ids: Vec<String> = text.lines().map(|l| json(l)["id"].as_str().unwrap().to_owned()).collect();
    let out = work.path().join("embeddings.jsonl");
    // The tenant's trust inputs are the signed policy and the image publisher's key; the fleet
    // key is believed from the genesis the host stored in S3 beside the epoch its worker created.
    let policy = stack.home().join("dev/policy.json");
    let publisher = std::fs::read_to_string(stack.home().join("dev/image-publisher.pub")).unwrap();
    let trust = ["--policy", policy.to_str().unwrap(), "--publisher-key", publisher.trim()];
    let geneses = services.attestations.list(protocol::fleet::GENESIS_PREFIX).unwrap();
    assert!(!geneses.is_empty(), "the worker's epoch has its genesis in the attestations bucket");
    let mut args = vec!["submit", corpus.to_str().unwrap(), "--wait", "-o", out.to_str().unwrap(), "--json"];
    args.extend_from_slice(&trust);
    let report = json(&stack.ok(&args));
    let job = report["job_id"].as_str().unwrap().to_owned();
    assert_eq!(report["embedded"], expected_ids.len(), "{report}");
    assert_eq!(report["errors"], 0);
    assert_eq!(report["in_ledger"], true, "{report}");
    let ids: Vec<String> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| json(l)["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, expected_ids, "results in input order");

    let mut args = vec!["verify", job.as_str(), "--json"];
    args.extend_from_slice(&trust);
    let verification = json(&stack.ok(&args));
    for check in verification["checks"].as_array().unwrap() {
        assert_eq!(check["passed"], true, "{check}");
    }
    // An online query with the same trust inputs, through the host's relay.
    {
        let serve = tests::Serve::start_with(
            |args| {
                let mut command = stack.command();
                command.args(args);
                command
            },
            &trust,
        );
        let (status, answer) =
            serve.embeddings(&serde_json::json!({"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["a query"]}));
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["data"][0]["embedding"].as_array().unwrap().len(), 384, "{answer}");
    }
    // The key checks over the flow's fleet key pass; an Encrypt grant (grants outlive
    // PutKeyPolicy) fails them by name. The enclave reads the same evidence before it creates an
    // epoch, so no epoch could be born under the key now.
    let fleet_key = stack.ok(&["fleet", "check-key", "--json", "--recheck"]);
    assert!(json(&fleet_key)["checks"].as_array().unwrap().iter().all(|c| c["passed"] == true), "{fleet_key}");
    let kms = devstack::dev::aws::local_kms_of(&cloud).unwrap();
    let key = json(&fleet_key)["key"].as_str().unwrap().to_owned();
    kms.create_grant(&key, "arn:aws:iam::000000000000:role/operator", &["Encrypt"]).unwrap();
    let granted = stack.cli(&["fleet", "check-key", "--json"]);
    assert!(!granted.status.success(), "{}", stack.describe(&granted));
    let report = json(&String::from_utf8_lossy(&granted.stdout));
    let failed: Vec<&str> = report["checks"].as_array().unwrap().iter().filter(|c| c["passed"] == false).filter_map(|c| c["name"].as_str()).collect();
    assert!(failed.contains(&"key_grants"), "{report}");
    // Inclusion was checked with the job's own proof object: no copy of the ledger was needed.
    let ledger_detail = verification["checks"].as_array().unwrap().iter().find(|c| c["name"] == "ledger").unwrap()["detail"].clone();
    assert!(ledger_detail.as_str().unwrap().contains("ledger-proof.json"), "{ledger_detail}");
    let status = json(&stack.ok(&["status", &job, "--json"]));
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["status"]["attempt"], 1, "{status}");
    assert!(status["ledger"]["index"].is_u64(), "{status}");
    // What the pipeline left in the emulator's S3: the receipt, the attempt's output, the marker
    // ledger-append writes after it appended the receipt from the ledger queue's SQS event.
    let job_id = tests_job_id(&job);
    for key in [layout::job_receipt(&job_id), layout::job_output(&job_id, 1), layout::job_ledger_proof(&job_id), layout::job_ledgered(&job_id)] {
        assert!(exists(services.jobs.as_ref(), &key), "{key} is not in S3\n{}", stack.logs());
    }
    // The ledger queue drains: the job's receipt was taken, and the online query's usage receipt
    // (collected every 2 s, so it may still be on its way) is taken too.
    stack.wait_until("the ledger queue to drain", Duration::from_secs(60), || {
        let stats = cloud.ledger_queue().stats().unwrap();
        (stats.in_flight + stats.visible + stats.delayed == 0).then_some(())
    });
    // The ledger is the AWS one: tlog-tiles in the ledger bucket, written by the `ledger-append`
    // function the pump invoked; an auditor syncs a copy of it and verifies the whole ledger.
    let ledger_bucket = cloud.clients().object_store(cloud.settings().ledger_bucket.as_deref().unwrap(), "");
    let ledger_keys: Vec<String> = ledger_bucket.list("").unwrap().into_iter().map(|m| m.key).collect();
    for key in ["checkpoint", "tile/entries/000.p/1"] {
        assert!(ledger_keys.iter().any(|k| k == key), "{key} is not in the ledger bucket: {ledger_keys:?}\n{}", stack.logs());
    }
    assert!(!stack.home().join("ledger/ledger.sqlite").exists(), "no local ledger stands in for the S3 one");
    let pinned = stack.home().join("aws-ledger/ledger.pub"); // pinned by dev up (the development ledger key)
    let from = format!("s3://{}", cloud.settings().ledger_bucket.as_deref().unwrap());
    stack.ok(&["ledger", "sync", "--from", &from, "--ledger-key", pinned.to_str().unwrap(), "--json"]);
    let ledger_check = json(&stack.ok(&["ledger", "verify", "--json"]));
    assert_eq!(ledger_check["ok"], true, "{ledger_check}");

    // Blind host: no canary in anything stored in S3 or logged on the host side.
    let dumped = work.path().join("s3");
    std::fs::create_dir_all(&dumped).unwrap();
    dump(services.jobs.as_ref(), &dumped);
    dump(services.attestations.as_ref(), &dumped);
    let mut hits = canary_hits(&dumped, &canaries);
    hits.extend(canary_hits(&stack.home().join("logs"), &canaries));
    assert!(hits.is_empty(), "plaintext on the host side: {hits:?}");

    // --- 2. redelivery after a visibility timeout ----------------------------------------------
    // The host stops; a job is submitted; its message is taken by a "host" that dies with it
    // (received, never deleted); a new host gets it again once the visibility timeout ends.
    stack.stop_host_poller();
    let small = work.path().join("small.jsonl");
    std::fs::write(&small, "{\"id\": \"r1\", \"text\": \"Redelivered after a host died.\"}\n").unwrap();
    let second = json(&stack.ok(&["submit", small.to_str().unwrap(), "--json"]))["job_id"].as_str().unwrap().to_owned();
    let taken = stack.wait_until("the job message from on-upload", Duration::from_secs(60), || {
        cloud.job_queue().receive(1, Duration::from_secs(1), Duration::from_secs(3)).unwrap().into_iter().next()
    });
    let message: JobMessage = serde_json::from_str(&taken.body).unwrap();
    assert_eq!((message.job_id.to_hex().as_str(), taken.receive_count), (second.as_str(), 1));
    stack.up();
    let done = stack.wait_until("the redelivered job to complete", Duration::from_secs(180), || {
        let status = json(&stack.ok(&["status", &second, "--json"]));
        (status["state"] == "completed" && status["ledger"]["index"].is_u64()).then_some(status)
    });
    assert_eq!(done["status"]["attempt"], 2, "the second delivery did the work: {done}");
    let second_id = tests_job_id(&second);
    assert!(exists(services.jobs.as_ref(), &layout::job_output(&second_id, 2)));
    assert!(!exists(services.jobs.as_ref(), &layout::job_output(&second_id, 1)), "the dead host wrote nothing");
    stack.ok(&["verify", &second]);

    // --- 3. dead letters after N failed deliveries --------------------------------------------
    // A job message whose input does not exist (every attempt fails to read it), and a body
    // that is not a job message at all.
    let ghost = "9".repeat(32);
    let ghost_message = JobMessage {
        job_id: ghost.parse().unwrap(),
        input_key: format!("jobs/{ghost}/input.sealed"),
        input_size: 100,
        model_id: message.model_id.clone(),
        manifest_hash: message.manifest_hash.clone(),
        epoch: message.epoch,
        record_count: 1,
        created_ms: cloud::now_ms(),
        earlier_receives: 0,
    };
    services.job_queue.send(&serde_json::to_string(&ghost_message).unwrap(), &SendOptions::default()).unwrap();
    services.job_queue.send("not a job message", &SendOptions::default()).unwrap();
    // Both reach the dead-letter queue, which job-dead-letter (the pump, as the function's event
    // source) drains: the ghost's end, written by its host on the last receive, stays as it is;
    // the other body names no job and is logged.
    let dlq = cloud.job_dlq().expect("the job DLQ is in the outputs");
    let pump_log = || std::fs::read_to_string(stack.home().join("logs").join("aws-pump.log")).unwrap_or_default();
    stack.wait_until("job-dead-letter to take both dead letters", Duration::from_secs(120), || {
        let log = pump_log();
        let ended = log.lines().any(|l| l.contains("job had ended already") && l.contains(&ghost));
        let unattributable = log.lines().any(|l| l.contains("a dead letter names no job") && l.contains("not JSON"));
        (ended && unattributable).then_some(())
    });
    let ghost_status = json(&String::from_utf8(services.jobs.get(&format!("jobs/{ghost}/status.json")).unwrap()).unwrap());
    assert_eq!(ghost_status["state"], "failed", "{ghost_status}");
    assert_eq!(ghost_status["failure"]["check"], "dead_letter", "the host's own end is not overwritten: {ghost_status}");
    stack.wait_until("the DLQ drained", Duration::from_secs(30), || {
        let stats = dlq.stats().unwrap();
        (stats.visible == 0 && stats.in_flight == 0).then_some(())
    });
    let ledger_dlq = cloud.ledger_dlq().expect("the ledger DLQ is in the outputs");
    assert!(ledger_dlq.receive(10, Duration::ZERO, Duration::ZERO).unwrap().is_empty(), "a receipt was dead-lettered");
}

fn tests_job_id(hex: &str) -> protocol::envelope::JobId {
    protocol::envelope::JobId::from_hex(hex).expect("a job id")
}
