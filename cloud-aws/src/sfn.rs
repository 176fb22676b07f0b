//! [`SfnWorkflow`]: task tokens and executions on AWS Step Functions.
//!
//! `SendTaskSuccess` / `SendTaskFailure` need only the token (hosts and `bulk-await-shard`);
//! `StartExecution` needs the bulk state machine's ARN (the client). A token that is already
//! completed, timed out or unknown (`TaskTimedOut`, `InvalidToken`, `TaskDoesNotExist`) is
//! [`Completion::AlreadyClosed`], not an error: the other side of the hand-off, or the
//! timeout, decided the task.

use aws_sdk_sfn::config::http::HttpResponse;
use aws_sdk_sfn::error::{ProvideErrorMetadata, SdkError};

use super::error::Failure;
use super::runtime::AwsRuntime;
use cloud::workflow::{Completion, Execution, ExecutionStatus, Executions, TaskTokens, WorkflowError};

/// Codes that mean the task is already decided.
const CLOSED_CODES: &[&str] = &["TaskTimedOut", "InvalidToken", "TaskDoesNotExist"];

/// Step Functions for one deployment. Cheap to clone.
#[derive(Clone)]
pub struct SfnWorkflow {
    client: aws_sdk_sfn::Client,
    runtime: AwsRuntime,
    state_machine_arn: Option<String>,
}

impl std::fmt::Debug for SfnWorkflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SfnWorkflow").field("state_machine_arn", &self.state_machine_arn).finish()
    }
}

/// An SDK failure as a [`WorkflowError`], the operation named.
fn error<E>(op: &str, error: SdkError<E, HttpResponse>) -> WorkflowError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let failure = Failure::of(&error);
    let message = format!("Step Functions {op}: {}", failure.message);
    let code = failure.code.as_str();
    if failure.transient {
        return WorkflowError::Unavailable(message);
    }
    if code.contains("AccessDenied") || failure.status_is(403) {
        return WorkflowError::AccessDenied(message);
    }
    match code {
        "ExecutionDoesNotExist" | "StateMachineDoesNotExist" | "StateMachineDeleting" => WorkflowError::NotFound(message),
        "ExecutionAlreadyExists" => WorkflowError::AlreadyExists(message),
        _ => WorkflowError::Invalid(message),
    }
}

/// The closing answer of a completion, if that is what `error` is.
fn closed<E>(error: &SdkError<E, HttpResponse>) -> Option<Completion>
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let code = error.code()?;
    CLOSED_CODES.contains(&code).then(|| Completion::AlreadyClosed { code: code.to_owned() })
}

impl SfnWorkflow {
    pub fn new(client: aws_sdk_sfn::Client, runtime: AwsRuntime, state_machine_arn: Option<String>) -> SfnWorkflow {
        SfnWorkflow { client, runtime, state_machine_arn }
    }

    pub fn state_machine_arn(&self) -> Option<&str> {
        self.state_machine_arn.as_deref()
    }

    pub fn client(&self) -> &aws_sdk_sfn::Client {
        &self.client
    }
}

impl TaskTokens for SfnWorkflow {
    fn succeed(&self, token: &str, output: &str) -> Result<Completion, WorkflowError> {
        let call = self.client.send_task_success().task_token(token).output(output).send();
        match self.runtime.block_on(call) {
            Ok(_) => Ok(Completion::Completed),
            Err(e) => closed(&e).ok_or_else(|| error("SendTaskSuccess", e)),
        }
    }

    fn fail(&self, token: &str, error_name: &str, cause: &str) -> Result<Completion, WorkflowError> {
        let call = self.client.send_task_failure().task_token(token).error(error_name).cause(cause).send();
        match self.runtime.block_on(call) {
            Ok(_) => Ok(Completion::Completed),
            Err(e) => closed(&e).ok_or_else(|| error("SendTaskFailure", e)),
        }
    }
}

impl Executions for SfnWorkflow {
    fn start(&self, name: &str, input: &str) -> Result<String, WorkflowError> {
        let Some(arn) = &self.state_machine_arn else {
            return Err(WorkflowError::NotConfigured(
                "the stack outputs have no BulkStateMachineArn (or set EPHEM_BULK_STATE_MACHINE_ARN)".into(),
            ));
        };
        let call = self.client.start_execution().state_machine_arn(arn).name(name).input(input).send();
        let out = self.runtime.block_on(call).map_err(|e| error("StartExecution", e))?;
        Ok(out.execution_arn().to_owned())
    }

    fn describe(&self, execution: &str) -> Result<Execution, WorkflowError> {
        let call = self.client.describe_execution().execution_arn(execution).send();
        let out = self.runtime.block_on(call).map_err(|e| error("DescribeExecution", e))?;
        use aws_sdk_sfn::types::ExecutionStatus as S;
        let status = match out.status() {
            S::Succeeded => ExecutionStatus::Succeeded,
            S::Failed => ExecutionStatus::Failed,
            S::TimedOut => ExecutionStatus::TimedOut,
            S::Aborted => ExecutionStatus::Aborted,
            // RUNNING, PENDING_REDRIVE, and anything newer than this SDK: not over yet.
            _ => ExecutionStatus::Running,
        };
        Ok(Execution {
            id: out.execution_arn().to_owned(),
            status,
            output: out.output().map(str::to_owned),
            error: out.error().map(str::to_owned),
            cause: out.cause().map(str::to_owned),
        })
    }
}
