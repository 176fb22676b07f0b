//! `submit --wait`: follow a job until its receipt is committed (or it failed), then until the
//! ledger holds the receipt.

use std::time::{Duration, Instant};

use anyhow::bail;
use cloud::messages::JobState;
use cloud::Services;
use indicatif::{ProgressBar, ProgressStyle};
use protocol::envelope::JobId;

/// How long `--wait` waits for the ledger after the receipt is committed.
const LEDGER_WAIT: Duration = Duration::from_secs(60);

/// `--wait-timeout` unless given: a day, the bulk workflow's task timeout.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Why `--wait` stopped waiting.
#[derive(Debug, thiserror::Error)]
#[error(
    "job {job} is still {state} after {waited_s} s (--wait-timeout); it is not cancelled: \
     `ephem-batch status {job}` follows it, `ephem-batch results {job}` fetches it once completed"
)]
pub struct WaitTimedOut {
    pub job: JobId,
    pub state: &'static str,
    pub waited_s: u64,
}

/// Follows `job` until it completed, failed or was cancelled, or `timeout` passed.
pub fn until_done(services: &Services, job: &JobId, records: u64, timeout: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let bar = ProgressBar::new(records);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {pos}/{len} records {per_sec} {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message("queued");
    loop {
        let view = crate::status::view(services, job)?;
        if let Some(status) = &view.status {
            bar.set_position(status.records_done.min(records));
        }
        match view.state {
            JobState::Completed => {
                bar.set_position(records);
                bar.finish_and_clear();
                break;
            }
            JobState::Failed => {
                bar.abandon();
                let failure = view.status.and_then(|s| s.failure);
                let hint = failure.as_ref().and_then(|f| unprocessed_hint(&f.check)).map(|h| format!("\n{h}")).unwrap_or_default();
                let reason = failure.map(|f| format!("check `{}`: {}", f.check, f.message));
                bail!("job {job} failed: {}{hint}", reason.unwrap_or_else(|| "no reason recorded".into()));
            }
            JobState::Cancelled => {
                bar.abandon();
                bail!("job {job} was cancelled");
            }
            JobState::Queued => bar.set_message("queued"),
            JobState::InProgress => bar.set_message("embedding"),
        }
        if started.elapsed() >= timeout {
            bar.abandon();
            return Err(WaitTimedOut { job: *job, state: view.state.as_str(), waited_s: started.elapsed().as_secs() }.into());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let deadline = Instant::now() + LEDGER_WAIT;
    while crate::status::view(services, job)?.ledger.is_none() {
        if Instant::now() > deadline {
            eprintln!("note: the ledger has not appended the receipt of job {job} yet");
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// What a tenant can do about a job the deployment ended before any host finished it.
fn unprocessed_hint(check: &str) -> Option<&'static str> {
    match check {
        cloud::messages::UPLOAD_UNPROCESSED => {
            Some("the deployment never queued this upload (its operator is alerted); nothing was processed: submit the input again later")
        }
        cloud::messages::DEAD_LETTERED => {
            Some("no host finished this job before the queue gave up on it; nothing was returned: submit the input again later")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_nobody_processes_ends_the_wait_with_a_clear_message() {
        let dir = tempfile::tempdir().unwrap();
        let local = cloud_local::LocalCloud::open(dir.path()).unwrap();
        let services = local.services();
        let job = JobId([3; 16]);
        services.jobs.put(&cloud::layout::job_input(&job), b"sealed", cloud::PutCondition::CreateOnly).unwrap();
        let started = Instant::now();
        let error = until_done(&services, &job, 10, Duration::from_millis(300)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        let timed_out = error.downcast_ref::<WaitTimedOut>().expect("a WaitTimedOut");
        assert_eq!(timed_out.state, "queued");
        assert!(error.to_string().contains("ephem-batch status 03030303"), "{error}");
    }

    /// A job the dead-letter consumer ended: the wait returns at once, naming the check, what
    /// on-upload said, and what to do.
    #[test]
    fn a_job_ended_unprocessed_ends_the_wait_with_the_check() {
        use cloud::messages::{Failure, JobStatus, UPLOAD_UNPROCESSED};
        let dir = tempfile::tempdir().unwrap();
        let services = cloud_local::LocalCloud::open(dir.path()).unwrap().services();
        let job = JobId([4; 16]);
        services.jobs.put(&cloud::layout::job_input(&job), b"sealed", cloud::PutCondition::CreateOnly).unwrap();
        // The status `job-dead-letter` writes for it.
        let mut status = JobStatus::new(job, JobState::Failed, 1);
        status.failure = Some(Failure {
            check: UPLOAD_UNPROCESSED.into(),
            message: "on-upload gave up after 3 invocation(s) (RetriesExhausted): queue unavailable".into(),
        });
        let status = serde_json::to_vec(&status).unwrap();
        services.jobs.put(&cloud::layout::job_status(&job), &status, cloud::PutCondition::CreateOnly).unwrap();
        let started = Instant::now();
        let error = until_done(&services, &job, 10, Duration::from_secs(60)).unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(error.contains("check `upload_unprocessed`: on-upload gave up"), "{error}");
        assert!(error.contains("submit the input again"), "{error}");
    }
}
