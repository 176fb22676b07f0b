//! A job sealed to an epoch this host's image does not hold, while a live host of another image
//! holds it — the overlap of an image update: the job is handed over as a fresh message, so its
//! receives are not spent on hosts that can never open it (each receive counts towards the
//! queue's dead-letter limit, and a job whose limit runs out on the wrong hosts would be lost).
//!
//! "Live holder": a published current document, renewed within [`HOLDER_FRESH`], whose binding
//! names the job's epoch and whose host is not this one. Read unverified: a host lying here can
//! only delay the job (it is handed over until [`MAX_EARLIER_RECEIVES`] receives), and
//! the enclave checks every sealed byte as always.

use std::time::Duration;

use cloud::{layout, ObjectError, Services, MAX_SMALL_OBJECT};
use protocol::attestation::{AttestationDocument, UserDataBinding};

use crate::retry;

/// A document renewed within this long marks a running host (they renew every 30 minutes).
pub(crate) const HOLDER_FRESH: Duration = Duration::from_secs(65 * 60);
/// How long a handed-over copy waits, after `receives` receives in all: 10 s after the first,
/// doubling to at most a minute — so a holder busy for long is not outwaited by spent receives,
/// and a free one gets the job within a minute (the host that handed it over may take it back and
/// hand it over again meanwhile).
pub(crate) fn handover_delay(receives: u32) -> Duration {
    Duration::from_secs(5 << receives.min(4)).min(Duration::from_secs(60))
}
/// Past this many receives in all, a job is not handed over again: it takes the ordinary path
/// to a terminal status (the dead-letter queue). With [`handover_delay`], over 90 minutes: more
/// than a draining host's 30.
pub(crate) const MAX_EARLIER_RECEIVES: u32 = 100;

/// The published document key of a live host, other than `own_host`'s, whose binding names
/// `epoch`.
pub(crate) fn live_holder(services: &Services, epoch: u64, own_host: &str, now_ms: u64) -> Result<Option<String>, ObjectError> {
    let store = &services.attestations;
    let own = layout::attestation_current(own_host);
    for meta in retry::transient("list published documents", || store.list(layout::ATTESTATIONS_CURRENT_PREFIX))? {
        if meta.key == own || meta.modified_ms + (HOLDER_FRESH.as_millis() as u64) < now_ms {
            continue;
        }
        let bytes = match retry::transient("get published document", || store.get_at_most(&meta.key, MAX_SMALL_OBJECT)) {
            Ok(bytes) => bytes,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        };
        let binding = AttestationDocument::parse_unverified(&bytes)
            .ok()
            .and_then(|d| d.user_data)
            .and_then(|user_data| UserDataBinding::decode(&user_data).ok());
        if binding.is_some_and(|b| b.epoch == epoch) {
            return Ok(Some(meta.key));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handovers_back_off_to_a_minute_and_cover_a_drain() {
        let delays: Vec<u64> = (1..=6).map(|n| handover_delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 60, 60, 60]);
        let covered: u64 = (1..MAX_EARLIER_RECEIVES).map(|n| handover_delay(n).as_secs()).sum();
        assert!(covered > 90 * 60, "{covered} s");
    }
}
