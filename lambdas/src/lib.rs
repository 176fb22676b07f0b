#![forbid(unsafe_code)]
//! Lambda handlers as library functions. Each takes the real AWS event type
//! (`aws_lambda_events`) and the [`cloud::Services`] it needs, so the same function runs in a
//! `lambda_runtime` binary in AWS and in-process on events of the same shape locally.
//!
//! - [`on_upload`]: S3 object created under `jobs/…/input.sealed` → checked job message (the
//!   only way a job is created); a sealed shard under a store prefix → its job input.
//! - [`job_limits`]: what one upload may ask of the fleet, and the tenant its job is queued under.
//! - [`dead_letter`]: on-upload's failure records and the jobs DLQ → the job marked failed
//!   (unless it ended) and its waiting bulk task completed.
//! - [`ledger_append`]: ledger queue batch → verified receipts appended to the ledger.
//! - [`fleet_epochs`]: the fleet-key epoch records stored (enclaves create them: docs/protocol.md §7.3.2).
//! - [`bulk`]: the bulk workflow's steps (list the shards, await each shard on a task token,
//!   aggregate verified receipts).
//! - [`metrics`]: the deployment's metrics as CloudWatch Embedded Metric Format lines.
//! - [`policies`]: the publisher-signed attestation policies receipts must satisfy.
//! - [`shell`]: what the `lambda_runtime` binaries (`src/bin/`) share.
//! - [`sqs_event`]: the event an SQS event source delivers, for the runtimes that stand in for it.
//!
//! What runs around the handlers in the embedded default (the ASL interpreter standing in for
//! Step Functions, the queues' event sources, the upload notification) is `devstack`'s.

pub mod bulk;
pub mod dead_letter;
pub mod fleet_epochs;
pub mod job_limits;
pub mod ledger_append;
pub mod ledger_signer;
pub mod metrics;
pub mod on_upload;
pub mod policies;
pub mod shell;
pub mod sqs_event;
