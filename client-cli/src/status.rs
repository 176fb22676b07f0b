//! `ephem-batch status` and `ephem-batch cancel`.
//!
//! The status object is informative (hosts write it); the committed receipt and the ledger
//! marker are facts, so `status` reports them beside it.

use anyhow::{anyhow, bail};
use cloud::messages::{JobState, JobStatus, Ledgered};
use cloud::{layout, ObjectError, PutCondition, Services};
use protocol::cancel::{CancelError, CancelRequest};
use protocol::envelope::{JobId, ResultSecretKey};
use serde::Serialize;

pub fn parse_job(text: &str) -> anyhow::Result<JobId> {
    JobId::from_hex(text.trim()).ok_or_else(|| anyhow!("{text:?} is not a job id (32 hex digits)"))
}

fn get_json<T: serde::de::DeserializeOwned>(services: &Services, key: &str) -> anyhow::Result<Option<T>> {
    match services.jobs.get_at_most(key, cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(|e| anyhow!("{key}: {e}"))?)),
        Err(ObjectError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

pub fn read_status(services: &Services, job: &JobId) -> anyhow::Result<Option<JobStatus>> {
    get_json(services, &layout::job_status(job))
}

/// Everything the stores say about a job.
#[derive(Debug, Serialize)]
pub struct JobView {
    pub job_id: JobId,
    pub state: JobState,
    pub status: Option<JobStatus>,
    pub receipt_committed: bool,
    pub ledger: Option<Ledgered>,
}

pub fn view(services: &Services, job: &JobId) -> anyhow::Result<JobView> {
    let status = read_status(services, job)?;
    let receipt_committed = services.jobs.head(&layout::job_receipt(job))?.is_some();
    let ledger = get_json(services, &layout::job_ledgered(job))?;
    let state = match (&status, receipt_committed) {
        // The receipt is the truth, whatever a host last wrote.
        (_, true) => JobState::Completed,
        (Some(status), false) => status.state,
        (None, false) if services.jobs.head(&layout::job_input(job))?.is_some() => JobState::Queued,
        (None, false) => bail!("job {job} does not exist"),
    };
    Ok(JobView { job_id: *job, state, status, receipt_committed, ledger })
}

pub fn print(view: &JobView) {
    println!("job       {}", view.job_id);
    println!("state     {}", view.state.as_str());
    if let Some(status) = &view.status {
        println!("records   {} done of {} sealed, {} tokens", status.records_done, status.records_total, status.tokens);
        if let (Some(ok), Some(failed)) = (status.records_ok, status.records_failed) {
            println!("results   {ok} embedded, {failed} failed");
        }
        if let Some(attempt) = status.attempt {
            println!("attempt   {attempt}{}", status.host.as_deref().map(|h| format!(" on {h}")).unwrap_or_default());
        }
        if let Some(failure) = &status.failure {
            println!("failure   check `{}`: {}", failure.check, failure.message);
        }
    }
    println!("receipt   {}", if view.receipt_committed { "committed" } else { "not yet" });
    match &view.ledger {
        Some(ledgered) => println!("ledger    entry {}", ledgered.index),
        None => println!("ledger    not yet"),
    }
}

/// Why `cancel` did not cancel, by check.
#[derive(Debug, thiserror::Error)]
pub enum CancelFailure {
    #[error("job {job} is {state}: only a queued job can be cancelled")]
    NotQueued { job: JobId, state: &'static str },
    #[error("job {job} cannot be cancelled with this home's result key ({check}): only the key it was sealed to can")]
    NotOurs { job: JobId, check: CancelError },
    #[error(
        "{key} already holds a cancel that is not the submitter's ({check}): hosts ignore it, and the name is create-only, \
         so this cancel cannot replace it; the job will run"
    )]
    Occupied { key: String, check: CancelError },
    #[error("the job's sealed input: {0}")]
    Input(ObjectError),
}

/// Cancels a job no host has started. Hosts check `cancel.json` before they start a job and
/// honour it only if it is signed by the result key the job was sealed to, so this signs the
/// job id with `key`, checks the signature against the job's own header first (another key's
/// cancel would be ignored), and writes it create-only.
pub fn cancel(services: &Services, job: &JobId, key: &ResultSecretKey) -> anyhow::Result<()> {
    let view = view(services, job)?;
    if view.state != JobState::Queued {
        return Err(CancelFailure::NotQueued { job: *job, state: view.state.as_str() }.into());
    }
    let input = services.jobs.read_range(&layout::job_input(job), 0, protocol::cancel::INPUT_PREFIX_LEN).map_err(CancelFailure::Input)?;
    let body = CancelRequest::new(key, job, cloud::now_ms()).to_json();
    protocol::cancel::check(&input, job, body.as_bytes()).map_err(|check| CancelFailure::NotOurs { job: *job, check })?;
    let cancel_key = layout::job_cancel(job);
    match services.jobs.put(&cancel_key, body.as_bytes(), PutCondition::CreateOnly) {
        Ok(_) => Ok(()),
        Err(ObjectError::AlreadyExists { .. }) => {
            // Ours from an earlier try is fine; anyone else's holds the name.
            let existing = services.jobs.get_at_most(&cancel_key, protocol::cancel::MAX_CANCEL_LEN);
            let check = match existing {
                Ok(existing) => protocol::cancel::check(&input, job, &existing),
                Err(error) => Err(CancelError::Malformed(error.to_string())),
            };
            check.map_err(|check| CancelFailure::Occupied { key: cancel_key, check }.into())
        }
        Err(error) => Err(error.into()),
    }
}
