//! [`LedgerFunction`]: the `ledger-append` function as it lives between invocations.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use cloud_aws::AwsClients;
use cloud::ObjectStore;
use protocol::attestation::TrustAnchor;
use receipts_ledger::store::tiles::{cache_file, layout::Layout, TileOptions};
use receipts_ledger::{CheckpointPolicy, Ledger, NoteSigner, TileStore, VerifierKey, WitnessClient};
use protocol::attestation::PolicySet;
use protocol::receipt_check::ReceiptVerifier;

use super::{process, settle, LedgerQueues, Outcome, RetryBudget};
use crate::shell::{self, ShellError};

/// What the function is given: its two buckets, its signer, its cache directory, the
/// attestation root receipts must chain to and the signed policies their documents must satisfy.
pub struct FunctionConfig {
    /// The ledger's bucket (C2SP tlog-tiles at its root).
    pub ledger: Arc<dyn ObjectStore>,
    /// Where `jobs/<id>/ledger-proof.json` and `jobs/<id>/ledgered.json` go.
    pub jobs: Arc<dyn ObjectStore>,
    pub signer: Box<dyn NoteSigner>,
    /// The SQLite cache (`ledger-cache.sqlite`), rebuilt from the bucket when missing or behind.
    pub cache_dir: PathBuf,
    pub root: TrustAnchor,
    /// The allow-list (verified): the image measurements receipts are admitted under.
    pub policies: PolicySet,
    /// The witnesses each new checkpoint goes to (`EPHEM_WITNESSES`); `None`: no cosignatures.
    pub witnesses: Option<WitnessClient>,
}

#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error("ledger in {bucket}: {source}")]
    Ledger {
        bucket: String,
        #[source]
        source: receipts_ledger::TileError,
    },
    #[error("attestation policies: {0}")]
    Policies(#[from] protocol::attestation::PolicySetError),
}

/// The `ledger-append` function as it lives between invocations: the ledger on S3 with its
/// cache, what checks receipts, and the queues it settles its verdicts on. The `lambda_runtime`
/// binary serves it; against an emulator `ephem-batch dev aws-pump` invokes the same value with
/// the SQS event Lambda would build.
pub struct LedgerFunction {
    ledger: Mutex<Ledger<TileStore>>,
    jobs: Arc<dyn ObjectStore>,
    queues: Option<LedgerQueues>,
}

impl LedgerFunction {
    /// Opens the ledger in its bucket and brings the cache up to the bucket's checkpoint.
    pub fn open(config: FunctionConfig, bucket: &str) -> Result<LedgerFunction, FunctionError> {
        let check = ReceiptVerifier::enforcing(config.root, config.policies)?;
        let fail = |source| FunctionError::Ledger { bucket: bucket.to_owned(), source };
        let verifier = config.signer.verifier();
        let mut store =
            TileStore::open(config.ledger, Layout::new(""), cache_file(&config.cache_dir), verifier.clone(), TileOptions::appender())
                .map_err(fail)?;
        let head = store.refresh().map_err(fail)?;
        tracing::info!(ledger_key = %verifier, size = head.map_or(0, |h| h.size), "ledger-append ready");
        let ledger =
            Ledger::new(store, Box::new(check), config.signer, CheckpointPolicy::default()).with_witnesses(config.witnesses);
        Ok(LedgerFunction { ledger: Mutex::new(ledger), jobs: config.jobs, queues: None })
    }

    /// Settles verdicts on `queues`: a retried message's visibility is the backoff its receive
    /// count calls for, a held one goes to the dead-letter queue now. Without them, every
    /// message not done waits out the queue's visibility timeout.
    pub fn with_queues(mut self, queues: LedgerQueues) -> Self {
        self.queues = Some(queues);
        self
    }

    /// The Lambda's configuration from its environment (docs/operations.md §6):
    /// `EPHEM_LEDGER_BUCKET`, `EPHEM_LEDGER_KEY_ARN` (or `EPHEM_LEDGER_SIGNING_KEY`),
    /// `EPHEM_JOBS_BUCKET`, `EPHEM_LEDGER_CACHE_DIR`, `EPHEM_ATTESTATION_ROOT_PEM`, the
    /// policies' `EPHEM_IMAGE_PUBLISHER_KEY`, `EPHEM_POLICIES_BUCKET`, `EPHEM_POLICIES_PREFIX`,
    /// the queues `EPHEM_LEDGER_QUEUE_URL` (its redrive policy read once) and
    /// `EPHEM_LEDGER_DLQ_URL`, and the witnesses `EPHEM_WITNESSES` (`KEY@URL,…`).
    pub fn from_env(clients: &AwsClients) -> Result<LedgerFunction, ShellError> {
        let bucket = shell::var("EPHEM_LEDGER_BUCKET")?;
        let jobs = shell::var("EPHEM_JOBS_BUCKET")?;
        let root = shell::attestation_root()?;
        let policies = crate::policies::policies_from_env(clients)?;
        let config = FunctionConfig {
            ledger: Arc::new(clients.object_store(&bucket, "")),
            jobs: Arc::new(clients.object_store(&jobs, "")),
            signer: crate::ledger_signer::from_env(Arc::new(clients.kms()), &bucket, clients.region())?,
            cache_dir: PathBuf::from(shell::optional("EPHEM_LEDGER_CACHE_DIR").unwrap_or_else(|| DEFAULT_CACHE_DIR.into())),
            root,
            policies,
            witnesses: WitnessClient::from_env().map_err(|e| ShellError::Setup(e.to_string()))?,
        };
        let function = LedgerFunction::open(config, &bucket).map_err(|e| ShellError::Setup(e.to_string()))?;
        Ok(match shell::optional("EPHEM_LEDGER_QUEUE_URL") {
            Some(url) => function.with_queues(queues_of(clients, &url, shell::optional("EPHEM_LEDGER_DLQ_URL").as_deref())?),
            None => function,
        })
    }

    /// One invocation: the batch appended, verdicts settled on the queues, partial failures
    /// reported, and one CloudWatch EMF line per receipt newly appended (the dashboard's
    /// jobs/min and documents/s).
    pub fn invoke(&self, event: &SqsEvent, now_ms: u64) -> SqsBatchResponse {
        // A panic in an earlier invocation cannot leave the ledger half-written: every append
        // is a transaction and the bucket is the truth.
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let budget = self.queues.as_ref().map_or(RetryBudget::UNKNOWN, |q| q.budget);
        let handled = process(event, &mut ledger, self.jobs.as_ref(), now_ms, budget, &mut |outcome| {
            if let Outcome::Appended(fields) = outcome {
                crate::metrics::emit_ledgered(now_ms, fields.ok_count, fields.failed_count)
            }
        });
        settle(&handled, self.queues.as_ref())
    }

    /// The key the function's checkpoints verify under.
    pub fn verifier(&self) -> VerifierKey {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).verifier()
    }
}

/// The ledger queue at `url` with its redrive limit (asked once: `GetQueueAttributes`), and its
/// dead-letter queue. A limit that cannot be read leaves the backoff alone: the queue still
/// dead-letters by its own policy, only without the last receive's shortcut.
pub fn queues_of(clients: &AwsClients, url: &str, dlq_url: Option<&str>) -> Result<LedgerQueues, ShellError> {
    let source = clients.queue(url);
    let max_receives = source.max_receives().unwrap_or_else(|error| {
        tracing::warn!(queue = url, %error, "the ledger queue's redrive limit is unknown");
        None
    });
    Ok(LedgerQueues {
        source: Arc::new(source),
        dead_letter: dlq_url.map(|u| Arc::new(clients.queue(u)) as Arc<dyn cloud::Queue>),
        budget: max_receives.map_or(RetryBudget::UNKNOWN, |max_receives| RetryBudget { max_receives }),
    })
}

/// Where the Lambda keeps its cache unless `EPHEM_LEDGER_CACHE_DIR` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/tmp/ephem-ledger";
