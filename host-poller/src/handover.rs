//! A job sealed to an epoch this host's image does not hold, while a live host of another image
//! holds it — the overlap of an image update: the job is handed over as a fresh message, so its
//! receives are not spent on hosts that can never open it (each receive counts towards the
//! queue's dead-letter limit, and a job whose limit runs out on the wrong hosts would be lost).
//!
//! "Live holder": a published current document, renewed within [`HOLDER_FRESH`], whose binding
//! names the job's epoch and whose host is not this one. Read unverified: a host lying here can
//! only delay the job (it is handed over at most [`MAX_EARLIER_RECEIVES`] receives' worth), and
//! the enclave checks every sealed byte as always.

use std::time::Duration;

use cloud::{layout, ObjectError, Services, MAX_SMALL_OBJECT};
use protocol::attestation::{AttestationDocument, UserDataBinding};

use crate::retry;

/// A document renewed within this long marks a running host (they renew every 30 minutes).
pub(crate) const HOLDER_FRESH: Duration = Duration::from_secs(65 * 60);
/// A handed-over copy waits this long, so the host that handed it over does not take it back
/// before the holder has polled.
pub(crate) const HANDOVER_DELAY: Duration = Duration::from_secs(5);
/// Past this many receives in all, a job is not handed over again: it takes the ordinary path
/// to a terminal status (the dead-letter queue).
pub(crate) const MAX_EARLIER_RECEIVES: u32 = 50;

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
