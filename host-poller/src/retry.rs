//! Backoff with jitter: for transient store, queue and KMS errors inside one operation, and for
//! the visibility delay before a failed job is tried again. Jitter keeps a fleet of hosts that
//! failed together from retrying together.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Errors that say whether trying again may help.
pub trait Transient: std::fmt::Display {
    fn is_transient(&self) -> bool;
}

impl Transient for cloud::ObjectError {
    fn is_transient(&self) -> bool {
        cloud::ObjectError::is_transient(self)
    }
}

impl Transient for cloud::QueueError {
    fn is_transient(&self) -> bool {
        cloud::QueueError::is_transient(self)
    }
}

impl Transient for cloud::KmsError {
    fn is_transient(&self) -> bool {
        cloud::KmsError::is_transient(self)
    }
}

impl Transient for cloud::workflow::BulkTaskError {
    fn is_transient(&self) -> bool {
        cloud::workflow::BulkTaskError::is_transient(self)
    }
}

/// Tries of one operation before a transient error is given up on.
const TRIES: u32 = 5;
const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(3);

/// Runs `op` until it succeeds, fails permanently, or has failed transiently [`TRIES`] times.
pub fn transient<T, E: Transient>(what: &str, mut op: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let mut try_number = 1;
    loop {
        match op() {
            Err(error) if error.is_transient() && try_number < TRIES => {
                let delay = jittered(exponential(FIRST_DELAY, try_number, MAX_DELAY));
                tracing::debug!(what, %error, try_number, ?delay, "transient error, trying again");
                std::thread::sleep(delay);
                try_number += 1;
            }
            other => return other,
        }
    }
}

/// `base · 2^(n-1)`, at most `max` (`n` counts from 1).
pub fn exponential(base: Duration, n: u32, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(n.saturating_sub(1).min(20)).unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(max)
}

/// Somewhere in `[d/2, d]`: "equal jitter".
pub fn jittered(delay: Duration) -> Duration {
    let half = delay / 2;
    let spread = half.as_millis() as u64;
    if spread == 0 {
        return delay;
    }
    half + Duration::from_millis(random_u64() % (spread + 1))
}

/// Not for cryptography: std's per-process random hash keys are enough to spread retries.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Flaky(bool);
    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "flaky")
        }
    }
    impl Transient for Flaky {
        fn is_transient(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let s = Duration::from_secs;
        assert_eq!(exponential(s(1), 1, s(60)), s(1));
        assert_eq!(exponential(s(1), 4, s(60)), s(8));
        assert_eq!(exponential(s(1), 40, s(60)), s(60));
        for _ in 0..100 {
            let d = jittered(s(10));
            assert!(d >= s(5) && d <= s(10), "{d:?}");
        }
    }

    #[test]
    fn retries_transient_errors_only() {
        let mut calls = 0;
        let result: Result<u8, Flaky> = transient("test", || {
            calls += 1;
            if calls < 3 { Err(Flaky(true)) } else { Ok(7) }
        });
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls, 3);
        let mut calls = 0;
        let result: Result<u8, Flaky> = transient("test", || {
            calls += 1;
            Err(Flaky(false))
        });
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
