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
    /// The witnesses whose cosignature on the latest checkpoint verified (with --witness).
    witnesses: Option<Vec<String>>,
    /// The latest checkpoint against the one this client saw before.
    seen: Option<SeenCheck>,
    /// Witness and seen-checkpoint refusals, each naming its check.
    refusals: Vec<Refusal>,
}

pub(super) fn verify_command(dir: &Path, json: bool, trust: &LedgerTrust, witness: &WitnessArgs) -> anyhow::Result<ExitCode> {
    let store = LocalLedger::open_read_only(dir)?;
    let pinned = home_key(trust.ledger_key.as_deref(), dir)?;
    let check = receipt_check(&trust.root, dir, true)?;
    let policy = witness.policy()?;
    // The replay, the latest checkpoint and the consistency proof from the one seen before all
    // read one moment of the ledger, however the appender commits meanwhile.
    let _snapshot = store.read_snapshot()?;
    let report = verify_ledger(&store, &pinned.key, Some(&check))?;
    let recorded_key_differs = store.ledger_key()?.is_some_and(|k| k != pinned.key.to_string());
    let messages: Vec<String> = report.issues.iter().map(ToString::to_string).collect();
    let (mut witnesses, mut seen, mut refusals) = (None, None, Vec::new());
    let latest = store.latest_checkpoint()?;
    match (&latest, &policy) {
        (Some(latest), Some(policy)) => match check_witnessed(policy, &latest.note) {
            Ok(names) => witnesses = Some(names),
            Err(r) => refusals.push(r),
        },
        (None, Some(_)) => {
            refusals.push(Refusal { check: "witness_quorum", message: "the ledger has no checkpoint to be cosigned".into() })
        }
        _ => {}
    }
    // The checkpoint is remembered only once everything else about it verified.
    if let Some(latest) = &latest
        && report.is_ok()
        && refusals.is_empty()
        && let Ok(cp) = Checkpoint::open(latest.note.as_bytes(), &pinned.key)
    {
        match check_seen(dir, &store, &cp, &latest.note)? {
            Ok(s) => seen = Some(s),
            Err(r) => refusals.push(r),
        }
    }
    let ok = report.is_ok() && refusals.is_empty();
    if json {
        let out = VerifyJson {
            ok,
            ledger: dir.display().to_string(),
            ledger_key: pinned.key.to_string(),
            ledger_key_source: &pinned.source,
            recorded_key_differs,
            root: RootJson::of(check.root()),
            report: &report,
            messages,
            witnesses,
            seen,
            refusals,
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
        if let (Some(names), Some(policy)) = (&witnesses, &policy) {
            println!("witnesses   {} cosigned the latest checkpoint (quorum {})", names.join(", "), policy.quorum);
        }
        if policy.is_none() {
            println!("witnesses   none configured: the checkpoints are signed by the operator's key only (--witness, EPHEM_WITNESSES)");
        }
        if let Some(s) = &seen {
            match s.previous {
                Some(p) => println!("seen        checkpoint {} extends the {p} this client saw before", s.size),
                None => println!("seen        checkpoint {} recorded (first seen)", s.size),
            }
        }
        for m in &messages {
            println!("FAIL  {m}");
        }
        for r in &refusals {
            println!("FAIL  {}: {}", r.check, r.message);
        }
        if report.truncated {
            println!("(more issues not listed)");
        }
        if ok {
            println!("ok: chain, tree, {} checkpoint(s) and {} receipt(s) verify", report.checkpoints, report.size);
        } else if !report.is_ok() {
            let at: Vec<String> = report.indexes().iter().map(u64::to_string).collect();
            println!("FAILED: {} issue(s), at {}", report.issues.len(), at.join(", "));
        } else {
            println!("FAILED: {}", refusals.iter().map(|r| r.check).collect::<Vec<_>>().join(", "));
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
