//! Embeds a JSONL corpus (`{"id","text"}` per line) with the worker's engine and writes the
//! vectors in corpus order as raw little-endian f32 (documents × dimensions), so that the
//! benchmark suite (`bench/run.sh`) can compare them with the sentence-transformers reference.
//! A document the engine refuses is written as a row of NaN and counted on stderr.
//!
//! ```text
//! cargo run --release -p enclave-worker --example embed_corpus -- --corpus C.jsonl --out V.f32 [--threads 2]
//! ```
//!
//! The model comes from `EPHEM_MODEL_DIR` or `.ephem/models/all-MiniLM-L6-v2`
//! (`bash scripts/setup-model.sh`); default engine settings, as the worker uses them.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, ModelFiles};
use protocol::envelope::OutputDtype;
use protocol::records::{InputRecord, OutputRecord, Vector};

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\nusage: embed_corpus --corpus FILE.jsonl --out VECTORS.f32 [--threads N]");
    std::process::exit(2)
}

fn main() {
    let (mut corpus, mut out, mut threads) = (None, None, 0usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--corpus" => corpus = Some(PathBuf::from(value())),
            "--out" => out = Some(PathBuf::from(value())),
            "--threads" => threads = value().parse().unwrap_or_else(|_| usage("--threads N")),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let corpus = corpus.unwrap_or_else(|| usage("--corpus is required"));
    let out = out.unwrap_or_else(|| usage("--out is required"));

    let dir = std::env::var_os("EPHEM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ephem/models/all-MiniLM-L6-v2")));
    let read = |name: &str| {
        std::fs::read(dir.join(name)).unwrap_or_else(|e| usage(&format!("{}/{name}: {e} (run scripts/setup-model.sh)", dir.display())))
    };
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let embedder = Embedder::load(
        ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] },
        EmbedderSettings::default(),
    )
    .expect("load model");
    drop((config, tokenizer, weights));
    let engine = Engine::new(Arc::new(embedder), EngineSettings { threads, ..EngineSettings::default() }).expect("engine");

    let text = std::fs::read_to_string(&corpus).unwrap_or_else(|e| usage(&format!("{}: {e}", corpus.display())));
    let records: Vec<InputRecord> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
            InputRecord {
                id: format!("{i}"),
                text: value["text"].as_str().unwrap_or_else(|| panic!("line {}: no text", i + 1)).as_bytes().to_vec(),
            }
        })
        .collect();

    let mut file = std::io::BufWriter::new(std::fs::File::create(&out).expect("create output"));
    let mut failed = 0usize;
    let mut dimensions = 0usize;
    engine
        .embed_stream(records, &EmbedOptions::default(), OutputDtype::F32, |record| {
            let row: Vec<f32> = match record {
                OutputRecord::Embedding { vector: Vector::F32(v), .. } => v,
                OutputRecord::Embedding { .. } => panic!("asked for f32 vectors"),
                OutputRecord::Error { .. } => {
                    failed += 1;
                    vec![f32::NAN; dimensions.max(384)]
                }
            };
            dimensions = row.len();
            for value in row {
                file.write_all(&value.to_le_bytes())?;
            }
            Ok::<(), std::io::Error>(())
        })
        .expect("write vectors");
    file.flush().expect("write vectors");
    if failed > 0 {
        eprintln!("{failed} documents refused (NaN rows)");
    }
    println!("{}: {dimensions} dimensions", out.display());
}
