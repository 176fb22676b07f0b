#![forbid(unsafe_code)]
//! `ledger-append`: the ledger FIFO queue → `lambdas::ledger_append` → the ledger in its
//! bucket (C2SP tlog-tiles, `receipts_ledger::store::tiles`), with partial batch failures.
//! Reserved concurrency 1 keeps it the only writer; the checkpoint's compare-and-swap keeps
//! the ledger whole even if two ever ran. Each receipt newly appended also prints one CloudWatch
//! EMF line (`lambdas::metrics`): `JobsLedgered`, `Documents`, `DocumentsFailed`.
//!
//! Environment: `EPHEM_LEDGER_BUCKET`, `EPHEM_LEDGER_KEY_ARN` (or, on an emulator,
//! `EPHEM_LEDGER_SIGNING_KEY`), `EPHEM_JOBS_BUCKET`; the signed policies receipts must satisfy
//! (`lambdas::policies`: `EPHEM_IMAGE_PUBLISHER_KEY`, `EPHEM_POLICIES_BUCKET`, optional
//! `EPHEM_POLICIES_PREFIX`) — without them it does not start; optional `EPHEM_LEDGER_ORIGIN`,
//! `EPHEM_ATTESTATION_ROOT_PEM`, `EPHEM_LEDGER_CACHE_DIR` (default `/tmp/ephem-ledger`: the
//! SQLite cache, rebuilt from the bucket whenever it is missing or behind); `EPHEM_LEDGER_QUEUE_URL`
//! and `EPHEM_LEDGER_DLQ_URL`, where it settles the messages it does not finish (a retry's
//! backoff, a held receipt dead-lettered; `lambdas::ledger_append`).

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambdas::ledger_append::LedgerFunction;
use lambdas::shell;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    shell::init_logging();
    let init = || LedgerFunction::from_env(&shell::aws()?);
    shell::serve("EphemBatch.LedgerAppendError", init, |function: &LedgerFunction, event: SqsEvent| {
        let response: SqsBatchResponse = function.invoke(&event, cloud::now_ms());
        Ok::<_, std::convert::Infallible>(response)
    })
    .await
}
