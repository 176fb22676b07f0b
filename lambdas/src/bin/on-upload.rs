#![forbid(unsafe_code)]
//! `on-upload`: S3 `ObjectCreated` → `lambdas::on_upload` (docs/operations.md §6).
//!
//! Environment: `EPHEM_JOBS_BUCKET`, `EPHEM_JOB_QUEUE_URL`, `EPHEM_STORE_PREFIXES`; with
//! `EPHEM_ATTESTATIONS_BUCKET` the fleet epoch is checked, with `EPHEM_MODELS_BUCKET` the
//! model manifest (the enclave checks both again in any case). `EPHEM_MAX_JOB_RECORDS` and
//! `EPHEM_MAX_JOB_BYTES` set the per-job limits (`lambdas::job_limits`).

use aws_lambda_events::s3::S3Event;
use lambdas::on_upload::{self, Config};
use lambdas::shell::{self, ShellError};

struct App {
    services: cloud::Services,
    config: Config,
}

fn init() -> Result<App, ShellError> {
    shell::var("EPHEM_JOBS_BUCKET")?;
    shell::var("EPHEM_JOB_QUEUE_URL")?;
    let clients = shell::aws()?;
    let config = Config {
        check_epoch: shell::optional("EPHEM_ATTESTATIONS_BUCKET").is_some(),
        check_manifest: shell::optional("EPHEM_MODELS_BUCKET").is_some(),
        limits: shell::job_limits()?,
        ..shell::store_prefixes()
    };
    tracing::info!(store_prefixes = ?config.store_prefixes, check_epoch = config.check_epoch, check_manifest = config.check_manifest, limits = ?config.limits, "on-upload ready");
    Ok(App { services: shell::services(&clients), config })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.OnUploadError", init, |app: &App, event: S3Event| {
        let outcomes = on_upload::handle_with(&event, &app.services, &app.config)?;
        tracing::info!(records = outcomes.len(), "event handled");
        Ok::<_, on_upload::OnUploadError>(())
    })
    .await
}
