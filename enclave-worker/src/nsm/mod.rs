//! Access to the Nitro Secure Module (DESIGN.md §4) behind one trait, [`Nsm`], with two
//! implementations:
//!
//! - `DevNsm` (cargo feature `dev`): the development NSM. It issues documents of exactly the real shape through the
//!   development CA of `protocol::attestation::dev_issuer` (root → intermediate → per-document
//!   leaf, P-384), whose keys it keeps in a state directory; PCR0 is SHA-384 of the running worker
//!   binary, PCR1/PCR2 are SHA-384 of fixed labels (see [`dev`]).
//! - `NitroNsm` (cargo feature `nitro`): the real NSM through `aws-nitro-enclaves-nsm-api`
//!   (`/dev/nsm`); its documents chain to the AWS Nitro Enclaves root G1.
//!
//! # The invariant: no host-chosen bytes in `public_key` or `user_data`
//!
//! DESIGN.md §3: *the enclave never puts host-chosen bytes into an NSM request's `public_key` or
//! `user_data`*; otherwise a host could have KMS release a key to an RSA key the host holds. The
//! guarantee is structural: an [`AttestationRequest`] has private fields, and its only
//! constructors are
//!
//! | constructor | `public_key` | `user_data` | `nonce` |
//! |---|---|---|---|
//! | [`AttestationRequest::key_release`]`(&OneShotKey)` | SPKI DER of that one-shot RSA key, which only [`OneShotKey`] generation (inside the worker) produces | absent | absent |
//! | [`AttestationRequest::publication`]`(&UserDataBinding)` | absent | the binding's deterministic CBOR | absent |
//! | [`AttestationRequest::fresh`]`(&UserDataBinding, client_nonce)` | absent | the binding's deterministic CBOR | the client's nonce (1..=1024 bytes) — the only host-relayed field |
//!
//! No constructor, `Default`, `From` or deserializer takes arbitrary `public_key` / `user_data`
//! bytes, and the fields cannot be set from outside this module: `public_key` can only be a key
//! the worker generated, `user_data` only a well-formed binding of two valid public keys. That the
//! binding names the worker's *own* keys is the caller's part: build it from the private keys
//! (`FleetSecretKey::public_key()` of the released fleet key, the per-boot receipt
//! `SigningKey::verifying_key()`), never from bytes a frame carried — e.g. with [`own_binding`].
//!
//! [`OneShotKey`]: crate::one_shot_key::OneShotKey

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use protocol::attestation::{GenesisBinding, TrustAnchor, UserDataBinding};
use protocol::envelope::FleetSecretKey;

use crate::one_shot_key::OneShotKey;

#[cfg(feature = "dev")]
pub mod dev;
#[cfg(feature = "nitro")]
pub mod nitro;

#[cfg(feature = "dev")]
pub use dev::DevNsm;
#[cfg(feature = "nitro")]
pub use nitro::NitroNsm;

/// Largest client nonce relayed into a fresh attestation (the NSM's field limit).
pub const MAX_NONCE_LEN: usize = 1024;

/// Why the NSM could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NsmError {
    /// No NSM device (or it could not be opened).
    #[error("nsm_unavailable: {0}")]
    Unavailable(String),
    /// The NSM (or the development issuer) refused or failed a request.
    #[error("nsm_request: {0}")]
    Request(String),
    /// The NSM answered with something other than what was asked for.
    #[error("nsm_response: {0}")]
    Response(String),
    /// The client nonce is empty or longer than [`MAX_NONCE_LEN`].
    #[error("nonce_length: a client nonce must be 1..={MAX_NONCE_LEN} bytes, got {0}")]
    NonceLength(usize),
    /// The development NSM's state directory (CA keys, root certificate).
    #[error("dev_state: {0}")]
    DevState(String),
    /// Measuring the worker binary for PCR0.
    #[error("measurement: {0}")]
    Measurement(String),
}

impl NsmError {
    /// The name of what failed (stable, for logs and `JobFailed`/`Status` frames).
    pub fn check(&self) -> &'static str {
        match self {
            NsmError::Unavailable(_) => "nsm_unavailable",
            NsmError::Request(_) => "nsm_request",
            NsmError::Response(_) => "nsm_response",
            NsmError::NonceLength(_) => "nonce_length",
            NsmError::DevState(_) => "dev_state",
            NsmError::Measurement(_) => "measurement",
        }
    }
}

/// What to put into an attestation document.
///
/// **Invariant (DESIGN.md §3): `public_key` and `user_data` never carry host-chosen bytes.** The
/// fields are private and the only constructors are [`key_release`](Self::key_release) (the SPKI
/// of a [`OneShotKey`] the worker generated), [`publication`](Self::publication) and
/// [`fresh`](Self::fresh) (the encoding of a [`UserDataBinding`], i.e. two valid public keys and
/// an epoch; callers build it from the keys they hold, see [`own_binding`]). `fresh` also takes
/// the client's nonce, the one host-relayed field, which only ever reaches `nonce`. Do not add a
/// constructor, `Default`, `From`, or `Deserialize` that takes other bytes. The integration test
/// `no_host_bytes_reach_public_key_or_user_data` (tests/key_release.rs) decodes every document
/// produced during key releases through honest and hostile hosts and checks this.
#[derive(Clone, PartialEq, Eq)]
pub struct AttestationRequest {
    public_key: Option<Vec<u8>>,
    user_data: Option<Vec<u8>>,
    nonce: Option<Vec<u8>>,
}

impl AttestationRequest {
    /// For one KMS `Decrypt` with `Recipient`: `public_key` = the one-shot RSA key's SPKI DER,
    /// nothing else.
    pub fn key_release(key: &OneShotKey) -> Self {
        AttestationRequest { public_key: Some(key.public_key_der().to_vec()), user_data: None, nonce: None }
    }

    /// The document the worker publishes: `user_data` = its key binding.
    pub fn publication(binding: &UserDataBinding) -> Self {
        AttestationRequest { public_key: None, user_data: Some(binding.encode()), nonce: None }
    }

    /// A fresh document on a client's request: the published binding plus the client's nonce
    /// (1..=1024 bytes), the only host-relayed field the worker ever attests.
    /// The document of an epoch the worker created (user_data: the genesis binding, made of a
    /// key KMS generated for it and what KMS said about the key).
    pub fn genesis(binding: &GenesisBinding) -> Self {
        AttestationRequest { public_key: None, user_data: Some(binding.encode()), nonce: None }
    }

    pub fn fresh(binding: &UserDataBinding, client_nonce: &[u8]) -> Result<Self, NsmError> {
        if client_nonce.is_empty() || client_nonce.len() > MAX_NONCE_LEN {
            return Err(NsmError::NonceLength(client_nonce.len()));
        }
        Ok(AttestationRequest {
            public_key: None,
            user_data: Some(binding.encode()),
            nonce: Some(client_nonce.to_vec()),
        })
    }

    pub fn public_key(&self) -> Option<&[u8]> {
        self.public_key.as_deref()
    }

    pub fn user_data(&self) -> Option<&[u8]> {
        self.user_data.as_deref()
    }

    pub fn nonce(&self) -> Option<&[u8]> {
        self.nonce.as_deref()
    }
}

impl core::fmt::Debug for AttestationRequest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let len = |v: &Option<Vec<u8>>| v.as_ref().map(Vec::len);
        f.debug_struct("AttestationRequest")
            .field("public_key_len", &len(&self.public_key))
            .field("user_data_len", &len(&self.user_data))
            .field("nonce_len", &len(&self.nonce))
            .finish()
    }
}

/// The NSM: attestation documents, PCRs, and a clock.
pub trait Nsm: Send + Sync {
    /// An attestation document (COSE_Sign1 bytes) for `request`.
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError>;
    /// PCR index → value, as read at start (the values documents carry).
    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>>;
    /// Milliseconds since the UNIX epoch, from the enclave's clock.
    fn now_ms(&self) -> u64;
    /// The root the documents chain to (AWS Nitro G1, or the development root).
    fn trust_anchor(&self) -> TrustAnchor;
    /// True for the development NSM: its documents prove nothing about Nitro hardware.
    fn is_development(&self) -> bool;
}

impl<T: Nsm + ?Sized> Nsm for &T {
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError> {
        (**self).attest(request)
    }
    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>> {
        (**self).pcrs()
    }
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn trust_anchor(&self) -> TrustAnchor {
        (**self).trust_anchor()
    }
    fn is_development(&self) -> bool {
        (**self).is_development()
    }
}

impl<T: Nsm + ?Sized> Nsm for std::sync::Arc<T> {
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError> {
        (**self).attest(request)
    }
    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>> {
        (**self).pcrs()
    }
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn trust_anchor(&self) -> TrustAnchor {
        (**self).trust_anchor()
    }
    fn is_development(&self) -> bool {
        (**self).is_development()
    }
}

/// The binding {fleet public key, receipt public key, epoch, not_after, KMS key} of keys whose
/// private halves the caller holds: both public keys are derived here; `kms_key` must be the key
/// KMS answered with when it released `fleet`.
pub fn own_binding(
    fleet: &FleetSecretKey,
    receipt: &ed25519_dalek::SigningKey,
    epoch: u64,
    not_after_ms: u64,
    kms_key: &protocol::kms_arn::KmsKeyArn,
) -> Result<UserDataBinding, NsmError> {
    let fleet_public: [u8; 65] = fleet
        .public_key()
        .to_bytes()
        .try_into()
        .map_err(|_| NsmError::Request("the fleet public key is not a 65-byte SEC1 point".into()))?;
    UserDataBinding::new(fleet_public, receipt.verifying_key().to_bytes(), epoch, not_after_ms, kms_key.clone())
        .map_err(|e| NsmError::Request(format!("key binding: {e}")))
}

/// The system clock in ms since the UNIX epoch (0 if it reads before 1970).
pub(crate) fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A KMS key ARN for unit tests.
#[cfg(test)]
pub(crate) fn test_kms_key() -> protocol::kms_arn::KmsKeyArn {
    protocol::attestation::vectors::BINDING_KMS_KEY.parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> UserDataBinding {
        let fleet = FleetSecretKey::generate();
        let receipt = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        own_binding(&fleet, &receipt, 42, 1_800_000_000_000, &test_kms_key()).unwrap()
    }

    #[test]
    fn own_binding_derives_the_public_keys() {
        let fleet = FleetSecretKey::generate();
        let receipt = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let b = own_binding(&fleet, &receipt, 42, 1_800_000_000_000, &test_kms_key()).unwrap();
        assert_eq!(b.fleet_public_key.to_vec(), fleet.public_key().to_bytes());
        assert_eq!(b.receipt_public_key, receipt.verifying_key().to_bytes());
        assert_eq!(b.epoch, 42);
        assert_eq!(UserDataBinding::decode(&b.encode()).unwrap(), b);
    }

    #[test]
    fn constructors_fill_only_their_fields() {
        let b = binding();
        let publication = AttestationRequest::publication(&b);
        assert_eq!(publication.public_key(), None);
        assert_eq!(publication.user_data(), Some(b.encode().as_slice()));
        assert_eq!(publication.nonce(), None);

        let fresh = AttestationRequest::fresh(&b, b"client nonce").unwrap();
        assert_eq!(fresh.public_key(), None);
        assert_eq!(fresh.user_data(), Some(b.encode().as_slice()));
        assert_eq!(fresh.nonce(), Some(&b"client nonce"[..]));
    }

    #[test]
    fn nonce_limits() {
        let b = binding();
        assert!(AttestationRequest::fresh(&b, &[0; MAX_NONCE_LEN]).is_ok());
        assert!(matches!(AttestationRequest::fresh(&b, &[0; MAX_NONCE_LEN + 1]), Err(NsmError::NonceLength(1025))));
        let empty = AttestationRequest::fresh(&b, &[]).unwrap_err();
        assert_eq!(empty.check(), "nonce_length");
    }

    #[test]
    fn debug_prints_lengths_only() {
        let text = format!("{:?}", AttestationRequest::fresh(&binding(), b"secret-looking").unwrap());
        assert_eq!(text, "AttestationRequest { public_key_len: None, user_data_len: Some(197), nonce_len: Some(14) }");
    }
}
