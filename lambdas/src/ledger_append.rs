//! `ledger-append`: a batch from the ledger queue (FIFO, one group, deduplicated by job id) →
//! receipts verified and appended to the ledger, with partial batch failure reporting.
//!
//! Each message is a [`LedgerMessage`]: the receipt's exact COSE bytes and the attestation
//! document it names. The ledger's [`ReceiptCheck`] verifies the document (at its own time), the
//! binding of the receipt key, the receipt signature, and that the document's measurements
//! satisfy one of the publisher-signed policies the function was given ([`crate::policies`]);
//! the ledger holds at most one entry per job, so a re-delivered message is a no-op. After the
//! append, `jobs/<id>/ledgered.json` records the index (the input-expiry rule keys off it).
//!
//! A refusal is terminal: the same bytes fail the same way every time, so the message is
//! acknowledged (and logged with the failed check) instead of being retried — in a FIFO queue
//! with one group a retried message would hold back every receipt behind it. Nothing refused
//! takes the job's slot, so the genuine receipt is appended when it comes. Only infrastructure
//! failures (the store, the jobs bucket) are reported back to the queue.
//!
//! [`LedgerFunction`] is the whole function — the ledger on S3 (C2SP tlog-tiles, its SQLite
//! index as a cache) behind [`handle_with`] and the metrics — which the `lambda_runtime` binary
//! serves and `ephem-batch dev aws-pump` invokes against an emulator.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use receipts_ledger::PolicySet;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use base64::Engine as _;
use cloud::aws::AwsClients;
use cloud::layout;
use cloud::messages::{LedgerMessage, Ledgered};
use cloud::{ObjectStore, PutCondition};
use protocol::attestation::TrustAnchor;
use protocol::envelope::JobId;
use receipts_ledger::store::tiles::{cache_file, layout::Layout, TileOptions};
use receipts_ledger::{
    AppendOutcome, AppendRequest, CheckpointPolicy, IndexedFields, Ledger, LedgerStore, NoteSigner, ProtocolReceipts,
    ReceiptCheck, TileStore, VerifierKey,
};

use crate::shell::{self, ShellError};

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("message has no body")]
    NoBody,
    #[error("message body is not a ledger message: {0}")]
    Body(String),
    #[error("field {0} is not base64")]
    Base64(&'static str),
    #[error("job id {0:?} is not 32 hex digits")]
    JobId(String),
    #[error("receipt refused: {0}")]
    Receipt(String),
    #[error("the message names job {message}, the receipt job {receipt}")]
    JobMismatch { message: String, receipt: String },
    /// The ledger already holds a different valid receipt for the job: two receipts for one job
    /// should never both exist (one commit wins at `jobs/<id>/receipt.cose`), so it is an alarm,
    /// not a success.
    #[error("the ledger holds another receipt for job {job} (entry {index}); this one is not appended")]
    OtherReceipt { job: String, index: u64 },
    #[error("ledger: {0}")]
    Ledger(#[from] receipts_ledger::LedgerError),
    #[error("jobs store: {0}")]
    Object(#[from] cloud::ObjectError),
}

impl AppendError {
    /// Whether the message can never be appended as it is (retrying changes nothing).
    pub fn is_refusal(&self) -> bool {
        use receipts_ledger::LedgerError as L;
        match self {
            Self::Ledger(L::ReceiptRejected { .. } | L::FieldMismatch { .. } | L::InvalidField { .. }) => true,
            Self::Ledger(_) | Self::Object(_) => false,
            Self::NoBody | Self::Body(_) | Self::Base64(_) | Self::JobId(_) | Self::Receipt(_) | Self::JobMismatch { .. } => true,
            Self::OtherReceipt { .. } => true,
        }
    }

    /// The failed check's name (`policy`, `receipt_signature`, …; `message` for a malformed
    /// message, `store` for an infrastructure failure).
    pub fn check(&self) -> &str {
        use receipts_ledger::LedgerError as L;
        let named = |reason: &str| -> &'static str {
            // A refusal reads "<check>: <reason>" (receipts_ledger::ReceiptCheckError).
            const CHECKS: [&str; 10] = [
                "receipt", "attestation", "policy", "receipt_key_id", "receipt_signature", "attestation_hash", "fleet_key",
                "pcrs", "fields", "receipt_check",
            ];
            CHECKS.iter().find(|c| reason.strip_prefix(**c).is_some_and(|r| r.starts_with(": "))).copied().unwrap_or("receipt_check")
        };
        match self {
            Self::Receipt(reason) | Self::Ledger(L::ReceiptRejected { reason, .. }) => named(reason),
            Self::JobMismatch { .. } => "job_id",
            Self::OtherReceipt { .. } => "other_receipt",
            Self::Ledger(L::FieldMismatch { .. } | L::InvalidField { .. }) => "fields",
            Self::NoBody | Self::Body(_) | Self::Base64(_) | Self::JobId(_) => "message",
            Self::Ledger(_) | Self::Object(_) => "store",
        }
    }
}

/// What became of one message.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Newly appended (not for a job the ledger already held).
    Appended(&'a IndexedFields),
    /// Refused for good: acknowledged, never appended.
    Refused { message_id: &'a str, error: &'a AppendError },
}

/// Appends every message of the batch; the response lists the ones that failed for a reason
/// that may pass (they return to the queue and, after the redrive limit, go to the dead-letter
/// queue). Refused messages are not listed: they are done.
pub fn handle<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
) -> SqsBatchResponse {
    handle_with(event, ledger, check, jobs, now_ms, &mut |_| {})
}

/// [`handle`], telling `outcome` of each receipt newly appended (what the Lambda counts in its
/// metrics) and each message refused.
pub fn handle_with<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    outcome: &mut dyn FnMut(Outcome<'_>),
) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in &event.records {
        let mut appended = |fields: &IndexedFields| outcome(Outcome::Appended(fields));
        let result = append_one(message, ledger, check, jobs, now_ms, &mut appended);
        let id = message.message_id.clone().unwrap_or_default();
        if let Err(error) = result {
            if error.is_refusal() {
                tracing::warn!(message = %id, check = error.check(), %error, "receipt refused for good; not retried");
                outcome(Outcome::Refused { message_id: &id, error: &error });
                continue;
            }
            tracing::warn!(message = %id, %error, "receipt not appended; retried");
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
    }
    if let Err(error) = ledger.tick(now_ms) {
        tracing::warn!(%error, "checkpoint not signed");
    }
    response
}

fn append_one<S: LedgerStore>(
    message: &SqsMessage,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    appended: &mut dyn FnMut(&IndexedFields),
) -> Result<u64, AppendError> {
    let body = message.body.as_deref().ok_or(AppendError::NoBody)?;
    let parsed: LedgerMessage = serde_json::from_str(body).map_err(|e| AppendError::Body(e.to_string()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let leaf = b64.decode(&parsed.receipt).map_err(|_| AppendError::Base64("receipt"))?;
    let document = b64.decode(&parsed.attestation_document).map_err(|_| AppendError::Base64("attestation_document"))?;
    let job = JobId::from_hex(&parsed.job_id).ok_or_else(|| AppendError::JobId(parsed.job_id.clone()))?;
    let fields = check.check(&leaf, &document).map_err(AppendError::Receipt)?;
    if fields.job_id != job.to_hex() {
        return Err(AppendError::JobMismatch { message: job.to_hex(), receipt: fields.job_id });
    }
    let outcome = ledger.append(AppendRequest { leaf, fields: fields.clone(), attestation_document: document }, now_ms)?;
    match outcome {
        AppendOutcome::Appended { .. } => appended(&fields),
        AppendOutcome::Existing { index, same_leaf: false } => {
            // `ledgered.json` must not claim this receipt is in: the entry is another one.
            tracing::error!(alarm = "ledger_holds_another_receipt", job = %job, index, "a second receipt for a ledgered job");
            return Err(AppendError::OtherReceipt { job: job.to_hex(), index });
        }
        AppendOutcome::Existing { .. } => {}
    }
    let marker = Ledgered { job_id: job.to_hex(), index: outcome.index(), appended_ms: now_ms };
    match jobs.put(&layout::job_ledgered(&job), &serde_json::to_vec_pretty(&marker).expect("serialises"), PutCondition::Overwrite) {
        Ok(_) => {}
        // The entry is in; a deployment that marks inputs otherwise (an object tag) denies
        // this write, and the receipt must not be retried for it.
        Err(error @ cloud::ObjectError::AccessDenied { .. }) => tracing::warn!(job = %job, %error, "ledgered.json not written"),
        Err(error) => return Err(error.into()),
    }
    tracing::info!(job = %job, index = outcome.index(), "receipt in the ledger");
    Ok(outcome.index())
}

// ---- the function -------------------------------------------------------------------------

/// What the function is given: its two buckets, its signer, its cache directory, the
/// attestation root receipts must chain to and the signed policies their documents must satisfy.
pub struct FunctionConfig {
    /// The ledger's bucket (C2SP tlog-tiles at its root).
    pub ledger: Arc<dyn ObjectStore>,
    /// Where `jobs/<id>/ledgered.json` goes.
    pub jobs: Arc<dyn ObjectStore>,
    pub signer: Box<dyn NoteSigner>,
    /// The SQLite cache (`ledger-cache.sqlite`), rebuilt from the bucket when missing or behind.
    pub cache_dir: PathBuf,
    pub root: TrustAnchor,
    /// The allow-list (verified): the image measurements receipts are admitted under.
    pub policies: PolicySet,
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
    Policies(#[from] receipts_ledger::PolicySetError),
}

/// The `ledger-append` function as it lives between invocations: the ledger on S3 with its
/// cache, and what checks receipts. The `lambda_runtime` binary serves it; against an emulator
/// `ephem-batch dev aws-pump` invokes the same value with the SQS event Lambda would build.
pub struct LedgerFunction {
    ledger: Mutex<Ledger<TileStore>>,
    /// The ledger's own check, shared (one document cache).
    check: Arc<ProtocolReceipts>,
    jobs: Arc<dyn ObjectStore>,
}

impl LedgerFunction {
    /// Opens the ledger in its bucket and brings the cache up to the bucket's checkpoint.
    pub fn open(config: FunctionConfig, bucket: &str) -> Result<LedgerFunction, FunctionError> {
        let check = Arc::new(ProtocolReceipts::enforcing(config.root, config.policies)?);
        let fail = |source| FunctionError::Ledger { bucket: bucket.to_owned(), source };
        let verifier = config.signer.verifier();
        let mut store =
            TileStore::open(config.ledger, Layout::new(""), cache_file(&config.cache_dir), verifier.clone(), TileOptions::appender())
                .map_err(fail)?;
        let head = store.refresh().map_err(fail)?;
        tracing::info!(ledger_key = %verifier, size = head.map_or(0, |h| h.size), "ledger-append ready");
        let ledger = Ledger::new(store, Box::new(check.clone()), config.signer, CheckpointPolicy::default());
        Ok(LedgerFunction { ledger: Mutex::new(ledger), check, jobs: config.jobs })
    }

    /// The Lambda's configuration from its environment (docs/operations.md §6):
    /// `EPHEM_LEDGER_BUCKET`, `EPHEM_LEDGER_KEY_ARN` (or `EPHEM_LEDGER_SIGNING_KEY`),
    /// `EPHEM_JOBS_BUCKET`, `EPHEM_LEDGER_CACHE_DIR`, `EPHEM_ATTESTATION_ROOT_PEM`, and the
    /// policies' `EPHEM_IMAGE_PUBLISHER_KEY`, `EPHEM_POLICIES_BUCKET`, `EPHEM_POLICIES_PREFIX`.
    pub fn from_env(clients: &AwsClients) -> Result<LedgerFunction, ShellError> {
        let bucket = shell::var("EPHEM_LEDGER_BUCKET")?;
        let jobs = shell::var("EPHEM_JOBS_BUCKET")?;
        let root = shell::attestation_root()?;
        let policies = crate::policies::policies_from_env(clients)?;
        let config = FunctionConfig {
            ledger: Arc::new(clients.object_store(&bucket, "")),
            jobs: Arc::new(clients.object_store(&jobs, "")),
            signer: crate::ledger_signer::from_env(clients, &bucket)?,
            cache_dir: PathBuf::from(shell::optional("EPHEM_LEDGER_CACHE_DIR").unwrap_or_else(|| DEFAULT_CACHE_DIR.into())),
            root,
            policies,
        };
        LedgerFunction::open(config, &bucket).map_err(|e| ShellError::Setup(e.to_string()))
    }

    /// One invocation: the batch appended, partial failures reported, and one CloudWatch EMF
    /// line per receipt newly appended (the dashboard's jobs/min and documents/s).
    pub fn invoke(&self, event: &SqsEvent, now_ms: u64) -> SqsBatchResponse {
        // A panic in an earlier invocation cannot leave the ledger half-written: every append
        // is a transaction and the bucket is the truth.
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        handle_with(event, &mut ledger, &self.check, self.jobs.as_ref(), now_ms, &mut |outcome| {
            if let Outcome::Appended(fields) = outcome {
                crate::metrics::emit_ledgered(now_ms, fields.ok_count, fields.failed_count)
            }
        })
    }

    /// The key the function's checkpoints verify under.
    pub fn verifier(&self) -> VerifierKey {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).verifier()
    }
}

/// Where the Lambda keeps its cache unless `EPHEM_LEDGER_CACHE_DIR` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/tmp/ephem-ledger";

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use cloud::local::DirObjectStore;
    use receipts_ledger::store::tiles::{layout::Layout, read_head, Cache, TileOptions};
    use receipts_ledger::testing::DevEnclave;
    use receipts_ledger::{CheckpointPolicy, ProtocolReceipts, SignerKey, TileStore};

    const T: u64 = 1_761_955_200_000;

    fn message(id: &str, body: &str) -> serde_json::Value {
        serde_json::json!({
            "messageId": id, "receiptHandle": format!("h-{id}"), "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1", "MessageGroupId": "ledger",
                           "MessageDeduplicationId": id},
            "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:ledger.fifo", "awsRegion": "us-east-1"
        })
    }

    fn body(job_id: &str, receipt: &[u8], document: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD;
        serde_json::to_string(&LedgerMessage {
            job_id: job_id.into(),
            receipt: b64.encode(receipt),
            attestation_document: b64.encode(document),
        })
        .unwrap()
    }

    fn publisher() -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[0x51; 32])
    }

    /// The appender's check: `images`' policies, signed by the publisher.
    fn enforcing(images: &[&DevEnclave]) -> Arc<ProtocolReceipts> {
        let signed = images.iter().map(|e| ("policy.json".to_owned(), e.policy(&publisher()))).collect();
        let set = PolicySet::verify(&publisher().verifying_key(), signed).unwrap();
        Arc::new(ProtocolReceipts::enforcing(images[0].anchor(), set).unwrap())
    }

    struct Run {
        failed: Vec<String>,
        refused: Vec<(String, String)>,
        appended: Vec<String>,
    }

    fn run(event: serde_json::Value, ledger: &mut Ledger<TileStore>, check: &ProtocolReceipts, jobs: &dyn ObjectStore) -> Run {
        let event: SqsEvent = serde_json::from_value(event).unwrap();
        let (mut refused, mut appended) = (Vec::new(), Vec::new());
        let response = handle_with(&event, ledger, check, jobs, T + 1, &mut |o| match o {
            Outcome::Appended(f) => appended.push(f.job_id.clone()),
            Outcome::Refused { message_id, error } => refused.push((message_id.to_owned(), error.check().to_owned())),
        });
        let failed = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        Run { failed, refused, appended }
    }

    fn bucket_ledger(bucket: Arc<dyn ObjectStore>, check: Arc<ProtocolReceipts>) -> Ledger<TileStore> {
        let signer = SignerKey::from_seed("ledger.example", &[1; 32]).unwrap();
        let store = TileStore::open(bucket, Layout::new(""), Cache::Memory, signer.verifier(), TileOptions::appender()).unwrap();
        Ledger::new(store, Box::new(check), Box::new(signer), CheckpointPolicy::default())
    }

    /// The Lambda's path: a real-shaped SQS batch into the tlog-tiles ledger in a bucket.
    #[test]
    fn a_batch_lands_in_the_bucket_ledger_with_refusals_named_and_not_retried() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let e = DevEnclave::new(2, T);
        let check = enforcing(&[&e]);
        let mut ledger = bucket_ledger(bucket.clone(), check.clone());

        let leaf = |j: u64| e.sign(&e.receipt(j));
        let id = |j: u64| format!("{j:032x}");
        let mut forged = leaf(3);
        forged[20] ^= 1;
        let records = vec![
            message("m1", &body(&id(1), &leaf(1), &e.document)),
            message("m2", "not json"),
            message("m3", &body(&id(3), &forged, &e.document)),
            message("m4", &body(&id(9), &leaf(4), &e.document)), // names another job
            message("m5", &body(&id(5), &leaf(5), &e.document)),
            message("m6", &body(&id(1), &leaf(1), &e.document)), // re-delivered: no second entry
        ];
        let r = run(serde_json::json!({ "Records": records }), &mut ledger, &check, &jobs);
        // Retrying would fail the same way and hold back the FIFO group: none goes back.
        assert_eq!(r.failed, Vec::<String>::new());
        let refused: Vec<(&str, &str)> = r.refused.iter().map(|(m, c)| (m.as_str(), c.as_str())).collect();
        assert_eq!(refused, vec![("m2", "message"), ("m3", "receipt"), ("m4", "job_id")]);
        // The metrics count each job once: the re-delivered m6 appended nothing.
        assert_eq!(r.appended, vec![id(1), id(5)]);

        let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
        assert_eq!(head.size, 2);
        let marker: Ledgered = serde_json::from_slice(&jobs.get(&layout::job_ledgered(&JobId::from_hex(&id(5)).unwrap())).unwrap()).unwrap();
        assert_eq!(marker.index, 1);
    }

    /// A second, different receipt for a job the ledger holds (another attempt): refused and
    /// alarmed, and `ledgered.json` keeps naming the entry actually held.
    #[test]
    fn a_different_receipt_for_a_ledgered_job_is_an_alarm_not_a_success() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let e = DevEnclave::new(2, T);
        let check = enforcing(&[&e]);
        let mut ledger = bucket_ledger(bucket, check.clone());
        let job = format!("{:032x}", 7);
        let first = e.sign(&e.receipt(7));
        let mut other = e.receipt(7);
        other.attempt += 1;
        let records = vec![
            message("first", &body(&job, &first, &e.document)),
            message("other", &body(&job, &e.sign(&other), &e.document)),
            message("again", &body(&job, &first, &e.document)),
        ];
        let r = run(serde_json::json!({ "Records": records }), &mut ledger, &check, &jobs);
        assert_eq!(r.refused, vec![("other".to_owned(), "other_receipt".to_owned())]);
        assert_eq!((r.failed.len(), r.appended), (0, vec![job.clone()]), "the same receipt again is a quiet success");
        let entry = ledger.store().entry_by_job(&job).unwrap().unwrap();
        assert_eq!((entry.index, entry.leaf), (0, first));
    }

    /// A host runs its own image on genuine hardware and sends a receipt for the victim's job
    /// id ahead of the genuine one, in the same batch.
    #[test]
    fn ledger_refuses_a_receipt_from_another_image() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let genuine = DevEnclave::new(2, T);
        let squatter = DevEnclave::with_image(2, 0xee, T);
        let check = enforcing(&[&genuine]);
        let mut ledger = bucket_ledger(bucket, check.clone());
        let job = format!("{:032x}", 5);
        let records = vec![
            message("evil", &body(&job, &squatter.sign(&squatter.receipt(5)), &squatter.document)),
            message("good", &body(&job, &genuine.sign(&genuine.receipt(5)), &genuine.document)),
        ];
        let r = run(serde_json::json!({ "Records": records }), &mut ledger, &check, &jobs);
        assert_eq!(r.refused, vec![("evil".to_owned(), "policy".to_owned())]);
        assert_eq!((r.failed.len(), r.appended), (0, vec![job.clone()]));
        let entry = ledger.store().entry_by_job(&job).unwrap().unwrap();
        assert_eq!((entry.index, entry.fields.pcr0), (0, hex::encode(genuine.pcrs[0])));
        let id = receipts_ledger::policy_id(&genuine.policy(&publisher()));
        assert_eq!(entry.fields.policy, Some(hex::encode(id)));
    }

    #[test]
    fn the_function_refuses_to_start_on_a_policy_for_another_root() {
        let tmp = tempfile::tempdir().unwrap();
        let store = |d: &str| -> Arc<dyn ObjectStore> { Arc::new(DirObjectStore::open(tmp.path().join(d)).unwrap()) };
        let foreign = DevEnclave::new(3, T);
        let set = PolicySet::verify(&publisher().verifying_key(), vec![("p.json".into(), foreign.policy(&publisher()))]).unwrap();
        let config = FunctionConfig {
            ledger: store("ledger"),
            jobs: store("jobs"),
            signer: Box::new(SignerKey::from_seed("ledger.example", &[1; 32]).unwrap()),
            cache_dir: tmp.path().join("cache"),
            root: DevEnclave::new(2, T).anchor(),
            policies: set,
        };
        let err = LedgerFunction::open(config, "ledger").err().expect("refused");
        assert!(matches!(err, FunctionError::Policies(receipts_ledger::PolicySetError::Root { .. })), "{err}");
    }
}
