#![forbid(unsafe_code)]
//! `bulk-await-shard`: the bulk workflow's Map item task (`lambdas::bulk::await_shard`), run as
//! `lambda:invoke.waitForTaskToken`: writes the task token to the run's own slot
//! `jobs/<job_id>/bulk-tasks/<bulk_id>.json`, then completes it itself if the job already ended
//! (else whoever ends the job does).
//! Input `{bulk_id, bucket, key, job_id, task_token}`, output `{job_id, state}` (ignored by
//! the workflow).
//!
//! Environment: `EPHEM_JOBS_BUCKET`. Calls S3 (PutObject `jobs/*/bulk-tasks/*`, GetObject
//! `jobs/*/receipt.cose` and `jobs/*/status.json`) and Step Functions (SendTaskSuccess,
//! SendTaskFailure).

use lambdas::bulk::{self, AwaitInput};
use lambdas::shell::{self, ShellError};

struct App {
    bucket: String,
    jobs: cloud_aws::S3ObjectStore,
    tokens: cloud_aws::SfnWorkflow,
}

fn init() -> Result<App, ShellError> {
    let bucket = shell::var("EPHEM_JOBS_BUCKET")?;
    let clients = shell::aws()?;
    Ok(App { jobs: clients.object_store(&bucket, ""), tokens: clients.step_functions(None), bucket })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.BulkError", init, |app: &App, input: AwaitInput| {
        if input.bucket != app.bucket {
            return Err(format!("bucket {} is not this deployment's jobs bucket {}", input.bucket, app.bucket));
        }
        bulk::await_shard(&input, &app.jobs, &app.tokens, cloud::now_ms()).map_err(|e| e.to_string())
    })
    .await
}
