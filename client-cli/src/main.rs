//! `ephem-batch`: a thin command-line shell over the project's libraries.

mod attest;
mod policy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ephem-batch", version, about = "Confidential bulk text embedding on AWS Nitro Enclaves")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attestation documents: verify them against a policy.
    #[command(subcommand)]
    Attest(attest::AttestCommand),
    /// Attestation policy files: create a publisher key, sign, verify.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attest(command) => attest::run(command),
        Command::Policy(command) => policy::run(command),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
