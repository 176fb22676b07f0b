//! Runs `lambdas/asl/bulk-workflow.asl.json` — the very file the deployment uses — by a small
//! interpreter of the Amazon States Language subset the definition uses. The tests run it with
//! the bulk handlers called in-process; the embedded default runs it as its stand-in for Step
//! Functions ([`crate::local_workflow`]).
//!
//! Interpreted: Task states for `lambda:invoke` (the handler is called with the resolved
//! `Payload`, its output wrapped as `{"Payload": …}`) and `lambda:invoke.waitForTaskToken`
//! (a token is issued per attempt and given as `$$.Task.Token`; the handler's result is ignored
//! and the task ends when the token is completed, failed or times out after `TimeoutSeconds`
//! with `States.Timeout`), Choice (`NumericGreaterThan[Equals]`), Pass with `Parameters`, the
//! intrinsic `States.Format`, an INLINE Map with `ItemSelector` (`$$.Map.Item.Value`; items one
//! after the other, not `MaxConcurrency` at a time), Fail, `ResultSelector`, `ResultPath`
//! (including `null`), `OutputPath`, `Retry` and `Catch` on the error names (`States.ALL`), and
//! the 256 KiB limit on every state's input and output (`States.DataLimitExceeded`). Not
//! covered: the Step Functions service itself (IAM, Lambda's invoke envelope beyond `Payload`,
//! real concurrency, execution history). A construct outside this subset panics: the
//! definition is fixed and its tests walk every state.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// What a run ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Succeeded(Value),
    Failed { error: String, cause: String },
}

/// An error as Step Functions names it: (error, cause).
pub type StateError = (String, String);

/// The services a run calls out to.
pub trait Environment {
    /// Invokes the Lambda function `name` with `payload`.
    fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, StateError>;
    /// A new task token for one attempt of a `.waitForTaskToken` task.
    fn issue_token(&mut self) -> Result<String, StateError>;
    /// Waits until `token` is completed (its output) or failed; after `timeout_s` the task
    /// fails with `States.Timeout`.
    fn wait_for_token(&mut self, token: &str, timeout_s: Option<u64>) -> Result<Value, StateError>;
}

/// Step Functions' limit on a state's input or output.
pub const MAX_STATE_BYTES: usize = 256 * 1024;
pub const TIMEOUT: &str = "States.Timeout";
/// An environment's way to end a run at once (its runtime is stopping): never retried or
/// caught, unlike every error Step Functions itself names.
pub const ABORTED: &str = "Runtime.Aborted";

pub struct Run<'e> {
    env: &'e mut dyn Environment,
    /// The context object (`$$`): the execution, and the Map item being processed.
    context: Value,
    /// How many times each state was entered.
    pub visits: BTreeMap<String, u64>,
}

impl<'e> Run<'e> {
    pub fn new(env: &'e mut dyn Environment, execution_id: &str) -> Self {
        Self { env, context: json!({"Execution": {"Id": execution_id}}), visits: BTreeMap::new() }
    }

    /// Runs a state machine (or a Map's item processor) on `input`.
    pub fn machine(&mut self, definition: &Value, input: Value) -> Ending {
        let states = &definition["States"];
        let mut name = definition["StartAt"].as_str().expect("StartAt").to_owned();
        let mut data = input;
        loop {
            let state = &states[&name];
            assert!(state.is_object(), "no state {name}");
            *self.visits.entry(name.clone()).or_default() += 1;
            if let Err((error, cause)) = check_size(&name, &data) {
                return Ending::Failed { error, cause };
            }
            let kept = state.get("Catch").map(|_| data.clone());
            let outcome = match state["Type"].as_str().expect("Type") {
                "Pass" => Ok(self.pass(state, data)),
                "Task" => self.task(state, data),
                "Choice" => {
                    name = choose(state, &data);
                    continue;
                }
                "Map" => self.map(state, data),
                "Fail" => {
                    return Ending::Failed {
                        error: state["Error"].as_str().unwrap_or_default().into(),
                        cause: state["Cause"].as_str().unwrap_or_default().into(),
                    };
                }
                other => panic!("state type {other} is not interpreted"),
            };
            data = match outcome.and_then(|d| check_size(&name, &d).map(|()| d)) {
                Ok(d) => d,
                Err((error, cause)) if error == ABORTED => return Ending::Failed { error, cause },
                Err((error, cause)) => match (catcher(state, &error), kept) {
                    (Some(catch), Some(input)) => {
                        let caught = place_result(catch.get("ResultPath"), input, json!({"Error": error, "Cause": cause}));
                        name = catch["Next"].as_str().expect("Catch Next").to_owned();
                        data = caught;
                        continue;
                    }
                    _ => return Ending::Failed { error, cause },
                },
            };
            if state["End"].as_bool() == Some(true) {
                return Ending::Succeeded(data);
            }
            name = state["Next"].as_str().expect("Next").to_owned();
        }
    }

    fn pass(&mut self, state: &Value, input: Value) -> Value {
        let result = match state.get("Parameters") {
            Some(p) => resolve(p, &input, &self.context),
            None => input.clone(),
        };
        place(state, input, result)
    }

    fn task(&mut self, state: &Value, input: Value) -> Result<Value, StateError> {
        let resource = state["Resource"].as_str().expect("Resource");
        let timeout_s = state.get("TimeoutSeconds").map(|t| t.as_u64().expect("TimeoutSeconds"));
        let mut attempts = 0;
        let raw = loop {
            let result = match resource {
                "arn:aws:states:::lambda:invoke" => {
                    let params = resolve(&state["Parameters"], &input, &self.context);
                    let function = params["FunctionName"].as_str().expect("FunctionName").to_owned();
                    self.env.invoke(&function, params["Payload"].clone()).map(|p| json!({"Payload": p, "StatusCode": 200}))
                }
                "arn:aws:states:::lambda:invoke.waitForTaskToken" => self.wait_for_token(state, &input, timeout_s),
                other => panic!("task resource {other} is not interpreted"),
            };
            match result {
                Ok(v) => break v,
                Err((error, cause)) => {
                    attempts += 1;
                    if error == ABORTED || !retries(state, &error, attempts) {
                        return Err((error, cause));
                    }
                }
            }
        };
        let result = match state.get("ResultSelector") {
            Some(s) => resolve(s, &raw, &self.context),
            None => raw,
        };
        Ok(place(state, input, result))
    }

    /// One attempt of a `.waitForTaskToken` task: a fresh token in the context, the function
    /// invoked (its result ignored), then the wait for the token.
    fn wait_for_token(&mut self, state: &Value, input: &Value, timeout_s: Option<u64>) -> Result<Value, StateError> {
        let token = self.env.issue_token()?;
        self.context["Task"] = json!({"Token": token});
        let params = resolve(&state["Parameters"], input, &self.context);
        if let Some(task) = self.context.as_object_mut() {
            task.remove("Task");
        }
        let function = params["FunctionName"].as_str().expect("FunctionName").to_owned();
        self.env.invoke(&function, params["Payload"].clone())?;
        self.env.wait_for_token(&token, timeout_s)
    }

    fn map(&mut self, state: &Value, input: Value) -> Result<Value, StateError> {
        let items = path(&input, state["ItemsPath"].as_str().unwrap_or("$")).as_array().cloned().expect("ItemsPath is an array");
        let mut out = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            self.context["Map"] = json!({"Item": {"Index": index, "Value": item}});
            let item_input = match state.get("ItemSelector") {
                Some(selector) => resolve(selector, &input, &self.context),
                None => item,
            };
            let ending = self.machine(&state["ItemProcessor"], item_input);
            if let Some(context) = self.context.as_object_mut() {
                context.remove("Map");
            }
            match ending {
                Ending::Succeeded(v) => out.push(v),
                Ending::Failed { error, cause } => return Err((error, cause)),
            }
        }
        Ok(place(state, input, Value::Array(out)))
    }
}

/// `ResultPath` then `OutputPath`.
fn place(state: &Value, input: Value, result: Value) -> Value {
    let combined = place_result(state.get("ResultPath"), input, result);
    match state.get("OutputPath").and_then(Value::as_str) {
        None | Some("$") => combined,
        Some(p) => path(&combined, p).clone(),
    }
}

/// `ResultPath`: absent or `$` → the result; `null` → the input; `$.a.b` → the input with the
/// result at that path.
fn place_result(result_path: Option<&Value>, input: Value, result: Value) -> Value {
    match result_path {
        None => result,
        Some(Value::Null) => input,
        Some(p) if p.as_str() == Some("$") => result,
        Some(p) => {
            let mut data = input;
            let p = p.as_str().expect("ResultPath is a path or null");
            let keys: Vec<&str> = p.strip_prefix("$.").expect("ResultPath $.x").split('.').collect();
            let (last, parents) = keys.split_last().expect("a key");
            let mut at = &mut data;
            for k in parents {
                at = at.as_object_mut().expect("object").entry(k.to_string()).or_insert(json!({}));
            }
            at.as_object_mut().expect("object").insert(last.to_string(), result);
            data
        }
    }
}

fn matches_error(names: &Value, error: &str) -> bool {
    names.as_array().expect("ErrorEquals").iter().any(|n| n == error || n == "States.ALL")
}

fn retries(state: &Value, error: &str, attempts: u64) -> bool {
    state["Retry"].as_array().into_iter().flatten().any(|r| {
        matches_error(&r["ErrorEquals"], error) && attempts <= r["MaxAttempts"].as_u64().unwrap_or(3)
    })
}

/// The first `Catch` rule naming `error`.
fn catcher<'s>(state: &'s Value, error: &str) -> Option<&'s Value> {
    state["Catch"].as_array().into_iter().flatten().find(|c| matches_error(&c["ErrorEquals"], error))
}

fn choose(state: &Value, data: &Value) -> String {
    for rule in state["Choices"].as_array().expect("Choices") {
        let value = path(data, rule["Variable"].as_str().expect("Variable")).as_f64().expect("a number");
        let hit = if let Some(n) = rule.get("NumericGreaterThan") {
            value > n.as_f64().expect("number")
        } else if let Some(n) = rule.get("NumericGreaterThanEquals") {
            value >= n.as_f64().expect("number")
        } else {
            panic!("choice rule {rule} is not interpreted")
        };
        if hit {
            return rule["Next"].as_str().expect("Next").to_owned();
        }
    }
    state["Default"].as_str().expect("Default").to_owned()
}

/// Parameters / ResultSelector / ItemSelector: `"key.$"` values are paths (`$…`, or `$$…`
/// into the context object) or intrinsics, others literal.
fn resolve(template: &Value, data: &Value, context: &Value) -> Value {
    match template {
        Value::Object(fields) => {
            let mut out = Map::new();
            for (k, v) in fields {
                match k.strip_suffix(".$") {
                    Some(name) => {
                        out.insert(name.to_owned(), expression(v.as_str().expect("a path"), data, context));
                    }
                    None => {
                        out.insert(k.clone(), resolve(v, data, context));
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn expression(expr: &str, data: &Value, context: &Value) -> Value {
    if let Some(rest) = expr.strip_prefix("$$") {
        return path(context, &format!("${rest}")).clone();
    }
    if expr.starts_with('$') {
        return path(data, expr).clone();
    }
    let (name, args) = expr.split_once('(').expect("an intrinsic");
    let args: Vec<Value> =
        split_args(args.strip_suffix(')').expect(")")).iter().map(|a| argument(a, data, context)).collect();
    match name {
        "States.Format" => {
            let template = args[0].as_str().expect("a template");
            let mut out = String::new();
            let mut rest = args[1..].iter();
            for (i, piece) in template.split("{}").enumerate() {
                if i > 0 {
                    let v = rest.next().expect("an argument per {}");
                    out.push_str(&v.as_str().map_or_else(|| v.to_string(), str::to_owned));
                }
                out.push_str(piece);
            }
            Value::String(out)
        }
        other => panic!("intrinsic {other} is not interpreted"),
    }
}

fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut current).trim().to_owned()),
            _ => current.push(c),
        }
    }
    out.push(current.trim().to_owned());
    out
}

fn argument(a: &str, data: &Value, context: &Value) -> Value {
    if let Some(s) = a.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        Value::String(s.to_owned())
    } else if a.starts_with('$') {
        expression(a, data, context)
    } else {
        serde_json::from_str(a).expect("a number")
    }
}

/// `$` or `$.a.b`.
fn path<'v>(data: &'v Value, p: &str) -> &'v Value {
    if p == "$" {
        return data;
    }
    p.strip_prefix("$.").expect("a $. path").split('.').fold(data, |v, k| &v[k])
}

fn check_size(state: &str, data: &Value) -> Result<(), StateError> {
    let size = serde_json::to_vec(data).expect("json").len();
    if size > MAX_STATE_BYTES {
        return Err(("States.DataLimitExceeded".into(), format!("state {state}: {size} bytes exceed Step Functions' {MAX_STATE_BYTES}")));
    }
    Ok(())
}

/// How a closed token ends its task, as Step Functions reports it.
pub fn token_result(outcome: cloud::local::TokenOutcome) -> Result<Value, StateError> {
    use cloud::local::TokenOutcome;
    match outcome {
        TokenOutcome::Succeeded { output } => {
            serde_json::from_str(&output).map_err(|e| ("States.Runtime".to_owned(), format!("the task's output is not JSON: {e}")))
        }
        TokenOutcome::Failed { error, cause } => Err((error, cause)),
        TokenOutcome::TimedOut => Err((TIMEOUT.to_owned(), "the task's token was not completed within its TimeoutSeconds".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bulk::{self, ListInput, Manifest, ManifestStatus};
    use crate::local_workflow::{self, Steps, AWAIT_SHARD};
    use crate::on_upload::Config;
    use crate::testing::Fixture;
    use cloud::messages::{Failure, JobState, JobStatus};
    use cloud::workflow::{complete_bulk_task, JobEnd};
    use cloud::{layout, Completion, PutCondition, TaskTokens};
    use protocol::envelope::JobId;
    use receipts_ledger::testing::DevEnclave;
    use receipts_ledger::ProtocolReceipts;
    use std::collections::HashMap;

    const T: u64 = 1_761_955_200_000;
    const BUCKET: &str = "ephem-jobs-test";
    const DAY: u64 = 86_400;

    /// What a shard's host does, and when.
    #[derive(Clone, PartialEq)]
    enum Host {
        /// Commits the receipt (and looks for a token: none yet) before the run starts.
        CommitsBeforeTheRun,
        /// As above, and completes the token again once the run waits on it (a late duplicate).
        CommitsBeforeTheRunAndAgainLater,
        /// Commits the receipt while the run waits: it finds the token and completes it.
        CommitsWhileWaiting,
        /// The job fails for good while the run waits (status, then the token failed).
        FailsWhileWaiting(String),
        /// The job was refused before the run (status written; no token to complete then).
        FailedBeforeTheRun(String),
        /// Completes the token as committed without any receipt.
        LiesAboutCommitting,
        /// Commits the receipt but fails the token.
        CommitsButFailsTheToken,
        /// Never ends the job.
        Never,
    }

    /// The bulk Lambdas over a local cloud, tokens through its local Step Functions.
    struct Env {
        f: Fixture,
        enclave: DevEnclave,
        config: Config,
        hosts: HashMap<String, Host>,
        /// Receipts signed by a key the attestation does not bind.
        forged: Vec<String>,
        invocations: Vec<String>,
        /// token → job, from the await step's payloads.
        token_jobs: HashMap<String, String>,
        /// Completions the hosts made after the task was closed.
        late: Vec<Completion>,
        waited_s: u64,
    }

    impl Env {
        fn new() -> Self {
            let enclave = DevEnclave::new(4, T);
            let f = Fixture::new();
            let doc_key = layout::attestation_by_hash(&receipts_ledger::entry::attestation_sha256(&enclave.document));
            f.services.attestations.put(&doc_key, &enclave.document, PutCondition::CreateOnly).unwrap();
            Self {
                f,
                enclave,
                config: Config::from_list("stores/acme/"),
                hosts: HashMap::new(),
                forged: Vec::new(),
                invocations: Vec::new(),
                token_jobs: HashMap::new(),
                late: Vec::new(),
                waited_s: 0,
            }
        }

        /// A sealed shard under `key`, and what its host does.
        fn shard(&mut self, key: &str, host: Host) -> String {
            let (bytes, job) = self.f.sealed(10);
            self.f.services.jobs.put(key, &bytes, PutCondition::CreateOnly).unwrap();
            let job = job.to_hex();
            // Before the run no token exists: the host finds nothing to complete.
            let completed = match &host {
                Host::CommitsBeforeTheRun | Host::CommitsBeforeTheRunAndAgainLater => self.host_commits(&job),
                Host::FailedBeforeTheRun(reason) => self.host_fails(&job, reason),
                _ => None,
            };
            assert_eq!(completed, None);
            self.hosts.insert(job.clone(), host);
            job
        }

        fn tokens(&self) -> &dyn TaskTokens {
            self.f.services.task_tokens.as_deref().unwrap()
        }

        fn commit_receipt(&self, job_id: &str) {
            let mut receipt = self.enclave.receipt(1);
            receipt.job_id = JobId::from_hex(job_id).unwrap();
            let leaf = if self.forged.iter().any(|j| j == job_id) {
                receipt.sign(&ed25519_dalek::SigningKey::from_bytes(&[0xee; 32]))
            } else {
                self.enclave.sign(&receipt)
            };
            let key = layout::job_receipt(&receipt.job_id);
            self.f.services.jobs.put(&key, &leaf, PutCondition::CreateOnly).unwrap();
        }

        /// The host-poller's order: the receipt, then the token (if a run wrote one).
        fn host_commits(&mut self, job_id: &str) -> Option<Completion> {
            self.commit_receipt(job_id);
            let job = JobId::from_hex(job_id).unwrap();
            complete_bulk_task(self.f.services.jobs.as_ref(), self.tokens(), &job, &JobEnd::Committed).unwrap()
        }

        /// The host-poller's order: the failed status, then the token.
        fn host_fails(&mut self, job_id: &str, reason: &str) -> Option<Completion> {
            let job = JobId::from_hex(job_id).unwrap();
            let mut status = JobStatus::new(job_id, JobState::Failed, 10);
            let (check, message) = reason.split_once(": ").unwrap();
            status.failure = Some(Failure { check: check.into(), message: message.into() });
            self.f.services.jobs.put(&layout::job_status(&job), &serde_json::to_vec(&status).unwrap(), PutCondition::Overwrite).unwrap();
            let end = JobEnd::Failed { reason: reason.into() };
            complete_bulk_task(self.f.services.jobs.as_ref(), self.tokens(), &job, &end).unwrap()
        }

        fn manifest(&self, bulk_id: &str) -> Manifest {
            serde_json::from_slice(&self.f.services.jobs.get(&bulk::manifest_key(bulk_id)).unwrap()).unwrap()
        }

        fn run(&mut self, input: Value) -> (Ending, BTreeMap<String, u64>) {
            let def = local_workflow::definition(BUCKET);
            let mut run = Run::new(self, "test-execution");
            let ending = run.machine(&def, input);
            (ending, run.visits)
        }
    }

    impl Environment for Env {
        fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, StateError> {
            self.invocations.push(function.to_owned());
            if function == AWAIT_SHARD {
                assert_eq!(payload["bucket"], BUCKET);
                let token = payload["task_token"].as_str().unwrap().to_owned();
                self.token_jobs.insert(token, payload["job_id"].as_str().unwrap().to_owned());
            }
            let check = ProtocolReceipts::new(self.enclave.anchor());
            let s = &self.f.services;
            let steps = Steps {
                jobs: s.jobs.as_ref(),
                attestations: s.attestations.as_ref(),
                tokens: s.task_tokens.as_deref().unwrap(),
                config: &self.config,
                check: &check,
                now_ms: T,
            };
            steps.invoke(function, payload)
        }

        fn issue_token(&mut self) -> Result<String, StateError> {
            Ok(self.f.cloud.workflows().issue_token("test-execution").unwrap())
        }

        fn wait_for_token(&mut self, token: &str, timeout_s: Option<u64>) -> Result<Value, StateError> {
            assert_eq!(timeout_s, Some(DAY));
            let job = self.token_jobs[token].clone();
            let job_id = JobId::from_hex(&job).unwrap();
            match self.hosts[&job].clone() {
                Host::CommitsWhileWaiting => assert_eq!(self.host_commits(&job), Some(Completion::Completed)),
                Host::FailsWhileWaiting(reason) => assert_eq!(self.host_fails(&job, &reason), Some(Completion::Completed)),
                Host::CommitsBeforeTheRunAndAgainLater => {
                    let again = complete_bulk_task(self.f.services.jobs.as_ref(), self.tokens(), &job_id, &JobEnd::Committed);
                    self.late.push(again.unwrap().unwrap());
                }
                Host::LiesAboutCommitting => {
                    self.tokens().succeed(token, &cloud::workflow::committed_output(&job_id)).unwrap();
                }
                Host::CommitsButFailsTheToken => {
                    self.commit_receipt(&job);
                    self.tokens().fail(token, "EphemBatch.JobFailed", "stream: made up").unwrap();
                }
                Host::CommitsBeforeTheRun | Host::FailedBeforeTheRun(_) | Host::Never => {}
            }
            let workflows = self.f.cloud.workflows();
            let outcome = match workflows.outcome(token).unwrap() {
                Some(outcome) => outcome,
                None => {
                    self.waited_s += timeout_s.unwrap();
                    workflows.time_out(token).unwrap()
                }
            };
            token_result(outcome)
        }
    }

    #[test]
    fn shards_ended_before_and_after_their_token_was_written_give_a_verified_manifest() {
        let mut env = Env::new();
        let jobs = vec![
            env.shard("stores/acme/run-1/part-0.sealed", Host::CommitsBeforeTheRun),
            env.shard("stores/acme/run-1/part-1.sealed", Host::CommitsWhileWaiting),
            env.shard("stores/acme/run-1/part-2.sealed", Host::CommitsBeforeTheRunAndAgainLater),
        ];
        env.shard("stores/acme/run-2/other.sealed", Host::Never); // another run's prefix: not listed
        env.f.services.jobs.put("stores/acme/run-1/README.txt", b"not a shard", PutCondition::CreateOnly).unwrap();

        let (ending, visits) = env.run(json!({"bulk_id": "run-1", "prefix": "stores/acme/run-1/"}));
        let manifest_key = bulk::manifest_key("run-1");
        assert_eq!(ending, Ending::Succeeded(json!({"manifest_key": manifest_key, "committed": 3, "timed_out": 0, "failed": 0})));
        assert_eq!(visits["AwaitShard"], 3);
        assert_eq!(visits["ShardCommitted"], 3);
        assert_eq!(env.waited_s, 0, "no shard waited for its timeout");
        assert_eq!(env.invocations, ["bulk-list-shards", AWAIT_SHARD, AWAIT_SHARD, AWAIT_SHARD, "bulk-aggregate"]);
        // The await step completed the token first; the host's later completion was told so.
        assert_eq!(env.late, [Completion::AlreadyClosed { code: "TaskTimedOut".into() }]);
        for job in &jobs {
            let task = cloud::workflow::read_bulk_task(env.f.services.jobs.as_ref(), &JobId::from_hex(job).unwrap()).unwrap().unwrap();
            assert_eq!(task.bulk_id, "run-1");
        }

        let m = env.manifest("run-1");
        assert_eq!((m.committed, m.timed_out, m.failed, m.refused), (3, 0, 0, 0));
        assert_eq!(m.shards.iter().map(|s| s.job_id.clone()).collect::<Vec<_>>(), jobs);
        assert_eq!(m.attestation_root, hex::encode(env.enclave.anchor().sha256()));
        let ManifestStatus::Committed { receipt_key, records_ok, .. } = &m.shards[1].status else { panic!("{m:?}") };
        assert_eq!(receipt_key, &layout::job_receipt(&JobId::from_hex(&jobs[1]).unwrap()));
        assert_eq!(m.records_ok, 3 * records_ok);
        assert!(m.note.contains("signs nothing"));
    }

    #[test]
    fn a_failed_jobs_token_is_failed_and_the_shard_listed_with_its_reason() {
        let mut env = Env::new();
        let done = env.shard("stores/acme/f/a.sealed", Host::CommitsWhileWaiting);
        let failing = env.shard("stores/acme/f/b.sealed", Host::FailsWhileWaiting("stream: chunk 3 does not authenticate".into()));
        let refused = env.shard("stores/acme/f/c.sealed", Host::FailedBeforeTheRun("fleet_epoch: epoch 9 expired".into()));
        let (ending, visits) = env.run(json!({"bulk_id": "f", "prefix": "stores/acme/f/"}));
        assert_eq!(
            ending,
            Ending::Succeeded(json!({"manifest_key": "bulk/f/manifest.json", "committed": 1, "timed_out": 0, "failed": 2}))
        );
        assert_eq!(visits["ShardFailed"], 2);
        let m = env.manifest("f");
        let status = |job: &str| m.shards.iter().find(|s| s.job_id == job).unwrap().status.clone();
        assert!(matches!(status(&done), ManifestStatus::Committed { .. }));
        assert_eq!(
            status(&failing),
            ManifestStatus::Failed { error: "EphemBatch.JobFailed".into(), reason: Some("stream: chunk 3 does not authenticate".into()) }
        );
        // Failed before its token existed: the await step failed the token itself.
        assert_eq!(
            status(&refused),
            ManifestStatus::Failed { error: "EphemBatch.JobFailed".into(), reason: Some("fleet_epoch: epoch 9 expired".into()) }
        );
    }

    #[test]
    fn a_shard_whose_job_never_ends_times_out_after_a_day() {
        let mut env = Env::new();
        let done = env.shard("stores/acme/r/a.sealed", Host::CommitsWhileWaiting);
        let stuck = env.shard("stores/acme/r/b.sealed", Host::Never);
        let (ending, visits) = env.run(json!({"bulk_id": "r", "prefix": "stores/acme/r/"}));
        assert_eq!(env.waited_s, DAY);
        assert_eq!(visits["ShardTimedOut"], 1);
        assert_eq!(
            ending,
            Ending::Succeeded(json!({"manifest_key": "bulk/r/manifest.json", "committed": 1, "timed_out": 1, "failed": 0}))
        );
        let m = env.manifest("r");
        assert_eq!(m.shards.iter().find(|s| s.job_id == stuck).unwrap().status, ManifestStatus::TimedOut);
        assert!(m.shards.iter().any(|s| s.job_id == done));
        // The host that finally ends the job is told the task is closed.
        assert_eq!(env.host_commits(&stuck), Some(Completion::AlreadyClosed { code: "TaskTimedOut".into() }));
    }

    #[test]
    fn what_a_host_reports_on_the_token_is_not_trusted() {
        let mut env = Env::new();
        let liar = env.shard("stores/acme/l/a.sealed", Host::LiesAboutCommitting);
        let modest = env.shard("stores/acme/l/b.sealed", Host::CommitsButFailsTheToken);
        let (ending, _) = env.run(json!({"bulk_id": "l", "prefix": "stores/acme/l/"}));
        let Ending::Failed { error, cause } = ending else { panic!("{ending:?}") };
        assert_eq!(error, "EphemBatch.BulkError");
        assert!(cause.contains("no receipt"), "{cause}");
        let m = env.manifest("l");
        assert_eq!((m.committed, m.refused, m.failed), (1, 1, 0));
        let status = |job: &str| m.shards.iter().find(|s| s.job_id == job).unwrap().status.clone();
        assert!(matches!(status(&liar), ManifestStatus::Refused { check, .. } if check == "receipt"));
        assert!(matches!(status(&modest), ManifestStatus::Committed { .. }), "a verified receipt counts whatever the token said");
    }

    #[test]
    fn an_empty_prefix_fails_the_run() {
        let mut env = Env::new();
        let (ending, _) = env.run(json!({"bulk_id": "e", "prefix": "stores/acme/nothing/"}));
        assert_eq!(
            ending,
            Ending::Failed { error: "EphemBatch.NoShards".into(), cause: "no sealed shard under the given prefix".into() }
        );
        let (ending, _) = env.run(json!({"bulk_id": "e", "prefix": "jobs/"}));
        assert!(matches!(ending, Ending::Failed { ref cause, .. } if cause.contains("not under a store prefix")), "{ending:?}");
    }

    #[test]
    fn a_receipt_that_does_not_verify_fails_the_run_with_the_evidence_written() {
        let mut env = Env::new();
        env.shard("stores/acme/g/a.sealed", Host::CommitsWhileWaiting);
        let bad = env.shard("stores/acme/g/b.sealed", Host::CommitsWhileWaiting);
        env.forged.push(bad.clone());
        let (ending, _) = env.run(json!({"bulk_id": "g", "prefix": "stores/acme/g/"}));
        let Ending::Failed { error, cause } = ending else { panic!("{ending:?}") };
        assert_eq!(error, "EphemBatch.BulkError");
        assert!(cause.contains("receipt_key_id"), "{cause}");
        let m = env.manifest("g");
        assert_eq!((m.committed, m.refused), (1, 1));
        let refused = m.shards.iter().find(|s| s.job_id == bad).unwrap();
        assert!(matches!(&refused.status, ManifestStatus::Refused { check, .. } if check == "receipt_key_id"));
    }

    #[test]
    fn the_await_step_writes_the_token_before_it_looks() {
        let env = Env::new();
        let (bytes, job) = env.f.sealed(10);
        env.f.services.jobs.put("stores/acme/w/a.sealed", &bytes, PutCondition::CreateOnly).unwrap();
        let workflows = env.f.cloud.workflows();
        let token = workflows.issue_token("x").unwrap();
        let input = bulk::AwaitInput {
            bulk_id: "w".into(),
            bucket: BUCKET.into(),
            key: "stores/acme/w/a.sealed".into(),
            job_id: job.to_hex(),
            task_token: token.clone(),
        };
        let out = bulk::await_shard(&input, env.f.services.jobs.as_ref(), workflows.as_ref(), T).unwrap();
        assert_eq!(out.state, bulk::AwaitState::Waiting);
        let task = cloud::workflow::read_bulk_task(env.f.services.jobs.as_ref(), &job).unwrap().unwrap();
        assert_eq!((task.task_token.as_str(), task.bulk_id.as_str(), task.written_ms), (token.as_str(), "w", T));
        assert_eq!(workflows.outcome(&token).unwrap(), None);
        // Run again (a retried step) after the job ended: the new token is completed at once.
        env.commit_receipt(&job.to_hex());
        let again = bulk::AwaitInput { task_token: workflows.issue_token("x").unwrap(), ..input };
        let out = bulk::await_shard(&again, env.f.services.jobs.as_ref(), workflows.as_ref(), T).unwrap();
        assert_eq!(out.state, bulk::AwaitState::Completed);
        let done = token_result(workflows.outcome(&again.task_token).unwrap().unwrap()).unwrap();
        assert_eq!(done, json!({"job_id": job.to_hex(), "receipt_key": layout::job_receipt(&job)}));
        assert!(bulk::await_shard(&bulk::AwaitInput { job_id: "zz".into(), ..again }, env.f.services.jobs.as_ref(), workflows.as_ref(), T).is_err());
    }

    #[test]
    fn bulk_ids_cannot_escape_their_manifest_key() {
        let env = Env::new();
        for id in ["", "..", "a/b", "x y", &"a".repeat(129)] {
            let input = ListInput { bulk_id: id.into(), bucket: BUCKET.into(), prefix: "stores/acme/".into() };
            assert!(matches!(
                bulk::list_shards(&input, env.f.services.jobs.as_ref(), &env.config),
                Err(bulk::BulkError::BulkId(_))
            ));
        }
    }

    #[test]
    fn a_state_over_256_kib_fails_the_run() {
        let def = json!({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": true}}});
        let mut env = Env::new();
        let ending = Run::new(&mut env, "x").machine(&def, json!({"big": "x".repeat(MAX_STATE_BYTES)}));
        assert!(matches!(ending, Ending::Failed { ref error, .. } if error == "States.DataLimitExceeded"), "{ending:?}");
    }
}
