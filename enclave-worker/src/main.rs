//! `enclave-worker`: the process that runs inside the enclave (or, for the embedded default,
//! beside the host-poller with the development NSM).
//!
//! ```text
//! enclave-worker --listen unix:PATH|tcp:HOST:PORT|vsock:PORT [--state-dir DIR] [--threads N]
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use enclave_worker::inference::EngineSettings;
use enclave_worker::key_release::RsaKeyPool;
use enclave_worker::transport::{Endpoint, Listener};
use enclave_worker::{serve_connection, Worker};

struct Args {
    listen: Endpoint,
    state_dir: std::path::PathBuf,
    threads: usize,
}

const USAGE: &str = "usage: enclave-worker --listen unix:PATH|tcp:HOST:PORT [--state-dir DIR] [--threads N]";

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut state_dir = std::path::PathBuf::from(".ephem/enclave");
    let mut threads = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--listen" => listen = Some(Endpoint::parse(&value()?)?),
            "--state-dir" => state_dir = value()?.into(),
            "--threads" => threads = value()?.parse().map_err(|_| "--threads takes a number".to_owned())?,
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(Args { listen: listen.ok_or_else(|| USAGE.to_owned())?, state_dir, threads })
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
    let pool = Arc::new(RsaKeyPool::start(4));
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
    let worker = Arc::new(Worker::new(nsm, publisher, EngineSettings { threads: args.threads, ..EngineSettings::default() }));
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
                std::thread::spawn(move || serve_connection(&worker, &pool, connection));
            }
            Err(error) => tracing::warn!(%error, "accept failed"),
        }
    }
}
