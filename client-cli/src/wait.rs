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

pub fn until_done(services: &Services, job: &JobId, records: u64) -> anyhow::Result<()> {
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
                let failure = view.status.and_then(|s| s.failure).map(|f| format!("check `{}`: {}", f.check, f.message));
                bail!("job {job} failed: {}", failure.unwrap_or_else(|| "no reason recorded".into()));
            }
            JobState::Cancelled => {
                bar.abandon();
                bail!("job {job} was cancelled");
            }
            JobState::Queued => bar.set_message("queued"),
            JobState::InProgress => bar.set_message("embedding"),
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
