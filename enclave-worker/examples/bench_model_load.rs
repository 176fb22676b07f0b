//! Model cold-start benchmark: what a worker does between receiving a signed manifest and
//! serving jobs, minus the KMS round trip — verify the manifest signature, stream-decrypt every
//! file with the released DEK, check sizes and SHA-256 against the manifest, load the model —
//! plus, separately, one one-shot RSA-2048 key generation (overlapped with boot in the worker)
//! and one CMS unwrap. Prints the median and maximum of N runs.
//!
//! ```text
//! cargo run --release -p enclave-worker --example bench_model_load -- [--runs 10]
//! ```

use std::time::{Duration, Instant};

use enclave_worker::dev_model;
use enclave_worker::inference::{Embedder, EmbedderSettings, ModelFiles};
use enclave_worker::key_release::OneShotKey;
use protocol::manifest::{development_publisher, SignedManifest};
use protocol::stream::StreamOpener;
use sha2::{Digest, Sha256};


fn median(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], *samples.last().unwrap())
}

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let files = dev_model::read_files(&dev_model::model_dir());
    let dek = [0x5a; 32];
    let manifest = dev_model::manifest(1, &files, "bench", vec![1], 0);
    let signed = manifest.sign(&development_publisher());
    let sealed: Vec<Vec<u8>> = dev_model::seal(&manifest, &dek, &files).into_iter().map(|(_, ciphertext)| ciphertext).collect();
    drop(files);
    let publisher = development_publisher().verifying_key();

    let mut totals = Vec::new();
    let mut decrypts = Vec::new();
    let mut loads = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let verified = SignedManifest::decode(&signed).unwrap();
        let manifest = verified.verify(&publisher).unwrap();
        let mut plain = Vec::new();
        for (name, ciphertext) in dev_model::FILES.iter().zip(&sealed) {
            let entry = manifest.file(name).unwrap();
            let mut opener = StreamOpener::new(&manifest.file_key(&dek, name), manifest.file_stream_id(name));
            let mut out = Vec::with_capacity(entry.size as usize);
            // Arrives in 256 KiB frames in the worker.
            for part in ciphertext.chunks(256 * 1024) {
                opener.push(part, &mut out).unwrap();
            }
            opener.finish(&mut out).unwrap();
            assert_eq!(<[u8; 32]>::from(Sha256::digest(&out)), entry.sha256);
            plain.push(out);
        }
        let decrypted = started.elapsed();
        let embedder = Embedder::load(
            ModelFiles { config: &plain[0], tokenizer: &plain[2], weights: &plain[1], dense: &[] },
            EmbedderSettings::from_manifest(manifest),
        )
        .unwrap();
        drop(embedder);
        let total = started.elapsed();
        decrypts.push(decrypted);
        loads.push(total - decrypted);
        totals.push(total);
    }
    let mut keygens = Vec::new();
    let mut unwraps = Vec::new();
    for _ in 0..runs.min(10) {
        let started = Instant::now();
        let key = OneShotKey::generate().unwrap();
        keygens.push(started.elapsed());
        let envelope =
            protocol::cms::seal(key.public_key_der(), &dek, &mut rsa::rand_core::UnwrapErr(getrandom::SysRng)).unwrap();
        let started = Instant::now();
        key.open(&envelope).unwrap();
        unwraps.push(started.elapsed());
    }
    let report = |name: &str, samples: Vec<Duration>| {
        let (median, max) = median(samples);
        println!("{name:<46} median {:>8.1} ms   max {:>8.1} ms", median.as_secs_f64() * 1e3, max.as_secs_f64() * 1e3);
    };
    println!("all-MiniLM-L6-v2, {runs} runs ({} MB of sealed weights)", sealed[1].len() / 1_000_000);
    report("manifest check + stream-decrypt + SHA-256", decrypts);
    report("model load (from decrypted bytes)", loads);
    report("cold start without KMS round trip", totals);
    report("RSA-2048 one-shot key generation", keygens);
    report("CMS unwrap (RSA-OAEP + AES-256-CBC)", unwraps);
}
