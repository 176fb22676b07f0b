//! What the ledger commands pin: the ledger key and the attestation root.

use super::*;

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

pub(super) fn home_key(arg: Option<&str>, ledger_dir: &Path) -> anyhow::Result<PinnedKey> {
    match arg {
        Some(arg) => parse_ledger_key(arg),
        None => Ok(PinnedKey {
            key: LocalLedger::verifier_key(ledger_dir)?,
            source: ledger_dir.join(receipts_ledger::local::LEDGER_PUB).display().to_string(),
        }),
    }
}

pub(super) fn read_root(path: &Path) -> anyhow::Result<TrustAnchor> {
    let pem = std::fs::read_to_string(path).with_context(|| format!("reading root {}", path.display()))?;
    TrustAnchor::from_pem(&pem).with_context(|| format!("root {}", path.display()))
}

/// The root receipts' documents must chain to. `home_default`: without options, trust
/// the home's development root if it has one (the home's own ledger), else AWS.
pub(super) fn resolve_root(args: &RootArgs, ledger_dir: &Path, home_default: bool) -> anyhow::Result<TrustAnchor> {
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

pub(super) fn receipt_check(args: &RootArgs, ledger_dir: &Path, home_default: bool) -> anyhow::Result<ReceiptVerifier> {
    let root = resolve_root(args, ledger_dir, home_default)?;
    Ok(ReceiptVerifier::new(root)
        .with_expected_pcrs(args.expect_pcr.iter().cloned().collect())
        .allow_debug(args.allow_debug))
}

#[derive(Serialize)]
pub(super) struct RootJson {
    kind: &'static str,
    label: String,
    sha256: String,
    development: bool,
}

impl RootJson {
    pub(super) fn of(root: &TrustAnchor) -> Self {
        RootJson {
            kind: root.kind().as_str(),
            label: root.label(),
            sha256: hex::encode(root.sha256()),
            development: root.kind() == RootKind::Development,
        }
    }
}

/// The latest stored checkpoint, opened with the pinned key.
pub(super) fn latest_signed(store: &dyn LedgerStore, key: &VerifierKey) -> anyhow::Result<Result<Option<Checkpoint>, String>> {
    Ok(match store.latest_checkpoint()? {
        None => Ok(None),
        Some(cp) => Checkpoint::open(cp.note.as_bytes(), key).map(Some).map_err(|e| {
            format!("latest checkpoint (size {}) does not verify under the pinned ledger key: {e}", cp.size)
        }),
    })
}
