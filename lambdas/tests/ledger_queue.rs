//! A host poisons the ledger's FIFO queue — one message group, so whatever is not done holds
//! back every receipt behind it — and a genuine receipt that comes after must still be appended
//! within seconds, not after the queue's visibility timeouts (180 s each, three receives: the
//! stack's settings). Then the operator fixes what held the rest (a policy uploaded, a throttled
//! prefix calm again), redrives the dead-letter queue, and the held receipts are appended in
//! their order.
//!
//! The queue is played by the local queue and by SQS on an emulator (moto; skipped with a note
//! without `EPHEM_TEST_AWS_ENDPOINT`), drained the way Lambda's event source does: receive with
//! the queue's visibility, invoke [`LedgerFunction`], delete what the response does not list —
//! and nothing else (the event source changes no visibility and dead-letters nothing itself).

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use base64::Engine as _;
use cloud_aws::{AwsClients, SqsQueue};
use cloud::hooked::{Hooked, ThrottledPuts};
use cloud_local::{DirObjectStore, QueueConfig, SqliteQueue};
use cloud::messages::{LedgerMessage, Ledgered};
use cloud::{layout, ObjectError, ObjectStore, Queue, SendOptions};
use lambdas::ledger_append::{FunctionConfig, LedgerFunction, LedgerQueues, RetryBudget, LEDGER_GROUP};
use protocol::envelope::JobId;
use protocol::dev_enclave::DevEnclave;
use receipts_ledger::SignerKey;
use protocol::attestation::PolicySet;

/// 2025-11-01T00:00:00Z: the documents' time.
const T: u64 = 1_761_955_200_000;
/// The stack's ledger queue: visibility 6 × the function's 30 s, three receives.
const VISIBILITY: Duration = Duration::from_secs(180);
const MAX_RECEIVES: u32 = 3;

fn job(j: u64) -> String {
    format!("{j:032x}")
}

fn publisher() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x51; 32])
}

fn policies(images: &[&DevEnclave]) -> PolicySet {
    let signed = images.iter().enumerate().map(|(i, e)| (format!("image-{i}.json"), e.policy(&publisher()))).collect();
    PolicySet::verify(&publisher().verifying_key(), signed).unwrap()
}

fn body(e: &DevEnclave, j: u64) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::to_string(&LedgerMessage {
        job_id: job(j).parse().unwrap(),
        receipt: b64.encode(e.sign(&e.receipt(j))),
        attestation_document: b64.encode(&e.document),
    })
    .unwrap()
}

/// The ledger queue and its dead-letter queue, as one backend has them.
enum Queues {
    Local { source: Arc<SqliteQueue>, dlq: Arc<SqliteQueue> },
    Sqs { source: SqsQueue, dlq: SqsQueue, clients: Box<AwsClients> },
}

impl Queues {
    fn source(&self) -> Arc<dyn Queue> {
        match self {
            Queues::Local { source, .. } => source.clone(),
            Queues::Sqs { source, .. } => Arc::new(source.clone()),
        }
    }

    fn dlq(&self) -> Arc<dyn Queue> {
        match self {
            Queues::Local { dlq, .. } => dlq.clone(),
            Queues::Sqs { dlq, .. } => Arc::new(dlq.clone()),
        }
    }

    /// What the function settles on: for SQS, read from the queue's own redrive policy.
    fn for_function(&self) -> LedgerQueues {
        match self {
            Queues::Local { .. } => {
                LedgerQueues { source: self.source(), dead_letter: Some(self.dlq()), budget: RetryBudget { max_receives: MAX_RECEIVES } }
            }
            Queues::Sqs { source, dlq, clients } => lambdas::ledger_append::queues_of(clients, source.url(), Some(dlq.url())).unwrap(),
        }
    }

    /// One round of Lambda's event source; returns how many messages it received.
    fn round(&self, function: &LedgerFunction) -> usize {
        let (event, handles): (SqsEvent, Vec<(String, String)>) = match self {
            Queues::Local { source, .. } => {
                let received = source.receive(10, Duration::from_millis(200), VISIBILITY).unwrap();
                let handles = received.iter().map(|m| (m.message_id.clone(), m.receipt_handle.clone())).collect();
                (lambdas::sqs_event::sqs_event(source.as_ref(), &received), handles)
            }
            Queues::Sqs { source, .. } => {
                let batch = source.receive_lambda_batch(10, Duration::from_secs(1), VISIBILITY).unwrap();
                let handles = batch.messages.iter().map(|m| (m.message_id.clone(), m.receipt_handle.clone())).collect();
                (serde_json::from_value(batch.event).unwrap(), handles)
            }
        };
        let response = function.invoke(&event, cloud::now_ms());
        let listed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        let source = self.source();
        for (id, handle) in handles.iter().filter(|(id, _)| !listed.contains(&id.as_str())) {
            source.delete(handle).unwrap_or_else(|e| panic!("deleting {id}: {e}"));
        }
        handles.len()
    }

    fn send(&self, body: &str, dedup: &str) {
        let options = SendOptions { group_id: Some(LEDGER_GROUP.into()), deduplication_id: Some(dedup.into()), ..Default::default() };
        self.source().send(body, &options).unwrap();
    }
}

struct Deployment {
    queues: Queues,
    ledger: Arc<dyn ObjectStore>,
    /// Writes under one job's prefix fail as S3 answers a throttled prefix, until switched off.
    jobs: Arc<Hooked<ThrottledPuts>>,
    cache: tempfile::TempDir,
}

impl Deployment {
    /// The function as a cold start opens it, admitting the images of `images`.
    fn function(&self, images: &[&DevEnclave]) -> LedgerFunction {
        let config = FunctionConfig {
            ledger: self.ledger.clone(),
            jobs: self.jobs.clone(),
            signer: Box::new(SignerKey::from_seed("ledger.test/queue", &[3; 32]).unwrap()),
            cache_dir: self.cache.path().join(format!("cold-{}", cloud::now_ms())),
            root: images[0].anchor(),
            policies: policies(images),
            witnesses: None,
        };
        LedgerFunction::open(config, "ledger").unwrap().with_queues(self.queues.for_function())
    }

    /// The index `jobs/<id>/ledgered.json` names, once written.
    fn ledgered(&self, j: u64) -> Option<u64> {
        let key = layout::job_ledgered(&JobId::from_hex(&job(j)).unwrap());
        match self.jobs.get(&key) {
            Ok(bytes) => Some(serde_json::from_slice::<Ledgered>(&bytes).unwrap().index),
            Err(ObjectError::NotFound { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    }

    fn until(&self, function: &LedgerFunction, limit: Duration, done: impl Fn(&Self) -> bool) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if done(self) {
                return Some(started.elapsed());
            }
            if self.queues.round(function) == 0 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        done(self).then(|| started.elapsed())
    }
}

fn local() -> Deployment {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("queues.sqlite");
    let config = QueueConfig { fifo: true, max_receives: Some(MAX_RECEIVES), dead_letter: Some("ledger-dlq".into()) };
    let source = Arc::new(SqliteQueue::open(&db, "ledger", config).unwrap());
    let dlq = Arc::new(SqliteQueue::open_existing(&db, "ledger-dlq").unwrap());
    let ledger: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(dir.path().join("ledger")).unwrap());
    let jobs: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(dir.path().join("jobs")).unwrap());
    let jobs = Arc::new(Hooked::new(jobs, ThrottledPuts::new(format!("jobs/{}/", job(4)))));
    Deployment { queues: Queues::Local { source, dlq }, ledger, jobs, cache: dir }
}

fn emulated() -> Option<Deployment> {
    let Some(endpoint) = std::env::var("EPHEM_TEST_AWS_ENDPOINT").ok().filter(|v| !v.is_empty()) else {
        eprintln!("\n*** SKIPPED (SQS half): EPHEM_TEST_AWS_ENDPOINT is not set; `make test-aws` starts moto and runs it. ***\n");
        return None;
    };
    let clients = AwsClients::connect_emulator(&endpoint, "us-east-1").unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let options = cloud_aws::bootstrap::BootstrapOptions {
        name_prefix: format!("tpoison-{}-{nanos:x}", std::process::id()),
        max_receives: MAX_RECEIVES,
        ..Default::default()
    };
    let outputs = cloud_aws::bootstrap::bootstrap(&clients, &options).unwrap();
    let value = |name: &str| outputs.values[name].clone();
    let source = clients.queue(&value(cloud_aws::settings::LEDGER_QUEUE.output));
    let dlq = clients.queue(&value(cloud_aws::settings::LEDGER_DLQ.output));
    let ledger: Arc<dyn ObjectStore> = Arc::new(clients.object_store(&value(cloud_aws::settings::LEDGER_BUCKET.output), ""));
    let jobs: Arc<dyn ObjectStore> = Arc::new(clients.object_store(&value(cloud_aws::settings::JOBS_BUCKET.output), ""));
    let jobs = Arc::new(Hooked::new(jobs, ThrottledPuts::new(format!("jobs/{}/", job(4)))));
    Some(Deployment { queues: Queues::Sqs { source, dlq, clients: Box::new(clients) }, ledger, jobs, cache: tempfile::tempdir().unwrap() })
}

/// The whole story on one backend; returns how long the genuine receipt waited.
fn poison_then_redrive(d: &Deployment) -> Duration {
    let a = DevEnclave::new(2, T);
    let b = DevEnclave::with_image(2, 0xb0, T); // the new image, its policy not uploaded yet
    let function = d.function(&[&a]);

    // The host's poison, ahead of everything: garbage; a message of the right shape whose
    // fields are not base64; a genuine receipt for a job that has no objects at all; a genuine
    // receipt whose job's prefix the host keeps throttled (a failure of the jobs bucket, not of
    // the receipt); and between them two receipts of the new image.
    d.queues.send("not json", "p1");
    d.queues.send(r#"{"job_id":"zz","receipt":"!!","attestation_document":""}"#, "p2");
    d.queues.send(&body(&b, 20), "b20");
    d.queues.send(&body(&a, 3), "p3");
    d.queues.send(&body(&a, 4), "p4");
    d.queues.send(&body(&b, 21), "b21");
    // Drain until the throttled receipt has failed once and is in flight: the group's head.
    let in_flight = |d: &Deployment| d.queues.source().stats().map(|s| s.in_flight == 1).unwrap_or(false);
    d.until(&function, Duration::from_secs(30), |d| d.ledgered(3).is_some() && in_flight(d)).expect("the poison was received");
    assert_eq!(d.ledgered(3), Some(0), "a receipt for a job without objects is appended like any other");

    // Now the genuine receipt.
    d.queues.send(&body(&a, 5), "g5");
    let waited = d.until(&function, Duration::from_secs(60), |d| d.ledgered(5).is_some());
    let waited = waited.expect("the genuine receipt waited behind the poison for more than 60 s");
    assert!(waited < Duration::from_secs(20), "the genuine receipt waited {waited:?}");

    // The throttled receipt leaves the group after its three receives; what the policy holds
    // was dead-lettered at once.
    let drained = |d: &Deployment| d.queues.source().stats().map(|s| s.visible + s.in_flight == 0).unwrap_or(false);
    d.until(&function, Duration::from_secs(30), drained).expect("the poison left the group");
    let dlq = d.queues.dlq();
    assert_eq!(dlq.stats().unwrap().visible, 3, "held: the new image's two receipts and the throttled one");
    assert_eq!(d.ledgered(4), None, "its marker was what failed");

    // The operator uploads the new image's policy (a cold start reads it), the prefix calms
    // down, and the dead letters go back.
    d.jobs.hooks.set(false);
    let function = d.function(&[&a, &b]);
    let (report, stopped) = lambdas::ledger_append::redrive(dlq.as_ref(), d.queues.source().as_ref(), u64::MAX, Duration::from_secs(1));
    assert!(stopped.is_none(), "{stopped:?}");
    // In the dead-letter queue's order: the new image's two in theirs (SQS hands the whole
    // batch over at once, the local queue one message of the group at a time, so where the
    // throttled one falls differs).
    let jobs: Vec<String> = report.moved.iter().filter_map(|m| m.job_id.map(|j| j.to_hex())).collect();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert_eq!(jobs.iter().filter(|j| **j != job(4)).collect::<Vec<_>>(), [&job(20), &job(21)]);
    d.until(&function, Duration::from_secs(30), |d| [20, 21, 4].iter().all(|j| d.ledgered(*j).is_some()))
        .expect("the redriven receipts were appended");
    let (b20, b21, g5) = (d.ledgered(20).unwrap(), d.ledgered(21).unwrap(), d.ledgered(5).unwrap());
    assert!(g5 < b20 && b20 < b21, "appended in order: g5 {g5}, b20 {b20}, b21 {b21}");
    assert_eq!(d.ledgered(4), Some(1), "the throttled job's entry was in all along");
    assert_eq!(dlq.stats().unwrap().visible, 0);
    waited
}

#[test]
fn a_poisoned_ledger_queue_appends_the_next_receipt_in_seconds_and_the_dead_letters_after_a_redrive() {
    let waited = poison_then_redrive(&local());
    eprintln!("local queue: the genuine receipt waited {waited:?}");
    if let Some(d) = emulated() {
        let waited = poison_then_redrive(&d);
        eprintln!("SQS (emulator): the genuine receipt waited {waited:?}");
    }
}
