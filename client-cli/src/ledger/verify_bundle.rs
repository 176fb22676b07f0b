//! `ledger verify-bundle`: a proof bundle checked offline against a pinned ledger key.

use super::*;

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

/// [`check_bundle`], then the bundle's checkpoint must carry a quorum of `policy`'s witnesses'
/// cosignatures (check `witness_quorum`, or `witness_cosignature` for one that fails).
pub fn check_bundle_witnessed(
    bytes: &[u8],
    pinned: &VerifierKey,
    check: &ReceiptVerifier,
    job: Option<&JobId>,
    policy: Option<&receipts_ledger::WitnessPolicy>,
) -> Result<(ProvenReceipt, Vec<String>), Refusal> {
    let proven = check_bundle(bytes, pinned, check, job)?;
    let Some(policy) = policy else { return Ok((proven, Vec::new())) };
    let bundle = ProofBundle::from_json(bytes).map_err(|e| bundle_refusal(&e))?;
    Ok((proven, check_witnessed(policy, &bundle.checkpoint)?))
}

#[derive(Serialize)]
struct BundleJson {
    valid: bool,
    error: Option<Refusal>,
    root: RootJson,
    proven: Option<ProvenReceipt>,
    witnesses: Vec<String>,
}

/// What an offline check of a bundle trusts: the pinned ledger key, the attestation root (and
/// measurements) receipts must chain to, and the witness policy.
pub(super) struct OfflineCheck {
    pub pinned: PinnedKey,
    pub check: ReceiptVerifier,
    pub witnesses: Option<receipts_ledger::WitnessPolicy>,
}

impl OfflineCheck {
    /// The bundle file's bytes and the check its options describe.
    pub fn load(dir: &Path, path: &Path, ledger_key: &str, root: &RootArgs, witness: &WitnessArgs) -> anyhow::Result<(Vec<u8>, Self)> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let trust = Self { pinned: parse_ledger_key(ledger_key)?, check: receipt_check(root, dir, false)?, witnesses: witness.policy()? };
        Ok((bytes, trust))
    }
}

pub(super) fn verify_bundle_command(
    dir: &Path,
    path: &Path,
    ledger_key: &str,
    job: Option<&JobId>,
    root: &RootArgs,
    witness: &WitnessArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (bytes, trust) = OfflineCheck::load(dir, path, ledger_key, root, witness)?;
    let outcome = check_bundle_witnessed(&bytes, &trust.pinned.key, &trust.check, job, trust.witnesses.as_ref());
    if json {
        let (proven, witnesses, error) = match &outcome {
            Ok((p, w)) => (Some(p.clone()), w.clone(), None),
            Err(r) => (None, Vec::new(), Some(r.clone())),
        };
        let out = BundleJson { valid: error.is_none(), error, root: RootJson::of(trust.check.root()), proven, witnesses };
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    match outcome {
        Ok((p, witnesses)) => {
            if !json {
                if let Some(policy) = &trust.witnesses {
                    println!("witnesses    {} cosigned (quorum {})", witnesses.join(", "), policy.quorum);
                }
                print_proven(&p, trust.check.root());
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
