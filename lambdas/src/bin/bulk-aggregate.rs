#![forbid(unsafe_code)]
//! `bulk-aggregate`: the bulk workflow's last step (`lambdas::bulk::aggregate`): reads the
//! run's listing back from `bulk/<bulk_id>/shards.json`, verifies every shard's receipt and
//! writes `bulk/<bulk_id>/manifest.json`. Input `{bulk_id, bucket, prefix, outcomes}` (one word
//! per listed shard), output `{manifest_key, committed, timed_out, failed}`.
//!
//! Environment: `EPHEM_JOBS_BUCKET`; `EPHEM_ATTESTATIONS_BUCKET` (the documents receipts
//! name); the signed policies receipts' documents must satisfy (`lambdas::policies`:
//! `EPHEM_IMAGE_PUBLISHER_KEY`, `EPHEM_POLICIES_BUCKET`, optional `EPHEM_POLICIES_PREFIX`);
//! `EPHEM_ATTESTATION_ROOT_PEM` only to trust another root than AWS Nitro G1.

use lambdas::bulk::{self, AggregateInput};
use lambdas::shell::{self, ShellError};
use protocol::receipt_check::ReceiptVerifier;

struct App {
    bucket: String,
    jobs: cloud_aws::S3ObjectStore,
    attestations: cloud_aws::S3ObjectStore,
    check: ReceiptVerifier,
}

fn init() -> Result<App, ShellError> {
    let bucket = shell::var("EPHEM_JOBS_BUCKET")?;
    let attestations = shell::var("EPHEM_ATTESTATIONS_BUCKET")?;
    let clients = shell::aws()?;
    Ok(App {
        jobs: clients.object_store(&bucket, ""),
        attestations: clients.object_store(&attestations, ""),
        bucket,
        check: lambdas::policies::receipt_check_from_env(&clients, shell::attestation_root()?)?,
    })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.BulkError", init, |app: &App, input: AggregateInput| {
        if input.bucket != app.bucket {
            return Err(format!("bucket {} is not this deployment's jobs bucket {}", input.bucket, app.bucket));
        }
        bulk::aggregate(&input, &app.jobs, &app.attestations, &app.check, cloud::now_ms()).map_err(|e| e.to_string())
    })
    .await
}
