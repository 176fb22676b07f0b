//! Creating a fleet epoch inside the enclave (docs/protocol.md §7.3.1).
//!
//! An epoch whose wrapped key came from anywhere but KMS's key-pair generation could be a key
//! the operator knows: a key policy that denies `Encrypt` today may have allowed it yesterday,
//! and KMS ciphertext does not say how it was made. So the worker makes the epoch itself:
//! 1. it reads the KMS key's `DescribeKey`, `GetKeyPolicy` and `ListGrants` through its own TLS
//!    session and runs the key checks against its own PCR0 (`protocol::key_checks`): from now on,
//!    only an enclave of this image can ever have a key generated under it;
//! 2. it asks KMS for `GenerateDataKeyPair` with a `Recipient` document: the private key arrives
//!    only in the envelope to its one-shot key, through the same kind of session;
//! 3. it attests a genesis binding — the public key, epoch, `not_after`, the key's ARN and the
//!    evidence's digest — so a client holding only the image publisher's policy can decide
//!    offline that nobody outside the image has the private key.

use protocol::attestation::GenesisBinding;
use protocol::envelope::FleetSecretKey;
use protocol::fleet::{EpochGenesis, EpochRecord, MAX_EPOCH_LIFETIME_MS};
use protocol::key_checks;
use protocol::kms_arn::KmsKeyArn;

use super::{FleetEpoch, KeyReleaseError, KmsTransport, RsaKeyPool, attested_call, kms_error, parse_published_key, relayed};
use crate::nsm::{AttestationRequest, Nsm};

/// A new epoch: the key the worker now holds, the record the host stores and the proof of how
/// the key came to be.
pub struct CreatedEpoch {
    pub secret: FleetSecretKey,
    pub record: EpochRecord,
    pub genesis: EpochGenesis,
}

/// Creates `epoch` under `kms_key` (see the module documentation). Checks, in order:
/// `fleet_epoch_expired`, `fleet_epoch_lifetime` (at most [`MAX_EPOCH_LIFETIME_MS`] from the
/// NSM's clock), `fleet_key_checks`, `kms_failed`/`kms_region`/…, `fleet_kms_key` (KMS answered
/// for the key asked), `cms`, `invalid_pkcs8`, `fleet_key_mismatch` (the public key KMS sent is the
/// one derived from the private key).
pub fn create_fleet_epoch<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    kms_key: &KmsKeyArn,
    epoch: FleetEpoch,
) -> Result<CreatedEpoch, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    let now_ms = nsm.now_ms();
    epoch.check_current(now_ms)?;
    if epoch.not_after_ms - now_ms > MAX_EPOCH_LIFETIME_MS {
        return Err(KeyReleaseError::FleetEpochLifetime {
            epoch: epoch.epoch,
            not_after_ms: epoch.not_after_ms,
            now_ms,
            max_days: MAX_EPOCH_LIFETIME_MS / 86_400_000,
        });
    }
    let evidence = transport.key_evidence(kms_key).map_err(kms_error)?;
    let pcr0 = nsm.pcrs().get(&0).cloned().unwrap_or_default();
    let report = key_checks::evaluate(&evidence, kms_key, &pcr0);
    if !report.passed() {
        return Err(KeyReleaseError::FleetKeyChecks(report.failures()));
    }
    let context = epoch.encryption_context();
    let (answer, pkcs8) = attested_call(
        nsm,
        pool.take()?,
        |document| epoch.check_current(document.timestamp_ms),
        |document| {
            let answer = transport.generate_data_key_pair(kms_key, context, document).map_err(kms_error)?;
            let envelope = answer.ciphertext_for_recipient.clone().unwrap_or_default();
            Ok((answer, envelope))
        },
    )?;
    if answer.key_id != kms_key.as_str() {
        return Err(KeyReleaseError::FleetKmsKey(format!("asked KMS key {kms_key}, but KMS answered for {}", relayed(&answer.key_id))));
    }
    let secret = FleetSecretKey::from_pkcs8_der(&pkcs8).map_err(|_| KeyReleaseError::InvalidPkcs8)?;
    drop(pkcs8);
    let public = secret.public_key();
    let point: [u8; 65] = public.to_bytes().try_into().map_err(|_| KeyReleaseError::InvalidPkcs8)?;
    let sent = parse_published_key(&answer.public_key)?;
    if sent != point {
        return Err(KeyReleaseError::FleetKeyMismatch {
            derived: hex::encode(public.key_id()),
            published: hex::encode(protocol::keys::key_id(&sent)),
        });
    }
    let binding = GenesisBinding {
        fleet_public_key: point,
        epoch: epoch.epoch,
        not_after_ms: epoch.not_after_ms,
        kms_key: kms_key.clone(),
        evidence_digest: evidence.digest(),
    };
    let document = nsm.attest(AttestationRequest::genesis(&binding))?;
    let record = EpochRecord {
        epoch: epoch.epoch,
        not_after_ms: epoch.not_after_ms,
        kms_key_id: kms_key.to_string(),
        public_key: hex::encode(point),
        wrapped_private_key: hex::encode(&answer.private_key_ciphertext_blob),
    };
    let genesis = EpochGenesis { epoch: epoch.epoch, document: hex::encode(document), key_evidence: evidence };
    Ok(CreatedEpoch { secret, record, genesis })
}
