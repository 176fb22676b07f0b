//! Inference benchmark: embeds a JSONL corpus (`{"id","text"}` per line, e.g. from
//! `scripts/build_corpus.py`) with the worker's engine at several thread counts and prints
//! documents/s, real tokens/s, achieved GFLOP/s, padded fraction, latency of one short and one
//! 128-token text, model load time (from bytes already in memory) and peak RSS.
//!
//! ```text
//! python3 scripts/build_corpus.py --count 2000 --out /tmp/corpus-2000.jsonl
//! cargo run --release -p enclave-worker --example bench_inference -- --corpus /tmp/corpus-2000.jsonl
//!     [--threads 1,2] [--repeats 3] [--budget 2048] [--max-batch 128] [--window 1024]
//!     [--backend fused|candle] [--max-tokens 256] [--pooling mean|cls|lasttoken] [--no-latency] [--no-agreement] [--vectors OUT.f32] [--json out.json]
//! ```
//!
//! Each thread count runs in a child process started with `RAYON_NUM_THREADS=n
//! CANDLE_NUM_THREADS=n`: candle sizes its element-wise pool from the environment once per process
//! (see `enclave_worker::inference` docs), and peak RSS is per process that way too.
//! The model comes from `EPHEM_MODEL_DIR` or `.ephem/models/all-MiniLM-L6-v2`
//! (`bash scripts/setup-model.sh`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use enclave_worker::inference::dense_bench::Arithmetic;
use enclave_worker::inference::{
    Backend, BatchLimits, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, ModelFiles,
    candle_thread_settings,
};
use protocol::envelope::{OutputDtype, Precision};
use protocol::manifest::Pooling;
use protocol::records::{InputRecord, OutputRecord, Vector};

/// all-MiniLM-L6-v2 cost model (issue 8): 21.2 MFLOP per token for the dense layers, plus
/// 9.2 kFLOP × sequence length per token for attention.
const DENSE_FLOP_PER_TOKEN: f64 = 21.2e6;
const ATTENTION_FLOP_PER_TOKEN_PER_POSITION: f64 = 9.2e3;

#[derive(Debug, Clone)]
struct Args {
    corpus: PathBuf,
    threads: Vec<usize>,
    repeats: usize,
    budget: usize,
    max_batch: usize,
    window: usize,
    json: Option<PathBuf>,
    backend: Backend,
    precision: Precision,
    /// Truncation length (the model's own for long-context models).
    max_tokens: usize,
    /// Pooling of the model (mean for all-MiniLM-L6-v2; the long-document models' own).
    pooling: Pooling,
    /// Whether to time the two single texts (long-document runs skip them: they measure the
    /// corpus only).
    latency: bool,
    /// Whether a reduced precision also measures its agreement with fp32 (a second, fp32 pass over
    /// the corpus, after the timed ones).
    agreement: bool,
    /// Where to write the last pass's vectors (little-endian f32, corpus order).
    vectors: Option<PathBuf>,
    child: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        corpus: PathBuf::new(),
        threads: vec![1, 2],
        repeats: 3,
        budget: BatchLimits::default().max_padded_tokens,
        max_batch: BatchLimits::default().max_batch_size,
        window: EngineSettings::default().window_records,
        json: None,
        backend: Backend::Fused,
        precision: Precision::Fp32,
        max_tokens: EmbedderSettings::default().max_tokens,
        pooling: Pooling::Mean,
        latency: true,
        agreement: true,
        vectors: None,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--corpus" => args.corpus = PathBuf::from(value()),
            "--threads" => {
                args.threads =
                    value().split(',').map(|t| t.trim().parse().unwrap_or_else(|_| usage("--threads 1,2"))).collect()
            }
            "--repeats" => args.repeats = value().parse().unwrap_or_else(|_| usage("--repeats N")),
            "--budget" => args.budget = value().parse().unwrap_or_else(|_| usage("--budget TOKENS")),
            "--max-batch" => args.max_batch = value().parse().unwrap_or_else(|_| usage("--max-batch N")),
            "--window" => args.window = value().parse().unwrap_or_else(|_| usage("--window N")),
            "--max-tokens" => args.max_tokens = value().parse().unwrap_or_else(|_| usage("--max-tokens N")),
            "--json" => args.json = Some(PathBuf::from(value())),
            "--backend" => {
                args.backend = match value().as_str() {
                    "fused" => Backend::Fused,
                    "candle" => Backend::CandleBert,
                    _ => usage("--backend fused|candle"),
                }
            }
            "--precision" => {
                args.precision = match value().as_str() {
                    "fp32" => Precision::Fp32,
                    "bf16" => Precision::Bf16,
                    "int8" => Precision::Int8,
                    _ => usage("--precision fp32|bf16|int8"),
                }
            }
            "--pooling" => args.pooling = Pooling::from_name(&value()).unwrap_or_else(|| usage("--pooling mean|cls|lasttoken")),
            "--no-latency" => args.latency = false,
            "--no-agreement" => args.agreement = false,
            "--vectors" => args.vectors = Some(PathBuf::from(value())),
            "--child" => args.child = true,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if args.corpus.as_os_str().is_empty() {
        usage("--corpus FILE.jsonl is required");
    }
    args.repeats = args.repeats.max(1);
    args
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage: bench_inference --corpus FILE.jsonl [--threads 1,2] [--repeats 3] [--budget 2048] \
         [--max-batch 128] [--window 1024] [--backend fused|candle] [--precision fp32|bf16|int8] [--max-tokens 256] \
         [--pooling mean|cls|lasttoken] [--no-latency] [--no-agreement] [--vectors OUT.f32] [--json OUT]"
    );
    std::process::exit(2)
}


/// A latency as printed: two decimals, or `-` when not measured.
fn milliseconds(value: &serde_json::Value) -> String {
    value.as_f64().map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2}"))
}

fn model_dir() -> PathBuf {
    std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ephem/models/all-MiniLM-L6-v2")))
}

fn read_model_file(name: &str) -> Vec<u8> {
    let path = model_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        eprintln!("{}: {e}; install the model with: bash scripts/setup-model.sh", path.display());
        std::process::exit(1)
    })
}

fn read_corpus(path: &PathBuf) -> Vec<InputRecord> {
    let raw = std::fs::read_to_string(path).unwrap_or_else(|e| {
        eprintln!("{}: {e}; build one with scripts/build_corpus.py", path.display());
        std::process::exit(1)
    });
    raw.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
            InputRecord {
                id: value["id"].as_str().map(str::to_owned).unwrap_or_else(|| format!("line-{}", i + 1)),
                text: value["text"].as_str().unwrap_or_else(|| panic!("line {}: no text", i + 1)).as_bytes().to_vec(),
            }
        })
        .collect()
}

/// The arithmetic of a reduced precision's products, `None` for fp32.
fn reduced_arithmetic(precision: Precision) -> Option<Arithmetic> {
    match precision {
        Precision::Bf16 => Some(Arithmetic::Bf16),
        Precision::Int8 => Some(Arithmetic::Int8),
        _ => None,
    }
}

/// The issue rate (GOP/s) of the unit this run's bf16 or int8 products run on (AVX-512 VNNI or
/// BF16, AVX2's int8 pair): its peak, measured; AMX tiles' is a multiple of the FMA peak
/// (bench/report.py).
fn unit_peak(pool: &rayon::ThreadPool, precision: Precision) -> Option<f64> {
    enclave_worker::inference::dense_bench::unit_peak(pool, reduced_arithmetic(precision)?, 0.5)
}

/// Length buckets (tokens with `[CLS]`/`[SEP]`) of a reduced precision's agreement with fp32.
const TOKEN_BUCKETS: [(&str, std::ops::RangeInclusive<u32>); 4] =
    [("1-8", 1..=8), ("9-32", 9..=32), ("33-128", 33..=128), ("129+", 129..=u32::MAX)];

/// The texts of the int8 accuracy set (tests/testdata/short_texts/reference.json: 156 short texts
/// and the reference texts of every length), beside the corpus in the per-length agreement; none
/// if the file is not there.
fn read_accuracy_set() -> Vec<InputRecord> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/short_texts/reference.json");
    let Ok(raw) = std::fs::read_to_string(path) else {
        eprintln!("{path}: not found; the length buckets cover the corpus only");
        return Vec::new();
    };
    let doc: serde_json::Value = serde_json::from_str(&raw).expect("the accuracy set is JSON");
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .enumerate()
        .map(|(i, c)| InputRecord { id: format!("accuracy-{i}"), text: c["text"].as_str().expect("text").as_bytes().to_vec() })
        .collect()
}

/// A bucket's first length ("9-32" → 9), to show them in order (JSON objects are not).
fn leading_number(name: &str) -> u32 {
    name.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(u32::MAX)
}

/// A `/proc/self/status` size in KiB (`VmHWM`: peak resident set; `VmRSS`: resident now).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Resets the peak resident set to the current one (Linux ≥ 4.0), so that the peak after it
/// is the embedding's alone, not the model load's (checkpoint and packed weights together).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// GEMM peak of candle on this machine now (same process, same threads): (4096,384)×(384,1536)
/// f32, the shape of the model's FFN, median GFLOP/s of 10 after warm-up. Run inside the engine's
/// pool so that it gets the same threads.
fn gemm_peak(pool: &rayon::ThreadPool) -> f64 {
    use candle_core::{Device, Tensor};
    pool.install(|| {
        let a = Tensor::randn(0f32, 1.0, (4096, 384), &Device::Cpu).unwrap();
        let b = Tensor::randn(0f32, 1.0, (384, 1536), &Device::Cpu).unwrap();
        let mut rates = Vec::new();
        for i in 0..13 {
            let started = Instant::now();
            let c = a.matmul(&b).unwrap();
            let elapsed = started.elapsed().as_secs_f64();
            drop(c);
            if i >= 3 {
                rates.push(2.0 * 4096.0 * 384.0 * 1536.0 / elapsed / 1e9);
            }
        }
        median(&mut rates)
    })
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn useful_flop(tokens: u64) -> f64 {
    let n = tokens as f64;
    n * (DENSE_FLOP_PER_TOKEN + ATTENTION_FLOP_PER_TOKEN_PER_POSITION * n)
}

/// One thread count, in this process.
fn run_child(args: &Args) -> serde_json::Value {
    let threads = args.threads[0];
    let records = read_corpus(&args.corpus);
    let (config, tokenizer, weights) =
        (read_model_file("config.json"), read_model_file("tokenizer.json"), read_model_file("model.safetensors"));
    let started = Instant::now();
    let embedder = Embedder::load(
        ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] },
        EmbedderSettings { backend: args.backend, max_tokens: args.max_tokens, pooling: args.pooling, ..EmbedderSettings::default() },
    )
    .expect("load model");
    assert_eq!(embedder.backend(), args.backend);
    let load = started.elapsed();
    drop((config, tokenizer, weights));

    let settings = EngineSettings {
        threads,
        limits: BatchLimits { max_padded_tokens: args.budget, max_batch_size: args.max_batch },
        window_records: args.window,
        ..Default::default()
    };
    let engine = Engine::new(Arc::new(embedder), settings).expect("engine");
    let (loading_peak_kib, loaded_kib) = (status_kib("VmHWM"), status_kib("VmRSS"));
    let reset = reset_peak_rss();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    let load_before = load_average();
    let peak_before = gemm_peak(&pool);
    let fma_before = enclave_worker::inference::dense_bench::fma_peak(&pool, 0.5);
    let unit_peak_before = unit_peak(&pool, args.precision);
    let options = EmbedOptions { precision: args.precision, ..EmbedOptions::default() };

    // Warm-up (thread pools, allocator, caches).
    let warm: Vec<InputRecord> = records.iter().take(64).cloned().collect();
    engine.embed_records(&warm, &options, OutputDtype::F32);

    let mut docs_per_s = Vec::new();
    let mut tokens_per_s = Vec::new();
    let mut gflops = Vec::new();
    let mut last = None;
    let mut vectors = Vec::new();
    for _ in 0..args.repeats {
        let before = engine.metrics();
        let mut flop = 0.0;
        let mut failed = 0u64;
        vectors.clear();
        let started = Instant::now();
        engine
            .embed_stream(records.iter().cloned(), &options, OutputDtype::F32, |out| {
                match out {
                    OutputRecord::Embedding { tokens, vector, .. } => {
                        flop += useful_flop(u64::from(tokens));
                        if args.vectors.is_some() {
                            let Vector::F32(values) = vector else { panic!("asked for f32 vectors") };
                            vectors.extend(values.iter().flat_map(|v| v.to_le_bytes()));
                        }
                    }
                    OutputRecord::Error { .. } => failed += 1,
                }
                Ok::<(), ()>(())
            })
            .unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        let delta = engine.metrics().since(&before);
        docs_per_s.push(delta.documents as f64 / elapsed);
        tokens_per_s.push(delta.real_tokens as f64 / elapsed);
        gflops.push(flop / elapsed / 1e9);
        last = Some((delta, elapsed, failed));
    }
    let (delta, elapsed, failed) = last.unwrap();
    if let Some(path) = &args.vectors {
        std::fs::write(path, &vectors).expect("write the vectors");
    }

    // Latency of one short and one 128-token text (median of 20 after a warm-up).
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("../testdata/reference_embeddings.json")).unwrap();
    let case = |name: &str| {
        reference["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let latency = |text: &str| {
        let mut times = Vec::new();
        for i in 0..23 {
            let started = Instant::now();
            let result = engine.embed_window(&[text], &options);
            assert!(result[0].is_ok());
            if i >= 3 {
                times.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        median(&mut times)
    };
    // Reduced precision: its worst cosine to the fp32 vectors over the whole corpus, and per
    // length bucket over the corpus and the accuracy set (short texts and reference texts).
    let accuracy_set = read_accuracy_set();
    let agreement = (args.agreement && args.precision != Precision::Fp32).then(|| {
        let texts: Vec<InputRecord> = records.iter().chain(&accuracy_set).cloned().collect();
        let vectors = |options: &EmbedOptions| {
            let mut out = Vec::with_capacity(texts.len());
            engine
                .embed_stream(texts.iter().cloned(), options, OutputDtype::F32, |record| {
                    match record {
                        OutputRecord::Embedding { vector, tokens, .. } => out.push(Some((vector.to_f32(), tokens))),
                        OutputRecord::Error { .. } => out.push(None),
                    }
                    Ok::<(), ()>(())
                })
                .unwrap();
            out
        };
        let (reduced, full) = (vectors(&options), vectors(&EmbedOptions::default()));
        let cosines: Vec<Option<(f64, u32)>> = reduced
            .iter()
            .zip(&full)
            .map(|(a, b)| Some((cosine(&a.as_ref()?.0, &b.as_ref()?.0), b.as_ref()?.1)))
            .collect();
        let corpus = cosines[..records.len()].iter().flatten().map(|c| c.0).fold(1.0f64, f64::min);
        let buckets: serde_json::Map<String, serde_json::Value> = TOKEN_BUCKETS
            .iter()
            .map(|(name, range)| {
                let inside: Vec<f64> = cosines.iter().flatten().filter(|c| range.contains(&c.1)).map(|c| c.0).collect();
                let min = inside.iter().copied().reduce(f64::min);
                ((*name).to_owned(), serde_json::json!({"min": min, "texts": inside.len()}))
            })
            .collect();
        (corpus, buckets)
    });
    let min_cosine_to_fp32 = agreement.as_ref().map(|a| a.0);
    let min_cosine_to_fp32_by_tokens = agreement.map(|a| a.1);
    let (short_ms, ms_128) = match args.latency {
        true => (Some(latency(&case("capital_of_france"))), Some(latency(&case("tokens_128")))),
        false => (None, None),
    };

    let peak_after = gemm_peak(&pool);
    let fma_after = enclave_worker::inference::dense_bench::fma_peak(&pool, 0.5);
    let unit_peak_after = unit_peak(&pool, args.precision);
    let load_after = load_average();
    let gemm_peak_gflops = peak_before.max(peak_after);

    let candle = candle_thread_settings();
    let blocking = enclave_worker::inference::dense_blocking();
    let units = enclave_worker::inference::dense_units();
    let unit = |unit: Option<enclave_worker::inference::DenseUnit>| unit.map(|unit| unit.as_str());
    let mut result = serde_json::json!({
        "dense_units": {"f32": unit(units.f32), "bf16": unit(units.bf16), "int8": unit(units.int8)},
        "dense_l2_bytes": blocking.l2.0,
        "dense_l2_from_cpuid": blocking.measured,
        "dense_depth_slice": blocking.depth_slice,
        "threads": threads,
        "backend": format!("{:?}", args.backend),
        "precision": args.precision.as_str(),
        "min_cosine_to_fp32": min_cosine_to_fp32,
        "min_cosine_to_fp32_by_tokens": min_cosine_to_fp32_by_tokens,
        "accuracy_set_texts": accuracy_set.len(),
        "candle_gemm_tasks": candle.gemm_tasks,
        "candle_elementwise_threads": candle.elementwise_threads,
        "documents": delta.documents,
        "failed": failed,
        "repeats": args.repeats,
        "documents_per_s": median(&mut docs_per_s),
        "documents_per_s_runs": docs_per_s,
        "real_tokens_per_s": median(&mut tokens_per_s),
        "useful_gflop_per_s": median(&mut gflops),
        "gemm_peak_gflop_per_s": gemm_peak_gflops,
        "gemm_peak_before_after": [peak_before, peak_after],
        "fma_peak_gflop_per_s": fma_before.max(fma_after),
        "fma_peak_before_after": [fma_before, fma_after],
        "unit_peak_before_after": [unit_peak_before, unit_peak_after],
        "loadavg_before_after": [load_before, load_after],
        "mean_tokens": delta.real_tokens as f64 / delta.documents.max(1) as f64,
        "padded_fraction": delta.padded_fraction(),
        "batches": delta.batches,
        "windows": delta.windows,
        "last_run_s": elapsed,
        "tokenize_s": delta.tokenize.as_secs_f64(),
        "model_s": delta.model.as_secs_f64(),
        "latency_9_tokens_ms": short_ms,
        "latency_128_tokens_ms": ms_128,
        "model_load_ms": load.as_secs_f64() * 1e3,
        "peak_rss_mib": loading_peak_kib.max(status_kib("VmHWM")) as f64 / 1024.0,
        "loading_peak_rss_mib": loading_peak_kib as f64 / 1024.0,
        "loaded_rss_mib": loaded_kib as f64 / 1024.0,
        "embedding_peak_rss_mib": reset.then(|| status_kib("VmHWM") as f64 / 1024.0),
    });
    // `<precision>_<unit>_peak_gop_per_s`, as bench/report.py reads it.
    let reduced_unit = reduced_arithmetic(args.precision).and_then(Arithmetic::unit).map(|unit| unit.as_str());
    if let (Some(unit), Some((before, after))) = (reduced_unit, unit_peak_before.zip(unit_peak_after)) {
        result[format!("{}_{unit}_peak_gop_per_s", args.precision.as_str())] = before.max(after).into();
    }
    result
}

fn main() {
    let args = parse_args();
    if args.child {
        println!("{}", run_child(&args));
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    let corpus_len = read_corpus(&args.corpus).len();
    println!(
        "{:?} backend, corpus {} ({corpus_len} documents), budget {} padded tokens, max batch {}, window {}, \
         {} repeats (median)",
        args.backend,
        args.corpus.display(),
        args.budget,
        args.max_batch,
        args.window,
        args.repeats
    );
    let mut results = Vec::new();
    for &threads in &args.threads {
        let started = Instant::now();
        let output = Command::new(&exe)
            .args(["--child", "--threads", &threads.to_string(), "--repeats", &args.repeats.to_string()])
            .args(["--budget", &args.budget.to_string(), "--max-batch", &args.max_batch.to_string()])
            .args(["--window", &args.window.to_string(), "--max-tokens", &args.max_tokens.to_string()])
            .args(["--backend", if args.backend == Backend::Fused { "fused" } else { "candle" }])
            .args(["--precision", args.precision.as_str(), "--pooling", args.pooling.as_str()])
            .args(if args.latency { &[][..] } else { &["--no-latency"][..] })
            .args(if args.agreement { &[][..] } else { &["--no-agreement"][..] })
            .args(args.vectors.iter().flat_map(|path| [std::ffi::OsStr::new("--vectors"), path.as_os_str()]))
            .arg("--corpus")
            .arg(&args.corpus)
            .env("RAYON_NUM_THREADS", threads.to_string())
            .env("CANDLE_NUM_THREADS", threads.to_string())
            .output()
            .expect("run child");
        if !output.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&output.stderr));
            panic!("child for {threads} threads failed");
        }
        let line = String::from_utf8_lossy(&output.stdout);
        let r: serde_json::Value = serde_json::from_str(line.trim()).expect("child output");
        println!(
            "threads {:>2}: {:>7.1} docs/s  {:>8.0} tokens/s  {:>6.1} GFLOP/s ({:.0}% of GEMM peak {:.0}, {:.0}% of FMA peak {:.0})  padded {:>4.1}%  \
             (mean {:.1} tokens, {} batches)  latency 9-tok {} ms, 128-tok {} ms  load {:.0} ms  peak RSS {:.0} MiB  load avg {} → {}  [{:.0?}]{}",
            threads,
            r["documents_per_s"].as_f64().unwrap(),
            r["real_tokens_per_s"].as_f64().unwrap(),
            r["useful_gflop_per_s"].as_f64().unwrap(),
            100.0 * r["useful_gflop_per_s"].as_f64().unwrap() / r["gemm_peak_gflop_per_s"].as_f64().unwrap(),
            r["gemm_peak_gflop_per_s"].as_f64().unwrap(),
            100.0 * r["useful_gflop_per_s"].as_f64().unwrap() / r["fma_peak_gflop_per_s"].as_f64().unwrap(),
            r["fma_peak_gflop_per_s"].as_f64().unwrap(),
            r["padded_fraction"].as_f64().unwrap() * 100.0,
            r["mean_tokens"].as_f64().unwrap(),
            r["batches"],
            milliseconds(&r["latency_9_tokens_ms"]),
            milliseconds(&r["latency_128_tokens_ms"]),
            r["model_load_ms"].as_f64().unwrap(),
            r["peak_rss_mib"].as_f64().unwrap(),
            r["loadavg_before_after"][0].as_str().unwrap_or(""),
            r["loadavg_before_after"][1].as_str().unwrap_or(""),
            Duration::from_secs_f64(started.elapsed().as_secs_f64()),
            r["min_cosine_to_fp32"]
                .as_f64()
                .map(|c| format!("  {} min cosine to fp32 {c:.6}", r["precision"].as_str().unwrap_or("")))
                .unwrap_or_default()
                + &r["min_cosine_to_fp32_by_tokens"]
                    .as_object()
                    .map(|b| {
                        let mut buckets: Vec<_> = b.iter().collect();
                        buckets.sort_by_key(|(name, _)| leading_number(name));
                        let shown: Vec<String> = buckets
                            .into_iter()
                            .map(|(name, v)| format!("{name}: {} ({})", v["min"].as_f64().map_or("-".into(), |m| format!("{m:.6}")), v["texts"]))
                            .collect();
                        format!(" (by tokens {})", shown.join(", "))
                    })
                    .unwrap_or_default(),
        );
        results.push(r);
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "corpus": args.corpus, "documents": corpus_len, "results": results });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n").expect("write json");
        println!("wrote {}", path.display());
    }
}
