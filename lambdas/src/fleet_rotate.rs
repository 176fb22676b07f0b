//! `fleet-rotate`: starts a new fleet-key epoch (DESIGN.md §3). KMS generates the P-256 key pair
//! and returns only the public key and the wrapped private key, so the private key exists only
//! inside KMS and inside enclaves. The epoch record goes to `fleet-keys/epoch-<N>.json`,
//! create-only: two concurrent rotations cannot both claim epoch N. Older epochs stay usable until
//! their own `not_after`, so jobs sealed to them still open.

use cloud::{layout, KmsError, ObjectError, PutCondition, Services};
use p256::pkcs8::DecodePublicKey;
use protocol::envelope::FleetPublicKey;
use protocol::fleet::{encryption_context, epoch_object_key, EpochRecord};

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("KMS: {0}")]
    Kms(#[from] KmsError),
    #[error("attestations store: {0}")]
    Object(#[from] ObjectError),
    #[error("KMS returned a public key that is not a P-256 SubjectPublicKeyInfo")]
    PublicKey,
    #[error("epoch {0} was created by a concurrent rotation; retry")]
    Raced(u64),
}

/// The newest epoch record in the store, if any (records that do not parse are skipped).
pub fn epochs(services: &Services) -> Result<Vec<EpochRecord>, ObjectError> {
    let mut records = Vec::new();
    for meta in services.attestations.list(layout::FLEET_KEYS_PREFIX)? {
        match services.attestations.get(&meta.key) {
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

/// Creates epoch `newest + 1`, valid for `validity_ms` from `now_ms`.
pub fn rotate(services: &Services, validity_ms: u64, now_ms: u64) -> Result<EpochRecord, RotateError> {
    let epoch = epochs(services)?.last().map_or(1, |r| r.epoch + 1);
    let not_after_ms = now_ms + validity_ms;
    let pair = services
        .kms
        .generate_data_key_pair_without_plaintext(&services.keys.fleet, &encryption_context(epoch, not_after_ms))?;
    let public = p256::PublicKey::from_public_key_der(&pair.public_key_der).map_err(|_| RotateError::PublicKey)?;
    let point = p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&public, false);
    let fleet = FleetPublicKey::from_bytes(point.as_bytes()).map_err(|_| RotateError::PublicKey)?;
    let record = EpochRecord {
        epoch,
        not_after_ms,
        kms_key_id: pair.key_id,
        public_key: hex::encode(fleet.to_bytes()),
        wrapped_private_key: hex::encode(&pair.private_key_ciphertext_blob),
    };
    match services.attestations.put(&epoch_object_key(epoch), record.to_json().as_bytes(), PutCondition::CreateOnly) {
        Ok(_) => {
            tracing::info!(epoch, not_after_ms, "fleet epoch created");
            Ok(record)
        }
        Err(ObjectError::AlreadyExists { .. }) => Err(RotateError::Raced(epoch)),
        Err(error) => Err(error.into()),
    }
}

/// The newest epoch still valid `margin_ms` from now.
pub fn current_epoch(services: &Services, now_ms: u64, margin_ms: u64) -> Result<Option<EpochRecord>, ObjectError> {
    Ok(epochs(services)?.into_iter().rfind(|r| r.not_after_ms > now_ms + margin_ms))
}
