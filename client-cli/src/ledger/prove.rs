//! `ledger prove`: a job's offline proof bundle, signing a checkpoint first if none covers it.

use super::*;

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
