//! Step Functions as the pipeline uses it: [`Executions`] of the bulk workflow (the client starts
//! one and follows it) and [`TaskTokens`] (each shard's Map item waits on one; whoever sees the
//! shard's job end completes it).
//!
//! **The hand-off** (`jobs/<job_id>/bulk-tasks/<bulk_id>.json`, [`BulkTask`]): the workflow's
//! `bulk-await-shard` step writes its run's token there, *then* looks for the job's end
//! (receipt, failed status); a host writes the job's end, *then* lists the job's slots and
//! completes every token it finds ([`complete_bulk_tasks`]). Each side writes before it reads,
//! so at least one of them sees the other's write and completes the token; a second completion
//! finds the token closed, which [`Completion::AlreadyClosed`] reports as an outcome, not an
//! error. One slot per run: two runs over the same shard both hear of its end.
//!
//! Whatever a completion says is informative: the aggregate step verifies every receipt itself.

use protocol::envelope::JobId;
use serde::{Deserialize, Serialize};

use crate::{layout, ObjectError, ObjectStore, PutCondition};

/// The error name a host fails a shard's task with.
pub const JOB_FAILED_ERROR: &str = "EphemBatch.JobFailed";
/// Step Functions takes a cause of at most 32 768 characters; a shard's reason needs far less.
pub const MAX_CAUSE_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// No such execution (or state machine).
    #[error("{0}")]
    NotFound(String),
    /// An execution of that name exists with another input.
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    AccessDenied(String),
    /// The request itself is wrong (a name, an ARN, the input); trying again will not help.
    #[error("{0}")]
    Invalid(String),
    /// Throttling, 5xx, the network, a busy local database: worth trying again later.
    #[error("{0}")]
    Unavailable(String),
    /// The deployment has no bulk workflow.
    #[error("no bulk workflow is configured: {0}")]
    NotConfigured(String),
}

impl WorkflowError {
    pub fn is_transient(&self) -> bool {
        matches!(self, WorkflowError::Unavailable(_))
    }
}

/// What completing a token did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// This call completed the task.
    Completed,
    /// The task was already completed, timed out, or the token is unknown (`TaskTimedOut`,
    /// `InvalidToken`, `TaskDoesNotExist`): someone (or the timeout) decided it already.
    /// Nothing to retry.
    AlreadyClosed { code: String },
}

/// Completes the tasks that wait on task tokens (`SendTaskSuccess` / `SendTaskFailure`).
pub trait TaskTokens: Send + Sync {
    /// `output` is the task's result (JSON text).
    fn succeed(&self, token: &str, output: &str) -> Result<Completion, WorkflowError>;
    fn fail(&self, token: &str, error: &str, cause: &str) -> Result<Completion, WorkflowError>;
}

/// How an execution stands (`PENDING_REDRIVE` counts as running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExecutionStatus {
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Aborted,
}

impl ExecutionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Running => "RUNNING",
            ExecutionStatus::Succeeded => "SUCCEEDED",
            ExecutionStatus::Failed => "FAILED",
            ExecutionStatus::TimedOut => "TIMED_OUT",
            ExecutionStatus::Aborted => "ABORTED",
        }
    }

    pub fn is_done(self) -> bool {
        self != ExecutionStatus::Running
    }
}

/// `DescribeExecution`, reduced to what the client follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execution {
    /// The execution's ARN (locally `local:execution:<name>`).
    pub id: String,
    pub status: ExecutionStatus,
    /// The execution's output (JSON text) once it succeeded.
    pub output: Option<String>,
    pub error: Option<String>,
    pub cause: Option<String>,
}

/// Starts and follows executions of the deployment's bulk state machine.
pub trait Executions: Send + Sync {
    /// `StartExecution` named `name` with `input` (JSON text); returns the execution's id.
    fn start(&self, name: &str, input: &str) -> Result<String, WorkflowError>;
    fn describe(&self, execution: &str) -> Result<Execution, WorkflowError>;
}

/// `jobs/<job_id>/bulk-tasks/<bulk_id>.json`: the token bulk run `bulk_id` waits on for this
/// job, one slot per run. Only `bulk-await-shard` may write there (its role's `WriteBulkTasks`;
/// tenants and hosts may not); hosts and `on-upload` read it all the same as hostile: at most
/// [`MAX_BULK_TASK_BYTES`], its bulk id must be the slot's, its token 1 to
/// [`MAX_TASK_TOKEN_CHARS`] characters. Not secret: a token only lets its holder complete one
/// task, whose output the aggregate step does not trust anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkTask {
    pub version: u32,
    pub bulk_id: String,
    pub task_token: String,
    pub written_ms: u64,
}

/// The most read of a bulk task slot (a record is ~1 KiB: a token of at most 2048 characters).
pub const MAX_BULK_TASK_BYTES: u64 = 4096;
/// Step Functions' longest task token (`SendTaskSuccess` `taskToken`).
pub const MAX_TASK_TOKEN_CHARS: usize = 2048;
/// Runs whose tokens one job's end completes; the slots past it (in bulk-id order) are left to
/// their 24 h timeout. Only those who may start bulk runs over the job's shard fill the slots.
pub const MAX_BULK_TASKS_PER_JOB: usize = 64;

/// A bulk id names objects (`bulk/<bulk_id>/…`, a task slot) and executions: 1 to 128
/// characters of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
pub fn is_valid_bulk_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != ".."
}

/// How a job ended, as the side completing its token saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// The receipt is committed.
    Committed,
    /// Failed for good (or cancelled): the recorded reason.
    Failed { reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum BulkTaskError {
    #[error("reading {key}: {source}")]
    Object {
        key: String,
        #[source]
        source: ObjectError,
    },
    #[error("{key} is not a bulk task record: {message}")]
    Record { key: String, message: String },
    #[error("bulk run {bulk_id}: {source}")]
    Workflow {
        bulk_id: String,
        #[source]
        source: WorkflowError,
    },
}

impl BulkTaskError {
    pub fn is_transient(&self) -> bool {
        match self {
            BulkTaskError::Object { source, .. } => source.is_transient(),
            BulkTaskError::Workflow { source, .. } => source.is_transient(),
            BulkTaskError::Record { .. } => false,
        }
    }

    /// The deployment does not allow this caller the read or the completion.
    pub fn is_access_denied(&self) -> bool {
        matches!(
            self,
            BulkTaskError::Object { source: ObjectError::AccessDenied { .. }, .. }
                | BulkTaskError::Workflow { source: WorkflowError::AccessDenied(_), .. }
        )
    }
}

/// Writes the token bulk run `bulk_id` waits on for `job` into the run's own slot (replacing
/// only a retried step's older token of the same run).
pub fn write_bulk_task(jobs: &dyn ObjectStore, job: &JobId, bulk_id: &str, task_token: &str, now_ms: u64) -> Result<(), ObjectError> {
    let key = layout::job_bulk_task(job, bulk_id);
    if !is_valid_bulk_id(bulk_id) {
        return Err(ObjectError::InvalidKey { key, reason: "the bulk id is not 1 to 128 characters of A-Z a-z 0-9 . _ -" });
    }
    let record = BulkTask { version: 1, bulk_id: bulk_id.to_owned(), task_token: task_token.to_owned(), written_ms: now_ms };
    let bytes = serde_json::to_vec(&record).expect("a bulk task serialises");
    jobs.put(&key, &bytes, PutCondition::Overwrite).map(drop)
}

/// The token bulk run `bulk_id` left for `job`, if it wrote one.
pub fn read_bulk_task(jobs: &dyn ObjectStore, job: &JobId, bulk_id: &str) -> Result<Option<BulkTask>, BulkTaskError> {
    read_slot(jobs, job, &layout::job_bulk_task(job, bulk_id))
}

/// One slot, read as hostile: bounded, its record's bulk id the slot's, its token plausible.
fn read_slot(jobs: &dyn ObjectStore, job: &JobId, key: &str) -> Result<Option<BulkTask>, BulkTaskError> {
    let refused = |message: String| BulkTaskError::Record { key: key.to_owned(), message };
    let bytes = match jobs.get_at_most(key, MAX_BULK_TASK_BYTES) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(ObjectError::Rejected { message, .. }) => return Err(refused(message)),
        Err(source) => return Err(BulkTaskError::Object { key: key.to_owned(), source }),
    };
    let task: BulkTask = serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))?;
    let slot = layout::bulk_id_of_task_key(job, key).unwrap_or_default();
    if task.version != 1 {
        return Err(refused(format!("version {} (this code reads 1)", task.version)));
    }
    if task.bulk_id != slot || !is_valid_bulk_id(slot) {
        return Err(refused(format!("names bulk run {:?}, not its slot's {slot:?}", task.bulk_id)));
    }
    if task.task_token.is_empty() || task.task_token.chars().count() > MAX_TASK_TOKEN_CHARS {
        return Err(refused(format!("a task token of {} characters (1 to {MAX_TASK_TOKEN_CHARS})", task.task_token.chars().count())));
    }
    Ok(Some(task))
}

/// The task output of a committed job: its id and receipt key (informative; the aggregate step
/// reads the receipt from the job's own key).
pub fn committed_output(job: &JobId) -> String {
    serde_json::json!({ "job_id": job.to_hex(), "receipt_key": layout::job_receipt(job) }).to_string()
}

/// `reason` cut to [`MAX_CAUSE_BYTES`] on a character boundary.
pub fn cause(reason: &str) -> &str {
    if reason.len() <= MAX_CAUSE_BYTES {
        return reason;
    }
    let mut end = MAX_CAUSE_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Completes `task` with how `job` ended.
pub fn complete_task(tokens: &dyn TaskTokens, task: &BulkTask, job: &JobId, end: &JobEnd) -> Result<Completion, BulkTaskError> {
    let result = match end {
        JobEnd::Committed => tokens.succeed(&task.task_token, &committed_output(job)),
        JobEnd::Failed { reason } => tokens.fail(&task.task_token, JOB_FAILED_ERROR, cause(reason)),
    };
    result.map_err(|source| BulkTaskError::Workflow { bulk_id: task.bulk_id.clone(), source })
}

/// What completing the tokens of the runs waiting for one job did.
#[derive(Debug, Default)]
pub struct BulkTaskCompletions {
    /// Each run's bulk id and what completing its token did.
    pub completed: Vec<(String, Completion)>,
    /// Slots left alone: oversized, not a record, another run's record.
    pub refused: Vec<BulkTaskError>,
    /// More than [`MAX_BULK_TASKS_PER_JOB`] runs wait: the rest are left to their timeout.
    pub truncated: bool,
}

/// The host's side of the hand-off, called after the job's end is written: completes the token
/// of every bulk run waiting for `job` (at most [`MAX_BULK_TASKS_PER_JOB`]). A slot that fails
/// to read or complete does not stop the others; the first such error is returned after all
/// were tried, so a caller's retry finds the completed ones closed and tries the rest again.
pub fn complete_bulk_tasks(
    jobs: &dyn ObjectStore,
    tokens: &dyn TaskTokens,
    job: &JobId,
    end: &JobEnd,
) -> Result<BulkTaskCompletions, BulkTaskError> {
    let prefix = layout::job_bulk_tasks_prefix(job);
    let mut slots = jobs
        .list_page(&prefix, None, MAX_BULK_TASKS_PER_JOB + 1)
        .map_err(|source| BulkTaskError::Object { key: prefix.clone(), source })?;
    let mut done = BulkTaskCompletions { truncated: slots.len() > MAX_BULK_TASKS_PER_JOB, ..Default::default() };
    slots.truncate(MAX_BULK_TASKS_PER_JOB);
    let mut first_error = None;
    for meta in slots {
        // The listed size refuses a planted giant before any read; the read is bounded anyway.
        let task = if meta.size > MAX_BULK_TASK_BYTES {
            Err(BulkTaskError::Record { key: meta.key.clone(), message: format!("{} bytes (at most {MAX_BULK_TASK_BYTES})", meta.size) })
        } else {
            read_slot(jobs, job, &meta.key)
        };
        let outcome = match task {
            Ok(None) => continue,
            Ok(Some(task)) => complete_task(tokens, &task, job, end).map(|c| done.completed.push((task.bulk_id, c))),
            Err(e @ BulkTaskError::Record { .. }) => {
                tracing::warn!(job = %job, error = %e, "bulk task slot left alone");
                done.refused.push(e);
                continue;
            }
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    if done.truncated {
        tracing::warn!(job = %job, max = MAX_BULK_TASKS_PER_JOB, "more bulk runs wait for this job than one end completes; the rest time out");
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(done),
    }
}

/// [`complete_bulk_tasks`], summed up for callers that log one outcome: `None` when no run
/// waits, `Completed` when this call completed at least one token, else how the first was
/// already closed.
pub fn complete_bulk_task(
    jobs: &dyn ObjectStore,
    tokens: &dyn TaskTokens,
    job: &JobId,
    end: &JobEnd,
) -> Result<Option<Completion>, BulkTaskError> {
    let done = complete_bulk_tasks(jobs, tokens, job, end)?;
    Ok(match done.completed.iter().find(|(_, c)| *c == Completion::Completed) {
        Some((_, completed)) => Some(completed.clone()),
        None => done.completed.into_iter().next().map(|(_, c)| c),
    })
}
