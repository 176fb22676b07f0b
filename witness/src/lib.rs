#![forbid(unsafe_code)]
//! A C2SP tlog-witness (c2sp.org/tlog-witness) for the receipts ledger: it cosigns a log's
//! checkpoint (c2sp.org/tlog-cosignature, Ed25519 cosignature/v1) only if the checkpoint is
//! signed by a log key it was configured with and is consistent with the last checkpoint it
//! cosigned for that log, whose size and root it keeps in a file written before it answers.
//! A rollback (a smaller size) and a fork (the same size with another root, or a bad
//! consistency proof) get no cosignature. `ephem-batch witness serve` runs it.

pub mod server;
pub mod state;
pub mod witness;

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use receipts_ledger::cosignature::CosignerSigner;
use receipts_ledger::VerifierKey;

pub use state::{LogState, State, StateError};
pub use witness::{AddCheckpoint, Refusal, Witness};

/// `witness serve`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (`127.0.0.1:0` picks a free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:7380")]
    pub listen: String,
    /// The witness's secret key file (`PRIVATE+KEY+name+id+base64(0x04 || seed)`), created
    /// with --name if missing; its verifier key is written beside it as FILE.pub.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Name of a key this command creates.
    #[arg(long, default_value = "witness.ephem-batch.local/w1")]
    pub name: String,
    /// The state file (last cosigned checkpoint per log).
    #[arg(long, value_name = "FILE")]
    pub state: PathBuf,
    /// A log verifier key (`name+hex8+base64`, or a file holding one) whose checkpoints this
    /// witness cosigns; repeat for more logs.
    #[arg(long = "log", value_name = "FILE|KEY", required = true)]
    pub logs: Vec<String>,
    /// Submission prefix (path) before `/add-checkpoint`.
    #[arg(long, default_value = "")]
    pub prefix: String,
}

/// Reads the key file, or creates it (mode 0600) with `name`.
pub fn load_or_create_key(path: &Path, name: &str) -> anyhow::Result<CosignerSigner> {
    let key = match fs::read_to_string(path) {
        Ok(text) => CosignerSigner::parse(&text).with_context(|| format!("{}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = CosignerSigner::generate(name)?;
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            f.write_all(format!("{}\n", key.to_secret_string()).as_bytes())?;
            f.sync_all()?;
            key
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let public = path.with_extension("pub");
    fs::write(&public, format!("{}\n", key.verifier())).with_context(|| format!("writing {}", public.display()))?;
    Ok(key)
}

fn log_key(arg: &str) -> anyhow::Result<VerifierKey> {
    let text = if Path::new(arg).is_file() { fs::read_to_string(arg)? } else { arg.to_owned() };
    VerifierKey::parse(text.trim()).with_context(|| format!("log key {arg:?}"))
}

/// Runs the witness until SIGTERM or SIGINT.
pub fn serve_command(args: &ServeArgs) -> anyhow::Result<()> {
    let signer = load_or_create_key(&args.key, &args.name)?;
    let logs = args.logs.iter().map(|l| log_key(l)).collect::<anyhow::Result<Vec<_>>>()?;
    let state = State::open(&args.state)?;
    let listener = std::net::TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    println!("witness {} listening on http://{}{}", signer.verifier(), listener.local_addr()?, args.prefix);
    std::io::stdout().flush()?;
    let names: Vec<&str> = logs.iter().map(VerifierKey::name).collect();
    tracing::info!(witness = %signer.verifier(), logs = ?names, "witness started");
    let witness = Arc::new(Witness::new(signer, logs, state));
    server::serve(listener, witness, args.prefix.trim_end_matches('/').to_owned(), stop)?;
    Ok(())
}
