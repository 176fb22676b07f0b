#![forbid(unsafe_code)]
//! `host-poller`: the untrusted relay on each host. A thin shell over [`host_poller::Poller`]:
//! flags (with environment fallbacks), logging, signals, the backend's services.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use host_poller::{Poller, PollerConfig, SpawnConfig, WorkerEndpoint, WorkerSource};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// Everything under `--home` on this machine (the embedded default).
    Local,
    /// S3, SQS and KMS (the deployment's environment, docs/operations.md §6; EPHEM_KMS=local:DIR
    /// for an emulator).
    Aws,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The untrusted relay between the job queue, the object stores, KMS and the enclave worker.
#[derive(Debug, Parser)]
#[command(name = "host-poller", version)]
struct Args {
    /// Where the queues, objects and keys are. Default: `aws` when EPHEM_JOB_QUEUE_URL is set
    /// (as on a fleet host), else `local`.
    #[arg(long, env = "EPHEM_BACKEND", value_enum)]
    backend: Option<Backend>,

    /// The local stack's directory (objects, queues, KMS, `run/` pid files and sockets).
    #[arg(long, env = "EPHEM_HOME", default_value = ".ephem")]
    home: PathBuf,

    /// This host's pid files and sockets. Default: `<home>/run`. Two hosts of one home (an image
    /// update on the development stack) need two.
    #[arg(long, env = "EPHEM_RUN_DIR")]
    run_dir: Option<PathBuf>,

    /// The KMS key this host's worker creates fleet epochs under (an ARN, key id or alias).
    /// Default: the backend's (`FleetKeyArn`, or the local stack's alias). Each image has its
    /// own, so a host of one image never asks for an epoch under another's.
    #[arg(long, env = "EPHEM_HOST_FLEET_KEY")]
    fleet_key: Option<String>,

    /// Start and supervise this `enclave-worker` on `<run dir>/worker.sock`.
    #[arg(long, env = "EPHEM_SPAWN_WORKER", conflicts_with = "worker")]
    spawn_worker: Option<PathBuf>,

    /// The supervised worker's state directory (development CA). Default: `<home>/enclave`.
    #[arg(long, env = "EPHEM_WORKER_STATE_DIR", requires = "spawn_worker")]
    worker_state_dir: Option<PathBuf>,

    /// The supervised worker's inference threads (0: one per core).
    #[arg(long, env = "EPHEM_WORKER_THREADS", default_value_t = 0, requires = "spawn_worker")]
    worker_threads: usize,

    /// Append the supervised worker's output to this file instead of the poller's own.
    #[arg(long, env = "EPHEM_WORKER_LOG", requires = "spawn_worker")]
    worker_log: Option<PathBuf>,

    /// A worker that runs already: unix:PATH, tcp:HOST:PORT, or vsock:CID:PORT (feature `nitro`).
    #[arg(long, env = "EPHEM_WORKER")]
    worker: Option<WorkerEndpoint>,

    /// The enclave's vsock CID; with --enclave-port, the worker when --worker is not given.
    #[arg(long, env = "EPHEM_ENCLAVE_CID")]
    enclave_cid: Option<u32>,

    #[arg(long, env = "EPHEM_ENCLAVE_PORT", default_value_t = 5000)]
    enclave_port: u32,

    /// Jobs in parallel.
    #[arg(long, env = "EPHEM_CONCURRENCY", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    concurrency: u32,

    /// Visibility timeout of a received job message, seconds (extended while the job runs).
    #[arg(long, env = "EPHEM_VISIBILITY_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=43_200))]
    visibility_s: u64,

    /// Names this host's published attestation. Default: the host name.
    #[arg(long, env = "EPHEM_HOST_ID")]
    host_id: Option<String>,

    /// The job queue's receive limit before it moves a message to the dead-letter queue.
    #[arg(long, env = "EPHEM_MAX_RECEIVES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_receives: u32,

    /// First delay before a failed attempt's job is received again, milliseconds; doubles per
    /// receive, up to --retry-max-s.
    #[arg(long, env = "EPHEM_RETRY_BASE_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    retry_base_ms: u64,

    /// Longest delay between two attempts of a job, seconds.
    #[arg(long, env = "EPHEM_RETRY_MAX_S", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    retry_max_s: u64,

    /// First delay before a fleet epoch or model the worker refused (KMS unavailable, a key
    /// policy that does not match) is asked for again, seconds; doubles per refusal, up to 15 min.
    #[arg(long, env = "EPHEM_REFUSAL_RETRY_S", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    refusal_retry_s: u64,

    /// Long-poll wait of one receive, seconds.
    #[arg(long, env = "EPHEM_POLL_WAIT_S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=20))]
    poll_wait_s: u64,

    /// How often to look for new fleet-key epochs and model versions, seconds.
    #[arg(long, env = "EPHEM_RESCAN_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    rescan_s: u64,

    /// How often the usage receipts of online requests are collected for the ledger, seconds.
    #[arg(long, env = "EPHEM_USAGE_COLLECT_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    usage_collect_s: u64,

    /// End the worker's open usage periods at each collection: receipts within seconds instead of
    /// after each minute (the development stack; more, shorter receipts).
    #[arg(long, env = "EPHEM_USAGE_FLUSH_EACH")]
    usage_flush_each: bool,

    /// Serve the Oblivious HTTP relay (POST /v1/ohttp, GET /healthz) on this address; off when
    /// unset.
    #[arg(long, env = "EPHEM_ONLINE_LISTEN")]
    online_listen: Option<std::net::SocketAddr>,

    /// Online requests at the enclave at once.
    #[arg(long, env = "EPHEM_ONLINE_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    online_concurrency: u32,

    /// Online requests waiting for a slot at most; beyond, 503.
    #[arg(long, env = "EPHEM_ONLINE_QUEUE", default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=65_536))]
    online_queue: u32,

    /// Longest wait for a slot (`2s`, `500ms`; a bare number is seconds); then 503.
    #[arg(long, env = "EPHEM_ONLINE_QUEUE_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    online_queue_timeout: Duration,

    /// Deadline of one online request, from its arrival to the enclave's last byte; then 504.
    #[arg(long, env = "EPHEM_ONLINE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    online_timeout: Duration,

    #[arg(long, env = "EPHEM_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("host-poller: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let backend = args
        .backend
        .unwrap_or(if std::env::var_os("EPHEM_JOB_QUEUE_URL").is_some() { Backend::Aws } else { Backend::Local });
    // The directory of a local KMS, if KMS is the local one: its HTTPS endpoint is served here.
    let (mut services, local_kms_dir) = match backend {
        Backend::Local => (local_services(&args.home)?, Some(args.home.clone())),
        // Names from EPHEM_* (as user data writes them) or EPHEM_STACK_OUTPUTS; KMS from EPHEM_KMS.
        Backend::Aws => {
            let settings = cloud_aws::AwsSettings::from_env().map_err(|e| e.to_string())?;
            let services = cloud_aws::AwsCloud::from_config(&settings, Some(cloud_local::open_emulator_kms)).map_err(|e| format!("AWS backend: {e}"))?;
            let local_kms = match &settings.kms {
                cloud_aws::KmsBackend::Local(dir) => Some(dir.clone()),
                cloud_aws::KmsBackend::Aws => None,
            };
            (services, local_kms)
        }
    };

    if let Some(key) = &args.fleet_key {
        services.keys.fleet = key.clone();
    }
    let run_dir = args.run_dir.clone().unwrap_or_else(|| args.home.join("run"));
    let worker = if let Some(binary) = &args.spawn_worker {
        let mut spawn = SpawnConfig::local(&args.home, &run_dir, binary.clone());
        if let Some(dir) = &args.worker_state_dir {
            spawn.state_dir = dir.clone();
        }
        spawn.threads = args.worker_threads;
        spawn.log_file = args.worker_log.clone();
        // In AWS the worker reaches KMS through the parent's vsock-proxy (its default relay); a
        // local KMS is served here, over TLS with a root only a development worker accepts.
        if let Some(dir) = &local_kms_dir {
            spawn.serve_local_kms(dir, services.kms.clone()).map_err(|e| e.to_string())?;
        }
        WorkerSource::Spawn(spawn)
    } else if let Some(endpoint) = &args.worker {
        WorkerSource::Connect(endpoint.clone())
    } else if let Some(cid) = args.enclave_cid {
        let endpoint = WorkerEndpoint::parse(&format!("vsock:{cid}:{}", args.enclave_port)).map_err(|e| e.to_string())?;
        WorkerSource::Connect(endpoint)
    } else {
        return Err("no worker: give --spawn-worker PATH, --worker ENDPOINT or --enclave-cid CID".into());
    };

    let mut config = PollerConfig::new(worker);
    if let Some(host_id) = args.host_id {
        config.host_id = host_id;
    }
    config.concurrency = args.concurrency as usize;
    config.visibility = Duration::from_secs(args.visibility_s);
    config.max_receives = args.max_receives;
    config.poll_wait = Duration::from_secs(args.poll_wait_s);
    config.retry_base = Duration::from_millis(args.retry_base_ms);
    config.retry_max = Duration::from_secs(args.retry_max_s).max(config.retry_base);
    config.rescan_interval = Duration::from_secs(args.rescan_s);
    config.refusal_retry = Duration::from_secs(args.refusal_retry_s);
    config.usage = host_poller::usage::UsageSettings {
        interval: Duration::from_secs(args.usage_collect_s),
        flush_each: args.usage_flush_each,
    };
    if let Some(listen) = args.online_listen {
        let mut online = host_poller::OnlineSettings::new(listen);
        online.concurrency = args.online_concurrency as usize;
        online.queue = args.online_queue as usize;
        online.queue_timeout = args.online_queue_timeout;
        online.request_timeout = args.online_timeout;
        config.online = Some(online);
    }
    if backend == Backend::Local {
        config.pid_file = Some(run_dir.join("host-poller.pid"));
        config.models_status = Some(run_dir.join(host_poller::MODELS_STATUS_FILE));
    }

    let poller = Poller::new(services, config);
    poller.shutdown_handle().on_signals().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    poller.run().map_err(|e| e.to_string())
}

/// `30s`, `500ms`, or a bare number of seconds; at least a millisecond, at most an hour.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit_ms) = match text.strip_suffix("ms") {
        Some(number) => (number, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1_000),
    };
    let ms = number.trim().parse::<u64>().map_err(|_| format!("{text:?}: expected e.g. 30s or 500ms"))?.saturating_mul(unit_ms);
    if !(1..=3_600_000).contains(&ms) {
        return Err(format!("{text:?}: between 1ms and 3600s"));
    }
    Ok(Duration::from_millis(ms))
}

fn local_services(home: &std::path::Path) -> Result<cloud::Services, String> {
    let local = cloud_local::LocalCloud::open(home).map_err(|e| format!("local stack under {}: {e}", home.display()))?;
    Ok(local.services())
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // Colours only on a terminal: `dev up` sends this output to a log file.
        LogFormat::Text => builder.with_target(false).with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}
