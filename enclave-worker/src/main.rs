//! `enclave-worker`: the process that runs inside the enclave (or, for the embedded default,
//! beside the host-poller with the development NSM).
//!
//! ```text
//! enclave-worker --listen unix:PATH|tcp:HOST:PORT|vsock:PORT [--kms-relay ENDPOINT]
//!                [--kms-tls-root PEM] [--state-dir DIR] [--threads N] [--model-memory-mib N]
//! ```
//!
//! `--kms-relay` is where a byte relay to KMS listens (in an enclave `vsock:3:8000`, the
//! parent's `vsock-proxy`, the default there). `--kms-tls-root` replaces the compiled-in Amazon
//! roots by a development root, and is refused unless the NSM is the development one.
//!
//! `--model-memory-mib` (or `EPHEM_MODEL_MEMORY_MIB`) is the budget of the models the worker
//! holds, as their engines measure them; loading one that does not fit evicts the least recently
//! used. Without it, half the machine's memory (`MemTotal`; in an enclave, its allocation), so
//! the models never take it all.

use std::process::ExitCode;
use std::sync::Arc;

use enclave_worker::inference::EngineSettings;
use enclave_worker::key_release::kms_https::{KmsHttps, KmsRoots};
use enclave_worker::key_release::RsaKeyPool;
use enclave_worker::transport::{Endpoint, Listener};
use enclave_worker::{serve_connection, Worker};

struct Args {
    listen: Endpoint,
    kms_relay: Option<Endpoint>,
    kms_tls_root: Option<std::path::PathBuf>,
    state_dir: std::path::PathBuf,
    threads: usize,
    model_memory_mib: Option<u64>,
}

const USAGE: &str = "usage: enclave-worker --listen unix:PATH|tcp:HOST:PORT [--kms-relay ENDPOINT] [--kms-tls-root PEM] [--state-dir DIR] [--threads N] [--model-memory-mib N]";

/// The parent instance's `vsock-proxy` to KMS, as the host's user data starts it.
#[cfg(feature = "nitro")]
const DEFAULT_KMS_RELAY: Option<&str> = Some("vsock:3:8000");
#[cfg(not(feature = "nitro"))]
const DEFAULT_KMS_RELAY: Option<&str> = None;

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut kms_relay = DEFAULT_KMS_RELAY.map(Endpoint::parse).transpose()?;
    let mut kms_tls_root = None;
    let mut state_dir = std::path::PathBuf::from(".ephem/enclave");
    let mut threads = 0;
    let mib = |text: &str, from: &str| match text.trim().parse::<u64>() {
        Ok(mib) if mib > 0 => Ok(mib),
        _ => Err(format!("{from} takes a number of MiB above 0")),
    };
    let mut model_memory_mib = match std::env::var("EPHEM_MODEL_MEMORY_MIB") {
        Ok(text) => Some(mib(&text, "EPHEM_MODEL_MEMORY_MIB")?),
        Err(_) => None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--listen" => listen = Some(Endpoint::parse(&value()?)?),
            "--kms-relay" => kms_relay = Some(Endpoint::parse(&value()?)?),
            "--kms-tls-root" => kms_tls_root = Some(value()?.into()),
            "--state-dir" => state_dir = value()?.into(),
            "--threads" => threads = value()?.parse().map_err(|_| "--threads takes a number".to_owned())?,
            "--model-memory-mib" => model_memory_mib = Some(mib(&value()?, "--model-memory-mib")?),
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(Args { listen: listen.ok_or_else(|| USAGE.to_owned())?, kms_relay, kms_tls_root, state_dir, threads, model_memory_mib })
}

/// The worker's own KMS client. A development root is accepted only beside the development NSM:
/// a production image trusts the Amazon roots it was measured with, whatever the host passes.
fn kms_client(args: &Args, development_nsm: bool) -> Result<KmsHttps, String> {
    let relay = args.kms_relay.clone().ok_or("--kms-relay is required (where the byte relay to KMS listens)")?;
    let roots = match &args.kms_tls_root {
        None => KmsRoots::Amazon,
        Some(_) if !development_nsm => return Err("--kms-tls-root is only accepted with the development NSM".into()),
        Some(path) => {
            use rustls::pki_types::{pem::PemObject, CertificateDer};
            let der = CertificateDer::from_pem_file(path).map_err(|e| format!("--kms-tls-root {}: {e}", path.display()))?;
            KmsRoots::Development(der.to_vec())
        }
    };
    KmsHttps::new(relay, &roots)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    // RSA keys for KMS calls are generated in the background while the rest boots.
    let pool = Arc::new(RsaKeyPool::start(4, 2));
    let (nsm, publisher) = match enclave_worker::boot_nsm(&args.state_dir) {
        Ok(pair) => pair,
        Err(message) => {
            eprintln!("enclave-worker: {message}");
            return ExitCode::FAILURE;
        }
    };
    if nsm.is_development() {
        tracing::warn!(
            state_dir = %args.state_dir.display(),
            "DEVELOPMENT NSM: attestation documents are signed by a local development CA, not AWS Nitro"
        );
    }
    let kms = match kms_client(&args, nsm.is_development()) {
        Ok(kms) => kms,
        Err(message) => {
            eprintln!("enclave-worker: {message}");
            return ExitCode::FAILURE;
        }
    };
    let settings = EngineSettings { threads: args.threads, ..EngineSettings::default() };
    let budget = args.model_memory_mib.map_or_else(enclave_worker::worker::default_model_budget, |mib| mib << 20);
    tracing::info!(bytes = budget, "model memory budget");
    let blocking = enclave_worker::inference::dense_blocking();
    tracing::info!(l2_bytes = blocking.l2.0, from_cpuid = blocking.measured, depth_slice = blocking.depth_slice, "dense blocking");
    let units = enclave_worker::inference::dense_units();
    let unit = |unit: Option<enclave_worker::inference::DenseUnit>| unit.map_or("none", |unit| unit.as_str());
    tracing::info!(f32 = unit(units.f32), bf16 = unit(units.bf16), int8 = unit(units.int8), "dense units");
    let worker = Arc::new(Worker::new(nsm, publisher, settings, kms).with_model_budget(budget));
    let online = Arc::new(enclave_worker::online::OnlineState::default());
    let listener = match Listener::bind(&args.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("enclave-worker: cannot listen on {:?}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(endpoint = ?args.listen, "listening");
    loop {
        match listener.accept() {
            Ok(connection) => {
                let worker = Arc::clone(&worker);
                let pool = Arc::clone(&pool);
                let online = Arc::clone(&online);
                std::thread::spawn(move || serve_connection(&worker, &online, &pool, connection));
            }
            Err(error) => tracing::warn!(%error, "accept failed"),
        }
    }
}
