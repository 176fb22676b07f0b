//! `ledger prove`, `ledger verify-bundle` and `ledger consistency`: offline proofs.

use super::*;

// ---- prove -----------------------------------------------------------------------------

pub(super) fn clock_ms() -> anyhow::Result<u64> {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).context("system clock is before 1970")?;
    u64::try_from(d.as_millis()).context("system clock out of range")
}

/// The bundle for `job`, signing a checkpoint first if none covers the entry yet.
pub(super) fn bundle_for(dir: &Path, job: &JobId) -> anyhow::Result<Option<ProofBundle>> {
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

pub(super) fn prove_command(dir: &Path, job: &JobId, output: &Path) -> anyhow::Result<ExitCode> {
    let Some(bundle) = bundle_for(dir, job)? else {
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

pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
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

pub(super) fn bundle_refusal(e: &BundleError) -> Refusal {
    let check = match e {
        BundleError::Checkpoint(_) => "checkpoint",
        BundleError::SizeMismatch { .. } => "tree_size",
        BundleError::Inclusion(_) => "inclusion",
        _ => "bundle",
    };
    Refusal { check, message: e.to_string() }
}

pub(super) fn receipt_refusal(e: &ReceiptRefusal) -> Refusal {
    Refusal { check: e.check(), message: e.to_string() }
}

/// Verifies bundle bytes against the pinned key and the receipt check, in order: the
/// bundle's form, the checkpoint's signature (pinned key only), the inclusion proof, the
/// receipt and its attestation, then the job asked about.
pub fn check_bundle(
    bytes: &[u8],
    pinned: &VerifierKey,
    check: &ReceiptVerifier,
    job: Option<&JobId>,
) -> Result<ProvenReceipt, Refusal> {
    let bundle = ProofBundle::from_json(bytes).map_err(|e| bundle_refusal(&e))?;
    let proven = verify_bundle(&bundle, pinned).map_err(|e| bundle_refusal(&e))?;
    let receipt =
        check.verify(&proven.receipt, &proven.attestation_document).map_err(|e| receipt_refusal(&e.into()))?;
    let fields = receipt_fields(&receipt).map_err(|e| receipt_refusal(&e))?;
    if let Some(job) = job
        && fields.job_id != *job
    {
        return Err(Refusal { check: "job", message: format!("the bundle proves job {}, not {job}", fields.job_id) });
    }
    Ok(ProvenReceipt {
        fields,
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

pub(super) fn verify_bundle_command(
    dir: &Path,
    path: &Path,
    ledger_key: &str,
    job: Option<&JobId>,
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

pub(super) fn print_proven(p: &ProvenReceipt, root: &TrustAnchor) {
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

pub(super) fn consistency_command(dir: &Path, old_size: u64, new_size: u64, json: bool) -> anyhow::Result<ExitCode> {
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
