//! Support for the AWS-path tests: an AWS emulator (moto's server, started by
//! `scripts/moto.sh` from `scripts/test-rust.sh`, endpoint in `EPHEM_TEST_AWS_ENDPOINT`), fresh
//! resources per test, and [`AwsStack`] — the pipeline with `--backend aws` through the real
//! binaries, as [`crate::Stack`] runs the embedded default.
//!
//! KMS in these tests is the project's local KMS (`--kms local`), not the emulator's: moto's
//! KMS accepts `Recipient` and ignores it (it would hand the host plaintext) and has no
//! `GenerateDataKeyPair*`. S3, SQS and the S3 → SQS upload notification are the emulator's; the
//! pipeline's buckets, queues, DLQs and notification filters come from the CDK app's template,
//! created by the emulator's CloudFormation ([`deploy_template`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cloud_aws::bootstrap::BootstrapOptions;
use cloud_aws::{AwsClients, AwsCloud, AwsSettings, StackOutputs};

use crate::{bin_dir, model_dir};

/// The emulator's endpoint (`http://127.0.0.1:PORT`).
pub const ENDPOINT_VAR: &str = "EPHEM_TEST_AWS_ENDPOINT";
pub const REGION: &str = "us-east-1";

/// The emulator's endpoint, or `None` with a loud note — only when the variable is absent.
/// Under CI (`CI` set) its absence is a failure: CI must run these tests.
pub fn endpoint() -> Option<String> {
    match std::env::var(ENDPOINT_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{ENDPOINT_VAR} is not set under CI: scripts/test-rust.sh starts the AWS emulator and sets it"
            );
            eprintln!(
                "\n*** SKIPPED: {ENDPOINT_VAR} is not set, so this AWS emulator test did not run. \
                 `make test-aws` (or scripts/test-rust.sh) starts moto and runs it. ***\n"
            );
            None
        }
    }
}

/// A name no other test (or earlier run against the same emulator) uses.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("t{tag}-{}-{:x}{}", std::process::id(), nanos & 0xffff, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// SDK clients for the emulator (dummy credentials).
pub fn clients(endpoint: &str) -> AwsClients {
    AwsClients::connect_emulator(endpoint, REGION).expect("clients for the emulator")
}

/// Fresh buckets, queues (+ DLQs) and emulator KMS keys, made by hand (`cloud_aws::bootstrap`):
/// for the adapters' semantics, each test with queues of its own and the redrive limit it needs,
/// in milliseconds. The stack itself comes from [`deploy_template`].
pub fn fresh_stack(clients: &AwsClients, tag: &str, max_receives: u32) -> StackOutputs {
    let options = BootstrapOptions { name_prefix: unique_prefix(tag), max_receives, job_visibility_s: 30, ..BootstrapOptions::default() };
    cloud_aws::bootstrap::bootstrap(clients, &options).expect("bootstrap in the emulator")
}

/// The environment every child process gets: the emulator, fixed credentials, no profile.
fn emulator_env(command: &mut Command, endpoint: &str) {
    command
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", REGION)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_DEFAULT_REGION");
}

/// `scripts/emulator-stack.sh deploy`: the CDK app's synthesized template, as the emulator
/// template derives it (scripts/emulator_stack.py), created by the emulator's CloudFormation as
/// stack `stack_name`; its outputs written to `outputs`. Synthesizes the app first unless an
/// earlier synth is newer than its sources (`scripts/test-rust.sh` synthesizes it once).
pub fn deploy_template(endpoint: &str, stack_name: &str, outputs: &Path) -> Output {
    let mut command = Command::new("bash");
    command.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/emulator-stack.sh")).arg("deploy").arg(outputs).arg(stack_name);
    emulator_env(&mut command, endpoint);
    command.output().expect("run scripts/emulator-stack.sh")
}

/// The pipeline with `--backend aws` in a temporary home: resources created by the emulator's
/// CloudFormation from the CDK app's template ([`deploy_template`]), processes from
/// `ephem-batch --backend aws dev up` (host-poller in aws mode spawning the local enclave
/// worker; the upload/ledger pump). `dev down` when dropped.
pub struct AwsStack {
    pub home: tempfile::TempDir,
    pub endpoint: String,
    pub outputs: PathBuf,
    bin: PathBuf,
}

impl AwsStack {
    /// The template's stack, deployed into the emulator ([`deploy_template`]); nothing runs yet.
    pub fn deploy(endpoint: &str) -> AwsStack {
        let home = tempfile::tempdir().expect("temporary home");
        let outputs = home.path().join("aws-outputs.json");
        let stack = AwsStack { endpoint: endpoint.to_owned(), outputs, bin: bin_dir(), home };
        // A stack name of its own (a letter, then letters, digits and hyphens, as CloudFormation wants).
        let out = deploy_template(endpoint, &unique_prefix("p"), &stack.outputs);
        assert!(out.status.success(), "scripts/emulator-stack.sh deploy failed:\n{}", stack.describe(&out));
        assert!(stack.outputs.is_file());
        stack
    }

    /// `dev up` (idempotent: starts what does not run).
    pub fn up(&self) {
        let out = self.cli(&["dev", "up", "--threads", "2", "--concurrency", "2"]);
        assert!(out.status.success(), "dev up --backend aws failed:\n{}", self.describe(&out));
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// `ephem-batch --home <home>` with `--backend aws` (through the environment), the stack's
    /// outputs, the local KMS and the emulator.
    pub fn command(&self) -> Command {
        let mut command = Command::new(self.bin.join("ephem-batch"));
        command
            .arg("--home")
            .arg(self.home())
            .env("EPHEM_BACKEND", "aws")
            .env("EPHEM_STACK_OUTPUTS", &self.outputs)
            .env("EPHEM_KMS", "local")
            .env("EPHEM_MODEL_DIR", model_dir())
            .env("EPHEM_BIN_DIR", &self.bin)
            // A failed attempt comes back after 1 s, 2 s, 4 s, … (not 5 s, 10 s, …), so a message
            // reaches the template's redrive limit (5 receives) within seconds.
            .env("EPHEM_RETRY_BASE_MS", "1000")
            .env_remove("EPHEM_HOME");
        emulator_env(&mut command, &self.endpoint);
        command
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run ephem-batch")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "ephem-batch {args:?} failed:\n{}", self.describe(&out));
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// The stack seen from the test: the emulator's S3 and SQS, the home's local KMS.
    pub fn cloud(&self) -> AwsCloud {
        let kms = format!("local:{}", self.home().display());
        let settings = AwsSettings::resolve_with(Some(&self.outputs), Some(&kms), |_| None).expect("the stack's settings");
        AwsCloud::with_clients(clients(&self.endpoint), &settings, Some(cloud_local::open_emulator_kms)).expect("the stack's services")
    }

    /// Stops the host-poller (and with it its enclave worker), as a host that dies would.
    pub fn stop_host_poller(&self) {
        let pid_file = self.home().join("run/host-poller.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("host-poller pid file").trim().to_owned();
        let status = Command::new("kill").arg("-TERM").arg(&pid).status().expect("kill");
        assert!(status.success(), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(&pid) {
            assert!(Instant::now() < deadline, "host-poller {pid} did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The command's output and the stack's logs, for a failure message.
    pub fn describe(&self, out: &Output) -> String {
        let mut text = format!(
            "status {}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        text.push_str(&self.logs());
        text
    }

    /// [`wait_until`], with the stack's logs in the failure message.
    pub fn wait_until<T>(&self, what: &str, timeout: Duration, mut done: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = done() {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out after {}s waiting for {what}{}", timeout.as_secs(), self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of the host-poller's and the pump's logs.
    pub fn logs(&self) -> String {
        crate::log_tails(self.home(), &["host-poller", "aws-pump"], 60)
    }
}

fn is_zombie(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) == Some("Z"))
        .unwrap_or(true)
}

impl Drop for AwsStack {
    fn drop(&mut self) {
        let _ = self.cli(&["dev", "down"]);
    }
}

/// Polls `done` every 200 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut done: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {}s waiting for {what}", timeout.as_secs());
        std::thread::sleep(Duration::from_millis(200));
    }
}
