//! `ephem-batch policy …`: the attestation policy file a release step writes from the enclave
//! image's measurements and the image publisher signs (DESIGN.md §4, §11).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Subcommand;
use ed25519_dalek::SigningKey;
use protocol::attestation::{Policy, SignedPolicy};

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Create an image publisher key: the seed goes to FILE (mode 0600), the public key to stdout.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign an unsigned policy file (root, PCRs, allow_debug, max_age_s) with the publisher key.
    Sign {
        /// File holding the publisher's Ed25519 seed as 64 hex digits.
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        out: PathBuf,
        unsigned: PathBuf,
    },
    /// Check a signed policy file against the publisher key you pin.
    Verify {
        policy: PathBuf,
        /// The image publisher's Ed25519 public key, 64 hex digits.
        #[arg(long, env = "EPHEM_POLICY_PUBLISHER_KEY")]
        publisher_key: Option<String>,
    },
}

pub fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Keygen { out } => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).context("reading the OS random generator")?;
            write_secret(&out, &hex::encode(seed))?;
            println!("{}", hex::encode(SigningKey::from_bytes(&seed).verifying_key().as_bytes()));
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Sign { key, out, unsigned } => {
            let signing_key = crate::keys::read_signing_key(&key)?;
            let text = std::fs::read_to_string(&unsigned).with_context(|| format!("reading {}", unsigned.display()))?;
            let policy = Policy::from_unsigned_json(&text).with_context(|| format!("{}", unsigned.display()))?;
            let signed = policy.sign(&signing_key)?;
            std::fs::write(&out, signed.to_json()).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("signed policy written to {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Verify { policy, publisher_key } => {
            let text = std::fs::read_to_string(&policy).with_context(|| format!("reading {}", policy.display()))?;
            let signed = SignedPolicy::from_json(&text).with_context(|| format!("{}", policy.display()))?;
            let Some(publisher_key) = publisher_key else {
                eprintln!("WARNING: no publisher key pinned (--publisher-key): the signature was NOT checked");
                return Ok(ExitCode::SUCCESS);
            };
            let key: [u8; 32] = hex::decode(publisher_key.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .context("--publisher-key: expected 64 hex digits")?;
            match signed.verify_with_key_bytes(&key) {
                Ok(policy) => {
                    println!("valid: policy signed by the pinned publisher; {} PCRs, allow_debug {}", policy.pcrs.len(), policy.allow_debug);
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("invalid: {error}");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}

fn write_secret(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if path.exists() {
        bail!("{} exists; refusing to overwrite a key", path.display());
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(file, "{contents}")?;
    Ok(())
}
