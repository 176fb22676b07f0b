//! The latency `ephem-batch serve` adds: one short query at 1 and 16 concurrent clients, sent
//! (a) through serve (verification cached, encapsulation, loopback HTTP, the relay, the enclave)
//! and (b) encapsulated by this program straight to the relay (the relay and the enclave only).
//! p50/p99 of each, on a local stack of its own. Not a test: `cargo run --release -p tests
//! --example online_latency [REQUESTS]` (docs/benchmarks.md).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::envelope::FleetPublicKey;
use protocol::ohttp::{self, KeyConfig};
use protocol::online::{self, EMBEDDINGS_PATH};
use tests::{http_exchange, wait_until, Stack};

const BODY: &str = r#"{"input":"a tool to encrypt and sign my email","model":"sentence-transformers/all-MiniLM-L6-v2"}"#;

fn post(port: u16, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
    http_exchange(port, "POST", path, content_type, body)
}

/// Runs `requests` calls of `call` from `clients` threads; latencies in ms, sorted.
fn measure(clients: usize, requests: usize, call: Arc<dyn Fn() + Send + Sync>) -> Vec<f64> {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(requests)));
    let per_client = requests / clients;
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (call, latencies) = (Arc::clone(&call), Arc::clone(&latencies));
            std::thread::spawn(move || {
                for _ in 0..per_client {
                    let started = Instant::now();
                    call();
                    latencies.lock().unwrap().push(started.elapsed().as_secs_f64() * 1000.0);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut all = Arc::try_unwrap(latencies).unwrap().into_inner().unwrap();
    all.sort_by(f64::total_cmp);
    all
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let requests: usize = std::env::args().nth(1).map(|a| a.parse().unwrap()).unwrap_or(320);
    let stack = Stack::up();
    let fetched: serde_json::Value = serde_json::from_str(&stack.ok(&["attest", "fetch", "--json"])).unwrap();
    let binding = &fetched["binding"];
    let fleet = FleetPublicKey::from_bytes(&hex::decode(binding["fleet_public_key"].as_str().unwrap()).unwrap()).unwrap();
    let config = KeyConfig::for_epoch(binding["epoch"].as_u64().unwrap(), fleet);
    let status: serde_json::Value = serde_json::from_str(&stack.ok(&["dev", "status", "--json"])).unwrap();
    let relay_port: u16 = status["online_relay"].as_str().unwrap().trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().parse().unwrap();

    let serve_port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{serve_port}");
    let mut serve: Child = stack.command(&["serve", "--listen", &listen]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("serve", Duration::from_secs(60), || TcpStream::connect(("127.0.0.1", serve_port)).is_ok());

    let through_serve: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let (status, body) = post(serve_port, EMBEDDINGS_PATH, "application/json", BODY.as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    });
    let to_relay: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let request = online::encode_request("POST", EMBEDDINGS_PATH, BODY.as_bytes(), cloud::now_ms(), None);
        let (encapsulated, opener) = ohttp::encapsulate_request(&config, &request).unwrap();
        let (status, body) = post(relay_port, "/v1/ohttp", ohttp::REQUEST_MEDIA_TYPE, &encapsulated);
        assert_eq!(status, 200);
        let (status, _) = online::decode_response(&opener.open(&body).unwrap()).unwrap();
        assert_eq!(status, 200);
    });
    // The stack is up once its document is published; the model loads after that.
    wait_until("the model to load", Duration::from_secs(300), || post(serve_port, EMBEDDINGS_PATH, "application/json", BODY.as_bytes()).0 == 200);
    // Warm both paths (first model pass, serve's first verification).
    measure(1, 10, Arc::clone(&through_serve));
    measure(1, 10, Arc::clone(&to_relay));

    println!("| clients | path | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    for clients in [1, 16] {
        for (name, call) in [("relay direct", &to_relay), ("through serve", &through_serve)] {
            let latencies = measure(clients, requests, Arc::clone(call));
            println!("| {clients} | {name} | {:.2} | {:.2} |", quantile(&latencies, 0.5), quantile(&latencies, 0.99));
        }
    }
    let _ = serve.kill();
    let _ = serve.wait();
}
