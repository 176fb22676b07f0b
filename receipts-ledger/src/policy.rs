//! The measurements an appender accepts: an allow-list of attestation policies signed by the
//! image publisher (docs/protocol.md §7.4), e.g. the old and the new image's while both run.
//!
//! Without it the ledger would take a receipt from any enclave under the root — including a
//! host's own image — and, holding one entry per job id, keep the genuine receipt out for good.
//! Every policy's signature is verified when the set is built; a set that does not verify, or
//! is empty, is refused, so an appender cannot start without one.
//!
//! A policy is named by its id: SHA-256 of its canonical signed bytes (§7.4), which the ledger
//! records with each entry it admits (`IndexedFields::policy`).

use ed25519_dalek::VerifyingKey;
use protocol::attestation::{Policy, PolicyError, SignedPolicy, TrustAnchor};
use sha2::{Digest, Sha256};

use crate::merkle::Hash;

/// SHA-256 of the policy's canonical signed bytes: the same for every JSON rendering of it.
pub fn policy_id(signed: &SignedPolicy) -> Hash {
    Sha256::digest(signed.policy.signed_bytes(&signed.publisher_key_id)).into()
}

/// One policy of the allow-list, verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedPolicy {
    pub id: Hash,
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
mod tests {
    use super::*;
    use crate::testing::DevEnclave;
    use ed25519_dalek::SigningKey;

    const T: u64 = 1_761_955_200_000;

    fn publisher() -> SigningKey {
        SigningKey::from_bytes(&[0x51; 32])
    }

    #[test]
    fn the_id_is_the_signed_bytes_hash_whatever_the_json_layout() {
        let e = DevEnclave::new(1, T);
        let signed = e.policy(&publisher());
        let compact = serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&signed.to_json()).unwrap()).unwrap();
        let set = PolicySet::from_json(&publisher().verifying_key(), &[("compact".into(), compact)]).unwrap();
        assert_eq!(set.policies()[0].id, policy_id(&signed));
        assert_eq!(
            policy_id(&signed),
            <[u8; 32]>::from(Sha256::digest(signed.policy.signed_bytes(&signed.publisher_key_id)))
        );
        assert_ne!(policy_id(&signed), policy_id(&DevEnclave::with_image(1, 0x0b, T).policy(&publisher())));
    }

    #[test]
    fn a_set_that_does_not_verify_is_refused_by_name() {
        let e = DevEnclave::new(1, T);
        let key = publisher().verifying_key();
        assert_eq!(PolicySet::verify(&key, vec![]), Err(PolicySetError::Empty));
        // Signed by someone else: the pinned publisher never vouched for it.
        let mallory = e.policy(&SigningKey::from_bytes(&[0x66; 32]));
        let err = PolicySet::verify(&key, vec![("mallory.json".into(), mallory)]).unwrap_err();
        assert!(matches!(&err, PolicySetError::Signature { source_name, error: PolicyError::WrongPublisher { .. } } if source_name == "mallory.json"));
        // An edited PCR under the publisher's key id: the signature fails.
        let mut edited = e.policy(&publisher());
        edited.policy.pcrs.insert(0, vec![0xee; 48]);
        let err = PolicySet::verify(&key, vec![("edited.json".into(), edited)]).unwrap_err();
        assert!(matches!(err, PolicySetError::Signature { error: PolicyError::BadSignature, .. }));
        let err = PolicySet::from_json(&key, &[("junk.json".into(), "{}".into())]).unwrap_err();
        assert!(matches!(err, PolicySetError::Parse { .. }), "{err}");
        // A policy for another root.
        let set = PolicySet::verify(&key, vec![("p".into(), e.policy(&publisher()))]).unwrap();
        set.check_root(&e.anchor()).unwrap();
        assert!(matches!(set.check_root(&DevEnclave::new(2, T).anchor()), Err(PolicySetError::Root { .. })));
    }

    #[test]
    fn a_policy_admits_its_measurements_and_debug_only_if_allowed() {
        let e = DevEnclave::new(1, T);
        let set = PolicySet::verify(&publisher().verifying_key(), vec![("p".into(), e.policy(&publisher()))]).unwrap();
        let mut pcrs: std::collections::BTreeMap<u8, Vec<u8>> = (0u8..).zip(e.pcrs.iter().map(|p| p.to_vec())).collect();
        pcrs.insert(4, vec![0x44; 48]); // a PCR the policy does not pin
        assert_eq!(set.admitting(&pcrs, false).map(|p| p.id), Some(set.policies()[0].id));
        assert!(set.admitting(&pcrs, true).is_none(), "debug mode without allow_debug");
        pcrs.insert(2, vec![0; 48]);
        assert!(set.admitting(&pcrs, false).is_none());
        assert!(!set.allows_debug());
    }

    mod ledger {
        use super::*;
        use crate::ledger::{Ledger, LedgerError};
        use crate::note::SignerKey;
        use crate::receipt_check::{ProtocolReceipts, ReceiptCheckError};
        use crate::store::{AppendOutcome, CheckpointPolicy, LedgerStore, SqliteStore};
        use std::sync::Arc;

        fn enforcing(anchor: TrustAnchor, images: &[&DevEnclave]) -> Arc<ProtocolReceipts> {
            let signed = images.iter().enumerate().map(|(i, e)| (format!("image-{i}.json"), e.policy(&publisher()))).collect();
            let set = PolicySet::verify(&publisher().verifying_key(), signed).unwrap();
            Arc::new(ProtocolReceipts::enforcing(anchor, set).unwrap())
        }

        fn ledger(check: Arc<ProtocolReceipts>) -> Ledger<SqliteStore> {
            let signer = SignerKey::from_seed("ledger.ephem-batch.example/test", &[0x42; 32]).unwrap();
            Ledger::new(SqliteStore::open_in_memory().unwrap(), Box::new(check), Box::new(signer), CheckpointPolicy::default())
        }

        fn rejected(r: Result<AppendOutcome, LedgerError>) -> String {
            match r {
                Err(LedgerError::ReceiptRejected { reason, .. }) => reason,
                other => panic!("not refused by the check: {other:?}"),
            }
        }

        fn policy_of(l: &Ledger<SqliteStore>, job: u64) -> Option<String> {
            l.store().entry_by_job(&format!("{job:032x}")).unwrap().unwrap().fields.policy
        }

        /// A host runs its own image on genuine hardware (same root, another PCR0) and signs a
        /// receipt for the victim's job id before the genuine one arrives.
        #[test]
        fn ledger_refuses_a_receipt_from_another_image() {
            let genuine = DevEnclave::new(1, T);
            let squatter = DevEnclave::with_image(1, 0xee, T);
            let squat = squatter.request(5);
            // Without the allow-list the squatter takes the job's slot for good.
            let mut open = ledger(Arc::new(ProtocolReceipts::new(genuine.anchor())));
            open.append(squat.clone(), T).unwrap();
            assert_eq!(open.append(genuine.request(5), T).unwrap(), AppendOutcome::Existing { index: 0, same_leaf: false });

            let check = enforcing(genuine.anchor(), &[&genuine]);
            let refusal = check.verify(&squat.leaf, &squat.attestation_document).unwrap_err();
            assert!(matches!(refusal, ReceiptCheckError::Policy { allowed: 1, debug_mode: false, .. }), "{refusal}");
            assert_eq!(refusal.check(), "policy");
            let mut l = ledger(check.clone());
            let reason = rejected(l.append(squat, T));
            assert!(reason.starts_with(&format!("policy: the document's measurements (PCR0 {}", "ee".repeat(48))), "{reason}");
            assert_eq!(l.store().size().unwrap(), 0, "a refused receipt takes no slot");
            let genuine_request = check.append_request(genuine.sign(&genuine.receipt(5)), genuine.document.clone()).unwrap();
            assert!(matches!(l.append(genuine_request, T + 1).unwrap(), AppendOutcome::Appended { index: 0, .. }));
            assert_eq!(policy_of(&l, 5), Some(hex::encode(policy_id(&genuine.policy(&publisher())))));
        }

        /// An image rotation: the old and the new image's policies are both allowed while both run.
        #[test]
        fn an_allow_list_of_two_policies_accepts_both_images_and_refuses_a_third() {
            let (old, new, third) = (DevEnclave::new(1, T), DevEnclave::with_image(1, 0x0b, T), DevEnclave::with_image(1, 0x0c, T));
            let check = enforcing(old.anchor(), &[&old, &new]);
            let mut l = ledger(check);
            // The request claims no policy: the ledger records the one its own check found.
            l.append(old.request(1), T).unwrap();
            l.append(new.request(2), T).unwrap();
            assert!(rejected(l.append(third.request(3), T)).starts_with("policy: "));
            assert_eq!(policy_of(&l, 1), Some(hex::encode(policy_id(&old.policy(&publisher())))));
            assert_eq!(policy_of(&l, 2), Some(hex::encode(policy_id(&new.policy(&publisher())))));
            assert_eq!(l.store().size().unwrap(), 2);
            // A claimed policy is not believed either.
            let mut lying = old.request(4);
            lying.fields.policy = Some("00".repeat(32));
            l.append(lying, T).unwrap();
            assert_eq!(policy_of(&l, 4), policy_of(&l, 1));
        }

        #[test]
        fn debug_enclaves_pass_only_a_policy_that_allows_debug() {
            let mut debug = DevEnclave::new(1, T);
            debug.pcrs = [[0; 48]; 3];
            debug.document = debug.attest(Some(debug.binding.encode()), T);
            let strict = enforcing(debug.anchor(), &[&debug]);
            let r = debug.request(1);
            // Refused by the document verification itself: no policy allows debug.
            assert_eq!(strict.verify(&r.leaf, &r.attestation_document).unwrap_err().check(), "attestation");
            let mut policy = debug.policy(&publisher()).policy;
            policy.allow_debug = true;
            let set = PolicySet::verify(&publisher().verifying_key(), vec![("debug".into(), policy.sign(&publisher()).unwrap())]).unwrap();
            let lenient = ProtocolReceipts::enforcing(debug.anchor(), set).unwrap();
            assert!(lenient.verify(&r.leaf, &r.attestation_document).unwrap().debug_mode);
            // A debug-allowing policy of another image does not let this one in.
            let other = DevEnclave::with_image(1, 0x0b, T);
            let mut policy = other.policy(&publisher()).policy;
            policy.allow_debug = true;
            let set = PolicySet::verify(&publisher().verifying_key(), vec![("other".into(), policy.sign(&publisher()).unwrap())]).unwrap();
            let err = ProtocolReceipts::enforcing(debug.anchor(), set).unwrap().verify(&r.leaf, &r.attestation_document).unwrap_err();
            assert!(matches!(err, ReceiptCheckError::Policy { debug_mode: true, .. }), "{err}");
        }
    }
}
