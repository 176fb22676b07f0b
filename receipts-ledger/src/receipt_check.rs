//! The ledger's receipt check over real protocol receipts (docs/protocol.md §4, §7).
//!
//! A leaf is accepted when, in this order:
//!
//! | # | name | passes when |
//! |---|---|---|
//! | 1 | `receipt` | the leaf is a strict COSE_Sign1 receipt (EdDSA, receipt content type, canonical bytes, payload schema) |
//! | 2 | `attestation` | the attestation document verifies under the pinned root **at its own timestamp**, with the expected PCRs and debug policy, and its `user_data` is a key binding |
//! | 2b | `policy` | with an allow-list ([`ProtocolReceipts::enforcing`]): the document's PCRs and debug mode satisfy one of the publisher-signed policies |
//! | 3 | `receipt_key_id` | the receipt's `kid` is the key id of the receipt key the binding names |
//! | 4 | `receipt_signature` | the Ed25519 signature verifies with that key |
//! | 5 | `attestation_hash` | the receipt's `attestation` is SHA-256 of the given document |
//! | 6 | `fleet_key` | the receipt's fleet key id and epoch are the ones the binding names |
//! | 7 | `pcrs` | the receipt carries PCR0 and every PCR it carries equals the document's |
//! | 8 | `fields` | the indexed fields fit the ledger's limits |
//!
//! Nothing the receipt says is used before 4 has passed. The document is verified at its
//! own timestamp because an auditor checks receipts long after the document's leaf
//! certificate (about three hours) expired; freshness is the publisher's and the client's
//! concern at submission time, not the ledger's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use ed25519_dalek::VerifyingKey;
use protocol::attestation::error::UserDataBindingError;
use protocol::attestation::{
    AttestationDocument, AttestationError, BindingError, RootInfo, TrustAnchor, UserDataBinding, VerifyOptions, verify,
};
use protocol::receipt::{Receipt, ReceiptError, SignedReceipt};

use crate::entry::{AppendRequest, FieldError, IndexedFields, LeafClaims, LeafReader, ReceiptCheck, attestation_sha256};
use crate::merkle::Hash;
use crate::policy::{PolicySet, PolicySetError};

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
    #[error("fields: {0}")]
    Fields(FieldError),
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
            Self::Fields(_) => "fields",
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
    /// The fields the ledger indexes, as the receipt states them.
    pub fields: IndexedFields,
    pub binding: UserDataBinding,
    /// The document's timestamp: the time its verification was pinned to.
    pub document_timestamp_ms: u64,
    pub module_id: String,
    pub root: RootInfo,
    /// The enclave ran in debug mode (only possible with `allow_debug`).
    pub debug_mode: bool,
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

/// [`ReceiptCheck`] over protocol receipts and Nitro attestation documents.
pub struct ProtocolReceipts {
    root: TrustAnchor,
    expected_pcrs: BTreeMap<u8, Vec<u8>>,
    allow_debug: bool,
    /// The appender's allow-list; `None` for auditors' checks, which admit any image.
    policies: Option<PolicySet>,
    /// Keyed by SHA-256 of the document: verification is a pure function of the
    /// document bytes and the options above, so a hit is as good as a re-verification.
    verified: Mutex<HashMap<Hash, Attested>>,
}

impl ProtocolReceipts {
    /// Receipts whose documents chain to `root`; any measurements, debug refused.
    pub fn new(root: TrustAnchor) -> Self {
        Self { root, expected_pcrs: BTreeMap::new(), allow_debug: false, policies: None, verified: Mutex::new(HashMap::new()) }
    }

    /// What an appender runs: receipts whose documents chain to `root` **and** satisfy one of
    /// `policies` (check `policy`); the satisfied policy's id is returned in
    /// [`IndexedFields::policy`]. A policy for another root is refused.
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
        // 2. attestation
        let doc_sha256 = attestation_sha256(attestation_document);
        let attested = self.attest(attestation_document, &doc_sha256)?;
        // 2b. policy
        let policy = match &self.policies {
            None => None,
            Some(set) => match set.admitting(&attested.pcrs, attested.debug_mode) {
                Some(p) => Some(hex::encode(p.id)),
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
        if signed.kid != bound_kid {
            return Err(ReceiptCheckError::ReceiptKeyId {
                signed_by: hex::encode(signed.kid),
                bound: hex::encode(bound_kid),
            });
        }
        // 4. receipt_signature
        let receipt = signed.verify(&attested.receipt_key).map_err(ReceiptCheckError::ReceiptSignature)?.clone();
        // 5. attestation_hash
        if receipt.attestation_sha256 != doc_sha256 {
            return Err(ReceiptCheckError::AttestationHash {
                named: hex::encode(receipt.attestation_sha256),
                given: hex::encode(doc_sha256),
            });
        }
        // 6. fleet_key
        let bound_fleet = attested.binding.fleet_key_id();
        if receipt.fleet_key_id != bound_fleet || receipt.epoch != attested.binding.epoch {
            return Err(ReceiptCheckError::FleetKey {
                receipt: hex::encode(receipt.fleet_key_id),
                receipt_epoch: receipt.epoch,
                bound: hex::encode(bound_fleet),
                bound_epoch: attested.binding.epoch,
            });
        }
        // 7. pcrs
        check_pcrs(&receipt.pcrs, &attested.pcrs).map_err(ReceiptCheckError::Pcrs)?;
        // 8. fields
        let mut fields = indexed_fields(&receipt);
        fields.policy = policy;
        fields.validate().map_err(ReceiptCheckError::Fields)?;
        Ok(VerifiedReceipt {
            receipt,
            fields,
            binding: attested.binding,
            document_timestamp_ms: attested.timestamp_ms,
            module_id: attested.module_id,
            root: attested.root,
            debug_mode: attested.debug_mode,
        })
    }

    /// A checked append request for `leaf` (the fields are the receipt's own).
    pub fn append_request(
        &self,
        leaf: Vec<u8>,
        attestation_document: Vec<u8>,
    ) -> Result<AppendRequest, ReceiptCheckError> {
        let fields = self.verify(&leaf, &attestation_document)?.fields;
        Ok(AppendRequest { leaf, fields, attestation_document })
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

impl ReceiptCheck for ProtocolReceipts {
    fn check(&self, leaf: &[u8], attestation_document: &[u8]) -> Result<IndexedFields, String> {
        self.verify(leaf, attestation_document).map(|v| v.fields).map_err(|e| e.to_string())
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

/// [`LeafReader`] over protocol receipts: the fields and the document a receipt states, decoded
/// strictly (check 1), its signature not checked.
pub struct ProtocolLeaves;

impl LeafReader for ProtocolLeaves {
    fn read(&self, leaf: &[u8]) -> Result<LeafClaims, String> {
        let receipt = SignedReceipt::decode(leaf).map_err(|e| e.to_string())?.receipt;
        Ok(LeafClaims { fields: indexed_fields(&receipt), attestation_sha256: receipt.attestation_sha256 })
    }
}

/// The fields the ledger indexes, as `receipt` states them (lowercase hex).
pub fn indexed_fields(receipt: &Receipt) -> IndexedFields {
    IndexedFields {
        job_id: receipt.job_id.to_hex(),
        model_id: receipt.model_id.clone(),
        manifest_hash: hex::encode(receipt.manifest_hash),
        pcr0: receipt.pcrs.get(&0).map(hex::encode).unwrap_or_default(),
        client_key_id: hex::encode(receipt.result_key_id),
        start_ms: receipt.started_ms,
        end_ms: receipt.finished_ms,
        ok_count: receipt.records_ok,
        failed_count: receipt.records_failed,
        policy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ledger;
    use crate::bundle::{prove, verify_bundle_and_receipt};
    use crate::ledger::LedgerError;
    use crate::note::SignerKey;
    use crate::store::{CheckpointPolicy, LedgerStore, SqliteStore};
    use crate::testing::{DEV_EPOCH, DevEnclave};
    use crate::verify::verify_ledger;
    use protocol::attestation::CheckName;

    /// 2025-11-01T00:00:00Z: the documents' time; checks run years later.
    const T: u64 = 1_761_955_200_000;

    fn enclave() -> DevEnclave {
        DevEnclave::new(1, T)
    }

    fn check_of(e: &DevEnclave) -> ProtocolReceipts {
        ProtocolReceipts::new(e.anchor())
    }

    /// The failed check's name, with the attestation check appended (`attestation: chain`).
    fn refusal(check: &ProtocolReceipts, leaf: &[u8], doc: &[u8]) -> String {
        match check.verify(leaf, doc) {
            Ok(_) => "accepted".into(),
            Err(ReceiptCheckError::Attestation(e)) => format!("attestation: {}", e.check()),
            Err(e) => e.check().into(),
        }
    }

    #[test]
    fn a_real_receipt_yields_the_fields_it_carries() {
        let e = enclave();
        let receipt = e.receipt(5);
        let leaf = e.sign(&receipt);
        let v = check_of(&e).verify(&leaf, &e.document).unwrap();
        assert_eq!(v.receipt, receipt);
        assert_eq!(
            v.fields,
            IndexedFields {
                job_id: "00000000000000000000000000000005".into(),
                model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
                manifest_hash: "33".repeat(32),
                pcr0: "a1".repeat(48),
                client_key_id: "44".repeat(32),
                start_ms: T + 5000,
                end_ms: T + 5500,
                ok_count: 1005,
                failed_count: 2,
                policy: None,
            }
        );
        assert_eq!(v.document_timestamp_ms, T);
        assert_eq!(v.binding, e.binding);
        assert!(v.root.is_development());
        assert!(!v.debug_mode);
        assert_eq!(check_of(&e).check(&leaf, &e.document), Ok(v.fields));
    }

    /// The document's leaf certificate lives three hours; the ledger verifies it at its
    /// own timestamp, so a receipt stays checkable for as long as the CA is valid.
    #[test]
    fn documents_are_verified_at_their_own_time() {
        let e = enclave();
        let later = VerifyOptions::new(e.anchor(), T + 4 * 3_600_000);
        assert_eq!(verify(&e.document, &later).unwrap_err().check(), CheckName::Validity);
        let leaf = e.sign(&e.receipt(1));
        assert_eq!(refusal(&check_of(&e), &leaf, &e.document), "accepted");
    }

    #[test]
    fn tampered_receipts_are_refused_by_name() {
        let e = enclave();
        let check = check_of(&e);
        let leaf = e.sign(&e.receipt(1));
        let payload = e.receipt(1).to_payload();
        let start = leaf.windows(payload.len()).position(|w| w == payload).unwrap();
        for i in start..start + payload.len() {
            let mut t = leaf.clone();
            t[i] ^= 0x01;
            let name = refusal(&check, &t, &e.document);
            assert!(name == "receipt" || name == "receipt_signature", "payload byte {i}: {name}");
        }
        // 1001 records become 1000: a well-formed receipt, which the signature catches.
        let ok = payload.windows(6).position(|w| w == [0x62, b'o', b'k', 0x19, 0x03, 0xe9]).unwrap();
        let mut t = leaf.clone();
        t[start + ok + 5] ^= 0x01;
        assert_eq!(refusal(&check, &t, &e.document), "receipt_signature");
        let mut t = leaf.clone();
        t.pop();
        assert_eq!(refusal(&check, &t, &e.document), "receipt");
        assert_eq!(refusal(&check, b"not a receipt", &e.document), "receipt");
    }

    #[test]
    fn wrong_documents_are_refused_by_name() {
        let e = enclave();
        let check = check_of(&e);
        let leaf = e.sign(&e.receipt(1));

        // The same enclave's next publication (same keys): not the document the receipt names.
        let republished = e.attest(Some(e.binding.encode()), T + 1_800_000);
        assert_eq!(refusal(&check, &leaf, &republished), "attestation_hash");
        // Another enclave under the same CA binds another receipt key.
        let mut other = DevEnclave::new(1, T);
        other.receipt_key = ed25519_dalek::SigningKey::from_bytes(&[0x99; 32]);
        other.binding.receipt_public_key = other.receipt_key.verifying_key().to_bytes();
        let other_doc = other.attest(Some(other.binding.encode()), T);
        assert_eq!(refusal(&check, &leaf, &other_doc), "receipt_key_id");
        // A document under a root that is not pinned.
        let foreign = DevEnclave::new(2, T);
        assert_eq!(refusal(&check, &leaf, &foreign.document), "attestation: root_pinned");
        assert_eq!(
            refusal(&ProtocolReceipts::new(TrustAnchor::aws_nitro_g1()), &leaf, &e.document),
            "attestation: root_pinned"
        );
        // Edited bytes, no binding, not a document.
        let mut edited = e.document.clone();
        let at = edited.len() - 200;
        edited[at] ^= 0x01;
        assert!(refusal(&check, &leaf, &edited).starts_with("attestation: "));
        assert_eq!(refusal(&check, &leaf, &e.attest(None, T)), "attestation: user_data_binding");
        assert_eq!(refusal(&check, &leaf, b"garbage"), "attestation: cbor");
    }

    #[test]
    fn foreign_keys_are_refused_by_name() {
        let e = enclave();
        let check = check_of(&e);
        let mallory = ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]);
        let forged = e.receipt(1).sign(&mallory);
        assert_eq!(refusal(&check, &forged, &e.document), "receipt_key_id");
        // Naming the enclave's key id in the header does not make Mallory's signature its.
        let mallory_kid = protocol::keys::key_id(mallory.verifying_key().as_bytes());
        let at = forged.windows(32).position(|w| w == mallory_kid).unwrap();
        let mut relabelled = forged.clone();
        relabelled[at..at + 32].copy_from_slice(&e.binding.receipt_key_id());
        assert_eq!(refusal(&check, &relabelled, &e.document), "receipt_signature");
    }

    #[test]
    fn receipt_claims_must_match_the_document() {
        let e = enclave();
        let check = check_of(&e);
        let signed = |f: &dyn Fn(&mut Receipt)| {
            let mut r = e.receipt(1);
            f(&mut r);
            e.sign(&r)
        };
        let leaf = signed(&|r| {
            r.pcrs.insert(0, vec![0xee; 48]);
        });
        assert!(matches!(
            check.verify(&leaf, &e.document),
            Err(ReceiptCheckError::Pcrs(PcrError::Differs { index: 0, .. }))
        ));
        let leaf = signed(&|r| {
            r.pcrs.remove(&0);
        });
        assert_eq!(check.verify(&leaf, &e.document), Err(ReceiptCheckError::Pcrs(PcrError::NoPcr0)));
        let leaf = signed(&|r| {
            r.pcrs.insert(20, vec![1; 48]);
        });
        assert_eq!(check.verify(&leaf, &e.document), Err(ReceiptCheckError::Pcrs(PcrError::NotInDocument(20))));
        let leaf = signed(&|r| r.epoch = DEV_EPOCH + 1);
        assert_eq!(refusal(&check, &leaf, &e.document), "fleet_key");
        let leaf = signed(&|r| r.fleet_key_id = [0; 32]);
        assert_eq!(refusal(&check, &leaf, &e.document), "fleet_key");
        let leaf = signed(&|r| r.records_ok = u64::MAX);
        assert_eq!(
            check.verify(&leaf, &e.document),
            Err(ReceiptCheckError::Fields(FieldError::TooBig { field: "ok_count", max: i64::MAX as u64 }))
        );
    }

    #[test]
    fn measurement_policy_applies_to_every_document() {
        let e = enclave();
        let leaf = e.sign(&e.receipt(1));
        let pcrs = |v: u8| BTreeMap::from([(0u8, vec![v; 48])]);
        let pinned = check_of(&e).with_expected_pcrs(pcrs(0xa1));
        assert_eq!(refusal(&pinned, &leaf, &e.document), "accepted");
        let wrong = check_of(&e).with_expected_pcrs(pcrs(0xa0));
        assert_eq!(refusal(&wrong, &leaf, &e.document), "attestation: pcr_policy");

        let mut debug = DevEnclave::new(1, T);
        debug.pcrs = [[0; 48]; 3];
        debug.document = debug.attest(Some(debug.binding.encode()), T);
        let leaf = debug.sign(&debug.receipt(1));
        assert_eq!(refusal(&check_of(&debug), &leaf, &debug.document), "attestation: debug_mode");
        let v = check_of(&debug).allow_debug(true).verify(&leaf, &debug.document).unwrap();
        assert!(v.debug_mode);
    }

    #[test]
    fn error_text_names_the_check() {
        let e = enclave();
        let check = check_of(&e);
        let leaf = e.sign(&e.receipt(1));
        let republished = e.attest(Some(e.binding.encode()), T + 1);
        assert!(check.check(&leaf, &republished).unwrap_err().starts_with("attestation_hash: receipt names document "));
        let foreign = DevEnclave::new(2, T);
        assert!(check.check(&leaf, &foreign.document).unwrap_err().starts_with("attestation: root_pinned: "));
    }

    fn ledger(check: ProtocolReceipts) -> (Ledger<SqliteStore>, SignerKey) {
        let key = SignerKey::from_seed("ledger.ephem-batch.example/test", &[0x42; 32]).unwrap();
        let signer = SignerKey::from_seed("ledger.ephem-batch.example/test", &[0x42; 32]).unwrap();
        let policy = CheckpointPolicy { every_appends: 4, every_ms: u64::MAX };
        (Ledger::new(SqliteStore::open_in_memory().unwrap(), Box::new(check), Box::new(signer), policy), key)
    }

    #[test]
    fn the_ledger_appends_real_receipts_and_refuses_the_rest_by_name() {
        let a = enclave();
        let (mut l, key) = ledger(check_of(&a));
        for j in 0..8 {
            l.append(a.request(j), T + j).unwrap();
        }
        let reason = |r: Result<_, LedgerError>| match r {
            Err(LedgerError::ReceiptRejected { reason, .. }) => reason,
            other => panic!("{:?}", other.map(|_| ())),
        };
        let mut tampered = a.request(8);
        let at = tampered.leaf.len() - 70;
        tampered.leaf[at] ^= 0x01;
        assert!(reason(l.append(tampered, T)).starts_with("receipt_signature: "));
        let mut wrong_doc = a.request(9);
        wrong_doc.attestation_document = a.attest(Some(a.binding.encode()), T + 60_000);
        assert!(reason(l.append(wrong_doc, T)).starts_with("attestation_hash: "));
        let mut foreign = a.request(10);
        foreign.leaf = a.receipt(10).sign(&ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]));
        assert!(reason(l.append(foreign, T)).starts_with("receipt_key_id: "));
        // Claimed fields must be the receipt's own.
        let mut lying = a.request(11);
        lying.fields.ok_count += 1;
        assert!(matches!(l.append(lying, T), Err(LedgerError::FieldMismatch { field: "ok_count", .. })));
        assert_eq!(l.store().size().unwrap(), 8);

        let check = check_of(&a);
        let report = verify_ledger(l.store(), &key.verifier(), Some(&check)).unwrap();
        assert!(report.is_ok(), "{:?}", report.issues);
        assert_eq!((report.size, report.checkpoints, report.receipts_checked), (8, 2, true));

        let bundle = prove(l.store(), &format!("{:032x}", 6)).unwrap();
        let (v, fields) = verify_bundle_and_receipt(&bundle, &key.verifier(), &check).unwrap();
        assert_eq!((v.leaf_index, v.checkpoint.size), (6, 8));
        assert_eq!(fields, crate::receipt_check::indexed_fields(&a.receipt(6)));
        // The same bundle under another root: the receipt check names the failure.
        let other = ProtocolReceipts::new(DevEnclave::new(2, T).anchor());
        let err = verify_bundle_and_receipt(&bundle, &key.verifier(), &other).unwrap_err();
        assert!(err.to_string().contains("attestation: root_pinned"), "{err}");
    }

    #[test]
    fn verification_is_cached_per_document_only() {
        let e = enclave();
        let check = check_of(&e);
        let leaf = e.sign(&e.receipt(1));
        check.verify(&leaf, &e.document).unwrap();
        check.verify(&leaf, &e.document).unwrap();
        assert_eq!(check.cache().len(), 1);
        // A cached document does not vouch for an edited copy of itself.
        let mut edited = e.document.clone();
        let at = edited.len() - 10;
        edited[at] ^= 0x01;
        assert_eq!(refusal(&check, &leaf, &edited), "attestation: signature");
    }
}
