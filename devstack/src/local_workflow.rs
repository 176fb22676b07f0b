//! The embedded default's stand-in for Step Functions. An execution of the bulk workflow is
//! started through [`cloud_local::LocalWorkflows`] (as `Executions::start`), and the local
//! Lambda runtime (`ephem-batch dev run-lambdas`) claims and runs it with [`Runner`]: the very
//! definition the deployment uses, interpreted by [`crate::asl_walk`], the bulk steps called
//! in-process, and task tokens issued and awaited in the same SQLite file the host-poller
//! completes them in.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cloud_local::LocalWorkflows;
use cloud::{ExecutionStatus, ObjectStore, Services, WorkflowError};
use protocol::receipt_check::ReceiptVerifier;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::asl_walk::{self, Ending, Environment, Run, StateError, ABORTED};
use lambdas::bulk::{self, AggregateInput, AwaitInput, ListInput};
use lambdas::on_upload::Config;

/// The definition the deployment deploys (placeholders unfilled).
pub const DEFINITION: &str = bulk::WORKFLOW_DEFINITION;
/// The functions the local runtime names in the definition.
pub const LIST_SHARDS: &str = "bulk-list-shards";
pub const AWAIT_SHARD: &str = "bulk-await-shard";
pub const AGGREGATE: &str = "bulk-aggregate";
/// The jobs "bucket" the local runtime names in the definition.
pub const LOCAL_BUCKET: &str = "local-jobs";

/// The definition with its placeholders filled, as the deployment fills them (with ARNs there).
pub fn definition(bucket: &str) -> Value {
    let text = DEFINITION
        .replace("${BulkListShardsFunctionArn}", LIST_SHARDS)
        .replace("${BulkAwaitShardFunctionArn}", AWAIT_SHARD)
        .replace("${BulkAggregateFunctionArn}", AGGREGATE)
        .replace("${JobsBucketName}", bucket);
    serde_json::from_str(&text).expect("the bulk workflow definition is JSON")
}

/// What the three bulk functions need, for calling them in-process.
pub struct Steps<'a> {
    pub jobs: &'a dyn ObjectStore,
    pub attestations: &'a dyn ObjectStore,
    pub tokens: &'a dyn cloud::TaskTokens,
    pub config: &'a Config,
    pub check: &'a ReceiptVerifier,
    pub now_ms: u64,
}

impl Steps<'_> {
    /// Invokes function `name` with `payload`, as Lambda would: a handler error is
    /// `EphemBatch.BulkError`, the binaries' error type.
    pub fn invoke(&self, name: &str, payload: Value) -> Result<Value, StateError> {
        match name {
            LIST_SHARDS => call(payload, |input: ListInput| bulk::list_shards(&input, self.jobs, self.config)),
            AWAIT_SHARD => call(payload, |input: AwaitInput| bulk::await_shard(&input, self.jobs, self.tokens, self.now_ms)),
            AGGREGATE => {
                call(payload, |input: AggregateInput| bulk::aggregate(&input, self.jobs, self.attestations, self.check, self.now_ms))
            }
            other => Err(("Lambda.ResourceNotFoundException".into(), format!("no function {other}"))),
        }
    }
}

fn call<I: DeserializeOwned, O: Serialize>(payload: Value, handler: impl FnOnce(I) -> Result<O, bulk::BulkError>) -> Result<Value, StateError> {
    let failed = |message: String| ("EphemBatch.BulkError".to_owned(), message);
    let input = serde_json::from_value(payload).map_err(|e| failed(format!("input: {e}")))?;
    let output = handler(input).map_err(|e| failed(e.to_string()))?;
    Ok(serde_json::to_value(output).expect("handler output serialises"))
}

/// Runs the home's bulk executions.
pub struct Runner {
    pub services: Services,
    pub workflows: Arc<LocalWorkflows>,
    /// The embedded default's store prefixes.
    pub config: Config,
    /// What shard receipts must pass: the development root and the home's signed policy,
    /// locally ([`ReceiptVerifier::enforcing`]).
    pub check: Arc<ReceiptVerifier>,
    /// How often a waiting task looks at its token.
    pub poll: Duration,
}

impl Runner {
    /// Claims and runs pending executions, each on its own thread, until `stop`; executions a
    /// previous runner left running start again (their steps are idempotent).
    pub fn serve(self: Arc<Self>, stop: Arc<AtomicBool>) -> Result<(), WorkflowError> {
        let requeued = self.workflows.requeue_running()?;
        if requeued > 0 {
            tracing::info!(requeued, "bulk executions left running by a previous runtime start again");
        }
        let mut running = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            running.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
            match self.workflows.claim() {
                Ok(Some((id, input))) => {
                    let (runner, stop) = (self.clone(), stop.clone());
                    running.push(std::thread::spawn(move || runner.run_execution(&id, &input, &stop)));
                }
                Ok(None) => std::thread::sleep(self.poll),
                Err(error) => {
                    tracing::warn!(%error, "claiming a bulk execution");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        for thread in running {
            let _ = thread.join();
        }
        Ok(())
    }

    /// Runs one claimed execution and records how it ended (not when `stop` cut a wait short:
    /// it stays running and starts again with the runtime).
    pub fn run_execution(&self, id: &str, input: &str, stop: &AtomicBool) {
        tracing::info!(execution = id, "bulk execution started");
        let ending = match serde_json::from_str::<Value>(input) {
            Err(e) => Ending::Failed { error: "States.Runtime".into(), cause: format!("the execution input is not JSON: {e}") },
            Ok(input) => {
                let mut env = LocalEnv { runner: self, execution: id.to_owned(), stop };
                let definition = definition(LOCAL_BUCKET);
                // A construct the interpreter lacks panics; the execution fails instead of the runtime.
                std::panic::catch_unwind(AssertUnwindSafe(|| Run::new(&mut env, id).execute(&definition, input))).unwrap_or_else(|panic| {
                    let cause = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                    Ending::Failed { error: "States.Runtime".into(), cause: cause.unwrap_or_else(|| "the interpreter panicked".into()) }
                })
            }
        };
        let recorded = match &ending {
            Ending::Failed { error, .. } if error == ABORTED => {
                tracing::info!(execution = id, "bulk execution interrupted; it runs again when the runtime starts");
                return;
            }
            Ending::Succeeded(output) => self.workflows.finish(id, ExecutionStatus::Succeeded, Some(&output.to_string()), None, None),
            Ending::Failed { error, cause } => self.workflows.finish(id, ExecutionStatus::Failed, None, Some(error), Some(cause)),
        };
        match recorded {
            Ok(()) => tracing::info!(execution = id, ?ending, "bulk execution ended"),
            Err(error) => tracing::error!(execution = id, %error, "bulk execution ended but was not recorded"),
        }
    }
}

struct LocalEnv<'a> {
    runner: &'a Runner,
    execution: String,
    stop: &'a AtomicBool,
}

impl Environment for LocalEnv<'_> {
    fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, StateError> {
        let services = &self.runner.services;
        let steps = Steps {
            jobs: services.jobs.as_ref(),
            attestations: services.attestations.as_ref(),
            tokens: self.runner.workflows.as_ref(),
            config: &self.runner.config,
            check: &self.runner.check,
            now_ms: cloud::now_ms(),
        };
        steps.invoke(function, payload)
    }

    fn issue_token(&mut self) -> Result<String, StateError> {
        self.runner.workflows.issue_token(&self.execution).map_err(runtime_error)
    }

    fn wait_for_token(&mut self, token: &str, timeout_s: Option<u64>) -> Result<Value, StateError> {
        let stop = || self.stop.load(Ordering::Relaxed);
        match self.runner.workflows.wait(token, timeout_s.map(Duration::from_secs), self.runner.poll, &stop) {
            Ok(Some(outcome)) => asl_walk::token_result(outcome),
            Ok(None) => Err((ABORTED.into(), "the local runtime stopped".into())),
            Err(error) => Err(runtime_error(error)),
        }
    }
}

fn runtime_error(error: WorkflowError) -> StateError {
    ("States.Runtime".into(), error.to_string())
}
