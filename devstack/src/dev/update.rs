//! `ephem-batch dev update-image --worker PATH`: an enclave image update on the development
//! stack, in the order `scripts/deploy.sh --update-image` follows in an account
//! (docs/operations.md §4), so the emulator flow can show that no job is lost:
//!
//! 1. both images' policies where the ledger's appenders read them (`dev/policies/`), and the
//!    appenders restarted (in AWS a configuration change starts fresh Lambda instances);
//! 2. the new image's fleet and model keys (bound to its PCR0), beside the running image's;
//! 3. the model sealed under the new model key as the next version, for the new image only;
//! 4. a host of the new image beside the running one; its worker creates an epoch under the new
//!    fleet key (5) and attests;
//! 6. clients move: `dev/policy.json` (what clients are given) names the new image;
//! 7. once the job queue has stayed empty for a while (a job sealed to the old image's epoch
//!    that a new host receives meanwhile is handed over to the old host), the running image's
//!    host is drained (one SIGTERM: it finishes what it holds) and stopped; the new host becomes
//!    the stack's host, and the key aliases name the new image's keys.
//!
//! On the development NSM an image's PCR0 is the SHA-384 of the worker binary, so a copy of the
//! worker with other bytes appended is a new image that runs the same code.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use cloud_local::kms::LocalKeyPolicy;
use protocol::attestation::SignedPolicy;

use ephem_batch_client::backend::BackendArgs;
use ephem_batch_client::home::{write_private, Home};

use super::{aws, current_epoch, ensure_model, sha384_file, start_host, stop, wait_for, write_policy_to, HostSpec};

#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// The new image: an `enclave-worker` binary (on the development NSM its SHA-384 is PCR0).
    #[arg(long)]
    pub worker: PathBuf,
    /// Model directory to seal for the new image (as for `dev up`).
    #[arg(long, env = "EPHEM_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Inference threads of the new worker (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Jobs the new host runs at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// How long the running image's host may take to finish the jobs it holds, seconds.
    #[arg(long, default_value_t = 1800)]
    pub drain_s: u64,
}

/// The policies of images an update rolls in or out, beside `dev/policy.json`.
fn policies_dir(home: &Home) -> PathBuf {
    home.dev_policy().with_file_name("policies")
}

/// Every policy file in `dev/policies/`, by name.
pub fn image_policies(home: &Home) -> anyhow::Result<Vec<PathBuf>> {
    let dir = policies_dir(home);
    let mut files = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("listing {}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    Ok(files)
}

/// The process names of incoming images' hosts an update left running (`run/image-*.pid`).
pub fn incoming_hosts(home: &Home) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(home.run_dir()) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".pid").filter(|n| n.starts_with("image-")).map(str::to_owned))
        .collect()
}

fn short(pcr0: &[u8]) -> String {
    hex::encode(&pcr0[..6])
}

/// PCR0 of the image `dev/policy.json` names: the one clients are given now.
fn running_image(home: &Home) -> anyhow::Result<[u8; 48]> {
    let path = home.dev_policy();
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {} (run `ephem-batch dev up` first)", path.display()))?;
    let signed = SignedPolicy::from_json(&text).with_context(|| format!("{}", path.display()))?;
    let pcr0 = signed.policy.pcrs.get(&0).cloned().ok_or_else(|| anyhow!("{} names no PCR0", path.display()))?;
    pcr0.try_into().map_err(|_| anyhow!("{}: PCR0 is not 48 bytes", path.display()))
}

/// Restarts what appends receipts to the ledger, so that it reads the policies again.
fn restart_appenders(home: &Home, backend: &BackendArgs, opened: &ephem_batch_client::backend::Opened) -> anyhow::Result<()> {
    if opened.aws.is_some() {
        stop(home, aws::PUMP, Duration::from_secs(60));
        aws::start_pump(home, backend)
    } else {
        // The local Lambda runtime reads the policies when it starts (restarted with the default
        // input retention).
        if stop(home, "lambdas", Duration::from_secs(60)) {
            super::start_lambdas(home, 0)?;
        }
        Ok(())
    }
}

pub fn update_image(home: &Home, args: &UpdateArgs, backend: &BackendArgs) -> anyhow::Result<()> {
    let opened = ephem_batch_client::backend::open(home, backend)?;
    let services = opened.services.clone();
    if home.running("host-poller").is_none() {
        bail!("no host runs: `ephem-batch dev up` first (an update rolls a running stack)");
    }
    let old = running_image(home)?;
    let new = sha384_file(&args.worker)?;
    if old == new {
        bail!("{} is the running image (PCR0 {}): nothing to roll out", args.worker.display(), hex::encode(new));
    }
    let kms = super::local_kms(&opened)?;

    println!("1. both images' policies for the ledger (running {}, new {})", short(&old), short(&new));
    let dir = policies_dir(home);
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(home.dev_policy(), dir.join(format!("{}.json", short(&old))))?;
    let new_policy = dir.join(format!("{}.json", short(&new)));
    write_policy_to(home, new, &new_policy)?;
    restart_appenders(home, backend, &opened)?;

    println!("2. the new image's fleet and model keys");
    let fleet_key = kms.create_key(LocalKeyPolicy::fleet(new.to_vec(), None), "ephem-batch fleet keys (local, incoming image)")?;
    let model_key = kms.create_key(LocalKeyPolicy::model(new.to_vec(), None), "ephem-batch model keys (local, incoming image)")?;

    println!("3. the model sealed under the new model key, for the new image");
    let model_dir = args.model_dir.clone().unwrap_or_else(|| home.default_model_dir());
    let manifest = ensure_model(&services, &model_key, &model_dir, new)?;
    println!("   {manifest}");

    println!("4. a host of the new image beside the running one");
    let run_dir = home.run_dir().join(format!("image-{}", short(&new)));
    let host = HostSpec {
        name: format!("image-{}", short(&new)),
        worker: args.worker.clone(),
        pcr0: new,
        fleet_key: fleet_key.clone(),
        run_dir: Some(run_dir.clone()),
        host_id: Some(format!("image-{}", short(&new))),
    };
    let cold = std::time::Instant::now();
    start_host(home, backend, &opened, &host, args.threads, args.concurrency)?;
    // A host's cold start here: worker start, model load, epoch creation, attestation (an
    // account adds the instance's boot and the enclave's start).
    println!("   attested {:.1} s after its start", cold.elapsed().as_secs_f64());

    println!("5. its epoch under the new fleet key, with its genesis");
    let mut epoch = None;
    wait_for("the new image's worker to create a fleet epoch", Duration::from_secs(120), || {
        epoch = current_epoch(&services, &fleet_key)?;
        Ok(epoch.is_some())
    })?;
    println!("   epoch {}", epoch.unwrap_or_default());

    println!("6. clients move to the new image: {} is its policy", home.dev_policy().display());
    std::fs::copy(&new_policy, home.dev_policy())?;

    println!("7. the running image's host drained and stopped, once the job queue is empty");
    wait_for_quiet_queue(&services, QUIET)?;
    stop(home, "host-poller", Duration::from_secs(args.drain_s));
    std::fs::rename(home.pid_file(&host.name), home.pid_file("host-poller"))?;
    let relay = std::fs::read(run_dir.join("online-relay.url"))?;
    write_private(&home.local_relay_url_file(), &relay)?;
    // The aliases are this stack's stand-in for the deployment's FleetKeyArn, which a client
    // checks the attested key against: moved last, so a client of the old image is not refused
    // while its host still serves.
    kms.set_alias(cloud_local::FLEET_KEY_ALIAS, &fleet_key)?;
    kms.set_alias(cloud_local::MODEL_KEY_ALIAS, &model_key)?;
    println!("the stack runs PCR0 {}; clients use {}", hex::encode(new), home.dev_policy().display());
    Ok(())
}

/// How long the job queue must stay empty before the running image's host is drained: a job a
/// client of the old image sealed just before it moved is taken meanwhile.
const QUIET: Duration = Duration::from_secs(15);

/// Waits until the job queue has held no message — visible, delayed or in flight — for `quiet`
/// in a row. In flight counts too: a message a new host holds may be a job of the old image on
/// its way to being handed over, which only the old image's host can still serve.
fn wait_for_quiet_queue(services: &cloud::Services, quiet: Duration) -> anyhow::Result<()> {
    let mut since = std::time::Instant::now();
    wait_for("the job queue to stay empty", Duration::from_secs(3600), || {
        let stats = services.job_queue.stats()?;
        if stats.visible + stats.delayed + stats.in_flight > 0 {
            since = std::time::Instant::now();
        }
        Ok(since.elapsed() >= quiet)
    })
}
