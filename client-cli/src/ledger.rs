//! `ephem-batch ledger …`: the compliance view of the receipts ledger, its full
//! verification, and offline proofs (DESIGN.md §8, docs/protocol.md §8).
//!
//! ```text
//! ledger query [--job ID] [--model ID] [--pcr0 HEX] [--client KEYID] [--since T] [--until T] [--json]
//! ledger verify [--witness KEY... [--witness-quorum N]] [--json]
//! ledger checkpoint
//! ledger prove JOB -o BUNDLE.json
//! ledger export-scitt --job ID -o STATEMENT.cbor [--attestation-output DOC]
//! ledger verify-scitt STATEMENT.cbor --ledger-key FILE|TEXT [--job ID] [--attestation DOC] [--json]
//! ledger verify-bundle BUNDLE.json --ledger-key FILE|TEXT [--job ID] [--witness KEY... [--witness-quorum N]] [--json]
//! ledger consistency OLD_SIZE NEW_SIZE [--json]
//! ledger sync --from s3://BUCKET[/PREFIX]|DIR --ledger-key FILE|TEXT [--no-audit] [--json]
//! ledger redrive [--max N] [--json]
//! ```
//!
//! `sync` copies the ledger of a deployment (its bucket, in the C2SP tlog-tiles layout) into
//! this home's ledger directory, so that every command above runs on the copy. Use a home of
//! its own for an audit copy: a home's own ledger has another key and is refused. With
//! `--backend aws` the directory is `<home>/aws-ledger/`, the copy of the deployment's ledger
//! that `ephem-batch verify` also brings up to date, apart from the home's own ledger.
//!
//! `query`, `verify` and `verify-bundle` also take the attestation trust options
//! `--root aws-nitro-g1|PEM`, `--development-root [PEM]`, `--expect-pcr N=HEX`,
//! `--allow-debug`; `query` and `verify` take `--ledger-key FILE|TEXT`.
//!
//! **Trust.** `query` and `verify` read the ledger of an `$EPHEM_HOME` and by default
//! trust what that home holds: the ledger key in `ledger/ledger.pub` and, if the home
//! has a development CA (`enclave/dev-root.pem`), its development root — announced
//! loudly — else the AWS Nitro Enclaves root G1. `verify-bundle` trusts nothing it is
//! not told: the ledger key is `--ledger-key` or `$EPHEM_LEDGER_KEY` (never the key the
//! bundle carries) and the root is the AWS Nitro Enclaves root G1 unless `--root` or
//! `--development-root` names another.
//!
//! **Exit status.** 0: success. 1: a negative answer — a query row or the ledger does
//! not verify, a bundle is invalid, a job is not in the ledger, no checkpoint verifies.
//! 2: usage, I/O or storage errors.
//!
//! One file per subcommand under `ledger/` (`query.rs`, `verify.rs`, `checkpoint.rs`, `prove.rs`,
//! `verify_bundle.rs`, `consistency.rs`, `sync.rs`, `redrive.rs`), with the shared trust options in
//! `trust.rs`, a job's own proof object (`jobs/<id>/ledger-proof.json`) in `proof.rs`, a job's
//! whole ledger check (witnesses, checkpoints seen) in `job_check.rs`, the witness settings and
//! the memory of checkpoints in `witness_policy.rs`, and consistency proofs from a bucket's hash
//! tiles in `hash_tiles.rs`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use protocol::attestation::{RootKind, TrustAnchor, format_ms};
use protocol::envelope::JobId;
use receipts_ledger::merkle::{root_at, verify_consistency};
use receipts_ledger::{
    BundleError, Checkpoint, IndexedFields, LedgerStore, LocalLedger, ProofBundle, Query, ReceiptRefusal, SqliteStore,
    VerifierKey, consistency, prove, receipt_fields, verify_bundle, verify_ledger,
};
use protocol::receipt_check::ReceiptVerifier;
use receipts_ledger::store::tiles;
use serde::Serialize;

mod checkpoint;
mod consistency;
mod hash_tiles;
mod job_check;
mod proof;
mod prove;
mod query;
mod record;
mod redrive;
mod scitt;
mod sync;
mod trust;
mod verify;
mod verify_bundle;
mod witness_policy;
#[cfg(test)]
mod tests;

use checkpoint::checkpoint_command;
use consistency::consistency_command;
use prove::prove_command;
use verify::verify_command;
pub use verify_bundle::{ProvenReceipt, Refusal, check_bundle, check_bundle_witnessed};
pub use witness_policy::{SeenAs, SeenCheck, WitnessArgs, check_seen, check_witnessed, remember_checkpoint, seen_checkpoint};
pub use hash_tiles::{HashTiles, tiles_consistency};
pub use job_check::{JobEntry, accept_checkpoint, check_job_in_ledger, check_job_proof_object};
use verify_bundle::verify_bundle_command;
pub use proof::{JobProof, check_job_proof, check_proof};
pub use query::{Row, UsageDetail, query_ledger, query_rows, usage_gaps};
pub use record::{Inputs, ProveRecordArgs, ProvenRecord, RecordBundle, RecordRebuilder, check_record_bundle, record_bundle};
use record::verify_record_command;
pub use receipts_ledger::EntryKind;
pub use redrive::{RedriveArgs, redrive_command};
use query::query_command;
pub use sync::sync_copy;
use sync::sync_command;
pub use trust::{PinnedKey, parse_ledger_key};
use trust::{RootJson, home_key, latest_signed, receipt_check};

/// Where an `$EPHEM_HOME` keeps its development root (the enclave worker's state).
pub const HOME_DEV_ROOT: &str = "enclave/dev-root.pem";
/// `--root` value naming the compiled-in AWS Nitro Enclaves root G1.
pub const AWS_ROOT_NAME: &str = "aws-nitro-g1";

#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// The compliance view: one row per receipt (time, job, model, counts, measurement, verdict).
    Query {
        /// Only this job (hex id).
        #[arg(long, value_name = "ID", value_parser = parse_job)]
        job: Option<JobId>,
        /// Only this model id.
        #[arg(long, value_name = "ID")]
        model: Option<String>,
        /// Only this enclave measurement (PCR0, hex).
        #[arg(long, value_name = "HEX")]
        pcr0: Option<String>,
        /// Only jobs whose results were sealed to this client key id (hex).
        #[arg(long, value_name = "KEYID")]
        client: Option<String>,
        /// Only jobs that finished at or after T (RFC 3339, YYYY-MM-DD in UTC, or Unix ms).
        #[arg(long, value_name = "T", value_parser = parse_time)]
        since: Option<u64>,
        /// Only jobs that finished before T.
        #[arg(long, value_name = "T", value_parser = parse_time)]
        until: Option<u64>,
        /// Only usage receipts of online requests (`serve`, the SDK's `embed`).
        #[arg(long, conflicts_with = "jobs")]
        online: bool,
        /// Only batch jobs' receipts.
        #[arg(long)]
        jobs: bool,
        /// One JSON array of rows on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: LedgerTrust,
    },
    /// Replay the whole ledger: chain, tree, every checkpoint, every receipt and its attestation.
    Verify {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: LedgerTrust,
        #[command(flatten)]
        witness: WitnessArgs,
    },
    /// Print the latest signed checkpoint (C2SP signed note).
    Checkpoint,
    /// Write an offline proof bundle for a job (receipt, attestation document, inclusion proof,
    /// signed checkpoint).
    Prove {
        /// The job id (hex).
        #[arg(value_parser = parse_job)]
        job: JobId,
        /// Where to write the bundle (`-` for stdout).
        #[arg(short = 'o', long = "output", value_name = "BUNDLE.json")]
        output: PathBuf,
    },
    /// Verify a proof bundle offline, against a ledger key you pin.
    VerifyBundle {
        /// The bundle (JSON, from `ledger prove`).
        bundle: PathBuf,
        /// The ledger's verifier key to trust: the key string (name+id+base64) or a file holding
        /// it. The key the bundle names is never trusted.
        #[arg(long, value_name = "FILE|TEXT", env = "EPHEM_LEDGER_KEY")]
        ledger_key: String,
        /// The bundle must prove this job.
        #[arg(long, value_name = "ID", value_parser = parse_job)]
        job: Option<JobId>,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        witness: WitnessArgs,
        #[arg(long)]
        json: bool,
    },
    /// Export a job's entry as an IETF SCITT transparent statement: its receipt with a COSE
    /// Receipt (RFC 9162 inclusion proof signed by the ledger key) under header 394 (§8.13).
    ExportScitt {
        /// The job (or usage id) whose entry to export.
        #[arg(long, value_name = "ID", value_parser = parse_job)]
        job: JobId,
        /// Where to write the transparent statement (CBOR).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Also write the attestation document the receipt names (for `verify-scitt --attestation`).
        #[arg(long, value_name = "FILE")]
        attestation_output: Option<PathBuf>,
    },
    /// Verify a transparent statement (`export-scitt`) offline against a ledger key you pin.
    VerifyScitt(scitt::VerifyScittArgs),
    /// Prove that one record's vector came out of a job (its model, its image), revealing only
    /// that record: its text, its output record, its path to the receipt's record tree, and the
    /// receipt's ledger proof.
    ProveRecord(ProveRecordArgs),
    /// Check a record bundle (`prove-record`) offline against a pinned ledger key.
    VerifyRecord {
        /// The bundle (JSON, from `ledger prove-record`).
        bundle: PathBuf,
        /// The ledger's verifier key to trust (the key string or a file holding it).
        #[arg(long, value_name = "FILE|TEXT", env = "EPHEM_LEDGER_KEY")]
        ledger_key: String,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        witness: WitnessArgs,
        #[arg(long)]
        json: bool,
    },
    /// Copy a deployment's ledger (tlog-tiles in a bucket) into this home's ledger directory,
    /// checking every checkpoint against the pinned key, that the copy only grows, and every
    /// published tile and bundle against the rebuilt tree.
    Sync {
        /// `s3://BUCKET[/PREFIX]` (the AWS configuration chain; `AWS_ENDPOINT_URL` for an
        /// emulator), or a directory holding a copy of the bucket.
        #[arg(long, value_name = "s3://BUCKET[/PREFIX]|DIR")]
        from: String,
        /// The ledger's verifier key to trust: the key string or a file holding it.
        #[arg(long, value_name = "FILE|TEXT", env = "EPHEM_LEDGER_KEY")]
        ledger_key: String,
        /// Skip comparing the published tiles and bundles with the copy.
        #[arg(long)]
        no_audit: bool,
        #[arg(long)]
        json: bool,
    },
    /// Operators: send the receipts in the ledger's dead-letter queue back to the ledger queue,
    /// oldest first, once what held them is fixed (a policy uploaded, a store back). Uses the
    /// backend's queues (`--backend aws`: LedgerDlqUrl, LedgerQueueUrl).
    Redrive(RedriveArgs),
    /// Check this client's online usage against the ledger: every account its log holds
    /// (`serve` and the SDK's `embed` log each answered exchange) must have a usage receipt with
    /// the same request count and commitment, and no receipt under its label may be unknown to
    /// the log; exit 1 naming each period that is withheld, miscounted or charged unlogged.
    ReconcileUsage {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trust: LedgerTrust,
    },
    /// Print the consistency proof between two tree sizes (hex hashes, one per line).
    Consistency {
        old_size: u64,
        new_size: u64,
        /// A JSON object with both roots, the proof and the checkpoints of both sizes.
        #[arg(long)]
        json: bool,
    },
}

/// What `query` and `verify` pin.
#[derive(Args, Debug, Clone, Default)]
pub struct LedgerTrust {
    /// The ledger verifier key to pin (key string or file). Default: the ledger's `ledger.pub`.
    #[arg(long, value_name = "FILE|TEXT")]
    pub ledger_key: Option<String>,
    #[command(flatten)]
    pub root: RootArgs,
}

/// Which attestation documents receipts may rest on.
#[derive(Args, Debug, Clone, Default)]
pub struct RootArgs {
    /// Attestation root to trust: `aws-nitro-g1` or a PEM certificate file.
    #[arg(long, value_name = "aws-nitro-g1|PEM", conflicts_with = "development_root")]
    pub root: Option<String>,
    /// Trust a development root (PEM; default: `$EPHEM_HOME/enclave/dev-root.pem`). Receipts
    /// under it prove nothing about Nitro hardware.
    #[arg(long, value_name = "PEM", num_args = 0..=1)]
    pub development_root: Option<Option<PathBuf>>,
    /// Require PCR N to equal HEX in every attestation document (repeatable).
    #[arg(long = "expect-pcr", value_name = "N=HEX", value_parser = parse_pcr)]
    pub expect_pcr: Vec<(u8, Vec<u8>)>,
    /// Accept documents of debug-mode enclaves (PCR0/1/2 all zero).
    #[arg(long)]
    pub allow_debug: bool,
}

/// The filter of `ledger query`'s options (hex ids compared in lower case).
pub fn query_filter(
    job: Option<JobId>,
    model: Option<String>,
    pcr0: Option<String>,
    client: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    kind: Option<EntryKind>,
) -> Query {
    Query {
        job_id: job,
        model_id: model,
        pcr0: pcr0.map(|p| p.to_ascii_lowercase()),
        client_key_id: client.map(|c| c.to_ascii_lowercase()),
        kind,
        since_ms: since,
        until_ms: until,
        limit: None,
    }
}

/// `ledger prove` for a library caller (the Python SDK): the job's bundle, a checkpoint signed
/// first if none covers it, checked under the ledger's own key (returned with it); `None` if
/// the job is not in it.
pub fn prove_job(ledger_dir: &Path, job: &JobId) -> anyhow::Result<Option<(ProofBundle, VerifierKey)>> {
    let Some(bundle) = prove::bundle_for(ledger_dir, job)? else { return Ok(None) };
    let key = LocalLedger::verifier_key(ledger_dir)?;
    verify_bundle(&bundle, &key).context("the bundle does not verify under this ledger's own key")?;
    Ok(Some((bundle, key)))
}

/// `ledger verify-bundle` for a library caller: `bytes` checked against the pinned key (either
/// form of `--ledger-key`) and the root options; `ledger_dir` only locates a home's development
/// root. `Err`: the options are unusable; `Ok(Err)`: the bundle is invalid, by named check.
pub fn verify_bundle_bytes(
    ledger_dir: &Path,
    bytes: &[u8],
    ledger_key: &str,
    job: Option<&JobId>,
    root: &RootArgs,
) -> anyhow::Result<Result<ProvenReceipt, Refusal>> {
    let pinned = parse_ledger_key(ledger_key)?;
    let check = receipt_check(root, ledger_dir, false)?;
    Ok(check_bundle(bytes, &pinned.key, &check, job))
}

/// `ledger verify-record` for a library caller: `bytes` checked against the pinned key and the
/// root options (`ledger_dir` only locates a home's development root). `Err`: the options are
/// unusable; `Ok(Err)`: the bundle is invalid, by named check.
pub fn verify_record_bytes(
    ledger_dir: &Path,
    bytes: &[u8],
    ledger_key: &str,
    root: &RootArgs,
) -> anyhow::Result<Result<ProvenRecord, Refusal>> {
    let pinned = parse_ledger_key(ledger_key)?;
    let check = receipt_check(root, ledger_dir, false)?;
    Ok(check_record_bundle(bytes, &pinned.key, &check, None))
}

/// Runs a ledger command on the ledger in `ledger_dir` (`$EPHEM_HOME/ledger`).
pub fn run(command: LedgerCommand, ledger_dir: &Path) -> anyhow::Result<ExitCode> {
    match command {
        LedgerCommand::Query { job, model, pcr0, client, since, until, online, jobs, json, trust } => {
            let kind = match (online, jobs) {
                (true, _) => Some(EntryKind::Usage),
                (_, true) => Some(EntryKind::Job),
                _ => None,
            };
            query_command(ledger_dir, &query_filter(job, model, pcr0, client, since, until, kind), json, &trust)
        }
        LedgerCommand::Verify { json, trust, witness } => verify_command(ledger_dir, json, &trust, &witness),
        LedgerCommand::Checkpoint => checkpoint_command(ledger_dir),
        LedgerCommand::Prove { job, output } => prove_command(ledger_dir, &job, &output),
        LedgerCommand::ExportScitt { job, output, attestation_output } => {
            scitt::export_scitt_command(ledger_dir, &job, &output, attestation_output.as_deref())
        }
        LedgerCommand::VerifyScitt(args) => scitt::verify_scitt_command(ledger_dir, &args),
        LedgerCommand::VerifyBundle { bundle, ledger_key, job, root, witness, json } => {
            verify_bundle_command(ledger_dir, &bundle, &ledger_key, job.as_ref(), &root, &witness, json)
        }
        LedgerCommand::Consistency { old_size, new_size, json } => {
            consistency_command(ledger_dir, old_size, new_size, json)
        }
        LedgerCommand::Sync { from, ledger_key, no_audit, json } => {
            sync_command(ledger_dir, &from, &ledger_key, !no_audit, json)
        }
        LedgerCommand::VerifyRecord { bundle, ledger_key, root, witness, json } => {
            verify_record_command(ledger_dir, &bundle, &ledger_key, &root, &witness, json)
        }
        LedgerCommand::Redrive(_) => Err(anyhow!("ledger redrive needs the backend's queues: run it through `ephem-batch`")),
        LedgerCommand::ProveRecord(_) => Err(anyhow!("ledger prove-record reads the job's results: run it through `ephem-batch`")),
        LedgerCommand::ReconcileUsage { .. } => Err(anyhow!("ledger reconcile-usage reads the home's usage log: run it through `ephem-batch`")),
    }
}

// ---- argument parsers ------------------------------------------------------------------

/// A job id: 32 hex digits, either case (the ledger writes them in lowercase).
fn parse_job(s: &str) -> Result<JobId, String> {
    s.trim().to_ascii_lowercase().parse().map_err(|_| format!("job id {s:?} is not 32 hex digits"))
}

/// RFC 3339, a UTC date `YYYY-MM-DD`, or Unix milliseconds.
fn parse_time(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| format!("{s} is out of range"));
    }
    let full = if s.len() == 10 { format!("{s}T00:00:00Z") } else { s.to_owned() };
    let t = time::OffsetDateTime::parse(&full, &time::format_description::well_known::Rfc3339)
        .map_err(|_| format!("{s:?} is neither RFC 3339, YYYY-MM-DD nor Unix milliseconds"))?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).map_err(|_| format!("{s} is before 1970"))
}

fn parse_pcr(s: &str) -> Result<(u8, Vec<u8>), String> {
    let (index, value) = s.split_once('=').ok_or("expected N=HEX")?;
    let index: u8 = index.trim().parse().map_err(|_| format!("PCR index {index:?} is not a number"))?;
    if index > 31 {
        return Err(format!("PCR index {index} is outside 0..=31"));
    }
    let value = hex::decode(value.trim()).map_err(|e| format!("PCR{index}: not hex: {e}"))?;
    if ![32, 48, 64].contains(&value.len()) {
        return Err(format!("PCR{index} value is {} bytes; a PCR is 32, 48 or 64 bytes", value.len()));
    }
    Ok((index, value))
}
