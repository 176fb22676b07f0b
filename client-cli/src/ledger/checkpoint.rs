//! `ledger checkpoint`: the latest signed checkpoint.

use super::*;

pub(super) fn checkpoint_command(dir: &Path) -> anyhow::Result<ExitCode> {
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
