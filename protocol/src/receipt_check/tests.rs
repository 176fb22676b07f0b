use std::collections::BTreeMap;

use super::*;
use crate::attestation::CheckName;
use crate::dev_enclave::{DEV_EPOCH, DevEnclave};

/// 2025-11-01T00:00:00Z: the documents' time; checks run years later.
const T: u64 = 1_761_955_200_000;

fn enclave() -> DevEnclave {
    DevEnclave::new(1, T)
}

fn check_of(e: &DevEnclave) -> ReceiptVerifier {
    ReceiptVerifier::new(e.anchor())
}

/// The failed check's name, with the attestation check appended (`attestation: chain`).
fn refusal(check: &ReceiptVerifier, leaf: &[u8], doc: &[u8]) -> String {
    match check.verify(leaf, doc) {
        Ok(_) => "accepted".into(),
        Err(ReceiptCheckError::Attestation(e)) => format!("attestation: {}", e.check()),
        Err(e) => e.check().into(),
    }
}

#[test]
fn a_real_receipt_is_accepted_with_what_it_was_checked_against() {
    let e = enclave();
    let receipt = e.receipt(5);
    let leaf = e.sign(&receipt);
    let v = check_of(&e).verify(&leaf, &e.document).unwrap();
    assert_eq!(v.receipt, receipt);
    assert_eq!(v.policy, None, "no allow-list, no policy");
    assert_eq!(v.document_timestamp_ms, T);
    assert_eq!(v.binding, e.binding);
    assert!(v.root.is_development());
    assert!(!v.debug_mode);
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
        refusal(&ReceiptVerifier::new(TrustAnchor::aws_nitro_g1()), &leaf, &e.document),
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

/// The failed check's name for a usage receipt.
fn usage_refusal(check: &ReceiptVerifier, leaf: &[u8], doc: &[u8]) -> String {
    match check.verify_usage(leaf, doc) {
        Ok(_) => "accepted".into(),
        Err(ReceiptCheckError::Attestation(e)) => format!("attestation: {}", e.check()),
        Err(e) => e.check().into(),
    }
}

#[test]
fn usage_receipts_pass_the_same_checks() {
    let e = enclave();
    let check = check_of(&e);
    let usage = e.usage_receipt(2);
    let leaf = usage.sign(&e.receipt_key);
    let verified = check.verify_usage(&leaf, &e.document).unwrap();
    assert_eq!(verified.usage, usage);
    assert_eq!(verified.usage_id.0, crate::usage::UsageReceipt::usage_id(&e.binding.receipt_key_id(), 2));

    // A job receipt is not a usage receipt, and the other way round.
    assert_eq!(usage_refusal(&check, &e.sign(&e.receipt(1)), &e.document), "receipt");
    assert_eq!(refusal(&check, &leaf, &e.document), "receipt");
    // A host's own key, however it labels the message.
    let mallory = ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]);
    assert_eq!(usage_refusal(&check, &usage.sign(&mallory), &e.document), "receipt_key_id");
    // Another enclave's document; claims that are not the document's.
    let foreign = DevEnclave::new(2, T);
    assert_eq!(usage_refusal(&check, &leaf, &foreign.document), "attestation: root_pinned");
    let signed = |f: &dyn Fn(&mut crate::usage::UsageReceipt)| {
        let mut u = e.usage_receipt(2);
        f(&mut u);
        u.sign(&e.receipt_key)
    };
    assert_eq!(usage_refusal(&check, &signed(&|u| u.attestation_sha256 = [1; 32]), &e.document), "attestation_hash");
    assert_eq!(usage_refusal(&check, &signed(&|u| u.epoch += 1), &e.document), "fleet_key");
    assert_eq!(usage_refusal(&check, &signed(&|u| u.pcrs.clear()), &e.document), "pcrs");
    // Every payload byte is covered by the signature.
    let payload = usage.to_payload();
    let start = leaf.windows(payload.len()).position(|w| w == payload).unwrap();
    for i in start..start + payload.len() {
        let mut t = leaf.clone();
        t[i] ^= 0x01;
        let name = usage_refusal(&check, &t, &e.document);
        assert!(name == "receipt" || name == "receipt_signature", "payload byte {i}: {name}");
    }
}

#[test]
fn usage_receipts_of_an_image_no_policy_admits_are_refused() {
    let e = enclave();
    let publisher = ed25519_dalek::SigningKey::from_bytes(&[0x21; 32]);
    let other_image = DevEnclave::with_image(1, 9, T);
    let set = PolicySet::verify(&publisher.verifying_key(), vec![("other.json".into(), other_image.policy(&publisher))]).unwrap();
    let check = ReceiptVerifier::enforcing(e.anchor(), set).unwrap();
    let leaf = e.usage_receipt(0).sign(&e.receipt_key);
    assert_eq!(usage_refusal(&check, &leaf, &e.document), "policy");
}
