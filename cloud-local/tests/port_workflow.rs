//! The bulk-task slots of `cloud::workflow` over the local store and workflows.

use cloud::workflow::*;
use cloud::*;
use protocol::envelope::JobId;
use cloud::hooked::{Hooked, StoreHooks};
use cloud_local::{DirObjectStore, LocalWorkflows, TokenOutcome};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts the most bytes any one read of the jobs store returned.
#[derive(Default)]
struct Counting {
    most_read: AtomicU64,
}

impl Counting {
    fn read(&self, bytes: Result<Vec<u8>, ObjectError>) -> Result<Vec<u8>, ObjectError> {
        if let Ok(b) = &bytes {
            self.most_read.fetch_max(b.len() as u64, Ordering::Relaxed);
        }
        bytes
    }
}

impl StoreHooks for Counting {
    fn get(&self, inner: &dyn ObjectStore, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.read(inner.get(key))
    }
    fn reader(&self, _: &dyn ObjectStore, _: &str) -> Result<Box<dyn std::io::Read + Send>, ObjectError> {
        unimplemented!("the hand-off reads whole (bounded) objects only")
    }
    fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        self.read(inner.read_range(key, offset, len))
    }
}

fn setup() -> (tempfile::TempDir, Hooked<Counting>, LocalWorkflows) {
    let dir = tempfile::tempdir().unwrap();
    let jobs = Hooked::new(Arc::new(DirObjectStore::open(dir.path().join("jobs")).unwrap()), Counting::default());
    let workflows = LocalWorkflows::open(dir.path().join("workflows.db")).unwrap();
    (dir, jobs, workflows)
}

const JOB: JobId = JobId([0x42; 16]);

/// Two bulk runs over the same shard wait for its job; the job's end reaches both (with
/// one slot per job the second run's token replaced the first's, which then waited 24 h).
#[test]
fn two_runs_waiting_for_one_job_both_hear_of_its_end() {
    let (_dir, jobs, workflows) = setup();
    let first = workflows.issue_token("run-1").unwrap();
    write_bulk_task(&jobs, &JOB, "run-1", &first, 1).unwrap();
    let second = workflows.issue_token("run-2").unwrap();
    write_bulk_task(&jobs, &JOB, "run-2", &second, 2).unwrap();

    let end = JobEnd::Failed { reason: "stream: chunk 3 does not authenticate".into() };
    assert_eq!(complete_bulk_task(&jobs, &workflows, &JOB, &end).unwrap(), Some(Completion::Completed));
    for token in [&first, &second] {
        match workflows.outcome(token).unwrap() {
            Some(TokenOutcome::Failed { error, cause }) => assert_eq!((error.as_str(), cause.as_str()), (JOB_FAILED_ERROR, "stream: chunk 3 does not authenticate")),
            other => panic!("token {token} is {other:?}"),
        }
    }
    // The end reported again (a duplicate delivery): both already closed, no error.
    let again = complete_bulk_tasks(&jobs, &workflows, &JOB, &end).unwrap();
    let closed = Completion::AlreadyClosed { code: "TaskTimedOut".into() };
    assert_eq!(again.completed, [("run-1".to_owned(), closed.clone()), ("run-2".to_owned(), closed.clone())]);
    assert_eq!(complete_bulk_task(&jobs, &workflows, &JOB, &end).unwrap(), Some(closed));
    // A retried await step of one run replaces only that run's token.
    let retried = workflows.issue_token("run-2").unwrap();
    write_bulk_task(&jobs, &JOB, "run-2", &retried, 3).unwrap();
    assert_eq!(read_bulk_task(&jobs, &JOB, "run-1").unwrap().unwrap().task_token, first);
    assert_eq!(read_bulk_task(&jobs, &JOB, "run-2").unwrap().unwrap().task_token, retried);
    assert_eq!(complete_bulk_task(&jobs, &workflows, &JOB, &JobEnd::Committed).unwrap(), Some(Completion::Completed));
    assert!(matches!(workflows.outcome(&retried).unwrap(), Some(TokenOutcome::Succeeded { .. })));
    // No run waits for another job.
    assert_eq!(complete_bulk_task(&jobs, &workflows, &JobId([7; 16]), &JobEnd::Committed).unwrap(), None);
}

/// Slots only the await step's role may write, planted anyway (an operator's mistake, a
/// leaked role): a giant is refused from its listed size (and by a bounded read when read
/// by name), a record naming another run, an empty or overlong token and garbage are each
/// left alone by key, and the genuine run beside them is completed.
#[test]
fn planted_slots_are_read_bounded_and_left_alone() {
    let (_dir, jobs, workflows) = setup();
    let genuine = workflows.issue_token("run-ok").unwrap();
    write_bulk_task(&jobs, &JOB, "run-ok", &genuine, 1).unwrap();
    let plant = |bulk_id: &str, bytes: &[u8]| {
        jobs.inner.put(&layout::job_bulk_task(&JOB, bulk_id), bytes, PutCondition::Overwrite).unwrap();
    };
    let record = |bulk_id: &str, token: &str| serde_json::to_vec(&BulkTask { version: 1, bulk_id: bulk_id.into(), task_token: token.into(), written_ms: 1 }).unwrap();
    let giant = vec![b' '; 8 << 20];
    plant("a-giant", &giant);
    plant("b-other", &record("run-ok", &genuine));
    plant("c-empty", &record("c-empty", ""));
    plant("d-long", &record("d-long", &"t".repeat(MAX_TASK_TOKEN_CHARS + 1)));
    plant("e-garbage", b"{not json");

    let done = complete_bulk_tasks(&jobs, &workflows, &JOB, &JobEnd::Committed).unwrap();
    assert_eq!(done.completed, [("run-ok".to_owned(), Completion::Completed)]);
    let refused: Vec<String> = done.refused.iter().map(|e| match e {
        BulkTaskError::Record { key, .. } => layout::bulk_id_of_task_key(&JOB, key).unwrap().to_owned(),
        other => panic!("{other}"),
    }).collect();
    assert_eq!(refused, ["a-giant", "b-other", "c-empty", "d-long", "e-garbage"]);
    assert!(jobs.hooks.most_read.load(Ordering::Relaxed) <= MAX_BULK_TASK_BYTES, "{:?}", jobs.hooks.most_read);
    // Read by name (no listing to size it first): one ranged read of the limit + 1.
    let by_name = read_bulk_task(&jobs, &JOB, "a-giant").unwrap_err();
    assert!(matches!(&by_name, BulkTaskError::Record { message, .. } if message.contains("4096 bytes")), "{by_name}");
    assert_eq!(jobs.hooks.most_read.load(Ordering::Relaxed), MAX_BULK_TASK_BYTES + 1);
    // A bulk id that could not name a slot is refused before any write.
    assert!(matches!(write_bulk_task(&jobs, &JOB, "../x", "t", 1), Err(ObjectError::InvalidKey { .. })));
}

/// One job's end completes at most MAX_BULK_TASKS_PER_JOB tokens, whoever filled the slots.
#[test]
fn one_jobs_end_completes_a_bounded_number_of_tokens() {
    let (_dir, jobs, workflows) = setup();
    let tokens: Vec<String> = (0..=MAX_BULK_TASKS_PER_JOB)
        .map(|i| {
            let token = workflows.issue_token("many").unwrap();
            write_bulk_task(&jobs, &JOB, &format!("run-{i:03}"), &token, 1).unwrap();
            token
        })
        .collect();
    let done = complete_bulk_tasks(&jobs, &workflows, &JOB, &JobEnd::Committed).unwrap();
    assert!(done.truncated);
    assert_eq!(done.completed.len(), MAX_BULK_TASKS_PER_JOB);
    assert_eq!(workflows.outcome(tokens.last().unwrap()).unwrap(), None, "the slot past the bound waits for its timeout");
}

#[test]
fn causes_are_cut_on_a_character_boundary() {
    assert_eq!(cause("short"), "short");
    let long = "é".repeat(MAX_CAUSE_BYTES);
    let cut = cause(&long);
    assert!(cut.len() <= MAX_CAUSE_BYTES && cut.len() >= MAX_CAUSE_BYTES - 1);
    assert!(cut.chars().all(|c| c == 'é'));
}

#[test]
fn statuses_use_step_functions_spelling() {
    assert_eq!(serde_json::to_string(&ExecutionStatus::TimedOut).unwrap(), "\"TIMED_OUT\"");
    assert!(!ExecutionStatus::Running.is_done());
    assert!(ExecutionStatus::Aborted.is_done());
}
