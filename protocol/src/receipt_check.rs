//! Checking a receipt against the attestation document it names (docs/protocol.md §4, §7): what
//! the ledger runs on each append, the client on each job and an auditor on each entry.
//!
//! A receipt is accepted when, in this order:
//!
//! | # | name | passes when |
//! |---|---|---|
//! | 1 | `receipt` | the leaf is a strict COSE_Sign1 receipt (EdDSA, receipt content type, canonical bytes, payload schema) |
//! | 2 | `attestation` | the attestation document verifies under the pinned root **at its own timestamp**, with the expected PCRs and debug policy, and its `user_data` is a key binding |
//! | 2b | `policy` | with an allow-list ([`ReceiptVerifier::enforcing`]): the document's PCRs and debug mode satisfy one of the publisher-signed policies |
//! | 3 | `receipt_key_id` | the receipt's `kid` is the key id of the receipt key the binding names |
//! | 4 | `receipt_signature` | the Ed25519 signature verifies with that key |
//! | 5 | `attestation_hash` | the receipt's `attestation` is SHA-256 of the given document |
//! | 6 | `fleet_key` | the receipt's fleet key id and epoch are the ones the binding names |
//! | 7 | `pcrs` | the receipt carries PCR0 and every PCR it carries equals the document's |
//!
//! (The ledger adds an eighth, `fields`: the values it indexes fit its limits.) A usage receipt
//! (§9.5, [`ReceiptVerifier::verify_usage`]) passes the same checks; only 1 decodes its own schema.
//!
//! Nothing the receipt says is used before 4 has passed. The document is verified at its
//! own timestamp because an auditor checks receipts long after the document's leaf
//! certificate (about three hours) expired; freshness is the publisher's and the client's
//! concern at submission time, not the ledger's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::attestation::error::UserDataBindingError;
use crate::attestation::policy_set::{PolicyId, PolicySet, PolicySetError};
use crate::attestation::{
    AttestationDocument, AttestationError, BindingError, RootInfo, TrustAnchor, UserDataBinding, VerifyOptions, verify,
};
use crate::envelope::JobId;
use crate::keys::KeyId;
use crate::receipt::{Receipt, ReceiptError, SignedReceipt};
use crate::usage::{SignedUsageReceipt, UsageReceipt};

type Hash = [u8; 32];

/// Verified documents kept in memory: a document is shared by every receipt of one
/// enclave epoch, and verifying its P-384 chain costs far more than a receipt signature.
const DOCUMENT_CACHE: usize = 64;

/// Why a receipt was refused. `Display` is `"<check>: <reason>"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptCheckError {
    #[error("receipt: {0}")]
    Receipt(ReceiptError),
    /// The attestation check that failed, named by the verifier (`attestation: signature: …`).
    #[error("attestation: {0}")]
    Attestation(AttestationError),
    /// The document verified, but the image it measures is none the publisher signed for.
    #[error("policy: the document's measurements (PCR0 {pcr0}{debug}) satisfy none of the {allowed} allowed policies", debug = if *.debug_mode { ", debug mode" } else { "" })]
    Policy { pcr0: String, debug_mode: bool, allowed: usize },
    #[error("receipt_key_id: receipt is signed by key {signed_by}, the attestation document binds {bound}")]
    ReceiptKeyId { signed_by: String, bound: String },
    #[error("receipt_signature: {0}")]
    ReceiptSignature(ReceiptError),
    #[error("attestation_hash: receipt names document {named}, the given document is {given}")]
    AttestationHash { named: String, given: String },
    #[error(
        "fleet_key: receipt names fleet key {receipt} epoch {receipt_epoch}, the document binds {bound} epoch {bound_epoch}"
    )]
    FleetKey { receipt: String, receipt_epoch: u64, bound: String, bound_epoch: u64 },
    #[error("pcrs: {0}")]
    Pcrs(PcrError),
}

impl ReceiptCheckError {
    /// The name of the failed check (the first column of the table above).
    pub fn check(&self) -> &'static str {
        match self {
            Self::Receipt(_) => "receipt",
            Self::Attestation(_) => "attestation",
            Self::Policy { .. } => "policy",
            Self::ReceiptKeyId { .. } => "receipt_key_id",
            Self::ReceiptSignature(_) => "receipt_signature",
            Self::AttestationHash { .. } => "attestation_hash",
            Self::FleetKey { .. } => "fleet_key",
            Self::Pcrs(_) => "pcrs",
        }
    }
}

/// How the receipt's PCRs disagree with the document's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcrError {
    #[error("receipt carries no PCR0")]
    NoPcr0,
    #[error("receipt carries PCR{0}, the document has none")]
    NotInDocument(u8),
    #[error("receipt PCR{index} is {receipt}, the document's is {document}")]
    Differs { index: u8, receipt: String, document: String },
}

/// A receipt that passed every check, with what it was checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedReceipt {
    pub receipt: Receipt,
    /// The allow-listed policy the document satisfies (`None` for a check without an allow-list).
    pub policy: Option<PolicyId>,
    pub binding: UserDataBinding,
    /// The document's timestamp: the time its verification was pinned to.
    pub document_timestamp_ms: u64,
    pub module_id: String,
    pub root: RootInfo,
    /// The enclave ran in debug mode (only possible with `allow_debug`).
    pub debug_mode: bool,
}

/// A usage receipt that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedUsage {
    pub usage: UsageReceipt,
    /// Its ledger id (§9.5): the receipt key's id and the sequence number, hashed.
    pub usage_id: JobId,
    pub policy: Option<PolicyId>,
    pub document_timestamp_ms: u64,
    pub debug_mode: bool,
}

/// What a signed statement claims about the enclave that signed it: checks 5–7 compare these
/// with the attestation document.
pub struct EnclaveClaimsRef<'a> {
    pub attestation_sha256: &'a Hash,
    pub fleet_key_id: &'a KeyId,
    pub epoch: u64,
    pub pcrs: &'a BTreeMap<u8, Vec<u8>>,
}

/// A statement an enclave signs with its receipt key: a job receipt or a usage receipt.
pub trait EnclaveClaims {
    fn enclave_claims(&self) -> EnclaveClaimsRef<'_>;
}

impl EnclaveClaims for Receipt {
    fn enclave_claims(&self) -> EnclaveClaimsRef<'_> {
        EnclaveClaimsRef { attestation_sha256: &self.attestation_sha256, fleet_key_id: &self.fleet_key_id, epoch: self.epoch, pcrs: &self.pcrs }
    }
}

impl EnclaveClaims for UsageReceipt {
    fn enclave_claims(&self) -> EnclaveClaimsRef<'_> {
        EnclaveClaimsRef { attestation_sha256: &self.attestation_sha256, fleet_key_id: &self.fleet_key_id, epoch: self.epoch, pcrs: &self.pcrs }
    }
}

/// The document behind a statement that passed checks 2–7, and the policy it satisfied.
struct CheckedEnclave {
    attested: Attested,
    policy: Option<PolicyId>,
}

/// What a verified document contributes to receipt checks.
#[derive(Clone)]
struct Attested {
    receipt_key: VerifyingKey,
    binding: UserDataBinding,
    pcrs: BTreeMap<u8, Vec<u8>>,
    timestamp_ms: u64,
    module_id: String,
    root: RootInfo,
    debug_mode: bool,
}

/// Checks receipts against Nitro attestation documents under one pinned root.
pub struct ReceiptVerifier {
    root: TrustAnchor,
    expected_pcrs: BTreeMap<u8, Vec<u8>>,
    allow_debug: bool,
    /// The appender's allow-list; `None` for auditors' checks, which admit any image.
    policies: Option<PolicySet>,
    /// Keyed by SHA-256 of the document: verification is a pure function of the
    /// document bytes and the options above, so a hit is as good as a re-verification.
    verified: Mutex<HashMap<Hash, Attested>>,
}

impl ReceiptVerifier {
    /// Receipts whose documents chain to `root`; any measurements, debug refused.
    pub fn new(root: TrustAnchor) -> Self {
        Self { root, expected_pcrs: BTreeMap::new(), allow_debug: false, policies: None, verified: Mutex::new(HashMap::new()) }
    }

    /// What an appender runs: receipts whose documents chain to `root` **and** satisfy one of
    /// `policies` (check `policy`); the satisfied policy's id is returned in
    /// [`VerifiedReceipt::policy`]. A policy for another root is refused.
    pub fn enforcing(root: TrustAnchor, policies: PolicySet) -> Result<Self, PolicySetError> {
        policies.check_root(&root)?;
        let mut check = Self::new(root);
        check.policies = Some(policies);
        Ok(check)
    }

    /// The allow-list, when this check enforces one.
    pub fn policies(&self) -> Option<&PolicySet> {
        self.policies.as_ref()
    }

    /// Also require these exact PCR values in every document.
    pub fn with_expected_pcrs(mut self, pcrs: BTreeMap<u8, Vec<u8>>) -> Self {
        self.expected_pcrs = pcrs;
        self
    }

    /// Accept documents of debug-mode enclaves (PCR0/1/2 all zero).
    pub fn allow_debug(mut self, allow: bool) -> Self {
        self.allow_debug = allow;
        self
    }

    pub fn root(&self) -> &TrustAnchor {
        &self.root
    }

    /// Runs every check in order and returns the first failure.
    pub fn verify(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<VerifiedReceipt, ReceiptCheckError> {
        // 1. receipt
        let signed = SignedReceipt::decode(leaf).map_err(ReceiptCheckError::Receipt)?;
        let (receipt, enclave) = self.check_statement(signed.kid, |key| signed.verify(key).cloned(), attestation_document)?;
        Ok(VerifiedReceipt {
            receipt,
            policy: enclave.policy,
            binding: enclave.attested.binding,
            document_timestamp_ms: enclave.attested.timestamp_ms,
            module_id: enclave.attested.module_id,
            root: enclave.attested.root,
            debug_mode: enclave.attested.debug_mode,
        })
    }

    /// The same checks for a usage receipt (docs/protocol.md §9.5): check 1 decodes a usage
    /// receipt instead of a job receipt, 2–7 are the job receipt's.
    pub fn verify_usage(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<VerifiedUsage, ReceiptCheckError> {
        // 1. receipt
        let signed = SignedUsageReceipt::decode(leaf).map_err(ReceiptCheckError::Receipt)?;
        let (usage, enclave) = self.check_statement(signed.kid, |key| signed.verify(key).cloned(), attestation_document)?;
        Ok(VerifiedUsage {
            usage_id: JobId(signed.usage_id()),
            usage,
            policy: enclave.policy,
            document_timestamp_ms: enclave.attested.timestamp_ms,
            debug_mode: enclave.attested.debug_mode,
        })
    }

    /// Checks 2–7 for a statement signed by key `kid`; `verify_signature` is check 4 and yields
    /// the statement, whose claims 5–7 are then compared with the document.
    fn check_statement<S: EnclaveClaims>(
        &self,
        kid: KeyId,
        verify_signature: impl FnOnce(&VerifyingKey) -> Result<S, ReceiptError>,
        attestation_document: &[u8],
    ) -> Result<(S, CheckedEnclave), ReceiptCheckError> {
        // 2. attestation
        let doc_sha256: Hash = Sha256::digest(attestation_document).into();
        let attested = self.attest(attestation_document, &doc_sha256)?;
        // 2b. policy
        let policy = match &self.policies {
            None => None,
            Some(set) => match set.admitting(&attested.pcrs, attested.debug_mode) {
                Some(p) => Some(p.id),
                None => {
                    return Err(ReceiptCheckError::Policy {
                        pcr0: attested.pcrs.get(&0).map(hex::encode).unwrap_or_default(),
                        debug_mode: attested.debug_mode,
                        allowed: set.policies().len(),
                    });
                }
            },
        };
        // 3. receipt_key_id
        let bound_kid = attested.binding.receipt_key_id();
        if kid != bound_kid {
            return Err(ReceiptCheckError::ReceiptKeyId { signed_by: hex::encode(kid), bound: hex::encode(bound_kid) });
        }
        // 4. receipt_signature
        let statement = verify_signature(&attested.receipt_key).map_err(ReceiptCheckError::ReceiptSignature)?;
        let claims = statement.enclave_claims();
        // 5. attestation_hash
        if *claims.attestation_sha256 != doc_sha256 {
            return Err(ReceiptCheckError::AttestationHash {
                named: hex::encode(claims.attestation_sha256),
                given: hex::encode(doc_sha256),
            });
        }
        // 6. fleet_key
        let bound_fleet = attested.binding.fleet_key_id();
        if *claims.fleet_key_id != bound_fleet || claims.epoch != attested.binding.epoch {
            return Err(ReceiptCheckError::FleetKey {
                receipt: hex::encode(claims.fleet_key_id),
                receipt_epoch: claims.epoch,
                bound: hex::encode(bound_fleet),
                bound_epoch: attested.binding.epoch,
            });
        }
        // 7. pcrs
        check_pcrs(claims.pcrs, &attested.pcrs).map_err(ReceiptCheckError::Pcrs)?;
        Ok((statement, CheckedEnclave { attested, policy }))
    }

    fn attest(&self, document: &[u8], sha256: &Hash) -> Result<Attested, ReceiptCheckError> {
        if let Some(hit) = self.cache().get(sha256) {
            return Ok(hit.clone());
        }
        // The timestamp is read before verification only to pin the verification time;
        // the signature check that follows covers it.
        let timestamp_ms =
            AttestationDocument::parse_unverified(document).map_err(ReceiptCheckError::Attestation)?.timestamp_ms;
        let mut options = VerifyOptions::new(self.root.clone(), timestamp_ms);
        options.expected_pcrs = self.expected_pcrs.clone();
        // Debug documents pass here only if some policy may admit them; 2b decides which.
        options.allow_debug = self.allow_debug || self.policies.as_ref().is_some_and(PolicySet::allows_debug);
        options.require_binding = true;
        let verified = verify(document, &options).map_err(ReceiptCheckError::Attestation)?;
        // With require_binding the verifier returns the binding, and decoding it has
        // already checked the receipt key is a valid point; refuse rather than trust a gap.
        let binding = verified.binding.ok_or(binding_error(UserDataBindingError::Absent))?;
        let receipt_key = VerifyingKey::from_bytes(&binding.receipt_public_key)
            .map_err(|_| binding_error(UserDataBindingError::Decode(BindingError::InvalidReceiptKey)))?;
        let attested = Attested {
            receipt_key,
            binding,
            pcrs: verified.document.pcrs,
            timestamp_ms,
            module_id: verified.document.module_id,
            root: verified.root,
            debug_mode: verified.debug_mode,
        };
        let mut cache = self.cache();
        if cache.len() >= DOCUMENT_CACHE {
            cache.clear();
        }
        cache.insert(*sha256, attested.clone());
        Ok(attested)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<Hash, Attested>> {
        // A panic elsewhere cannot leave a half-written entry: inserts are single calls.
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn binding_error(error: UserDataBindingError) -> ReceiptCheckError {
    ReceiptCheckError::Attestation(AttestationError::UserDataBinding(error))
}

fn check_pcrs(receipt: &BTreeMap<u8, Vec<u8>>, document: &BTreeMap<u8, Vec<u8>>) -> Result<(), PcrError> {
    if !receipt.contains_key(&0) {
        return Err(PcrError::NoPcr0);
    }
    for (index, value) in receipt {
        match document.get(index) {
            None => return Err(PcrError::NotInDocument(*index)),
            Some(d) if d != value => {
                return Err(PcrError::Differs { index: *index, receipt: hex::encode(value), document: hex::encode(d) });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
