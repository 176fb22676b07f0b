//! Usage accounting of online requests: per client label, model, precision and epoch, over
//! periods of [`PERIOD_MS`]; a period that has ended becomes a signed usage receipt when the host
//! collects it. A flush ends every open period early; what comes after it in the same minute
//! starts at the flush, so no two receipts' periods of one account overlap.

use std::collections::BTreeMap;

use protocol::envelope::Precision;
use protocol::online::ClientLabel;
use protocol::usage::{UsageCommitment, UsageReceipt};

use crate::worker::Worker;

pub const PERIOD_MS: u64 = 60_000;
/// Open accounts held at most: a host that never collects cannot grow the enclave's memory. Past
/// it, a request that would open another account is refused before it is computed
/// ([`UsageBook::admits`]); no account is ever dropped, so no one can evict another's usage. (The
/// book may pass the bound by the requests computed at the same moment, at most the online
/// concurrency.)
pub const MAX_OPEN_ACCOUNTS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Account {
    period_start_ms: u64,
    client: ClientLabel,
    model_id: String,
    precision: Precision,
    epoch: u64,
}

#[derive(Default)]
struct Tally {
    manifest_hash: [u8; 32],
    requests: u64,
    inputs: u64,
    tokens: u64,
    commitment: UsageCommitment,
}

/// One answered request, as accounted.
pub struct Answered<'a> {
    pub client: ClientLabel,
    pub model_id: &'a str,
    pub manifest_hash: [u8; 32],
    pub precision: Precision,
    pub epoch: u64,
    pub inputs: u64,
    pub tokens: u64,
    pub request: &'a [u8],
    pub response: &'a [u8],
}

#[derive(Default)]
pub struct UsageBook {
    open: BTreeMap<Account, Tally>,
    issued: u64,
    /// The last flush: no period starts before it.
    flushed_at_ms: u64,
}

/// The end of the whole minute `period_start_ms` lies in.
fn minute_end(period_start_ms: u64) -> u64 {
    period_start_ms - period_start_ms % PERIOD_MS + PERIOD_MS
}

impl UsageBook {
    fn account(&self, client: ClientLabel, model_id: &str, precision: Precision, epoch: u64, now_ms: u64) -> Account {
        Account {
            period_start_ms: (now_ms - now_ms % PERIOD_MS).max(self.flushed_at_ms.min(now_ms)),
            client,
            model_id: model_id.to_owned(),
            precision,
            epoch,
        }
    }

    /// Whether a request of `client` for `model_id` at `precision` under `epoch` may be computed
    /// now: its account is open already, or the book has room for one more.
    pub fn admits(&self, client: ClientLabel, model_id: &str, precision: Precision, epoch: u64, now_ms: u64) -> bool {
        self.open.len() < MAX_OPEN_ACCOUNTS || self.open.contains_key(&self.account(client, model_id, precision, epoch, now_ms))
    }

    /// Where a request answered now would be accounted: its account and the requests before it
    /// there (what the answer tells the client, and what [`UsageBook::record`] then records).
    pub fn slot(&self, client: ClientLabel, model_id: &str, precision: Precision, epoch: u64, now_ms: u64) -> (u64, u64) {
        let account = self.account(client, model_id, precision, epoch, now_ms);
        (account.period_start_ms, self.open.get(&account).map_or(0, |tally| tally.requests))
    }

    pub fn record(&mut self, answered: Answered<'_>, now_ms: u64) {
        let account = self.account(answered.client, answered.model_id, answered.precision, answered.epoch, now_ms);
        let tally = self.open.entry(account).or_default();
        tally.manifest_hash = answered.manifest_hash;
        tally.requests += 1;
        tally.inputs += answered.inputs;
        tally.tokens += answered.tokens;
        tally.commitment.absorb(answered.request, answered.response);
    }

    /// Takes the accounts whose period ended by `now_ms` (every one if `flush`, and then no new
    /// period starts before `now_ms`).
    fn take_ended(&mut self, now_ms: u64, flush: bool) -> Vec<(Account, Tally)> {
        if flush {
            self.flushed_at_ms = self.flushed_at_ms.max(now_ms);
        }
        let ended: Vec<Account> =
            self.open.keys().filter(|a| flush || minute_end(a.period_start_ms) <= now_ms).cloned().collect();
        ended.into_iter().filter_map(|a| self.open.remove(&a).map(|t| (a, t))).collect()
    }

    /// Signs the receipts of every period that ended by `now_ms` (all of them if `flush`).
    pub fn collect(&mut self, worker: &Worker, now_ms: u64, flush: bool) -> Vec<(Vec<u8>, Vec<u8>)> {
        let ended = self.take_ended(now_ms, flush);
        let mut out = Vec::new();
        for (account, tally) in ended {
            // A receipt names the document of its epoch; an epoch no longer held cannot be named.
            let Some(epoch) = worker.held_epoch(account.epoch) else {
                tracing::warn!(epoch = account.epoch, "usage of an epoch no longer held is dropped");
                continue;
            };
            let receipt = UsageReceipt {
                client: account.client,
                model_id: account.model_id,
                manifest_hash: tally.manifest_hash,
                precision: account.precision,
                period_start_ms: account.period_start_ms,
                // A flushed period ends now.
                period_end_ms: minute_end(account.period_start_ms).min(now_ms.max(account.period_start_ms + 1)),
                requests: tally.requests,
                inputs: tally.inputs,
                tokens: tally.tokens,
                commitment: tally.commitment.0,
                sequence: self.issued,
                attestation_sha256: epoch.document_sha256,
                pcrs: worker.receipt_pcrs(),
                fleet_key_id: epoch.secret.public_key().key_id(),
                epoch: account.epoch,
            };
            self.issued += 1;
            out.push((receipt.sign(worker.receipt_key()), epoch.document.clone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(client: u8) -> Answered<'static> {
        Answered {
            client: ClientLabel([client; 32]),
            model_id: "m",
            manifest_hash: [0; 32],
            precision: Precision::Fp32,
            epoch: 1,
            inputs: 1,
            tokens: 3,
            request: b"q",
            response: b"r",
        }
    }

    /// 4,097 accounts (a host that never collects, or clients opening labels) cannot evict the
    /// victim's: the 4,097th is refused before anything is computed, and the victim's tally stays.
    #[test]
    fn a_full_book_refuses_new_accounts_and_evicts_no_one() {
        let mut book = UsageBook::default();
        let victim = ClientLabel([0xee; 32]);
        book.record(Answered { client: victim, ..answered(0) }, 5);
        for client in 1..MAX_OPEN_ACCOUNTS as u32 {
            let label = nth_label(client);
            assert!(book.admits(label, "m", Precision::Fp32, 1, 5));
            book.record(Answered { client: label, ..answered(0) }, 5);
        }
        assert_eq!(book.open.len(), MAX_OPEN_ACCOUNTS);
        let newcomer = ClientLabel([0xaa; 32]);
        assert!(!book.admits(newcomer, "m", Precision::Fp32, 1, 5), "the 4,097th account is refused");
        assert!(!book.admits(victim, "m", Precision::Fp32, 1, PERIOD_MS + 5), "a new period is a new account");
        assert!(book.admits(victim, "m", Precision::Fp32, 1, 7), "an open account goes on");
        let ended = book.take_ended(PERIOD_MS, false);
        let kept = ended.iter().find(|(a, _)| a.client == victim).expect("the victim's usage is kept");
        assert_eq!((kept.1.requests, kept.1.tokens), (1, 3));
        assert!(book.admits(newcomer, "m", Precision::Fp32, 1, PERIOD_MS + 5), "collected: room again");
    }

    /// Distinct labels for the fill.
    fn nth_label(n: u32) -> ClientLabel {
        let mut label = [1u8; 32];
        label[..4].copy_from_slice(&n.to_be_bytes());
        ClientLabel(label)
    }

    /// A host that flushes often (the development stack does) gets receipts whose periods follow
    /// one another: none starts before the previous flush.
    #[test]
    fn periods_after_a_flush_start_at_the_flush() {
        let mut book = UsageBook::default();
        book.record(answered(1), PERIOD_MS + 5);
        let first = book.take_ended(PERIOD_MS + 30_000, true);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0.period_start_ms, PERIOD_MS);
        book.record(answered(1), PERIOD_MS + 40_000);
        assert!(book.take_ended(PERIOD_MS + 50_000, false).is_empty(), "the minute has not ended");
        let second = book.take_ended(2 * PERIOD_MS, false);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].0.period_start_ms, PERIOD_MS + 30_000);
        assert_eq!(minute_end(second[0].0.period_start_ms), 2 * PERIOD_MS);
        // The next minute starts at its own beginning.
        book.record(answered(1), 2 * PERIOD_MS + 1);
        assert_eq!(book.open.keys().next().unwrap().period_start_ms, 2 * PERIOD_MS);
    }

    #[test]
    fn requests_of_one_period_and_client_share_an_account() {
        let mut book = UsageBook::default();
        book.record(answered(1), 5);
        book.record(answered(1), PERIOD_MS - 1);
        book.record(answered(2), 7);
        assert_eq!(book.open.len(), 2);
        let tally = &book.open.values().next().unwrap();
        assert_eq!((tally.requests, tally.inputs, tally.tokens), (2, 2, 6));
    }
}
