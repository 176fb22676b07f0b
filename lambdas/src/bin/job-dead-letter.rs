#![forbid(unsafe_code)]
//! `job-dead-letter`: on-upload's on-failure queue and the jobs DLQ → `lambdas::dead_letter`
//! (the job marked failed unless it ended, its waiting bulk task completed), with partial batch
//! failures: a record that hit an error comes back after the queue's visibility timeout.
//!
//! Environment: `EPHEM_JOBS_BUCKET`, `EPHEM_STORE_PREFIXES` (a shard's job is read from its
//! header), `EPHEM_ATTESTATIONS_BUCKET` and `EPHEM_LEDGER_QUEUE_URL` (a committed receipt the
//! ledger does not hold is sent there). Calls S3 (GetObject and conditional PutObject of
//! `jobs/*/status.json`; GetObject of `jobs/*/receipt.cose`, `jobs/*/ledgered.json`,
//! `jobs/*/bulk-tasks/*` (listed), `jobs/*/input.sealed`, shards and `attestations/by-hash/*`),
//! SQS (SendMessage to the ledger queue) and Step Functions (SendTaskSuccess, SendTaskFailure).

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambdas::on_upload::Config;
use lambdas::shell::{self, ShellError};

struct App {
    services: cloud::Services,
    config: Config,
}

fn init() -> Result<App, ShellError> {
    shell::var("EPHEM_JOBS_BUCKET")?;
    let clients = shell::aws()?;
    let config = shell::store_prefixes();
    tracing::info!(store_prefixes = ?config.store_prefixes, "job-dead-letter ready");
    Ok(App { services: shell::services(&clients), config })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.DeadLetterError", init, |app: &App, event: SqsEvent| {
        let response: SqsBatchResponse = lambdas::dead_letter::handle(&event, &app.services, &app.config);
        Ok::<_, std::convert::Infallible>(response)
    })
    .await
}
