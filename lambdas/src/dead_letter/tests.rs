use std::time::Duration;

use cloud_local::TokenOutcome;
use cloud::hooked::{Hooked, StoreHooks};

use super::*;
use lambdas_testing::Fixture;

fn config() -> Config {
    Config::from_list("stores/acme/")
}

/// A job that ended stays as it ended: a completed or failed status, or a committed receipt
/// whatever the status says. The waiting token gets the job's own end.
#[test]
fn a_job_that_ended_is_never_marked_failed() {
    let f = Fixture::new();
    let message = |job: &JobId| {
        serde_json::json!({
            "job_id": job.to_hex(), "input_key": layout::job_input(job), "input_size": 1, "model_id": "m",
            "manifest_hash": "00", "epoch": 1, "record_count": 1, "created_ms": 1
        })
        .to_string()
    };

    let (_, done) = f.sealed(1);
    let completed = serde_json::to_vec(&JobStatus::new(done, JobState::Completed, 1)).unwrap();
    f.services.jobs.put(&layout::job_status(&done), &completed, PutCondition::CreateOnly).unwrap();
    let out = handle_body(&message(&done), &f.services, &config()).unwrap();
    assert_eq!(out, [Outcome::AlreadyEnded { job_id: done, state: JobState::Completed }]);
    assert_eq!(f.services.jobs.get(&layout::job_status(&done)).unwrap(), completed);

    // The receipt is committed; the host died before it wrote `completed`.
    let (_, committed) = f.sealed(1);
    let token = f.waiting_token(&committed, "b-committed");
    let running = serde_json::to_vec(&JobStatus::new(committed, JobState::InProgress, 1)).unwrap();
    f.services.jobs.put(&layout::job_status(&committed), &running, PutCondition::CreateOnly).unwrap();
    f.services.jobs.put(&layout::job_receipt(&committed), b"receipt", PutCondition::CreateOnly).unwrap();
    let out = handle_body(&message(&committed), &f.services, &config()).unwrap();
    assert_eq!(out, [Outcome::AlreadyEnded { job_id: committed, state: JobState::Completed }]);
    assert_eq!(f.services.jobs.get(&layout::job_status(&committed)).unwrap(), running);
    assert!(matches!(f.cloud.workflows().outcome(&token).unwrap(), Some(TokenOutcome::Succeeded { .. })));

    // Failed by its host on the last receive, which died before completing the token.
    let (_, failed) = f.sealed(1);
    let token = f.waiting_token(&failed, "b-failed");
    let mut host_failed = JobStatus::new(failed, JobState::Failed, 1);
    host_failed.failure = Some(Failure { check: "dead_letter".into(), message: "stalled: no progress (receive 5 of 5)".into() });
    f.services.jobs.put(&layout::job_status(&failed), &serde_json::to_vec(&host_failed).unwrap(), PutCondition::CreateOnly).unwrap();
    handle_body(&message(&failed), &f.services, &config()).unwrap();
    assert_eq!(f.status(&failed), host_failed);
    assert_eq!(f.failed_cause(&token), "dead_letter: stalled: no progress (receive 5 of 5)");
}

/// A host that writes the job's end right after the consumer read the status it is about to
/// replace.
struct HostFinishesMeanwhile {
    end: Vec<u8>,
    done: std::sync::atomic::AtomicBool,
}

impl StoreHooks for HostFinishesMeanwhile {
    fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        let bytes = inner.read_range(key, offset, len)?;
        if key.ends_with("/status.json") && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            inner.put(key, &self.end, PutCondition::Overwrite)?;
        }
        Ok(bytes)
    }
}

/// The failed status is written If-Match the status read: a host's `completed` written in
/// between wins, and the consumer sees it on its next look.
#[test]
fn a_status_written_meanwhile_is_not_overwritten() {
    let f = Fixture::new();
    let (_, job) = f.sealed(1);
    let queued = serde_json::to_vec(&JobStatus::new(job, JobState::InProgress, 1)).unwrap();
    f.services.jobs.put(&layout::job_status(&job), &queued, PutCondition::CreateOnly).unwrap();
    let completed = serde_json::to_vec(&JobStatus::new(job, JobState::Completed, 1)).unwrap();
    let racing = Hooked::new(f.services.jobs.clone(), HostFinishesMeanwhile { end: completed.clone(), done: Default::default() });
    let failure = Failure { check: DEAD_LETTERED.into(), message: "m".into() };
    let marked = mark_failed(&racing, &job, failure.clone()).unwrap();
    assert_eq!(marked, Marked::Ended { state: JobState::Completed, failure: None });
    assert_eq!(f.services.jobs.get(&layout::job_status(&job)).unwrap(), completed);

    // Without a status at all: create-only.
    let (_, fresh) = f.sealed(1);
    assert_eq!(mark_failed(f.services.jobs.as_ref(), &fresh, failure).unwrap(), Marked::Failed);
    assert_eq!(f.status(&fresh).state, JobState::Failed);
}

/// The failure record as AWS documents it (asynchronous invocation, SQS destination), a
/// shard's record (the job its header derives), and records that name no job.
#[test]
fn records_are_read_as_lambda_writes_them() {
    let f = Fixture::new();
    let (bytes, job) = f.sealed(3);
    f.services.jobs.put("stores/acme/part-1.sealed", &bytes, PutCondition::CreateOnly).unwrap();
    let event = on_upload::object_created_event("jobs", "stores/acme/part-1.sealed", 1, "e");
    let record = serde_json::json!({
        "version": "1.0",
        "timestamp": "2026-11-24T21:52:47.333Z",
        "requestContext": {
            "requestId": "8ea123e4-1db7-4aca-ad10-d9ca1234c1fd",
            "functionArn": "arn:aws:lambda:us-east-2:123456789012:function:on-upload:$LATEST",
            "condition": "EventAgeExceeded",
            "approximateInvokeCount": 0
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"}
    })
    .to_string();
    match DeadLetter::parse(&record) {
        DeadLetter::Upload { reason, .. } => assert_eq!(reason, "on-upload gave up after 0 invocation(s) (EventAgeExceeded)"),
        other => panic!("{other:?}"),
    }
    let out = handle_body(&record, &f.services, &config()).unwrap();
    assert_eq!(out, [Outcome::MarkedFailed { job_id: job, check: UPLOAD_UNPROCESSED }]);

    // The shard became its job input before the invocation failed: that input's event decides.
    f.services.jobs.put(&layout::job_input(&job), &bytes, PutCondition::CreateOnly).unwrap();
    assert_eq!(handle_body(&record, &f.services, &config()).unwrap(), [Outcome::InputExists { job_id: job }]);

    for body in ["not json", r#"{"hello": 1}"#, r#"{"requestPayload": {"x": 1}}"#] {
        assert!(matches!(&handle_body(body, &f.services, &config()).unwrap()[..], [Outcome::Unattributable { .. }]), "{body}");
    }
    // A job message whose job id is not one (a real one with a non-hex last digit) names no job to end.
    let mut message = serde_json::to_value(cloud::messages::JobMessage {
        job_id: job,
        input_key: layout::job_input(&job),
        input_size: 1,
        model_id: "m".into(),
        manifest_hash: hex::encode([1; 32]),
        epoch: 1,
        record_count: 1,
        created_ms: 0,
        earlier_receives: 0,
    })
    .unwrap();
    message["job_id"] = format!("{}g", &job.to_hex()[..31]).into();
    let out = handle_body(&message.to_string(), &f.services, &config()).unwrap();
    assert!(matches!(&out[..], [Outcome::Unattributable { reason }] if reason.contains("is not a job id")), "{out:?}");
    let elsewhere = failure_record(&on_upload::object_created_event("jobs", "other/x.sealed", 1, "e"), "RetriesExhausted", 3, "boom");
    assert!(matches!(&handle_body(&elsewhere, &f.services, &config()).unwrap()[..], [Outcome::Unattributable { reason }] if reason.contains("neither")));
}

/// A host committed the receipt and died before it told the ledger, on the message's last
/// receive: the dead-letter consumer sends the receipt to the ledger queue as the host would
/// have, once — not again once the ledger holds the job, and never a receipt that does not decode.
#[test]
fn a_committed_receipt_the_ledger_never_heard_of_is_sent_to_it() {
    use base64::Engine as _;
    use cloud::messages::LedgerMessage;

    let f = Fixture::new();
    let e = protocol::dev_enclave::DevEnclave::new(2, cloud::now_ms());
    let signed = e.sign(&e.receipt(41));
    let job = e.receipt(41).job_id;
    f.services.jobs.put(&layout::job_receipt(&job), &signed, PutCondition::CreateOnly).unwrap();
    let document_key = layout::attestation_by_hash(&e.receipt(41).attestation_sha256);
    f.services.attestations.put(&document_key, &e.document, PutCondition::CreateOnly).unwrap();
    let message = serde_json::json!({
        "job_id": job.to_hex(), "input_key": layout::job_input(&job), "input_size": 1, "model_id": "m",
        "manifest_hash": "00", "epoch": 1, "record_count": 1, "created_ms": 1
    })
    .to_string();

    let out = handle_body(&message, &f.services, &config()).unwrap();
    assert_eq!(out, [Outcome::ReceiptSentToLedger { job_id: job }]);
    let sent = f.services.ledger_queue.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap();
    assert_eq!(sent.len(), 1);
    let sent: LedgerMessage = serde_json::from_str(&sent[0].body).unwrap();
    assert_eq!(sent, LedgerMessage::new(&job, &signed, &e.document));
    assert_eq!(base64::engine::general_purpose::STANDARD.decode(&sent.receipt).unwrap(), signed);

    // Once the ledger holds the job, a second dead letter for it sends nothing.
    f.services.jobs.put(&layout::job_ledgered(&job), b"{}", PutCondition::CreateOnly).unwrap();
    let out = handle_body(&message, &f.services, &config()).unwrap();
    assert_eq!(out, [Outcome::AlreadyEnded { job_id: job, state: JobState::Completed }]);
    assert!(f.services.ledger_queue.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap().is_empty());
}
