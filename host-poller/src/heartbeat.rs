//! Keeps a received message hidden while its job runs: extends the visibility timeout every
//! third of it, so a job longer than the timeout is not handed to a second host meanwhile
//! (which would be safe — the receipt is create-only — but wasted work).

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cloud::{Queue, QueueError};

use crate::retry;

pub(crate) struct Heartbeat {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    pub fn start(queue: Arc<dyn Queue>, receipt_handle: String, job: String, visibility: Duration) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let every = (visibility / 3).max(Duration::from_millis(100));
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || loop {
                match stopped.recv_timeout(every) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
                match retry::transient("extend visibility", || queue.change_visibility(&receipt_handle, visibility)) {
                    Ok(()) => tracing::trace!(job, "visibility extended"),
                    // The message came back to the queue (or was deleted): another delivery may
                    // be running. Carry on; the create-only receipt decides who wins.
                    Err(QueueError::InvalidReceiptHandle(_)) => {
                        tracing::warn!(job, "lost the message while working on it; finishing anyway");
                        return;
                    }
                    Err(error) => tracing::warn!(job, %error, "visibility not extended"),
                }
            })
            .ok();
        Self { stop: Some(stop), thread }
    }

    /// Stops extending; returns once no extension can happen any more (so that a visibility
    /// the caller sets next is not overwritten).
    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}
