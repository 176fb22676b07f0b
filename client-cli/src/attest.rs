//! `ephem-batch attest …`

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum AttestCommand {}

pub fn run(command: AttestCommand) -> anyhow::Result<ExitCode> {
    match command {}
}
