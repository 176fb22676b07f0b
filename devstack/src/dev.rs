//! `ephem-batch dev up | down | status`: the embedded default's stack under `$EPHEM_HOME`.
//!
//! `up` is idempotent: it creates what is missing — KMS keys bound to the local worker binary's
//! measurement, a fleet-key epoch, the encrypted and signed default model, a development policy —
//! and starts what is not running: `host-poller` (which starts and supervises `enclave-worker`)
//! and the local Lambda runtime (`ephem-batch dev run-lambdas`: the ledger queue's event source
//! for `ledger-append`, the event sources of `job-dead-letter` (on-upload's failures, the jobs
//! DLQ), the input-expiry lifecycle rule, and the bulk workflow's executions).
//! One pid file per process in `run/`, one log per process in `logs/`.
//!
//! With `--backend aws` (against an emulator: see [`aws`]) `up` does the same over S3 and SQS:
//! the host-poller runs in aws mode, `ephem-batch dev aws-pump` stands in for the bucket
//! notification and the Lambdas, and KMS is the local one (`--kms local`), because the
//! development worker's attestation is one only the local KMS can check.

pub mod aws;
pub mod update;
pub mod witness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use cloud_local::kms::{LocalKeyPolicy, LocalKms};
use cloud_local::LocalCloud;
use cloud::{layout, Services};
use ed25519_dalek::SigningKey;
use protocol::attestation::dev_issuer::development_pcrs;
use protocol::attestation::{Policy, TrustAnchor};
use sha2::{Digest, Sha384};

use ephem_batch_client::backend::{Backend, BackendArgs};
use ephem_batch_client::home::{write_private, Home};
use ephem_batch_client::submit::DEFAULT_MODEL;

#[derive(Subcommand, Debug)]
pub enum DevCommand {
    /// Start the local stack (idempotent: only what is missing is created or started).
    Up(UpArgs),
    /// Stop every process of the local stack (SIGTERM: in-flight jobs finish first).
    Down,
    /// What runs, what is queued, which epochs and models exist.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The local Lambda runtime (started by `dev up`).
    #[command(hide = true)]
    RunLambdas {
        /// Keep a sealed input this long after the ledger holds its receipt.
        #[arg(long, default_value_t = 0)]
        input_retention_s: u64,
    },
    /// Against an emulator: feed S3 upload events to `on-upload` and the ledger queue to
    /// `ledger-append`, as the bucket notification and the Lambdas do in AWS (started by
    /// `dev up --backend aws`).
    AwsPump(aws::PumpArgs),
    /// Roll out another enclave image beside the running one, then retire the running one, in
    /// the order an account update follows (docs/operations.md §4).
    UpdateImage(update::UpdateArgs),
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Model directory (config.json, tokenizer.json, model.safetensors). Default:
    /// `$EPHEM_MODEL_DIR`, else `$EPHEM_HOME/models/all-MiniLM-L6-v2` (scripts/setup-model.sh).
    #[arg(long, env = "EPHEM_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Inference threads of the worker (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Jobs the host-poller runs at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Keep a sealed input this long after the ledger holds its receipt.
    #[arg(long, default_value_t = 0)]
    pub input_retention_s: u64,
}

/// Where the project's binaries are: `$EPHEM_BIN_DIR`, else beside this executable.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("EPHEM_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()?.parent().ok_or_else(|| anyhow!("no directory for this executable"))?.to_path_buf(),
    };
    let path = dir.join(name);
    if !path.is_file() {
        bail!("{} not found (build it: cargo build --release --bins, or set EPHEM_BIN_DIR)", path.display());
    }
    Ok(path)
}

fn sha384_file(path: &Path) -> anyhow::Result<[u8; 48]> {
    let mut file = std::fs::File::open(path).with_context(|| format!("measuring {}", path.display()))?;
    let mut hasher = Sha384::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buffer).with_context(|| format!("measuring {}", path.display()))?;
        if n == 0 {
            return Ok(hasher.finalize().into());
        }
        hasher.update(&buffer[..n]);
    }
}

// --- processes -------------------------------------------------------------------------------

fn spawn(home: &Home, name: &str, program: &Path, args: &[String], env: &[(&str, String)]) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(home.logs_dir())?;
    std::fs::create_dir_all(home.run_dir())?;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(home.log_file(name))?;
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal does not reach the stack.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    std::fs::write(home.pid_file(name), format!("{}\n", child.id()))?;
    Ok(child.id())
}

fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).stderr(Stdio::null()).status();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) != Some("Z"))
        .unwrap_or(false)
}

/// SIGTERM, then up to `grace` for the process to finish its work, then SIGKILL.
fn stop(home: &Home, name: &str, grace: Duration) -> bool {
    let Some(pid) = home.running(name) else {
        let _ = std::fs::remove_file(home.pid_file(name));
        return false;
    };
    signal(pid, "TERM");
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if alive(pid) {
        signal(pid, "KILL");
    }
    let _ = std::fs::remove_file(home.pid_file(name));
    true
}

// --- keys, epochs, model, policy -------------------------------------------------------------

/// The key behind `alias` if its policy binds `pcr0`; else a new key with that policy, and the
/// alias moved to it. A key's policy is never edited: a new measurement means a new key.
fn ensure_key(kms: &LocalKms, alias: &str, policy: LocalKeyPolicy, description: &str) -> anyhow::Result<String> {
    if let Ok(key_id) = kms.resolve(alias) {
        if kms.key_policy(&key_id).map(|p| p == policy).unwrap_or(false) {
            return Ok(key_id);
        }
    }
    let key_id = kms.create_key(policy, description)?;
    kms.set_alias(alias, &key_id)?;
    eprintln!("created KMS key {key_id} ({alias})");
    Ok(key_id)
}

/// The newest epoch under `fleet_key` that has a genesis: the enclave created it (the host asks
/// its worker for one when none lasts long enough; docs/protocol.md §7.4).
fn current_epoch(services: &Services, fleet_key: &str) -> anyhow::Result<Option<u64>> {
    let now = cloud::now_ms();
    for record in lambdas::fleet_epochs::epochs(services)?.into_iter().rev() {
        if record.kms_key_id == fleet_key
            && record.not_after_ms > now
            && services.attestations.head(&protocol::fleet::genesis_object_key(record.epoch))?.is_some()
        {
            return Ok(Some(record.epoch));
        }
    }
    Ok(None)
}

/// The newest version sealed under `model_key`, else a new version sealed under it for the image
/// measured `pcr0`.
fn ensure_model(services: &Services, model_key: &str, model_dir: &Path, pcr0: [u8; 48]) -> anyhow::Result<String> {
    let publisher = protocol::manifest::development_publisher();
    let name = DEFAULT_MODEL.rsplit('/').next().unwrap_or(DEFAULT_MODEL);
    let mut newest = 0;
    for meta in services.models.list(&format!("{}{name}/", layout::MODELS_PREFIX))? {
        let Some(version) = layout::manifest_version(&meta.key) else { continue };
        newest = newest.max(version);
        let bytes = services.models.get(&meta.key)?;
        let signed = protocol::manifest::SignedManifest::decode(&bytes)?;
        if signed.manifest.kms_key_id == model_key && signed.verify(&publisher.verifying_key()).is_ok() {
            return Ok(meta.key);
        }
    }
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        if !model_dir.join(file).is_file() {
            bail!("{} has no {file}: run scripts/setup-model.sh (or pass --model-dir)", model_dir.display());
        }
    }
    let offering = ephem_batch_client::model::Offering { images: vec![pcr0], ..Default::default() };
    let published = ephem_batch_client::model::publish_offering(
        model_dir,
        DEFAULT_MODEL,
        newest + 1,
        &offering,
        services.kms.as_ref(),
        model_key,
        &publisher,
        services.models.as_ref(),
    )?;
    eprintln!("model {DEFAULT_MODEL} v{} encrypted and published", newest + 1);
    Ok(published.manifest_key)
}

fn image_publisher(home: &Home) -> anyhow::Result<SigningKey> {
    let path = home.dev_image_publisher_key();
    if path.exists() {
        return ephem_batch_client::keys::read_signing_key(&path);
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow!("random: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    write_private(&path, hex::encode(seed).as_bytes())?;
    std::fs::write(home.dev_image_publisher_pub(), hex::encode(key.verifying_key().to_bytes()))?;
    Ok(key)
}

/// The development policy: the development root, the worker binary's PCRs, signed by the
/// development image publisher.
fn write_policy(home: &Home, pcr0: [u8; 48]) -> anyhow::Result<()> {
    write_policy_to(home, pcr0, &home.dev_policy())
}

fn write_policy_to(home: &Home, pcr0: [u8; 48], path: &Path) -> anyhow::Result<()> {
    let pem = std::fs::read_to_string(home.dev_root_pem())?;
    let root = TrustAnchor::from_pem(&pem)?;
    let pcrs = development_pcrs(pcr0);
    let mut policy = Policy::aws((0..3u8).map(|i| (i, pcrs[i as usize].to_vec())).collect());
    policy.root = root;
    let signed = policy.sign(&image_publisher(home)?)?;
    std::fs::write(path, signed.to_json())?;
    Ok(())
}

/// One host of the stack: a host-poller that starts and supervises one enclave image.
struct HostSpec {
    /// Its process name (`run/<name>.pid`, `logs/<name>.log`).
    name: String,
    worker: PathBuf,
    /// Its measurement (the worker binary's SHA-384), which its published document must carry.
    pcr0: [u8; 48],
    /// The KMS key its worker creates epochs under: the image's own.
    fleet_key: String,
    /// Its pid files and sockets (`--run-dir`); `None`: the home's `run/`.
    run_dir: Option<PathBuf>,
    /// Its published document's name (`--host-id`); `None`: the machine's host name.
    host_id: Option<String>,
}

/// Starts `host` and waits until its worker has published an attestation document; the Oblivious
/// HTTP relay on a free loopback port, recorded for `serve` and `status` when the host is the
/// stack's only one.
fn start_host(
    home: &Home,
    backend: &BackendArgs,
    opened: &ephem_batch_client::backend::Opened,
    host: &HostSpec,
    threads: usize,
    concurrency: usize,
) -> anyhow::Result<u32> {
    let started = cloud::now_ms();
    let services = &opened.services;
    let (backend_name, env, max_receives) = match &opened.aws {
        None => ("local", Vec::new(), cloud_local::MAX_RECEIVES),
        Some(cloud) => ("aws", aws::child_env(home, backend)?, aws::max_receives(cloud)?),
    };
    let relay_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut args: Vec<String> = vec![
        "--online-listen".into(),
        format!("127.0.0.1:{relay_port}"),
        "--backend".into(),
        backend_name.into(),
        "--max-receives".into(),
        max_receives.to_string(),
        "--home".into(),
        home.root().display().to_string(),
        "--spawn-worker".into(),
        host.worker.display().to_string(),
        "--fleet-key".into(),
        host.fleet_key.clone(),
        "--worker-threads".into(),
        threads.to_string(),
        "--concurrency".into(),
        concurrency.to_string(),
        // Online usage reaches the local ledger within seconds, not after each minute.
        "--usage-collect-s".into(),
        "2".into(),
        "--usage-flush-each".into(),
    ];
    if let Some(dir) = &host.run_dir {
        std::fs::create_dir_all(dir)?;
        args.extend(["--run-dir".into(), dir.display().to_string()]);
    }
    if let Some(id) = &host.host_id {
        args.extend(["--host-id".into(), id.clone()]);
    }
    std::fs::create_dir_all(home.run_dir())?;
    let relay_url = format!("http://127.0.0.1:{relay_port}/v1/ohttp\n");
    let relay_file = match &host.run_dir {
        None => home.local_relay_url_file(),
        Some(dir) => dir.join("online-relay.url"),
    };
    write_private(&relay_file, relay_url.as_bytes())?;
    let pid = spawn(home, &host.name, &binary("host-poller")?, &args, &env)?;
    eprintln!("started {} (pid {pid}), which starts {}", host.name, host.worker.display());
    wait_for("the enclave worker to publish its attestation document", Duration::from_secs(120), || {
        // By pid: until the child has exec'd, its command line is still this program's.
        if !alive(pid) {
            bail!("{} exited; see {}", host.name, home.log_file(&host.name).display());
        }
        for meta in services.attestations.list(layout::ATTESTATIONS_CURRENT_PREFIX)? {
            if meta.modified_ms + 1000 < started {
                continue;
            }
            let Ok(bytes) = services.attestations.get(&meta.key) else { continue };
            let pcr0 = protocol::attestation::AttestationDocument::parse_unverified(&bytes).ok().and_then(|d| d.pcrs.get(&0).cloned());
            if pcr0.as_deref() == Some(host.pcr0.as_slice()) {
                return Ok(true);
            }
        }
        Ok(false)
    })?;
    Ok(pid)
}

/// The local KMS the stack administers (keys bound to the worker's measurement).
fn local_kms(opened: &ephem_batch_client::backend::Opened) -> anyhow::Result<Arc<LocalKms>> {
    Ok(match (&opened.local, &opened.aws) {
        (Some(local), _) => local.kms(),
        (None, Some(cloud)) => Arc::new(aws::local_kms_of(cloud)?),
        (None, None) => unreachable!("a backend is always opened"),
    })
}

/// The local Lambda runtime (`dev run-lambdas`), its checkpoints witnessed by the local witness.
fn start_lambdas(home: &Home, input_retention_s: u64) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let args: Vec<String> = vec![
        "--home".into(),
        home.root().display().to_string(),
        "dev".into(),
        "run-lambdas".into(),
        "--input-retention-s".into(),
        input_retention_s.to_string(),
    ];
    let witnesses = witness::start(home)?;
    let pid = spawn(home, "lambdas", &me, &args, &[(receipts_ledger::witness_client::WITNESSES_ENV, witnesses)])?;
    eprintln!("started the local Lambda runtime (pid {pid})");
    Ok(())
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready()? {
        if Instant::now() > deadline {
            bail!("timed out after {}s waiting for {what}", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn published_pcr0(services: &Services) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut values = Vec::new();
    for meta in services.attestations.list(layout::ATTESTATIONS_CURRENT_PREFIX)? {
        if let Ok(bytes) = services.attestations.get(&meta.key) {
            if let Ok(doc) = protocol::attestation::AttestationDocument::parse_unverified(&bytes) {
                values.extend(doc.pcrs.get(&0).cloned());
            }
        }
    }
    Ok(values)
}

pub fn up(home: &Home, args: &UpArgs, backend: &BackendArgs) -> anyhow::Result<()> {
    let opened = ephem_batch_client::backend::open(home, backend)?;
    let services = opened.services.clone();
    let worker_bin = binary("enclave-worker")?;
    let pcr0 = sha384_file(&worker_bin)?;

    if home.running("host-poller").is_some() {
        let published = published_pcr0(&services)?;
        if !published.is_empty() && !published.contains(&pcr0.to_vec()) {
            bail!(
                "the running enclave worker was built from another binary than {} (PCR0 differs): \
                 run `ephem-batch dev down` first, then `ephem-batch dev up`",
                worker_bin.display()
            );
        }
    }
    let kms = local_kms(&opened)?;
    let fleet_key = ensure_key(&kms, cloud_local::FLEET_KEY_ALIAS, LocalKeyPolicy::fleet(pcr0.to_vec(), None), "ephem-batch fleet keys (local)")?;
    let model_key = ensure_key(&kms, cloud_local::MODEL_KEY_ALIAS, LocalKeyPolicy::model(pcr0.to_vec(), None), "ephem-batch model keys (local)")?;
    let model_dir = args.model_dir.clone().unwrap_or_else(|| home.default_model_dir());
    let manifest_key = ensure_model(&services, &model_key, &model_dir, pcr0)?;

    if home.running("host-poller").is_none() {
        let host = HostSpec { name: "host-poller".into(), worker: worker_bin.clone(), pcr0, fleet_key: fleet_key.clone(), run_dir: None, host_id: None };
        start_host(home, backend, &opened, &host, args.threads, args.concurrency)?;
    }
    write_policy(home, pcr0)?;
    let mut epoch = None;
    wait_for("the enclave worker to create a fleet epoch", Duration::from_secs(120), || {
        epoch = current_epoch(&services, &fleet_key)?;
        Ok(epoch.is_some())
    })?;
    let epoch = epoch.unwrap_or_default();

    if opened.aws.is_some() {
        aws::start_pump(home, backend)?;
    } else if home.running("lambdas").is_none() {
        start_lambdas(home, args.input_retention_s)?;
    }
    eprintln!(
        "\nWARNING: this local stack attests with a DEVELOPMENT root ({}):\n\
         it proves nothing about Nitro hardware, and this machine's owner can read everything.\n",
        home.dev_root_pem().display()
    );
    println!("stack up in {}", home.root().display());
    println!("  fleet epoch   {epoch}");
    println!("  model         {manifest_key}");
    println!("  PCR0          {}", hex::encode(pcr0));
    println!("  policy        {}", home.dev_policy().display());
    if let Some(url) = home.local_relay_url() {
        println!("  online relay  {url}");
    }
    Ok(())
}

pub fn down(home: &Home) -> anyhow::Result<()> {
    let mut stopped = Vec::new();
    // The pollers first (an image update's incoming host too): each finishes its in-flight jobs
    // and stops its worker itself.
    let incoming = update::incoming_hosts(home);
    let names = ["host-poller"].into_iter().chain(incoming.iter().map(String::as_str));
    for name in names.chain(["lambdas", aws::PUMP, "enclave-worker", witness::PROCESS]) {
        if stop(home, name, Duration::from_secs(120)) {
            stopped.push(name.to_owned());
        }
    }
    if stopped.is_empty() {
        println!("nothing was running");
    } else {
        println!("stopped {}", stopped.join(", "));
    }
    Ok(())
}

pub fn status(home: &Home, backend: &BackendArgs, json: bool) -> anyhow::Result<()> {
    type DeadLetters = Vec<(String, Arc<dyn cloud::Queue>)>;
    let (services, dead_letters): (Services, DeadLetters) = match backend.backend {
        Backend::Local => {
            let local = LocalCloud::open(home.root())?;
            let dlqs: DeadLetters = vec![
                (cloud_local::JOB_DLQ.to_owned(), local.job_dlq()),
                (cloud_local::LEDGER_DLQ.to_owned(), local.ledger_dlq()),
                (cloud_local::UPLOAD_FAILURES.to_owned(), local.upload_failures()),
            ];
            (local.services(), dlqs)
        }
        Backend::Aws => {
            let cloud = ephem_batch_client::backend::open(home, backend)?.aws.expect("the aws backend");
            let dlqs = [("jobs-dlq", cloud.job_dlq()), ("ledger-dlq", cloud.ledger_dlq())]
                .into_iter()
                .filter_map(|(name, q)| q.map(|q| (name.to_owned(), Arc::new(q) as Arc<dyn cloud::Queue>)))
                .collect();
            (cloud.services(), dlqs)
        }
    };
    let processes: BTreeMap<&str, Option<u32>> =
        ["host-poller", "enclave-worker", "lambdas", aws::PUMP].into_iter().map(|n| (n, home.running(n))).collect();
    let mut queues = BTreeMap::new();
    for (name, queue) in [("jobs", &services.job_queue), ("ledger", &services.ledger_queue)] {
        queues.insert(name.to_owned(), queue.stats()?);
    }
    for (name, queue) in &dead_letters {
        queues.insert(name.clone(), queue.stats()?);
    }
    let epochs = lambdas::fleet_epochs::epochs(&services)?;
    let models: Vec<String> = services.models.list(layout::MODELS_PREFIX)?.into_iter().filter(|m| layout::manifest_version(&m.key).is_some()).map(|m| m.key).collect();
    let published = services.attestations.list(layout::ATTESTATIONS_CURRENT_PREFIX)?;
    let held = processes["host-poller"].and_then(|_| worker_models(home));
    if json {
        let value = serde_json::json!({
            "home": home.root(),
            "processes": processes,
            "queues": queues.iter().map(|(n, s)| (n.clone(), serde_json::json!({"visible": s.visible, "in_flight": s.in_flight, "delayed": s.delayed}))).collect::<serde_json::Map<_, _>>(),
            "epochs": epochs.iter().map(|e| serde_json::json!({"epoch": e.epoch, "not_after_ms": e.not_after_ms})).collect::<Vec<_>>(),
            "models": models,
            "published_documents": published.iter().map(|m| &m.key).collect::<Vec<_>>(),
            "online_relay": home.local_relay_url(),
            "worker_models": held,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("home {}", home.root().display());
    for (name, pid) in &processes {
        match pid {
            Some(pid) => println!("  {name:15} running (pid {pid})"),
            None => println!("  {name:15} stopped"),
        }
    }
    for (name, stats) in &queues {
        println!("  queue {name:10} {} visible, {} in flight, {} delayed", stats.visible, stats.in_flight, stats.delayed);
    }
    for epoch in &epochs {
        println!("  fleet epoch {} valid until {}", epoch.epoch, protocol::attestation::format_ms(epoch.not_after_ms));
    }
    for model in &models {
        println!("  model {model}");
    }
    for meta in &published {
        println!("  published {} ({})", meta.key, protocol::attestation::format_ms(meta.modified_ms));
    }
    if let Some(held) = &held {
        let mib = |v: &serde_json::Value| v.as_u64().unwrap_or(0) as f64 / f64::from(1 << 20);
        println!("  model memory  {:.1} MiB of a {:.1} MiB budget", mib(&held["used_bytes"]), mib(&held["budget_bytes"]));
        for model in held["models"].as_array().into_iter().flatten() {
            let last_use = model["last_use_ms"].as_u64().map_or_else(String::new, protocol::attestation::format_ms);
            println!(
                "  loaded {} v{}  {:.1} MiB, last used {last_use}",
                model["model_id"].as_str().unwrap_or("?"),
                model["version"],
                mib(&model["bytes"])
            );
        }
    }
    if let Some(url) = home.local_relay_url() {
        println!("  online relay  {url}");
    }
    Ok(())
}

/// The models the worker holds and its memory budget, as the host-poller last wrote them
/// (`run/worker-models.json`, host_poller::MODELS_STATUS_FILE); none before its first pass.
fn worker_models(home: &Home) -> Option<serde_json::Value> {
    let bytes = std::fs::read(home.run_dir().join("worker-models.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What the home's appenders admit: receipts under its development root whose documents satisfy
/// its development policy (`dev up` writes it, signed by the development image publisher) or
/// the policy of an image an update rolls in or out (`dev/policies/`). A policy that does not
/// verify stops the appender: it never admits any image instead.
pub fn home_policies(home: &Home) -> anyhow::Result<(TrustAnchor, protocol::attestation::PolicySet)> {
    wait_for("the development root and policy", Duration::from_secs(120), || {
        Ok(home.dev_root_pem().is_file() && home.dev_policy().is_file())
    })?;
    let anchor = TrustAnchor::from_pem(&std::fs::read_to_string(home.dev_root_pem())?)?;
    let publisher = std::fs::read_to_string(home.dev_image_publisher_pub())
        .with_context(|| format!("reading {}", home.dev_image_publisher_pub().display()))?;
    let publisher = ephem_batch_client::trust::parse_key(&publisher, "the development image publisher key")?;
    let mut files = Vec::new();
    for file in std::iter::once(home.dev_policy()).chain(update::image_policies(home)?) {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        files.push((file.display().to_string(), text));
    }
    let set = protocol::attestation::PolicySet::from_json(&publisher, &files)?;
    for p in set.policies() {
        tracing::info!(policy = %hex::encode(p.id), source = %p.source, "receipts admitted under this policy");
    }
    Ok((anchor, set))
}

/// The local Lambda runtime: the event sources of the ledger queue and of `job-dead-letter`, the
/// input-expiry rule, and the stand-in for Step Functions that runs bulk workflows, until SIGTERM.
pub fn run_lambdas(home: &Home, input_retention: Duration) -> anyhow::Result<()> {
    use receipts_ledger::local::LocalLedger;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let (services, local) = ephem_batch_client::backend::open_local(home)?;
    let (anchor, policies) = home_policies(home)?;
    let check = Arc::new(protocol::receipt_check::ReceiptVerifier::enforcing(anchor, policies)?);
    let runner = Arc::new(crate::local_workflow::Runner {
        services: services.clone(),
        workflows: local.workflows(),
        config: lambdas::on_upload::Config::from_list(cloud_local::STORE_PREFIX),
        check: check.clone(),
        poll: Duration::from_millis(250),
    });
    let workflows = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new().name("bulk-workflows".into()).spawn(move || {
            if let Err(error) = runner.serve(stop) {
                tracing::error!(%error, "bulk workflows stopped");
            }
        })?
    };
    let (ledger, verifier) = LocalLedger::open(&home.ledger_dir(), Box::new(check.clone()))?;
    let mut ledger = ledger.with_witnesses(receipts_ledger::WitnessClient::from_env()?);
    tracing::info!(ledger_key = %verifier, "local Lambda runtime started");
    let mut last_expiry = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match crate::local::pump_ledger_queue(&services, &mut ledger, Duration::from_secs(1)) {
            // Locally a checkpoint right away, so a proof is available as soon as the entry is.
            Ok(n) if n > 0 => {
                if let Err(error) = ledger.checkpoint_now(cloud::now_ms()) {
                    tracing::warn!(%error, "checkpoint not signed");
                }
                if let Some(Err(error)) = ledger.cosign_latest() {
                    tracing::warn!(%error, "checkpoint not cosigned");
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "ledger queue");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let config = lambdas::on_upload::Config::from_list(cloud_local::STORE_PREFIX);
        for queue in [local.upload_failures(), local.job_dlq()] {
            if let Err(error) = crate::local::pump_dead_letters(&services, &config, queue.as_ref(), Duration::ZERO) {
                tracing::warn!(%error, queue = cloud::Queue::name(queue.as_ref()), "dead letters");
            }
        }
        if last_expiry.elapsed() > Duration::from_secs(5) {
            if let Err(error) = crate::local::expire_inputs(&services, ledger.store(), input_retention, cloud::now_ms()) {
                tracing::warn!(%error, "input expiry");
            }
            last_expiry = Instant::now();
        }
    }
    let _ = workflows.join();
    tracing::info!("local Lambda runtime stopped");
    Ok(())
}
