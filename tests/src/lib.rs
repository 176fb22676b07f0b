#![forbid(unsafe_code)]
//! Support for the cross-component tests: a local stack in a temporary `$EPHEM_HOME`, driven
//! through the real `ephem-batch`, `host-poller` and `enclave-worker` binaries.
//!
//! The binaries are the workspace's own build (`scripts/test-rust.sh` builds every binary
//! before the tests run): `$EPHEM_BIN_DIR`, else the target directory this test runs from.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod aws;
pub mod conformance;
pub mod process;

/// The directory holding the workspace's binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("EPHEM_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/<test> → target/<profile>
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target directory").to_path_buf();
    for name in ["ephem-batch", "host-poller", "enclave-worker"] {
        assert!(dir.join(name).is_file(), "{} is not built: run `cargo build --workspace --bins` first", dir.join(name).display());
    }
    dir
}

/// The model files (scripts/setup-model.sh installs them).
pub fn model_dir() -> PathBuf {
    std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../.ephem/models/all-MiniLM-L6-v2").into())
}

/// A local stack under a temporary home; `dev down` when dropped.
pub struct Stack {
    pub home: tempfile::TempDir,
    bin: PathBuf,
    /// Environment of `dev up`, and so of the processes it starts (not of client commands:
    /// the client's own temporary files are not the host's).
    env: Vec<(OsString, OsString)>,
}

impl Stack {
    /// `ephem-batch dev up` in a fresh home.
    pub fn up() -> Stack {
        Stack::up_with(&[])
    }

    /// `dev up` in a fresh home with `env` set for the processes the stack starts (the
    /// host-poller reads `EPHEM_*` settings from its environment; `TMPDIR`).
    pub fn up_with(env: &[(&str, &std::ffi::OsStr)]) -> Stack {
        let env = env.iter().map(|(k, v)| (OsString::from(k), v.to_os_string())).collect();
        let stack = Stack { home: tempfile::tempdir().expect("temporary home"), bin: bin_dir(), env };
        stack.start();
        stack
    }

    /// `dev up` (again): starts whatever of the stack is not running.
    pub fn start(&self) {
        let mut up = self.command(&["dev", "up", "--threads", "2", "--concurrency", "2"]);
        let out = up.envs(self.env.iter().map(|(k, v)| (k, v))).output().expect("run ephem-batch dev up");
        assert!(out.status.success(), "dev up failed:\n{}", self.describe(&out));
    }

    /// The pid of a live stack process (`host-poller`, `enclave-worker`, `lambdas`), from its
    /// pid file in `run/`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        let pid = std::fs::read_to_string(self.home().join("run").join(format!("{name}.pid"))).ok()?.trim().parse().ok()?;
        process::is_running(pid).then_some(pid)
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// Runs `ephem-batch --home <home> ARGS…`.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run ephem-batch")
    }

    /// `ephem-batch --home <home> ARGS…`, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.bin.join("ephem-batch"));
        command
            .arg("--home")
            .arg(self.home())
            .args(args)
            .env("EPHEM_MODEL_DIR", model_dir())
            .env("EPHEM_BIN_DIR", &self.bin)
            .env_remove("EPHEM_HOME");
        command
    }

    /// `status JOB --json`.
    pub fn status(&self, job: &str) -> serde_json::Value {
        json(&self.ok(&["status", job, "--json"]))
    }

    /// The ledger's own rows for `job` (`ledger query --job`, read from the ledger store).
    pub fn ledger_rows(&self, job: &str) -> Vec<serde_json::Value> {
        let rows = json(&self.ok(&["ledger", "query", "--job", job, "--json"]));
        rows.as_array().unwrap_or_else(|| panic!("ledger query: not an array: {rows}")).clone()
    }

    /// Runs the CLI and insists on success.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "ephem-batch {args:?} failed:\n{}", self.describe(&out));
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// Onboards the model directory `dir` as the tenant does: `model encrypt` (with `extra`
    /// flags) into `sealed`, `model sign --development`, `model upload`.
    pub fn onboard(&self, dir: &Path, model_id: &str, sealed: &Path, extra: &[&str]) {
        let (dir, sealed) = (dir.to_str().unwrap(), sealed.to_str().unwrap());
        let mut encrypt = vec!["model", "encrypt", dir, "--model-id", model_id, "--version", "1", "-o", sealed];
        encrypt.extend_from_slice(extra);
        self.ok(&encrypt);
        self.ok(&["model", "sign", sealed, "--development"]);
        self.ok(&["model", "upload", sealed]);
    }

    /// `verify JOB`'s check named `name` (`{"name", "passed", "detail"}`).
    pub fn verify_check(&self, job: &str, name: &str) -> serde_json::Value {
        let verification = json(&String::from_utf8_lossy(&self.cli(&["verify", job, "--json"]).stdout));
        let checks = verification["checks"].as_array().unwrap_or_else(|| panic!("verify {job}: no checks: {verification}"));
        checks.iter().find(|c| c["name"] == name).cloned().unwrap_or_else(|| panic!("verify {job}: no check {name}"))
    }

    /// One record of a job proven alone (`ledger prove-record` into `bundle`) and checked
    /// offline (`ledger verify-record` with the stack's ledger key and development root): the
    /// verification, which must say `valid`.
    pub fn prove_record(&self, job: &str, record: &str, bundle: &Path) -> serde_json::Value {
        let bundle = bundle.to_str().unwrap();
        self.ok(&["ledger", "prove-record", job, record, "-o", bundle]);
        let proven = json(&self.ok(&[
            "ledger", "verify-record", bundle,
            "--ledger-key", self.home().join("ledger/ledger.pub").to_str().unwrap(),
            "--development-root", self.home().join("enclave/dev-root.pem").to_str().unwrap(),
            "--json",
        ]));
        assert_eq!(proven["valid"], serde_json::json!(true), "{proven}");
        proven
    }

    /// The command's output and the stack's logs, for a failure message.
    pub fn describe(&self, out: &Output) -> String {
        let mut text = format!(
            "status {}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        text.push_str(&log_tails(self.home(), &["host-poller", "lambdas"], 40));
        text
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.cli(&["dev", "down"]);
    }
}

/// Parses one JSON value, naming the text on failure.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The JSON lines of a file.
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(json).collect()
}

/// A corpus of `n` unique short records, `<tag>-<i>`, written to `path`; returns the ids.
pub fn short_corpus(path: &Path, tag: &str, n: usize) -> Vec<String> {
    const WORDS: [&str; 16] = [
        "harbour", "lantern", "granite", "meadow", "copper", "falcon", "willow", "ember", "quartz", "tundra", "orchid",
        "canyon", "saffron", "glacier", "pepper", "velvet",
    ];
    let mut text = String::new();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let words: Vec<&str> = (0..6).map(|k| WORDS[(i >> (k * 2)) % 16 ^ k]).collect();
        let line = serde_json::json!({"id": id, "text": format!("Record {i} of {tag}: the {} {}.", words.join(" "), i * 7919 % 10007)});
        text.push_str(&line.to_string());
        text.push('\n');
        ids.push(id);
    }
    std::fs::write(path, text).expect("write the corpus");
    ids
}

/// `ephem-batch serve` of a stack, on a free loopback port; killed when dropped.
pub struct Serve {
    child: std::process::Child,
    pub port: u16,
}

impl Serve {
    /// Starts `serve` with `extra` arguments and waits until it listens.
    pub fn start(stack: &Stack, extra: &[&str]) -> Serve {
        Self::start_with(|args| stack.command(args), extra)
    }

    /// [`Serve::start`] for any stack: `command` makes the CLI invocation of the given arguments.
    /// `serve` binds port 0 and the port is read from the line it prints once bound: a port
    /// chosen here and bound by `serve` later could be taken in between by another test's
    /// `serve`, whose requests this test would then send and count.
    pub fn start_with(command: impl FnOnce(&[&str]) -> std::process::Command, extra: &[&str]) -> Serve {
        use std::io::BufRead;
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child = command(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start serve");
        let stderr = child.stderr.take().expect("piped");
        let (bound, port) = std::sync::mpsc::channel();
        // Reads serve's stderr to its end, so that the pipe never fills.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let port = line.strip_prefix("serve: OpenAI embeddings API on http://127.0.0.1:").and_then(|rest| rest.split('/').next()?.parse::<u16>().ok());
                if let Some(port) = port {
                    let _ = bound.send(port);
                }
            }
        });
        let port = port.recv_timeout(std::time::Duration::from_secs(60)).expect("serve names the port it listens on");
        Serve { child, port }
    }

    /// POSTs an OpenAI embeddings request; the status and the JSON answer.
    pub fn embeddings(&self, request: &serde_json::Value) -> (u16, serde_json::Value) {
        let (status, body) =
            http_exchange(self.port, "POST", "/v1/embeddings", "application/json", request.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body))))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` every 100 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The last `lines` lines of each named log in `<home>/logs/`, for failure messages.
pub fn log_tails(home: &Path, logs: &[&str], lines: usize) -> String {
    let mut text = String::new();
    for log in logs {
        let path = home.join("logs").join(format!("{log}.log"));
        if let Ok(content) = std::fs::read_to_string(&path) {
            let tail: Vec<&str> = content.lines().rev().take(lines).collect();
            text.push_str(&format!("\n--- {log}.log (last lines)\n"));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

/// The example corpus (its first `lines` lines, or all), followed by one record per canary
/// (`canary-<i>`, a sentence carrying the canary), written to `path`. Returns the text written.
pub fn corpus_with_canaries(path: &Path, lines: Option<usize>, canaries: &[String]) -> String {
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/corpus.jsonl")).expect("examples/corpus.jsonl");
    let mut text: String = example.lines().take(lines.unwrap_or(usize::MAX)).map(|l| format!("{l}\n")).collect();
    for (i, canary) in canaries.iter().enumerate() {
        text.push_str(&serde_json::json!({"id": format!("canary-{i}"), "text": format!("A secret note: {canary}.")}).to_string());
        text.push('\n');
    }
    std::fs::write(path, &text).expect("write the corpus");
    text
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if path.is_file() {
            out.push(path);
        }
    }
    out
}

/// Regular files under `dir` modified at or after `since`, not under any of `skip`; symbolic
/// links are not followed (a shared temporary directory may hold anything).
pub fn files_modified_since(dir: &Path, since: std::time::SystemTime, skip: &[&Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if skip.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            out.extend(files_modified_since(&path, since, skip));
        } else if kind.is_file() && entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= since) {
            out.push(path);
        }
    }
    out
}

/// The forms a canary could leak in: plain, hex (either case) and base64.
pub fn canary_forms(canary: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    let engines = [&base64::engine::general_purpose::STANDARD, &base64::engine::general_purpose::URL_SAFE_NO_PAD];
    let mut forms = vec![canary.as_bytes().to_vec(), hex::encode(canary).into_bytes(), hex::encode_upper(canary).into_bytes()];
    // In a base64 stream the canary starts at some offset mod 3: starting it at byte 0, 1 or 2
    // puts a group boundary there, and its whole groups then encode to exactly these characters.
    let bytes = canary.as_bytes();
    for engine in engines {
        for skip in 0..3 {
            let whole = (bytes.len().saturating_sub(skip) / 3) * 3;
            if whole >= 9 {
                forms.push(engine.encode(&bytes[skip..skip + whole]).into_bytes());
            }
        }
    }
    forms
}

/// Files under `dir` containing any form of any canary: (file, canary).
pub fn canary_hits(dir: &Path, canaries: &[String]) -> Vec<(PathBuf, String)> {
    canary_hits_in(files_under(dir), canaries)
}

/// Which of `files` contain any form of any canary: (file, canary).
pub fn canary_hits_in(files: impl IntoIterator<Item = PathBuf>, canaries: &[String]) -> Vec<(PathBuf, String)> {
    let forms: Vec<(String, Vec<Vec<u8>>)> = canaries.iter().map(|c| (c.clone(), canary_forms(c))).collect();
    let mut hits = Vec::new();
    for file in files {
        let Ok(bytes) = std::fs::read(&file) else { continue };
        // Every form is ASCII, so a lossy UTF-8 view keeps each occurrence intact, and `str`'s
        // substring search is linear (the model's objects are tens of megabytes).
        let text = String::from_utf8_lossy(&bytes);
        for (canary, variants) in &forms {
            if variants.iter().any(|v| text.contains(std::str::from_utf8(v).expect("ASCII forms"))) {
                hits.push((file.clone(), canary.clone()));
            }
        }
    }
    hits
}

/// One HTTP/1.1 exchange with a server on loopback (`Connection: close`): status and body.
pub fn http_exchange(port: u16, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(std::time::Duration::from_secs(120))).expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send the head");
    stream.write_all(body).expect("send the body");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read the response");
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP response");
    let status = std::str::from_utf8(&response[9..12]).ok().and_then(|s| s.parse().ok()).expect("a status code");
    (status, response[split + 4..].to_vec())
}

/// Reads a committed reference file (JSON whose `texts` have a `name` and a `text`) and writes
/// those texts to `corpus`, one `{"id": name, "text"}` line each; returns the reference.
pub fn reference_corpus(reference: &Path, corpus: &Path) -> serde_json::Value {
    let reference: serde_json::Value = serde_json::from_slice(&std::fs::read(reference).unwrap()).unwrap();
    let texts = reference["texts"].as_array().expect("the reference has texts");
    let lines: Vec<String> = texts.iter().map(|t| serde_json::json!({"id": t["name"], "text": t["text"]}).to_string()).collect();
    std::fs::write(corpus, lines.join("\n") + "\n").unwrap();
    reference
}
