//! What every Lambda binary shares: JSON logs, settings from named environment variables,
//! the AWS clients, and the blocking handlers run off the runtime's workers.
//!
//! The handlers and the `cloud` adapters are blocking, so each invocation runs on
//! `spawn_blocking`; the adapters drive the AWS SDK on their own runtime.

#[cfg(feature = "runtime")]
use std::fmt::Display;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use cloud_aws::AwsClients;
use cloud::{
    KeyNames, Kms, ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition, Queue, QueueError, QueueStats,
    Received, SendOptions, Services,
};
#[cfg(feature = "runtime")]
use lambda_runtime::{service_fn, Diagnostic, LambdaEvent};
#[cfg(feature = "runtime")]
use serde::{de::DeserializeOwned, Serialize};

/// Why a binary could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("environment variable {0} is not set")]
    Missing(&'static str),
    #[error("environment variable {name}: {message}")]
    Invalid { name: &'static str, message: String },
    #[error("AWS clients: {0}")]
    Aws(#[from] cloud_aws::AwsError),
    #[error("{0}")]
    Setup(String),
}

/// JSON lines on stdout (the functions log in Lambda's JSON format), filtered by `RUST_LOG`
/// (`info` by default; `target=level` lists as in `tracing-subscriber`'s `Targets`).
pub fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter: Targets = std::env::var("RUST_LOG").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        Targets::new().with_default(tracing::Level::INFO)
    });
    let json = tracing_subscriber::fmt::layer().json().flatten_event(true).with_current_span(false).with_ansi(false);
    let _ = tracing_subscriber::registry().with(json.with_filter(filter)).try_init();
}

/// A required variable.
pub fn var(name: &'static str) -> Result<String, ShellError> {
    optional(name).ok_or(ShellError::Missing(name))
}

/// A variable that may be absent (or empty).
pub fn optional(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A number variable, or `default` when absent.
pub fn number(name: &'static str, default: u64) -> Result<u64, ShellError> {
    optional(name).map_or(Ok(default), |v| v.parse().map_err(|e| ShellError::Invalid { name, message: format!("{v:?}: {e}") }))
}

/// `EPHEM_MAX_JOB_RECORDS` and `EPHEM_MAX_JOB_BYTES` over [`crate::job_limits::JobLimits::default`].
pub fn job_limits() -> Result<crate::job_limits::JobLimits, ShellError> {
    let default = crate::job_limits::JobLimits::default();
    Ok(crate::job_limits::JobLimits {
        max_records: number("EPHEM_MAX_JOB_RECORDS", default.max_records)?,
        max_input_bytes: number("EPHEM_MAX_JOB_BYTES", default.max_input_bytes)?,
    })
}

/// The SDK's configuration chain: the function's role, `AWS_REGION`, `AWS_ENDPOINT_URL`.
pub fn aws() -> Result<AwsClients, ShellError> {
    Ok(AwsClients::connect(None, None)?)
}

/// The services a function's variables name. A store or queue it has no variable for answers
/// every call with access denied, naming the variable: the deployment gave it no such right.
pub fn services(clients: &AwsClients) -> Services {
    let store = |name: &'static str| -> Arc<dyn ObjectStore> {
        match optional(name) {
            Some(bucket) => Arc::new(clients.object_store(&bucket, "")),
            None => Arc::new(Unconfigured(name)),
        }
    };
    let queue = |name: &'static str| -> Arc<dyn Queue> {
        match optional(name) {
            Some(url) => Arc::new(clients.queue(&url)),
            None => Arc::new(Unconfigured(name)),
        }
    };
    Services {
        jobs: store("EPHEM_JOBS_BUCKET"),
        models: store("EPHEM_MODELS_BUCKET"),
        attestations: store("EPHEM_ATTESTATIONS_BUCKET"),
        job_queue: queue("EPHEM_JOB_QUEUE_URL"),
        ledger_queue: queue("EPHEM_LEDGER_QUEUE_URL"),
        kms: Arc::new(clients.kms()) as Arc<dyn Kms>,
        task_tokens: Some(Arc::new(clients.step_functions(None))),
        bulk_workflow: None,
        keys: KeyNames { fleet: optional("EPHEM_FLEET_KEY_ARN").unwrap_or_default(), model: String::new() },
    }
}

#[cfg(feature = "runtime")]
/// Runs `init` once (off the async workers), then serves every invocation with `handler`.
/// A handler error becomes the invocation's error, typed `error_type` (what a state
/// machine's `Retry`/`Catch` and the logs see).
pub async fn serve<I, O, E, S, H>(
    error_type: &'static str,
    init: impl FnOnce() -> Result<S, ShellError> + Send + 'static,
    handler: H,
) -> Result<(), lambda_runtime::Error>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
    E: Display,
    S: Send + Sync + 'static,
    H: Fn(&S, I) -> Result<O, E> + Send + Sync + 'static,
{
    let state = match tokio::task::spawn_blocking(init).await? {
        Ok(state) => Arc::new(state),
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return Err(error.into());
        }
    };
    let handler = Arc::new(handler);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<I>| {
        let (state, handler) = (state.clone(), handler.clone());
        invoke(error_type, move || handler(&state, event.payload))
    }))
    .await
}

#[cfg(feature = "runtime")]
async fn invoke<O: Send + 'static, E: Display>(
    error_type: &'static str,
    call: impl FnOnce() -> Result<O, E> + Send + 'static,
) -> Result<O, Diagnostic> {
    let failed = |message: String| {
        tracing::error!(error = %message, "invocation failed");
        Diagnostic { error_type: error_type.to_owned(), error_message: message }
    };
    match tokio::task::spawn_blocking(move || call().map_err(|e| e.to_string())).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(message)) => Err(failed(message)),
        Err(join) => Err(failed(format!("the handler panicked: {join}"))),
    }
}

/// A store or queue this function was given no variable for.
struct Unconfigured(&'static str);

impl Unconfigured {
    fn denied(&self, key: &str) -> ObjectError {
        ObjectError::AccessDenied { key: key.to_owned(), message: format!("this function has no {}", self.0) }
    }
    fn queue_denied(&self) -> QueueError {
        QueueError::AccessDenied { queue: self.0.to_owned(), message: format!("this function has no {}", self.0) }
    }
}

impl ObjectStore for Unconfigured {
    fn put(&self, key: &str, _: &[u8], _: PutCondition) -> Result<ObjectMeta, ObjectError> {
        Err(self.denied(key))
    }
    fn writer(&self, key: &str, _: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        Err(self.denied(key))
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        Err(self.denied(key))
    }
    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        Err(self.denied(key))
    }
    fn read_range(&self, key: &str, _: u64, _: u64) -> Result<Vec<u8>, ObjectError> {
        Err(self.denied(key))
    }
    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        Err(self.denied(key))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        Err(self.denied(prefix))
    }
    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        Err(self.denied(key))
    }
}

impl Queue for Unconfigured {
    fn name(&self) -> &str {
        self.0
    }
    fn send(&self, _: &str, _: &SendOptions) -> Result<String, QueueError> {
        Err(self.queue_denied())
    }
    fn receive(&self, _: usize, _: Duration, _: Duration) -> Result<Vec<Received>, QueueError> {
        Err(self.queue_denied())
    }
    fn change_visibility(&self, _: &str, _: Duration) -> Result<(), QueueError> {
        Err(self.queue_denied())
    }
    fn delete(&self, _: &str) -> Result<(), QueueError> {
        Err(self.queue_denied())
    }
    fn stats(&self) -> Result<QueueStats, QueueError> {
        Err(self.queue_denied())
    }
}

/// The attestation root receipts must chain to: the AWS Nitro Enclaves root G1, unless
/// `EPHEM_ATTESTATION_ROOT_PEM` (PEM text or a file) names another — for emulator runs with
/// the development NSM only, and logged loudly.
pub fn attestation_root() -> Result<protocol::attestation::TrustAnchor, ShellError> {
    use protocol::attestation::{RootKind, TrustAnchor};
    let Some(value) = optional("EPHEM_ATTESTATION_ROOT_PEM") else { return Ok(TrustAnchor::aws_nitro_g1()) };
    let pem = if value.contains("-----BEGIN") {
        value
    } else {
        std::fs::read_to_string(&value)
            .map_err(|e| ShellError::Invalid { name: "EPHEM_ATTESTATION_ROOT_PEM", message: format!("{value}: {e}") })?
    };
    let root = TrustAnchor::from_pem(&pem)
        .map_err(|e| ShellError::Invalid { name: "EPHEM_ATTESTATION_ROOT_PEM", message: e.to_string() })?;
    if root.kind() != RootKind::AwsNitroG1 {
        tracing::warn!(root = %root.label(), "receipts are checked against a root that is NOT the AWS Nitro Enclaves root G1");
    }
    Ok(root)
}

/// `EPHEM_STORE_PREFIXES`.
pub fn store_prefixes() -> crate::on_upload::Config {
    crate::on_upload::Config::from_list(&optional("EPHEM_STORE_PREFIXES").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "runtime")]
    #[tokio::test]
    async fn handler_results_become_lambda_answers() {
        assert_eq!(invoke("T", || Ok::<_, String>(7)).await.unwrap(), 7);
        let err = invoke("EphemBatch.TestError", || Err::<(), _>("the jobs bucket is gone")).await.unwrap_err();
        assert_eq!((err.error_type.as_str(), err.error_message.as_str()), ("EphemBatch.TestError", "the jobs bucket is gone"));
        let err = invoke("EphemBatch.TestError", || -> Result<(), String> { panic!("boom") }).await.unwrap_err();
        assert!(err.error_message.contains("panicked"), "{}", err.error_message);
    }

    #[test]
    fn an_unconfigured_store_names_its_variable() {
        let store = Unconfigured("EPHEM_MODELS_BUCKET");
        let err = store.get("models/x").unwrap_err();
        assert!(err.to_string().contains("this function has no EPHEM_MODELS_BUCKET"), "{err}");
        assert!(matches!(err, ObjectError::AccessDenied { .. }));
    }
}
