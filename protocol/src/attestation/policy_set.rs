//! The measurements a receipt check accepts: an allow-list of attestation policies signed by the
//! image publisher (docs/protocol.md §7.4), e.g. the old and the new image's while both run.
//!
//! Without it the ledger would take a receipt from any enclave under the root — including a
//! host's own image — and, holding one entry per job id, keep the genuine receipt out for good.
//! Every policy's signature is verified when the set is built; a set that does not verify, or
//! is empty, is refused, so an appender cannot start without one.
//!
//! A policy is named by its id: SHA-256 of its canonical signed bytes (§7.4), which the ledger
//! records with each entry it admits.

use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use super::policy::{Policy, PolicyError, SignedPolicy};
use super::roots::TrustAnchor;

/// A policy's id: SHA-256 of its canonical signed bytes.
pub type PolicyId = [u8; 32];

/// SHA-256 of the policy's canonical signed bytes: the same for every JSON rendering of it.
pub fn policy_id(signed: &SignedPolicy) -> PolicyId {
    Sha256::digest(signed.policy.signed_bytes(&signed.publisher_key_id)).into()
}

/// One policy of the allow-list, verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedPolicy {
    pub id: PolicyId,
    /// Where it came from (a file or an object key), for messages.
    pub source: String,
    pub policy: Policy,
}

impl AllowedPolicy {
    /// Whether a verified document with these PCRs (and debug flag) satisfies this policy:
    /// every PCR the policy pins is equal, and debug mode only if the policy allows it.
    pub fn admits(&self, pcrs: &std::collections::BTreeMap<u8, Vec<u8>>, debug_mode: bool) -> bool {
        (!debug_mode || self.policy.allow_debug) && self.policy.pcrs.iter().all(|(i, v)| pcrs.get(i) == Some(v))
    }
}

/// Why an allow-list was refused (the appender does not start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicySetError {
    #[error("no attestation policy: an appender admits receipts only under a signed policy")]
    Empty,
    #[error("policy {source_name}: {error}")]
    Parse { source_name: String, error: PolicyError },
    #[error("policy {source_name}: {error}")]
    Signature { source_name: String, error: PolicyError },
    #[error("policy {source_name} trusts root {policy_root}, the appender pins {pinned}")]
    Root { source_name: String, policy_root: String, pinned: String },
}

/// A verified, non-empty allow-list of policies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySet {
    policies: Vec<AllowedPolicy>,
}

impl PolicySet {
    /// Parses and verifies each `(source, JSON text)` with the pinned publisher key.
    pub fn from_json(publisher: &VerifyingKey, files: &[(String, String)]) -> Result<PolicySet, PolicySetError> {
        let signed = files
            .iter()
            .map(|(source, text)| {
                SignedPolicy::from_json(text)
                    .map(|s| (source.clone(), s))
                    .map_err(|error| PolicySetError::Parse { source_name: source.clone(), error })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::verify(publisher, signed)
    }

    /// Verifies each signed policy with the pinned publisher key.
    pub fn verify(publisher: &VerifyingKey, signed: Vec<(String, SignedPolicy)>) -> Result<PolicySet, PolicySetError> {
        let mut policies: Vec<AllowedPolicy> = Vec::with_capacity(signed.len());
        for (source, s) in signed {
            let policy = s
                .verify(publisher)
                .map_err(|error| PolicySetError::Signature { source_name: source.clone(), error })?
                .clone();
            let id = policy_id(&s);
            if !policies.iter().any(|p| p.id == id) {
                policies.push(AllowedPolicy { id, source, policy });
            }
        }
        if policies.is_empty() {
            return Err(PolicySetError::Empty);
        }
        Ok(PolicySet { policies })
    }

    /// Refuses a policy that trusts another root than the one documents are verified under:
    /// its PCRs would be matched against documents it never vouched for.
    pub fn check_root(&self, pinned: &TrustAnchor) -> Result<(), PolicySetError> {
        match self.policies.iter().find(|p| p.policy.root.sha256() != pinned.sha256()) {
            Some(p) => Err(PolicySetError::Root {
                source_name: p.source.clone(),
                policy_root: p.policy.root.label(),
                pinned: pinned.label(),
            }),
            None => Ok(()),
        }
    }

    pub fn policies(&self) -> &[AllowedPolicy] {
        &self.policies
    }

    /// The first policy a verified document satisfies.
    pub fn admitting(&self, pcrs: &std::collections::BTreeMap<u8, Vec<u8>>, debug_mode: bool) -> Option<&AllowedPolicy> {
        self.policies.iter().find(|p| p.admits(pcrs, debug_mode))
    }

    /// Whether any policy accepts debug-mode enclaves.
    pub fn allows_debug(&self) -> bool {
        self.policies.iter().any(|p| p.policy.allow_debug)
    }
}

#[cfg(test)]
mod tests;
