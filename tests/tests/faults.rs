//! Fault injection on the local stack, through the real binaries: a SIGKILL of the host-poller
//! or of the enclave worker in the middle of a job, and of the ledger appender (the local Lambda
//! runtime, `ephem-batch dev run-lambdas`) in the middle of a batch of appends; a duplicate
//! delivery; disk full on the client's and on the host's results path; KMS down while a worker
//! needs its keys. After `dev up`
//! again every job completes exactly once: one receipt, one ledger entry (read from the ledger
//! itself), every input record back as an embedding or an error, and `verify` passes.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud::kms::{DataKey, DataKeyPair, Decrypted, EncryptionContext};
use cloud_local::KmsEndpoint;
use cloud::{AwsCredentials, Kms, KmsError, Queue, Recipient, SendOptions};
use protocol::envelope::JobId;
use serde_json::Value;
use tests::{json, json_lines, process, short_corpus, wait_until, Stack};

/// The job queue's visibility timeout for these stacks (the host-poller reads it from its
/// environment): a message whose host died is received again after this long, not a minute.
const VISIBILITY_S: &str = "6";
const JOB_TIMEOUT: Duration = Duration::from_secs(150);

fn stack() -> Stack {
    Stack::up_with(&[("EPHEM_VISIBILITY_S", OsStr::new(VISIBILITY_S))])
}

/// `submit FILE --json` without waiting: the job id.
fn submit(stack: &Stack, corpus: &Path) -> String {
    let report = json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--json"]));
    report["job_id"].as_str().expect("a job id").to_owned()
}

fn state(status: &Value) -> &str {
    status["state"].as_str().unwrap_or("?")
}

/// Waits until the job's receipt is committed and the ledger marker is written.
fn wait_completed_and_ledgered(stack: &Stack, job: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let last = stack.status(job);
        if state(&last) == "completed" && last["ledger"]["index"].is_u64() {
            return last;
        }
        assert_ne!(state(&last), "failed", "job {job} failed: {last}");
        assert!(Instant::now() < deadline, "job {job} not completed and ledgered after {timeout:?}: {last}\n{}", tests::log_tails(stack.home(), &["host-poller", "lambdas"], 30));
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Exactly once, checked from every side: one row for the job in the ledger, the ledger
/// replays, `verify` exits 0, and the results hold every input id once (embedded or error).
fn assert_exactly_once(stack: &Stack, job: &str, ids: &[String], work: &Path) {
    let rows = stack.ledger_rows(job);
    assert_eq!(rows.len(), 1, "ledger rows for job {job}: {rows:?}");
    stack.ok(&["ledger", "verify"]);
    let verify = stack.cli(&["verify", job]);
    assert!(verify.status.success(), "verify {job}:\n{}", stack.describe(&verify));

    let out = work.join(format!("{job}.jsonl"));
    stack.ok(&["results", job, "-o", out.to_str().unwrap()]);
    let mut seen: Vec<String> = json_lines(&out).iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
    let errors = json_lines(&work.join(format!("{job}.errors.jsonl")));
    seen.extend(errors.iter().map(|e| e["id"].as_str().unwrap_or("<no id>").to_owned()));
    seen.sort();
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(seen.len(), expected.len(), "records out vs in");
    assert_eq!(seen, expected, "every input record once, in output or errors");
    assert!(errors.is_empty(), "no record of a clean corpus fails: {errors:?}");
}

/// Waits until the job is in progress with some records done but not all, then SIGKILLs
/// `victim` and starts the stack again: the job must still complete exactly once.
fn kill_mid_job(victim: &str, records: usize) {
    let started = Instant::now();
    let stack = stack();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    let ids = short_corpus(&corpus, victim, records);
    let job = submit(&stack, &corpus);

    // In progress: received, its attempt started on the worker, no receipt yet.
    let mut seen = Value::Null;
    wait_until("the job to be in flight", Duration::from_secs(120), || {
        seen = stack.status(&job);
        assert_ne!(state(&seen), "completed", "the job finished before it could be interrupted: use a bigger corpus");
        state(&seen) == "in_progress"
    });
    let pid = stack.pid(victim).unwrap_or_else(|| panic!("{victim} is not running"));
    process::kill9(pid);
    let done_at_kill = seen["status"]["records_done"].as_u64().unwrap_or(0);
    eprintln!("{victim} (pid {pid}) killed with {done_at_kill} of {records} records done");
    assert!(done_at_kill < records as u64, "killed after the last record: {seen}");

    stack.start();
    let end = wait_completed_and_ledgered(&stack, &job, JOB_TIMEOUT);
    let attempt = end["status"]["attempt"].as_u64().unwrap_or(0);
    assert!(attempt >= 2, "the receipt is of a later attempt than the killed one: {end}");
    assert_exactly_once(&stack, &job, &ids, work.path());
    // One committed output: the killed attempt's upload was abandoned, not published.
    let attempts = tests::files_under(&stack.home().join("objects/jobs/jobs").join(&job).join("attempts"));
    assert_eq!(attempts.len(), 1, "committed attempt outputs: {attempts:?}");
    eprintln!("kill -9 {victim}: exactly once in {:.1}s", started.elapsed().as_secs_f64());
}

#[test]
fn host_poller_killed_mid_job_then_restarted_completes_the_job_exactly_once() {
    kill_mid_job("host-poller", 1500);
}

#[test]
fn worker_killed_mid_job_completes_the_job_exactly_once() {
    kill_mid_job("enclave-worker", 1500);
}

/// Stops `pid` (SIGSTOP) at a moment it holds no write lock on the local cloud's databases: a
/// process frozen inside a write transaction locks every other process out of that database
/// ("database is locked" for as long as it stays stopped). Stopped, the databases probed for a
/// write lock; if one is held, resumed and tried again.
fn stop_outside_a_write(stack: &Stack, pid: u32) {
    let writable = |path: &Path| {
        rusqlite::Connection::open(path)
            .and_then(|db| db.busy_timeout(Duration::ZERO).and_then(|()| db.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")))
            .is_ok()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        process::signal(pid, "STOP");
        let databases = std::fs::read_dir(stack.home()).unwrap().map(|entry| entry.unwrap().path());
        if databases.filter(|path| path.extension() == Some(OsStr::new("sqlite"))).all(|path| writable(&path)) {
            return;
        }
        process::signal(pid, "CONT");
        assert!(Instant::now() < deadline, "pid {pid} held a database write lock every time it was stopped for 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The appender is stopped (SIGSTOP) while jobs commit their receipts, so the ledger queue
/// fills; it is resumed and SIGKILLed as soon as it has received the batch (messages in
/// flight: appending, not yet acknowledged). The restarted appender receives the batch again
/// when its visibility timeout ends, and appends each job once.
#[test]
fn ledger_appender_killed_mid_append_appends_each_receipt_once() {
    let started = Instant::now();
    let stack = stack();
    let work = tempfile::tempdir().unwrap();
    let appender = stack.pid("lambdas").expect("the local Lambda runtime runs");
    stop_outside_a_write(&stack, appender);

    let mut jobs = Vec::new();
    for n in 0..6 {
        let corpus = work.path().join(format!("corpus-{n}.jsonl"));
        let ids = short_corpus(&corpus, &format!("ledger-{n}"), 5);
        jobs.push((submit(&stack, &corpus), ids));
    }
    wait_until("every receipt committed", JOB_TIMEOUT, || jobs.iter().all(|(job, _)| state(&stack.status(job)) == "completed"));
    let local = cloud_local::LocalCloud::open(stack.home()).expect("the local cloud");
    let ledger_queue = local.services().ledger_queue;
    wait_until("the receipts on the ledger queue", Duration::from_secs(30), || {
        ledger_queue.stats().map(|s| s.visible).unwrap_or(0) >= jobs.len() as u64
    });

    process::signal(appender, "CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while ledger_queue.stats().map(|s| s.in_flight).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "the appender did not receive the batch");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Frozen the moment it holds the batch, then killed: what it had not acknowledged by then
    // stays unacknowledged, however loaded the machine.
    process::signal(appender, "STOP");
    process::kill9(appender);
    let ledgered_at_kill = jobs.iter().filter(|(job, _)| stack.status(job)["ledger"]["index"].is_u64()).count();
    let stats = ledger_queue.stats().unwrap();
    eprintln!("appender killed mid-batch: {ledgered_at_kill} of {} appended, {} messages unacknowledged", jobs.len(), stats.in_flight);
    assert!(stats.in_flight > 0, "killed after the batch was acknowledged");

    stack.start();
    for (job, ids) in &jobs {
        wait_completed_and_ledgered(&stack, job, JOB_TIMEOUT);
        assert_exactly_once(&stack, job, ids, work.path());
    }
    let all = json(&stack.ok(&["ledger", "query", "--json"]));
    assert_eq!(all.as_array().unwrap().len(), jobs.len(), "one ledger entry per job, no more");
    eprintln!("kill -9 appender: exactly once in {:.1}s", started.elapsed().as_secs_f64());

    // Duplicate delivery: a finished job's message arrives twice more. No rework (the receipt
    // is the same object), no second ledger entry.
    let (job, _) = &jobs[0];
    let receipt_key = cloud::layout::job_receipt(&JobId::from_hex(job).unwrap());
    let jobs_store = &local.services().jobs;
    let receipt = jobs_store.get(&receipt_key).unwrap();
    let job_queue = local.services().job_queue;
    for _ in 0..2 {
        job_queue.send(&job_message(&stack, job), &SendOptions::default()).unwrap();
    }
    wait_until("the duplicates to be handled", Duration::from_secs(60), || {
        job_queue.stats().is_ok_and(|s| s.visible + s.in_flight + s.delayed == 0)
    });
    assert_eq!(jobs_store.get(&receipt_key).unwrap(), receipt, "the receipt is untouched");
    assert_eq!(stack.ledger_rows(job).len(), 1, "a duplicate delivery adds no ledger entry");
    let all = json(&stack.ok(&["ledger", "query", "--json"]));
    assert_eq!(all.as_array().unwrap().len(), jobs.len());
    let log = std::fs::read_to_string(stack.home().join("logs/host-poller.log")).unwrap();
    assert!(log.matches("disposition=Duplicate").count() >= 2, "handled as duplicates, not reworked");
}

/// The job message `on-upload` sent for `job`, rebuilt from what the client remembers of it.
fn job_message(stack: &Stack, job: &str) -> String {
    let state = json(&std::fs::read_to_string(stack.home().join("client/jobs").join(job).join("job.json")).unwrap());
    let message = cloud::messages::JobMessage {
        job_id: job.parse().unwrap(),
        input_key: cloud::layout::job_input(&JobId::from_hex(job).unwrap()),
        input_size: state["sealed_size"].as_u64().unwrap(),
        model_id: state["model_id"].as_str().unwrap().to_owned(),
        manifest_hash: state["manifest_hash"].as_str().unwrap().to_owned(),
        epoch: state["epoch"].as_u64().unwrap(),
        record_count: state["records"].as_u64().unwrap(),
        created_ms: cloud::now_ms(),
        earlier_receives: 0,
    };
    serde_json::to_string(&message).unwrap()
}

/// Whether this machine lets us make a private user and mount namespace (to mount a small
/// tmpfs); `EPHEM_TEST_NO_NAMESPACES=1` tests the fallbacks.
fn namespaces() -> bool {
    std::env::var_os("EPHEM_TEST_NO_NAMESPACES").is_none()
        && std::process::Command::new("unshare").args(["-rm", "true"]).output().is_ok_and(|p| p.status.success())
}

/// Runs `ephem-batch results JOB -o DIR/out.jsonl` where writing fails with ENOSPC: in a
/// private user and mount namespace with a 64 KiB tmpfs on DIR, or, where namespaces are not
/// available, with the output's partial file a link to `/dev/full`. Returns the command's
/// output and the names left in DIR afterwards.
fn results_on_a_full_disk(stack: &Stack, job: &str, dir: &Path) -> (std::process::Output, Vec<String>) {
    let bin = tests::bin_dir().join("ephem-batch");
    let script = r#"mount -t tmpfs -o size=64k tmpfs "$1" || exit 90
"$2" --home "$3" results "$4" -o "$1/out.jsonl"; rc=$?
echo "--- left:"; ls -A "$1"; exit $rc"#;
    if namespaces() {
        let mut namespaced = std::process::Command::new("unshare");
        namespaced.args(["-rm", "sh", "-c", script, "sh"]).arg(dir).arg(&bin).arg(stack.home()).arg(job);
        namespaced.env("EPHEM_BIN_DIR", tests::bin_dir()).env_remove("EPHEM_HOME");
        let output = namespaced.output().expect("run unshare");
        assert_ne!(output.status.code(), Some(90), "tmpfs mount failed:\n{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let left = stdout.split("--- left:\n").nth(1).unwrap_or("").lines().map(str::to_owned).collect();
        return (output, left);
    }
    eprintln!("no user namespaces here: ENOSPC from /dev/full");
    std::os::unix::fs::symlink("/dev/full", dir.join("out.jsonl.partial")).unwrap();
    let output = stack.cli(&["results", job, "-o", dir.join("out.jsonl").to_str().unwrap()]);
    let left = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    (output, left)
}

/// Disk full on the client's results path: `results` fails naming the cause and the file,
/// nothing is left under a final name (nor a partial file), and the job's results are intact:
/// the same command with room to write gets every record.
#[test]
fn results_on_a_full_disk_fail_cleanly_and_publish_nothing() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    let ids = short_corpus(&corpus, "full-disk", 60);
    let report = json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--wait", "--json"]));
    let job = report["job_id"].as_str().unwrap().to_owned();

    let full = work.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let (output, left) = results_on_a_full_disk(&stack, &job, &full);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "results on a full disk succeeded:\n{}", stack.describe(&output));
    assert!(stderr.contains("No space left on device"), "the cause is named: {stderr}");
    assert!(stderr.contains("out.jsonl"), "the file is named: {stderr}");
    assert!(left.is_empty(), "nothing published and no partial file left: {left:?}");
    eprintln!("results on a full disk: {}", stderr.lines().last().unwrap_or(""));

    assert_exactly_once(&stack, &job, &ids, work.path());
}

/// Disk full on the host's results path: the stack runs in a private user and mount namespace
/// with a tmpfs on the jobs store too small for the job's sealed output. Every attempt fails on
/// ENOSPC, the job is dead-lettered after the receive limit with that reason, `status` says
/// `failed` with it, and nothing of the output is committed (no attempt object, no receipt).
#[test]
fn a_full_jobs_store_fails_the_job_with_the_cause_and_commits_nothing() {
    if !namespaces() {
        eprintln!("skipped: no user namespaces here to mount a small file system for the host's store");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "full-store", 200);
    let bin = tests::bin_dir().join("ephem-batch");
    // 96 KiB: room for the sealed input (~15 KB), the status object and the attempt's first
    // output frames, not for 200 × 384 sealed floats.
    let script = r#"
set -u
B="$1"; H="$2"; C="$3"
mkdir -p "$H/objects/jobs" && mount -t tmpfs -o size=96k tmpfs "$H/objects/jobs" || exit 90
"$B" --home "$H" dev up --threads 2 --concurrency 1 >&2 || exit 91
job=$("$B" --home "$H" submit "$C" --json | sed -n 's/.*"job_id":"\([0-9a-f]*\)".*/\1/p')
[ -n "$job" ] || exit 92
i=0
while [ $i -lt 600 ]; do
    state=$("$B" --home "$H" status "$job" --json | sed -n 's/^  "state": "\([a-z_]*\)".*/\1/p')
    [ "$state" = failed ] || [ "$state" = completed ] && break
    sleep 0.2; i=$((i + 1))
done
echo "--- status"; "$B" --home "$H" status "$job" --json
echo "--- text"; "$B" --home "$H" status "$job"
echo "--- files"; (cd "$H/objects/jobs" && find . -type f)
"$B" --home "$H" dev down >&2
"#;
    let started = Instant::now();
    let output = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", script, "sh"])
        .arg(&bin)
        .arg(home.path())
        .arg(&corpus)
        .env("EPHEM_MODEL_DIR", tests::model_dir())
        .env("EPHEM_BIN_DIR", tests::bin_dir())
        .env("EPHEM_RETRY_BASE_MS", "200")
        .env("EPHEM_RETRY_MAX_S", "1")
        .env_remove("EPHEM_HOME")
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let context = format!("{stdout}\n--- stderr\n{}{}", String::from_utf8_lossy(&output.stderr), tests::log_tails(home.path(), &["host-poller"], 40));
    assert!(output.status.success(), "{context}");
    let section = |name: &str| stdout.split(&format!("--- {name}\n")).nth(1).unwrap_or("").split("\n--- ").next().unwrap_or("").to_owned();
    let status = json(&section("status"));
    assert_eq!(status["state"], "failed", "{context}");
    let failure = &status["status"]["failure"];
    assert_eq!(failure["check"], "dead_letter", "{context}");
    let message = failure["message"].as_str().unwrap();
    assert!(message.starts_with("output: ") && message.contains("No space left on device"), "the reason names the cause: {message}");
    assert!(message.contains("receive 5 of 5"), "after the receive limit: {message}");
    assert!(section("text").contains("No space left on device"), "`status` shows the reason:\n{}", section("text"));
    let files = section("files");
    assert!(!files.contains("/attempts/") && !files.contains("receipt"), "no output committed:\n{files}");
    assert!(!files.contains("./.tmp/"), "no temporary output left:\n{files}");
    eprintln!("full jobs store: dead-lettered with the cause in {:.1}s", started.elapsed().as_secs_f64());
}

/// KMS as it is while down: every call fails with `KMSInternalException`; calls are counted.
#[derive(Default)]
struct DownKms {
    calls: AtomicU64,
}

impl DownKms {
    fn down<T>(&self) -> Result<T, KmsError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(KmsError::Unavailable("injected outage: KMS is down".into()))
    }
}

impl Kms for DownKms {
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        self.down()
    }
    fn encrypt(&self, _: &str, _: &[u8], _: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        self.down()
    }
    fn generate_data_key(&self, _: &str, _: &EncryptionContext, _: Option<&Recipient>) -> Result<DataKey, KmsError> {
        self.down()
    }
    fn generate_data_key_pair_without_plaintext(&self, _: &str, _: &EncryptionContext) -> Result<DataKeyPair, KmsError> {
        self.down()
    }
    fn decrypt(&self, _: Option<&str>, _: &[u8], _: &EncryptionContext, _: Option<&Recipient>) -> Result<Decrypted, KmsError> {
        self.down()
    }
}

/// KMS down while a worker needs its keys: the host's KMS endpoint socket is moved aside and
/// an endpoint with the same TLS identity, in front of a KMS that fails every call, takes its
/// place; then the worker is killed, so its replacement must have its fleet key and model key
/// released again. The worker retries each release a bounded number of times with backoff and
/// gives up naming KMS's error; the host logs that and asks again with a backoff of its own; a
/// job submitted meanwhile waits in the queue (a host without keys receives nothing, so nothing
/// is dead-lettered). When KMS is back the keys are released and the job completes exactly once.
#[test]
fn a_kms_outage_delays_jobs_and_loses_none() {
    let started = Instant::now();
    let stack = Stack::up_with(&[
        ("EPHEM_VISIBILITY_S", OsStr::new(VISIBILITY_S)),
        ("EPHEM_REFUSAL_RETRY_S", OsStr::new("1")),
        ("EPHEM_RESCAN_S", OsStr::new("1")),
    ]);
    let work = tempfile::tempdir().unwrap();
    let run = stack.home().join("run");
    let (socket, genuine) = (run.join("kms.sock"), run.join("kms.sock.genuine"));
    std::fs::rename(&socket, &genuine).unwrap();
    let down = Arc::new(DownKms::default());
    KmsEndpoint::open(stack.home(), down.clone()).unwrap().serve_unix(&socket).unwrap();
    process::kill9(stack.pid("enclave-worker").expect("the worker runs"));

    let poller_log = || std::fs::read_to_string(stack.home().join("logs/host-poller.log")).unwrap_or_default();
    // The host's own line (the worker's output goes to the same log).
    let refusals = || -> Vec<String> {
        let log = poller_log();
        log.lines().filter(|l| l.contains("worker refused") && l.contains("gave up after 5 attempts")).map(str::to_owned).collect()
    };
    wait_until("the host to log the replacement worker giving up on KMS", Duration::from_secs(90), || !refusals().is_empty());
    let first = refusals().remove(0);
    assert!(first.contains("kms_failed") && first.contains("KMSInternalException"), "named: {first}");
    eprintln!("during the outage the host logs: {first}");

    let corpus = work.path().join("corpus.jsonl");
    let ids = short_corpus(&corpus, "kms-outage", 40);
    let job = submit(&stack, &corpus);
    let calls_at_submit = down.calls.load(Ordering::SeqCst);
    assert!(calls_at_submit >= 5, "bounded retries reached KMS: {calls_at_submit} calls");
    // Long enough for the host to ask again (refusal retry 1 s, doubling), and for a job it had
    // received to show: in flight, or back in the queue with a failed attempt in its status.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(state(&stack.status(&job)), "queued", "the job waits for a host with keys");
    let local = cloud_local::LocalCloud::open(stack.home()).expect("the local cloud");
    let queued = local.services().job_queue.stats().unwrap();
    assert_eq!((queued.visible, queued.in_flight), (1, 0), "never received while KMS is down: {queued:?}");
    assert_eq!(local.job_dlq().stats().unwrap().visible, 0, "nothing dead-lettered");
    let calls = down.calls.load(Ordering::SeqCst);
    assert!(calls >= calls_at_submit + 5, "the host asked again, with backoff: {calls_at_submit} → {calls} calls");
    let refusals = refusals().len();
    assert!((2..=20).contains(&refusals), "asked again with a growing delay, not in a loop: {refusals} refusals");

    std::fs::rename(&genuine, &socket).unwrap();
    wait_completed_and_ledgered(&stack, &job, JOB_TIMEOUT);
    assert_exactly_once(&stack, &job, &ids, work.path());
    eprintln!("KMS outage: {calls} failed KMS calls, {refusals} refusals, job done exactly once in {:.1}s", started.elapsed().as_secs_f64());
}
