//! `ephem-witness`: the witness alone (`ephem-batch witness serve` is the same command).

use clap::Parser;

#[derive(Parser)]
#[command(name = "ephem-witness", about = "A C2SP tlog-witness for the receipts ledger")]
struct Cli {
    #[command(flatten)]
    serve: witness::ServeArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    witness::serve_command(&Cli::parse().serve)
}
