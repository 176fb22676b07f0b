use protocol::dev_enclave::DevEnclave;
use protocol::online::ClientLabel;
use protocol::receipt_check::ReceiptVerifier;
use receipts_ledger::{EntryKind, LocalLedger, Query};

use super::*;
use crate::ledger::query_rows;

const T: u64 = 1_761_955_200_000;

/// A client's log of `n` exchanges in the account of `e`'s period `sequence`.
fn logged(e: &DevEnclave, sequence: u64, n: u64) -> Vec<Exchange> {
    let receipt = e.usage_receipt(sequence);
    (0..n)
        .map(|index| Exchange {
            label: receipt.client.to_hex(),
            accounted: AccountedAs {
                receipt_key_id: hex::encode(e.binding.receipt_key_id()),
                start_ms: receipt.period_start_ms,
                model: receipt.model_id.clone(),
                precision: receipt.precision.as_str().to_owned(),
                epoch: receipt.epoch,
                index,
            },
            request_sha256: hex::encode([sequence as u8, index as u8, 1].repeat(11)[..32].to_vec()),
            response_sha256: hex::encode([sequence as u8, index as u8, 2].repeat(11)[..32].to_vec()),
        })
        .collect()
}

/// The receipt the enclave signs for those exchanges.
fn receipt_for(e: &DevEnclave, sequence: u64, exchanges: &[Exchange]) -> Vec<u8> {
    let mut receipt = e.usage_receipt(sequence);
    let mut commitment = UsageCommitment::default();
    for x in exchanges {
        commitment.absorb_digests(&digest(&x.request_sha256).unwrap(), &digest(&x.response_sha256).unwrap());
    }
    receipt.requests = exchanges.len() as u64;
    receipt.commitment = commitment.0;
    receipt.sign(&e.receipt_key)
}

/// The ledger's verified usage rows after appending `leaves`.
fn rows(e: &DevEnclave, leaves: Vec<Vec<u8>>) -> Vec<Row> {
    let dir = tempfile::tempdir().unwrap();
    let (mut ledger, key) = LocalLedger::open(dir.path(), Box::new(ReceiptVerifier::new(e.anchor()))).unwrap();
    for leaf in leaves {
        ledger.append(receipts_ledger::append_request(&ReceiptVerifier::new(e.anchor()), leaf, e.document.clone()).unwrap(), T).unwrap();
    }
    drop(ledger);
    let store = LocalLedger::open_read_only(dir.path()).unwrap();
    let usage = Query { kind: Some(EntryKind::Usage), ..Query::default() };
    query_rows(&store, &usage, &key, &ReceiptVerifier::new(e.anchor())).unwrap()
}

fn outcomes(periods: &[Period]) -> Vec<(u64, Outcome)> {
    periods.iter().map(|p| (p.start_ms, p.outcome)).collect()
}

#[test]
fn an_honest_ledger_reconciles_and_a_withheld_receipt_is_named_by_its_period() {
    let e = DevEnclave::new(1, T);
    let (a, b, c) = (logged(&e, 0, 2), logged(&e, 1, 3), logged(&e, 2, 1));
    let log: Vec<Exchange> = [a.clone(), b.clone(), c.clone()].concat();
    let later = T + 60 * 60_000;
    let start = |sequence| e.usage_receipt(sequence).period_start_ms;

    let honest = rows(&e, vec![receipt_for(&e, 0, &a), receipt_for(&e, 1, &b), receipt_for(&e, 2, &c)]);
    let periods = reconcile(&log, &honest, later);
    assert_eq!(outcomes(&periods), [(start(0), Outcome::Matched), (start(1), Outcome::Matched), (start(2), Outcome::Matched)]);
    assert!(periods.iter().all(|p| p.logged == p.receipted.unwrap()));

    // The host withholds period 1's receipt: reconciliation names that period; shortly after the
    // period it is only pending.
    let withheld = rows(&e, vec![receipt_for(&e, 0, &a), receipt_for(&e, 2, &c)]);
    assert_eq!(outcomes(&reconcile(&log, &withheld, later)), [(start(0), Outcome::Matched), (start(1), Outcome::Withheld), (start(2), Outcome::Matched)]);
    assert_eq!(reconcile(&log, &withheld, start(1) + 2 * 60_000)[1].outcome, Outcome::Pending);

    // A receipt that counts one exchange fewer (or other exchanges) fails its commitment.
    let short = rows(&e, vec![receipt_for(&e, 0, &a[..1]), receipt_for(&e, 1, &b), receipt_for(&e, 2, &c)]);
    assert_eq!(reconcile(&log, &short, later)[0].outcome, Outcome::Commitment);

    // A receipt under the label for a period the log never saw charges requests it did not send.
    let foreign = logged(&e, 3, 4);
    let charged = rows(&e, vec![receipt_for(&e, 0, &a), receipt_for(&e, 1, &b), receipt_for(&e, 2, &c), receipt_for(&e, 3, &foreign)]);
    let periods = reconcile(&log, &charged, later);
    assert_eq!(periods.last().map(|p| (p.start_ms, p.outcome, p.receipted)), Some((start(3), Outcome::Unlogged, Some(4))));

    // A log that misses a place of its account cannot be reconciled, and says so.
    let gappy: Vec<Exchange> = [a.clone(), vec![b[0].clone(), b[2].clone()], c.clone()].concat();
    assert_eq!(reconcile(&gappy, &honest, later)[1].outcome, Outcome::LogIncomplete);

    // Receipts under another label are not this client's business.
    let mut other = log.clone();
    for x in &mut other {
        x.label = ClientLabel([0x01; 32]).to_hex();
    }
    let periods = reconcile(&other, &honest, later);
    assert!(periods.iter().all(|p| p.outcome == Outcome::Withheld), "{periods:?}");
}

#[test]
fn the_log_round_trips_and_refuses_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage/exchanges.jsonl");
    assert!(read(&path).unwrap().is_empty());
    let e = DevEnclave::new(1, T);
    let exchanges = logged(&e, 0, 3);
    for x in &exchanges {
        append(&path, x).unwrap();
    }
    assert_eq!(read(&path).unwrap(), exchanges);
    std::fs::write(&path, "{\"label\":1}\n").unwrap();
    assert!(read(&path).unwrap_err().to_string().contains("line 1"));
}
