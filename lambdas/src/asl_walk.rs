//! Runs `lambdas/asl/bulk-workflow.asl.json` — the very file the deployment uses — with the
//! bulk handlers called in-process, by a small interpreter of the Amazon States Language
//! subset the definition uses.
//!
//! Interpreted: Task states for `lambda:invoke` (the handler is called with the resolved
//! `Payload`, its output wrapped as `{"Payload": …}`) and `aws-sdk:s3:listObjectsV2` (answered
//! from the jobs store: `KeyCount`), Choice (`NumericGreaterThan[Equals]`), Pass with
//! `Parameters`, the intrinsics `States.Format` and `States.MathAdd`, Wait (simulated time:
//! nothing sleeps), an INLINE Map (items one after the other, not 40 at a time), Fail,
//! `ResultSelector`, `ResultPath`, `OutputPath`, `Retry` on the error names, and the 256 KiB
//! limit on every state's input and output. Not covered: the Step Functions service itself
//! (IAM, Lambda's invoke envelope beyond `Payload`, real concurrency and timing, execution
//! history); moto can execute state machines but would need Docker to run Lambda tasks.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// What a run ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    Succeeded(Value),
    Failed { error: String, cause: String },
}

/// The services a run calls out to.
pub trait Environment {
    /// Invokes the Lambda function `name` with `payload`; an `Err` is (error name, cause).
    fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, (String, String)>;
    /// S3 ListObjectsV2 on `bucket` (Prefix, MaxKeys).
    fn list_objects(&mut self, bucket: &str, prefix: &str, max_keys: u64) -> Result<u64, (String, String)>;
    /// A Wait state of `seconds` is about to pass, with the state's input.
    fn wait(&mut self, seconds: u64, input: &Value);
}

/// Step Functions' limit on a state's input or output.
pub const MAX_STATE_BYTES: usize = 256 * 1024;

pub struct Run<'e> {
    env: &'e mut dyn Environment,
    /// How many times each state was entered.
    pub visits: BTreeMap<String, u64>,
    /// Simulated seconds spent in Wait states.
    pub waited_s: u64,
}

impl<'e> Run<'e> {
    pub fn new(env: &'e mut dyn Environment) -> Self {
        Self { env, visits: BTreeMap::new(), waited_s: 0 }
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
            check_size(&name, &data);
            let outcome = match state["Type"].as_str().expect("Type") {
                "Pass" => Ok(self.pass(state, data)),
                "Task" => self.task(state, data),
                "Choice" => {
                    name = choose(state, &data);
                    continue;
                }
                "Wait" => {
                    let seconds = state["Seconds"].as_u64().expect("Seconds");
                    self.env.wait(seconds, &data);
                    self.waited_s += seconds;
                    Ok(data)
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
            data = match outcome {
                Ok(d) => d,
                Err((error, cause)) => return Ending::Failed { error, cause },
            };
            check_size(&name, &data);
            if state["End"].as_bool() == Some(true) {
                return Ending::Succeeded(data);
            }
            name = state["Next"].as_str().expect("Next").to_owned();
        }
    }

    fn pass(&mut self, state: &Value, input: Value) -> Value {
        let result = match state.get("Parameters") {
            Some(p) => resolve(p, &input),
            None => input.clone(),
        };
        place(state, input, result)
    }

    fn task(&mut self, state: &Value, input: Value) -> Result<Value, (String, String)> {
        let params = resolve(&state["Parameters"], &input);
        let resource = state["Resource"].as_str().expect("Resource");
        let mut attempts = 0;
        let raw = loop {
            let result = match resource {
                "arn:aws:states:::lambda:invoke" => {
                    let function = params["FunctionName"].as_str().expect("FunctionName").to_owned();
                    self.env.invoke(&function, params["Payload"].clone()).map(|p| json!({"Payload": p, "StatusCode": 200}))
                }
                "arn:aws:states:::aws-sdk:s3:listObjectsV2" => {
                    let count = self.env.list_objects(
                        params["Bucket"].as_str().expect("Bucket"),
                        params["Prefix"].as_str().expect("Prefix"),
                        params["MaxKeys"].as_u64().unwrap_or(1000),
                    )?;
                    Ok(json!({"KeyCount": count, "IsTruncated": false}))
                }
                other => panic!("task resource {other} is not interpreted"),
            };
            match result {
                Ok(v) => break v,
                Err((error, cause)) => {
                    attempts += 1;
                    if !retries(state, &error, attempts) {
                        return Err((error, cause));
                    }
                }
            }
        };
        let result = match state.get("ResultSelector") {
            Some(s) => resolve(s, &raw),
            None => raw,
        };
        Ok(place(state, input, result))
    }

    fn map(&mut self, state: &Value, input: Value) -> Result<Value, (String, String)> {
        let items = path(&input, state["ItemsPath"].as_str().unwrap_or("$")).as_array().cloned().expect("ItemsPath is an array");
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match self.machine(&state["ItemProcessor"], item) {
                Ending::Succeeded(v) => out.push(v),
                Ending::Failed { error, cause } => return Err((error, cause)),
            }
        }
        Ok(place(state, input, Value::Array(out)))
    }
}

/// `ResultPath` then `OutputPath`.
fn place(state: &Value, input: Value, result: Value) -> Value {
    let combined = match state.get("ResultPath").and_then(Value::as_str) {
        None | Some("$") => result,
        Some(p) => {
            let mut data = input;
            let keys: Vec<&str> = p.strip_prefix("$.").expect("ResultPath $.x").split('.').collect();
            let (last, parents) = keys.split_last().expect("a key");
            let mut at = &mut data;
            for k in parents {
                at = at.as_object_mut().expect("object").entry(k.to_string()).or_insert(json!({}));
            }
            at.as_object_mut().expect("object").insert(last.to_string(), result);
            data
        }
    };
    match state.get("OutputPath").and_then(Value::as_str) {
        None | Some("$") => combined,
        Some(p) => path(&combined, p).clone(),
    }
}

fn retries(state: &Value, error: &str, attempts: u64) -> bool {
    state["Retry"].as_array().into_iter().flatten().any(|r| {
        let names = r["ErrorEquals"].as_array().expect("ErrorEquals");
        let matches = names.iter().any(|n| n == error || n == "States.ALL");
        matches && attempts <= r["MaxAttempts"].as_u64().unwrap_or(3)
    })
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

/// Parameters / ResultSelector: `"key.$"` values are paths or intrinsics, others literal.
fn resolve(template: &Value, data: &Value) -> Value {
    match template {
        Value::Object(fields) => {
            let mut out = Map::new();
            for (k, v) in fields {
                match k.strip_suffix(".$") {
                    Some(name) => {
                        out.insert(name.to_owned(), expression(v.as_str().expect("a path"), data));
                    }
                    None => {
                        out.insert(k.clone(), resolve(v, data));
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn expression(expr: &str, data: &Value) -> Value {
    if expr.starts_with('$') {
        return path(data, expr).clone();
    }
    let (name, args) = expr.split_once('(').expect("an intrinsic");
    let args: Vec<Value> = split_args(args.strip_suffix(')').expect(")")).iter().map(|a| argument(a, data)).collect();
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
        "States.MathAdd" => json!(args[0].as_i64().expect("int") + args[1].as_i64().expect("int")),
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

fn argument(a: &str, data: &Value) -> Value {
    if let Some(s) = a.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        Value::String(s.to_owned())
    } else if a.starts_with('$') {
        path(data, a).clone()
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

fn check_size(state: &str, data: &Value) {
    let size = serde_json::to_vec(data).expect("json").len();
    assert!(size <= MAX_STATE_BYTES, "state {state}: {size} bytes exceed Step Functions' {MAX_STATE_BYTES}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bulk::{self, AggregateInput, ListInput, Manifest, ManifestStatus};
    use crate::on_upload::Config;
    use crate::testing::Fixture;
    use cloud::{layout, PutCondition};
    use protocol::envelope::JobId;
    use receipts_ledger::testing::DevEnclave;
    use receipts_ledger::ProtocolReceipts;
    use std::collections::HashMap;

    const T: u64 = 1_761_955_200_000;
    const BUCKET: &str = "ephem-jobs-test";

    /// The definition with the deployment's substitutions, as CDK fills them.
    fn definition() -> Value {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/asl/bulk-workflow.asl.json")).unwrap();
        let text = text
            .replace("${BulkListShardsFunctionArn}", "bulk-list-shards")
            .replace("${BulkAggregateFunctionArn}", "bulk-aggregate")
            .replace("${JobsBucketName}", BUCKET);
        serde_json::from_str(&text).unwrap()
    }

    /// The bulk Lambdas over a local cloud; receipts are committed by `at_poll`.
    struct Env {
        f: Fixture,
        enclave: DevEnclave,
        config: Config,
        /// job id → the poll count at which its receipt appears (never, if absent).
        at_poll: HashMap<String, u64>,
        /// Receipts signed by a key the attestation does not bind.
        forged: Vec<String>,
        invocations: Vec<String>,
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
                at_poll: HashMap::new(),
                forged: Vec::new(),
                invocations: Vec::new(),
            }
        }

        fn shard(&self, key: &str) -> String {
            let (bytes, job) = self.f.sealed(10);
            self.f.services.jobs.put(key, &bytes, PutCondition::CreateOnly).unwrap();
            job.to_hex()
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
    }

    impl Environment for Env {
        fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, (String, String)> {
            self.invocations.push(function.to_owned());
            let failed = |e: bulk::BulkError| ("EphemBatch.BulkError".to_owned(), e.to_string());
            match function {
                "bulk-list-shards" => {
                    let input: ListInput = serde_json::from_value(payload).unwrap();
                    bulk::list_shards(&input, self.f.services.jobs.as_ref(), &self.config)
                        .map(|o| serde_json::to_value(o).unwrap())
                        .map_err(failed)
                }
                "bulk-aggregate" => {
                    let input: AggregateInput = serde_json::from_value(payload).unwrap();
                    let check = ProtocolReceipts::new(self.enclave.anchor());
                    bulk::aggregate(&input, self.f.services.jobs.as_ref(), self.f.services.attestations.as_ref(), &check, T)
                        .map(|o| serde_json::to_value(o).unwrap())
                        .map_err(failed)
                }
                other => panic!("no function {other}"),
            }
        }

        fn list_objects(&mut self, bucket: &str, prefix: &str, max_keys: u64) -> Result<u64, (String, String)> {
            assert_eq!(bucket, BUCKET);
            Ok((self.f.services.jobs.list(prefix).unwrap().len() as u64).min(max_keys))
        }

        fn wait(&mut self, seconds: u64, input: &Value) {
            assert_eq!(seconds, 30);
            let job = input["shard"]["job_id"].as_str().unwrap().to_owned();
            // The receipt of this shard appears during the wait after its `at_poll`-th look.
            if self.at_poll.get(&job) == Some(&input["polls"].as_u64().unwrap()) {
                self.commit_receipt(&job);
            }
        }
    }

    fn manifest(env: &Env, bulk_id: &str) -> Manifest {
        serde_json::from_slice(&env.f.services.jobs.get(&bulk::manifest_key(bulk_id)).unwrap()).unwrap()
    }

    #[test]
    fn every_shard_committed_gives_a_verified_manifest() {
        let mut env = Env::new();
        let jobs: Vec<String> = (0..3).map(|i| env.shard(&format!("stores/acme/run-1/part-{i}.sealed"))).collect();
        env.shard("stores/acme/run-2/other.sealed"); // another run's prefix: not listed
        env.f.services.jobs.put("stores/acme/run-1/README.txt", b"not a shard", PutCondition::CreateOnly).unwrap();
        env.commit_receipt(&jobs[0]); // already done before the run starts
        env.at_poll.insert(jobs[1].clone(), 0);
        env.at_poll.insert(jobs[2].clone(), 5);

        let def = definition();
        let mut run = Run::new(&mut env);
        let ending = run.machine(&def, json!({"bulk_id": "run-1", "prefix": "stores/acme/run-1/"}));
        let (visits, waited) = (run.visits.clone(), run.waited_s);
        let manifest_key = bulk::manifest_key("run-1");
        assert_eq!(ending, Ending::Succeeded(json!({"manifest_key": manifest_key, "committed": 3, "timed_out": 0})));
        assert_eq!(visits["LookForReceipt"], 1 + 2 + 7);
        assert_eq!(visits["WaitBeforeNextLook"], 1 + 6);
        assert_eq!(waited, 7 * 30);
        assert_eq!(env.invocations, vec!["bulk-list-shards", "bulk-aggregate"]);

        let m = manifest(&env, "run-1");
        assert_eq!((m.committed, m.timed_out, m.refused), (3, 0, 0));
        assert_eq!(m.shards.iter().map(|s| s.job_id.clone()).collect::<Vec<_>>(), jobs);
        assert_eq!(m.attestation_root, hex::encode(env.enclave.anchor().sha256()));
        let ManifestStatus::Committed { receipt_key, records_ok, .. } = &m.shards[1].status else { panic!("{m:?}") };
        assert_eq!(receipt_key, &layout::job_receipt(&JobId::from_hex(&jobs[1]).unwrap()));
        assert_eq!(m.records_ok, 3 * records_ok);
        assert!(m.note.contains("signs nothing"));
    }

    #[test]
    fn a_shard_without_a_receipt_times_out_after_a_day() {
        let mut env = Env::new();
        let done = env.shard("stores/acme/r/a.sealed");
        let stuck = env.shard("stores/acme/r/b.sealed");
        env.at_poll.insert(done.clone(), 0);
        let def = definition();
        let mut run = Run::new(&mut env);
        let ending = run.machine(&def, json!({"bulk_id": "r", "prefix": "stores/acme/r/"}));
        assert!(run.waited_s >= 24 * 3600, "{}", run.waited_s);
        assert_eq!(
            ending,
            Ending::Succeeded(json!({"manifest_key": "bulk/r/manifest.json", "committed": 1, "timed_out": 1}))
        );
        let m = manifest(&env, "r");
        let stuck_entry = m.shards.iter().find(|s| s.job_id == stuck).unwrap();
        assert_eq!(stuck_entry.status, ManifestStatus::TimedOut);
    }

    #[test]
    fn an_empty_prefix_fails_the_run() {
        let mut env = Env::new();
        let def = definition();
        let ending = Run::new(&mut env).machine(&def, json!({"bulk_id": "e", "prefix": "stores/acme/nothing/"}));
        assert_eq!(
            ending,
            Ending::Failed { error: "EphemBatch.NoShards".into(), cause: "no sealed shard under the given prefix".into() }
        );
        let ending = Run::new(&mut env).machine(&def, json!({"bulk_id": "e", "prefix": "jobs/"}));
        assert!(matches!(ending, Ending::Failed { ref cause, .. } if cause.contains("not under a store prefix")), "{ending:?}");
    }

    #[test]
    fn a_receipt_that_does_not_verify_fails_the_run_with_the_evidence_written() {
        let mut env = Env::new();
        let good = env.shard("stores/acme/f/a.sealed");
        let bad = env.shard("stores/acme/f/b.sealed");
        env.forged.push(bad.clone());
        env.at_poll.insert(good, 0);
        env.at_poll.insert(bad.clone(), 0);
        let def = definition();
        let ending = Run::new(&mut env).machine(&def, json!({"bulk_id": "f", "prefix": "stores/acme/f/"}));
        let Ending::Failed { error, cause } = ending else { panic!("{ending:?}") };
        assert_eq!(error, "EphemBatch.BulkError");
        assert!(cause.contains("receipt_key_id"), "{cause}");
        let m = manifest(&env, "f");
        assert_eq!((m.committed, m.refused), (1, 1));
        let refused = m.shards.iter().find(|s| s.job_id == bad).unwrap();
        assert!(matches!(&refused.status, ManifestStatus::Refused { check, .. } if check == "receipt_key_id"));
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
}
