//! `ephem-batch ledger …`: the compliance view of the receipts ledger, its full
//! verification, and offline proofs (DESIGN.md §8, docs/protocol.md §8).
//!
//! ```text
//! ledger query [--job ID] [--model ID] [--pcr0 HEX] [--client KEYID] [--since T] [--until T] [--json]
//! ledger verify [--json]
//! ledger checkpoint
//! ledger prove JOB -o BUNDLE.json
//! ledger verify-bundle BUNDLE.json --ledger-key FILE|TEXT [--job ID] [--json]
//! ledger consistency OLD_SIZE NEW_SIZE [--json]
//! ledger sync --from s3://BUCKET[/PREFIX]|DIR --ledger-key FILE|TEXT [--no-audit] [--json]
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
    BundleError, Checkpoint, IndexedFields, LedgerStore, LocalLedger, ProofBundle, ProtocolReceipts,
    Query, ReceiptCheckError, SqliteStore, VerifierKey, consistency, prove, verify_bundle, verify_ledger,
};
use receipts_ledger::store::tiles;
use serde::Serialize;

mod query;
pub use query::{Row, query_rows};
use query::query_command;

/// Where an `$EPHEM_HOME` keeps its development root (the enclave worker's state).
pub const HOME_DEV_ROOT: &str = "enclave/dev-root.pem";
/// `--root` value naming the compiled-in AWS Nitro Enclaves root G1.
pub const AWS_ROOT_NAME: &str = "aws-nitro-g1";

#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// The compliance view: one row per receipt (time, job, model, counts, measurement, verdict).
    Query {
        /// Only this job (hex id).
        #[arg(long, value_name = "ID")]
        job: Option<String>,
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
    },
    /// Print the latest signed checkpoint (C2SP signed note).
    Checkpoint,
    /// Write an offline proof bundle for a job (receipt, attestation document, inclusion proof,
    /// signed checkpoint).
    Prove {
        /// The job id (hex).
        job: String,
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
        #[arg(long, value_name = "ID")]
        job: Option<String>,
        #[command(flatten)]
        root: RootArgs,
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

/// Runs a ledger command on the ledger in `ledger_dir` (`$EPHEM_HOME/ledger`).
pub fn run(command: LedgerCommand, ledger_dir: &Path) -> anyhow::Result<ExitCode> {
    match command {
        LedgerCommand::Query { job, model, pcr0, client, since, until, json, trust } => {
            let query = Query {
                job_id: job.map(|j| j.to_ascii_lowercase()),
                model_id: model,
                pcr0: pcr0.map(|p| p.to_ascii_lowercase()),
                client_key_id: client.map(|c| c.to_ascii_lowercase()),
                since_ms: since,
                until_ms: until,
                limit: None,
            };
            query_command(ledger_dir, &query, json, &trust)
        }
        LedgerCommand::Verify { json, trust } => verify_command(ledger_dir, json, &trust),
        LedgerCommand::Checkpoint => checkpoint_command(ledger_dir),
        LedgerCommand::Prove { job, output } => prove_command(ledger_dir, &job, &output),
        LedgerCommand::VerifyBundle { bundle, ledger_key, job, root, json } => {
            verify_bundle_command(ledger_dir, &bundle, &ledger_key, job.as_deref(), &root, json)
        }
        LedgerCommand::Consistency { old_size, new_size, json } => {
            consistency_command(ledger_dir, old_size, new_size, json)
        }
        LedgerCommand::Sync { from, ledger_key, no_audit, json } => {
            sync_command(ledger_dir, &from, &ledger_key, !no_audit, json)
        }
    }
}

// ---- sync ------------------------------------------------------------------------------

/// Where `--from` points: a bucket (and prefix) or a directory.
fn ledger_objects(from: &str) -> anyhow::Result<(std::sync::Arc<dyn cloud::ObjectStore>, String)> {
    if let Some(rest) = from.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(anyhow!("--from {from:?} names no bucket"));
        }
        let clients = cloud::aws::AwsClients::connect(None, None).context("connecting to S3")?;
        return Ok((std::sync::Arc::new(clients.object_store(bucket, "")), prefix.to_owned()));
    }
    let dir = Path::new(from);
    if !dir.is_dir() {
        return Err(anyhow!("--from {from:?} is neither s3://BUCKET[/PREFIX] nor a directory"));
    }
    let store = cloud::local::DirObjectStore::open(dir).with_context(|| format!("opening {from}"))?;
    Ok((std::sync::Arc::new(store), String::new()))
}

#[derive(Serialize)]
struct SyncJson<'a> {
    ok: bool,
    ledger_key: String,
    copy: String,
    sync: &'a tiles::SyncReport,
    audit: Option<&'a tiles::AuditReport>,
}

/// The copy in `dir` (`ledger.sqlite`) of the tlog-tiles ledger in `objects` under `prefix`,
/// brought up to the bucket's checkpoint, every checkpoint checked against `key`; `ledger.pub`
/// then pins `key` for the copy's commands. `Ok(Err(..))`: the bucket's ledger was refused.
pub fn sync_copy(
    dir: &Path,
    objects: std::sync::Arc<dyn cloud::ObjectStore>,
    prefix: &str,
    key: &VerifierKey,
) -> anyhow::Result<Result<(tiles::TileStore, tiles::SyncReport), tiles::TileError>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let db = dir.join(receipts_ledger::local::LEDGER_DB);
    let mut store = tiles::TileStore::open(
        objects,
        tiles::layout::Layout::new(prefix),
        tiles::Cache::File(db.clone()),
        key.clone(),
        tiles::TileOptions::auditor(),
    )
    .with_context(|| format!("opening the copy {}", db.display()))?;
    let report = match tiles::sync(&mut store) {
        Ok(report) => report,
        Err(e) => return Ok(Err(e)),
    };
    // The copy's commands trust the key it was synced under.
    let pub_path = dir.join(receipts_ledger::local::LEDGER_PUB);
    std::fs::write(&pub_path, format!("{key}\n")).with_context(|| format!("writing {}", pub_path.display()))?;
    Ok(Ok((store, report)))
}

fn sync_command(dir: &Path, from: &str, ledger_key: &str, audit: bool, json: bool) -> anyhow::Result<ExitCode> {
    let pinned = parse_ledger_key(ledger_key)?;
    let (objects, prefix) = ledger_objects(from)?;
    let db = dir.join(receipts_ledger::local::LEDGER_DB);
    let (store, report) = match sync_copy(dir, objects, &prefix, &pinned.key)? {
        Ok(synced) => synced,
        Err(e) => {
            eprintln!("sync refused: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let audit = if audit { Some(tiles::audit(&store)?) } else { None };
    let ok = audit.as_ref().is_none_or(tiles::AuditReport::ok);
    if json {
        let out = SyncJson { ok, ledger_key: pinned.key.to_string(), copy: db.display().to_string(), sync: &report, audit: audit.as_ref() };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "synced {from} into {}: {} -> {} entries, {} checkpoint(s), root {}",
            db.display(),
            report.from,
            report.size,
            report.checkpoints,
            report.root.as_deref().unwrap_or("(empty ledger)")
        );
        println!("ledger key {} ({})", pinned.key, pinned.source);
        if let Some(a) = &audit {
            println!(
                "audit: {} hash tile(s), {} entry bundle(s), {} metadata bundle(s) match; {} newer object(s) not checked",
                a.hash_tiles, a.entry_bundles, a.meta_bundles, a.beyond
            );
            for p in &a.problems {
                println!("  MISMATCH {}: {}", p.key, p.problem);
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

// ---- trust -----------------------------------------------------------------------------

/// The pinned ledger key and where it came from.
pub struct PinnedKey {
    pub key: VerifierKey,
    pub source: String,
}

/// `--ledger-key`: a verifier key string, else a file holding one.
pub fn parse_ledger_key(arg: &str) -> anyhow::Result<PinnedKey> {
    if let Ok(key) = VerifierKey::parse(arg.trim()) {
        return Ok(PinnedKey { key, source: "--ledger-key".into() });
    }
    let text = std::fs::read_to_string(arg).with_context(|| {
        format!("--ledger-key {arg:?} is neither a verifier key (name+id+base64) nor a readable file")
    })?;
    let key = VerifierKey::parse(text.trim()).with_context(|| format!("--ledger-key file {arg}"))?;
    Ok(PinnedKey { key, source: arg.to_owned() })
}

fn home_key(arg: Option<&str>, ledger_dir: &Path) -> anyhow::Result<PinnedKey> {
    match arg {
        Some(arg) => parse_ledger_key(arg),
        None => Ok(PinnedKey {
            key: LocalLedger::verifier_key(ledger_dir)?,
            source: ledger_dir.join(receipts_ledger::local::LEDGER_PUB).display().to_string(),
        }),
    }
}

fn read_root(path: &Path) -> anyhow::Result<TrustAnchor> {
    let pem = std::fs::read_to_string(path).with_context(|| format!("reading root {}", path.display()))?;
    TrustAnchor::from_pem(&pem).with_context(|| format!("root {}", path.display()))
}

/// The root receipts' documents must chain to. `home_default`: without options, trust
/// the home's development root if it has one (the home's own ledger), else AWS.
fn resolve_root(args: &RootArgs, ledger_dir: &Path, home_default: bool) -> anyhow::Result<TrustAnchor> {
    let home_dev_root = || -> anyhow::Result<PathBuf> {
        let home = ledger_dir.parent().ok_or_else(|| anyhow!("the ledger directory has no parent ($EPHEM_HOME)"))?;
        Ok(home.join(HOME_DEV_ROOT))
    };
    let root = match (&args.root, &args.development_root) {
        (Some(name), _) if name == AWS_ROOT_NAME => TrustAnchor::aws_nitro_g1(),
        (Some(pem), _) => read_root(Path::new(pem))?,
        (None, Some(path)) => {
            let path = match path {
                Some(p) => p.clone(),
                None => home_dev_root()?,
            };
            let root = read_root(&path)?;
            if root.kind() != RootKind::Development {
                return Err(anyhow!("{} is not a development root ({})", path.display(), root.label()));
            }
            root
        }
        (None, None) if home_default => match home_dev_root() {
            Ok(path) if path.is_file() => read_root(&path)?,
            _ => TrustAnchor::aws_nitro_g1(),
        },
        (None, None) => TrustAnchor::aws_nitro_g1(),
    };
    match root.kind() {
        RootKind::AwsNitroG1 => {}
        RootKind::Development => eprintln!(
            "WARNING: trusting a DEVELOPMENT attestation root ({}): receipts under it prove nothing about Nitro hardware",
            root.label()
        ),
        RootKind::Other => eprintln!("WARNING: trusting {}, which is NOT the AWS Nitro Enclaves root G1", root.label()),
    }
    Ok(root)
}

fn receipt_check(args: &RootArgs, ledger_dir: &Path, home_default: bool) -> anyhow::Result<ProtocolReceipts> {
    let root = resolve_root(args, ledger_dir, home_default)?;
    Ok(ProtocolReceipts::new(root)
        .with_expected_pcrs(args.expect_pcr.iter().cloned().collect())
        .allow_debug(args.allow_debug))
}

#[derive(Serialize)]
struct RootJson {
    kind: &'static str,
    label: String,
    sha256: String,
    development: bool,
}

impl RootJson {
    fn of(root: &TrustAnchor) -> Self {
        RootJson {
            kind: root.kind().as_str(),
            label: root.label(),
            sha256: hex::encode(root.sha256()),
            development: root.kind() == RootKind::Development,
        }
    }
}

/// The latest stored checkpoint, opened with the pinned key.
fn latest_signed(store: &dyn LedgerStore, key: &VerifierKey) -> anyhow::Result<Result<Option<Checkpoint>, String>> {
    Ok(match store.latest_checkpoint()? {
        None => Ok(None),
        Some(cp) => Checkpoint::open(cp.note.as_bytes(), key).map(Some).map_err(|e| {
            format!("latest checkpoint (size {}) does not verify under the pinned ledger key: {e}", cp.size)
        }),
    })
}

// ---- verify ----------------------------------------------------------------------------

#[derive(Serialize)]
struct VerifyJson<'a> {
    ok: bool,
    ledger: String,
    ledger_key: String,
    ledger_key_source: &'a str,
    /// The key the ledger recorded at its first append, when it differs from the pinned one.
    recorded_key_differs: bool,
    root: RootJson,
    report: &'a receipts_ledger::VerifyReport,
    messages: Vec<String>,
}

fn verify_command(dir: &Path, json: bool, trust: &LedgerTrust) -> anyhow::Result<ExitCode> {
    let store = LocalLedger::open_read_only(dir)?;
    let pinned = home_key(trust.ledger_key.as_deref(), dir)?;
    let check = receipt_check(&trust.root, dir, true)?;
    let report = verify_ledger(&store, &pinned.key, Some(&check))?;
    let recorded_key_differs = store.ledger_key()?.is_some_and(|k| k != pinned.key.to_string());
    let messages: Vec<String> = report.issues.iter().map(ToString::to_string).collect();
    if json {
        let out = VerifyJson {
            ok: report.is_ok(),
            ledger: dir.display().to_string(),
            ledger_key: pinned.key.to_string(),
            ledger_key_source: &pinned.source,
            recorded_key_differs,
            root: RootJson::of(check.root()),
            report: &report,
            messages,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("ledger      {}", dir.display());
        println!("entries     {}", report.size);
        println!("checkpoints {}", report.checkpoints);
        println!("ledger key  {} ({})", pinned.key, pinned.source);
        println!("root        {}", check.root().label());
        if recorded_key_differs {
            println!("note: the ledger records another signing key than the pinned one");
        }
        if let Some(from) = report.uncheckpointed_from {
            println!("note: entries from {from} on are not covered by a signed checkpoint yet");
        }
        for m in &messages {
            println!("FAIL  {m}");
        }
        if report.truncated {
            println!("(more issues not listed)");
        }
        if report.is_ok() {
            println!("ok: chain, tree, {} checkpoint(s) and {} receipt(s) verify", report.checkpoints, report.size);
        } else {
            let at: Vec<String> = report.indexes().iter().map(u64::to_string).collect();
            println!("FAILED: {} issue(s), at {}", report.issues.len(), at.join(", "));
        }
    }
    Ok(if report.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

// ---- checkpoint ------------------------------------------------------------------------

fn checkpoint_command(dir: &Path) -> anyhow::Result<ExitCode> {
    let store = LocalLedger::open_read_only(dir)?;
    let Some(latest) = store.latest_checkpoint()? else {
        eprintln!("the ledger has no checkpoint yet");
        return Ok(ExitCode::from(1));
    };
    let key = LocalLedger::verifier_key(dir)?;
    if let Err(e) = Checkpoint::open(latest.note.as_bytes(), &key) {
        eprintln!("checkpoint of size {} does not verify under {key}: {e}", latest.size);
        return Ok(ExitCode::from(1));
    }
    print!("{}", latest.note);
    let size = store.size()?;
    if size > latest.size {
        eprintln!(
            "note: {} entr{} appended since; `ephem-batch ledger prove` signs a new checkpoint when it needs one",
            size - latest.size,
            if size - latest.size == 1 { "y" } else { "ies" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

// ---- prove -----------------------------------------------------------------------------

fn clock_ms() -> anyhow::Result<u64> {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).context("system clock is before 1970")?;
    u64::try_from(d.as_millis()).context("system clock out of range")
}

fn job_hex(job: &str) -> anyhow::Result<String> {
    let lower = job.trim().to_ascii_lowercase();
    JobId::from_hex(&lower).map(|j| j.to_hex()).ok_or_else(|| anyhow!("job id {job:?} is not 32 hex digits"))
}

/// The bundle for `job`, signing a checkpoint first if none covers the entry yet.
fn bundle_for(dir: &Path, job: &str) -> anyhow::Result<Option<ProofBundle>> {
    let store = LocalLedger::open_read_only(dir)?;
    match prove(&store, job) {
        Ok(b) => Ok(Some(b)),
        Err(BundleError::UnknownJob(_)) => Ok(None),
        Err(BundleError::NotCheckpointed { index, .. }) => {
            drop(store);
            if let Some(cp) = LocalLedger::sign_checkpoint(dir, clock_ms()?)? {
                eprintln!("signed checkpoint of size {} to cover entry {index}", cp.size);
            }
            Ok(Some(prove(&LocalLedger::open_read_only(dir)?, job)?))
        }
        Err(e) => Err(e.into()),
    }
}

fn prove_command(dir: &Path, job: &str, output: &Path) -> anyhow::Result<ExitCode> {
    let job = job_hex(job)?;
    let Some(bundle) = bundle_for(dir, &job)? else {
        eprintln!("job {job} is not in the ledger");
        return Ok(ExitCode::from(1));
    };
    // What we hand out must verify under the key we publish.
    let key = LocalLedger::verifier_key(dir)?;
    let proven = verify_bundle(&bundle, &key).context("the bundle does not verify under this ledger's own key")?;
    let mut text = bundle.to_json();
    text.push('\n');
    if output == Path::new("-") {
        std::io::stdout().write_all(text.as_bytes())?;
    } else {
        write_atomically(output, text.as_bytes())?;
    }
    eprintln!(
        "job {job}: entry {} of the tree of size {}, checkpoint signed by {}{}",
        proven.leaf_index,
        proven.checkpoint.size,
        key,
        if output == Path::new("-") { String::new() } else { format!("; wrote {}", output.display()) }
    );
    Ok(ExitCode::SUCCESS)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path.file_name().ok_or_else(|| anyhow!("{} is not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

// ---- verify-bundle ---------------------------------------------------------------------

/// What a valid bundle proves.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct ProvenReceipt {
    #[serde(flatten)]
    pub fields: IndexedFields,
    pub tokens: u64,
    pub leaf_index: u64,
    pub tree_size: u64,
    /// The checkpoint's origin (the ledger key's name) and root.
    pub origin: String,
    pub tree_root: String,
    pub ledger_key: String,
    /// The bundle named the pinned key (if not, the named one was ignored).
    pub bundle_key_matches_pinned: bool,
    pub document_timestamp_ms: u64,
    pub module_id: String,
    pub debug_mode: bool,
}

/// Why a bundle is invalid: the check that failed and what it said.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub check: &'static str,
    pub message: String,
}

fn bundle_refusal(e: &BundleError) -> Refusal {
    let check = match e {
        BundleError::Checkpoint(_) => "checkpoint",
        BundleError::SizeMismatch { .. } => "tree_size",
        BundleError::Inclusion(_) => "inclusion",
        _ => "bundle",
    };
    Refusal { check, message: e.to_string() }
}

fn receipt_refusal(e: &ReceiptCheckError) -> Refusal {
    Refusal { check: e.check(), message: e.to_string() }
}

/// Verifies bundle bytes against the pinned key and the receipt check, in order: the
/// bundle's form, the checkpoint's signature (pinned key only), the inclusion proof, the
/// receipt and its attestation, then the job asked about.
pub fn check_bundle(
    bytes: &[u8],
    pinned: &VerifierKey,
    check: &ProtocolReceipts,
    job: Option<&str>,
) -> Result<ProvenReceipt, Refusal> {
    let bundle = ProofBundle::from_json(bytes).map_err(|e| bundle_refusal(&e))?;
    let proven = verify_bundle(&bundle, pinned).map_err(|e| bundle_refusal(&e))?;
    let receipt = check.verify(&proven.receipt, &proven.attestation_document).map_err(|e| receipt_refusal(&e))?;
    if let Some(job) = job
        && !receipt.fields.job_id.eq_ignore_ascii_case(job.trim())
    {
        return Err(Refusal {
            check: "job",
            message: format!("the bundle proves job {}, not {job}", receipt.fields.job_id),
        });
    }
    Ok(ProvenReceipt {
        fields: receipt.fields,
        tokens: receipt.receipt.tokens,
        leaf_index: proven.leaf_index,
        tree_size: proven.checkpoint.size,
        origin: proven.checkpoint.origin.clone(),
        tree_root: hex::encode(proven.checkpoint.root),
        ledger_key: pinned.to_string(),
        bundle_key_matches_pinned: proven.bundle_key_matches_pinned,
        document_timestamp_ms: receipt.document_timestamp_ms,
        module_id: receipt.module_id,
        debug_mode: receipt.debug_mode,
    })
}

#[derive(Serialize)]
struct BundleJson {
    valid: bool,
    error: Option<Refusal>,
    root: RootJson,
    proven: Option<ProvenReceipt>,
}

fn verify_bundle_command(
    dir: &Path,
    path: &Path,
    ledger_key: &str,
    job: Option<&str>,
    root: &RootArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let pinned = parse_ledger_key(ledger_key)?;
    let check = receipt_check(root, dir, false)?;
    let outcome = check_bundle(&bytes, &pinned.key, &check, job);
    if json {
        let (proven, error) = match &outcome {
            Ok(p) => (Some(p.clone()), None),
            Err(r) => (None, Some(r.clone())),
        };
        let out = BundleJson { valid: error.is_none(), error, root: RootJson::of(check.root()), proven };
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    match outcome {
        Ok(p) => {
            if !json {
                print_proven(&p, check.root());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(r) => {
            eprintln!("invalid: {}", r.message);
            Ok(ExitCode::from(1))
        }
    }
}

fn print_proven(p: &ProvenReceipt, root: &TrustAnchor) {
    let f = &p.fields;
    println!("job          {}", f.job_id);
    println!("model        {} (manifest {})", f.model_id, f.manifest_hash);
    println!("pcr0         {}", f.pcr0);
    println!("records      {} ok, {} failed, {} tokens", f.ok_count, f.failed_count, p.tokens);
    println!("ran          {} → {}", format_ms(f.start_ms), format_ms(f.end_ms));
    println!("client key   {}", f.client_key_id);
    println!(
        "attestation  {} ({}), verified at its own time {} under {}{}",
        p.module_id,
        if p.debug_mode { "DEBUG MODE" } else { "not debug mode" },
        format_ms(p.document_timestamp_ms),
        root.label(),
        if root.kind() == RootKind::Development { " (DEVELOPMENT root)" } else { "" }
    );
    println!("ledger       entry {} of {} (tree size {}, root {})", p.leaf_index, p.origin, p.tree_size, p.tree_root);
    println!("ledger key   {} (pinned)", p.ledger_key);
    if !p.bundle_key_matches_pinned {
        println!("note: the bundle names another ledger key; it was ignored");
    }
    println!("valid");
}

// ---- consistency -----------------------------------------------------------------------

#[derive(Serialize)]
struct ConsistencyJson {
    old_size: u64,
    new_size: u64,
    old_root: String,
    new_root: String,
    proof: Vec<String>,
    /// The stored signed checkpoints of these sizes, if any.
    old_checkpoint: Option<String>,
    new_checkpoint: Option<String>,
}

fn consistency_command(dir: &Path, old_size: u64, new_size: u64, json: bool) -> anyhow::Result<ExitCode> {
    let store: SqliteStore = LocalLedger::open_read_only(dir)?;
    let proof = consistency(&store, old_size, new_size)?;
    let old_root = root_at(&store, old_size)?;
    let new_root = root_at(&store, new_size)?;
    // A proof this ledger cannot verify itself is a storage fault, not an answer.
    verify_consistency(old_size, new_size, &old_root, &new_root, &proof)
        .context("the stored tree does not yield a valid consistency proof")?;
    let hexes: Vec<String> = proof.iter().map(hex::encode).collect();
    if json {
        let out = ConsistencyJson {
            old_size,
            new_size,
            old_root: hex::encode(old_root),
            new_root: hex::encode(new_root),
            proof: hexes,
            old_checkpoint: store.checkpoint_at(old_size)?.map(|c| c.note),
            new_checkpoint: store.checkpoint_at(new_size)?.map(|c| c.note),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for h in &hexes {
            println!("{h}");
        }
        eprintln!(
            "consistency proof from size {old_size} (root {}) to size {new_size} (root {}): {} hash(es)",
            hex::encode(old_root),
            hex::encode(new_root),
            hexes.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

// ---- argument parsers ------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    #[test]
    fn sync_copies_a_bucket_ledger_and_audits_it() {
        use cloud::{ObjectStore, PutCondition};
        use receipts_ledger::testing::{TestReceipts, test_request};
        use receipts_ledger::{CheckpointPolicy, Ledger, SignerKey};

        let tmp = tempfile::tempdir().unwrap();
        let bucket = tmp.path().join("bucket");
        let objects = std::sync::Arc::new(cloud::local::DirObjectStore::open(&bucket).unwrap());
        let signer = SignerKey::from_seed("ledger.example/bucket", &[7; 32]).unwrap();
        let key = signer.verifier();
        let store = tiles::TileStore::open(
            objects.clone(),
            tiles::layout::Layout::new(""),
            tiles::Cache::Memory,
            key.clone(),
            tiles::TileOptions::appender(),
        )
        .unwrap();
        let mut ledger = Ledger::new(store, Box::new(TestReceipts), Box::new(signer), CheckpointPolicy::default());
        for j in 0..5 {
            ledger.append(test_request(j, 100), 10 + j).unwrap();
        }
        let home_ledger = tmp.path().join("audit-home/ledger");
        let from = bucket.to_str().unwrap();
        let code = sync_command(&home_ledger, from, &key.to_string(), true, true).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let copy = LocalLedger::open_read_only(&home_ledger).unwrap();
        assert_eq!(copy.size().unwrap(), 5);
        assert_eq!(LocalLedger::verifier_key(&home_ledger).unwrap(), key);
        let cp = copy.latest_checkpoint().unwrap().unwrap();
        assert_eq!(Checkpoint::open(cp.note.as_bytes(), &key).unwrap().size, 5);
        drop(copy);

        // A rewritten tile is reported, and the exit status says so.
        let tile = "tile/0/000.p/5";
        let mut bytes = objects.get(tile).unwrap();
        bytes[0] ^= 0xff;
        objects.put(tile, &bytes, PutCondition::Overwrite).unwrap();
        assert_eq!(sync_command(&home_ledger, from, &key.to_string(), true, true).unwrap(), ExitCode::from(1));
        // Another key is refused before anything is copied.
        let other = SignerKey::from_seed("ledger.example/bucket", &[8; 32]).unwrap().verifier();
        let elsewhere = tmp.path().join("other/ledger");
        assert_eq!(sync_command(&elsewhere, from, &other.to_string(), false, true).unwrap(), ExitCode::from(1));
    }

    use super::*;
    use clap::Parser;
    use receipts_ledger::local::{LEDGER_DB, LocalOptions};
    use receipts_ledger::testing::DevEnclave;
    use receipts_ledger::{CheckpointPolicy, EntryVerdict, SignerKey, SqliteOptions};

    /// 2025-11-01T00:00:00Z.
    const T: u64 = 1_761_955_200_000;

    #[derive(Parser)]
    struct Wrapper {
        #[command(subcommand)]
        command: LedgerCommand,
    }

    fn parse(args: &[&str]) -> LedgerCommand {
        Wrapper::try_parse_from(std::iter::once("ledger").chain(args.iter().copied())).unwrap().command
    }

    /// An `$EPHEM_HOME` with a development CA and a ledger of `n` real receipts,
    /// checkpointed every 4 appends.
    struct Home {
        _tmp: tempfile::TempDir,
        ledger: PathBuf,
        enclave: DevEnclave,
    }

    impl Home {
        fn new(n: u64) -> Home {
            let tmp = tempfile::tempdir().unwrap();
            let enclave = DevEnclave::new(3, T);
            std::fs::create_dir_all(tmp.path().join("enclave")).unwrap();
            std::fs::write(tmp.path().join(HOME_DEV_ROOT), enclave.anchor().to_pem()).unwrap();
            let ledger = tmp.path().join("ledger");
            let options = LocalOptions {
                policy: CheckpointPolicy { every_appends: 4, every_ms: u64::MAX },
                ..LocalOptions::default()
            };
            let check = Box::new(ProtocolReceipts::new(enclave.anchor()));
            let (mut l, _) = LocalLedger::open_with(&ledger, check, &options).unwrap();
            for j in 0..n {
                l.append(enclave.request(j), T + j).unwrap();
            }
            Home { _tmp: tmp, ledger, enclave }
        }

        fn run(&self, args: &[&str]) -> u8 {
            let code = run(parse(args), &self.ledger).unwrap();
            // ExitCode has no accessor; compare with the three we use.
            [0u8, 1, 2].into_iter().find(|c| ExitCode::from(*c) == code).unwrap()
        }

        fn key(&self) -> VerifierKey {
            LocalLedger::verifier_key(&self.ledger).unwrap()
        }

        fn dev_check(&self) -> ProtocolReceipts {
            ProtocolReceipts::new(self.enclave.anchor())
        }

        fn path(&self, name: &str) -> PathBuf {
            self.ledger.parent().unwrap().join(name)
        }
    }

    fn job(j: u64) -> String {
        format!("{j:032x}")
    }

    #[test]
    fn clap_definition_follows_the_issue() {
        use clap::CommandFactory;
        Wrapper::command().debug_assert();
        let LedgerCommand::Query { job, model, pcr0, since, until, json, .. } = parse(&[
            "query",
            "--job",
            "AB",
            "--model",
            "m",
            "--pcr0",
            "CD",
            "--since",
            "2025-11-01",
            "--until",
            "1761955300000",
            "--json",
        ]) else {
            panic!()
        };
        assert_eq!((job.as_deref(), model.as_deref(), pcr0.as_deref()), (Some("AB"), Some("m"), Some("CD")));
        assert_eq!((since, until, json), (Some(T), Some(T + 100_000), true));
        assert!(matches!(parse(&["verify", "--json"]), LedgerCommand::Verify { json: true, .. }));
        assert!(matches!(parse(&["checkpoint"]), LedgerCommand::Checkpoint));
        let LedgerCommand::Prove { job, output } = parse(&["prove", "J", "-o", "b.json"]) else { panic!() };
        assert_eq!((job.as_str(), output.as_path()), ("J", Path::new("b.json")));
        let LedgerCommand::VerifyBundle { bundle, ledger_key, root, .. } =
            parse(&["verify-bundle", "b.json", "--ledger-key", "k", "--development-root"])
        else {
            panic!()
        };
        assert_eq!((bundle.as_path(), ledger_key.as_str()), (Path::new("b.json"), "k"));
        assert_eq!(root.development_root, Some(None));
        let LedgerCommand::VerifyBundle { root, .. } =
            parse(&["verify-bundle", "b.json", "--ledger-key", "k", "--development-root", "r.pem"])
        else {
            panic!()
        };
        assert_eq!(root.development_root, Some(Some(PathBuf::from("r.pem"))));
        assert!(matches!(
            parse(&["consistency", "3", "8"]),
            LedgerCommand::Consistency { old_size: 3, new_size: 8, .. }
        ));
        // verify-bundle needs a pinned key; --root and --development-root exclude each other.
        if std::env::var_os("EPHEM_LEDGER_KEY").is_none() {
            assert!(Wrapper::try_parse_from(["ledger", "verify-bundle", "b.json"]).is_err());
        }
        let both = ["ledger", "verify", "--root", "aws-nitro-g1", "--development-root"];
        assert!(Wrapper::try_parse_from(both).is_err());
    }

    #[test]
    fn time_and_pcr_arguments() {
        assert_eq!(parse_time("2025-11-01"), Ok(T));
        assert_eq!(parse_time("2025-11-01T01:00:00+01:00"), Ok(T));
        assert_eq!(parse_time("1761955200000"), Ok(T));
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("1969-12-31").is_err());
        assert_eq!(parse_pcr(&format!("0={}", "ab".repeat(48))), Ok((0, vec![0xab; 48])));
        assert!(parse_pcr("0=ab").is_err());
        assert!(parse_pcr("40=00").is_err());
    }

    #[test]
    fn query_rows_carry_the_verdict() {
        let home = Home::new(6);
        let store = LocalLedger::open_read_only(&home.ledger).unwrap();
        let rows = query_rows(&store, &Query::default(), &home.key(), &home.dev_check()).unwrap();
        assert_eq!(rows.len(), 6);
        assert!(rows[..4].iter().all(|r| r.verdict == EntryVerdict::Verified { checkpoint: 4 }), "{rows:?}");
        assert!(rows[4..].iter().all(|r| r.verdict == EntryVerdict::NotCheckpointed));
        let r = &rows[5];
        let want = home.enclave.receipt(5);
        assert_eq!(
            (r.job_id.as_str(), r.ok_count, r.failed_count, r.tokens),
            (job(5).as_str(), 1005, 2, Some(want.tokens))
        );
        assert_eq!(r.pcr0, hex::encode(want.pcrs[&0].as_slice()));
        assert_eq!(r.finished, "2025-11-01T00:00:05.500Z");

        let q = |query: Query| query_rows(&store, &query, &home.key(), &home.dev_check()).unwrap();
        assert_eq!(q(Query { job_id: Some(job(2)), ..Query::default() }).len(), 1);
        assert_eq!(q(Query { pcr0: Some(rows[0].pcr0.clone()), ..Query::default() }).len(), 6);
        assert_eq!(q(Query { pcr0: Some("00".into()), ..Query::default() }).len(), 0);
        assert_eq!(q(Query { since_ms: Some(T + 3000), until_ms: Some(T + 5000), ..Query::default() }).len(), 2);

        // Under the AWS root these receipts prove nothing: every verdict says why.
        let aws = ProtocolReceipts::new(TrustAnchor::aws_nitro_g1());
        let rows = query_rows(&store, &Query::default(), &home.key(), &aws).unwrap();
        assert!(rows.iter().all(
            |r| matches!(&r.verdict, EntryVerdict::Invalid { reason } if reason.starts_with("attestation: root_pinned"))
        ));
        // Under another ledger key no row is proven.
        let other = SignerKey::from_seed("ephem-batch.local/ledger", &[9; 32]).unwrap().verifier();
        let rows = query_rows(&store, &Query::default(), &other, &home.dev_check()).unwrap();
        assert!(rows.iter().all(
            |r| matches!(&r.verdict, EntryVerdict::Invalid { reason } if reason.starts_with("latest checkpoint"))
        ));
    }

    #[test]
    fn query_verify_checkpoint_and_consistency_commands() {
        let home = Home::new(6);
        assert_eq!(home.run(&["query"]), 0);
        assert_eq!(home.run(&["query", "--json", "--model", "sentence-transformers/all-MiniLM-L6-v2"]), 0);
        assert_eq!(home.run(&["query", "--root", "aws-nitro-g1"]), 1);
        assert_eq!(home.run(&["verify"]), 0);
        assert_eq!(home.run(&["verify", "--json"]), 0);
        assert_eq!(home.run(&["verify", "--root", "aws-nitro-g1"]), 1);
        let dev_root = home.path(HOME_DEV_ROOT);
        assert_eq!(home.run(&["verify", "--development-root", dev_root.to_str().unwrap()]), 0);
        assert_eq!(home.run(&["verify", "--ledger-key", &home.key().to_string()]), 0);
        assert_eq!(home.run(&["checkpoint"]), 0);
        assert_eq!(home.run(&["consistency", "4", "6"]), 0);
        assert_eq!(home.run(&["consistency", "4", "6", "--json"]), 0);
        assert!(run(parse(&["consistency", "4", "7"]), &home.ledger).is_err());
        assert!(run(parse(&["consistency", "0", "4"]), &home.ledger).is_err());

        // An edited row makes verify fail (the replay names the index).
        {
            let store = SqliteStore::open(&home.ledger.join(LEDGER_DB), &SqliteOptions::default()).unwrap();
            store.connection().execute("UPDATE entries SET ok_count = 7 WHERE idx = 2", []).unwrap();
        }
        assert_eq!(home.run(&["verify"]), 1);
        assert_eq!(home.run(&["query", "--job", &job(2)]), 1);
        assert_eq!(home.run(&["query", "--job", &job(3)]), 0);
    }

    #[test]
    fn missing_ledgers_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger");
        assert!(run(parse(&["verify"]), &dir).is_err());
        assert!(run(parse(&["checkpoint"]), &dir).is_err());
    }

    #[test]
    fn prove_then_verify_bundle() {
        let home = Home::new(6);
        let out = home.path("b.json");
        let out_s = out.to_str().unwrap();
        let key_file = home.ledger.join("ledger.pub");
        let key_file = key_file.to_str().unwrap();

        // Entry 5 is not covered by a checkpoint yet: prove signs one on demand.
        assert_eq!(home.run(&["prove", &job(5).to_uppercase(), "-o", out_s]), 0);
        let store = LocalLedger::open_read_only(&home.ledger).unwrap();
        assert_eq!(store.latest_checkpoint().unwrap().unwrap().size, 6);
        assert_eq!(home.run(&["prove", &job(99), "-o", out_s]), 1);
        assert!(run(parse(&["prove", "xyz", "-o", out_s]), &home.ledger).is_err());

        assert_eq!(home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root"]), 0);
        assert_eq!(
            home.run(&[
                "verify-bundle",
                out_s,
                "--ledger-key",
                &home.key().to_string(),
                "--development-root",
                "--json"
            ]),
            0
        );
        assert_eq!(
            home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root", "--job", &job(5)]),
            0
        );
        assert_eq!(
            home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root", "--job", &job(4)]),
            1
        );
        // The auditor's default root is AWS: a development bundle is refused, by name.
        assert_eq!(home.run(&["verify-bundle", out_s, "--ledger-key", key_file]), 1);
        assert!(run(parse(&["verify-bundle", out_s, "--ledger-key", "nonsense"]), &home.ledger).is_err());

        let bytes = std::fs::read(&out).unwrap();
        let v = check_bundle(&bytes, &home.key(), &home.dev_check(), None).unwrap();
        assert_eq!((v.leaf_index, v.tree_size, v.fields.job_id.as_str()), (5, 6, job(5).as_str()));
        assert_eq!(v.fields, receipts_ledger::receipt_check::indexed_fields(&home.enclave.receipt(5)));
        assert!(v.bundle_key_matches_pinned);
        let aws = ProtocolReceipts::new(TrustAnchor::aws_nitro_g1());
        assert_eq!(check_bundle(&bytes, &home.key(), &aws, None).unwrap_err().check, "attestation");
    }

    fn flip_digit(s: &str, at: usize) -> String {
        let mut b = s.as_bytes().to_vec();
        b[at] = if b[at] == b'0' { b'1' } else { b'0' };
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn changed_or_re_signed_bundles_fail() {
        let home = Home::new(4);
        let out = home.path("b.json");
        assert_eq!(home.run(&["prove", &job(1), "-o", out.to_str().unwrap()]), 0);
        let good: ProofBundle = ProofBundle::from_json(&std::fs::read(&out).unwrap()).unwrap();
        let (key, check) = (home.key(), home.dev_check());
        let verdict =
            |b: &ProofBundle| check_bundle(b.to_json().as_bytes(), &key, &check, None).map(|_| ()).map_err(|r| r.check);
        assert_eq!(verdict(&good), Ok(()));

        // One hex digit changed anywhere in the receipt, the document or the path.
        for at in (0..good.receipt.len()).step_by(7) {
            let b = ProofBundle { receipt: flip_digit(&good.receipt, at), ..good.clone() };
            assert_eq!(verdict(&b), Err("inclusion"), "receipt digit {at}");
        }
        for at in (0..good.attestation_document.len()).step_by(97) {
            let b = ProofBundle { attestation_document: flip_digit(&good.attestation_document, at), ..good.clone() };
            let e = verdict(&b).unwrap_err();
            assert!(e == "attestation" || e == "receipt_key_id" || e == "attestation_hash", "document digit {at}: {e}");
        }
        for at in 0..64 {
            let mut b = good.clone();
            b.inclusion_path[0] = flip_digit(&b.inclusion_path[0], at);
            assert_eq!(verdict(&b), Err("inclusion"), "path digit {at}");
        }

        // Re-signed with another key under the same origin, naming that key.
        let cp = Checkpoint::open(good.checkpoint.as_bytes(), &key).unwrap();
        let evil = SignerKey::from_seed(key.name(), &[0x66; 32]).unwrap();
        let resigned = ProofBundle {
            checkpoint: cp.sign(&evil).unwrap(),
            ledger_key: evil.verifier().to_string(),
            ..good.clone()
        };
        assert_eq!(verdict(&resigned), Err("checkpoint"));
        std::fs::write(&out, resigned.to_json()).unwrap();
        let key_file = home.ledger.join("ledger.pub");
        assert_eq!(
            home.run(&[
                "verify-bundle",
                out.to_str().unwrap(),
                "--ledger-key",
                key_file.to_str().unwrap(),
                "--development-root"
            ]),
            1
        );
        // ... and verified under the key it names, it is still only as good as that key.
        assert_eq!(check_bundle(resigned.to_json().as_bytes(), &evil.verifier(), &check, None).map(|_| ()), Ok(()));

        assert_eq!(check_bundle(b"{}", &key, &check, None).unwrap_err().check, "bundle");
    }
}
