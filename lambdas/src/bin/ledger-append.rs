#![forbid(unsafe_code)]
//! `ledger-append`: the ledger FIFO queue → `lambdas::ledger_append` → the ledger in its
//! bucket (C2SP tlog-tiles, `receipts_ledger::store::tiles`), with partial batch failures.
//! Reserved concurrency 1 keeps it the only writer; the checkpoint's compare-and-swap keeps
//! the ledger whole even if two ever ran. Each receipt newly appended also prints one CloudWatch
//! EMF line (`lambdas::metrics`): `JobsLedgered`, `Documents`, `DocumentsFailed`.
//!
//! Environment: `EPHEM_LEDGER_BUCKET`, `EPHEM_LEDGER_KEY_ARN` (or, on an emulator,
//! `EPHEM_LEDGER_SIGNING_KEY`), `EPHEM_JOBS_BUCKET`; optional `EPHEM_LEDGER_ORIGIN`,
//! `EPHEM_ATTESTATION_ROOT_PEM`, `EPHEM_LEDGER_CACHE_DIR` (default `/tmp/ephem-ledger`: the
//! SQLite cache, rebuilt from the bucket whenever it is missing or behind).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambdas::{ledger_append, metrics};
use lambdas::shell::{self, ShellError};
use receipts_ledger::store::tiles::{cache_file, layout::Layout, TileOptions};
use receipts_ledger::{CheckpointPolicy, Ledger, ProtocolReceipts, TileStore};

struct App {
    ledger: Mutex<Ledger<TileStore>>,
    check: ProtocolReceipts,
    jobs: Arc<dyn cloud::ObjectStore>,
}

fn init() -> Result<App, ShellError> {
    let bucket = shell::var("EPHEM_LEDGER_BUCKET")?;
    shell::var("EPHEM_JOBS_BUCKET")?;
    let clients = shell::aws()?;
    let signer = lambdas::ledger_signer::from_env(&clients, &bucket)?;
    let cache = PathBuf::from(shell::optional("EPHEM_LEDGER_CACHE_DIR").unwrap_or_else(|| "/tmp/ephem-ledger".into()));
    let objects = Arc::new(clients.object_store(&bucket, ""));
    let mut store = TileStore::open(objects, Layout::new(""), cache_file(&cache), signer.verifier(), TileOptions::appender())
        .map_err(|e| ShellError::Setup(format!("ledger in {bucket}: {e}")))?;
    let head = store.refresh().map_err(|e| ShellError::Setup(format!("ledger in {bucket}: {e}")))?;
    tracing::info!(ledger_key = %signer.verifier(), size = head.map_or(0, |h| h.size), "ledger-append ready");
    let root = shell::attestation_root()?;
    let ledger = Ledger::new(store, Box::new(ProtocolReceipts::new(root.clone())), signer, CheckpointPolicy::default());
    Ok(App { ledger: Mutex::new(ledger), check: ProtocolReceipts::new(root), jobs: shell::services(&clients).jobs })
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    shell::serve("EphemBatch.LedgerAppendError", init, |app: &App, event: SqsEvent| {
        // A panic in an earlier invocation cannot leave the ledger half-written: every append
        // is a transaction and the bucket is the truth.
        let mut ledger = app.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let now = cloud::now_ms();
        // One EMF line per receipt newly appended: the dashboard's jobs/min and documents/s.
        let response: SqsBatchResponse =
            ledger_append::handle_with(&event, &mut ledger, &app.check, app.jobs.as_ref(), now, &mut |fields| {
                metrics::emit_ledgered(now, fields.ok_count, fields.failed_count)
            });
        Ok::<_, std::convert::Infallible>(response)
    })
    .await
}
