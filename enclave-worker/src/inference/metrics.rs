//! Counters of an [`Engine`](super::Engine): lock-free, cumulative since the engine was built.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters (shared by all windows of an engine).
#[derive(Debug, Default)]
pub struct Metrics {
    documents: AtomicU64,
    failed: AtomicU64,
    real_tokens: AtomicU64,
    padded_tokens: AtomicU64,
    batches: AtomicU64,
    windows: AtomicU64,
    tokenize_ns: AtomicU64,
    model_ns: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Records embedded successfully.
    pub documents: u64,
    /// Records that became per-record errors.
    pub failed: u64,
    /// Tokens of embedded records (`[CLS]`/`[SEP]` included, after truncation).
    pub real_tokens: u64,
    /// Tokens the model processed, padding included: Σ batch size × padded length with the
    /// CandleBert backend; equal to `real_tokens` with the fused backend, which packs sequences.
    pub padded_tokens: u64,
    pub batches: u64,
    pub windows: u64,
    /// Wall time spent tokenizing (all threads of the pool work on it together).
    pub tokenize: Duration,
    /// Wall time spent in the model: tensor building, forward pass, pooling, normalisation.
    pub model: Duration,
}

impl Metrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            documents: get(&self.documents),
            failed: get(&self.failed),
            real_tokens: get(&self.real_tokens),
            padded_tokens: get(&self.padded_tokens),
            batches: get(&self.batches),
            windows: get(&self.windows),
            tokenize: Duration::from_nanos(get(&self.tokenize_ns)),
            model: Duration::from_nanos(get(&self.model_ns)),
        }
    }

    pub(crate) fn add_window(&self, tokenize: Duration) {
        self.windows.fetch_add(1, Ordering::Relaxed);
        self.tokenize_ns.fetch_add(tokenize.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_failed(&self, n: u64) {
        self.failed.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_batch(&self, documents: u64, real_tokens: u64, padded_tokens: u64, model: Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.documents.fetch_add(documents, Ordering::Relaxed);
        self.real_tokens.fetch_add(real_tokens, Ordering::Relaxed);
        self.padded_tokens.fetch_add(padded_tokens, Ordering::Relaxed);
        self.model_ns.fetch_add(model.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl MetricsSnapshot {
    /// Share of the processed tokens that were padding.
    pub fn padded_fraction(&self) -> f64 {
        if self.padded_tokens == 0 {
            0.0
        } else {
            (self.padded_tokens - self.real_tokens) as f64 / self.padded_tokens as f64
        }
    }

    /// Counters accumulated since `earlier` (a snapshot of the same engine).
    pub fn since(&self, earlier: &MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            documents: self.documents - earlier.documents,
            failed: self.failed - earlier.failed,
            real_tokens: self.real_tokens - earlier.real_tokens,
            padded_tokens: self.padded_tokens - earlier.padded_tokens,
            batches: self.batches - earlier.batches,
            windows: self.windows - earlier.windows,
            tokenize: self.tokenize.saturating_sub(earlier.tokenize),
            model: self.model.saturating_sub(earlier.model),
        }
    }
}
