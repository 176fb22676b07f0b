//! `ledger-append`: a batch from the ledger queue (FIFO, one group, deduplicated by job id) →
//! receipts verified and appended to the ledger, with partial batch failure reporting.
//!
//! Each message is a [`LedgerMessage`]: the receipt's exact COSE bytes and the attestation
//! document it names. The ledger's [`ReceiptCheck`] verifies the document (at its own time), the
//! binding of the receipt key, and the receipt signature; the ledger holds at most one entry per
//! job, so a re-delivered message is a no-op. After the append, `jobs/<id>/ledgered.json` records
//! the index (the input-expiry rule keys off it).
//!
//! [`LedgerFunction`] is the whole function — the ledger on S3 (C2SP tlog-tiles, its SQLite
//! index as a cache) behind [`handle_with`] and the metrics — which the `lambda_runtime` binary
//! serves and `ephem-batch dev aws-pump` invokes against an emulator.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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
    #[error("ledger: {0}")]
    Ledger(#[from] receipts_ledger::LedgerError),
    #[error("jobs store: {0}")]
    Object(#[from] cloud::ObjectError),
}

/// Appends every message of the batch; the response lists the ones that failed (they return to
/// the queue and, after the redrive limit, go to the dead-letter queue).
pub fn handle<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
) -> SqsBatchResponse {
    handle_with(event, ledger, check, jobs, now_ms, &mut |_| {})
}

/// [`handle`], calling `appended` with the fields of each receipt it newly appends (not for one
/// the ledger already held): what the Lambda counts in its metrics.
pub fn handle_with<S: LedgerStore>(
    event: &SqsEvent,
    ledger: &mut Ledger<S>,
    check: &dyn ReceiptCheck,
    jobs: &dyn ObjectStore,
    now_ms: u64,
    appended: &mut dyn FnMut(&IndexedFields),
) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in &event.records {
        if let Err(error) = append_one(message, ledger, check, jobs, now_ms, appended) {
            let id = message.message_id.clone().unwrap_or_default();
            tracing::warn!(message = %id, %error, "receipt not appended");
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
    if matches!(outcome, AppendOutcome::Appended { .. }) {
        appended(&fields);
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

/// What the function is given: its two buckets, its signer, its cache directory and the
/// attestation root receipts must chain to.
pub struct FunctionConfig {
    /// The ledger's bucket (C2SP tlog-tiles at its root).
    pub ledger: Arc<dyn ObjectStore>,
    /// Where `jobs/<id>/ledgered.json` goes.
    pub jobs: Arc<dyn ObjectStore>,
    pub signer: Box<dyn NoteSigner>,
    /// The SQLite cache (`ledger-cache.sqlite`), rebuilt from the bucket when missing or behind.
    pub cache_dir: PathBuf,
    pub root: TrustAnchor,
}

#[derive(Debug, thiserror::Error)]
#[error("ledger in {bucket}: {source}")]
pub struct FunctionError {
    pub bucket: String,
    #[source]
    pub source: receipts_ledger::TileError,
}

/// The `ledger-append` function as it lives between invocations: the ledger on S3 with its
/// cache, and what checks receipts. The `lambda_runtime` binary serves it; against an emulator
/// `ephem-batch dev aws-pump` invokes the same value with the SQS event Lambda would build.
pub struct LedgerFunction {
    ledger: Mutex<Ledger<TileStore>>,
    check: ProtocolReceipts,
    jobs: Arc<dyn ObjectStore>,
}

impl LedgerFunction {
    /// Opens the ledger in its bucket and brings the cache up to the bucket's checkpoint.
    pub fn open(config: FunctionConfig, bucket: &str) -> Result<LedgerFunction, FunctionError> {
        let fail = |source| FunctionError { bucket: bucket.to_owned(), source };
        let verifier = config.signer.verifier();
        let mut store =
            TileStore::open(config.ledger, Layout::new(""), cache_file(&config.cache_dir), verifier.clone(), TileOptions::appender())
                .map_err(fail)?;
        let head = store.refresh().map_err(fail)?;
        tracing::info!(ledger_key = %verifier, size = head.map_or(0, |h| h.size), "ledger-append ready");
        let ledger =
            Ledger::new(store, Box::new(ProtocolReceipts::new(config.root.clone())), config.signer, CheckpointPolicy::default());
        Ok(LedgerFunction { ledger: Mutex::new(ledger), check: ProtocolReceipts::new(config.root), jobs: config.jobs })
    }

    /// The Lambda's configuration from its environment (docs/operations.md §6):
    /// `EPHEM_LEDGER_BUCKET`, `EPHEM_LEDGER_KEY_ARN` (or `EPHEM_LEDGER_SIGNING_KEY`),
    /// `EPHEM_JOBS_BUCKET`, `EPHEM_LEDGER_CACHE_DIR`, `EPHEM_ATTESTATION_ROOT_PEM`.
    pub fn from_env(clients: &AwsClients) -> Result<LedgerFunction, ShellError> {
        let bucket = shell::var("EPHEM_LEDGER_BUCKET")?;
        let jobs = shell::var("EPHEM_JOBS_BUCKET")?;
        let config = FunctionConfig {
            ledger: Arc::new(clients.object_store(&bucket, "")),
            jobs: Arc::new(clients.object_store(&jobs, "")),
            signer: crate::ledger_signer::from_env(clients, &bucket)?,
            cache_dir: PathBuf::from(shell::optional("EPHEM_LEDGER_CACHE_DIR").unwrap_or_else(|| DEFAULT_CACHE_DIR.into())),
            root: shell::attestation_root()?,
        };
        LedgerFunction::open(config, &bucket).map_err(|e| ShellError::Setup(e.to_string()))
    }

    /// One invocation: the batch appended, partial failures reported, and one CloudWatch EMF
    /// line per receipt newly appended (the dashboard's jobs/min and documents/s).
    pub fn invoke(&self, event: &SqsEvent, now_ms: u64) -> SqsBatchResponse {
        // A panic in an earlier invocation cannot leave the ledger half-written: every append
        // is a transaction and the bucket is the truth.
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        handle_with(event, &mut ledger, &self.check, self.jobs.as_ref(), now_ms, &mut |fields| {
            crate::metrics::emit_ledgered(now_ms, fields.ok_count, fields.failed_count)
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

    /// The Lambda's path: a real-shaped SQS batch into the tlog-tiles ledger in a bucket.
    #[test]
    fn a_batch_lands_in_the_bucket_ledger_with_failures_reported_by_message() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(DirObjectStore::open(tmp.path().join("ledger")).unwrap());
        let jobs = DirObjectStore::open(tmp.path().join("jobs")).unwrap();
        let e = DevEnclave::new(2, T);
        let signer = SignerKey::from_seed("ledger.example", &[1; 32]).unwrap();
        let store = TileStore::open(bucket.clone(), Layout::new(""), Cache::Memory, signer.verifier(), TileOptions::appender())
            .unwrap();
        let mut ledger =
            Ledger::new(store, Box::new(ProtocolReceipts::new(e.anchor())), Box::new(signer), CheckpointPolicy::default());
        let check = ProtocolReceipts::new(e.anchor());

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
        let event: SqsEvent = serde_json::from_value(serde_json::json!({ "Records": records })).unwrap();
        let mut appended = Vec::new();
        let response = handle_with(&event, &mut ledger, &check, &jobs, T + 1, &mut |f| appended.push(f.job_id.clone()));
        let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        assert_eq!(failed, vec!["m2", "m3", "m4"]);
        // The metrics count each job once: the re-delivered m6 appended nothing.
        assert_eq!(appended, vec![id(1), id(5)]);
        let response = serde_json::to_value(&response).unwrap();
        assert_eq!(response["batchItemFailures"][0]["itemIdentifier"], "m2");

        let head = read_head(bucket.as_ref(), &Layout::new(""), &ledger.verifier()).unwrap().unwrap();
        assert_eq!(head.size, 2);
        let marker: Ledgered = serde_json::from_slice(&jobs.get(&layout::job_ledgered(&JobId::from_hex(&id(5)).unwrap())).unwrap()).unwrap();
        assert_eq!(marker.index, 1);
    }
}
