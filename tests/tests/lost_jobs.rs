//! No accepted upload is lost without a trace (issue 17 item 3), on the local stack through the
//! real binaries: every job ends `completed`, or `failed` naming the check.
//!
//! - The job queue refuses every send, so `on-upload` can never turn an upload into a job: after
//!   its retries the failure record goes to its on-failure queue, `job-dead-letter` (the local
//!   Lambda runtime) marks the job `failed` with `upload_unprocessed`, and `submit --wait` returns
//!   with that reason within seconds instead of waiting out its timeout.
//! - A host received a job message on its last allowed receive and died: the queue dead-letters
//!   the message, and `job-dead-letter` marks the job `failed` with `dead_lettered`.

use std::path::Path;
use std::time::{Duration, Instant};

use cloud_local::SqliteQueue;
use cloud::Queue;
use tests::{process, short_corpus, wait_until, Stack};

/// The job ids the stack's jobs store holds.
fn job_ids(stack: &Stack) -> Vec<String> {
    let dir = stack.home().join("objects").join("jobs").join("jobs");
    let mut ids: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

fn queues_db(stack: &Stack) -> std::path::PathBuf {
    stack.home().join(cloud_local::QUEUES_DB)
}

/// The job queue stops answering sends (every insert into it aborts), as SQS down or a role
/// without `sqs:SendMessage` would; every other queue keeps working.
fn break_job_queue(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER job_queue_unreachable BEFORE INSERT ON messages WHEN NEW.queue = 'jobs'
         BEGIN SELECT RAISE(ABORT, 'the job queue does not answer'); END;",
    )
    .unwrap();
}

fn mend_job_queue(db: &Path) {
    rusqlite::Connection::open(db).unwrap().execute_batch("DROP TRIGGER job_queue_unreachable;").unwrap();
}

fn failure_of(stack: &Stack, job: &str) -> (String, String) {
    let status = stack.status(job);
    let check = status["status"]["failure"]["check"].as_str().unwrap_or_default().to_owned();
    (status["state"].as_str().unwrap_or_default().to_owned(), check)
}

#[test]
fn an_upload_on_upload_cannot_process_ends_failed_and_wait_returns() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "unprocessed", 4);
    break_job_queue(&queues_db(&stack));

    let started = Instant::now();
    let out = stack.cli(&["submit", corpus.to_str().unwrap(), "--wait", "--wait-timeout", "120"]);
    let waited = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "submit --wait succeeded with the job queue down:\n{}", stack.describe(&out));
    assert!(waited < Duration::from_secs(60), "submit --wait returned after {waited:?}, not at the job's end:\n{}", stack.describe(&out));
    assert!(stderr.contains("upload_unprocessed"), "submit --wait does not name the check:\n{}", stack.describe(&out));
    assert!(stderr.contains("the job queue does not answer"), "nor on-upload's error:\n{}", stack.describe(&out));

    let jobs = job_ids(&stack);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(failure_of(&stack, &jobs[0]), ("failed".into(), "upload_unprocessed".into()));
    let failures = SqliteQueue::open_existing(queues_db(&stack), cloud_local::UPLOAD_FAILURES).unwrap();
    assert_eq!(failures.stats().unwrap(), Default::default(), "the failure record was consumed");
    eprintln!("submit --wait returned `failed: upload_unprocessed` after {waited:?}");

    // The queue answers again: the next upload is a job like any other.
    mend_job_queue(&queues_db(&stack));
    let corpus = work.path().join("again.jsonl");
    short_corpus(&corpus, "again", 3);
    let out = stack.cli(&["submit", corpus.to_str().unwrap(), "--wait", "--wait-timeout", "150"]);
    assert!(out.status.success(), "{}", stack.describe(&out));
}

#[test]
fn a_job_message_dead_lettered_after_its_host_died_ends_failed() {
    let stack = Stack::up();
    // No host takes the message but the one this test plays.
    let poller = stack.pid("host-poller").expect("the host-poller runs");
    process::kill9(poller);
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "dead", 2);
    let submitted = tests::json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--json"]));
    let job = submitted["job_id"].as_str().unwrap().to_owned();

    // A host receives the message and dies, on every allowed receive: no delete, no status.
    let queue = SqliteQueue::open_existing(queues_db(&stack), cloud_local::JOB_QUEUE).unwrap();
    for receive in 1..=cloud_local::MAX_RECEIVES {
        let got = queue.receive(1, Duration::from_secs(2), Duration::ZERO).unwrap();
        assert_eq!(got.len(), 1, "receive {receive}");
        assert!(got[0].body.contains(&job));
    }
    assert!(queue.receive(1, Duration::ZERO, Duration::ZERO).unwrap().is_empty(), "moved to the dead-letter queue");

    wait_until("the dead-lettered job to end failed", Duration::from_secs(30), || failure_of(&stack, &job).0 == "failed");
    assert_eq!(failure_of(&stack, &job), ("failed".into(), "dead_lettered".into()));
    let dlq = SqliteQueue::open_existing(queues_db(&stack), cloud_local::JOB_DLQ).unwrap();
    assert_eq!(dlq.stats().unwrap().visible, 0, "consumed");
}
