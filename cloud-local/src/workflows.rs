//! [`LocalWorkflows`]: the embedded default's Step Functions, in one SQLite file shared by the
//! processes of a home (`workflows.sqlite`).
//!
//! It keeps what the service keeps — executions (name, input, status, output or error) and task
//! tokens (open until completed, failed or timed out) — and answers [`Executions`] and
//! [`TaskTokens`] with the service's semantics: a second completion, a completion after the
//! timeout, or an unknown token is [`Completion::AlreadyClosed`] (`TaskTimedOut`,
//! `InvalidToken`). Nothing here runs a state machine: the local runtime (`ephem-batch dev
//! run-lambdas`) claims pending executions with [`LocalWorkflows::claim`] and runs them with
//! the ASL interpreter of crate `lambdas`, issuing and awaiting tokens here.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

use super::sqlite;
use cloud::workflow::{Completion, Execution, ExecutionStatus, Executions, TaskTokens, WorkflowError};

/// Execution ids are this prefix and the execution's name.
pub const EXECUTION_PREFIX: &str = "local:execution:";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS executions (
    name       TEXT PRIMARY KEY,
    input      TEXT NOT NULL,
    status     TEXT NOT NULL,
    output     TEXT,
    error      TEXT,
    cause      TEXT,
    started_ms INTEGER NOT NULL,
    stopped_ms INTEGER
);
CREATE TABLE IF NOT EXISTS task_tokens (
    token      TEXT PRIMARY KEY,
    execution  TEXT NOT NULL,
    state      TEXT NOT NULL,
    output     TEXT,
    error      TEXT,
    cause      TEXT,
    created_ms INTEGER NOT NULL,
    closed_ms  INTEGER
);
";

/// A state and its output, error and cause, as stored.
type Closing = (String, Option<String>, Option<String>, Option<String>);

/// Not yet claimed by a runner; reported as `RUNNING`, as Step Functions would.
const PENDING: &str = "PENDING";

/// How a task token was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOutcome {
    Succeeded { output: String },
    Failed { error: String, cause: String },
    TimedOut,
}

pub struct LocalWorkflows {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for LocalWorkflows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWorkflows").field("path", &self.path).finish()
    }
}

/// Step Functions' rule for execution names: 1 to 80 of `A-Z a-z 0-9 - _`.
pub fn valid_execution_name(name: &str) -> bool {
    (1..=80).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl LocalWorkflows {
    pub fn open(path: impl AsRef<Path>) -> Result<LocalWorkflows, WorkflowError> {
        let path = path.as_ref().to_path_buf();
        let conn = sqlite::open_with_setup(&path, false, |tx| tx.execute_batch(SCHEMA)).map_err(|e| db_error(&path, e))?;
        Ok(LocalWorkflows { path, conn: Mutex::new(conn) })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn db(&self, e: rusqlite::Error) -> WorkflowError {
        db_error(&self.path, e)
    }

    /// The oldest pending execution, now running: (id, input). A runner calls this; an
    /// execution is claimed once.
    pub fn claim(&self) -> Result<Option<(String, String)>, WorkflowError> {
        let conn = self.conn();
        let row: Option<(String, String)> = conn
            .query_row(
                "UPDATE executions SET status = 'RUNNING'
                 WHERE name = (SELECT name FROM executions WHERE status = ?1 ORDER BY started_ms, name LIMIT 1)
                 RETURNING name, input",
                [PENDING],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|e| self.db(e))?;
        Ok(row.map(|(name, input)| (format!("{EXECUTION_PREFIX}{name}"), input)))
    }

    /// Puts executions a stopped runner left running back to pending (the runner is one
    /// process per home; call at its start). Their steps are idempotent, so they run again.
    pub fn requeue_running(&self) -> Result<usize, WorkflowError> {
        self.conn().execute("UPDATE executions SET status = ?1 WHERE status = 'RUNNING'", [PENDING]).map_err(|e| self.db(e))
    }

    /// Records how an execution ended.
    pub fn finish(&self, id: &str, status: ExecutionStatus, output: Option<&str>, error: Option<&str>, cause: Option<&str>) -> Result<(), WorkflowError> {
        let name = name_of(id)?;
        self.conn()
            .execute(
                "UPDATE executions SET status = ?2, output = ?3, error = ?4, cause = ?5, stopped_ms = ?6 WHERE name = ?1",
                params![name, status.as_str(), output, error, cause, cloud::now_ms() as i64],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// A new open token for a task of `execution`.
    pub fn issue_token(&self, execution: &str) -> Result<String, WorkflowError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| WorkflowError::Unavailable(format!("random number generator: {e}")))?;
        let token = hex::encode(bytes);
        self.conn()
            .execute(
                "INSERT INTO task_tokens (token, execution, state, created_ms) VALUES (?1, ?2, 'open', ?3)",
                params![token, execution, cloud::now_ms() as i64],
            )
            .map_err(|e| self.db(e))?;
        Ok(token)
    }

    /// How `token` was closed; `None` while it is open.
    pub fn outcome(&self, token: &str) -> Result<Option<TokenOutcome>, WorkflowError> {
        let row: Option<Closing> = self
            .conn()
            .query_row("SELECT state, output, error, cause FROM task_tokens WHERE token = ?1", [token], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
            .map_err(|e| self.db(e))?;
        let Some((state, output, error, cause)) = row else {
            return Err(WorkflowError::Invalid(format!("Step Functions (local): no task token {token}")));
        };
        Ok(match state.as_str() {
            "succeeded" => Some(TokenOutcome::Succeeded { output: output.unwrap_or_default() }),
            "failed" => Some(TokenOutcome::Failed { error: error.unwrap_or_default(), cause: cause.unwrap_or_default() }),
            "timed_out" => Some(TokenOutcome::TimedOut),
            _ => None,
        })
    }

    /// Closes `token` as timed out unless it was completed first; returns how it ended.
    pub fn time_out(&self, token: &str) -> Result<TokenOutcome, WorkflowError> {
        self.close(token, "timed_out", None, None, None)?;
        Ok(self.outcome(token)?.unwrap_or(TokenOutcome::TimedOut))
    }

    /// Waits until `token` is closed, polling every `poll`; after `timeout` it is closed as
    /// timed out. `stop` ends the wait early with `None` (the token stays open).
    pub fn wait(&self, token: &str, timeout: Option<Duration>, poll: Duration, stop: &dyn Fn() -> bool) -> Result<Option<TokenOutcome>, WorkflowError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(outcome) = self.outcome(token)? {
                return Ok(Some(outcome));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return self.time_out(token).map(Some);
            }
            if stop() {
                return Ok(None);
            }
            std::thread::sleep(poll);
        }
    }

    /// Closes an open token; [`Completion::AlreadyClosed`] names why it could not be.
    fn close(&self, token: &str, state: &str, output: Option<&str>, error: Option<&str>, cause: Option<&str>) -> Result<Completion, WorkflowError> {
        let conn = self.conn();
        let changed = conn
            .execute(
                "UPDATE task_tokens SET state = ?2, output = ?3, error = ?4, cause = ?5, closed_ms = ?6
                 WHERE token = ?1 AND state = 'open'",
                params![token, state, output, error, cause, cloud::now_ms() as i64],
            )
            .map_err(|e| self.db(e))?;
        if changed == 1 {
            return Ok(Completion::Completed);
        }
        let known: Option<String> = conn
            .query_row("SELECT state FROM task_tokens WHERE token = ?1", [token], |row| row.get(0))
            .optional()
            .map_err(|e| self.db(e))?;
        // As the service: a closed task answers TaskTimedOut, an unknown token InvalidToken.
        let code = if known.is_some() { "TaskTimedOut" } else { "InvalidToken" };
        Ok(Completion::AlreadyClosed { code: code.to_owned() })
    }
}

impl TaskTokens for LocalWorkflows {
    fn succeed(&self, token: &str, output: &str) -> Result<Completion, WorkflowError> {
        if serde_json::from_str::<serde_json::Value>(output).is_err() {
            return Err(WorkflowError::Invalid("Step Functions (local) SendTaskSuccess: InvalidOutput: the output is not JSON".into()));
        }
        self.close(token, "succeeded", Some(output), None, None)
    }

    fn fail(&self, token: &str, error: &str, cause: &str) -> Result<Completion, WorkflowError> {
        self.close(token, "failed", None, Some(error), Some(cause))
    }
}

impl Executions for LocalWorkflows {
    fn start(&self, name: &str, input: &str) -> Result<String, WorkflowError> {
        if !valid_execution_name(name) {
            return Err(WorkflowError::Invalid(format!("Step Functions (local) StartExecution: InvalidName: {name:?}")));
        }
        if serde_json::from_str::<serde_json::Value>(input).is_err() {
            return Err(WorkflowError::Invalid("Step Functions (local) StartExecution: InvalidExecutionInput: not JSON".into()));
        }
        let conn = self.conn();
        let inserted = conn
            .execute(
                "INSERT INTO executions (name, input, status, started_ms) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING",
                params![name, input, PENDING, cloud::now_ms() as i64],
            )
            .map_err(|e| self.db(e))?;
        if inserted == 0 {
            // As the service: the same name and input is the same execution.
            let existing: String =
                conn.query_row("SELECT input FROM executions WHERE name = ?1", [name], |row| row.get(0)).map_err(|e| self.db(e))?;
            if existing != input {
                return Err(WorkflowError::AlreadyExists(format!(
                    "Step Functions (local) StartExecution: ExecutionAlreadyExists: {name} (with another input)"
                )));
            }
        }
        Ok(format!("{EXECUTION_PREFIX}{name}"))
    }

    fn describe(&self, execution: &str) -> Result<Execution, WorkflowError> {
        let name = name_of(execution)?;
        let row: Option<Closing> = self
            .conn()
            .query_row("SELECT status, output, error, cause FROM executions WHERE name = ?1", [name], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
            .map_err(|e| self.db(e))?;
        let Some((status, output, error, cause)) = row else {
            return Err(WorkflowError::NotFound(format!("Step Functions (local) DescribeExecution: ExecutionDoesNotExist: {execution}")));
        };
        let status = match status.as_str() {
            "SUCCEEDED" => ExecutionStatus::Succeeded,
            "FAILED" => ExecutionStatus::Failed,
            "TIMED_OUT" => ExecutionStatus::TimedOut,
            "ABORTED" => ExecutionStatus::Aborted,
            _ => ExecutionStatus::Running,
        };
        Ok(Execution { id: execution.to_owned(), status, output, error, cause })
    }
}

fn name_of(id: &str) -> Result<&str, WorkflowError> {
    id.strip_prefix(EXECUTION_PREFIX)
        .ok_or_else(|| WorkflowError::Invalid(format!("Step Functions (local): InvalidArn: {id:?} is not {EXECUTION_PREFIX}<name>")))
}

fn db_error(path: &Path, e: rusqlite::Error) -> WorkflowError {
    let message = format!("Step Functions (local) {}: {e}", path.display());
    if sqlite::is_busy(&e) { WorkflowError::Unavailable(message) } else { WorkflowError::Invalid(message) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, LocalWorkflows) {
        let dir = tempfile::tempdir().unwrap();
        let w = LocalWorkflows::open(dir.path().join("workflows.sqlite")).unwrap();
        (dir, w)
    }

    #[test]
    fn a_token_closes_once() {
        let (_dir, w) = open();
        let token = w.issue_token("local:execution:x").unwrap();
        assert_eq!(w.outcome(&token).unwrap(), None);
        assert_eq!(w.succeed(&token, r#"{"job_id":"a"}"#).unwrap(), Completion::Completed);
        // The host and the await step may both complete it: the second one is told, not failed.
        assert_eq!(w.fail(&token, "EphemBatch.JobFailed", "late").unwrap(), Completion::AlreadyClosed { code: "TaskTimedOut".into() });
        assert_eq!(w.outcome(&token).unwrap(), Some(TokenOutcome::Succeeded { output: r#"{"job_id":"a"}"#.into() }));
        assert_eq!(w.succeed("nope", "{}").unwrap(), Completion::AlreadyClosed { code: "InvalidToken".into() });
        assert!(w.succeed(&token, "not json").is_err());
    }

    #[test]
    fn a_token_times_out_unless_completed_first() {
        let (_dir, w) = open();
        let token = w.issue_token("local:execution:x").unwrap();
        let outcome = w.wait(&token, Some(Duration::from_millis(30)), Duration::from_millis(5), &|| false).unwrap();
        assert_eq!(outcome, Some(TokenOutcome::TimedOut));
        assert_eq!(w.succeed(&token, "{}").unwrap(), Completion::AlreadyClosed { code: "TaskTimedOut".into() });
        let done = w.issue_token("local:execution:x").unwrap();
        w.fail(&done, "E", "why").unwrap();
        assert_eq!(w.time_out(&done).unwrap(), TokenOutcome::Failed { error: "E".into(), cause: "why".into() });
        let open_one = w.issue_token("local:execution:x").unwrap();
        assert_eq!(w.wait(&open_one, None, Duration::from_millis(1), &|| true).unwrap(), None, "stop ends the wait");
    }

    #[test]
    fn executions_are_claimed_once_and_described() {
        let (dir, w) = open();
        let id = w.start("bulk-1", r#"{"bulk_id":"bulk-1"}"#).unwrap();
        assert_eq!(id, "local:execution:bulk-1");
        assert_eq!(w.start("bulk-1", r#"{"bulk_id":"bulk-1"}"#).unwrap(), id, "same name and input: same execution");
        assert!(matches!(w.start("bulk-1", "{}"), Err(WorkflowError::AlreadyExists(_))));
        assert!(matches!(w.start("bad name", "{}"), Err(WorkflowError::Invalid(_))));
        assert_eq!(w.describe(&id).unwrap().status, ExecutionStatus::Running);

        let other = LocalWorkflows::open(dir.path().join("workflows.sqlite")).unwrap();
        assert_eq!(other.claim().unwrap(), Some((id.clone(), r#"{"bulk_id":"bulk-1"}"#.to_owned())));
        assert_eq!(w.claim().unwrap(), None);
        assert_eq!(w.requeue_running().unwrap(), 1);
        assert!(w.claim().unwrap().is_some());
        other.finish(&id, ExecutionStatus::Failed, None, Some("EphemBatch.NoShards"), Some("none")).unwrap();
        let done = w.describe(&id).unwrap();
        assert_eq!((done.status, done.error.as_deref()), (ExecutionStatus::Failed, Some("EphemBatch.NoShards")));
        assert!(matches!(w.describe("local:execution:missing"), Err(WorkflowError::NotFound(_))));
        assert!(matches!(w.describe("arn:aws:states:x"), Err(WorkflowError::Invalid(_))));
    }
}
