//! The client's own record of its online exchanges, and its reconciliation with the ledger's usage
//! rows (docs/protocol.md §9.5): every 200 answer says where the enclave accounted the request
//! ([`AccountedAs`]); `serve` and the SDK append that with the SHA-256 of the request and the
//! response they exchanged. From the log alone the client recomputes each account's request count
//! and commitment, and checks them against the usage receipts the ledger holds: a period with no
//! receipt is withheld, a receipt with another commitment counts other exchanges, and a receipt
//! under this client's label that its log does not know charges it for requests it never sent.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use protocol::online::AccountedAs;
use protocol::usage::UsageCommitment;
use serde::{Deserialize, Serialize};

use crate::home::Home;
use crate::ledger::{query_ledger, LedgerTrust, Row};

/// One logged exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    /// The label the request was sent under (hex).
    pub label: String,
    pub accounted: AccountedAs,
    /// SHA-256 (hex) of the Binary HTTP request and response plaintexts.
    pub request_sha256: String,
    pub response_sha256: String,
}

/// The log file of a client home.
pub fn log_path(home: &Home) -> PathBuf {
    home.root().join("usage").join("exchanges.jsonl")
}

/// Appends one exchange (one line, one write: concurrent appenders do not interleave).
pub fn append(path: &Path, exchange: &Exchange) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut line = serde_json::to_string(exchange)?;
    line.push('\n');
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("opening {}", path.display()))?;
    file.write_all(line.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// Every exchange of the log (none if there is no log yet).
pub fn read(path: &Path) -> anyhow::Result<Vec<Exchange>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| serde_json::from_str(line).with_context(|| format!("{} line {}", path.display(), n + 1)))
        .collect()
}

/// What reconciliation found for one usage account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A receipt in the ledger with the count and commitment the log gives.
    Matched,
    /// No receipt yet, and the period ended less than [`GRACE_MS`] ago.
    Pending,
    /// No receipt, though the period ended [`GRACE_MS`] or more ago: withheld.
    Withheld,
    /// A receipt whose request count or commitment is not the log's.
    Commitment,
    /// The log misses places of the account (another process of this home, a lost line): the
    /// commitment cannot be recomputed.
    LogIncomplete,
    /// A receipt under this client's label that the log does not know: requests charged to it
    /// that it did not send (or sent from another copy of its home).
    Unlogged,
}

impl Outcome {
    pub fn passed(self) -> bool {
        matches!(self, Outcome::Matched | Outcome::Pending)
    }
}

/// How long after a period ends its receipt may still be on its way (the host collects every
/// minute, then the ledger queue and the appender).
pub const GRACE_MS: u64 = 10 * 60_000;

/// One account's reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Period {
    pub label: String,
    pub receipt_key_id: String,
    pub start_ms: u64,
    pub model: String,
    pub precision: String,
    pub epoch: u64,
    /// Requests the log holds, and the count the ledger's receipt states (if there is one).
    pub logged: u64,
    pub receipted: Option<u64>,
    pub outcome: Outcome,
}

type Key = (String, String, u64, String, String, u64);

fn key_of(label: &str, a: &AccountedAs) -> Key {
    (label.to_owned(), a.receipt_key_id.clone(), a.start_ms, a.model.clone(), a.precision.clone(), a.epoch)
}

/// Reconciles `exchanges` with the ledger's verified usage `rows`, for the exchanges' labels.
pub fn reconcile(exchanges: &[Exchange], rows: &[Row], now_ms: u64) -> Vec<Period> {
    let mut groups: BTreeMap<Key, Vec<&Exchange>> = BTreeMap::new();
    for exchange in exchanges {
        groups.entry(key_of(&exchange.label, &exchange.accounted)).or_default().push(exchange);
    }
    let labels: Vec<String> = exchanges.iter().map(|e| e.label.clone()).collect();
    let mut receipts: BTreeMap<Key, (u64, String)> = BTreeMap::new();
    for row in rows {
        let Some(usage) = &row.usage else { continue };
        if !labels.contains(&row.client_key_id) {
            continue;
        }
        let key = (row.client_key_id.clone(), usage.receipt_key_id.clone(), row.started_ms, row.model_id.clone(), usage.precision.clone(), usage.epoch);
        receipts.insert(key, (usage.requests, usage.commitment.clone()));
    }
    let mut periods = Vec::new();
    for (key, mut logged) in groups {
        logged.sort_by_key(|e| e.accounted.index);
        let complete = logged.iter().enumerate().all(|(i, e)| e.accounted.index == i as u64);
        let mut commitment = UsageCommitment::default();
        for e in &logged {
            let (Ok(request), Ok(response)) = (digest(&e.request_sha256), digest(&e.response_sha256)) else { continue };
            commitment.absorb_digests(&request, &response);
        }
        let receipt = receipts.remove(&key);
        let outcome = match (&receipt, complete) {
            (_, false) => Outcome::LogIncomplete,
            (Some((requests, receipted)), true) if *requests == logged.len() as u64 && *receipted == hex::encode(commitment.0) => Outcome::Matched,
            (Some(_), true) => Outcome::Commitment,
            (None, true) if now_ms < period_end(key.2) + GRACE_MS => Outcome::Pending,
            (None, true) => Outcome::Withheld,
        };
        periods.push(period(key, logged.len() as u64, receipt.map(|r| r.0), outcome));
    }
    for (key, (requests, _)) in receipts {
        periods.push(period(key, 0, Some(requests), Outcome::Unlogged));
    }
    periods
}

/// What reconciling a home's log found.
#[derive(Debug, Clone, Serialize)]
pub struct Reconciliation {
    /// Every account matched or pending.
    pub passed: bool,
    pub log: PathBuf,
    pub exchanges: usize,
    pub periods: Vec<Period>,
}

/// The log of `home` against the verified usage rows of the ledger in `ledger_dir`.
pub fn reconcile_home(home: &Home, ledger_dir: &Path, trust: &LedgerTrust) -> anyhow::Result<Reconciliation> {
    let log = log_path(home);
    let exchanges = read(&log)?;
    let usage = receipts_ledger::Query { kind: Some(receipts_ledger::EntryKind::Usage), ..receipts_ledger::Query::default() };
    let rows: Vec<Row> = query_ledger(ledger_dir, &usage, trust)?
        .into_iter()
        .filter(|row| !matches!(row.verdict, receipts_ledger::EntryVerdict::Invalid { .. }))
        .collect();
    let periods = reconcile(&exchanges, &rows, cloud::now_ms());
    Ok(Reconciliation { passed: periods.iter().all(|p| p.outcome.passed()), log, exchanges: exchanges.len(), periods })
}

/// `ledger reconcile-usage`.
pub fn reconcile_command(home: &Home, ledger_dir: &Path, json: bool, trust: &LedgerTrust) -> anyhow::Result<std::process::ExitCode> {
    let found = reconcile_home(home, ledger_dir, trust)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        println!("{} exchanges in {}", found.exchanges, found.log.display());
        for p in &found.periods {
            let receipted = p.receipted.map_or("none".to_owned(), |n| n.to_string());
            println!(
                "{:<13} period from {} ({} {} epoch {}, enclave {}…): {} logged, receipt {}",
                serde_json::to_value(p.outcome)?.as_str().unwrap_or_default(),
                protocol::attestation::format_ms(p.start_ms),
                p.model,
                p.precision,
                p.epoch,
                &p.receipt_key_id[..p.receipt_key_id.len().min(16)],
                p.logged,
                receipted
            );
        }
    }
    Ok(if found.passed { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) })
}

fn period(key: Key, logged: u64, receipted: Option<u64>, outcome: Outcome) -> Period {
    let (label, receipt_key_id, start_ms, model, precision, epoch) = key;
    Period { label, receipt_key_id, start_ms, model, precision, epoch, logged, receipted, outcome }
}

/// The end of the enclave's whole minute a period starts in (a flushed period ends earlier; its
/// receipt then comes sooner, never later).
fn period_end(start_ms: u64) -> u64 {
    start_ms - start_ms % 60_000 + 60_000
}

fn digest(text: &str) -> anyhow::Result<[u8; 32]> {
    hex::decode(text)?.try_into().map_err(|_| anyhow::anyhow!("not a SHA-256 digest: {text}"))
}

#[cfg(test)]
mod tests;
