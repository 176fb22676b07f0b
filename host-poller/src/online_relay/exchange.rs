//! The enclave side of the relay, blocking I/O on the worker's frames: one request per online
//! connection at a time (`OnlineRequest` → `OnlineResponse`* or `OnlineRefused`), connections
//! kept idle between requests for the next one. Everything here runs on the blocking pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use protocol::frame::{Channel, Message};
use protocol::FailedCheck;

use crate::worker_link::{describe, LinkError, WorkerEndpoint, WorkerLink};

/// What the enclave answered.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The encapsulated response (`message/ohttp-res`), complete.
    Response(Vec<u8>),
    /// Refused before anything could be encrypted to the client.
    Refused { check: FailedCheck },
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ExchangeError {
    #[error("worker unreachable: {0}")]
    Unreachable(LinkError),
    #[error("the per-request deadline passed")]
    Timeout,
    #[error("connection to the worker lost: {0}")]
    Link(LinkError),
    #[error("the worker sent {0} on the online channel")]
    Unexpected(&'static str),
    #[error("the worker answered request {got} to request {sent}")]
    WrongRequest { sent: u64, got: u64 },
    #[error("the response exceeds {0} bytes")]
    ResponseTooLarge(usize),
}

impl ExchangeError {
    fn from_link(error: LinkError) -> Self {
        if error.is_timeout() { ExchangeError::Timeout } else { ExchangeError::Link(error) }
    }
}

pub(crate) struct Worker {
    endpoint: WorkerEndpoint,
    idle: Mutex<Vec<WorkerLink>>,
    max_idle: usize,
    max_response: usize,
    next_request: AtomicU64,
}

impl Worker {
    pub fn new(endpoint: WorkerEndpoint, max_idle: usize, max_response: usize) -> Self {
        Self { endpoint, idle: Mutex::new(Vec::new()), max_idle, max_response, next_request: AtomicU64::new(1) }
    }

    /// Relays one encapsulated request; gives up at `deadline`.
    pub fn exchange(&self, encapsulated: Vec<u8>, deadline: Instant) -> Result<Outcome, ExchangeError> {
        let mut link = self.link(deadline)?;
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        set_timeouts(&link, deadline)?;
        link.send(&Message::OnlineRequest { request, encapsulated }).map_err(ExchangeError::from_link)?;
        let mut response = Vec::new();
        loop {
            set_timeouts(&link, deadline)?;
            match link.recv().map_err(ExchangeError::from_link)? {
                Message::OnlineResponse { request: got, data, last } => {
                    if got != request {
                        return Err(ExchangeError::WrongRequest { sent: request, got });
                    }
                    if response.len() + data.len() > self.max_response {
                        return Err(ExchangeError::ResponseTooLarge(self.max_response));
                    }
                    response.extend_from_slice(&data);
                    if last {
                        self.give_back(link);
                        return Ok(Outcome::Response(response));
                    }
                }
                Message::OnlineRefused { request: got, check, .. } if got == request && response.is_empty() => {
                    self.give_back(link);
                    return Ok(Outcome::Refused { check });
                }
                other => return Err(ExchangeError::Unexpected(describe(&other))),
            }
        }
    }

    /// Whether the worker takes an online connection (an idle one that is still open will do).
    pub fn probe(&self, timeout: Duration) -> Result<(), ExchangeError> {
        let link = self.link(Instant::now() + timeout)?;
        self.give_back(link);
        Ok(())
    }

    /// An idle connection that is still open, or a new one.
    fn link(&self, deadline: Instant) -> Result<WorkerLink, ExchangeError> {
        while let Some(mut link) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            if !link.is_broken() {
                return Ok(link);
            }
        }
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(ExchangeError::Timeout)?;
        self.endpoint.connect_within(Channel::Online, Some(left)).map_err(|error| match error {
            error if error.is_timeout() => ExchangeError::Timeout,
            error => ExchangeError::Unreachable(error),
        })
    }

    fn give_back(&self, link: WorkerLink) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            idle.push(link);
        }
    }
}

/// Reads and writes on the link give up at the deadline.
fn set_timeouts(link: &WorkerLink, deadline: Instant) -> Result<(), ExchangeError> {
    let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(ExchangeError::Timeout)?;
    let io = |e: std::io::Error| ExchangeError::Link(LinkError::Frame(e.into()));
    link.set_read_timeout(Some(left)).map_err(io)?;
    link.set_write_timeout(Some(left)).map_err(io)
}
