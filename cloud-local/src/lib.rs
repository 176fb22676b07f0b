//! The embedded default: the cloud on one machine, under one directory (`$EPHEM_HOME`).
//!
//! ```text
//! $EPHEM_HOME/objects/{jobs,models,attestations}/   object stores (DirObjectStore)
//! $EPHEM_HOME/queues.sqlite                          job + ledger queues, their DLQs, on-upload's failures (SqliteQueue)
//! $EPHEM_HOME/kms.sqlite                             local KMS keys and policies (LocalKms)
//! $EPHEM_HOME/workflows.sqlite                       bulk-workflow executions and task tokens (LocalWorkflows)
//! $EPHEM_HOME/enclave/dev-root.pem                   the development CA root (written by the enclave worker)
//! ```
//!
//! Every process of the local pipeline (client, host-poller, tools) opens the same home with
//! [`LocalCloud::open`]; the stores and databases are safe to share between processes.
//!
//! S3 event notifications have no daemon here: the process that writes a job input calls the
//! `on-upload` handler itself, through the hook it registers on [`LocalCloud::jobs_store`]
//! ([`DirObjectStore::set_created_hook`]).

pub mod key_policy_document;
pub mod kms;
pub mod kms_endpoint;
pub mod objects;
pub mod queue;
mod sqlite;
pub mod workflows;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use kms::{AttestationTrust, LocalKeyPolicy, LocalKms};
pub use kms_endpoint::KmsEndpoint;
pub use objects::{CreatedHook, DirObjectStore};
pub use queue::{MessageState, QueueConfig, QueuedMessage, SqliteQueue};
pub use workflows::{LocalWorkflows, TokenOutcome};

use cloud::{KeyNames, Kms, KmsError, ObjectError, QueueError, Services, WorkflowError};

pub const OBJECTS_DIR: &str = "objects";
pub const JOBS_STORE: &str = "jobs";
pub const MODELS_STORE: &str = "models";
pub const ATTESTATIONS_STORE: &str = "attestations";
pub const QUEUES_DB: &str = "queues.sqlite";
pub const KMS_DB: &str = "kms.sqlite";
pub const WORKFLOWS_DB: &str = "workflows.sqlite";
/// The embedded default's store prefix: sealed shards under it become jobs (`submit --bulk`).
pub const STORE_PREFIX: &str = "stores/";
/// The development root the enclave worker writes on its first boot (relative to the home).
pub const DEV_ROOT_PEM: &str = "enclave/dev-root.pem";

pub const JOB_QUEUE: &str = "jobs";
pub const JOB_DLQ: &str = "jobs-dlq";
pub const LEDGER_QUEUE: &str = "ledger";
pub const LEDGER_DLQ: &str = "ledger-dlq";
/// on-upload's on-failure destination: the record of an upload it gave up on.
pub const UPLOAD_FAILURES: &str = "upload-failures";
/// Receives before a message goes to its dead-letter queue.
pub const MAX_RECEIVES: u32 = 5;

pub const FLEET_KEY_ALIAS: &str = "alias/ephem-fleet";
pub const MODEL_KEY_ALIAS: &str = "alias/ephem-model";
/// As KMS: a `Recipient` document older than this is refused.
pub const MAX_DOCUMENT_AGE: Duration = Duration::from_secs(5 * 60);

/// The local KMS under `dir` as the embedded default lays it out (`kms.sqlite`, and the
/// development root the enclave worker writes to `enclave/dev-root.pem`).
pub fn open_kms(dir: &Path) -> Result<LocalKms, LocalError> {
    std::fs::create_dir_all(dir).map_err(|source| LocalError::Io { path: dir.to_path_buf(), source })?;
    let trust = AttestationTrust { root_pem_path: dir.join(DEV_ROOT_PEM), max_document_age: MAX_DOCUMENT_AGE };
    Ok(LocalKms::open(dir.join(KMS_DB), trust)?)
}

/// The local KMS and its key names, for an AWS flow against an emulator whose KMS has no
/// `Recipient` (what `cloud_aws::AwsCloud` calls for `EPHEM_KMS=local:<dir>`).
pub fn open_emulator_kms(dir: &Path) -> Result<(Arc<dyn Kms>, KeyNames), Box<dyn std::error::Error + Send + Sync>> {
    let keys = KeyNames { fleet: FLEET_KEY_ALIAS.to_owned(), model: MODEL_KEY_ALIAS.to_owned() };
    Ok((Arc::new(open_kms(dir)?), keys))
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("cannot create {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object store {path}: {source}")]
    Objects {
        path: PathBuf,
        #[source]
        source: ObjectError,
    },
    #[error("queue {queue}: {source}")]
    Queue {
        queue: &'static str,
        #[source]
        source: QueueError,
    },
    #[error("local KMS: {0}")]
    Kms(#[from] KmsError),
    #[error("local Step Functions: {0}")]
    Workflows(#[from] WorkflowError),
}

/// Every local service under one home directory.
#[derive(Clone)]
pub struct LocalCloud {
    home: PathBuf,
    jobs: Arc<DirObjectStore>,
    models: Arc<DirObjectStore>,
    attestations: Arc<DirObjectStore>,
    job_queue: Arc<SqliteQueue>,
    job_dlq: Arc<SqliteQueue>,
    ledger_queue: Arc<SqliteQueue>,
    ledger_dlq: Arc<SqliteQueue>,
    upload_failures: Arc<SqliteQueue>,
    kms: Arc<LocalKms>,
    workflows: Arc<LocalWorkflows>,
}

impl std::fmt::Debug for LocalCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCloud").field("home", &self.home).finish()
    }
}

impl LocalCloud {
    /// Opens the home, creating its layout on first use. Safe to call from several processes.
    pub fn open(home: &Path) -> Result<LocalCloud, LocalError> {
        std::fs::create_dir_all(home).map_err(|source| LocalError::Io { path: home.to_path_buf(), source })?;
        let store = |name: &str| {
            let path = home.join(OBJECTS_DIR).join(name);
            DirObjectStore::open(&path).map(Arc::new).map_err(|source| LocalError::Objects { path, source })
        };
        let db = home.join(QUEUES_DB);
        let queue = |queue: &'static str, config: QueueConfig| {
            SqliteQueue::open(&db, queue, config).map(Arc::new).map_err(|source| LocalError::Queue { queue, source })
        };
        // Dead-letter queues first, so their (empty) redrive settings are the recorded ones.
        let job_dlq = queue(JOB_DLQ, QueueConfig::default())?;
        let ledger_dlq = queue(LEDGER_DLQ, QueueConfig { fifo: true, ..QueueConfig::default() })?;
        let job_queue = queue(
            JOB_QUEUE,
            QueueConfig { fifo: false, max_receives: Some(MAX_RECEIVES), dead_letter: Some(JOB_DLQ.into()) },
        )?;
        let ledger_queue = queue(
            LEDGER_QUEUE,
            QueueConfig { fifo: true, max_receives: Some(MAX_RECEIVES), dead_letter: Some(LEDGER_DLQ.into()) },
        )?;
        let upload_failures = queue(UPLOAD_FAILURES, QueueConfig::default())?;
        let kms = Arc::new(open_kms(home)?);
        let workflows = Arc::new(LocalWorkflows::open(home.join(WORKFLOWS_DB))?);
        Ok(LocalCloud {
            home: home.to_path_buf(),
            jobs: store(JOBS_STORE)?,
            models: store(MODELS_STORE)?,
            attestations: store(ATTESTATIONS_STORE)?,
            job_queue,
            job_dlq,
            ledger_queue,
            ledger_dlq,
            upload_failures,
            kms,
            workflows,
        })
    }

    /// The services as every component sees them; keys by alias.
    pub fn services(&self) -> Services {
        Services {
            jobs: self.jobs.clone(),
            models: self.models.clone(),
            attestations: self.attestations.clone(),
            job_queue: self.job_queue.clone(),
            ledger_queue: self.ledger_queue.clone(),
            kms: self.kms.clone(),
            task_tokens: Some(self.workflows.clone()),
            bulk_workflow: Some(self.workflows.clone()),
            keys: KeyNames { fleet: FLEET_KEY_ALIAS.to_owned(), model: MODEL_KEY_ALIAS.to_owned() },
        }
    }

    /// Step Functions with the runner's functions (claim, issue and await tokens).
    pub fn workflows(&self) -> Arc<LocalWorkflows> {
        self.workflows.clone()
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The jobs store itself, to register the `on-upload` hook on.
    pub fn jobs_store(&self) -> Arc<DirObjectStore> {
        self.jobs.clone()
    }

    pub fn models_store(&self) -> Arc<DirObjectStore> {
        self.models.clone()
    }

    pub fn attestations_store(&self) -> Arc<DirObjectStore> {
        self.attestations.clone()
    }

    /// The KMS with its admin functions (create keys, set aliases).
    pub fn kms(&self) -> Arc<LocalKms> {
        self.kms.clone()
    }

    pub fn job_queue(&self) -> Arc<SqliteQueue> {
        self.job_queue.clone()
    }

    pub fn job_dlq(&self) -> Arc<SqliteQueue> {
        self.job_dlq.clone()
    }

    pub fn ledger_queue(&self) -> Arc<SqliteQueue> {
        self.ledger_queue.clone()
    }

    pub fn ledger_dlq(&self) -> Arc<SqliteQueue> {
        self.ledger_dlq.clone()
    }

    /// Where on-upload's failure records go (the `job-dead-letter` consumer reads them).
    pub fn upload_failures(&self) -> Arc<SqliteQueue> {
        self.upload_failures.clone()
    }

    /// Where the local KMS expects the development root.
    pub fn dev_root_pem_path(&self) -> PathBuf {
        self.home.join(DEV_ROOT_PEM)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use cloud::{ObjectMeta, PutCondition, Queue, SendOptions};

    #[test]
    fn layout_and_two_opens_share_everything() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let a = LocalCloud::open(&home).unwrap();
        let b = LocalCloud::open(&home).unwrap();
        for sub in ["objects/jobs", "objects/models", "objects/attestations"] {
            assert!(home.join(sub).is_dir(), "{sub}");
        }
        assert!(home.join(QUEUES_DB).is_file());
        assert!(home.join(KMS_DB).is_file());
        assert_eq!(a.home(), home);
        assert_eq!(a.dev_root_pem_path(), home.join("enclave/dev-root.pem"));

        let (sa, sb) = (a.services(), b.services());
        assert_eq!(sa.keys, KeyNames { fleet: "alias/ephem-fleet".into(), model: "alias/ephem-model".into() });
        sa.jobs.put("jobs/x/status.json", b"{}", PutCondition::Overwrite).unwrap();
        assert_eq!(sb.jobs.get("jobs/x/status.json").unwrap(), b"{}");
        assert!(sb.models.list("").unwrap().is_empty(), "stores are separate");

        assert_eq!(sa.job_queue.name(), JOB_QUEUE);
        sa.job_queue.send("job", &SendOptions::default()).unwrap();
        let got = sb.job_queue.receive(1, Duration::ZERO, Duration::from_secs(30)).unwrap();
        assert_eq!(got[0].body, "job");
        assert!(sa.ledger_queue.send("r", &SendOptions::default()).is_err(), "the ledger queue is FIFO");
        sa.ledger_queue.send("r", &SendOptions { group_id: Some("ledger".into()), ..Default::default() }).unwrap();
        assert_eq!(b.ledger_queue().config().max_receives, Some(MAX_RECEIVES));
        assert_eq!(b.ledger_queue().config().dead_letter.as_deref(), Some(LEDGER_DLQ));
        assert!(b.ledger_dlq().config().fifo);
        assert!(!b.job_dlq().config().fifo);

        let key = a.kms().create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
        a.kms().set_alias(FLEET_KEY_ALIAS, &key).unwrap();
        assert_eq!(b.kms().resolve(&sb.keys.fleet).unwrap(), key);
        let ctx = Default::default();
        let blob = sa.kms.encrypt(&sa.keys.fleet, b"x", &ctx).unwrap();
        assert_eq!(sb.kms.decrypt(None, &blob, &ctx, None).unwrap().plaintext.unwrap().as_slice(), b"x");
    }

    #[test]
    fn the_jobs_store_hook_sees_uploads_through_services() {
        let dir = tempfile::tempdir().unwrap();
        let cloud = LocalCloud::open(dir.path()).unwrap();
        let queue = cloud.job_queue();
        // What the local pipeline does: the on-upload handler as a created hook.
        cloud.jobs_store().set_created_hook(
            cloud::layout::JOBS_PREFIX,
            cloud::layout::INPUT_SUFFIX,
            Arc::new(move |meta: &ObjectMeta| {
                queue.send(&meta.key, &SendOptions::default()).map(|_| ()).map_err(|e| e.to_string())
            }),
        );
        let services = cloud.services();
        services.jobs.put("jobs/abc/input.sealed", b"sealed", PutCondition::CreateOnly).unwrap();
        services.jobs.put("jobs/abc/status.json", b"{}", PutCondition::Overwrite).unwrap();
        let got = services.job_queue.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, "jobs/abc/input.sealed");
    }
}
