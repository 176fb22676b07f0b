//! `ephem-batch ledger query`: the compliance view, one row per receipt with its verdict and
//! the attestation policy the appender admitted it under. Usage receipts of online requests
//! (docs/protocol.md §9.5) are rows too (`kind` `usage`; `--online` shows only them), and a
//! gap in an enclave's usage sequence — a receipt a host withheld — is reported.

use std::path::Path;
use std::process::ExitCode;

use protocol::attestation::format_ms;
use protocol::JobId;
use protocol::receipt::SignedReceipt;
use protocol::usage::SignedUsageReceipt;
use receipts_ledger::{EntryKind, EntryVerdict, LedgerStore, LocalLedger, Query, VerifierKey, verify_entry};
use protocol::receipt_check::ReceiptVerifier;
use serde::Serialize;

use super::{LedgerTrust, home_key, latest_signed, receipt_check};

/// One row of the compliance view.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub index: u64,
    pub kind: EntryKind,
    /// A job's id, or a usage receipt's usage id.
    pub job_id: JobId,
    pub model_id: String,
    pub manifest_hash: String,
    pub pcr0: String,
    pub client_key_id: String,
    pub started_ms: u64,
    pub finished_ms: u64,
    pub finished: String,
    pub ok_count: u64,
    pub failed_count: u64,
    /// From the receipt, once it verified.
    pub tokens: Option<u64>,
    /// A usage receipt's own counts, once it verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageDetail>,
    pub appended_ms: u64,
    /// Id (hex SHA-256 of the signed bytes) of the publisher-signed attestation policy the
    /// appender found the receipt's document to satisfy; `null` for rows appended without one.
    pub policy: Option<String>,
    #[serde(flatten)]
    pub verdict: EntryVerdict,
}

/// What a verified usage receipt adds to its row.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct UsageDetail {
    pub requests: u64,
    /// The enclave's count of usage receipts before this one, under `receipt_key_id`.
    pub sequence: u64,
    pub receipt_key_id: String,
    pub precision: String,
    pub epoch: u64,
    /// The receipt's commitment over its exchanges (hex), which their client can recompute.
    pub commitment: String,
}

/// Usage sequence numbers missing between the lowest and highest seen per enclave receipt key:
/// receipts signed but never appended (withheld by a host, or still on their way).
pub fn usage_gaps(rows: &[Row]) -> Vec<(String, Vec<u64>)> {
    let mut seen: std::collections::BTreeMap<&str, std::collections::BTreeSet<u64>> = Default::default();
    for usage in rows.iter().filter_map(|r| r.usage.as_ref()) {
        seen.entry(&usage.receipt_key_id).or_default().insert(usage.sequence);
    }
    seen.into_iter()
        .filter_map(|(key, sequences)| {
            let (first, last) = (*sequences.first()?, *sequences.last()?);
            let missing: Vec<u64> = (first..=last).filter(|n| !sequences.contains(n)).take(32).collect();
            (!missing.is_empty()).then(|| (key.to_owned(), missing))
        })
        .collect()
}

/// The rows `query` matches, each with its verdict.
pub fn query_rows(
    store: &dyn LedgerStore,
    query: &Query,
    key: &VerifierKey,
    check: &ReceiptVerifier,
) -> anyhow::Result<Vec<Row>> {
    // The checkpoint, the rows and their proofs of one moment.
    let _snapshot = store.read_snapshot()?;
    let checkpoint = latest_signed(store, key)?;
    let mut rows = Vec::new();
    for entry in store.query(query)? {
        let mut verdict = verify_entry(store, &entry, check, checkpoint.as_ref().ok().and_then(Option::as_ref))?;
        // An entry that is fine on its own is still not proven if the checkpoint is not.
        if let (EntryVerdict::NotCheckpointed, Err(reason)) = (&verdict, &checkpoint) {
            verdict = EntryVerdict::Invalid { reason: reason.clone() };
        }
        let valid = !matches!(verdict, EntryVerdict::Invalid { .. });
        let (tokens, usage) = match entry.fields.kind {
            _ if !valid => (None, None),
            EntryKind::Job => (SignedReceipt::decode(&entry.leaf).ok().map(|s| s.receipt.tokens), None),
            EntryKind::Usage => match SignedUsageReceipt::decode(&entry.leaf) {
                Ok(signed) => (
                    Some(signed.receipt.tokens),
                    Some(UsageDetail {
                        requests: signed.receipt.requests,
                        sequence: signed.receipt.sequence,
                        receipt_key_id: hex::encode(signed.kid),
                        precision: signed.receipt.precision.as_str().to_owned(),
                        epoch: signed.receipt.epoch,
                        commitment: hex::encode(signed.receipt.commitment),
                    }),
                ),
                Err(_) => (None, None),
            },
        };
        let f = entry.fields;
        rows.push(Row {
            index: entry.index,
            kind: f.kind,
            finished: format_ms(f.end_ms),
            job_id: f.job_id,
            model_id: f.model_id,
            manifest_hash: f.manifest_hash,
            pcr0: f.pcr0,
            client_key_id: f.client_key_id,
            started_ms: f.start_ms,
            finished_ms: f.end_ms,
            ok_count: f.ok_count,
            failed_count: f.failed_count,
            tokens,
            usage,
            appended_ms: entry.appended_ms,
            policy: f.policy,
            verdict,
        });
    }
    Ok(rows)
}

fn verdict_text(v: &EntryVerdict) -> String {
    match v {
        EntryVerdict::Verified { checkpoint } => format!("verified (checkpoint {checkpoint})"),
        EntryVerdict::NotCheckpointed => "valid, not checkpointed yet".into(),
        EntryVerdict::Invalid { reason } => format!("INVALID: {reason}"),
    }
}

/// The compliance view of the ledger in `dir` under `trust` (the ledger key and root `query`
/// pins): the rows `query` matches, each with its verdict.
pub fn query_ledger(dir: &Path, query: &Query, trust: &LedgerTrust) -> anyhow::Result<Vec<Row>> {
    let store = LocalLedger::open_read_only(dir)?;
    let pinned = home_key(trust.ledger_key.as_deref(), dir)?;
    let check = receipt_check(&trust.root, dir, true)?;
    query_rows(&store, query, &pinned.key, &check)
}

pub(super) fn query_command(dir: &Path, query: &Query, json: bool, trust: &LedgerTrust) -> anyhow::Result<ExitCode> {
    let store = LocalLedger::open_read_only(dir)?;
    let pinned = home_key(trust.ledger_key.as_deref(), dir)?;
    let check = receipt_check(&trust.root, dir, true)?;
    let rows = query_rows(&store, query, &pinned.key, &check)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table(&rows));
        println!();
        println!("{} receipt(s); ledger key {} ({})", rows.len(), pinned.key, pinned.source);
        println!("attestation root {}", check.root().label());
        for (key, missing) in usage_gaps(&rows) {
            println!("usage receipts missing from enclave receipt key {}…: sequence {missing:?}", &key[..16]);
        }
    }
    let invalid = rows.iter().any(|r| matches!(r.verdict, EntryVerdict::Invalid { .. }));
    Ok(if invalid { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The human view: one line per row, `policy` the first 16 hex digits of the policy id (`-`:
/// appended before the ledger enforced one).
fn table(rows: &[Row]) -> String {
    let header = ["#", "finished (UTC)", "kind", "job", "model", "ok", "failed", "tokens", "pcr0", "policy", "verdict"];
    let cells: Vec<[String; 11]> = rows
        .iter()
        .map(|r| {
            [
                r.index.to_string(),
                r.finished.clone(),
                r.kind.as_str().to_owned(),
                r.job_id.to_hex(),
                r.model_id.clone(),
                r.ok_count.to_string(),
                r.failed_count.to_string(),
                r.tokens.map_or_else(|| "-".into(), |t| t.to_string()),
                format!("{}…", r.pcr0.get(..16).unwrap_or(&r.pcr0)),
                r.policy.as_ref().map_or_else(|| "-".into(), |p| format!("{}…", p.get(..16).unwrap_or(p))),
                verdict_text(&r.verdict),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cols: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
            if i + 1 == cols.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    for row in &cells {
        line(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use protocol::dev_enclave::DevEnclave;
    use receipts_ledger::testing::dev_request;
    use protocol::attestation::{PolicySet, policy_id};
    use std::sync::Arc;

    const T: u64 = 1_761_955_200_000;

    /// A row from before the ledger enforced policies, then one from each image of a rotation.
    #[test]
    fn query_shows_the_policy_each_row_satisfied() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ledger");
        let (old, new) = (DevEnclave::new(3, T), DevEnclave::with_image(3, 0x0b, T));
        let publisher = SigningKey::from_bytes(&[0x51; 32]);
        {
            let (mut l, _) = LocalLedger::open(&dir, Box::new(ReceiptVerifier::new(old.anchor()))).unwrap();
            l.append(dev_request(&old, 0), T).unwrap();
        }
        let signed = vec![("old.json".into(), old.policy(&publisher)), ("new.json".into(), new.policy(&publisher))];
        let set = PolicySet::verify(&publisher.verifying_key(), signed).unwrap();
        let check = Arc::new(ReceiptVerifier::enforcing(old.anchor(), set).unwrap());
        let (mut l, key) = LocalLedger::open(&dir, Box::new(check)).unwrap();
        l.append(dev_request(&old, 1), T).unwrap();
        l.append(dev_request(&new, 2), T).unwrap();
        drop(l);

        let store = LocalLedger::open_read_only(&dir).unwrap();
        let rows = query_rows(&store, &Query::default(), &key, &ReceiptVerifier::new(old.anchor())).unwrap();
        let (old_id, new_id) = (hex::encode(policy_id(&old.policy(&publisher))), hex::encode(policy_id(&new.policy(&publisher))));
        let policies: Vec<Option<&str>> = rows.iter().map(|r| r.policy.as_deref()).collect();
        assert_eq!(policies, vec![None, Some(old_id.as_str()), Some(new_id.as_str())]);
        assert!(rows.iter().all(|r| !matches!(r.verdict, EntryVerdict::Invalid { .. })), "{rows:?}");

        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["policy"], serde_json::Value::Null);
        assert_eq!(json[2]["policy"], new_id.as_str());
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains(" policy "), "{text}");
        assert!(lines[1].contains(" - "), "{text}");
        assert!(lines[2].contains(&format!("{}…", &old_id[..16])), "{text}");
        assert!(lines[3].contains(&format!("{}…", &new_id[..16])), "{text}");
    }

    /// Usage rows carry their counts, and a receipt signed but never appended shows as a gap
    /// in its enclave's sequence.
    #[test]
    fn usage_rows_carry_their_counts_and_a_withheld_receipt_shows() {
        let dir = tempfile::tempdir().unwrap();
        let e = DevEnclave::new(1, T);
        let (mut l, key) = LocalLedger::open(dir.path(), Box::new(ReceiptVerifier::new(e.anchor()))).unwrap();
        l.append(dev_request(&e, 0), T).unwrap();
        for sequence in [0, 1, 3] {
            let leaf = e.usage_receipt(sequence).sign(&e.receipt_key);
            l.append(receipts_ledger::append_request(&ReceiptVerifier::new(e.anchor()), leaf, e.document.clone()).unwrap(), T).unwrap();
        }
        drop(l);
        let store = LocalLedger::open_read_only(dir.path()).unwrap();
        let check = ReceiptVerifier::new(e.anchor());
        let usage = Query { kind: Some(EntryKind::Usage), ..Query::default() };
        let rows = query_rows(&store, &usage, &key, &check).unwrap();
        assert_eq!(rows.iter().map(|r| r.usage.as_ref().unwrap().sequence).collect::<Vec<_>>(), vec![0, 1, 3]);
        assert_eq!((rows[0].tokens, rows[0].usage.as_ref().unwrap().requests), (Some(90), 3));
        let gaps = usage_gaps(&rows);
        assert_eq!(gaps, vec![(hex::encode(e.binding.receipt_key_id()), vec![2])]);
        assert!(table(&rows).lines().nth(1).unwrap().contains(" usage "));
        let all = query_rows(&store, &Query::default(), &key, &check).unwrap();
        assert_eq!(all.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![EntryKind::Job, EntryKind::Usage, EntryKind::Usage, EntryKind::Usage]);
        assert!(all[0].usage.is_none());
    }
}
