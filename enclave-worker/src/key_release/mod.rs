//! Attested key release (DESIGN.md §3): how the worker obtains the fleet private key of an epoch
//! and model data keys from KMS without the host ever seeing them.
//!
//! One release:
//! 1. take a fresh [`OneShotKey`] (RSA-2048, generated inside the worker, ahead of time by an
//!    [`RsaKeyPool`]);
//! 2. ask the NSM for a document whose `public_key` is that key's SPKI
//!    ([`AttestationRequest::key_release`]: nothing else goes into the request);
//! 3. send KMS `Decrypt` with `Recipient` = that document ([`KmsTransport`]: the worker has no
//!    network; [`kms_https`] calls KMS over TLS that ends in the worker, through a byte relay on
//!    the host, with credentials the host supplies on the control connection);
//! 4. open the `CiphertextForRecipient` (BER CMS EnvelopedData) with the one-shot key, which is
//!    destroyed by that one use.
//!
//! On top of it, [`release_fleet_key`] enforces the epoch's encryption context
//! {epoch, not_after}, refuses a key whose `not_after` has passed (no rollback to an old epoch),
//! names the KMS key by its ARN and refuses an answer from another key (`fleet_kms_key`: the
//! ARN is then bound into the published document, where clients compare it with their
//! deployment's), parses the PKCS#8 P-256 private key and derives its public key itself;
//! [`release_data_key`] releases a model's 32-byte DEK under {model_id, version}.
//!
//! CMS carries no MAC and the recipient key is public: anyone who sees the document can seal
//! *something* to it. That is why the answer must come through a TLS session with KMS that ends
//! in the worker ([`kms_https`]): a host relaying frames could otherwise hand the worker a fleet
//! key of its own, which the worker would then attest to. On top of that, the fleet key is
//! checked against the public key the epoch publishes, and a DEK by the AEAD and hashes of the
//! model files it opens.
//!
//! Every error names the check that failed ([`KeyReleaseError::check`]).

use std::collections::BTreeMap;

use protocol::attestation::AttestationDocument;
use protocol::cms::CmsError;
use protocol::envelope::FleetSecretKey;
use protocol::fleet::EpochRecord;
use protocol::key_checks::KeyEvidence;
use protocol::kms_api::GenerateDataKeyPairResponse;
use protocol::kms_arn::KmsKeyArn;
use protocol::manifest::Manifest;
use zeroize::Zeroizing;

use crate::nsm::{AttestationRequest, Nsm, NsmError};

pub mod genesis;
pub mod kms_https;

pub use crate::one_shot_key::{KeyGenerationError, OneShotKey, RSA_BITS, RsaKeyPool};

/// Length of a model data key (AES-256 / HKDF input).
pub const DATA_KEY_LEN: usize = 32;
/// Longest text kept from a host-relayed KMS error.
const MAX_RELAYED_TEXT: usize = 512;

/// Why a key was not released. Each variant names the check that failed ([`check`](Self::check)).
#[derive(Debug, thiserror::Error)]
pub enum KeyReleaseError {
    /// No one-shot key could be generated.
    #[error("key_generation: {0}")]
    KeyGeneration(#[from] KeyGenerationError),
    /// The NSM failed to attest.
    #[error("nsm: {0}")]
    Nsm(#[from] NsmError),
    /// The NSM's document does not carry exactly the one-shot key (never sent to KMS).
    #[error("attestation_public_key: {0}")]
    AttestationPublicKey(String),
    /// KMS refused (e.g. the key policy's attestation condition did not match).
    #[error("kms_failed: {code}: {message}")]
    KmsFailed { code: String, message: String },
    /// The host did not deliver the call or KMS's answer.
    #[error("kms_transport: {0}")]
    KmsTransport(String),
    /// The TLS session to KMS failed: the server did not prove to be KMS under the pinned roots.
    #[error("kms_tls: {0}")]
    KmsTls(String),
    /// What came back through the TLS session is not a KMS answer.
    #[error("kms_http: {0}")]
    KmsHttp(String),
    /// The `CiphertextForRecipient` did not open with the one-shot key (wrong recipient,
    /// tampering, a replayed envelope, or not the KMS CMS profile).
    #[error("cms: {0}")]
    Cms(#[from] CmsError),
    /// The released plaintext has the wrong length.
    #[error("wrong_length: released {what} is {actual} bytes; expected {expected}")]
    WrongLength { what: &'static str, expected: usize, actual: usize },
    /// An encryption context is not of the required form.
    #[error("encryption_context: {0}")]
    EncryptionContext(String),
    /// The fleet epoch record is unusable (bad hex).
    #[error("fleet_epoch_record: {0}")]
    EpochRecord(String),
    /// The fleet key's epoch has ended by the NSM's clock.
    #[error("fleet_epoch_expired: epoch {epoch} ended at {not_after_ms} ms; the NSM clock reads {now_ms} ms")]
    FleetEpochExpired { epoch: u64, not_after_ms: u64, now_ms: u64 },
    /// The released fleet key is not a PKCS#8 P-256 private key.
    #[error("invalid_pkcs8: the released fleet key is not a PKCS#8 P-256 private key")]
    InvalidPkcs8,
    /// The published public key given for comparison is not a P-256 public key.
    #[error("invalid_published_key: the epoch's published public key is not a P-256 point or SPKI")]
    InvalidPublishedKey,
    /// The public key derived from the released private key is not the epoch's published one.
    #[error("fleet_key_mismatch: derived fleet key {derived} but the epoch publishes {published}")]
    FleetKeyMismatch { derived: String, published: String },
    /// The epoch names no KMS key ARN, or KMS answered for another key than the one asked.
    #[error("fleet_kms_key: {0}")]
    FleetKmsKey(String),
    /// Refused before connecting: the host's credentials are for another region than the key's,
    /// or the key's partition has no KMS endpoint the worker knows.
    #[error("kms_region: {0}")]
    KmsRegion(String),
    /// The key a new epoch would be generated under fails the key checks (`protocol::key_checks`).
    #[error("fleet_key_checks: {0}")]
    FleetKeyChecks(String),
    /// A new epoch's `not_after` is past the longest epoch lifetime.
    #[error("fleet_epoch_lifetime: epoch {epoch} would end at {not_after_ms} ms, more than {max_days} days after {now_ms} ms")]
    FleetEpochLifetime { epoch: u64, not_after_ms: u64, now_ms: u64, max_days: u64 },
}

impl KeyReleaseError {
    /// The name of the failed check.
    pub fn check(&self) -> &'static str {
        match self {
            KeyReleaseError::KeyGeneration(_) => "key_generation",
            KeyReleaseError::Nsm(_) => "nsm",
            KeyReleaseError::AttestationPublicKey(_) => "attestation_public_key",
            KeyReleaseError::KmsFailed { .. } => "kms_failed",
            KeyReleaseError::KmsTransport(_) => "kms_transport",
            KeyReleaseError::KmsTls(_) => "kms_tls",
            KeyReleaseError::KmsHttp(_) => "kms_http",
            KeyReleaseError::Cms(_) => "cms",
            KeyReleaseError::WrongLength { .. } => "wrong_length",
            KeyReleaseError::EncryptionContext(_) => "encryption_context",
            KeyReleaseError::EpochRecord(_) => "fleet_epoch_record",
            KeyReleaseError::FleetEpochExpired { .. } => "fleet_epoch_expired",
            KeyReleaseError::InvalidPkcs8 => "invalid_pkcs8",
            KeyReleaseError::InvalidPublishedKey => "invalid_published_key",
            KeyReleaseError::FleetKeyMismatch { .. } => "fleet_key_mismatch",
            KeyReleaseError::FleetKmsKey(_) => "fleet_kms_key",
            KeyReleaseError::KmsRegion(_) => "kms_region",
            KeyReleaseError::FleetKeyChecks(_) => "fleet_key_checks",
            KeyReleaseError::FleetEpochLifetime { .. } => "fleet_epoch_lifetime",
        }
    }
}

/// A KMS call that did not return an envelope: KMS's error (the `KmsFailed` frame: e.g.
/// `AccessDeniedException` when the key policy's `kms:RecipientAttestation:*` condition does not
/// match), or code [`KmsTransportError::TRANSPORT`] when the request or its answer did not get
/// through the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct KmsTransportError {
    pub code: String,
    pub message: String,
}

impl KmsTransportError {
    /// The code for "the host did not deliver the call or its answer".
    pub const TRANSPORT: &'static str = "transport";

    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        KmsTransportError { code: code.into(), message: message.into() }
    }
}

/// The worker's KMS calls (`Recipient` with RSAES_OAEP_SHA_256), through the host.
pub trait KmsTransport {
    /// `Decrypt`: returns KMS's key id (ARN) and `CiphertextForRecipient`.
    fn decrypt(
        &mut self,
        key_id: Option<String>,
        ciphertext_blob: Vec<u8>,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<(String, Vec<u8>), KmsTransportError>;

    /// `DescribeKey`, `GetKeyPolicy` and `ListGrants` of `key` (genesis only).
    fn key_evidence(&mut self, key: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        Err(KmsTransportError::new(KmsTransportError::TRANSPORT, format!("this transport cannot read key {key}")))
    }

    /// `GenerateDataKeyPair` (ECC_NIST_P256) of `key` to the recipient (genesis only).
    fn generate_data_key_pair(
        &mut self,
        key: &KmsKeyArn,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        let _ = (encryption_context, recipient_attestation);
        Err(KmsTransportError::new(KmsTransportError::TRANSPORT, format!("this transport cannot generate key pairs of {key}")))
    }
}

impl<T: KmsTransport + ?Sized> KmsTransport for &mut T {
    fn decrypt(
        &mut self,
        key_id: Option<String>,
        ciphertext_blob: Vec<u8>,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<(String, Vec<u8>), KmsTransportError> {
        (**self).decrypt(key_id, ciphertext_blob, encryption_context, recipient_attestation)
    }

    fn key_evidence(&mut self, key: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        (**self).key_evidence(key)
    }

    fn generate_data_key_pair(
        &mut self,
        key: &KmsKeyArn,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        (**self).generate_data_key_pair(key, encryption_context, recipient_attestation)
    }
}

impl<T: KmsTransport + ?Sized> KmsTransport for Box<T> {
    fn decrypt(
        &mut self,
        key_id: Option<String>,
        ciphertext_blob: Vec<u8>,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<(String, Vec<u8>), KmsTransportError> {
        (**self).decrypt(key_id, ciphertext_blob, encryption_context, recipient_attestation)
    }

    fn key_evidence(&mut self, key: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        (**self).key_evidence(key)
    }

    fn generate_data_key_pair(
        &mut self,
        key: &KmsKeyArn,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        (**self).generate_data_key_pair(key, encryption_context, recipient_attestation)
    }
}

/// Releases `ciphertext_blob` through KMS to a one-shot key from `pool` (see the module
/// documentation). The plaintext is zeroized on drop.
pub fn release<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    key_id: Option<String>,
    ciphertext_blob: Vec<u8>,
    encryption_context: BTreeMap<String, String>,
) -> Result<Zeroizing<Vec<u8>>, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    release_with_key(nsm, pool.take()?, transport, key_id, ciphertext_blob, encryption_context)
}

/// [`release`] with a one-shot key the caller took (or generated) itself.
pub fn release_with_key<N, T>(
    nsm: &N,
    key: OneShotKey,
    transport: &mut T,
    key_id: Option<String>,
    ciphertext_blob: Vec<u8>,
    encryption_context: BTreeMap<String, String>,
) -> Result<Zeroizing<Vec<u8>>, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    release_checked(nsm, key, transport, key_id, ciphertext_blob, encryption_context, |_| Ok(())).map(|(_, plaintext)| plaintext)
}

/// The release, with a check on the NSM's own document before anything goes to KMS. Returns the
/// key id KMS answered with (read inside the worker's TLS session) and the plaintext.
pub(crate) fn release_checked<N, T>(
    nsm: &N,
    key: OneShotKey,
    transport: &mut T,
    key_id: Option<String>,
    ciphertext_blob: Vec<u8>,
    encryption_context: BTreeMap<String, String>,
    before_kms: impl FnOnce(&AttestationDocument) -> Result<(), KeyReleaseError>,
) -> Result<(String, Zeroizing<Vec<u8>>), KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    attested_call(nsm, key, before_kms, |document| {
        transport.decrypt(key_id, ciphertext_blob, encryption_context, document).map_err(kms_error)
    })
}

/// One KMS call with a `Recipient`: the NSM's document for `key` (checked to carry exactly that
/// key, then by `before_kms`), the call, which returns its answer and the envelope, and the
/// envelope opened with the one-shot key (consumed whatever the outcome).
pub(crate) fn attested_call<N, A>(
    nsm: &N,
    key: OneShotKey,
    before_kms: impl FnOnce(&AttestationDocument) -> Result<(), KeyReleaseError>,
    call: impl FnOnce(Vec<u8>) -> Result<(A, Vec<u8>), KeyReleaseError>,
) -> Result<(A, Zeroizing<Vec<u8>>), KeyReleaseError>
where
    N: Nsm + ?Sized,
{
    let document = nsm.attest(AttestationRequest::key_release(&key))?;
    // Our own NSM's output read back (not anyone else's): it must carry exactly our key.
    let parsed = AttestationDocument::parse_unverified(&document)
        .map_err(|e| KeyReleaseError::AttestationPublicKey(format!("the NSM document does not parse: {e}")))?;
    if parsed.public_key.as_deref() != Some(key.public_key_der()) || parsed.user_data.is_some() {
        return Err(KeyReleaseError::AttestationPublicKey(
            "the NSM document's public_key or user_data differ from the request".into(),
        ));
    }
    before_kms(&parsed)?;
    let (answer, envelope) = call(document)?;
    Ok((answer, key.open(&envelope)?))
}

/// A failed KMS call, by the check it names.
pub(crate) fn kms_error(e: KmsTransportError) -> KeyReleaseError {
    match e.code.as_str() {
        KmsTransportError::TRANSPORT => KeyReleaseError::KmsTransport(relayed(&e.message)),
        kms_https::TLS_CHECK => KeyReleaseError::KmsTls(relayed(&e.message)),
        kms_https::HTTP_CHECK => KeyReleaseError::KmsHttp(relayed(&e.message)),
        kms_https::REGION_CHECK => KeyReleaseError::KmsRegion(relayed(&e.message)),
        _ => KeyReleaseError::KmsFailed { code: relayed(&e.code), message: relayed(&e.message) },
    }
}

/// Host-relayed text, cut to a bounded length for logs.
pub(crate) fn relayed(text: &str) -> String {
    text.chars().take(MAX_RELAYED_TEXT).collect()
}

// ---------------------------------------------------------------------------------------------
// Fleet keys

/// A fleet key epoch as its encryption context names it: `{"epoch": "<decimal>", "not_after":
/// "<decimal unix ms>"}`, exactly these two keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetEpoch {
    pub epoch: u64,
    /// End of the epoch, ms since the UNIX epoch: the key is refused from this instant on.
    pub not_after_ms: u64,
}

impl FleetEpoch {
    pub const EPOCH: &'static str = "epoch";
    pub const NOT_AFTER: &'static str = "not_after";

    /// The encryption context KMS checks (the one the rotation step generated the key under).
    pub fn encryption_context(&self) -> BTreeMap<String, String> {
        protocol::fleet::encryption_context(self.epoch, self.not_after_ms)
    }

    /// Strict inverse of [`encryption_context`](Self::encryption_context): exactly the two keys,
    /// canonical decimals (no sign, no leading zeros, no spaces).
    pub fn from_encryption_context(context: &BTreeMap<String, String>) -> Result<FleetEpoch, KeyReleaseError> {
        if context.len() != 2 {
            return Err(KeyReleaseError::EncryptionContext(format!(
                "a fleet key context has exactly the keys \"epoch\" and \"not_after\"; got {:?}",
                context.keys().collect::<Vec<_>>()
            )));
        }
        let field = |name: &str| {
            let text = context.get(name).ok_or_else(|| {
                KeyReleaseError::EncryptionContext(format!("missing \"{name}\" in a fleet key context"))
            })?;
            parse_decimal(text).ok_or_else(|| {
                KeyReleaseError::EncryptionContext(format!("\"{name}\" is {text:?}, not a canonical decimal u64"))
            })
        };
        Ok(FleetEpoch { epoch: field(Self::EPOCH)?, not_after_ms: field(Self::NOT_AFTER)? })
    }

    /// `fleet_epoch_expired` unless `now_ms < not_after_ms`.
    pub fn check_current(&self, now_ms: u64) -> Result<(), KeyReleaseError> {
        if self.not_after_ms <= now_ms {
            return Err(KeyReleaseError::FleetEpochExpired {
                epoch: self.epoch,
                not_after_ms: self.not_after_ms,
                now_ms,
            });
        }
        Ok(())
    }
}

fn parse_decimal(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if canonical { text.parse().ok() } else { None }
}

/// Releases the fleet private key of an epoch from its record (`fleet-keys/epoch-<N>.json`,
/// relayed by the host): KMS key ARN, wrapped key and context from the record, and the record's
/// published public key checked against the one derived from the released private key. See
/// [`release_fleet_key_parts`] for the checks. Everything in the record is the host's choice,
/// the KMS key included: what makes the result trustworthy is that the ARN KMS answered with is
/// bound into the published document for clients to compare with their deployment's.
pub fn release_fleet_key<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    record: &EpochRecord,
) -> Result<ReleasedFleetKey, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    let wrapped = record.wrapped().map_err(|e| KeyReleaseError::EpochRecord(e.to_string()))?;
    let published =
        hex::decode(&record.public_key).map_err(|_| KeyReleaseError::EpochRecord("public_key is not hex".into()))?;
    let kms_key = record.kms_key_id.parse::<KmsKeyArn>().map_err(|e| KeyReleaseError::FleetKmsKey(e.to_string()))?;
    let epoch = FleetEpoch { epoch: record.epoch, not_after_ms: record.not_after_ms };
    let secret = release_fleet_key_parts(nsm, pool, transport, &kms_key, wrapped, epoch, Some(&published))?;
    Ok(ReleasedFleetKey { secret, kms_key })
}

/// A fleet private key and the KMS key that released it (the one KMS answered with).
pub struct ReleasedFleetKey {
    pub secret: FleetSecretKey,
    pub kms_key: KmsKeyArn,
}

/// Releases the fleet private key of `epoch` from its wrapped form (`PrivateKeyCiphertextBlob`
/// of `GenerateDataKeyPairWithoutPlaintext`, ECC_NIST_P256) under the context
/// {"epoch", "not_after"}.
///
/// Checks, in order: `fleet_epoch_expired` (by `nsm.now_ms()`, then again by the timestamp of the
/// NSM-signed document made for this release — the NSM's own clock — before anything is sent to
/// KMS), `kms_failed`, `fleet_kms_key` (KMS's answer names exactly `kms_key`, which the request
/// named as `KeyId`), `cms`, `invalid_pkcs8`, and, when `published_public_key` is given (SEC1
/// point or SPKI DER, as KMS returns it), `fleet_key_mismatch` against the public key derived
/// here from the released private key.
pub fn release_fleet_key_parts<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    kms_key: &KmsKeyArn,
    wrapped_private_key: Vec<u8>,
    epoch: FleetEpoch,
    published_public_key: Option<&[u8]>,
) -> Result<FleetSecretKey, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    epoch.check_current(nsm.now_ms())?;
    let published = published_public_key.map(parse_published_key).transpose()?;
    let key = pool.take()?;
    let (answered_by, pkcs8) = release_checked(
        nsm,
        key,
        transport,
        Some(kms_key.to_string()),
        wrapped_private_key,
        epoch.encryption_context(),
        |document| epoch.check_current(document.timestamp_ms),
    )?;
    if answered_by != kms_key.as_str() {
        return Err(KeyReleaseError::FleetKmsKey(format!(
            "asked KMS key {kms_key}, but KMS answered for {}",
            relayed(&answered_by)
        )));
    }
    let secret = FleetSecretKey::from_pkcs8_der(&pkcs8).map_err(|_| KeyReleaseError::InvalidPkcs8)?;
    drop(pkcs8);
    let public = secret.public_key();
    if let Some(published) = published
        && published != public.to_bytes()
    {
        return Err(KeyReleaseError::FleetKeyMismatch {
            derived: hex::encode(public.key_id()),
            published: hex::encode(protocol::keys::key_id(&published)),
        });
    }
    Ok(secret)
}

/// A published P-256 public key (SEC1, compressed or not, or SPKI DER) as the 65-byte
/// uncompressed point.
pub(crate) fn parse_published_key(bytes: &[u8]) -> Result<Vec<u8>, KeyReleaseError> {
    use p256::elliptic_curve::sec1::ToSec1Point;
    use p256::pkcs8::DecodePublicKey;
    let key = p256::PublicKey::from_sec1_bytes(bytes)
        .or_else(|_| p256::PublicKey::from_public_key_der(bytes))
        .map_err(|_| KeyReleaseError::InvalidPublishedKey)?;
    Ok(key.to_sec1_point(false).as_bytes().to_vec())
}

// ---------------------------------------------------------------------------------------------
// Model data keys

/// The encryption context of a model DEK: `{"model_id": <id>, "version": "<decimal>"}`.
pub fn data_key_context(model_id: &str, version: u64) -> BTreeMap<String, String> {
    BTreeMap::from([("model_id".to_owned(), model_id.to_owned()), ("version".to_owned(), version.to_string())])
}

/// Releases a model's data key as its verified manifest names it (`kms_key_id`, `wrapped_dek`,
/// context {model_id, version}).
pub fn release_data_key<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    manifest: &Manifest,
) -> Result<Zeroizing<[u8; DATA_KEY_LEN]>, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    let key_id = Some(manifest.kms_key_id.clone()).filter(|id| !id.is_empty());
    release_data_key_parts(nsm, pool, transport, key_id, manifest.wrapped_dek.clone(), &manifest.model_id, manifest.version)
}

/// Releases a model data key (KMS `GenerateDataKey`'s CiphertextBlob) under
/// `{model_id, version}`: exactly 32 bytes, else `wrong_length`.
pub fn release_data_key_parts<N, T>(
    nsm: &N,
    pool: &RsaKeyPool,
    transport: &mut T,
    key_id: Option<String>,
    wrapped_data_key: Vec<u8>,
    model_id: &str,
    version: u64,
) -> Result<Zeroizing<[u8; DATA_KEY_LEN]>, KeyReleaseError>
where
    N: Nsm + ?Sized,
    T: KmsTransport + ?Sized,
{
    if !protocol::envelope::valid_model_id(model_id) {
        return Err(KeyReleaseError::EncryptionContext(format!("{model_id:?} is not a valid model id")));
    }
    let plaintext = release(nsm, pool, transport, key_id, wrapped_data_key, data_key_context(model_id, version))?;
    if plaintext.len() != DATA_KEY_LEN {
        return Err(KeyReleaseError::WrongLength { what: "data key", expected: DATA_KEY_LEN, actual: plaintext.len() });
    }
    let mut key = Zeroizing::new([0u8; DATA_KEY_LEN]);
    key.copy_from_slice(&plaintext);
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn fixtures() -> std::path::PathBuf {
        std::env::var_os("EPHEM_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures").into())
    }

    #[test]
    fn fleet_context_round_trip_and_strictness() {
        let epoch = FleetEpoch { epoch: 7, not_after_ms: 1_800_000_000_000 };
        let context = epoch.encryption_context();
        assert_eq!(context.get("epoch").map(String::as_str), Some("7"));
        assert_eq!(context.get("not_after").map(String::as_str), Some("1800000000000"));
        assert_eq!(FleetEpoch::from_encryption_context(&context).unwrap(), epoch);

        let with = |k: &str, v: &str| {
            let mut c = context.clone();
            c.insert(k.to_owned(), v.to_owned());
            FleetEpoch::from_encryption_context(&c).map_err(|e| e.check())
        };
        for bad in ["07", "+7", " 7", "7 ", "", "-1", "0x7", "18446744073709551616"] {
            assert_eq!(with("epoch", bad), Err("encryption_context"), "{bad:?}");
        }
        assert_eq!(with("epoch", "0").unwrap().epoch, 0);
        assert_eq!(with("extra", "1"), Err("encryption_context"));
        let mut missing = context.clone();
        missing.remove("not_after");
        missing.insert("notafter".into(), "1".into());
        assert_eq!(FleetEpoch::from_encryption_context(&missing).unwrap_err().check(), "encryption_context");
    }

    #[test]
    fn epoch_expiry_is_strict() {
        let epoch = FleetEpoch { epoch: 1, not_after_ms: 1000 };
        assert!(epoch.check_current(999).is_ok());
        assert_eq!(epoch.check_current(1000).unwrap_err().check(), "fleet_epoch_expired");
        assert_eq!(epoch.check_current(1001).unwrap_err().check(), "fleet_epoch_expired");
    }

    #[test]
    fn published_key_forms() {
        use p256::pkcs8::EncodePublicKey;
        let secret = FleetSecretKey::generate();
        let point = secret.public_key().to_bytes();
        assert_eq!(parse_published_key(&point).unwrap(), point);
        let p = p256::PublicKey::from_sec1_bytes(&point).unwrap();
        let spki = p.to_public_key_der().unwrap();
        assert_eq!(parse_published_key(spki.as_bytes()).unwrap(), point);
        let compressed = p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&p, true);
        assert_eq!(parse_published_key(compressed.as_bytes()).unwrap(), point);
        assert_eq!(parse_published_key(&[4; 65]).unwrap_err().check(), "invalid_published_key");
        assert_eq!(parse_published_key(b"").unwrap_err().check(), "invalid_published_key");
    }

    #[test]
    fn one_shot_key_reads_the_real_kms_envelope_and_is_consumed() {
        // The real KMS CiphertextForRecipient (BER, indefinite lengths, chunked content) was
        // sealed to someone else's key: it parses through our path and fails at the RSA unwrap,
        // not in the BER reader.
        let real = std::fs::read(fixtures().join("kms-cms/kms_ciphertext_for_recipient_1.ber"))
            .expect("kms-cms fixture (set EPHEM_FIXTURES)");
        let parsed = protocol::cms::EnvelopedData::parse(&real).unwrap();
        assert_eq!(parsed.encrypted_key.len(), RSA_BITS / 8);
        let key = OneShotKey::generate().unwrap();
        assert_eq!(key.open(&real), Err(CmsError::KeyUnwrap));
        // `key` is moved: using it again does not compile (`open` takes `self`).

        let key = OneShotKey::generate().unwrap();
        let sealed = protocol::cms::seal(
            key.public_key_der(),
            b"released",
            &mut rsa::rand_core::UnwrapErr(getrandom::SysRng),
        )
        .unwrap();
        assert_eq!(&**key.open(&sealed).unwrap(), b"released");
    }

    #[test]
    fn pool_hands_out_distinct_keys_and_refills() {
        for generators in [1, 2] {
            let pool = RsaKeyPool::start(2, generators);
            let a = pool.take().unwrap();
            let b = pool.take_timeout(Duration::from_secs(60)).unwrap();
            assert_ne!(a.public_key_der(), b.public_key_der());
            assert_eq!(a.public_key_der().len(), 294, "RSA-2048 SPKI DER");
            let deadline = Instant::now() + Duration::from_secs(60);
            while pool.ready() < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(pool.ready(), 2);
            // Full: every generator waits with its key instead of making one more (a key
            // generates in well under a second).
            let watch = Instant::now() + Duration::from_secs(2);
            while Instant::now() < watch {
                assert_eq!(pool.ready(), 2, "{generators} generators keep 2 keys, not more");
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(format!("{a:?}").starts_with("OneShotKey { spki_sha256: "));
        }
    }

    #[test]
    fn errors_name_their_check() {
        let e = KeyReleaseError::WrongLength { what: "data key", expected: 32, actual: 31 };
        assert_eq!(e.check(), "wrong_length");
        assert!(e.to_string().starts_with("wrong_length: "));
        let e = KeyReleaseError::FleetEpochExpired { epoch: 3, not_after_ms: 1, now_ms: 2 };
        assert!(e.to_string().starts_with("fleet_epoch_expired: "));
        assert_eq!(relayed(&"x".repeat(10_000)).len(), MAX_RELAYED_TEXT);
    }
}
