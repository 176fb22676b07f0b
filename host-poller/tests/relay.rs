//! The poller against a scripted worker and an in-memory cloud: what it does on each outcome
//! of a job, and what it serves on the control channel. Fast (no model, no real enclave); the
//! real worker runs in `worker_process.rs`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use cloud::messages::{JobState, LedgerMessage};
use cloud::hooked::{Hooked, StoreHooks};
use cloud::{layout, ObjectError, ObjectMeta, ObjectStore, PutCondition, Queue};
use host_poller::{PollerConfig, WorkerEndpoint, WorkerSource};
use protocol::cancel::CancelRequest;
use protocol::FailedCheck;
use protocol::envelope::{seal_job, FleetSecretKey, JobHeader, JobId, JobOptions, ResultSecretKey};
use protocol::fleet::{epoch_object_key, genesis_object_key, EpochRecord};
use protocol::frame::Message;
use protocol::receipt::SignedReceipt;
use sha2::{Digest, Sha256};
use support::fake_worker::{receipt_key, FakeWorker, JobMode};
use support::memory::MemCloud;
use support::{enqueue, status, wait_until, Running};

const WAIT: Duration = Duration::from_secs(20);

fn epoch_record(epoch: u64, not_after_ms: u64) -> Vec<u8> {
    EpochRecord {
        epoch,
        not_after_ms,
        kms_key_id: "fleet".into(),
        public_key: hex::encode(FleetSecretKey::generate().public_key().to_bytes()),
        wrapped_private_key: hex::encode(format!("wrapped {epoch}")),
    }
    .to_json()
    .into_bytes()
}

fn setup(mode: JobMode, max_receives: u32) -> (MemCloud, FakeWorker, PollerConfig) {
    let cloud = MemCloud::new(max_receives);
    let hour = 3_600_000;
    cloud.attestations.put(&epoch_object_key(1), &epoch_record(1, cloud::now_ms() + hour), PutCondition::CreateOnly).unwrap();
    // The host offers only epochs with a genesis (its content is the clients' to check).
    cloud.attestations.put(&genesis_object_key(1), b"{}", PutCondition::CreateOnly).unwrap();
    cloud.models.put("models/all-MiniLM-L6-v2/v1/manifest.cose", b"manifest v1", PutCondition::CreateOnly).unwrap();
    let worker = FakeWorker::start(mode);
    let mut config = PollerConfig::new(WorkerSource::Connect(WorkerEndpoint::Unix(worker.socket.clone())));
    config.host_id = "test-host".into();
    config.max_receives = max_receives;
    config.poll_wait = Duration::from_millis(100);
    config.retry_base = Duration::from_millis(100);
    config.retry_max = Duration::from_millis(400);
    config.visibility = Duration::from_secs(3);
    config.rescan_interval = Duration::from_millis(300);
    config.stall_timeout = Duration::from_secs(10);
    (cloud, worker, config)
}

#[test]
fn usage_receipts_sent_unasked_on_control_keep_the_connection() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let before = host_poller::usage::received_count();
    let poller = Running::start(cloud.services(), config);
    wait_until("the epoch taken up", WAIT, || !worker.state.lock().unwrap().epochs.is_empty());
    // Several rescans (every 300 ms) after the receipt that arrived on the idle connection.
    std::thread::sleep(Duration::from_millis(1200));
    poller.stop();
    assert!(host_poller::usage::received_count() >= before + 2);
    assert_eq!(worker.state.lock().unwrap().control_connections, 1, "a usage receipt is not a broken connection");
}

/// Collected usage receipts go to the ledger queue under their usage id; what the worker sends
/// that does not decode as one (the fake's unasked bytes) is not sent.
#[test]
fn collected_usage_receipts_reach_the_ledger_queue_under_their_usage_id() {
    let (cloud, worker, mut config) = setup(JobMode::Echo, 5);
    config.usage = host_poller::usage::UsageSettings { interval: Duration::from_millis(200), flush_each: true };
    worker.state.lock().unwrap().usage_to_hand_over = 3;
    let poller = Running::start(cloud.services(), config);
    wait_until("three usage receipts in the ledger queue", WAIT, || cloud.ledger_queue.sent.lock().unwrap().len() >= 3);
    poller.stop();
    let sent = cloud.ledger_queue.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "the unasked bytes that are no usage receipt were not sent");
    let b64 = base64::engine::general_purpose::STANDARD;
    for (n, (body, options)) in sent.iter().enumerate() {
        let message: LedgerMessage = serde_json::from_str(body).unwrap();
        let receipt = b64.decode(&message.receipt).unwrap();
        let signed = protocol::usage::SignedUsageReceipt::decode(&receipt).unwrap();
        assert_eq!(signed.receipt.sequence, n as u64);
        assert_eq!(message.job_id, JobId(signed.usage_id()));
        assert_eq!(options.deduplication_id.as_deref(), Some(message.job_id.to_hex().as_str()));
        assert_eq!(b64.decode(&message.attestation_document).unwrap(), worker.state.lock().unwrap().document);
    }
    let collections = worker.state.lock().unwrap().usage_collections.clone();
    assert!(!collections.is_empty() && collections.iter().all(|flush| *flush), "{collections:?}");
}

/// A sealed-looking input of `len` bytes (the fake worker does not open it).
fn put_job(cloud: &MemCloud, seed: u8, len: usize) -> (JobId, Vec<u8>) {
    let job = JobId([seed; 16]);
    let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ seed).collect();
    cloud.jobs.put(&layout::job_input(&job), &input, PutCondition::CreateOnly).unwrap();
    (job, input)
}

fn state(cloud: &MemCloud, job: &JobId) -> Option<JobState> {
    status(&*cloud.jobs, job).map(|s| s.state)
}

#[test]
fn a_job_streams_through_commits_and_reaches_the_ledger() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let now = cloud::now_ms();
    // An expired epoch is never offered; one KMS refuses is reported back by its AWS code.
    cloud.attestations.put(&epoch_object_key(0), &epoch_record(0, now - 1), PutCondition::CreateOnly).unwrap();
    cloud.attestations.put(&epoch_object_key(99), &epoch_record(99, now + 3_600_000), PutCondition::CreateOnly).unwrap();
    cloud.attestations.put(&genesis_object_key(99), b"{}", PutCondition::CreateOnly).unwrap();
    // Only the newest manifest of a model is loaded.
    cloud.models.put("models/all-MiniLM-L6-v2/v2/manifest.cose", b"manifest v2", PutCondition::CreateOnly).unwrap();
    let (job, input) = put_job(&cloud, 0x11, 600_000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);

    wait_until("the job to complete", WAIT, || state(&cloud, &job) == Some(JobState::Completed));
    poller.stop();

    let output = cloud.jobs.get(&layout::job_output(&job, 1)).unwrap();
    assert_eq!(output, input.iter().map(|b| !b).collect::<Vec<u8>>(), "output streamed back whole, under attempt 1");
    let receipt = cloud.jobs.get(&layout::job_receipt(&job)).unwrap();
    let signed = SignedReceipt::decode(&receipt).unwrap();
    signed.verify(&receipt_key().verifying_key()).unwrap();
    assert_eq!(signed.receipt.attempt, 1);
    assert!(cloud.job_queue.pending().is_empty(), "job message deleted");
    assert_eq!(worker.job_starts(), [(job.to_hex(), 1)]);

    let status = status(&*cloud.jobs, &job).unwrap();
    assert_eq!((status.records_ok, status.records_failed, status.tokens), (Some(2), Some(1), 30));
    assert_eq!(status.output_key.as_deref(), Some(layout::job_output(&job, 1).as_str()));
    assert_eq!(status.host.as_deref(), Some("test-host"));

    let sent = cloud.ledger_queue.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    let (body, options) = &sent[0];
    assert_eq!(options.group_id.as_deref(), Some("ledger"));
    assert_eq!(options.deduplication_id.as_deref(), Some(job.to_hex().as_str()));
    let message: LedgerMessage = serde_json::from_str(body).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(b64.decode(&message.receipt).unwrap(), receipt);
    let document = b64.decode(&message.attestation_document).unwrap();
    assert_eq!(document, b"document for epoch 1");

    // Control: what the worker fetched and what KMS answered through the host.
    let fake = worker.state.lock().unwrap();
    let fetched: Vec<(&str, bool)> = fake.fetched.iter().map(|(k, r)| (k.as_str(), r.is_ok())).collect();
    assert!(fetched.contains(&("fleet-keys/epoch-1.json", true)), "{fetched:?}");
    assert!(fetched.contains(&("models/all-MiniLM-L6-v2/v2/manifest.cose", true)), "{fetched:?}");
    assert!(fetched.contains(&("jobs/0123/input.sealed", false)), "job objects are not served on control: {fetched:?}");
    assert!(!fetched.iter().any(|(k, _)| *k == "fleet-keys/epoch-0.json" || k.contains("/v1/")), "{fetched:?}");
    assert_eq!(fake.epochs, [1]);
    assert!(fake.kms_answers.iter().all(|m| matches!(m,
        Message::KmsCredentials { region, access_key_id, session_token, .. }
            if region == "fake-region" && access_key_id == "fake-key-id" && session_token.as_deref() == Some("fake-token"))),
        "{:?}", fake.kms_answers);
    assert!(!fake.kms_answers.is_empty());
    assert!(cloud.kms.calls.lock().unwrap().is_empty(), "the host makes no KMS call on the worker's behalf");
    // The published document, by hash and as this host's current one.
    let by_hash = layout::attestation_by_hash(&Sha256::digest(&document).into());
    assert_eq!(cloud.attestations.get(&by_hash).unwrap(), document);
    assert_eq!(cloud.attestations.get(&layout::attestation_current("test-host")).unwrap(), document);
}

/// S3 answers a read of an absent key with 403, not 404, to a caller without `s3:ListBucket`
/// on it — a grant whose `s3:prefix` condition an account evaluates otherwise than expected.
struct AbsentIsDenied;

impl AbsentIsDenied {
    fn deny<T>(result: Result<T, ObjectError>) -> Result<T, ObjectError> {
        match result {
            Err(ObjectError::NotFound { key }) => Err(ObjectError::AccessDenied { key, message: "403 Forbidden".into() }),
            other => other,
        }
    }
}

impl StoreHooks for AbsentIsDenied {
    fn get(&self, inner: &dyn ObjectStore, key: &str) -> Result<Vec<u8>, ObjectError> {
        Self::deny(inner.get(key))
    }
    fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        Self::deny(inner.read_range(key, offset, len))
    }
    fn head(&self, inner: &dyn ObjectStore, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        match inner.head(key)? {
            Some(meta) => Ok(Some(meta)),
            None => Err(ObjectError::AccessDenied { key: key.to_owned(), message: "403 Forbidden".into() }),
        }
    }
}

/// The host's first reads of a new job (a receipt? a cancel?) find nothing: whether S3 says so
/// with 404 or 403, the job runs, and the create-only commit of the receipt keeps it done once.
#[test]
fn a_job_completes_whether_s3_answers_404_or_403_for_what_is_absent() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let (job, input) = put_job(&cloud, 0x2a, 10_000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let mut services = cloud.services();
    services.jobs = Arc::new(Hooked::new(cloud.jobs.clone(), AbsentIsDenied));
    let poller = Running::start(services.clone(), config);
    wait_until("the job to complete", WAIT, || state(&cloud, &job) == Some(JobState::Completed));
    // A second delivery of the same job is a duplicate, not a second attempt.
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    wait_until("the duplicate to be consumed", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();
    assert_eq!(worker.job_starts(), [(job.to_hex(), 1)]);
}

#[test]
fn a_duplicate_delivery_is_not_reworked_and_tells_the_ledger_until_it_has_the_receipt() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let (job, input) = put_job(&cloud, 0x22, 1000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the job to complete", WAIT, || state(&cloud, &job) == Some(JobState::Completed));

    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    wait_until("the duplicate to be deleted", WAIT, || {
        cloud.job_queue.pending().is_empty() && cloud.ledger_queue.sent.lock().unwrap().len() == 2
    });
    // Once the ledger has it, a duplicate is just deleted.
    cloud.jobs.put(&layout::job_ledgered(&job), b"{}", PutCondition::CreateOnly).unwrap();
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    wait_until("the second duplicate to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();

    assert_eq!(worker.job_starts().len(), 1, "no second attempt");
    assert_eq!(cloud.ledger_queue.sent.lock().unwrap().len(), 2);
    assert_eq!(cloud.jobs.keys(&layout::job_attempts_prefix(&job)), [layout::job_output(&job, 1)]);
}

#[test]
fn an_attempt_that_loses_the_receipt_race_discards_its_output() {
    let (cloud, worker, config) = setup(JobMode::Slow(Duration::from_millis(800)), 5);
    let (job, input) = put_job(&cloud, 0x33, 1000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the attempt to start", WAIT, || !worker.job_starts().is_empty());

    // Meanwhile another host's attempt 7 commits first.
    let document = worker.state.lock().unwrap().document.clone();
    let mut other = SignedReceipt::decode(&fake_receipt(&job, 7, &document)).unwrap().receipt;
    other.records_ok = 5;
    let winner = other.sign(&receipt_key());
    cloud.jobs.put(&layout::job_receipt(&job), &winner, PutCondition::CreateOnly).unwrap();

    wait_until("the message to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    wait_until("the status to name the winner", WAIT, || status(&*cloud.jobs, &job).is_some_and(|s| s.attempt == Some(7)));
    poller.stop();
    assert_eq!(cloud.jobs.get(&layout::job_receipt(&job)).unwrap(), winner, "the first receipt stands");
    assert!(cloud.jobs.keys(&layout::job_attempts_prefix(&job)).is_empty(), "the losing output is deleted");
    let status = status(&*cloud.jobs, &job).unwrap();
    assert_eq!((status.state, status.records_ok), (JobState::Completed, Some(5)));
}

fn fake_receipt(job: &JobId, attempt: u64, document: &[u8]) -> Vec<u8> {
    protocol::receipt::Receipt {
        job_id: *job,
        input_sha256: [0; 32],
        output_sha256: [0; 32],
        records_ok: 1,
        records_failed: 0,
        tokens: 1,
        model_id: support::fake_worker::MODEL_ID.into(),
        manifest_hash: [1; 32],
        options: Default::default(),
        result_key_id: [2; 32],
        attempt,
        attestation_sha256: Sha256::digest(document).into(),
        pcrs: Default::default(),
        fleet_key_id: [3; 32],
        epoch: 1,
        started_ms: 1,
        finished_ms: 2,
        commitment: [4; 32],
        records_root: None,
        compute: None,
    }
    .sign(&receipt_key())
}

#[test]
fn a_failure_of_the_jobs_own_bytes_is_final() {
    let (cloud, worker, config) = setup(JobMode::Fail(FailedCheck::Stream), 5);
    let (job, input) = put_job(&cloud, 0x44, 700_000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the job to fail", WAIT, || state(&cloud, &job) == Some(JobState::Failed));
    wait_until("the message to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();
    let failure = status(&*cloud.jobs, &job).unwrap().failure.unwrap();
    assert_eq!(failure.check, "stream");
    assert_eq!(worker.job_starts().len(), 1);
    assert!(cloud.jobs.keys(&layout::job_attempts_prefix(&job)).is_empty(), "a failed attempt commits no output");
    assert!(cloud.jobs.head(&layout::job_receipt(&job)).unwrap().is_none());
    assert!(cloud.ledger_queue.sent.lock().unwrap().is_empty());
}

#[test]
fn other_failures_are_retried_with_backoff_until_the_dead_letter() {
    let (cloud, worker, mut config) = setup(JobMode::Fail(FailedCheck::Protocol), 3);
    config.retry_base = Duration::from_millis(600);
    let (job, input) = put_job(&cloud, 0x55, 1000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);

    wait_until("a first failed attempt", WAIT, || {
        status(&*cloud.jobs, &job).is_some_and(|s| s.state == JobState::Queued && s.failure.is_some())
    });
    let shown = status(&*cloud.jobs, &job).unwrap().failure.unwrap();
    assert_eq!(shown.check, "protocol", "the status shows the last error");
    assert!(cloud.job_queue.hidden_for().unwrap() > 0.1, "hidden for a backoff, not retried at once");

    wait_until("the dead letter", WAIT, || state(&cloud, &job) == Some(JobState::Failed));
    wait_until("the queue to dead-letter it", WAIT, || cloud.job_queue.dead.lock().unwrap().len() == 1);
    poller.stop();
    let failure = status(&*cloud.jobs, &job).unwrap().failure.unwrap();
    assert_eq!(failure.check, "dead_letter");
    assert!(failure.message.starts_with("protocol: "), "{}", failure.message);
    let attempts: Vec<u64> = worker.job_starts().into_iter().map(|(_, a)| a).collect();
    assert_eq!(attempts, [1, 2, 3], "attempt = receive count");
}

/// An object store that keeps failing (throttled, 5xx) on the job's input: each attempt tries
/// the read a bounded number of times with backoff, each receive is delayed by the job's
/// backoff, and after the receive limit the job is dead-lettered with the store's error named.
#[test]
fn a_store_that_keeps_failing_is_retried_a_bounded_number_of_times_then_dead_lettered() {
    let (cloud, worker, mut config) = setup(JobMode::Echo, 3);
    config.retry_base = Duration::from_millis(600);
    let (job, input) = put_job(&cloud, 0x58, 1000);
    cloud.jobs.fail_reads(&layout::job_input(&job));
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let started = std::time::Instant::now();
    let poller = Running::start(cloud.services(), config);

    wait_until("a first failed attempt", WAIT, || {
        status(&*cloud.jobs, &job).is_some_and(|s| s.state == JobState::Queued && s.failure.is_some())
    });
    assert_eq!(status(&*cloud.jobs, &job).unwrap().failure.unwrap().check, "input");
    assert!(cloud.job_queue.hidden_for().unwrap() > 0.1, "hidden for a backoff, not retried at once");
    wait_until("the dead letter", WAIT, || state(&cloud, &job) == Some(JobState::Failed));
    wait_until("the queue to dead-letter it", WAIT, || cloud.job_queue.dead.lock().unwrap().len() == 1);
    poller.stop();

    let failure = status(&*cloud.jobs, &job).unwrap().failure.unwrap();
    assert_eq!(failure.check, "dead_letter");
    assert!(failure.message.starts_with("input: ") && failure.message.contains("injected: 503 Slow Down"), "{}", failure.message);
    assert!(failure.message.contains("receive 3 of 3"), "{}", failure.message);
    // 5 tries per receive (100, 200, 400, 800 ms apart, jittered), 3 receives: bounded.
    assert_eq!(cloud.jobs.failed_reads(), 15, "tries of the input read");
    assert!(started.elapsed() > Duration::from_millis(2000), "the tries were spread by backoff: {:?}", started.elapsed());
    assert!(worker.job_starts().is_empty(), "nothing reached the worker");
    assert!(cloud.jobs.head(&layout::job_receipt(&job)).unwrap().is_none());
}

#[test]
fn a_worker_that_dies_mid_job_loses_only_that_attempt() {
    let (cloud, worker, config) = setup(JobMode::Die, 5);
    let (job, input) = put_job(&cloud, 0x66, 600_000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the first attempt", WAIT, || !worker.job_starts().is_empty());
    worker.set_mode(JobMode::Echo);
    wait_until("the job to complete", WAIT, || state(&cloud, &job) == Some(JobState::Completed));
    poller.stop();
    assert_eq!(worker.job_starts().iter().map(|(_, a)| *a).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(cloud.jobs.keys(&layout::job_attempts_prefix(&job)), [layout::job_output(&job, 2)], "attempt 1 left nothing");
}

/// A job sealed for real (its id derives from its header, which names `submitter`'s result
/// key), with `len` bytes of stand-in chunks after the preamble (the fake worker does not open it).
fn put_sealed_job(cloud: &MemCloud, submitter: &ResultSecretKey, len: usize) -> (JobId, Vec<u8>) {
    let fleet = FleetSecretKey::generate().public_key();
    let header = JobHeader {
        fleet_key_id: fleet.key_id(),
        epoch: 1,
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: [1; 32],
        options: JobOptions::default(),
        result_public_key: submitter.public_key().to_bytes(),
        record_count: 3,
        created_ms: cloud::now_ms(),
    };
    let sealed = seal_job(&header, &fleet).unwrap();
    let job = JobId(sealed.stream_id);
    let mut input = sealed.preamble;
    input.extend((0..len).map(|i| (i % 251) as u8));
    cloud.jobs.put(&layout::job_input(&job), &input, PutCondition::CreateOnly).unwrap();
    (job, input)
}

#[test]
fn only_the_submitters_signed_cancel_stops_a_queued_job() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let submitter = ResultSecretKey::generate();
    let tenant = ResultSecretKey::generate();
    // Another tenant who learnt the job ids writes cancel.json first: unsigned, or signed
    // with its own key, or the submitter's signature lifted from another job.
    let (unsigned, unsigned_input) = put_sealed_job(&cloud, &submitter, 1000);
    let (foreign, foreign_input) = put_sealed_job(&cloud, &submitter, 1000);
    let (replayed, replayed_input) = put_sealed_job(&cloud, &submitter, 1000);
    let (genuine, genuine_input) = put_sealed_job(&cloud, &submitter, 1000);
    let bodies = [
        (unsigned, br#"{"job_id":"x","requested_ms":1}"#.to_vec()),
        (foreign, CancelRequest::new(&tenant, &foreign, 1).to_json().into_bytes()),
        (replayed, {
            let mut lifted = CancelRequest::new(&submitter, &genuine, 1);
            lifted.job_id = replayed;
            lifted.to_json().into_bytes()
        }),
        (genuine, CancelRequest::new(&submitter, &genuine, 1).to_json().into_bytes()),
    ];
    for (job, body) in &bodies {
        cloud.jobs.put(&layout::job_cancel(job), body, PutCondition::CreateOnly).unwrap();
    }
    for (job, input) in [(unsigned, &unsigned_input), (foreign, &foreign_input), (replayed, &replayed_input), (genuine, &genuine_input)] {
        enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    }
    let poller = Running::start(cloud.services(), config);
    wait_until("the genuine cancel", WAIT, || state(&cloud, &genuine) == Some(JobState::Cancelled));
    for job in [unsigned, foreign, replayed] {
        wait_until("the job a forged cancel named to run", WAIT, || state(&cloud, &job) == Some(JobState::Completed));
    }
    wait_until("every message to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();
    let started: Vec<String> = worker.job_starts().into_iter().map(|(job, _)| job).collect();
    assert!(!started.contains(&genuine.to_hex()), "the cancelled job never started");
    assert_eq!(started.len(), 3, "each job with a forged cancel ran once: {started:?}");
}

/// What a bulk run's await step leaves for the host: its task token under the job.
fn await_in_bulk_run(cloud: &MemCloud, job: &JobId, token: &str) {
    cloud::workflow::write_bulk_task(&*cloud.jobs, job, "run-1", token, cloud::now_ms()).unwrap();
}

#[test]
fn a_bulk_runs_token_is_completed_after_the_receipt_is_committed() {
    let (cloud, _worker, config) = setup(JobMode::Echo, 5);
    let (job, input) = put_job(&cloud, 0x81, 1000);
    let (plain, plain_input) = put_job(&cloud, 0x82, 1000);
    await_in_bulk_run(&cloud, &job, "token-1");
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    enqueue(&*cloud.job_queue, &plain, plain_input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config.clone());
    wait_until("both jobs to complete", WAIT, || {
        state(&cloud, &job) == Some(JobState::Completed) && state(&cloud, &plain) == Some(JobState::Completed)
    });
    wait_until("the messages to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();
    assert!(cloud.jobs.head(&layout::job_receipt(&job)).unwrap().is_some());
    let completed = cloud.tokens.completed.lock().unwrap().clone();
    assert_eq!(completed.len(), 1, "only the job a run waits for: {completed:?}");
    let (token, result) = &completed[0];
    assert_eq!(token, "token-1");
    let output: serde_json::Value = serde_json::from_str(result.as_ref().unwrap()).unwrap();
    assert_eq!(output, serde_json::json!({"job_id": job.to_hex(), "receipt_key": layout::job_receipt(&job)}));

    // A duplicate delivery completes it again; the service answers that it is closed.
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the duplicate to be deleted", WAIT, || cloud.job_queue.pending().is_empty());
    poller.stop();
    assert_eq!(cloud.tokens.late.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn a_bulk_runs_token_is_failed_with_the_reason_when_the_job_fails() {
    let (cloud, _worker, config) = setup(JobMode::Fail(FailedCheck::Stream), 5);
    let (job, input) = put_job(&cloud, 0x83, 1000);
    await_in_bulk_run(&cloud, &job, "token-2");
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the token to be failed", WAIT, || !cloud.tokens.completed.lock().unwrap().is_empty());
    poller.stop();
    let completed = cloud.tokens.completed.lock().unwrap().clone();
    let (token, result) = &completed[0];
    assert_eq!(token, "token-2");
    let (error, cause) = result.as_ref().unwrap_err();
    assert_eq!(error, "EphemBatch.JobFailed");
    assert!(cause.starts_with("stream: "), "{cause}");
    assert_eq!(state(&cloud, &job), Some(JobState::Failed), "the status was written before the token was failed");
}

#[test]
fn an_unreadable_message_is_left_for_the_dead_letter_queue() {
    let (cloud, _worker, config) = setup(JobMode::Echo, 5);
    cloud.job_queue.send("not json", &Default::default()).map(|_| ()).unwrap();
    let poller = Running::start(cloud.services(), config);
    wait_until("it to be received", WAIT, || cloud.job_queue.pending() == [1]);
    std::thread::sleep(Duration::from_millis(100));
    poller.stop();
    assert_eq!(cloud.job_queue.pending().len(), 1, "not deleted");
}

/// A job message whose job id is not 32 lowercase hex digits (a real one, its last digit not hex) is
/// unreadable: nothing is run, no status written under either spelling, the message left for
/// the dead-letter queue.
#[test]
fn a_message_whose_job_id_is_not_one_is_unreadable() {
    let (cloud, worker, config) = setup(JobMode::Echo, 5);
    let (job, input) = put_job(&cloud, 0x89, 100);
    let mut message = serde_json::to_value(cloud::messages::JobMessage {
        job_id: job,
        input_key: layout::job_input(&job),
        input_size: input.len() as u64,
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: hex::encode([1; 32]),
        epoch: 1,
        record_count: 1,
        created_ms: 0,
        earlier_receives: 0,
    })
    .unwrap();
    message["job_id"] = format!("{}g", &job.to_hex()[..31]).into();
    cloud.job_queue.send(&message.to_string(), &Default::default()).unwrap();
    let poller = Running::start(cloud.services(), config);
    wait_until("it to be received", WAIT, || cloud.job_queue.pending() == [1]);
    std::thread::sleep(Duration::from_millis(100));
    poller.stop();
    assert_eq!(cloud.job_queue.pending().len(), 1, "not deleted");
    assert!(worker.job_starts().is_empty(), "nothing ran");
    assert_eq!(state(&cloud, &job), None, "no status written");
}

#[test]
fn a_graceful_stop_finishes_the_job_in_flight() {
    let (cloud, worker, config) = setup(JobMode::Slow(Duration::from_millis(700)), 5);
    let (job, input) = put_job(&cloud, 0x88, 1000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the attempt to start", WAIT, || !worker.job_starts().is_empty());
    poller.stop();
    assert_eq!(state(&cloud, &job), Some(JobState::Completed));
    assert!(cloud.job_queue.pending().is_empty());
}

#[test]
fn an_abort_hands_the_job_in_flight_back_at_once() {
    let (cloud, worker, config) = setup(JobMode::Hang, 5);
    let (job, input) = put_job(&cloud, 0x99, 1000);
    enqueue(&*cloud.job_queue, &job, input.len() as u64, 3, [1; 32]);
    let poller = Running::start(cloud.services(), config);
    wait_until("the attempt to start", WAIT, || !worker.job_starts().is_empty());
    poller.handle.abort();
    poller.join();
    assert_eq!(cloud.job_queue.pending(), [1], "still in the queue");
    assert!(cloud.job_queue.hidden_for().unwrap() <= 0.0, "visible again at once");
    assert_eq!(state(&cloud, &job), Some(JobState::Queued));
    assert!(cloud.jobs.keys(&layout::job_attempts_prefix(&job)).is_empty(), "no partial output committed");
}

#[test]
fn a_client_nonce_gets_a_fresh_document() {
    let (cloud, _worker, config) = setup(JobMode::Echo, 5);
    let nonce = b"client nonce 1".to_vec();
    let body = format!(r#"{{"nonce":"{}","requested_ms":{}}}"#, hex::encode(&nonce), cloud::now_ms());
    cloud.attestations.put(&layout::attestation_request(&nonce), body.as_bytes(), PutCondition::CreateOnly).unwrap();
    let stale = b"stale".to_vec();
    let old = format!(r#"{{"nonce":"{}","requested_ms":1}}"#, hex::encode(&stale));
    cloud.attestations.put(&layout::attestation_request(&stale), old.as_bytes(), PutCondition::CreateOnly).unwrap();
    let poller = Running::start(cloud.services(), config);
    let answer = layout::attestation_fresh(&nonce);
    wait_until("the fresh document", WAIT, || cloud.attestations.head(&answer).unwrap().is_some());
    wait_until("the requests to be removed", WAIT, || cloud.attestations.keys(layout::ATTESTATION_REQUESTS_PREFIX).is_empty());
    poller.stop();
    assert_eq!(cloud.attestations.get(&answer).unwrap(), [b"fresh:".as_slice(), &nonce].concat());
    assert!(cloud.attestations.head(&layout::attestation_fresh(&stale)).unwrap().is_none(), "a stale request is dropped");
}

/// A tenant may put anything under `attestations/requests/`: a 64 MiB request is read at most a
/// few KiB and removed, a request dated near `u64::MAX` neither panics nor is answered, and a
/// genuine request beside them is answered.
#[test]
fn a_huge_or_absurd_attestation_request_is_removed_unread_and_the_genuine_one_answered() {
    let (cloud, _worker, config) = setup(JobMode::Echo, 5);
    let huge = b"huge".to_vec();
    let huge_key = layout::attestation_request(&huge);
    let mut body = format!(r#"{{"requested_ms":{},"pad":""#, cloud::now_ms()).into_bytes();
    body.resize(64 << 20, b'x');
    cloud.attestations.put(&huge_key, &body, PutCondition::CreateOnly).unwrap();
    let future = b"future".to_vec();
    let far = format!(r#"{{"requested_ms":{}}}"#, u64::MAX - 5);
    cloud.attestations.put(&layout::attestation_request(&future), far.as_bytes(), PutCondition::CreateOnly).unwrap();
    let nonce = b"genuine".to_vec();
    let genuine = format!(r#"{{"requested_ms":{}}}"#, cloud::now_ms());
    cloud.attestations.put(&layout::attestation_request(&nonce), genuine.as_bytes(), PutCondition::CreateOnly).unwrap();

    let poller = Running::start(cloud.services(), config);
    wait_until("the fresh document", WAIT, || cloud.attestations.head(&layout::attestation_fresh(&nonce)).unwrap().is_some());
    wait_until("the requests to be removed", WAIT, || cloud.attestations.keys(layout::ATTESTATION_REQUESTS_PREFIX).is_empty());
    poller.stop();
    let read = cloud.attestations.bytes_read(&huge_key);
    assert!(read <= 4096, "read {read} bytes of a 64 MiB request");
    assert_eq!(read, 0, "the listed size is checked before anything is read");
    for unanswered in [&huge, &future] {
        assert!(cloud.attestations.head(&layout::attestation_fresh(unanswered)).unwrap().is_none());
    }
}

/// A tenant floods `attestations/requests/` with 10,000 requests that look genuine (valid
/// nonces spread over the key space, fresh dates): a genuine request put meanwhile is answered
/// within the client's 30 s wait, the whole flood too (so it would be wherever its key sorts),
/// and no listing returns more than one pass's page.
#[test]
fn a_flood_of_requests_does_not_starve_a_genuine_one() {
    let (cloud, _worker, config) = setup(JobMode::Echo, 5);
    let body = format!(r#"{{"requested_ms":{}}}"#, cloud::now_ms());
    for n in 0u32..10_000 {
        let nonce = &Sha256::digest(n.to_be_bytes())[..16];
        cloud.attestations.put(&layout::attestation_request(nonce), body.as_bytes(), PutCondition::CreateOnly).unwrap();
    }
    let poller = Running::start(cloud.services(), config);
    wait_until("the flood to be worked on", WAIT, || cloud.attestations.keys(layout::ATTESTATION_REQUESTS_PREFIX).len() < 9_900);
    let nonce = b"genuine client".to_vec();
    let asked = std::time::Instant::now();
    let genuine = format!(r#"{{"requested_ms":{}}}"#, cloud::now_ms());
    cloud.attestations.put(&layout::attestation_request(&nonce), genuine.as_bytes(), PutCondition::CreateOnly).unwrap();
    wait_until("the genuine fresh document", Duration::from_secs(30), || {
        cloud.attestations.head(&layout::attestation_fresh(&nonce)).unwrap().is_some()
    });
    let answered_in = asked.elapsed();
    let left = cloud.attestations.keys(layout::ATTESTATION_REQUESTS_PREFIX).len();
    let rest = Duration::from_secs(30).saturating_sub(answered_in);
    wait_until("the whole flood", rest, || cloud.attestations.keys(layout::ATTESTATION_REQUESTS_PREFIX).is_empty());
    let drained_in = asked.elapsed();
    poller.stop();
    eprintln!("genuine request answered in {answered_in:?} ({left} flood requests left then), the flood in {drained_in:?}");
    assert_eq!(cloud.attestations.get(&layout::attestation_fresh(&nonce)).unwrap(), [b"fresh:".as_slice(), &nonce].concat());
    let most = cloud.attestations.most_listed();
    assert!(most <= 256, "one listing returned {most} request keys");
}
