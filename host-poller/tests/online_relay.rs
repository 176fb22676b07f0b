//! The Oblivious HTTP relay against a fake worker on a Unix socket, over real TCP: what each
//! answer of the enclave (or its silence) becomes in HTTP, that the limits hold against a
//! client that pushes them, and that no byte of a body reaches the relay's logs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use host_poller::online_relay::MAX_ENCAPSULATED_LEN;
use host_poller::{OnlineRelay, OnlineSettings, WorkerEndpoint};
use protocol::frame::{self, Channel, Message, Role};
use protocol::FailedCheck;

const CANARY: &str = "CANARY-7f3a9c-the-host-must-never-log-this";

// --- captured logs ----------------------------------------------------------------------------

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every event of every level, from every test of this binary, into [`LOGS`].
fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        tracing_subscriber::fmt().with_max_level(tracing::Level::TRACE).with_ansi(false).with_writer(|| Capture).init();
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

// --- a fake worker's online channel -----------------------------------------------------------

#[derive(Debug, Clone)]
enum Mode {
    /// Answers with the request's bytes, in several frames.
    Echo,
    /// Echo after a delay.
    Delay(Duration),
    Refuse(FailedCheck),
    /// Reads the request and never answers.
    Stall,
    /// Sends part of a response, then closes.
    CloseMidResponse,
    /// Sends more than the relay's response cap.
    Flood,
}

#[derive(Default)]
struct Counters {
    connections_open: AtomicUsize,
    max_connections_open: AtomicUsize,
    active: AtomicUsize,
    max_active: AtomicUsize,
    requests: AtomicUsize,
}

fn raise(max: &AtomicUsize, value: usize) {
    max.fetch_max(value, Ordering::SeqCst);
}

struct FakeOnline {
    _dir: tempfile::TempDir,
    path: PathBuf,
    counters: Arc<Counters>,
}

impl FakeOnline {
    fn start(mode: Mode) -> FakeOnline {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let counters = Arc::new(Counters::default());
        let shared = Arc::clone(&counters);
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                let Ok(connection) = connection else { return };
                let (counters, mode) = (Arc::clone(&shared), mode.clone());
                std::thread::spawn(move || {
                    let open = counters.connections_open.fetch_add(1, Ordering::SeqCst) + 1;
                    raise(&counters.max_connections_open, open);
                    serve(connection, &mode, &counters);
                    counters.connections_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        FakeOnline { _dir: dir, path, counters }
    }

    fn endpoint(&self) -> WorkerEndpoint {
        WorkerEndpoint::Unix(self.path.clone())
    }
}

fn serve(mut connection: UnixStream, mode: &Mode, counters: &Counters) {
    match frame::read_frame(&mut connection) {
        Ok(Some(Message::Hello { role: Role::Host, channel: Channel::Online })) => {}
        other => panic!("expected the host's Hello on the online channel, got {other:?}"),
    }
    frame::write_frame(&mut connection, &Message::Hello { role: Role::Enclave, channel: Channel::Online }).unwrap();
    while let Ok(Some(message)) = frame::read_frame(&mut connection) {
        let Message::OnlineRequest { request, encapsulated } = message else { panic!("not an OnlineRequest: {message:?}") };
        counters.requests.fetch_add(1, Ordering::SeqCst);
        let active = counters.active.fetch_add(1, Ordering::SeqCst) + 1;
        raise(&counters.max_active, active);
        let keep_open = answer(&mut connection, mode, request, encapsulated);
        counters.active.fetch_sub(1, Ordering::SeqCst);
        if !keep_open {
            return;
        }
    }
}

/// Answers one request; `false` when the connection is to end.
fn answer(connection: &mut UnixStream, mode: &Mode, request: u64, encapsulated: Vec<u8>) -> bool {
    let mut send = |message: Message| frame::write_frame(connection, &message).is_ok();
    match mode {
        Mode::Echo | Mode::Delay(_) => {
            if let Mode::Delay(delay) = mode {
                std::thread::sleep(*delay);
            }
            let chunks: Vec<&[u8]> = encapsulated.chunks(100_000).collect();
            if chunks.is_empty() {
                return send(Message::OnlineResponse { request, data: Vec::new(), last: true });
            }
            chunks.iter().enumerate().all(|(n, chunk)| send(Message::OnlineResponse { request, data: chunk.to_vec(), last: n + 1 == chunks.len() }))
        }
        Mode::Refuse(check) => send(Message::OnlineRefused { request, check: *check, message: "refused by the fake".into() }),
        // The relay ends the connection at its deadline; the read then returns.
        Mode::Stall => {
            let _ = frame::read_frame(connection);
            false
        }
        Mode::CloseMidResponse => {
            send(Message::OnlineResponse { request, data: encapsulated[..encapsulated.len() / 2].to_vec(), last: false });
            false
        }
        Mode::Flood => {
            let chunk = vec![0x5a; frame::MAX_DATA_LEN];
            (0..100).all(|_| send(Message::OnlineResponse { request, data: chunk.clone(), last: false }))
        }
    }
}

// --- a small HTTP/1.1 client ------------------------------------------------------------------

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

fn request(address: SocketAddr, method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if let Some(content_type) = content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_reply(&mut stream)
}

/// A request whose `Content-Length` is `declared`, of which only `part` is sent before the
/// reply is read. (A server that answers before reading a body closes a connection with
/// unread bytes, which resets it: a client still writing may never see the answer.)
fn announce(address: SocketAddr, declared: usize, part: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!("POST /v1/ohttp HTTP/1.1\r\nHost: relay\r\nContent-Type: message/ohttp-req\r\nContent-Length: {declared}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(part).unwrap();
    read_reply(&mut stream)
}

fn post(address: SocketAddr, body: &[u8]) -> Reply {
    request(address, "POST", "/v1/ohttp", Some("message/ohttp-req"), body)
}

fn read_reply(stream: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned())).collect();
    Reply { status, headers, body: raw[split + 4..].to_vec() }
}

// --- the relay ----------------------------------------------------------------------------------

fn settings() -> OnlineSettings {
    OnlineSettings::new("127.0.0.1:0".parse().unwrap())
}

fn relay(worker: &FakeOnline, settings: OnlineSettings) -> OnlineRelay {
    capture_logs();
    OnlineRelay::start(settings, worker.endpoint()).unwrap()
}

/// Every byte value, then the canary.
fn arbitrary_bytes(len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len).map(|n| (n * 7 + n / 256) as u8).collect();
    bytes.extend_from_slice(CANARY.as_bytes());
    bytes
}

#[test]
fn relays_arbitrary_bytes_both_ways_and_reuses_connections() {
    let worker = FakeOnline::start(Mode::Echo);
    let relay = relay(&worker, settings());
    for len in [0, 1, 300_000, MAX_ENCAPSULATED_LEN - CANARY.len()] {
        let body = arbitrary_bytes(len);
        let reply = post(relay.local_addr(), &body);
        assert_eq!(reply.status, 200, "{len} bytes");
        assert_eq!(reply.header("content-type"), Some("message/ohttp-res"));
        assert!(reply.body == body, "{len} bytes came back changed");
    }
    assert_eq!(worker.counters.requests.load(Ordering::SeqCst), 4);
    // One request at a time: one connection, kept idle between them.
    assert_eq!(worker.counters.max_connections_open.load(Ordering::SeqCst), 1);
    assert_eq!(relay.load().relayed, 4);
}

#[test]
fn health_reports_the_worker_and_the_load() {
    let worker = FakeOnline::start(Mode::Echo);
    let relay = relay(&worker, settings());
    let reply = request(relay.local_addr(), "GET", "/healthz", None, b"");
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!((body["worker"].as_str(), body["in_flight"].as_u64(), body["queued"].as_u64()), (Some("up"), Some(0), Some(0)));
    // Health checks are not relayed requests.
    assert_eq!(relay.load().relayed, 0);

    let unreachable = OnlineRelay::start(settings(), WorkerEndpoint::Unix("/nonexistent/worker.sock".into())).unwrap();
    let reply = request(unreachable.local_addr(), "GET", "/healthz", None, b"");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["worker"], "unreachable");
}

#[test]
fn wrong_media_type_is_415_and_never_reaches_the_worker() {
    let worker = FakeOnline::start(Mode::Echo);
    let relay = relay(&worker, settings());
    for content_type in [None, Some("application/json"), Some("message/ohttp-res"), Some("message/ohttp-reqx")] {
        let reply = request(relay.local_addr(), "POST", "/v1/ohttp", content_type, CANARY.as_bytes());
        assert_eq!(reply.status, 415, "{content_type:?}");
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    }
    // Parameters and case do not matter to the media type.
    assert_eq!(request(relay.local_addr(), "POST", "/v1/ohttp", Some("Message/OHTTP-Req; x=1"), b"x").status, 200);
    assert_eq!(worker.counters.requests.load(Ordering::SeqCst), 1);
    assert_eq!(request(relay.local_addr(), "GET", "/v1/ohttp", None, b"").status, 405);
    assert_eq!(request(relay.local_addr(), "POST", "/v1/other", Some("message/ohttp-req"), b"x").status, 404);
}

#[test]
fn a_body_over_one_frame_is_413_without_being_read() {
    let worker = FakeOnline::start(Mode::Echo);
    let relay = relay(&worker, settings());
    // Announce 5 MB, send 1 KiB of it: the answer comes without the rest.
    let started = Instant::now();
    assert_eq!(announce(relay.local_addr(), 5_000_000, &[0x41; 1024]).status, 413);
    assert!(started.elapsed() < Duration::from_secs(5));
    // One byte over the limit is refused the same way (the limit itself is relayed: the
    // round-trip test sends it).
    assert_eq!(announce(relay.local_addr(), MAX_ENCAPSULATED_LEN + 1, &[0x41; 1024]).status, 413);
    assert_eq!(worker.counters.requests.load(Ordering::SeqCst), 0);
}

#[test]
fn an_enclave_refusal_is_a_problem_naming_the_check() {
    for check in [FailedCheck::Replay, FailedCheck::Encapsulation] {
        let worker = FakeOnline::start(Mode::Refuse(check));
        let relay = relay(&worker, settings());
        let reply = post(relay.local_addr(), &arbitrary_bytes(64));
        assert_eq!(reply.status, 400);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        let problem = reply.json();
        assert_eq!(problem["check"], check.as_str());
        assert!(problem["type"].as_str().is_some_and(|t| !t.is_empty()) && problem["title"].as_str().is_some());
        // The connection stays usable after a refusal.
        assert_eq!(post(relay.local_addr(), b"again").status, 400);
        assert_eq!(worker.counters.max_connections_open.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_stalled_worker_is_504_at_the_deadline() {
    let worker = FakeOnline::start(Mode::Stall);
    let relay = relay(&worker, OnlineSettings { request_timeout: Duration::from_millis(600), ..settings() });
    let started = Instant::now();
    let reply = post(relay.local_addr(), &arbitrary_bytes(10));
    let took = started.elapsed();
    assert_eq!(reply.status, 504);
    assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(3), "{took:?}");
    // The stalled connection is not kept: the worker sees it close, and the slot frees.
    let counters = Arc::clone(&worker.counters);
    wait_for("the stalled connection to close", || counters.connections_open.load(Ordering::SeqCst) == 0);
    wait_for("the slot to free", || relay.load().in_flight == 0);
}

#[test]
fn a_broken_worker_is_502() {
    for mode in [Mode::CloseMidResponse, Mode::Flood] {
        let worker = FakeOnline::start(mode.clone());
        let relay = relay(&worker, OnlineSettings { max_response: 4 * 1024 * 1024, ..settings() });
        assert_eq!(post(relay.local_addr(), &arbitrary_bytes(1000)).status, 502, "{mode:?}");
    }
    let unreachable = OnlineRelay::start(settings(), WorkerEndpoint::Unix("/nonexistent/worker.sock".into())).unwrap();
    assert_eq!(post(unreachable.local_addr(), b"x").status, 502);
}

#[test]
fn beyond_concurrency_and_queue_is_503_and_the_worker_never_sees_more() {
    let worker = FakeOnline::start(Mode::Delay(Duration::from_millis(1500)));
    let settings = OnlineSettings { concurrency: 2, queue: 1, queue_timeout: Duration::from_millis(300), ..settings() };
    let relay = Arc::new(relay(&worker, settings));
    let address = relay.local_addr();
    let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(move || post(address, b"load"))).collect();
    wait_for("two requests at the enclave", || relay.load().in_flight == 2);
    let replies: Vec<Reply> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert_eq!((ok, busy.len()), (2, 6), "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    assert!(busy.iter().all(|r| r.header("retry-after") == Some("1")));
    assert_eq!(worker.counters.max_active.load(Ordering::SeqCst), 2);
    assert_eq!(worker.counters.max_connections_open.load(Ordering::SeqCst), 2);
    assert_eq!(relay.load().busy, 6);
}

#[test]
fn a_queued_request_is_served_when_a_slot_frees() {
    let worker = FakeOnline::start(Mode::Delay(Duration::from_millis(400)));
    let settings = OnlineSettings { concurrency: 1, queue: 4, queue_timeout: Duration::from_secs(10), ..settings() };
    let relay = relay(&worker, settings);
    let address = relay.local_addr();
    let clients: Vec<_> = (0..3).map(|_| std::thread::spawn(move || post(address, b"queued").status)).collect();
    let statuses: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(worker.counters.max_active.load(Ordering::SeqCst), 1);
}

#[test]
fn no_body_byte_reaches_the_logs() {
    let echo = FakeOnline::start(Mode::Echo);
    let refuse = FakeOnline::start(Mode::Refuse(FailedCheck::Replay));
    let broken = FakeOnline::start(Mode::CloseMidResponse);
    let body = arbitrary_bytes(2000);
    for worker in [&echo, &refuse, &broken] {
        let relay = relay(worker, settings());
        post(relay.local_addr(), &body);
        request(relay.local_addr(), "POST", "/v1/ohttp", Some("text/plain"), &body);
        request(relay.local_addr(), "POST", &format!("/{CANARY}"), Some("message/ohttp-req"), &body);
        announce(relay.local_addr(), MAX_ENCAPSULATED_LEN + body.len(), &body);
    }
    let logs = logs();
    // The capture works: the relay's request lines are there, with sizes.
    assert!(logs.contains("online relay") && logs.contains("request_bytes=2"), "{logs}");
    for needle in [CANARY.to_owned(), hex::encode(CANARY), CANARY.to_lowercase()] {
        assert!(!logs.contains(&needle), "the logs hold a body's bytes");
    }
}

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
