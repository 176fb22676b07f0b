//! Bounded concurrency with backpressure: at most `concurrency` requests at the enclave, at most
//! `queue` more waiting for a slot, none waiting longer than `queue_timeout`. A request beyond
//! that is turned away at once (503), so a burst costs the host memory for the queue only and
//! the enclave sees a steady load; the balancer retries elsewhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    concurrency: usize,
    waiting: AtomicUsize,
    queue: usize,
    queue_timeout: Duration,
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// `queue` requests wait already.
    QueueFull,
    /// It waited `queue_timeout` without a slot coming free.
    Waited,
}

/// Leaves the queue however the wait ends (a slot, a timeout, or the client going away).
struct InQueue<'a>(&'a AtomicUsize);

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(concurrency: usize, queue: usize, queue_timeout: Duration) -> Self {
        Self { permits: Arc::new(Semaphore::new(concurrency)), concurrency, waiting: AtomicUsize::new(0), queue, queue_timeout }
    }

    /// A slot at the enclave, held until the permit is dropped (by whoever does the worker I/O,
    /// so the limit counts connections really in use, not HTTP requests still answered).
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, Busy> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Ok(permit);
        }
        let joined = self.waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.queue).then_some(n + 1));
        if joined.is_err() {
            return Err(Busy::QueueFull);
        }
        let _in_queue = InQueue(&self.waiting);
        match tokio::time::timeout(self.queue_timeout, Arc::clone(&self.permits).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a closed one would be a relay shutting down.
            Ok(Err(_)) | Err(_) => Err(Busy::Waited),
        }
    }

    /// Requests at the enclave now.
    pub fn in_flight(&self) -> usize {
        self.concurrency.saturating_sub(self.permits.available_permits())
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}
