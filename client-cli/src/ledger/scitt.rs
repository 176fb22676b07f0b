//! `ledger export-scitt` / `ledger verify-scitt`: a ledger entry as an IETF SCITT transparent
//! statement carrying a COSE Receipt (docs/protocol.md §8.13, `receipts_ledger::scitt`).

use receipts_ledger::local::LEDGER_KEY;
use receipts_ledger::scitt::{export, verify_transparent_statement, VerifiedStatement};
use receipts_ledger::{LeafReader, ProtocolLeaves, ReceiptCheck, SignerKey};

use super::prove::{bundle_for, write_atomically};
use super::*;

/// Arguments of `ledger verify-scitt`.
#[derive(Args, Debug)]
pub struct VerifyScittArgs {
    /// The transparent statement (CBOR, from `ledger export-scitt`).
    pub statement: PathBuf,
    /// The ledger's verifier key to trust: the key string (name+id+base64) or a file holding it.
    #[arg(long, value_name = "FILE|TEXT", env = "EPHEM_LEDGER_KEY")]
    pub ledger_key: String,
    /// The statement must be this job's (or usage id's) receipt.
    #[arg(long, value_name = "ID", value_parser = parse_job)]
    pub job: Option<JobId>,
    /// The attestation document the receipt names: with it, the receipt's own checks (§8.1) run
    /// under the root options; without it, only its strict decoding.
    #[arg(long, value_name = "FILE")]
    pub attestation: Option<PathBuf>,
    #[command(flatten)]
    pub root: RootArgs,
    #[arg(long)]
    pub json: bool,
}

/// A refusal of `verify-scitt`, by named check.
#[derive(Debug, Serialize)]
pub struct ScittRefusal {
    pub check: &'static str,
    pub message: String,
}

/// What a verified statement proves, with the receipt's indexed fields.
#[derive(Debug, Serialize)]
pub struct ProvenStatement {
    pub leaf_index: u64,
    pub tree_size: u64,
    pub tree_root: String,
    pub issuer: String,
    pub subject: String,
    pub fields: IndexedFields,
    /// Whether the receipt's signature and attestation were checked (`--attestation`).
    pub receipt_checked: bool,
}

pub(super) fn export_scitt_command(
    dir: &Path,
    job: &JobId,
    output: &Path,
    attestation_output: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let Some(bundle) = bundle_for(dir, job)? else {
        eprintln!("job {job} is not in the ledger");
        return Ok(ExitCode::from(1));
    };
    let key_path = dir.join(LEDGER_KEY);
    let text = std::fs::read_to_string(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
    let signer = SignerKey::parse(text.trim_end_matches('\n')).with_context(|| format!("parsing {}", key_path.display()))?;
    let published = LocalLedger::verifier_key(dir)?;
    if signer.verifier() != published {
        return Err(anyhow!("{} is not the key of ledger.pub ({published})", key_path.display()));
    }
    let statement = export(&bundle, &job.to_hex(), &signer).map_err(|e| anyhow!("export: {e}"))?;
    // What we hand out must verify under the key we publish.
    let proven = verify_transparent_statement(&statement, &published).map_err(|e| anyhow!("the export does not verify: {e}"))?;
    write_atomically(output, &statement)?;
    if let Some(path) = attestation_output {
        write_atomically(path, &hex::decode(&bundle.attestation_document)?)?;
    }
    eprintln!(
        "job {job}: entry {} of the tree of size {}, COSE Receipt signed by {published}; wrote {}",
        proven.leaf_index,
        proven.tree_size,
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Checks a transparent statement: inclusion and the ledger's signature (pinned key), the
/// receipt's strict decoding, the subject, the job, and with a document the receipt checks.
pub fn check_statement(
    bytes: &[u8],
    pinned: &VerifierKey,
    receipt: Option<(&dyn ReceiptCheck, &[u8])>,
    job: Option<&JobId>,
) -> Result<ProvenStatement, ScittRefusal> {
    let refuse = |check: &'static str, message: String| ScittRefusal { check, message };
    let v: VerifiedStatement = verify_transparent_statement(bytes, pinned).map_err(|e| refuse(e.check(), e.to_string()))?;
    let claims = ProtocolLeaves.read(&v.statement).map_err(|e| refuse("statement", format!("statement: {e}")))?;
    let fields = claims.fields;
    if v.subject != fields.job_id.to_hex() {
        return Err(refuse("subject", format!("subject: the receipt's sub {} is not the statement's id {}", v.subject, fields.job_id)));
    }
    if let Some(document) = receipt.map(|(_, d)| d) {
        let check = receipt.map(|(c, _)| c).expect("paired with the document");
        let checked = check.check(&v.statement, document).map_err(|e| refuse(e.check(), e.to_string()))?;
        if checked != fields {
            return Err(refuse("fields", "fields: the checked receipt's fields differ from the statement's".into()));
        }
    }
    if let Some(job) = job
        && fields.job_id != *job
    {
        return Err(refuse("job", format!("job: the statement is job {}, not {job}", fields.job_id)));
    }
    Ok(ProvenStatement {
        leaf_index: v.leaf_index,
        tree_size: v.tree_size,
        tree_root: hex::encode(v.root),
        issuer: v.issuer,
        subject: v.subject,
        fields,
        receipt_checked: receipt.is_some(),
    })
}

pub(super) fn verify_scitt_command(dir: &Path, args: &VerifyScittArgs) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(&args.statement).with_context(|| format!("reading {}", args.statement.display()))?;
    let pinned = parse_ledger_key(&args.ledger_key)?;
    let document = match &args.attestation {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let check = match document {
        Some(_) => Some(receipt_check(&args.root, dir, false)?),
        None => None,
    };
    let receipt = check.as_ref().zip(document.as_deref()).map(|(c, d)| (c as &dyn ReceiptCheck, d));
    let result = check_statement(&bytes, &pinned.key, receipt, args.job.as_ref());
    if args.json {
        let (proven, error) = match &result {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        };
        let out = serde_json::json!({ "valid": result.is_ok(), "error": error, "proven": proven });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    match result {
        Ok(p) => {
            if !args.json {
                println!(
                    "valid: {} {} is entry {} of the tree of size {} (root {}), COSE Receipt by {}{}",
                    p.fields.kind.as_str(),
                    p.subject,
                    p.leaf_index,
                    p.tree_size,
                    p.tree_root,
                    pinned.key,
                    if p.receipt_checked { "; receipt and attestation verified" } else { "; receipt decoded, not checked (no --attestation)" }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if !args.json {
                eprintln!("invalid: {}", e.message);
            }
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests;
