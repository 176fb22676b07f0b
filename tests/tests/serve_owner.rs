//! `serve` is its owner's: a web page (DNS rebinding, a cross-origin `fetch`), another user of
//! the machine without the owner's token, and a relay that lies about a delivered request each
//! get nothing out of it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tests::{http_exchange, Serve, Stack};

const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// One HTTP/1.1 exchange with exactly these header lines (no Host added).
fn raw_exchange(port: u16, method: &str, path: &str, headers: &[&str], body: &[u8]) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP response");
    let status = std::str::from_utf8(&response[9..12]).unwrap().parse().unwrap();
    (status, serde_json::from_slice(&response[split + 4..]).unwrap_or(Value::Null))
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[test]
fn serve_answers_its_owner_only() {
    let stack = Stack::up();
    let proxy = Serve::start(&stack, &[]);
    let port = proxy.port;
    let own = format!("Host: 127.0.0.1:{port}");

    // The owner's application.
    let (status, body) = raw_exchange(port, "GET", "/v1/models", &[&own], b"");
    assert_eq!(status, 200, "{body}");
    let (status, body) = raw_exchange(port, "GET", "/v1/models", &[&format!("Host: localhost:{port}")], b"");
    assert_eq!(status, 200, "{body}");

    // A page whose name now resolves to 127.0.0.1 still sends its own name.
    let request = json!({"input": "what the page wants embedded", "model": MODEL}).to_string();
    for host in [format!("Host: rebound.evil.example:{port}"), "Host: 127.0.0.1".to_owned(), format!("Host: 127.0.0.1:{}", port ^ 1)] {
        let (status, body) = raw_exchange(port, "POST", "/v1/embeddings", &[&host], request.as_bytes());
        assert_eq!((status, code(&body)), (403, "host"), "{host}: {body}");
    }
    let (status, body) = raw_exchange(port, "POST", "/v1/embeddings", &[], request.as_bytes());
    assert_eq!((status, code(&body)), (403, "host"), "{body}");
    // Any Origin: a browser's request, even one that got the Host right.
    for origin in ["Origin: https://evil.example", "Origin: null", &format!("Origin: http://127.0.0.1:{port}")] {
        let (status, body) = raw_exchange(port, "POST", "/v1/embeddings", &[&own, origin], request.as_bytes());
        assert_eq!((status, code(&body)), (403, "origin"), "{origin}: {body}");
    }
    drop(proxy);

    // With a token: written 0600 into the client's home, required from then on.
    let guarded = Serve::start(&stack, &["--require-token"]);
    let token_path = stack.home().join("client").join("serve.token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&token_path).unwrap().permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&token_path).unwrap().trim().to_owned();
    let own = format!("Host: 127.0.0.1:{}", guarded.port);
    let (status, body) = raw_exchange(guarded.port, "GET", "/v1/models", &[&own], b"");
    assert_eq!((status, code(&body)), (401, "token"), "{body}");
    let (status, body) = raw_exchange(guarded.port, "GET", "/v1/models", &[&own, "Authorization: Bearer 00"], b"");
    assert_eq!((status, code(&body)), (401, "token"), "{body}");
    let (status, body) = raw_exchange(guarded.port, "GET", "/v1/models", &[&own, &format!("Authorization: Bearer {token}")], b"");
    assert_eq!(status, 200, "{body}");
    drop(guarded);
    // The file stays: a later serve of this home requires it without being asked.
    let later = Serve::start(&stack, &[]);
    let (status, _) = http_exchange(later.port, "GET", "/v1/models", "application/json", b"");
    assert_eq!(status, 401);
    drop(later);
}

#[test]
fn serve_never_resends_to_a_key_still_verified() {
    let stack = Stack::up();
    // A relay that delivers the request, then claims the enclave could not open it.
    let relay = stack.ok(&["dev", "status", "--json"]);
    let relay = serde_json::from_str::<Value>(&relay).unwrap()["online_relay"].as_str().expect("dev status names the relay").to_owned();
    let relay_port: u16 = relay.trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().parse().unwrap();
    let lying = LyingRelay::start(relay_port);
    let proxy = Serve::start(&stack, &["--relay", &format!("http://127.0.0.1:{}/v1/ohttp", lying.port)]);
    let (status, body) = proxy.embeddings(&json!({"input": ["counted once"], "model": MODEL}));
    assert_eq!((status, code(&body)), (502, "encapsulation"), "{body}");
    assert_eq!(lying.answered.load(Ordering::SeqCst), 1, "the enclave answered the request once");
    assert_eq!(lying.forwarded.load(Ordering::SeqCst), 1, "serve resent a request the enclave had answered, to the same key");
}

/// Forwards each encapsulated request to the real relay, then answers
/// `400 {"check":"encapsulation"}` whatever the enclave said.
struct LyingRelay {
    port: u16,
    forwarded: Arc<AtomicU64>,
    /// Forwarded requests the enclave answered (the real relay's 200).
    answered: Arc<AtomicU64>,
}

impl LyingRelay {
    fn start(relay_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (forwarded, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (f, a) = (Arc::clone(&forwarded), Arc::clone(&answered));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let Some(body) = read_request(&mut stream) else { continue };
                f.fetch_add(1, Ordering::SeqCst);
                let (status, _) = http_exchange(relay_port, "POST", "/v1/ohttp", "message/ohttp-req", &body);
                if status == 200 {
                    a.fetch_add(1, Ordering::SeqCst);
                }
                let problem = json!({"check": "encapsulation", "detail": "the enclave could not open the request"}).to_string();
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{problem}",
                        problem.len()
                    )
                    .as_bytes(),
                );
            }
        });
        Self { port, forwarded, answered }
    }
}

/// The body of one HTTP/1.1 request with a Content-Length.
fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok())?;
    while data.len() < head_end + length {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    }
    Some(data[head_end..head_end + length].to_vec())
}
