//! The dense layers' products alone, with the blocking this CPU's L2 chose and without depth
//! slices, alternately (the machines drift within minutes): GFLOP/s per shape, median of the
//! runs. The shapes are the dense layers of all-MiniLM-L6-v2 (hidden 384), BERT-base (768) and
//! BERT-large (1,024): FFN input and output, `m` token rows.
//!
//! ```text
//! cargo run --release -p enclave-worker --example bench_dense -- [--threads 2] [--rows 2048] [--runs 9] [--bf16] [--slice N]
//! cargo run --release -p enclave-worker --example bench_dense -- --units [--threads 2] [--rows 2048] [--runs 9]
//! ```
//!
//! `--units`: the f32, bf16 and int8 products on every unit alternately instead (AVX-512, AMX
//! tiles, f32 and int8 on AVX2) beside gemm's f32 product, with the chosen blocking (AMX only
//! where this CPU has it and Linux grants the tile state).
//! `--slice N`: the "chosen" column measures depth slices of N lanes instead of this CPU's.

use std::time::Instant;

use enclave_worker::inference::dense_bench as bench;
use enclave_worker::inference::{DenseBlocking, DenseUnit, L2Size, dense_blocking, dense_units};

const SHAPES: [(&str, usize, usize); 6] = [
    ("MiniLM FFN in", 384, 1536),
    ("MiniLM FFN out", 1536, 384),
    ("BERT-base FFN in", 768, 3072),
    ("BERT-base FFN out", 3072, 768),
    ("BERT-large FFN in", 1024, 4096),
    ("BERT-large FFN out", 4096, 1024),
];

fn flag(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Deterministic values in [-0.5, 0.5).
fn values(seed: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed)) % 1000) as f32 / 1000.0 - 0.5).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every product on every unit and gemm's f32 product (the encoder's on a CPU without AVX2),
/// alternately, per shape: GOP/s (two operations per multiply-add), "–" where this CPU cannot
/// run it.
fn units(pool: &rayon::ThreadPool, m: usize, runs: usize) {
    use bench::Arithmetic::{Bf16, F32, Int8};
    let columns = [("f32 AVX-512", F32, DenseUnit::Avx512), ("f32 AVX2", F32, DenseUnit::Avx2), ("bf16 AVX-512", Bf16, DenseUnit::Avx512), ("bf16 AMX", Bf16, DenseUnit::Amx), ("int8 VNNI", Int8, DenseUnit::Avx512), ("int8 AMX", Int8, DenseUnit::Amx), ("int8 AVX2", Int8, DenseUnit::Avx2)];
    let chosen = *dense_blocking();
    println!("dense units {:?}; {} threads, {m} rows, median of {runs}", dense_units(), pool.current_num_threads());
    println!("| shape | k × n | f32 gemm | {} |", columns.map(|c| c.0).join(" | "));
    println!("|---|---|---|{}", "---|".repeat(columns.len()));
    for (seed, &(name, k, n)) in SHAPES.iter().enumerate() {
        let x = values(seed, m * k);
        let w = bench::pack(&values(seed + 7, k * n), k, n);
        let mut out = vec![0f32; m * n];
        let mut times = columns.map(|_| Vec::new());
        let mut gemm = Vec::new();
        for _ in 0..=runs {
            let start = Instant::now();
            pool.install(|| bench::gemm_f32(&x, m, &w, &mut out));
            gemm.push(2.0 * (m * k * n) as f64 / start.elapsed().as_secs_f64() / 1e9);
            for ((_, arithmetic, unit), times) in columns.iter().zip(&mut times) {
                let start = Instant::now();
                if pool.install(|| bench::product_on(&x, m, &w, &mut out, *arithmetic, *unit, &chosen)).is_some() {
                    times.push(2.0 * (m * k * n) as f64 / start.elapsed().as_secs_f64() / 1e9);
                }
            }
        }
        // The first run of each warms its caches: left out.
        let cells = times.map(|v| if v.len() > 1 { format!("{:.1}", median(v[1..].to_vec())) } else { "–".to_owned() });
        println!("| {name} | {k} × {n} | {:.1} | {} |", median(gemm[1..].to_vec()), cells.join(" | "));
    }
}

fn main() {
    let (threads, m, runs) = (flag("--threads", 2), flag("--rows", 2048), flag("--runs", 9));
    if std::env::args().any(|a| a == "--units") {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
        return units(&pool, m, runs);
    }
    let bf16 = std::env::args().any(|a| a == "--bf16");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    // `--slice N`: measure slices of N lanes instead of the chosen ones.
    let chosen = match flag("--slice", 0) {
        0 => *dense_blocking(),
        depth_slice => DenseBlocking { depth_slice, ..*dense_blocking() },
    };
    let unsliced = DenseBlocking { l2: L2Size(0), measured: false, depth_slice: usize::MAX };
    println!(
        "L2 {} KiB per thread ({}), depth slices of at most {} lanes; {threads} threads, {m} rows, {}, median of {runs}",
        chosen.l2.0 >> 10,
        if chosen.measured { "CPUID" } else { "assumed" },
        chosen.depth_slice,
        if bf16 { "bf16" } else { "f32" },
    );
    println!("| shape | k × n | lanes deep | slices | GFLOP/s chosen | GFLOP/s unsliced | chosen / unsliced (median of pairs) |");
    println!("|---|---|---|---|---|---|---|");
    for (seed, &(name, k, n)) in SHAPES.iter().enumerate() {
        let x = values(seed, m * k);
        let w = bench::pack(&values(seed + 7, k * n), k, n);
        let mut out = vec![0f32; m * n];
        let mut time = |blocking: &DenseBlocking| {
            let start = Instant::now();
            pool.install(|| bench::product(&x, m, &w, &mut out, bf16, blocking)).expect("this CPU has no AVX-512 BF16");
            2.0 * (m * k * n) as f64 / start.elapsed().as_secs_f64() / 1e9
        };
        time(&chosen);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        // In pairs, each first in every other pair: the machine's speed drifts between runs,
        // and the ratio of a pair's two runs is what a change is judged by.
        for run in 0..runs {
            let pair = if run % 2 == 0 { [&chosen, &unsliced] } else { [&unsliced, &chosen] };
            let [first, second] = pair.map(&mut time);
            let (a, b) = if run % 2 == 0 { (first, second) } else { (second, first) };
            with.push(a);
            without.push(b);
        }
        let depth = if bf16 { k.div_ceil(2) } else { k };
        let ratio = median(with.iter().zip(&without).map(|(a, b)| a / b).collect());
        let (with, without) = (median(with), median(without));
        println!(
            "| {name} | {k} × {n} | {depth} | {} | {with:.1} | {without:.1} | {ratio:.3} |",
            depth.div_ceil(chosen.depth_slice),
        );
    }
}
