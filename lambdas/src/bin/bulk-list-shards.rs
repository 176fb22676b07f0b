#![forbid(unsafe_code)]
//! `bulk-list-shards`: the bulk workflow's first step (`lambdas::bulk::list_shards`).
//! Input `{bulk_id, bucket, prefix}`, output `{shards: [{key, job_id}], shard_count}`; writes
//! the listing once (If-None-Match) to `bulk/<bulk_id>/shards.json`.
//!
//! Environment: `EPHEM_JOBS_BUCKET`, `EPHEM_STORE_PREFIXES`.

use cloud::ObjectStore;
use lambdas::bulk::{self, BulkError, ListInput};
use lambdas::on_upload::Config;
use lambdas::shell::{self, ShellError};

struct App {
    bucket: String,
    jobs: cloud_aws::S3ObjectStore,
    config: Config,
}

fn init() -> Result<App, ShellError> {
    let bucket = shell::var("EPHEM_JOBS_BUCKET")?;
    let config = shell::store_prefixes();
    if config.store_prefixes.is_empty() {
        return Err(ShellError::Missing("EPHEM_STORE_PREFIXES"));
    }
    Ok(App { jobs: shell::aws()?.object_store(&bucket, ""), bucket, config })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.BulkError", init, |app: &App, input: ListInput| {
        if input.bucket != app.bucket {
            return Err(format!("bucket {} is not this deployment's jobs bucket {}", input.bucket, app.bucket));
        }
        bulk::list_shards(&input, &app.jobs as &dyn ObjectStore, &app.config).map_err(|e: BulkError| e.to_string())
    })
    .await
}
