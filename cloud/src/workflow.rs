//! Step Functions as the pipeline uses it: [`Executions`] of the bulk workflow (the client starts
//! one and follows it) and [`TaskTokens`] (each shard's Map item waits on one; whoever sees the
//! shard's job end completes it).
//!
//! **The hand-off** (`jobs/<job_id>/bulk-task.json`, [`BulkTask`]): the workflow's
//! `bulk-await-shard` step writes the token there, *then* looks for the job's end (receipt,
//! failed status); a host writes the job's end, *then* reads the token there and completes it
//! ([`complete_bulk_task`]). Each side writes before it reads, so at least one of them sees
//! the other's write and completes the token; a second completion finds the token closed, which
//! [`Completion::AlreadyClosed`] reports as an outcome, not an error.
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

/// `jobs/<job_id>/bulk-task.json`: the token of the bulk run waiting for this job. Host-visible
/// and unauthenticated (a token only lets its holder complete one task, which the aggregate step
/// does not trust anyway).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkTask {
    pub version: u32,
    pub bulk_id: String,
    pub task_token: String,
    pub written_ms: u64,
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

/// Writes the token a bulk run waits on for `job` (replacing a retried step's older token).
pub fn write_bulk_task(jobs: &dyn ObjectStore, job: &JobId, bulk_id: &str, task_token: &str, now_ms: u64) -> Result<(), ObjectError> {
    let record = BulkTask { version: 1, bulk_id: bulk_id.to_owned(), task_token: task_token.to_owned(), written_ms: now_ms };
    let bytes = serde_json::to_vec(&record).expect("a bulk task serialises");
    jobs.put(&layout::job_bulk_task(job), &bytes, PutCondition::Overwrite).map(drop)
}

/// The token waiting for `job`, if a bulk run wrote one.
pub fn read_bulk_task(jobs: &dyn ObjectStore, job: &JobId) -> Result<Option<BulkTask>, BulkTaskError> {
    let key = layout::job_bulk_task(job);
    let bytes = match jobs.get(&key) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(None),
        Err(source) => return Err(BulkTaskError::Object { key, source }),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| BulkTaskError::Record { key, message: e.to_string() })
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

/// The host's side of the hand-off, called after the job's end is written: if a bulk run waits
/// for `job`, completes its token. `None`: no run waits.
pub fn complete_bulk_task(
    jobs: &dyn ObjectStore,
    tokens: &dyn TaskTokens,
    job: &JobId,
    end: &JobEnd,
) -> Result<Option<Completion>, BulkTaskError> {
    let Some(task) = read_bulk_task(jobs, job)? else { return Ok(None) };
    complete_task(tokens, &task, job, end).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
