//! `jobs/<id>/status.json`: where a job stands, for humans and `ephem-batch status`. Informative
//! only — the receipt is the truth — so a failed write is logged, never fatal, and progress is
//! written at most every [`PROGRESS_INTERVAL`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud::messages::{Failure, JobState, JobStatus};
use cloud::{layout, ObjectStore, PutCondition};
use protocol::envelope::JobId;

use cloud::MAX_SMALL_OBJECT;
use crate::retry;

pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

pub(crate) struct StatusBoard {
    store: Arc<dyn ObjectStore>,
    key: String,
    status: JobStatus,
    last_write: Option<Instant>,
}

impl StatusBoard {
    pub fn new(store: Arc<dyn ObjectStore>, job: &JobId, records_total: u64, host: &str) -> Self {
        let mut status = JobStatus::new(*job, JobState::Queued, records_total);
        status.host = Some(host.to_owned());
        Self { store, key: layout::job_status(job), status, last_write: None }
    }

    pub fn in_progress(&mut self, attempt: u64) {
        self.update(|s| {
            s.state = JobState::InProgress;
            s.attempt = Some(attempt);
            s.records_done = 0;
            s.tokens = 0;
            s.failure = None;
            s.output_key = None;
        });
    }

    /// Progress from the worker; written if the last write is old enough.
    pub fn progress(&mut self, records: u64, tokens: u64) {
        self.status.records_done = records;
        self.status.tokens = tokens;
        if self.last_write.is_none_or(|at| at.elapsed() >= PROGRESS_INTERVAL) {
            self.write();
        }
    }

    /// Back in the queue for another attempt, showing why this one failed.
    pub fn retrying(&mut self, failure: Option<Failure>) {
        self.update(|s| {
            s.state = JobState::Queued;
            s.failure = failure;
        });
    }

    pub fn failed(&mut self, failure: Failure) {
        self.update(|s| {
            s.state = JobState::Failed;
            s.failure = Some(failure);
        });
    }

    pub fn cancelled(&mut self) {
        self.update(|s| s.state = JobState::Cancelled);
    }

    /// From the committed receipt (its counts are the enclave's; informative here).
    pub fn completed(&mut self, receipt: &protocol::receipt::Receipt, output_key: String) {
        self.update(|s| {
            s.state = JobState::Completed;
            s.attempt = Some(receipt.attempt);
            s.records_done = receipt.records_ok + receipt.records_failed;
            s.records_ok = Some(receipt.records_ok);
            s.records_failed = Some(receipt.records_failed);
            s.tokens = receipt.tokens;
            s.failure = None;
            s.output_key = Some(output_key);
        });
    }

    fn update(&mut self, change: impl FnOnce(&mut JobStatus)) {
        change(&mut self.status);
        self.write();
    }

    fn write(&mut self) {
        self.status.updated_ms = cloud::now_ms();
        self.last_write = Some(Instant::now());
        let bytes = match serde_json::to_vec_pretty(&self.status) {
            Ok(bytes) => bytes,
            Err(error) => return tracing::warn!(%error, "status does not serialise"),
        };
        if let Err(error) = retry::transient("write status", || self.store.put(&self.key, &bytes, PutCondition::Overwrite)) {
            tracing::warn!(key = self.key, %error, "status not written");
        }
    }
}

/// The status currently stored, if it is readable.
pub(crate) fn read(store: &dyn ObjectStore, job: &JobId) -> Option<JobStatus> {
    let bytes = retry::transient("read status", || store.get_at_most(&layout::job_status(job), MAX_SMALL_OBJECT)).ok()?;
    serde_json::from_slice(&bytes).ok()
}
