//! Usage receipts of online requests (docs/protocol.md §9.5): control collects them from the
//! worker (`CollectUsage` every [`UsageSettings::interval`]; the worker may also send them unasked)
//! and each goes to the ledger queue under its usage id, as a job's receipt goes under its job id.
//!
//! A receipt is signed and public, and the ledger checks all of it; the host reads only the id
//! that names it in the queue. One the queue does not take is kept and sent again at the next
//! collection, up to [`MAX_PENDING`]; past that the oldest is dropped and logged — a gap in the
//! enclave's usage sequence, which `ephem-batch ledger query` reports.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud::messages::LedgerMessage;
use cloud::Queue;
use protocol::usage::SignedUsageReceipt;
use protocol::JobId;

use crate::retry;

/// Receipts waiting for the ledger queue at most.
pub const MAX_PENDING: usize = 4096;

static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Receipts received from the worker since the process started.
pub fn received_count() -> u64 {
    RECEIVED.load(Ordering::Relaxed)
}

/// When control collects usage receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSettings {
    pub interval: Duration,
    /// Ask the worker to end its open periods at each collection (`CollectUsage {flush}`): receipts
    /// within seconds rather than after the minute ends (the development stack).
    pub flush_each: bool,
}

impl Default for UsageSettings {
    fn default() -> Self {
        Self { interval: Duration::from_secs(60), flush_each: false }
    }
}

/// Receipts on their way to the ledger queue.
pub(crate) struct UsageDelivery {
    queue: Arc<dyn Queue>,
    pending: Mutex<VecDeque<(JobId, String)>>,
}

impl UsageDelivery {
    pub fn new(queue: Arc<dyn Queue>) -> Self {
        Self { queue, pending: Mutex::new(VecDeque::new()) }
    }

    /// One receipt from the worker, and the attestation document that vouches for its key.
    pub fn received(&self, receipt: &[u8], attestation_document: &[u8]) {
        RECEIVED.fetch_add(1, Ordering::Relaxed);
        // Only the id is read; a receipt that does not even decode would be refused by the
        // ledger, so it is not sent.
        let usage_id = match SignedUsageReceipt::decode(receipt) {
            Ok(signed) => JobId(signed.usage_id()),
            Err(error) => {
                tracing::warn!(%error, receipt_bytes = receipt.len(), "worker sent a usage receipt that does not decode; dropped");
                return;
            }
        };
        let body = serde_json::to_string(&LedgerMessage::new(&usage_id, receipt, attestation_document))
            .expect("a ledger message serialises");
        let mut pending = self.lock();
        if pending.len() >= MAX_PENDING
            && let Some((dropped, _)) = pending.pop_front()
        {
            tracing::error!(alarm = "usage_receipt_dropped", usage = %dropped, "usage receipts pile up unsent; the oldest is dropped");
        }
        pending.push_back((usage_id, body));
    }

    /// Sends what is pending, in order, until the queue refuses one (kept for next time).
    pub fn send_pending(&self) {
        let mut pending = self.lock();
        while let Some((usage_id, body)) = pending.front() {
            let options = LedgerMessage::send_options(usage_id);
            match retry::transient("send usage receipt", || self.queue.send(body, &options)) {
                Ok(_) => {
                    tracing::info!(usage = %usage_id, "usage receipt sent to the ledger queue");
                    pending.pop_front();
                }
                Err(error) => {
                    tracing::warn!(%error, pending = pending.len(), "usage receipts not sent; kept for the next collection");
                    return;
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(JobId, String)>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}
