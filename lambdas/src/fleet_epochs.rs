//! The fleet-key epochs stored under `fleet-keys/` (DESIGN.md §3). Enclaves create them — a
//! worker has KMS generate the key pair for itself and attests its genesis (docs/protocol.md
//! §7.3.2) — and hosts store the record create-only; nothing here can make one.

use cloud::{layout, ObjectError, Services};
use protocol::fleet::{epoch_object_key, EpochRecord};

/// Largest epoch record read (a few hundred bytes; anyone who can write the store chooses sizes).
const MAX_RECORD_LEN: u64 = 64 * 1024;

/// Every readable epoch record in the store, oldest first (a record that does not parse, or
/// sits under another epoch's name, is skipped).
pub fn epochs(services: &Services) -> Result<Vec<EpochRecord>, ObjectError> {
    let mut records = Vec::new();
    for meta in services.attestations.list(layout::FLEET_KEYS_PREFIX)? {
        match services.attestations.get_at_most(&meta.key, MAX_RECORD_LEN) {
            Ok(bytes) => match EpochRecord::from_json(&bytes) {
                Ok(record) if epoch_object_key(record.epoch) == meta.key => records.push(record),
                _ => tracing::warn!(key = %meta.key, "skipping an unreadable fleet epoch record"),
            },
            Err(ObjectError::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    records.sort_by_key(|r| r.epoch);
    Ok(records)
}
