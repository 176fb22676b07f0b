//! `ledger verify`: the whole ledger replayed (chain, tree, checkpoints, receipts).

use super::*;

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

pub(super) fn verify_command(dir: &Path, json: bool, trust: &LedgerTrust) -> anyhow::Result<ExitCode> {
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
