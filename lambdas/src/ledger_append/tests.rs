use std::sync::Arc;

use super::*;
use cloud::hooked::{Hooked, ThrottledPuts};
use cloud_local::{DirObjectStore, QueueConfig, SqliteQueue};
use cloud::ObjectError;
use receipts_ledger::store::tiles::{layout::Layout, read_head, Cache, TileOptions};
use protocol::dev_enclave::DevEnclave;
use receipts_ledger::{CheckpointPolicy, ProofBundle, ReceiptCheck, SignerKey, TileStore};
use protocol::attestation::PolicySet;
use protocol::receipt_check::ReceiptVerifier;

const T: u64 = 1_761_955_200_000;

fn message_at(id: &str, body: &str, receives: u32) -> serde_json::Value {
    serde_json::json!({
        "messageId": id, "receiptHandle": format!("h-{id}"), "body": body,
        "attributes": {"ApproximateReceiveCount": receives.to_string(), "SentTimestamp": "1", "MessageGroupId": "ledger",
                       "MessageDeduplicationId": id},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:ledger.fifo", "awsRegion": "us-east-1"
    })
}

fn message(id: &str, body: &str) -> serde_json::Value {
    message_at(id, body, 1)
}

fn body(job_id: &str, receipt: &[u8], document: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::to_string(&LedgerMessage { job_id: job_id.parse().expect("a job id"), receipt: b64.encode(receipt), attestation_document: b64.encode(document) })
        .unwrap()
}

fn publisher() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x51; 32])
}

/// The appender's check: `images`' policies, signed by the publisher.
fn enforcing(images: &[&DevEnclave]) -> Arc<ReceiptVerifier> {
    let signed = images.iter().map(|e| ("policy.json".to_owned(), e.policy(&publisher()))).collect();
    let set = PolicySet::verify(&publisher().verifying_key(), signed).unwrap();
    Arc::new(ReceiptVerifier::enforcing(images[0].anchor(), set).unwrap())
}

#[derive(Default)]
struct Run {
    verdicts: Vec<(String, Verdict)>,
    refused: Vec<(String, String)>,
    held: Vec<(String, String)>,
    appended: Vec<JobId>,
}

impl Run {
    fn verdict(&self, id: &str) -> Verdict {
        self.verdicts.iter().find(|(m, _)| m == id).map(|(_, v)| v.clone()).unwrap()
    }
}

fn run_with(
    event: serde_json::Value,
    ledger: &mut Ledger<TileStore>,
    jobs: &dyn ObjectStore,
    budget: RetryBudget,
) -> Run {
    let event: SqsEvent = serde_json::from_value(event).unwrap();
    let mut r = Run::default();
    let handled = process(&event, ledger, jobs, T + 1, budget, &mut |o| match o {
        Outcome::Appended(f) => r.appended.push(f.job_id),
        Outcome::Refused { message_id, error } => r.refused.push((message_id.to_owned(), error.check().to_owned())),
        Outcome::Held { message_id, error } => r.held.push((message_id.to_owned(), error.check().to_owned())),
        Outcome::Retried { .. } => {}
    });
    r.verdicts = handled.into_iter().map(|h| (h.message.message_id.clone().unwrap(), h.verdict)).collect();
    r
}

fn run(event: serde_json::Value, ledger: &mut Ledger<TileStore>, jobs: &dyn ObjectStore) -> Run {
    run_with(event, ledger, jobs, RetryBudget { max_receives: 3 })
}

fn bucket_ledger(bucket: Arc<dyn ObjectStore>, check: impl ReceiptCheck + 'static) -> Ledger<TileStore> {
    let signer = SignerKey::from_seed("ledger.example", &[1; 32]).unwrap();
    let store = TileStore::open(bucket, Layout::new(""), Cache::Memory, signer.verifier(), TileOptions::appender()).unwrap();
    Ledger::new(store, Box::new(check), Box::new(signer), CheckpointPolicy::default())
}

/// Job `j`'s id as a message carries it.
fn job(j: u64) -> String {
    job_id(j).to_hex()
}

fn job_id(j: u64) -> JobId {
    receipts_ledger::testing::test_job(j)
}

/// The Lambda's path: a real-shaped SQS batch into the tlog-tiles ledger in a bucket.
#[test]
fn a_batch_lands_in_the_bucket_ledger_with_refusals_named_and_not_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let check = enforcing(&[&e]);
    let mut ledger = bucket_ledger(bucket.clone(), check.clone());

    let leaf = |j: u64| e.sign(&e.receipt(j));
    let mut forged = leaf(3);
    forged[20] ^= 1;
    let records = vec![
        message("m1", &body(&job(1), &leaf(1), &e.document)),
        message("m2", "not json"),
        message("m3", &body(&job(3), &forged, &e.document)),
        message("m4", &body(&job(9), &leaf(4), &e.document)), // names another job
        message("m5", &body(&job(5), &leaf(5), &e.document)),
        message("m6", &body(&job(1), &leaf(1), &e.document)), // re-delivered: no second entry
        // A host-chosen job id that is not one (a real one with a non-hex last digit).
        message("m7", &body(&job(7), &leaf(7), &e.document).replace(&job(7), &format!("{}g", &job(7)[..31]))),
    ];
    let r = run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    // Retrying would fail the same way and hold back the FIFO group: every one is done.
    assert!(r.verdicts.iter().all(|(_, v)| *v == Verdict::Done), "{:?}", r.verdicts);
    let refused: Vec<(&str, &str)> = r.refused.iter().map(|(m, c)| (m.as_str(), c.as_str())).collect();
    assert_eq!(refused, vec![("m2", "message"), ("m3", "receipt"), ("m4", "job_id"), ("m7", "message")]);
    // The metrics count each job once: the re-delivered m6 appended nothing.
    assert_eq!(r.appended, vec![job_id(1), job_id(5)]);

    let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
    assert_eq!(head.size, 2);
    let marker: Ledgered = serde_json::from_slice(&jobs.get(&layout::job_ledgered(&JobId::from_hex(&job(5)).unwrap())).unwrap()).unwrap();
    assert_eq!(marker.index, 1);
}

/// Usage receipts of online requests travel the same queue under their usage id: appended to the
/// tiles ledger beside jobs, nothing written under `jobs/`, and what a host can bend refused.
#[test]
fn usage_receipts_are_appended_under_their_usage_id() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let squatter = DevEnclave::with_image(2, 0xee, T);
    let mut ledger = bucket_ledger(bucket.clone(), enforcing(&[&e]));
    let usage = |enclave: &DevEnclave, n: u64| {
        let leaf = enclave.usage_receipt(n).sign(&enclave.receipt_key);
        let id = protocol::usage::SignedUsageReceipt::decode(&leaf).unwrap().usage_id();
        (JobId(id).to_hex(), leaf)
    };
    let (id0, leaf0) = usage(&e, 0);
    let (id1, leaf1) = usage(&e, 1);
    let (other_id, other_leaf) = usage(&squatter, 0);
    let records = vec![
        message("u0", &body(&id0, &leaf0, &e.document)),
        message("u1", &body(&id1, &leaf1, &e.document)),
        message("j1", &body(&job(1), &e.sign(&e.receipt(1)), &e.document)),
        // A usage receipt sent under a job's id cannot take the job's slot.
        message("u2", &body(&job(2), &usage(&e, 2).1, &e.document)),
        // A usage receipt from an image no policy admits is held like a job's.
        message("u3", &body(&other_id, &other_leaf, &squatter.document)),
    ];
    let r = run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    assert_eq!(r.refused, vec![("u2".to_owned(), "job_id".to_owned())]);
    assert_eq!(r.held, vec![("u3".to_owned(), "policy".to_owned())]);
    assert_eq!(r.appended, vec![JobId::from_hex(&id0).unwrap(), JobId::from_hex(&id1).unwrap(), job_id(1)]);
    let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
    assert_eq!(head.size, 3);
    let written: Vec<String> = jobs.list("").unwrap().into_iter().map(|m| m.key).collect();
    assert!(written.iter().all(|k| k.contains(&job(1))), "only the job has job objects: {written:?}");
    let entry = ledger.store().entry_by_job(&JobId::from_hex(&id1).unwrap()).unwrap().unwrap();
    assert_eq!((entry.index, entry.fields.kind), (1, EntryKind::Usage));
}

/// `jobs/<id>/ledger-proof.json` proves the job's receipt against a checkpoint signed by the
/// ledger key, with nothing else read.
#[test]
fn each_ledgered_job_gets_a_proof_it_can_check_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let check = enforcing(&[&e]);
    let mut ledger = bucket_ledger(bucket, check.clone());
    let records: Vec<_> = (0..3).map(|j| message(&format!("m{j}"), &body(&job(j), &e.sign(&e.receipt(j)), &e.document))).collect();
    run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    for j in 0..3 {
        let id = JobId::from_hex(&job(j)).unwrap();
        let bundle = ProofBundle::from_json(&jobs.get(&layout::job_ledger_proof(&id)).unwrap()).unwrap();
        let (proven, fields) = receipts_ledger::verify_bundle_and_receipt(&bundle, &ledger.verifier(), check.as_ref()).unwrap();
        assert_eq!((proven.leaf_index, fields.job_id), (j, job_id(j)));
        assert_eq!(proven.receipt, e.sign(&e.receipt(j)));
        assert!(proven.checkpoint.size > j);
        // The same entry as a SCITT transparent statement, checked under the ledger key alone.
        let statement = jobs.get(&layout::job_transparent_statement(&id)).unwrap();
        let verified = receipts_ledger::scitt::verify_transparent_statement(&statement, &ledger.verifier()).unwrap();
        assert_eq!((verified.leaf_index, verified.statement.as_slice()), (j, e.sign(&e.receipt(j)).as_slice()));
        assert_eq!(verified.subject, job(j));
        let other = SignerKey::from_seed("ledger.example", &[2; 32]).unwrap().verifier();
        assert!(receipts_ledger::scitt::verify_transparent_statement(&statement, &other).is_err());
    }
}

/// A second, different receipt for a job the ledger holds (another attempt): refused and
/// alarmed, and `ledgered.json` keeps naming the entry actually held.
#[test]
fn a_different_receipt_for_a_ledgered_job_is_an_alarm_not_a_success() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let check = enforcing(&[&e]);
    let mut ledger = bucket_ledger(bucket, check.clone());
    let first = e.sign(&e.receipt(7));
    let mut other = e.receipt(7);
    other.attempt += 1;
    let records = vec![
        message("first", &body(&job(7), &first, &e.document)),
        message("other", &body(&job(7), &e.sign(&other), &e.document)),
        message("again", &body(&job(7), &first, &e.document)),
    ];
    let r = run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    assert_eq!(r.refused, vec![("other".to_owned(), "other_receipt".to_owned())]);
    assert!(r.verdicts.iter().all(|(_, v)| *v == Verdict::Done));
    assert_eq!(r.appended, vec![job_id(7)], "the same receipt again is a quiet success");
    let entry = ledger.store().entry_by_job(&job_id(7)).unwrap().unwrap();
    assert_eq!((entry.index, entry.leaf), (0, first));
}

/// A host runs its own image on genuine hardware and sends a receipt for the victim's job id
/// ahead of the genuine one, in the same batch. No policy admits it: it takes no slot, is not
/// retried, and waits in the dead-letter queue (a new image's receipts sent before the
/// operator uploads its policy wait there the same way).
#[test]
fn ledger_refuses_a_receipt_from_another_image() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let genuine = DevEnclave::new(2, T);
    let squatter = DevEnclave::with_image(2, 0xee, T);
    let check = enforcing(&[&genuine]);
    let mut ledger = bucket_ledger(bucket, check.clone());
    let records = vec![
        message("evil", &body(&job(5), &squatter.sign(&squatter.receipt(5)), &squatter.document)),
        message("good", &body(&job(5), &genuine.sign(&genuine.receipt(5)), &genuine.document)),
    ];
    let r = run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    assert_eq!(r.held, vec![("evil".to_owned(), "policy".to_owned())]);
    assert_eq!((r.verdict("evil"), r.verdict("good")), (Verdict::DeadLetter, Verdict::Done));
    assert_eq!(r.appended, vec![job_id(5)]);
    let entry = ledger.store().entry_by_job(&job_id(5)).unwrap().unwrap();
    assert_eq!((entry.index, entry.fields.pcr0), (0, hex::encode(genuine.pcrs[0])));
    let id = protocol::attestation::policy_id(&genuine.policy(&publisher()));
    assert_eq!(entry.fields.policy, Some(hex::encode(id)));
}

/// Counts the checks the ledger runs (each is an Ed25519 and, for a new document, a P-384
/// chain verification).
struct Counting(Arc<ReceiptVerifier>, Arc<std::sync::atomic::AtomicUsize>);

impl ReceiptCheck for Counting {
    fn check(&self, leaf: &[u8], document: &[u8]) -> Result<IndexedFields, receipts_ledger::ReceiptRefusal> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.check(leaf, document)
    }
}

/// The appender checks a receipt once: the message handler looks at what the ledger's check
/// found (the job id) and the append trusts it, instead of each checking on its own.
#[test]
fn each_receipt_is_checked_once() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut ledger = bucket_ledger(bucket, Counting(enforcing(&[&e]), checks.clone()));
    let records = vec![
        message("m1", &body(&job(1), &e.sign(&e.receipt(1)), &e.document)),
        message("m2", &body(&job(9), &e.sign(&e.receipt(2)), &e.document)), // names another job
    ];
    let r = run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    assert_eq!(r.appended, vec![job_id(1)]);
    assert_eq!(r.refused, vec![("m2".to_owned(), "job_id".to_owned())]);
    assert_eq!(checks.load(std::sync::atomic::Ordering::Relaxed), 2, "one check per message");
}

/// A check that panics on one receipt (a bug these bytes meet), and is the real check otherwise.
struct Panicking(Arc<ReceiptVerifier>, Vec<u8>);

impl ReceiptCheck for Panicking {
    fn check(&self, leaf: &[u8], document: &[u8]) -> Result<IndexedFields, receipts_ledger::ReceiptRefusal> {
        assert_ne!(leaf, self.1.as_slice(), "a bug met by these bytes");
        self.0.check(leaf, document)
    }
}

/// What fails for a reason that may pass is retried — after 2 s, then 8 s — and on its last
/// budgeted receive made visible at once, so the queue dead-letters it; the messages beside it
/// are appended all the same. A panic is such a failure, not the batch's end.
#[test]
fn failures_that_may_pass_are_retried_within_the_budget_and_hold_nobody_up() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    // Writes under one job's prefix fail as S3 answers a throttled prefix (a host can hammer the
    // `status.json` it may write there): the jobs bucket, not the receipt, fails, for that job.
    let jobs = Hooked::new(Arc::new(DirObjectStore::open(tmp.path().join("jobs")).unwrap()), ThrottledPuts::new(format!("jobs/{}/", job(4))));
    let e = DevEnclave::new(2, T);
    let check = enforcing(&[&e]);
    // The ledger's own check is the one that meets the bug: it checks each receipt once.
    let mut ledger = bucket_ledger(bucket, Panicking(check.clone(), e.sign(&e.receipt(6))));
    let budget = RetryBudget { max_receives: 3 };
    let mut expected = Vec::new();
    for (receives, after) in [(1, 2), (2, 8), (3, 0)] {
        let records = vec![
            message_at("throttled", &body(&job(4), &e.sign(&e.receipt(4)), &e.document), receives),
            message_at("panics", &body(&job(6), &e.sign(&e.receipt(6)), &e.document), receives),
            message(&format!("fine-{receives}"), &body(&job(10 + receives as u64), &e.sign(&e.receipt(10 + receives as u64)), &e.document)),
        ];
        let r = run_with(serde_json::json!({ "Records": records }), &mut ledger, &jobs, budget);
        let retry = Verdict::Retry { after: Duration::from_secs(after) };
        assert_eq!((r.verdict("throttled"), r.verdict("panics")), (retry.clone(), retry), "receive {receives}");
        assert_eq!(r.verdict(&format!("fine-{receives}")), Verdict::Done);
        expected.push(job_id(10 + receives as u64));
    }
    // Job 4 is in (its marker is what failed): a retry only writes the marker and proof again.
    assert_eq!(ledger.store().entry_by_job(&job_id(4)).unwrap().map(|e| e.index), Some(0));
    assert!(ledger.store().entry_by_job(&job_id(6)).unwrap().is_none());
    assert!(expected.iter().all(|j| ledger.store().entry_by_job(j).unwrap().is_some()));
}

#[test]
fn failures_are_classified_by_what_caused_them() {
    use protocol::receipt::ReceiptError;
    use protocol::receipt_check::ReceiptCheckError;
    use receipts_ledger::{LedgerError as L, ReceiptRefusal};
    let policy = || ReceiptRefusal::Receipt(ReceiptCheckError::Policy { pcr0: "ee".repeat(48), debug_mode: false, allowed: 1 });
    let refused = [
        AppendError::Body("x".into()),
        AppendError::Receipt(ReceiptCheckError::ReceiptSignature(ReceiptError::Invalid("bad")).into()),
        AppendError::Ledger(L::Store(StoreError::TooLarge { what: "receipt", size: 2, max: 1 })),
        AppendError::Ledger(L::Store(StoreError::Tiles(Box::new(TileError::EntryTooLarge { index: 3, size: 70_000 })))),
    ];
    for e in &refused {
        assert_eq!(e.fate(), Fate::Refused, "{e}");
    }
    assert_eq!(AppendError::Receipt(policy()).fate(), Fate::Held);
    assert_eq!(AppendError::Ledger(L::ReceiptRejected { position: 0, reason: policy() }).fate(), Fate::Held);
    assert_eq!(AppendError::Receipt(policy()).check(), "policy");
    let retried = [
        AppendError::Object(ObjectError::Unavailable { key: "k".into(), message: "503".into() }),
        AppendError::Object(ObjectError::NoSuchBucket { bucket: "b".into(), key: "k".into() }),
        AppendError::Ledger(L::Store(StoreError::Tiles(Box::new(TileError::Contended { attempts: 8 })))),
        AppendError::Panicked("bug".into()),
    ];
    for e in &retried {
        assert_eq!(e.fate(), Fate::Retry, "{e}");
    }
    let budget = RetryBudget { max_receives: 5 };
    let afters: Vec<u64> = (1..=6).map(|n| budget.after(n).as_secs()).collect();
    assert_eq!(afters, [2, 8, 8, 8, 0, 0]);
    assert_eq!(RetryBudget::UNKNOWN.after(40), Duration::from_secs(8));
}

/// `settle` on the local queues: a retried message is hidden for its backoff, a held one is in
/// the dead-letter queue (same body, same group) and deleted from the batch, a done one listed
/// nowhere.
#[test]
fn verdicts_are_settled_on_the_queues() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("queues.sqlite");
    let config = QueueConfig { fifo: true, max_receives: Some(3), dead_letter: Some("ledger-dlq".into()) };
    let source = Arc::new(SqliteQueue::open(&db, "ledger", config).unwrap());
    let dlq = Arc::new(SqliteQueue::open_existing(&db, "ledger-dlq").unwrap());
    let options = |g: &str| SendOptions { group_id: Some(g.into()), ..Default::default() };
    for (body, group) in [("retry", "ledger"), ("hold", "g2"), ("done", "g3")] {
        source.send(body, &options(group)).unwrap();
    }
    let received = source.receive(10, Duration::ZERO, Duration::from_secs(600)).unwrap();
    let event = crate::sqs_event::sqs_event(source.as_ref(), &received);
    let verdicts = [Verdict::Retry { after: Duration::from_secs(2) }, Verdict::DeadLetter, Verdict::Done];
    let handled: Vec<Handled<'_>> =
        event.records.iter().zip(verdicts).map(|(message, verdict)| Handled { message, verdict }).collect();
    let queues = LedgerQueues { source: source.clone(), dead_letter: Some(dlq.clone()), budget: RetryBudget { max_receives: 3 } };
    let response = settle(&handled, Some(&queues));
    let listed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(listed, [received[0].message_id.as_str()]);
    let retried = source.peek().unwrap().into_iter().find(|m| m.body == "retry").unwrap();
    let hidden_for = retried.visible_at_ms.saturating_sub(cloud::now_ms());
    assert!((1_000..=2_000).contains(&hidden_for), "{hidden_for} ms");
    let dead = dlq.peek().unwrap();
    assert_eq!((dead.len(), dead[0].body.as_str(), dead[0].group_id.as_deref()), (1, "hold", Some("g2")));
}

#[test]
fn the_function_refuses_to_start_on_a_policy_for_another_root() {
    let tmp = tempfile::tempdir().unwrap();
    let store = |d: &str| -> Arc<dyn ObjectStore> { Arc::new(DirObjectStore::open(tmp.path().join(d)).unwrap()) };
    let foreign = DevEnclave::new(3, T);
    let set = PolicySet::verify(&publisher().verifying_key(), vec![("p.json".into(), foreign.policy(&publisher()))]).unwrap();
    let config = FunctionConfig {
        ledger: store("ledger"),
        jobs: store("jobs"),
        signer: Box::new(SignerKey::from_seed("ledger.example", &[1; 32]).unwrap()),
        cache_dir: tmp.path().join("cache"),
        root: DevEnclave::new(2, T).anchor(),
        policies: set,
        witnesses: None,
    };
    let err = LedgerFunction::open(config, "ledger").err().expect("refused");
    assert!(matches!(err, FunctionError::Policies(protocol::attestation::PolicySetError::Root { .. })), "{err}");
}

/// A witness serving on a loopback port in this process, its state in `dir`.
fn witness_at(dir: &std::path::Path, n: u8, ledger_key: &receipts_ledger::VerifierKey) -> (receipts_ledger::WitnessEndpoint, Arc<std::sync::atomic::AtomicBool>) {
    let signer = receipts_ledger::cosignature::CosignerSigner::from_seed(&format!("w{n}.lambda.test"), &[n; 32]).unwrap();
    let state = witness::state::State::open(&dir.join(format!("w{n}.json"))).unwrap();
    let key = signer.verifier();
    let service = Arc::new(witness::witness::Witness::new(signer, vec![ledger_key.clone()], state));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    std::thread::spawn(move || witness::server::serve(listener, service, String::new(), stopping));
    (receipts_ledger::WitnessEndpoint::parse(&format!("{key}@{url}")).unwrap(), stop)
}

/// With witnesses configured, every checkpoint the function commits is cosigned before the job's
/// proof is written: the published `checkpoint` and each `ledger-proof.json` carry both
/// cosignatures, and a quorum of both accepts them. A witness that is down holds nothing back.
#[test]
fn the_function_publishes_checkpoints_and_proofs_its_witnesses_cosigned() {
    use receipts_ledger::cosignature::{CosignerKey, WitnessPolicy};
    let tmp = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
    let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
    let e = DevEnclave::new(2, T);
    let signer = SignerKey::from_seed("ledger.example", &[1; 32]).unwrap();
    let (w1, stop1) = witness_at(tmp.path(), 1, &signer.verifier());
    let (w2, stop2) = witness_at(tmp.path(), 2, &signer.verifier());
    let keys: Vec<CosignerKey> = vec![w1.key.clone(), w2.key.clone()];
    let mut ledger = bucket_ledger(bucket.clone(), enforcing(&[&e]))
        .with_witnesses(Some(receipts_ledger::WitnessClient::new(vec![w1.clone(), w2.clone()])));
    let quorum = WitnessPolicy::new(keys.clone(), 2).unwrap();

    let records: Vec<_> = (0..3).map(|j| message(&format!("m{j}"), &body(&job(j), &e.sign(&e.receipt(j)), &e.document))).collect();
    run(serde_json::json!({ "Records": records }), &mut ledger, &jobs);
    let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
    assert_eq!(head.size, 3);
    assert_eq!(quorum.check(head.note.as_bytes()).unwrap().len(), 2);
    for j in 0..3 {
        let bundle = ProofBundle::from_json(&jobs.get(&layout::job_ledger_proof(&job_id(j))).unwrap()).unwrap();
        quorum.check(bundle.checkpoint.as_bytes()).unwrap_or_else(|error| panic!("job {j}'s proof: {error}"));
    }

    // One witness down: receipts are still appended; the checkpoint carries one cosignature,
    // which a quorum of two refuses by name.
    stop2.store(true, std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let r = run(serde_json::json!({ "Records": [message("m3", &body(&job(3), &e.sign(&e.receipt(3)), &e.document))] }), &mut ledger, &jobs);
    assert_eq!(r.appended, vec![job_id(3)]);
    let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
    assert_eq!(WitnessPolicy::new(vec![w1.key.clone()], 1).unwrap().check(head.note.as_bytes()).unwrap().len(), 1);
    let refusal = quorum.check(head.note.as_bytes()).unwrap_err();
    assert!(matches!(refusal, receipts_ledger::WitnessPolicyError::QuorumNotMet { have: 1, need: 2, .. }), "{refusal}");
    stop1.store(true, std::sync::atomic::Ordering::Relaxed);
}
