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
//! (including `null`), `OutputPath`, `Retry` and `Catch` on the error names (`States.ALL`), Pass
//! `Result`, and the 256 KiB limit on every state's input and output and on a Map's gathered
//! results (`States.DataLimitExceeded`). The events of the execution's history are counted as
//! Step Functions records them ([`Run::events`]; an execution holds at most 25,000). Not
//! covered: the Step Functions service itself (IAM, Lambda's invoke envelope beyond `Payload`,
//! real concurrency). A construct outside this subset panics: the definition is fixed and its
//! tests walk every state.

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

/// Step Functions' limit on a state's input or output (UTF-8 JSON).
pub const MAX_STATE_BYTES: usize = 256 * 1024;
/// Step Functions' limit on the events of one execution's history; a Standard execution that
/// reaches it fails.
pub const MAX_HISTORY_EVENTS: u64 = 25_000;
pub const TIMEOUT: &str = "States.Timeout";
/// A state's input, output or a task's parameters over [`MAX_STATE_BYTES`]: terminal, never
/// retried or caught (not even by `States.ALL`).
pub const DATA_LIMIT_EXCEEDED: &str = "States.DataLimitExceeded";
/// An environment's way to end a run at once (its runtime is stopping): never retried or
/// caught, unlike every error Step Functions itself names.
pub const ABORTED: &str = "Runtime.Aborted";

pub struct Run<'e> {
    env: &'e mut dyn Environment,
    /// The context object (`$$`): the execution, and the Map item being processed.
    context: Value,
    /// How many times each state was entered.
    pub visits: BTreeMap<String, u64>,
    /// The events the execution's history would hold, counted as Step Functions records them
    /// ([`Run::execute`]): an execution may hold at most [`MAX_HISTORY_EVENTS`].
    pub events: u64,
    /// The largest input or output of a state so far, in bytes of JSON.
    pub largest_state: usize,
}

impl<'e> Run<'e> {
    pub fn new(env: &'e mut dyn Environment, execution_id: &str) -> Self {
        Self { env, context: json!({"Execution": {"Id": execution_id}}), visits: BTreeMap::new(), events: 0, largest_state: 0 }
    }

    /// Runs an execution of `definition` on `input`: its states, and the two events of the
    /// execution's own start and end.
    pub fn execute(&mut self, definition: &Value, input: Value) -> Ending {
        self.events += 2;
        self.machine(definition, input)
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
            // <Type>StateEntered and <Type>StateExited (a Fail state's exit is the execution's).
            self.events += 2;
            match check_size(&name, &data) {
                Ok(size) => self.largest_state = self.largest_state.max(size),
                Err((error, cause)) => return Ending::Failed { error, cause },
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
            let outcome = outcome.and_then(|d| {
                self.largest_state = self.largest_state.max(check_size(&name, &d)?);
                Ok(d)
            });
            data = match outcome {
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
        let result = match (state.get("Parameters"), state.get("Result")) {
            (Some(p), _) => resolve(p, &input, &self.context),
            (None, Some(r)) => r.clone(),
            (None, None) => input.clone(),
        };
        place(state, input, result)
    }

    fn task(&mut self, state: &Value, input: Value) -> Result<Value, StateError> {
        let resource = state["Resource"].as_str().expect("Resource");
        let timeout_s = state.get("TimeoutSeconds").map(|t| t.as_u64().expect("TimeoutSeconds"));
        let mut attempts = 0;
        let raw = loop {
            // TaskScheduled, TaskStarted, then TaskSucceeded, TaskFailed or TaskTimedOut.
            self.events += 3;
            let result = match resource {
                "arn:aws:states:::lambda:invoke" => {
                    let params = resolve(&state["Parameters"], &input, &self.context);
                    check_size("the task's parameters", &params)?;
                    let function = params["FunctionName"].as_str().expect("FunctionName").to_owned();
                    let payload = self.env.invoke(&function, params["Payload"].clone())?;
                    check_size("the function's result", &payload)?;
                    Ok(json!({"Payload": payload, "StatusCode": 200}))
                }
                "arn:aws:states:::lambda:invoke.waitForTaskToken" => self.wait_for_token(state, &input, timeout_s),
                other => panic!("task resource {other} is not interpreted"),
            };
            match result {
                Ok(v) => break v,
                Err((error, cause)) => {
                    attempts += 1;
                    if error == ABORTED || error == DATA_LIMIT_EXCEEDED || !retries(state, &error, attempts) {
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
        check_size("the task's parameters", &params)?;
        let function = params["FunctionName"].as_str().expect("FunctionName").to_owned();
        self.env.invoke(&function, params["Payload"].clone())?;
        // TaskSubmitted: the function returned, the task waits for its token.
        self.events += 1;
        self.env.wait_for_token(&token, timeout_s)
    }

    fn map(&mut self, state: &Value, input: Value) -> Result<Value, StateError> {
        let items = path(&input, state["ItemsPath"].as_str().unwrap_or("$")).as_array().cloned().expect("ItemsPath is an array");
        let mut out = Vec::with_capacity(items.len());
        // MapStateStarted, MapStateSucceeded (or Failed); per item MapIterationStarted and
        // MapIterationSucceeded (or Failed).
        self.events += 2 + 2 * items.len() as u64;
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
        // The results gathered are a result like any other, whatever ResultPath keeps of them.
        let results = Value::Array(out);
        check_size("the Map's results", &results)?;
        Ok(place(state, input, results))
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

/// `States.ALL` matches every error but the two terminal ones, as in Step Functions.
fn matches_error(names: &Value, error: &str) -> bool {
    let terminal = matches!(error, DATA_LIMIT_EXCEEDED | "States.Runtime");
    names.as_array().expect("ErrorEquals").iter().any(|n| n == error || (n == "States.ALL" && !terminal))
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

/// The size of `data` as JSON, if within [`MAX_STATE_BYTES`].
fn check_size(state: &str, data: &Value) -> Result<usize, StateError> {
    let size = serde_json::to_vec(data).expect("json").len();
    if size > MAX_STATE_BYTES {
        return Err((DATA_LIMIT_EXCEEDED.into(), format!("state {state}: {size} bytes exceed Step Functions' {MAX_STATE_BYTES}")));
    }
    Ok(size)
}

/// How a closed token ends its task, as Step Functions reports it.
pub fn token_result(outcome: cloud_local::TokenOutcome) -> Result<Value, StateError> {
    use cloud_local::TokenOutcome;
    match outcome {
        TokenOutcome::Succeeded { output } => {
            serde_json::from_str(&output).map_err(|e| ("States.Runtime".to_owned(), format!("the task's output is not JSON: {e}")))
        }
        TokenOutcome::Failed { error, cause } => Err((error, cause)),
        TokenOutcome::TimedOut => Err((TIMEOUT.to_owned(), "the task's token was not completed within its TimeoutSeconds".to_owned())),
    }
}

#[cfg(test)]
mod tests;
