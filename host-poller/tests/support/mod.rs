#![allow(dead_code)]

pub mod fake_worker;
pub mod memory;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cloud::messages::{JobMessage, JobStatus};
use cloud::{layout, ObjectStore, Queue, SendOptions, Services};
use host_poller::{Poller, PollerConfig, ShutdownHandle};
use protocol::envelope::JobId;

/// Poller logs in the test output (`RUST_LOG`, default warnings only).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// A poller on its own thread.
pub struct Running {
    pub handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), host_poller::PollerError>>>,
}

impl Running {
    pub fn start(services: Services, config: PollerConfig) -> Running {
        init_logs();
        let poller = Poller::new(services, config);
        let handle = poller.shutdown_handle();
        let thread = std::thread::spawn(move || poller.run());
        Running { handle, thread: Some(thread) }
    }

    /// Stops gracefully and waits; returns how long that took.
    pub fn stop(mut self) -> Duration {
        let started = Instant::now();
        self.handle.stop();
        self.thread.take().unwrap().join().unwrap().unwrap();
        started.elapsed()
    }

    pub fn join(mut self) {
        self.thread.take().unwrap().join().unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.handle.abort();
            let _ = thread.join();
        }
    }
}

/// Polls `condition` every 20 ms; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn status(jobs: &dyn ObjectStore, job: &JobId) -> Option<JobStatus> {
    serde_json::from_slice(&jobs.get(&layout::job_status(job)).ok()?).ok()
}

/// Sends the job message `on-upload` would send for an input already in the store.
pub fn enqueue(queue: &dyn Queue, job: &JobId, input_size: u64, record_count: u64, manifest_hash: [u8; 32]) {
    let message = JobMessage {
        job_id: *job,
        input_key: layout::job_input(job),
        input_size,
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: hex::encode(manifest_hash),
        epoch: 1,
        record_count,
        created_ms: cloud::now_ms(),
        earlier_receives: 0,
    };
    queue.send(&serde_json::to_string(&message).unwrap(), &SendOptions::default()).unwrap();
}
