//! The Oblivious HTTP relay (RFC 9458 §7's relay resource, issue 20): `POST /v1/ohttp` carries a
//! `message/ohttp-req` to the enclave over an online connection and its `message/ohttp-res`
//! back. The host cannot read either (they are sealed to the fleet key and to the client's
//! ephemeral key), so it sees sizes and timing only, and logs no more than that.
//!
//! HTTP/1.1 (hyper) on a runtime and thread of its own, so a flood of clients cannot slow the
//! job threads; the enclave's frames are blocking I/O on the runtime's blocking pool, bounded by
//! [`admission`]. `GET /healthz` answers 200 while the worker takes connections, with the load
//! (requests in flight, queued), which a balancer's health check and an operator both read.

mod admission;
mod exchange;
mod http;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{oneshot, Semaphore};

use crate::worker_link::WorkerEndpoint;

pub use http::{REQUEST_MEDIA_TYPE, RESPONSE_MEDIA_TYPE};

/// Largest encapsulated request relayed: it must fit one `OnlineRequest` frame, whose CBOR
/// framing around the bytes takes well under the 1 MiB frame's other half.
pub const MAX_ENCAPSULATED_LEN: usize = 512 * 1024;
const _: () = assert!(MAX_ENCAPSULATED_LEN < protocol::frame::MAX_FRAME_LEN - 1024);

/// Largest encapsulated response relayed (the enclave's answer to at most 256 inputs).
pub const MAX_RESPONSE_LEN: usize = 16 * 1024 * 1024;
/// Client connections open at once; more are closed on accept.
const MAX_CONNECTIONS: usize = 1024;
/// A client has this long to send its request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the load is logged while there is any.
const LOAD_LOG_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnlineSettings {
    pub listen: SocketAddr,
    /// Requests at the enclave at once.
    pub concurrency: usize,
    /// Requests waiting for a slot at most; beyond, 503.
    pub queue: usize,
    /// Longest wait for a slot; then 503.
    pub queue_timeout: Duration,
    /// From the request's arrival to the enclave's last byte; then 504.
    pub request_timeout: Duration,
    pub max_request: usize,
    pub max_response: usize,
}

impl OnlineSettings {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            concurrency: 4,
            queue: 64,
            queue_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(30),
            max_request: MAX_ENCAPSULATED_LEN,
            max_response: MAX_RESPONSE_LEN,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OnlineRelayError {
    #[error("online relay: cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("online relay: concurrency must be at least 1 and requests at most {MAX_ENCAPSULATED_LEN} bytes")]
    Settings,
    #[error("online relay: cannot start its runtime: {0}")]
    Runtime(std::io::Error),
}

/// The relay's load now and its counts since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    pub in_flight: usize,
    pub queued: usize,
    /// Answered 200.
    pub relayed: u64,
    /// Answered 503 (no slot).
    pub busy: u64,
    /// Answered 504.
    pub timed_out: u64,
    /// Answered anything else.
    pub failed: u64,
}

#[derive(Default)]
struct Stats {
    relayed: AtomicU64,
    busy: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
}

impl Stats {
    fn count(&self, status: u16) {
        let counter = match status {
            200 => &self.relayed,
            503 => &self.busy,
            504 => &self.timed_out,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct State {
    settings: OnlineSettings,
    admission: admission::Admission,
    worker: Arc<exchange::Worker>,
    stats: Stats,
    last_probe: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

impl State {
    fn load(&self) -> Load {
        Load {
            in_flight: self.admission.in_flight(),
            queued: self.admission.queued(),
            relayed: self.stats.relayed.load(Ordering::Relaxed),
            busy: self.stats.busy.load(Ordering::Relaxed),
            timed_out: self.stats.timed_out.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
        }
    }
}

/// A running relay; [`stop`](Self::stop) (or drop) ends it.
pub struct OnlineRelay {
    address: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl OnlineRelay {
    /// Listens on `settings.listen` (port 0: any) and relays to `endpoint`'s online channel.
    pub fn start(settings: OnlineSettings, endpoint: WorkerEndpoint) -> Result<Self, OnlineRelayError> {
        if settings.concurrency == 0 || settings.max_request > MAX_ENCAPSULATED_LEN {
            return Err(OnlineRelayError::Settings);
        }
        let listen_error = |source| OnlineRelayError::Listen { address: settings.listen, source };
        let listener = TcpListener::bind(settings.listen).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let address = listener.local_addr().map_err(listen_error)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(settings.concurrency + 4)
            .thread_name("online-relay")
            .enable_io()
            .enable_time()
            .build()
            .map_err(OnlineRelayError::Runtime)?;
        let state = Arc::new(State {
            admission: admission::Admission::new(settings.concurrency, settings.queue, settings.queue_timeout),
            worker: Arc::new(exchange::Worker::new(endpoint.clone(), settings.concurrency, settings.max_response)),
            stats: Stats::default(),
            last_probe: tokio::sync::Mutex::new(None),
            settings,
        });
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("online-relay".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => {
                            tokio::spawn(accept_loop(listener, Arc::clone(&serving)));
                            tokio::spawn(log_load(serving));
                            let _ = stopped.await;
                        }
                        Err(error) => tracing::error!(%error, "online relay: listener not usable"),
                    }
                });
                // Requests still at the worker end with their connections' timeouts.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(OnlineRelayError::Runtime)?;
        tracing::info!(address = %address, worker = %endpoint, concurrency = state.settings.concurrency, queue = state.settings.queue, "online relay listening");
        Ok(Self { address, state, stop: Some(stop), thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn load(&self) -> Load {
        self.state.load()
    }

    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for OnlineRelay {
    fn drop(&mut self) {
        self.shut();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, state: Arc<State>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "online relay: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&connections).try_acquire_owned() else {
            tracing::warn!("online relay: {MAX_CONNECTIONS} connections open; closing a new one");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| http::serve(Arc::clone(&state), request));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(error) = connection.await {
                tracing::debug!(%error, "online relay: client connection ended");
            }
        });
    }
}

/// The load, in the log, every [`LOAD_LOG_INTERVAL`] while there is any: the scaling signal a
/// host without metrics agents still gives (the balancer's flow count is the other).
async fn log_load(state: Arc<State>) {
    let mut last = Load::default();
    loop {
        tokio::time::sleep(LOAD_LOG_INTERVAL).await;
        let load = state.load();
        if load != last || load.in_flight > 0 || load.queued > 0 {
            tracing::info!(
                in_flight = load.in_flight, queued = load.queued, relayed = load.relayed, busy = load.busy,
                timed_out = load.timed_out, failed = load.failed, "online relay load"
            );
        }
        last = load;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::frame::{encode, Message};

    #[test]
    fn the_largest_request_fits_one_frame() {
        let request = Message::OnlineRequest { request: u64::MAX, encapsulated: vec![0xff; MAX_ENCAPSULATED_LEN] };
        assert!(encode(&request).is_ok());
    }
}
