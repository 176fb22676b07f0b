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
/// it, the oldest account is dropped (and counted, see [`UsageBook::dropped`]).
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
    dropped: u64,
    /// The last flush: no period starts before it.
    flushed_at_ms: u64,
}

/// The end of the whole minute `period_start_ms` lies in.
fn minute_end(period_start_ms: u64) -> u64 {
    period_start_ms - period_start_ms % PERIOD_MS + PERIOD_MS
}

impl UsageBook {
    pub fn record(&mut self, answered: Answered<'_>, now_ms: u64) {
        let account = Account {
            period_start_ms: (now_ms - now_ms % PERIOD_MS).max(self.flushed_at_ms.min(now_ms)),
            client: answered.client,
            model_id: answered.model_id.to_owned(),
            precision: answered.precision,
            epoch: answered.epoch,
        };
        if !self.open.contains_key(&account) && self.open.len() >= MAX_OPEN_ACCOUNTS {
            // Accounts sort by period first: the first is the oldest.
            if let Some((oldest, _)) = self.open.pop_first() {
                self.dropped += 1;
                tracing::warn!(period_start_ms = oldest.period_start_ms, "usage book full: the host has not collected; oldest account dropped");
            }
        }
        let tally = self.open.entry(account).or_default();
        tally.manifest_hash = answered.manifest_hash;
        tally.requests += 1;
        tally.inputs += answered.inputs;
        tally.tokens += answered.tokens;
        tally.commitment.absorb(answered.request, answered.response);
    }

    /// Accounts dropped because the book was full (the host did not collect in time).
    pub fn dropped(&self) -> u64 {
        self.dropped
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

    #[test]
    fn a_host_that_never_collects_cannot_grow_the_book_past_its_bound() {
        let mut book = UsageBook::default();
        for minute in 0..(MAX_OPEN_ACCOUNTS as u64 + 10) {
            book.record(answered(1), minute * PERIOD_MS);
        }
        assert_eq!(book.open.len(), MAX_OPEN_ACCOUNTS);
        assert_eq!(book.dropped(), 10);
        // The newest periods are the ones kept.
        assert_eq!(book.open.keys().next().unwrap().period_start_ms, 10 * PERIOD_MS);
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
