//! An enclave image update in the emulator flow (docs/operations.md §4): image A serves a job;
//! `dev update-image` rolls out image B while it runs — B's policy for the ledger, B's keys, the
//! model sealed for B, a host of B beside A, B's epoch, clients moved to B, A drained — and no
//! job is lost:
//!
//! * the job A was running when the update began completes on A (its receipt verifies under A's
//!   policy, not under B's);
//! * a job a client of A submits during the overlap, after B's model version is published, is
//!   sealed to A's version (`model_image`) and completes on A, though a host of B receives it
//!   first (A runs one job at a time and is busy): B hands it over rather than spend its
//!   receives;
//! * a job submitted after the update is served by B with B's model version;
//! * the ledger holds all three and nothing was dead-lettered.
//!
//! Image B is the worker binary with bytes appended: on the development NSM PCR0 is the binary's
//! SHA-384, so B is another measurement running the same code.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cloud::{layout, Queue};
use serde_json::Value;
use sha2::{Digest, Sha384};
use tests::aws::{endpoint, AwsStack};

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A corpus of `n` records (the example texts, repeated under new ids).
fn corpus(path: &Path, n: usize) {
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/corpus.jsonl")).unwrap();
    let texts: Vec<String> = example.lines().map(|l| json(l)["text"].as_str().unwrap().to_owned()).collect();
    let mut out = std::fs::File::create(path).unwrap();
    for i in 0..n {
        writeln!(out, "{}", serde_json::json!({"id": format!("r{i}"), "text": texts[i % texts.len()]})).unwrap();
    }
}

/// The worker binary with bytes appended: another PCR0, the same code.
fn image_b(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut bytes = std::fs::read(tests::bin_dir().join("enclave-worker")).unwrap();
    bytes.extend_from_slice(b"\0ephem-batch image B (an update in the emulator flow)\0");
    let path = dir.join("enclave-worker");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    (path, Sha384::digest(&bytes).to_vec())
}

/// PCR0 of each document published now under `attestations/current/`.
fn published_pcr0s(stack: &AwsStack) -> Vec<Vec<u8>> {
    let attestations = stack.cloud().services().attestations;
    let mut pcr0s = Vec::new();
    for meta in attestations.list(layout::ATTESTATIONS_CURRENT_PREFIX).unwrap() {
        let bytes = attestations.get(&meta.key).unwrap();
        if let Ok(document) = protocol::attestation::AttestationDocument::parse_unverified(&bytes) {
            pcr0s.extend(document.pcrs.get(&0).cloned());
        }
    }
    pcr0s
}

fn trust_args<'a>(policy: &'a Path, publisher: &'a str) -> [&'a str; 4] {
    ["--policy", policy.to_str().unwrap(), "--publisher-key", publisher]
}

fn submit(stack: &AwsStack, corpus: &Path, policy: &Path, publisher: &str) -> (String, String) {
    let mut args = vec!["submit", corpus.to_str().unwrap(), "--json"];
    args.extend_from_slice(&trust_args(policy, publisher));
    let out = stack.cli(&args);
    assert!(out.status.success(), "submit failed:\n{}", stack.describe(&out));
    // The model version the client chose is on stderr ("model <id> v<N> manifest …").
    let chosen = String::from_utf8_lossy(&out.stderr).lines().find(|l| l.starts_with("model ")).unwrap_or_default().to_owned();
    (json(&String::from_utf8_lossy(&out.stdout))["job_id"].as_str().unwrap().to_owned(), chosen)
}

fn status(stack: &AwsStack, job: &str) -> Value {
    json(&stack.ok(&["status", job, "--json"]))
}

fn wait_ledgered(stack: &AwsStack, job: &str) -> Value {
    stack.wait_until(&format!("job {job} in the ledger"), Duration::from_secs(600), || {
        let status = status(stack, job);
        assert!(!matches!(status["state"].as_str(), Some("failed" | "cancelled")), "job {job} ended: {status}");
        (status["state"] == "completed" && status["ledger"]["index"].is_u64()).then_some(status)
    })
}

/// `verify`'s exit and the names of its failed checks.
fn verify(stack: &AwsStack, job: &str, policy: &Path, publisher: &str) -> (bool, Vec<String>) {
    let mut args = vec!["verify", job, "--json"];
    args.extend_from_slice(&trust_args(policy, publisher));
    let out = stack.cli(&args);
    let report = json(&String::from_utf8_lossy(&out.stdout));
    let failed = report["checks"].as_array().unwrap().iter().filter(|c| c["passed"] == false).map(|c| c["name"].as_str().unwrap().to_owned()).collect();
    (out.status.success(), failed)
}

#[test]
fn aws_an_image_update_loses_no_job() {
    let Some(endpoint) = endpoint() else { return };
    let stack = AwsStack::deploy(&endpoint);
    // One job at a time on image A's host: while it runs the first job it does not poll.
    stack.ok(&["dev", "up", "--threads", "2", "--concurrency", "1"]);
    let work = tempfile::tempdir().unwrap();
    let publisher = std::fs::read_to_string(stack.home().join("dev/image-publisher.pub")).unwrap().trim().to_owned();
    // What a client of image A holds: A's policy, kept as it was.
    let policy_a = work.path().join("policy-a.json");
    std::fs::copy(stack.home().join("dev/policy.json"), &policy_a).unwrap();
    let (worker_b, pcr0_b) = image_b(work.path());

    // --- image A serves a job, still running when the update begins -------------------------
    let long = work.path().join("long.jsonl");
    corpus(&long, 1500);
    let (running, _) = submit(&stack, &long, &policy_a, &publisher);
    stack.wait_until("image A to start the job", Duration::from_secs(120), || {
        (status(&stack, &running)["state"] == "in_progress").then_some(())
    });

    // --- the update, in the background --------------------------------------------------------
    let mut update = stack.command();
    update
        .args(["dev", "update-image", "--worker", worker_b.to_str().unwrap(), "--threads", "1", "--concurrency", "1", "--drain-s", "900"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let update = update.spawn().expect("dev update-image");
    let started = Instant::now();

    // During the overlap — B's host attested, so B's model version is published — a client that
    // still holds A's policy submits.
    stack.wait_until("a document of image B", Duration::from_secs(300), || published_pcr0s(&stack).contains(&pcr0_b).then_some(()));
    let overlap_state = status(&stack, &running)["state"].as_str().unwrap_or_default().to_owned();
    // Image A's host runs one job at a time and is busy, so a host of B receives this job first:
    // B's worker cannot open A's epoch, and B hands the job over instead of spending its receives.
    let short = work.path().join("short.jsonl");
    corpus(&short, 40);
    let (during, during_model) = submit(&stack, &short, &policy_a, &publisher);
    assert!(during_model.contains(" v1 "), "a client of image A seals to A's model version: {during_model}");
    stack.wait_until("a host of B to hand the job over", Duration::from_secs(120), || {
        status(&stack, &during).to_string().contains("handed over").then_some(())
    });

    let finished = update.wait_with_output().unwrap();
    assert!(finished.status.success(), "dev update-image failed:\n{}", stack.describe(&finished));
    eprintln!("update done in {:.0} s:\n{}", started.elapsed().as_secs_f64(), String::from_utf8_lossy(&finished.stdout));
    assert_ne!(overlap_state, "completed", "the first job was still running when image B came up (else nothing was in flight)");

    // --- after the update: clients hold B's policy ----------------------------------------------
    let policy_b = stack.home().join("dev/policy.json");
    let (after, after_model) = submit(&stack, &short, &policy_b, &publisher);
    assert!(after_model.contains(" v2 "), "a client of image B seals to B's model version: {after_model}");

    for job in [&running, &during, &after] {
        let done = wait_ledgered(&stack, job);
        assert_eq!(done["state"], "completed", "{done}");
    }
    // Each receipt verifies under its image's policy and only under it.
    for (job, own, other) in [(&running, &policy_a, &policy_b), (&during, &policy_a, &policy_b), (&after, &policy_b, &policy_a)] {
        let (ok, failed) = verify(&stack, job, own, &publisher);
        assert!(ok, "job {job} under its image's policy: failed {failed:?}");
        let (ok, failed) = verify(&stack, job, other, &publisher);
        assert!(!ok && !failed.is_empty(), "job {job} verified under the other image's policy");
    }
    // Nothing dead-lettered; the old image's host is gone, the new one serves.
    let cloud = stack.cloud();
    let dlq = cloud.job_dlq().expect("the job DLQ");
    let stats = dlq.stats().unwrap();
    assert_eq!(stats.visible + stats.in_flight, 0, "a job was dead-lettered");
    let status_all = json(&stack.ok(&["dev", "status", "--json"]));
    assert!(status_all["processes"]["host-poller"].is_u64(), "the new image's host is the stack's host: {status_all}");
}
