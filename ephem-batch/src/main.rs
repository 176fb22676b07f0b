//! `ephem-batch`: a thin command-line shell over the project's libraries, where the client
//! (`ephem_batch_client`) and the embedded default (`devstack`) are composed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ephem_batch_client::backend::{self, BackendArgs};
use devstack::dev;
use ephem_batch_client::{attest, bulk, flows, home::Home, keys, policy, results, status, submit, trust, verify};

#[derive(Parser)]
#[command(name = "ephem-batch", version, about = "Confidential bulk text embedding on AWS Nitro Enclaves")]
struct Cli {
    /// State directory of the embedded default and of this client's keys and jobs.
    #[arg(long, global = true, env = "EPHEM_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Seal a corpus to the attested fleet key and submit it (as one job, or with --bulk as
    /// shards run by the bulk workflow).
    Submit(submit::SubmitArgs),
    /// Bulk runs (`submit --bulk`): status, results, verification.
    #[command(subcommand)]
    Bulk(bulk::BulkCommand),
    /// Where a job stands.
    Status {
        job: String,
        #[arg(long)]
        json: bool,
    },
    /// Download, open and check a job's results.
    Results(ResultsArgs),
    /// Check a job's receipt against what this client sealed and opened, and its ledger entry.
    Verify {
        job: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: trust::TrustArgs,
    },
    /// OpenAI's embeddings API on loopback, answered by the attested enclaves through Oblivious
    /// HTTP: set an application's `base_url` to http://127.0.0.1:8089/v1.
    Serve(ephem_batch_client::serve::ServeArgs),
    /// Per-dimension ranges for `submit --dtype int8|uint8 --ranges`: the minima and maxima of
    /// the vectors of a (rows, N) float32 .npy (`results --format npy` of an f32 job), written as
    /// the (2, N) .npy sentence-transformers' `quantize_embeddings` takes.
    Ranges {
        embeddings: PathBuf,
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
    },
    /// Cancel a job no host has started (signed with this home's result key: only the job's
    /// submitter can cancel it).
    Cancel { job: String },
    /// Create this client's result key.
    Keygen {
        /// Replace an existing key (results sealed to it will no longer open).
        #[arg(long)]
        force: bool,
    },
    /// Attestation documents: verify one, or fetch the fleet's.
    #[command(subcommand)]
    Attest(attest::AttestCommand),
    /// Attestation policy files: create a publisher key, sign, verify.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Fleet keys.
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Model onboarding: encrypt, sign, upload, verify.
    #[command(subcommand)]
    Model(ephem_batch_client::model_cli::ModelCommand),
    /// The receipts ledger: compliance queries, verification, checkpoints, proofs.
    #[command(subcommand)]
    Ledger(ephem_batch_client::ledger::LedgerCommand),
    /// The embedded default: the whole stack on this machine.
    #[command(subcommand)]
    Dev(dev::DevCommand),
    /// A C2SP tlog-witness that cosigns the ledger's consistent checkpoints.
    #[command(subcommand)]
    Witness(WitnessCommand),
}

#[derive(Subcommand)]
enum WitnessCommand {
    /// Serve add-checkpoint until SIGTERM/SIGINT.
    Serve(witness::ServeArgs),
}

#[derive(clap::Args)]
struct ResultsArgs {
    job: String,
    /// Output file (default: beside the input, `<stem>.embeddings.<ext>`).
    #[arg(short, long, value_name = "OUT")]
    output: Option<PathBuf>,
    #[arg(long, value_enum)]
    format: Option<results::Format>,
    #[command(flatten)]
    trust: trust::TrustArgs,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Check that a fleet KMS key releases only to the measured image and wraps nothing anyone
    /// chose (DescribeKey, GetKeyPolicy, ListGrants, read with this caller's credentials); exit 1
    /// naming each failed check.
    CheckKey {
        #[arg(long)]
        json: bool,
        /// Forget the key evidence this client accepted for the key before, and remember this
        /// answer if it passes.
        #[arg(long)]
        recheck: bool,
        #[command(flatten)]
        trust: trust::TrustArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The local Lambda runtime is a service with a log file; commands only warn.
    let service = matches!(cli.command, Command::Dev(dev::DevCommand::RunLambdas { .. } | dev::DevCommand::AwsPump(_)) | Command::Witness(_) | Command::Serve(_));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(if service { tracing::Level::INFO } else { tracing::Level::WARN })
        .init();
    // The one place the embedded default meets the client: what the local backend runs on upload.
    backend::install_local_wiring(devstack::upload_wiring);
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let home = || Home::resolve(cli.home.as_deref());
    match cli.command {
        Command::Attest(attest::AttestCommand::Verify(args)) => attest::verify(args),
        Command::Attest(attest::AttestCommand::Fetch(args)) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            attest::fetch(&home, &services, &args)
        }
        Command::Policy(command) => policy::run(command),
        Command::Keygen { force } => {
            let home = home()?;
            let key = keys::keygen(&home.result_key(), force)?;
            println!("result key {} (key id {})", home.result_key().display(), hex::encode(key.public_key().key_id()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Submit(args) => {
            // The file is checked before anything reaches a stack: a missing, unreadable or
            // empty corpus is said once, and nothing is opened, warned about or chosen.
            submit::check_input(&args)?;
            let home = home()?;
            let opened = backend::open(&home, &cli.backend)?;
            if args.bulk { flows::submit_bulk(&home, &opened, &args) } else { flows::submit(&home, &opened.services, &args) }
        }
        Command::Serve(args) => {
            let home = home()?;
            let opened = backend::open(&home, &cli.backend)?;
            ephem_batch_client::serve::run(&home, opened.services, &args).map(|()| ExitCode::SUCCESS)
        }
        Command::Bulk(command) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            bulk::run(&home, &services, command)
        }
        Command::Status { job, json } => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let view = status::view(&services, &status::parse_job(&job)?)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                status::print(&view);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Results(args) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let trust = trust::ClientTrust::load(&home, &args.trust)?;
            trust.warn_if_development();
            let key = keys::load_result_key(&home.result_key(), false)?;
            let started = std::time::Instant::now();
            let written = results::run(&home, &services, &trust, &key, &status::parse_job(&args.job)?, args.output.as_deref(), args.format)?;
            flows::report_written(&args.job, &written, started.elapsed(), false)
        }
        Command::Verify { job, json, trust } => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let trust = trust::ClientTrust::load(&home, &trust)?;
            trust.warn_if_development();
            let key = keys::load_result_key(&home.result_key(), false)?;
            let outcome = verify::verify_job(&home, &services, &trust, &status::parse_job(&job)?, &key, None)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                outcome.print();
            }
            Ok(if outcome.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Ranges { embeddings, output } => {
            let ranges = ephem_batch_client::ranges::of_embeddings(&embeddings)?;
            ephem_batch_client::ranges::write(&ranges, &output)?;
            println!("ranges of {} dimensions written to {}", ranges.dimensions(), output.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Cancel { job } => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let key = keys::load_result_key(&home.result_key(), false)?;
            status::cancel(&services, &status::parse_job(&job)?, &key)?;
            println!("cancelled {job}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Fleet(FleetCommand::CheckKey { json, recheck, trust }) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let trust = trust::ClientTrust::load(&home, &trust)?;
            let key = trust.pinned_fleet_kms_key()?;
            let evidence = services.kms.key_evidence(key.as_str()).with_context(|| format!("reading key {key}"))?;
            let report = ephem_batch_client::fleet_key::check(&evidence, key, &trust.policy);
            let memory = ephem_batch_client::fleet_key::memory::KeyMemory::of(&home);
            if report.passed() {
                if recheck {
                    memory.forget(key)?;
                }
                memory.accept(key, &evidence.digest(), cloud::now_ms())?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                ephem_batch_client::fleet_key::print(&report);
            }
            Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Model(command) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            ephem_batch_client::model_cli::run(command, &services)
        }
        Command::Ledger(ephem_batch_client::ledger::LedgerCommand::Redrive(args)) => {
            ephem_batch_client::ledger::redrive_command(&backend::open(&home()?, &cli.backend)?, &args)
        }
        Command::Ledger(ephem_batch_client::ledger::LedgerCommand::ProveRecord(args)) => {
            let home = home()?;
            let services = backend::open(&home, &cli.backend)?.services;
            let trust = trust::ClientTrust::load(&home, &args.trust)?;
            let key = keys::load_result_key(&home.result_key(), false)?;
            let bundle = ephem_batch_client::record_proof::prove_record(&home, &services, &trust, &key, &args.job, &args.id, args.input.as_deref())?;
            std::fs::write(&args.output, serde_json::to_vec_pretty(&bundle)?).with_context(|| format!("writing {}", args.output.display()))?;
            eprintln!("record {:?} (#{} of {}) of job {}: {}", args.id, bundle.index, bundle.records, args.job, args.output.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Ledger(ephem_batch_client::ledger::LedgerCommand::ReconcileUsage { json, trust }) => {
            let home = home()?;
            ephem_batch_client::usage_log::reconcile_command(&home, &backend::ledger_dir(&home, &cli.backend), json, &trust)
        }
        Command::Ledger(command) => ephem_batch_client::ledger::run(command, &backend::ledger_dir(&home()?, &cli.backend)),
        Command::Witness(WitnessCommand::Serve(args)) => witness::serve_command(&args).map(|()| ExitCode::SUCCESS),
        Command::Dev(command) => {
            let home = home()?;
            match command {
                dev::DevCommand::Up(args) => dev::up(&home, &args, &cli.backend)?,
                dev::DevCommand::Down => dev::down(&home)?,
                dev::DevCommand::Status { json } => dev::status(&home, &cli.backend, json)?,
                dev::DevCommand::RunLambdas { input_retention_s } => {
                    dev::run_lambdas(&home, std::time::Duration::from_secs(input_retention_s))?
                }
                dev::DevCommand::AwsPump(args) => dev::aws::pump(&home, &cli.backend, &args)?,
                dev::DevCommand::UpdateImage(args) => dev::update::update_image(&home, &args, &cli.backend)?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
