#![forbid(unsafe_code)]
//! The embedded default: the whole stack on one machine, and what stands in for the AWS services
//! around the Lambda handlers. The production crates know nothing of it; the `ephem-batch` binary
//! composes it with the client once, in `main` ([`upload_wiring`] for the local backend, [`dev`]
//! for the `dev` commands).
//!
//! - [`dev`]: `ephem-batch dev up | down | status | run-lambdas`, and against an AWS emulator
//!   `dev aws-pump` ([`dev::aws`]) on the stack `scripts/emulator-stack.sh` deploys;
//! - [`local`]: the event sources of `ledger-append` and `job-dead-letter`, Lambda's asynchronous
//!   invocation of `on-upload` (retries, failure record), the input-expiry lifecycle rule;
//! - [`local_workflow`], [`asl_walk`]: the bulk workflow's own definition run by a small ASL
//!   interpreter, the steps in-process (the stand-in for Step Functions).

pub mod asl_walk;
pub mod dev;
pub mod local;
pub mod local_workflow;

use cloud::{Services, layout};
use cloud_local::LocalCloud;

/// The local backend's upload wiring: `on-upload` subscribed to `jobs/…/input.sealed` and to
/// sealed shards under the local store prefix (`stores/…`), as the deployment's two bucket
/// notifications subscribe the Lambda; an upload it gives up on goes to its on-failure queue
/// (`upload-failures`). Installed by the binary with `backend::install_local_wiring`.
pub fn upload_wiring(services: &Services, local: &LocalCloud) {
    let config = lambdas::on_upload::Config::from_list(cloud_local::STORE_PREFIX);
    for (prefix, suffix) in
        [(layout::JOBS_PREFIX, layout::INPUT_SUFFIX), (cloud_local::STORE_PREFIX, lambdas::on_upload::SHARD_SUFFIX)]
    {
        let delays = local::UPLOAD_RETRY_DELAYS.to_vec();
        let hook = local::on_upload_hook(services.clone(), config.clone(), local.upload_failures(), delays);
        local.jobs_store().set_created_hook(prefix, suffix, hook);
    }
}
