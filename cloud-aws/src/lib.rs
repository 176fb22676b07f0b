//! The AWS backend: [`S3ObjectStore`], [`SqsQueue`], [`AwsKms`] and [`SfnWorkflow`] behind the
//! same traits as the local stand-ins, and [`AwsCloud`], which builds a [`Services`] from [`AwsSettings`].
//!
//! ```no_run
//! let settings = cloud_aws::AwsSettings::from_env()?; // EPHEM_* / EPHEM_STACK_OUTPUTS
//! let services = cloud_aws::AwsCloud::from_config(&settings, None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! * The traits are blocking; each adapter blocks on one shared tokio runtime
//!   ([`AwsRuntime`]).
//! * Throttling, 5xx and network failures are retried by the SDK's **standard** retry mode
//!   (exponential backoff with jitter), configured explicitly in [`AwsClients::connect`]; what
//!   still fails is reported as transient (`is_transient`), so callers can back off further.
//! * **Emulators.** With `AWS_ENDPOINT_URL` every client talks to the emulator and S3 is
//!   addressed path-style. moto (what the tests run) speaks the real S3 and SQS protocols, but
//!   its KMS ignores `Recipient` and has no `GenerateDataKeyPair*`; against it, KMS is the
//!   local KMS ([`KmsBackend::Local`], opened by the [`OpenLocalKms`] the composing binary
//!   passes in — this crate knows no local code), never a fake inside [`AwsKms`], which refuses a
//!   `Recipient` answer without `CiphertextForRecipient`.

pub mod bootstrap;
mod error;
mod kms;
mod runtime;
mod s3;
mod s3_copy;
mod s3_read;
mod s3_write;
pub mod settings;
mod sfn;
mod sqs;

use std::sync::Arc;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_smithy_http_client::tls;

pub use kms::AwsKms;
pub use runtime::AwsRuntime;
pub use s3::{S3ObjectStore, DEFAULT_PART_SIZE, MIN_PART_SIZE};
pub use s3_copy::{DEFAULT_COPY_PART_SIZE, MAX_COPY_OBJECT};
pub use settings::{AwsSettings, KmsBackend, SettingsError, StackOutputs};
pub use sfn::SfnWorkflow;
pub use sqs::{LambdaBatch, SqsQueue};

use cloud::{KeyNames, Kms, Services};

/// Attempts per request, the first included (the SDK's standard mode defaults to 3).
pub const MAX_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("no AWS region: set AWS_REGION, or give the stack outputs file (it names the region)")]
    NoRegion,
    #[error("cannot start the runtime of the AWS clients: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("the settings name a local KMS under {0} (an emulator run), and this program cannot open one")]
    NoLocalKms(std::path::PathBuf),
    #[error("local KMS under {path}: {source}")]
    LocalKms {
        path: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// SDK clients for S3, SQS, KMS and Step Functions on one runtime, configured the AWS way (see
/// [`settings`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub kms: aws_sdk_kms::Client,
    pub sfn: aws_sdk_sfn::Client,
    pub runtime: AwsRuntime,
    credentials: Option<aws_sdk_kms::config::SharedCredentialsProvider>,
    region: String,
}

/// Whether an emulator endpoint is configured for S3 (then S3 is addressed path-style).
fn s3_endpoint_configured(explicit: Option<&str>) -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    let ignored = std::env::var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    explicit.is_some() || (!ignored && (set("AWS_ENDPOINT_URL") || set("AWS_ENDPOINT_URL_S3")))
}

impl AwsClients {
    /// Loads the shared configuration (credentials, region, endpoints) and builds the clients.
    /// `region` and `endpoint_url` override the environment's.
    pub fn connect(region: Option<&str>, endpoint_url: Option<&str>) -> Result<AwsClients, AwsError> {
        AwsClients::build(region, endpoint_url, None)
    }

    /// Clients for an emulator at `endpoint_url`, with fixed dummy credentials (emulators
    /// accept any) so that nothing depends on the environment's.
    pub fn connect_emulator(endpoint_url: &str, region: &str) -> Result<AwsClients, AwsError> {
        let credentials = aws_sdk_s3::config::Credentials::new("test", "test", None, None, "emulator");
        AwsClients::build(Some(region), Some(endpoint_url), Some(credentials))
    }

    fn build(
        region: Option<&str>,
        endpoint_url: Option<&str>,
        credentials: Option<aws_sdk_s3::config::Credentials>,
    ) -> Result<AwsClients, AwsError> {
        let runtime = AwsRuntime::new()?;
        let retry = RetryConfig::standard()
            .with_max_attempts(MAX_ATTEMPTS)
            .with_initial_backoff(Duration::from_millis(100))
            .with_max_backoff(Duration::from_secs(10));
        // No operation timeout: long polls take up to 20 s and object bodies stream for as
        // long as they need. A connection that cannot be made fails fast and is retried.
        let timeouts = TimeoutConfig::builder().connect_timeout(Duration::from_secs(5)).build();
        // HTTPS on rustls with ring, the crypto of every other TLS client here (Cargo.toml).
        let https = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(https)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(region) = region {
            loader = loader.region(Region::new(region.to_owned()));
        }
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(credentials) = credentials {
            loader = loader.credentials_provider(credentials);
        }
        let shared = runtime.block_on(loader.load());
        let region = shared.region().ok_or(AwsError::NoRegion)?.to_string();
        // Uploads carry checksums S3 verifies. Downloads are not checked against S3's stored
        // checksum: a multipart object has only a per-part one, which the SDK cannot check (and
        // warns about), and everything the pipeline reads is sealed or signed end to end.
        let s3_config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(s3_endpoint_configured(endpoint_url))
            .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
            .build();
        Ok(AwsClients {
            s3: aws_sdk_s3::Client::from_conf(s3_config),
            sqs: aws_sdk_sqs::Client::new(&shared),
            kms: aws_sdk_kms::Client::new(&shared),
            sfn: aws_sdk_sfn::Client::new(&shared),
            credentials: shared.credentials_provider(),
            runtime,
            region,
        })
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn object_store(&self, bucket: &str, prefix: &str) -> S3ObjectStore {
        S3ObjectStore::new(self.s3.clone(), self.runtime.clone(), bucket, prefix)
    }

    pub fn queue(&self, url: &str) -> SqsQueue {
        SqsQueue::new(self.sqs.clone(), self.runtime.clone(), url)
    }

    pub fn kms(&self) -> AwsKms {
        AwsKms::new(self.kms.clone(), self.credentials.clone(), self.runtime.clone())
    }

    /// Step Functions: task tokens always; executions of `state_machine_arn` when given.
    pub fn step_functions(&self, state_machine_arn: Option<&str>) -> SfnWorkflow {
        SfnWorkflow::new(self.sfn.clone(), self.runtime.clone(), state_machine_arn.map(str::to_owned))
    }
}

/// The deployment's services on AWS, with typed handles for tools (the dead-letter queues, the
/// emulator's upload-event queue).
#[derive(Clone)]
pub struct AwsCloud {
    clients: AwsClients,
    settings: AwsSettings,
    job_queue: SqsQueue,
    ledger_queue: SqsQueue,
    services: Services,
}

impl std::fmt::Debug for AwsCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCloud").field("settings", &self.settings).finish()
    }
}

impl AwsCloud {
    /// The services every component holds.
    pub fn from_config(settings: &AwsSettings, local_kms: Option<OpenLocalKms>) -> Result<Services, AwsError> {
        Ok(AwsCloud::connect(settings, local_kms)?.services)
    }

    pub fn connect(settings: &AwsSettings, local_kms: Option<OpenLocalKms>) -> Result<AwsCloud, AwsError> {
        let clients = AwsClients::connect(settings.region.as_deref(), settings.endpoint_url.as_deref())?;
        AwsCloud::with_clients(clients, settings, local_kms)
    }

    /// The services of `settings` over clients made elsewhere (tests: an emulator's).
    pub fn with_clients(clients: AwsClients, settings: &AwsSettings, local_kms: Option<OpenLocalKms>) -> Result<AwsCloud, AwsError> {
        let (kms, keys): (Arc<dyn Kms>, KeyNames) = match &settings.kms {
            KmsBackend::Aws => (
                Arc::new(clients.kms()),
                KeyNames {
                    fleet: settings.fleet_key.clone().unwrap_or_default(),
                    model: settings.model_key.clone().unwrap_or_default(),
                },
            ),
            KmsBackend::Local(dir) => {
                let open = local_kms.ok_or_else(|| AwsError::NoLocalKms(dir.clone()))?;
                open(dir).map_err(|source| AwsError::LocalKms { path: dir.clone(), source })?
            }
        };
        let job_queue = clients.queue(&settings.job_queue_url);
        let ledger_queue = clients.queue(&settings.ledger_queue_url);
        let services = Services {
            jobs: Arc::new(clients.object_store(&settings.jobs_bucket, "")),
            models: Arc::new(clients.object_store(&settings.models_bucket, "")),
            attestations: Arc::new(clients.object_store(&settings.attestations_bucket, "")),
            job_queue: Arc::new(job_queue.clone()),
            ledger_queue: Arc::new(ledger_queue.clone()),
            kms,
            // Completing a token needs no ARN: the token names its execution.
            task_tokens: Some(Arc::new(clients.step_functions(None))),
            bulk_workflow: settings
                .bulk_state_machine_arn
                .as_deref()
                .map(|arn| Arc::new(clients.step_functions(Some(arn))) as Arc<dyn cloud::Executions>),
            keys,
        };
        Ok(AwsCloud { clients, settings: settings.clone(), job_queue, ledger_queue, services })
    }

    pub fn services(&self) -> Services {
        self.services.clone()
    }

    pub fn clients(&self) -> &AwsClients {
        &self.clients
    }

    pub fn settings(&self) -> &AwsSettings {
        &self.settings
    }

    pub fn job_queue(&self) -> &SqsQueue {
        &self.job_queue
    }

    pub fn ledger_queue(&self) -> &SqsQueue {
        &self.ledger_queue
    }

    pub fn job_dlq(&self) -> Option<SqsQueue> {
        self.settings.job_dlq_url.as_deref().map(|url| self.clients.queue(url))
    }

    pub fn ledger_dlq(&self) -> Option<SqsQueue> {
        self.settings.ledger_dlq_url.as_deref().map(|url| self.clients.queue(url))
    }

    /// Emulators only: the queue the jobs bucket sends `jobs/…/input.sealed` events to.
    pub fn upload_events(&self) -> Option<SqsQueue> {
        self.settings.upload_events_queue_url.as_deref().map(|url| self.clients.queue(url))
    }
}

/// Opens the local KMS under a directory, with the key names it knows: emulator runs, whose
/// KMS has no `Recipient` (moto). The binary that composes the services passes
/// `cloud_local::open_emulator_kms`.
pub type OpenLocalKms = fn(&std::path::Path) -> Result<(Arc<dyn Kms>, KeyNames), Box<dyn std::error::Error + Send + Sync>>;
