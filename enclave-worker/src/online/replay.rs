//! The replay window (RFC 9458 §6.5): a request is answered once, and only within
//! [`WINDOW_MS`] of the time its client says it was sent. Within the window, the request's
//! encapsulated key (fresh per request) is remembered; older requests are refused by their time,
//! so nothing older needs remembering.

use std::collections::{HashSet, VecDeque};

/// How far a request's sent time may be from the enclave's clock, either way.
pub const WINDOW_MS: u64 = 60_000;
/// Requests remembered at most; beyond it new requests are refused, not old ones forgotten.
pub const CAPACITY: usize = 200_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayRefusal {
    #[error("sent at {sent_ms} ms, enclave time {now_ms} ms: outside the {WINDOW_MS} ms window")]
    OutsideWindow { sent_ms: u64, now_ms: u64 },
    #[error("this request was answered before")]
    Seen,
    #[error("{CAPACITY} requests in the window already; try again shortly")]
    Full,
}

#[derive(Default)]
pub struct ReplayCache {
    seen: HashSet<Vec<u8>>,
    /// (expiry, key), oldest first.
    order: VecDeque<(u64, Vec<u8>)>,
}

impl ReplayCache {
    /// Admits a request once.
    pub fn admit(&mut self, encapsulated_key: &[u8], sent_ms: u64, now_ms: u64) -> Result<(), ReplayRefusal> {
        if sent_ms.abs_diff(now_ms) > WINDOW_MS {
            return Err(ReplayRefusal::OutsideWindow { sent_ms, now_ms });
        }
        while self.order.front().is_some_and(|(expiry, _)| *expiry < now_ms) {
            if let Some((_, key)) = self.order.pop_front() {
                self.seen.remove(&key);
            }
        }
        if self.seen.contains(encapsulated_key) {
            return Err(ReplayRefusal::Seen);
        }
        if self.seen.len() >= CAPACITY {
            return Err(ReplayRefusal::Full);
        }
        // Remembered until its sent time has left the window.
        self.seen.insert(encapsulated_key.to_vec());
        self.order.push_back((sent_ms.max(now_ms) + WINDOW_MS, encapsulated_key.to_vec()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_admitted_once_and_only_in_the_window() {
        let mut cache = ReplayCache::default();
        assert_eq!(cache.admit(b"k1", 100_000, 100_000), Ok(()));
        assert_eq!(cache.admit(b"k1", 100_000, 100_500), Err(ReplayRefusal::Seen));
        assert_eq!(cache.admit(b"k2", 30_000, 100_000), Err(ReplayRefusal::OutsideWindow { sent_ms: 30_000, now_ms: 100_000 }));
        assert_eq!(cache.admit(b"k3", 170_000, 100_000), Err(ReplayRefusal::OutsideWindow { sent_ms: 170_000, now_ms: 100_000 }));
        // Once k1's sent time is out of the window it is refused by time, and forgotten.
        assert!(matches!(cache.admit(b"k1", 100_000, 170_001), Err(ReplayRefusal::OutsideWindow { .. })));
        assert_eq!(cache.admit(b"k4", 170_001, 170_001), Ok(()));
        assert!(!cache.seen.contains(b"k1".as_slice()));
    }
}
