use std::sync::Arc;
use std::time::Duration;

use cloud::messages::JobState;
use cloud::{PutCondition, QueueStats, Received, SendOptions};
use cloud::messages::{DEAD_LETTERED, UPLOAD_UNPROCESSED};
use lambdas::on_upload;
use lambdas_testing::Fixture;

use super::*;

fn config() -> Config {
    Config::from_list("stores/acme/")
}

/// The job queue as on-upload meets it when SQS is down (or its role may not send): every
/// send fails, however often it is tried.
struct Unreachable;

impl Queue for Unreachable {
    fn name(&self) -> &str {
        "jobs"
    }
    fn send(&self, _: &str, _: &SendOptions) -> Result<String, QueueError> {
        Err(QueueError::Unavailable("the job queue does not answer".into()))
    }
    fn receive(&self, _: usize, _: Duration, _: Duration) -> Result<Vec<Received>, QueueError> {
        Err(QueueError::Unavailable("the job queue does not answer".into()))
    }
    fn change_visibility(&self, _: &str, _: Duration) -> Result<(), QueueError> {
        Err(QueueError::Unavailable("the job queue does not answer".into()))
    }
    fn delete(&self, _: &str) -> Result<(), QueueError> {
        Err(QueueError::Unavailable("the job queue does not answer".into()))
    }
    fn stats(&self) -> Result<QueueStats, QueueError> {
        Err(QueueError::Unavailable("the job queue does not answer".into()))
    }
}

/// An upload on-upload cannot turn into a job — the job queue refuses every send — ends
/// `failed` with `upload_unprocessed`, through the same path as in AWS: the invocation's
/// retries, the failure record on the on-failure destination, the consumer. The bulk run that
/// waited for the job has its task failed instead of waiting out its day.
#[test]
fn an_upload_on_upload_cannot_process_ends_failed_and_fails_its_bulk_task() {
    let f = Fixture::new();
    let mut broken = f.services.clone();
    broken.job_queue = Arc::new(Unreachable);
    let failures = f.cloud.upload_failures();
    let delays = vec![Duration::from_millis(10), Duration::from_millis(10)];
    let hook = on_upload_hook(broken, config(), failures.clone(), delays);
    f.cloud.jobs_store().set_created_hook(layout::JOBS_PREFIX, layout::INPUT_SUFFIX, hook);

    let (bytes, job) = f.sealed(4);
    let token = f.waiting_token(&job, "b-unprocessed");
    f.services.jobs.put(&layout::job_input(&job), &bytes, PutCondition::CreateOnly).unwrap();
    assert_eq!(failures.stats().unwrap().visible, 1, "one failure record on the destination");

    let handled = pump_dead_letters(&f.services, &config(), failures.as_ref(), Duration::ZERO).unwrap();
    assert_eq!(handled, 1);
    let status = f.status(&job);
    let failure = status.failure.expect("a named failure");
    assert_eq!((status.state, failure.check.as_str()), (JobState::Failed, UPLOAD_UNPROCESSED));
    assert!(failure.message.contains("after 3 invocation(s)") && failure.message.contains("the job queue does not answer"), "{}", failure.message);
    assert!(f.failed_cause(&token).starts_with("upload_unprocessed: on-upload gave up"));
    assert_eq!(failures.stats().unwrap(), QueueStats::default(), "the record is consumed");
}

/// A host received the job message on its last allowed receive and died: it wrote no end. The
/// queue dead-letters the message at the next receive; the consumer ends the job `failed` with
/// `dead_lettered` and fails the bulk task waiting for it.
#[test]
fn a_job_message_dead_lettered_after_its_host_died_ends_failed_with_a_failed_bulk_token() {
    let f = Fixture::new();
    let (bytes, job) = f.sealed(2);
    let key = layout::job_input(&job);
    f.services.jobs.put(&key, &bytes, PutCondition::CreateOnly).unwrap();
    let out = on_upload::handle_with(&on_upload::object_created_event("jobs", &key, 1, "e"), &f.services, &config()).unwrap();
    assert!(matches!(&out[0], on_upload::Outcome::Queued { .. }), "{out:?}");
    let token = f.waiting_token(&job, "b-dead");

    // Every receive ends with the host gone: no delete, no status, no token completion.
    let queue = f.cloud.job_queue();
    for receive in 1..=cloud_local::MAX_RECEIVES {
        let got = queue.receive(1, Duration::ZERO, Duration::ZERO).unwrap();
        assert_eq!(got.len(), 1, "receive {receive}");
    }
    assert!(queue.receive(1, Duration::ZERO, Duration::ZERO).unwrap().is_empty(), "dead-lettered, not returned");
    assert_eq!(f.status(&job).state, JobState::Queued, "nobody else marks it");

    let dlq = f.cloud.job_dlq();
    assert_eq!(pump_dead_letters(&f.services, &config(), dlq.as_ref(), Duration::ZERO).unwrap(), 1);
    let status = f.status(&job);
    assert_eq!((status.state, status.failure.as_ref().map(|f| f.check.as_str())), (JobState::Failed, Some(DEAD_LETTERED)));
    assert_eq!(status.records_total, 2, "the counts on-upload wrote are kept");
    assert!(f.failed_cause(&token).starts_with("dead_lettered: the job queue dead-lettered"));
    assert_eq!(dlq.stats().unwrap().visible, 0);
}

/// Input expiry believes the ledger, not the marker: a `ledgered.json` forged for a job the
/// ledger has never seen keeps its input, and a marker that backdates a real entry does not
/// expire the input before the ledger's own time says so. (Trusting the marker, both inputs
/// went at the first round.)
#[test]
fn input_expiry_believes_the_ledger_not_the_marker() {
    use cloud::messages::Ledgered;
    use receipts_ledger::local::LocalLedger;
    use receipts_ledger::testing::{test_job, test_request, TestReceipts};

    let f = Fixture::new();
    let dir = tempfile::tempdir().unwrap();
    let (mut ledger, _) = LocalLedger::open(dir.path(), Box::new(TestReceipts)).unwrap();
    let appended_ms = 1_800_000_000_000;
    ledger.append(test_request(1, 200), appended_ms).unwrap();
    let retention = Duration::from_secs(3600);

    let (held, forged, unmarked) = (test_job(1), test_job(2), test_job(3));
    for job in [&held, &forged, &unmarked] {
        f.services.jobs.put(&layout::job_input(job), b"sealed", PutCondition::CreateOnly).unwrap();
    }
    // Both markers claim the epoch: long past any retention.
    for (job, index) in [(&held, 0), (&forged, 7)] {
        let marker = serde_json::to_vec(&Ledgered { job_id: *job, index, appended_ms: 0 }).unwrap();
        f.services.jobs.put(&layout::job_ledgered(job), &marker, PutCondition::Overwrite).unwrap();
    }
    let kept = |job: &JobId| f.services.jobs.head(&layout::job_input(job)).unwrap().is_some();

    let before = appended_ms + retention.as_millis() as u64 - 1;
    assert_eq!(expire_inputs(&f.services, ledger.store(), retention, before).unwrap(), 0);
    assert!(kept(&held) && kept(&forged) && kept(&unmarked), "nothing expires before the ledger's time");

    let after = appended_ms + retention.as_millis() as u64;
    assert_eq!(expire_inputs(&f.services, ledger.store(), retention, after).unwrap(), 1);
    assert!(!kept(&held), "the ledgered job's input expires after its retention");
    assert!(kept(&forged), "a marker the ledger does not back deletes nothing");
    assert!(kept(&unmarked));
}
