//! The poller: control on one thread, `concurrency` job threads each long-polling the job queue
//! and running one job at a time on its own job channel, and in local mode the worker's
//! supervisor. [`Poller::run`] returns when a [`ShutdownHandle`] stopped it and the jobs in
//! flight have finished (or, after an abort, have been handed back).

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cloud::{Received, Services};

use crate::control::{Control, ControlSettings};
use crate::usage::UsageSettings;
use crate::delivery::{self, Context, Disposition, Settings};
use crate::online_relay::{OnlineRelay, OnlineRelayError, OnlineSettings};
use crate::pidfile::{self, PidFile};
use crate::relay::Relay;
use crate::retry;
use crate::shared::{Shared, ShutdownHandle};
use crate::supervisor::{SpawnConfig, Supervisor, SupervisorError};
use crate::worker_link::WorkerEndpoint;

/// Where the worker comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerSource {
    /// A worker someone else runs (the enclave, or a process started by hand).
    Connect(WorkerEndpoint),
    /// Local mode: start and supervise `enclave-worker`.
    Spawn(SpawnConfig),
}

impl WorkerSource {
    pub fn endpoint(&self) -> WorkerEndpoint {
        match self {
            WorkerSource::Connect(endpoint) => endpoint.clone(),
            WorkerSource::Spawn(spawn) => spawn.endpoint(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PollerConfig {
    pub worker: WorkerSource,
    /// Names this host's published attestation (`attestations/current/<host_id>.cbor`) and its
    /// status entries. Letters, digits, `.`, `_`, `-`.
    pub host_id: String,
    /// Jobs in parallel, each on its own job channel.
    pub concurrency: usize,
    /// Visibility timeout of a received message; extended every third of it while the job runs.
    pub visibility: Duration,
    /// The job queue's receive limit before it dead-letters a message.
    pub max_receives: u32,
    /// Long-poll wait of one receive.
    pub poll_wait: Duration,
    /// First delay before a failed attempt's message is visible again; doubles per receive.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// A job (or control request) whose worker sends nothing for this long is given up.
    pub stall_timeout: Duration,
    /// How often control looks for new fleet epochs and model versions.
    pub rescan_interval: Duration,
    /// How often the newest epoch is taken up again to publish a fresh attestation document.
    pub republish_interval: Duration,
    /// First delay before a fleet epoch or model the worker refused (KMS down, a policy that
    /// does not match) is asked for again; doubles per refusal, up to 15 minutes.
    pub refusal_retry: Duration,
    /// How often to look for clients' requests for a fresh document (`attest fetch --nonce`).
    pub attestation_poll: Duration,
    /// This process's pid file (`<home>/run/host-poller.pid`), removed on a clean exit.
    pub pid_file: Option<PathBuf>,
    /// The Oblivious HTTP relay to the worker's online channel; off when `None`.
    pub online: Option<OnlineSettings>,
    /// When the usage receipts of online requests are collected for the ledger.
    pub usage: UsageSettings,
    /// Where control keeps the worker's held models and budget ([`crate::ModelsStatus`]); none if unset.
    pub models_status: Option<PathBuf>,
}

impl PollerConfig {
    pub fn new(worker: WorkerSource) -> Self {
        Self {
            worker,
            host_id: default_host_id(),
            concurrency: 1,
            visibility: Duration::from_secs(60),
            max_receives: 5,
            poll_wait: Duration::from_secs(10),
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
            stall_timeout: Duration::from_secs(300),
            rescan_interval: Duration::from_secs(60),
            republish_interval: Duration::from_secs(30 * 60),
            refusal_retry: Duration::from_secs(30),
            attestation_poll: Duration::from_secs(2),
            pid_file: None,
            online: None,
            usage: UsageSettings::default(),
            models_status: None,
        }
    }
}

/// Whether `id` can name objects (`attestations/current/<id>.cbor`).
pub fn valid_host_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) && id != "." && id != ".."
}

/// The machine's host name, made safe for an object key.
pub fn default_host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let id: String =
        name.trim().chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect();
    if valid_host_id(&id) { id } else { "host".to_owned() }
}

#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    #[error("host id {0:?} may only hold letters, digits, '.', '_' and '-'")]
    HostId(String),
    #[error("concurrency must be at least 1")]
    Concurrency,
    #[error("another host-poller (pid {pid}) runs with {path}")]
    AlreadyRunning { pid: u32, path: PathBuf },
    #[error("pid file {path}: {source}")]
    PidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    OnlineRelay(#[from] OnlineRelayError),
}

/// After an abort, how long `run` waits for job threads to hand their jobs back.
const ABORT_GRACE: Duration = Duration::from_secs(10);

pub struct Poller {
    services: Services,
    config: PollerConfig,
    shared: Arc<Shared>,
}

impl Poller {
    pub fn new(services: Services, config: PollerConfig) -> Self {
        Self { services, config, shared: Arc::new(Shared::default()) }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { shared: Arc::clone(&self.shared) }
    }

    /// Runs until stopped.
    pub fn run(self) -> Result<(), PollerError> {
        let config = &self.config;
        if !valid_host_id(&config.host_id) {
            return Err(PollerError::HostId(config.host_id.clone()));
        }
        if config.concurrency == 0 {
            return Err(PollerError::Concurrency);
        }
        let _pid_file = match &config.pid_file {
            Some(path) => {
                if let Some(pid) = pidfile::running(path, "host-poller").filter(|pid| *pid != std::process::id()) {
                    return Err(PollerError::AlreadyRunning { pid, path: path.clone() });
                }
                let written = PidFile::write(path, std::process::id());
                Some(written.map_err(|source| PollerError::PidFile { path: path.clone(), source })?)
            }
            None => None,
        };
        let endpoint = config.worker.endpoint();
        tracing::info!(
            host = config.host_id, worker = %endpoint, concurrency = config.concurrency,
            visibility_s = config.visibility.as_secs_f64(), max_receives = config.max_receives, "host-poller starting"
        );
        // Bound before the worker starts, so a taken port fails the start with nothing to undo.
        let online_relay = match &config.online {
            Some(settings) => Some(OnlineRelay::start(settings.clone(), endpoint.clone())?),
            None => None,
        };
        let mut supervisor = match &config.worker {
            WorkerSource::Spawn(spawn) => Some(Supervisor::start(spawn.clone(), Arc::clone(&self.shared))?),
            WorkerSource::Connect(_) => None,
        };

        let relay = Arc::new(Relay::new(self.services.clone(), config.host_id.clone()));
        let control = Control::new(
            self.services.clone(),
            endpoint.clone(),
            Arc::clone(&relay),
            Arc::clone(&self.shared),
            ControlSettings {
                rescan_interval: config.rescan_interval,
                republish_interval: config.republish_interval,
                refusal_retry: config.refusal_retry,
                attestation_poll: config.attestation_poll,
                request_timeout: config.stall_timeout,
                host_id: config.host_id.clone(),
                usage: config.usage,
                models_status: config.models_status.clone(),
            },
        );
        let control_thread = spawn_thread("control", move || control.run())?;

        let context = Arc::new(Context {
            services: self.services.clone(),
            endpoint,
            relay,
            shared: Arc::clone(&self.shared),
            settings: Settings {
                host_id: config.host_id.clone(),
                visibility: config.visibility,
                max_receives: config.max_receives,
                retry_base: config.retry_base,
                retry_max: config.retry_max,
                stall_timeout: config.stall_timeout,
            },
        });
        let mut jobs = Vec::new();
        for n in 0..config.concurrency {
            let context = Arc::clone(&context);
            let poll_wait = config.poll_wait;
            match spawn_thread(&format!("job-{n}"), move || job_loop(&context, poll_wait)) {
                Ok(thread) => jobs.push(thread),
                Err(error) => {
                    self.shared.abort();
                    return Err(error);
                }
            }
        }

        self.wait_for(jobs);
        self.shared.stop();
        if let Some(relay) = online_relay {
            relay.stop();
        }
        // No job needs the worker any more: a control request still waiting on it ends now.
        self.shared.cut_links();
        if self.shared.is_aborting() {
            // A control request may be blocked on the worker; the process is ending anyway.
            drop(control_thread);
        } else {
            let _ = control_thread.join();
        }
        if let Some(supervisor) = supervisor.as_mut() {
            supervisor.stop();
        }
        tracing::info!("host-poller stopped");
        Ok(())
    }

    /// Joins the job threads; after an abort, gives up on them after [`ABORT_GRACE`].
    fn wait_for(&self, mut threads: Vec<JoinHandle<()>>) {
        let mut aborted_at = None;
        while !threads.is_empty() {
            threads.retain(|t| !t.is_finished());
            if self.shared.is_aborting() {
                let at = *aborted_at.get_or_insert_with(Instant::now);
                if at.elapsed() > ABORT_GRACE {
                    tracing::warn!(threads = threads.len(), "jobs did not hand back in time");
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn spawn_thread(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, PollerError> {
    std::thread::Builder::new().name(name.to_owned()).spawn(body).map_err(PollerError::Thread)
}

/// One job slot: waits for a ready worker, receives one message, handles it, again.
fn job_loop(context: &Context, poll_wait: Duration) {
    let shared = &context.shared;
    let queue = &context.services.job_queue;
    let mut waiting_logged = false;
    let mut receive_errors = 0u32;
    while !shared.is_stopping() {
        // Receiving while the worker lacks its keys or model would spend receives for nothing.
        if !shared.wait_ready(Duration::from_secs(1)) {
            if !waiting_logged && !shared.is_stopping() {
                tracing::info!("waiting for the worker to be set up before taking jobs");
                waiting_logged = true;
            }
            continue;
        }
        waiting_logged = false;
        let received = match queue.receive(1, poll_wait, context.settings.visibility) {
            Ok(received) => {
                receive_errors = 0;
                received
            }
            Err(error) => {
                receive_errors += 1;
                tracing::warn!(%error, "receive failed");
                shared.sleep(retry::jittered(retry::exponential(Duration::from_millis(500), receive_errors, Duration::from_secs(30))));
                continue;
            }
        };
        for message in received {
            if shared.is_stopping() {
                release(context, &message);
                continue;
            }
            match delivery::handle(context, message) {
                Disposition::Released => tracing::info!("job handed back to the queue"),
                // This thread does not poll until the copy has been visible a while, so that the
                // host holding the job's epoch, not this one, receives it.
                Disposition::HandedOver { delay, .. } => shared.sleep(delay + HANDOVER_STEP_ASIDE),
                _ => {}
            }
        }
    }
}

/// How long past a handed-over copy's delay the thread that handed it over stays out of the queue.
const HANDOVER_STEP_ASIDE: Duration = Duration::from_secs(10);

/// A message that arrived after shutdown began goes straight back.
fn release(context: &Context, message: &Received) {
    delivery::set_visibility(context, message, Duration::ZERO);
}
