use super::*;
use cloud::bulk::{Manifest, ManifestStatus};
use lambdas::bulk::{self, ListInput};
use crate::local_workflow::{self, Steps, AWAIT_SHARD};
use lambdas::on_upload::Config;
use lambdas_testing::Fixture;
use cloud::messages::{Failure, JobState, JobStatus};
use cloud::workflow::{complete_bulk_task, JobEnd};
use cloud::{layout, Completion, PutCondition, TaskTokens};
use protocol::envelope::JobId;
use protocol::dev_enclave::DevEnclave;
use protocol::receipt_check::ReceiptVerifier;
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
    /// Lambda throttles each shard's await step this many times before it runs.
    throttled: u64,
    /// Await-step invocations per job, for the throttling.
    awaits: HashMap<String, u64>,
    /// The last run's history events.
    events: u64,
    /// The last run's largest state, in bytes.
    largest_state: usize,
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
            throttled: 0,
            awaits: HashMap::new(),
            events: 0,
            largest_state: 0,
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
        let mut status = JobStatus::new(job, JobState::Failed, 10);
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
        let ending = run.execute(&def, input);
        let (visits, events, largest) = (run.visits, run.events, run.largest_state);
        self.events = events;
        self.largest_state = largest;
        (ending, visits)
    }
}

impl Environment for Env {
    fn invoke(&mut self, function: &str, payload: Value) -> Result<Value, StateError> {
        self.invocations.push(function.to_owned());
        if function == AWAIT_SHARD {
            assert_eq!(payload["bucket"], BUCKET);
            let tries = self.awaits.entry(payload["job_id"].as_str().unwrap().to_owned()).or_default();
            *tries += 1;
            if *tries <= self.throttled {
                return Err(("Lambda.TooManyRequestsException".into(), "Rate Exceeded.".into()));
            }
            let token = payload["task_token"].as_str().unwrap().to_owned();
            self.token_jobs.insert(token, payload["job_id"].as_str().unwrap().to_owned());
        }
        let check = ReceiptVerifier::new(self.enclave.anchor());
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
        let task = cloud::workflow::read_bulk_task(env.f.services.jobs.as_ref(), &JobId::from_hex(job).unwrap(), "run-1").unwrap().unwrap();
        assert_eq!(task.bulk_id, "run-1");
    }

    let m = env.manifest("run-1");
    assert_eq!((m.committed, m.timed_out, m.failed, m.refused), (3, 0, 0, 0));
    assert_eq!(m.shards.iter().map(|s| s.job_id.to_hex()).collect::<Vec<_>>(), jobs);
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
    let status = |job: &str| m.shards.iter().find(|s| s.job_id.to_hex() == job).unwrap().status.clone();
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
    assert_eq!(m.shards.iter().find(|s| s.job_id.to_hex() == stuck).unwrap().status, ManifestStatus::TimedOut);
    assert!(m.shards.iter().any(|s| s.job_id.to_hex() == done));
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
    let status = |job: &str| m.shards.iter().find(|s| s.job_id.to_hex() == job).unwrap().status.clone();
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
    let refused = m.shards.iter().find(|s| s.job_id.to_hex() == bad).unwrap();
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
        job_id: job,
        task_token: token.clone(),
    };
    let out = bulk::await_shard(&input, env.f.services.jobs.as_ref(), workflows.as_ref(), T).unwrap();
    assert_eq!(out.state, bulk::AwaitState::Waiting);
    let task = cloud::workflow::read_bulk_task(env.f.services.jobs.as_ref(), &job, "w").unwrap().unwrap();
    assert_eq!((task.task_token.as_str(), task.bulk_id.as_str(), task.written_ms), (token.as_str(), "w", T));
    assert_eq!(workflows.outcome(&token).unwrap(), None);
    // Run again (a retried step) after the job ended: the new token is completed at once.
    env.commit_receipt(&job.to_hex());
    let again = bulk::AwaitInput { task_token: workflows.issue_token("x").unwrap(), ..input };
    let out = bulk::await_shard(&again, env.f.services.jobs.as_ref(), workflows.as_ref(), T).unwrap();
    assert_eq!(out.state, bulk::AwaitState::Completed);
    let done = token_result(workflows.outcome(&again.task_token).unwrap().unwrap()).unwrap();
    assert_eq!(done, json!({"job_id": job.to_hex(), "receipt_key": layout::job_receipt(&job)}));
    // A job id that is not one never becomes an input: the workflow's JSON is refused.
    let mut input = serde_json::to_value(&again).unwrap();
    input["job_id"] = json!("zz");
    assert!(serde_json::from_value::<bulk::AwaitInput>(input).is_err());
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
    let ending = Run::new(&mut env, "x").execute(&def, json!({"big": "x".repeat(MAX_STATE_BYTES)}));
    assert!(matches!(ending, Ending::Failed { ref error, .. } if error == DATA_LIMIT_EXCEEDED), "{ending:?}");
    // A Map's gathered results count even when ResultPath drops them, and States.ALL does not
    // catch the limit.
    let big = "x".repeat(MAX_STATE_BYTES / 2);
    let def = json!({"StartAt": "M", "States": {
        "M": {"Type": "Map", "ItemsPath": "$.items", "ResultPath": null, "Next": "Done",
              "ItemProcessor": {"StartAt": "P", "States": {"P": {"Type": "Pass", "Result": big, "End": true}}},
              "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Done"}]},
        "Done": {"Type": "Pass", "End": true}}});
    let ending = Run::new(&mut env, "x").execute(&def, json!({"items": [1, 2, 3]}));
    assert!(matches!(ending, Ending::Failed { ref error, ref cause } if error == DATA_LIMIT_EXCEEDED && cause.contains("Map's results")), "{ending:?}");
}

/// The client's own key shape (`submit --bulk`: `stores/<store>/incoming/<bulk_id>/part-NNNNN.sealed`
/// with its default bulk id), as many shards as the listing cap admits.
const CLIENT_BULK_ID: &str = "bulk-1761955200-0a1b2c3d";

fn client_key(i: usize) -> String {
    format!("stores/acme/incoming/{CLIENT_BULK_ID}/part-{i:05}.sealed")
}

/// How many shards of keys like `key(0)` the listing cap admits (at most `MAX_SHARDS`).
fn shards_at_the_cap(key: &str) -> usize {
    let item = serde_json::to_vec(&json!({"key": key, "job_id": "00".repeat(16)})).unwrap().len() + 1;
    bulk::MAX_SHARDS.min((bulk::MAX_LISTING_BYTES - 1) / item)
}

/// A run over `n` shards whose jobs all committed before it started.
fn run_committed(n: usize, bulk_id: &str, prefix: &str, throttled: u64, key: impl Fn(usize) -> String) -> (Env, Ending) {
    let mut env = Env::new();
    env.throttled = throttled;
    for i in 0..n {
        env.shard(&key(i), Host::CommitsBeforeTheRun);
    }
    let (ending, _) = env.run(json!({"bulk_id": bulk_id, "prefix": prefix}));
    (env, ending)
}

#[test]
fn a_run_at_the_listing_cap_with_the_clients_key_names_completes() {
    let n = shards_at_the_cap(&client_key(0));
    assert!(n > 800, "{n}");
    let prefix = format!("stores/acme/incoming/{CLIENT_BULK_ID}/");
    let (env, ending) = run_committed(n, CLIENT_BULK_ID, &prefix, 0, client_key);
    let manifest_key = bulk::manifest_key(CLIENT_BULK_ID);
    assert_eq!(ending, Ending::Succeeded(json!({"manifest_key": manifest_key, "committed": n, "timed_out": 0, "failed": 0})));
    assert_eq!(env.events, history_events(n as u64, 0));
    eprintln!("{n} client-named shards: largest state {} bytes, {} history events", env.largest_state, env.events);
    assert!(env.largest_state < MAX_STATE_BYTES / 2, "{}", env.largest_state);
    let m = env.manifest(CLIENT_BULK_ID);
    assert_eq!((m.shards.len(), m.committed), (n, n));
    assert_eq!(m.shards.iter().map(|s| s.key.clone()).collect::<Vec<_>>(), (0..n).map(client_key).collect::<Vec<_>>());
}

#[test]
fn a_run_of_a_thousand_shards_at_the_listing_cap_completes() {
    // Keys as long as a full 1000-shard listing allows.
    let key = |i: usize| format!("stores/acme/l/{i:0>22}.sealed");
    assert_eq!(shards_at_the_cap(&key(0)), bulk::MAX_SHARDS);
    // Every shard's await step throttled as often as its Retry allows: the most history a
    // 1000-shard run takes.
    let retries = await_retries();
    let (env, ending) = run_committed(bulk::MAX_SHARDS, "limit", "stores/acme/l/", retries, key);
    assert_eq!(ending, Ending::Succeeded(json!({"manifest_key": "bulk/limit/manifest.json", "committed": 1000, "timed_out": 0, "failed": 0})));
    assert_eq!(env.manifest("limit").committed, 1000);
    assert_eq!(env.events, history_events(1000, retries));
    assert!(env.events <= MAX_HISTORY_EVENTS, "{} events", env.events);
    eprintln!("1000 shards: largest state {} bytes, {} history events", env.largest_state, env.events);
    assert!(env.largest_state < MAX_STATE_BYTES / 2, "{}", env.largest_state);
}

/// The AwaitShard step's Retry budget for Lambda's throttling, from the definition.
fn await_retries() -> u64 {
    let def = local_workflow::definition(BUCKET);
    let retry = &def["States"]["AwaitShards"]["ItemProcessor"]["States"]["AwaitShard"]["Retry"][0];
    assert!(retry["ErrorEquals"].as_array().unwrap().iter().any(|e| e == "Lambda.TooManyRequestsException"));
    retry["MaxAttempts"].as_u64().unwrap()
}

/// A run's history when every shard's job committed before the run: the execution (2),
/// ListShards (5), AnyShards (2), the Map (4), per shard its iteration (2), AwaitShard (6,
/// and 3 per retried attempt) and ShardCommitted (2), then Aggregate (5).
fn history_events(shards: u64, retries_per_shard: u64) -> u64 {
    2 + 5 + 2 + 4 + shards * (2 + 6 + 3 * retries_per_shard + 2) + 5
}

/// Two shards that are one job (a sealed shard copied under a second key) are refused by name
/// when listed, before anything waits: in one run they would share one task slot, and the
/// manifest would count the job twice.
#[test]
fn two_shards_of_one_job_are_refused_by_name() {
    let mut env = Env::new();
    let (bytes, job) = env.f.sealed(10);
    for key in ["stores/acme/d/a.sealed", "stores/acme/d/b-copy.sealed"] {
        env.f.services.jobs.put(key, &bytes, PutCondition::CreateOnly).unwrap();
    }
    env.host_commits(&job.to_hex());
    env.hosts.insert(job.to_hex(), Host::CommitsBeforeTheRun);
    env.shard("stores/acme/d/c.sealed", Host::CommitsBeforeTheRun);
    let (ending, visits) = env.run(json!({"bulk_id": "d", "prefix": "stores/acme/d/"}));
    let Ending::Failed { error, cause } = ending else { panic!("{ending:?}") };
    assert_eq!(error, "EphemBatch.BulkError");
    assert_eq!(cause, format!("shards stores/acme/d/a.sealed and stores/acme/d/b-copy.sealed are the same job {job}: remove one of them"));
    assert_eq!(visits.get("AwaitShard"), None);
    assert!(env.f.services.jobs.head(&bulk::manifest_key("d")).unwrap().is_none());
}
