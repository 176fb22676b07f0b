//! Ledger benchmark: appends/s and proof generation time.
//!
//! `cargo bench -p receipts-ledger --bench ledger -- [SIZE ...]`
//! (default: 10000). Leaves are ~600-byte stand-in receipts. For each size it
//! reports single-append transactions/s (synchronous=FULL, durable), batched
//! appends/s (1000 per transaction) used to grow the ledger, inclusion and
//! consistency proof generation time, and a full verify.

use receipts_ledger::merkle::{consistency_proof, inclusion_proof, root_at};
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::{
    verify_ledger, CheckpointPolicy, Ledger, LedgerStore, SignerKey, SqliteOptions, SqliteStore,
};
use std::time::Instant;

const LEAF: usize = 600;
const SINGLE: u64 = 2_000;
const BATCH: u64 = 1_000;
const SAMPLES: u64 = 2_000;

/// A small deterministic generator (xorshift) for sample indexes.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn ledger(path: &std::path::Path, synchronous_full: bool) -> Ledger<SqliteStore> {
    let options = SqliteOptions { synchronous_full, ..SqliteOptions::default() };
    let store = SqliteStore::open(path, &options).unwrap();
    let key = SignerKey::from_seed("bench.ephem-batch.example/ledger", &[7; 32]).unwrap();
    Ledger::new(store, Box::new(TestReceipts), Box::new(key), CheckpointPolicy { every_appends: 256, every_ms: 10_000 })
}

fn run(size: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sqlite");
    let mut l = ledger(&path, true);
    let mut now = 1_700_000_000_000u64;
    println!("== ledger of {size} entries (leaf {LEAF} bytes)");

    // Grow to `size - SINGLE` in batches, then time single appends at the top.
    let bulk_to = size.saturating_sub(SINGLE);
    let t = Instant::now();
    let mut j = 0;
    while j < bulk_to {
        let n = BATCH.min(bulk_to - j);
        let reqs: Vec<_> = (j..j + n).map(|k| test_request(k, LEAF)).collect();
        now += 10;
        l.append_batch(&reqs, now).unwrap();
        j += n;
        if j % 100_000 == 0 {
            eprintln!("  … {j} entries, {:.0} appends/s", j as f64 / t.elapsed().as_secs_f64());
        }
    }
    if bulk_to > 0 {
        let s = t.elapsed().as_secs_f64();
        println!("batched appends ({BATCH}/txn): {bulk_to} in {s:.1} s = {:.0} appends/s", bulk_to as f64 / s);
    }
    let t = Instant::now();
    for k in bulk_to..size {
        now += 1;
        l.append(test_request(k, LEAF), now).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    let n = size - bulk_to;
    println!(
        "single appends (1/txn, synchronous=FULL) at size {bulk_to}..{size}: {n} in {s:.2} s = {:.0} appends/s ({:.2} ms each)",
        n as f64 / s,
        s * 1000.0 / n as f64
    );
    drop(l);
    // The same with synchronous=NORMAL: what an append costs without the fsync.
    let mut l = ledger(&path, false);
    let t = Instant::now();
    for k in size..size + SINGLE {
        now += 1;
        l.append(test_request(k, LEAF), now).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "single appends (1/txn, synchronous=NORMAL) at size {size}..{}: {:.0} appends/s ({:.3} ms each)",
        size + SINGLE,
        SINGLE as f64 / s,
        s * 1000.0 / SINGLE as f64
    );
    l.checkpoint_now(now + 1).unwrap();
    let size = size + SINGLE;
    let store = l.into_store();
    let file = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!("database: {:.1} MiB, {} tree nodes", file as f64 / (1 << 20) as f64, store.tree_node_count().unwrap());

    let mut rng = Rng(0x9e3779b97f4a7c15);
    let t = Instant::now();
    for _ in 0..SAMPLES {
        let i = rng.below(size);
        std::hint::black_box(inclusion_proof(&store, i, size).unwrap());
    }
    println!("inclusion proof: {:.1} µs each ({SAMPLES} random leaves)", t.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64);
    let t = Instant::now();
    for _ in 0..SAMPLES {
        let a = 1 + rng.below(size);
        std::hint::black_box(consistency_proof(&store, a, size).unwrap());
    }
    println!("consistency proof: {:.1} µs each ({SAMPLES} random old sizes)", t.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64);
    let t = Instant::now();
    for _ in 0..SAMPLES {
        let a = 1 + rng.below(size);
        std::hint::black_box(root_at(&store, a).unwrap());
    }
    println!("tree head at any size: {:.1} µs each", t.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64);
    let t = Instant::now();
    for _ in 0..SAMPLES {
        let i = rng.below(size);
        std::hint::black_box(receipts_ledger::prove(&store, &receipts_ledger::testing::test_job(i)).unwrap());
    }
    println!("full proof bundle (lookup + proof + documents): {:.1} µs each", t.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64);

    let key = SignerKey::from_seed("bench.ephem-batch.example/ledger", &[7; 32]).unwrap().verifier();
    let t = Instant::now();
    let r = verify_ledger(&store, &key, Some(&TestReceipts)).unwrap();
    assert!(r.is_ok(), "{:?}", &r.issues[..r.issues.len().min(5)]);
    println!("verify (replay chain + tree + {} checkpoints + receipt checks): {:.1} s", r.checkpoints, t.elapsed().as_secs_f64());
}

fn main() {
    let sizes: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    for size in if sizes.is_empty() { vec![10_000] } else { sizes } {
        run(size);
    }
}
