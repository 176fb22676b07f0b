//! Local mode: the poller starts `enclave-worker` as its child on a Unix socket, restarts it when
//! it exits (with backoff, so a worker that cannot start does not spin), and kills it on
//! shutdown. Each (re)start bumps the worker generation, which makes control set the new
//! process up again (fleet keys, models) before jobs flow to it.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cloud_local::KmsEndpoint;
use cloud::Kms;

use crate::pidfile::{self, PidFile};
use crate::retry;
use crate::shared::Shared;
use crate::worker_link::WorkerEndpoint;

/// How the poller starts its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnConfig {
    /// The `enclave-worker` executable.
    pub binary: PathBuf,
    /// The Unix socket it listens on.
    pub socket: PathBuf,
    /// Its `--state-dir` (the development CA lives there).
    pub state_dir: PathBuf,
    /// Its `--threads` (0: one per core).
    pub threads: usize,
    /// Where its pid is kept while it runs.
    pub pid_file: Option<PathBuf>,
    /// Where its stdout and stderr go (appended); `None`: the poller's own.
    pub log_file: Option<PathBuf>,
    /// Where the worker reaches KMS (`--kms-relay`), and the development root it then pins
    /// (`--kms-tls-root`): the local KMS endpoint of the embedded default.
    pub kms_relay: Option<String>,
    pub kms_tls_root: Option<PathBuf>,
}

impl SpawnConfig {
    /// The embedded default's layout: `<run>/worker.sock`, `<run>/enclave-worker.pid`, state in
    /// `<home>/enclave/`.
    pub fn local(home: &std::path::Path, run: &std::path::Path, binary: PathBuf) -> Self {
        Self {
            binary,
            socket: run.join("worker.sock"),
            state_dir: home.join("enclave"),
            threads: 0,
            pid_file: Some(run.join("enclave-worker.pid")),
            log_file: None,
            kms_relay: None,
            kms_tls_root: None,
        }
    }

    pub fn endpoint(&self) -> WorkerEndpoint {
        WorkerEndpoint::Unix(self.socket.clone())
    }

    /// Serves `kms` — a local KMS under `dir` — as its HTTPS endpoint on `kms.sock` beside the
    /// worker's socket, and has the worker reach KMS there with the endpoint's development root
    /// pinned. (In AWS the worker reaches KMS through the parent's vsock-proxy and trusts the
    /// Amazon roots.)
    pub fn serve_local_kms(&mut self, dir: &std::path::Path, kms: Arc<dyn Kms>) -> Result<(), SupervisorError> {
        let failed = |e: &dyn std::fmt::Display| SupervisorError::KmsEndpoint(e.to_string());
        let endpoint = KmsEndpoint::open(dir, kms).map_err(|e| failed(&e))?;
        let run = self.socket.parent().map(std::path::Path::to_path_buf).unwrap_or_else(|| dir.join("run"));
        std::fs::create_dir_all(&run).map_err(|source| SupervisorError::Files { path: run.clone(), source })?;
        let socket = run.join("kms.sock");
        self.kms_tls_root = Some(endpoint.root_pem().to_path_buf());
        endpoint.serve_unix(&socket).map_err(|e| failed(&e))?;
        tracing::info!(socket = %socket.display(), "local KMS endpoint serving (development TLS root)");
        self.kms_relay = Some(format!("unix:{}", socket.display()));
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("local KMS endpoint: {0}")]
    KmsEndpoint(String),
    #[error("cannot start the worker {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("worker files under {path}: {source}")]
    Files {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A worker that keeps running within this long is considered healthy again.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(500);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

struct Running {
    child: Child,
    started: Instant,
    _pid_file: Option<PidFile>,
}

pub(crate) struct Supervisor {
    done: Arc<(AtomicBool, Mutex<()>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Supervisor {
    /// Starts the worker (an error here means it could not be started at all) and watches it.
    pub fn start(config: SpawnConfig, shared: Arc<Shared>) -> Result<Supervisor, SupervisorError> {
        stop_stale(&config);
        let first = spawn(&config)?;
        shared.worker_replaced();
        let done = Arc::new((AtomicBool::new(false), Mutex::new(()), Condvar::new()));
        let watch = Arc::clone(&done);
        let thread = std::thread::Builder::new()
            .name("supervisor".into())
            .spawn(move || watch_worker(config, first, shared, &watch))
            .map_err(|source| SupervisorError::Spawn { binary: "supervisor thread".into(), source })?;
        Ok(Supervisor { done, thread: Some(thread) })
    }

    /// Kills the worker and waits for it.
    pub fn stop(&mut self) {
        let (flag, lock, wake) = &*self.done;
        flag.store(true, Ordering::SeqCst);
        let _guard = lock.lock();
        wake.notify_all();
        drop(_guard);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch_worker(config: SpawnConfig, first: Running, shared: Arc<Shared>, done: &(AtomicBool, Mutex<()>, Condvar)) {
    let (flag, lock, wake) = done;
    let wait = |duration: Duration| {
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !flag.load(Ordering::SeqCst) {
            let _ = wake.wait_timeout(guard, duration);
        }
    };
    let mut running = Some(first);
    let mut failures = 0u32;
    while !flag.load(Ordering::SeqCst) {
        let Some(current) = running.as_mut() else {
            // Not running: try to start it again.
            match spawn(&config) {
                Ok(started) => {
                    running = Some(started);
                    shared.worker_replaced();
                }
                Err(error) => {
                    failures += 1;
                    tracing::error!(%error, "worker restart failed");
                    wait(retry::exponential(FIRST_RESTART_DELAY, failures, MAX_RESTART_DELAY));
                }
            }
            continue;
        };
        match current.child.try_wait() {
            Ok(None) => wait(POLL),
            Ok(Some(exit)) => {
                let lived = current.started.elapsed();
                failures = if lived >= HEALTHY_AFTER { 1 } else { failures + 1 };
                let delay = retry::exponential(FIRST_RESTART_DELAY, failures, MAX_RESTART_DELAY);
                tracing::error!(%exit, ?lived, restart_in = ?delay, "worker exited");
                running = None;
                // Jobs on the old process are lost; nothing goes to a worker until it is set up.
                shared.worker_replaced();
                wait(delay);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot check on the worker");
                wait(POLL);
            }
        }
    }
    if let Some(mut current) = running {
        let _ = current.child.kill();
        let _ = current.child.wait();
        tracing::info!("worker stopped");
    }
    let _ = std::fs::remove_file(&config.socket);
}

fn spawn(config: &SpawnConfig) -> Result<Running, SupervisorError> {
    let files_error = |path: &std::path::Path| {
        let path = path.to_owned();
        move |source| SupervisorError::Files { path, source }
    };
    if let Some(dir) = config.socket.parent() {
        std::fs::create_dir_all(dir).map_err(files_error(dir))?;
    }
    // A stale socket would pass for a listening worker before the new one binds.
    match std::fs::remove_file(&config.socket) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(files_error(&config.socket)(error)),
    }
    let mut command = Command::new(&config.binary);
    command
        .arg("--listen")
        .arg(format!("unix:{}", config.socket.display()))
        .arg("--state-dir")
        .arg(&config.state_dir)
        .arg("--threads")
        .arg(config.threads.to_string())
        .stdin(Stdio::null());
    // Without it candle counts physical cores from /proc/cpuinfo on every matrix product it runs
    // (the worker's engine on a CPU without AVX-512; ~4 % of a job's time when attention still
    // went through candle); the worker cannot set its own environment safely.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = match config.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        };
        command.env("RAYON_NUM_THREADS", threads.to_string());
    }
    if let Some(relay) = &config.kms_relay {
        command.arg("--kms-relay").arg(relay);
    }
    if let Some(root) = &config.kms_tls_root {
        command.arg("--kms-tls-root").arg(root);
    }
    if let Some(log) = &config.log_file {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).map_err(files_error(dir))?;
        }
        let file = OpenOptions::new().create(true).append(true).open(log).map_err(files_error(log))?;
        let second = file.try_clone().map_err(files_error(log))?;
        command.stdout(file).stderr(second);
    }
    let child = command.spawn().map_err(|source| SupervisorError::Spawn { binary: config.binary.clone(), source })?;
    let pid_file = match &config.pid_file {
        Some(path) => Some(PidFile::write(path, child.id()).map_err(files_error(path))?),
        None => None,
    };
    tracing::info!(pid = child.id(), socket = %config.socket.display(), "worker started");
    Ok(Running { child, started: Instant::now(), _pid_file: pid_file })
}

/// A worker left behind by a poller that was killed (its pid file still names a live
/// `enclave-worker`) would keep its memory and its model: stop it first.
fn stop_stale(config: &SpawnConfig) {
    let Some(path) = &config.pid_file else { return };
    let Some(pid) = pidfile::running(path, "enclave-worker") else { return };
    tracing::warn!(pid, "stopping a worker left behind by an earlier poller");
    let stopped = Command::new("kill").arg("-TERM").arg(pid.to_string()).stderr(Stdio::null()).status();
    if !stopped.is_ok_and(|s| s.success()) {
        tracing::warn!(pid, "could not stop it");
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pidfile::command_line(pid).is_some() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
}
