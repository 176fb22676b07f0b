#![forbid(unsafe_code)]
//! The ports of the pipeline: small traits — [`ObjectStore`] (S3), [`Queue`] (SQS), [`Kms`]
//! (KMS), [`TaskTokens`] and [`Executions`] (Step Functions) — the storage [`layout`], the
//! [`messages`] that travel between components and the objects both sides of them read (the
//! [`bulk`] manifest), and the ledger's dead-letter [`redrive`] over the queue port. The
//! adapters live beside it: `cloud-aws` (the AWS SDK) and `cloud-local` (the embedded default).
//! Every caller (host-poller, Lambda handlers, `ephem-batch`) holds a [`Services`] and never
//! knows which backend it talks to; which one it is, is decided once, in the binary's `main`.
//!
//! The traits are blocking: the host-poller and the client move bytes with threads, and an AWS
//! adapter drives its async SDK from its own runtime.

pub mod bulk;
pub mod hooked;
pub mod kms;
pub mod layout;
pub mod messages;
pub mod objects;
pub mod queue;
pub mod redrive;
pub mod workflow;

use std::sync::Arc;

pub use kms::{AwsCredentials, DataKey, DataKeyPair, Decrypted, KeyDescription, Kms, KmsError, Recipient};
pub use objects::{ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition, MAX_SMALL_OBJECT};
pub use queue::{Queue, QueueError, QueueStats, Received, SendOptions};
pub use workflow::{Completion, Execution, ExecutionStatus, Executions, TaskTokens, WorkflowError};

/// Everything a component of the pipeline reaches in the cloud.
#[derive(Clone)]
pub struct Services {
    /// `jobs/<id>/…`: sealed inputs, per-attempt outputs, receipts, status; store prefixes.
    pub jobs: Arc<dyn ObjectStore>,
    /// `models/…`: encrypted model files and signed manifests.
    pub models: Arc<dyn ObjectStore>,
    /// `attestations/…` (published documents) and `fleet-keys/…` (epoch records).
    pub attestations: Arc<dyn ObjectStore>,
    /// Job messages, created only by the `on-upload` handler.
    pub job_queue: Arc<dyn Queue>,
    /// Receipts on their way to the ledger (FIFO, deduplicated by job id).
    pub ledger_queue: Arc<dyn Queue>,
    pub kms: Arc<dyn Kms>,
    /// Completes bulk-workflow task tokens (hosts, `bulk-await-shard`); `None` where no workflow
    /// runs.
    pub task_tokens: Option<Arc<dyn TaskTokens>>,
    /// Starts and follows bulk-workflow executions (the client); `None` where the deployment
    /// names no bulk state machine.
    pub bulk_workflow: Option<Arc<dyn Executions>>,
    /// KMS key ids (or aliases) of the deployment.
    pub keys: KeyNames,
}

/// Which KMS keys wrap what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNames {
    /// Wraps fleet-key epochs (`GenerateDataKeyPairWithoutPlaintext`).
    pub fleet: String,
    /// Wraps model data keys.
    pub model: String,
}

/// Milliseconds since the Unix epoch, by the local clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
