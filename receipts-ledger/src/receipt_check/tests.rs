use std::sync::Arc;

use protocol::attestation::{PolicySet, TrustAnchor, policy_id};
use protocol::dev_enclave::DevEnclave;
use protocol::receipt_check::ReceiptCheckError;

use super::*;
use crate::Ledger;
use crate::entry::FieldError;
use crate::testing::dev_request;
use crate::bundle::{prove, verify_bundle_and_receipt};
use crate::ledger::LedgerError;
use crate::note::SignerKey;
use crate::store::{AppendOutcome, CheckpointPolicy, LedgerStore, SqliteStore};
use crate::verify::verify_ledger;

/// 2025-11-01T00:00:00Z: the documents' time; checks run years later.
const T: u64 = 1_761_955_200_000;

fn enclave() -> DevEnclave {
    DevEnclave::new(1, T)
}

fn check_of(e: &DevEnclave) -> ReceiptVerifier {
    ReceiptVerifier::new(e.anchor())
}

#[test]
fn error_text_names_the_check() {
    let e = enclave();
    let check = check_of(&e);
    let leaf = e.sign(&e.receipt(1));
    let republished = e.attest(Some(e.binding.encode()), T + 1);
    let refusal = check.check(&leaf, &republished).unwrap_err();
    assert_eq!(refusal.check(), "attestation_hash");
    assert!(refusal.to_string().starts_with("attestation_hash: receipt names document "), "{refusal}");
    let foreign = DevEnclave::new(2, T);
    assert!(check.check(&leaf, &foreign.document).unwrap_err().to_string().starts_with("attestation: root_pinned: "));
}

#[test]
fn the_fields_are_the_receipts_own_with_the_policy_the_check_found() {
    let e = enclave();
    let receipt = e.receipt(5);
    let fields = check_of(&e).check(&e.sign(&receipt), &e.document).unwrap();
    assert_eq!(
        fields,
        IndexedFields {
            kind: EntryKind::Job,
            job_id: "00000000000000000000000000000005".parse().unwrap(),
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
}

/// A receipt that verifies but carries a value the index cannot hold is refused as `fields`.
#[test]
fn a_verified_receipt_out_of_the_ledgers_limits_is_refused_as_fields() {
    let e = enclave();
    let mut receipt = e.receipt(1);
    receipt.records_ok = u64::MAX;
    let refusal = check_of(&e).check(&e.sign(&receipt), &e.document).unwrap_err();
    assert_eq!(refusal, ReceiptRefusal::Fields(FieldError::TooBig { field: "ok_count", max: i64::MAX as u64 }));
    assert_eq!(refusal.check(), "fields");
}

fn ledger(check: ReceiptVerifier) -> (Ledger<SqliteStore>, SignerKey) {
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
        l.append(dev_request(&a, j), T + j).unwrap();
    }
    let reason = |r: Result<_, LedgerError>| match r {
        Err(LedgerError::ReceiptRejected { reason, .. }) => reason.to_string(),
        other => panic!("{:?}", other.map(|_| ())),
    };
    let mut tampered = dev_request(&a, 8);
    let at = tampered.leaf.len() - 70;
    tampered.leaf[at] ^= 0x01;
    assert!(reason(l.append(tampered, T)).starts_with("receipt_signature: "));
    let mut wrong_doc = dev_request(&a, 9);
    wrong_doc.attestation_document = a.attest(Some(a.binding.encode()), T + 60_000);
    assert!(reason(l.append(wrong_doc, T)).starts_with("attestation_hash: "));
    let mut foreign = dev_request(&a, 10);
    foreign.leaf = a.receipt(10).sign(&ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]));
    assert!(reason(l.append(foreign, T)).starts_with("receipt_key_id: "));
    // Claimed fields must be the receipt's own.
    let mut lying = dev_request(&a, 11);
    lying.fields.ok_count += 1;
    assert!(matches!(l.append(lying, T), Err(LedgerError::FieldMismatch { field: "ok_count", .. })));
    assert_eq!(l.store().size().unwrap(), 8);

    let check = check_of(&a);
    let report = verify_ledger(l.store(), &key.verifier(), Some(&check)).unwrap();
    assert!(report.is_ok(), "{:?}", report.issues);
    assert_eq!((report.size, report.checkpoints, report.receipts_checked), (8, 2, true));

    let bundle = prove(l.store(), &crate::testing::test_job(6)).unwrap();
    let (v, fields) = verify_bundle_and_receipt(&bundle, &key.verifier(), &check).unwrap();
    assert_eq!((v.leaf_index, v.checkpoint.size), (6, 8));
    assert_eq!(fields, indexed_fields(&a.receipt(6)));
    // The same bundle under another root: the receipt check names the failure.
    let other = ReceiptVerifier::new(DevEnclave::new(2, T).anchor());
    let err = verify_bundle_and_receipt(&bundle, &key.verifier(), &other).unwrap_err();
    assert!(err.to_string().contains("attestation: root_pinned"), "{err}");
}

/// Usage receipts of online requests go into the same ledger, checked the same way, and a query
/// tells them from jobs.
#[test]
fn usage_receipts_are_appended_verified_and_queried_beside_jobs() {
    let a = enclave();
    let (mut l, key) = ledger(check_of(&a));
    let usage_request = |u: &UsageReceipt| {
        let leaf = u.sign(&a.receipt_key);
        append_request(&check_of(&a), leaf, a.document.clone()).unwrap()
    };
    l.append(dev_request(&a, 0), T).unwrap();
    let first = a.usage_receipt(0);
    let appended = usage_request(&first);
    assert_eq!(appended.fields.kind, EntryKind::Usage);
    assert_eq!(appended.fields.job_id.0, UsageReceipt::usage_id(&a.binding.receipt_key_id(), 0));
    assert_eq!((appended.fields.ok_count, appended.fields.client_key_id.as_str()), (7, "55".repeat(32).as_str()));
    l.append(appended.clone(), T).unwrap();
    l.append(usage_request(&a.usage_receipt(1)), T).unwrap();
    l.append(dev_request(&a, 1), T).unwrap();
    // The same usage receipt again is the entry the ledger holds; nothing new.
    assert!(matches!(l.append(appended, T).unwrap(), AppendOutcome::Existing { index: 1, same_leaf: true }));

    // What a host can do to a usage receipt is refused by name.
    let reason = |r: Result<_, LedgerError>| match r {
        Err(LedgerError::ReceiptRejected { reason, .. }) => reason.to_string(),
        other => panic!("{:?}", other.map(|_| ())),
    };
    let mallory = ed25519_dalek::SigningKey::from_bytes(&[0x66; 32]);
    let mut forged = usage_request(&a.usage_receipt(2));
    forged.leaf = a.usage_receipt(2).sign(&mallory);
    assert!(reason(l.append(forged, T)).starts_with("receipt_key_id: "));
    let mut inflated = usage_request(&a.usage_receipt(3));
    let count = inflated.leaf.windows(7).position(|w| w == b"\x66inputs").unwrap() + 7;
    inflated.leaf[count] ^= 0x01;
    assert!(reason(l.append(inflated, T)).starts_with("receipt_signature: "));
    let mut lying = usage_request(&a.usage_receipt(4));
    lying.fields.kind = EntryKind::Job;
    assert!(matches!(l.append(lying, T), Err(LedgerError::FieldMismatch { field: "kind", .. })));
    assert_eq!(l.store().size().unwrap(), 4);

    let check = check_of(&a);
    let report = verify_ledger(l.store(), &key.verifier(), Some(&check)).unwrap();
    assert!(report.is_ok(), "{:?}", report.issues);
    let kinds = |kind| {
        let rows = l.store().query(&crate::store::Query { kind, ..Default::default() }).unwrap();
        rows.iter().map(|e| e.index).collect::<Vec<_>>()
    };
    assert_eq!(kinds(Some(EntryKind::Usage)), vec![1, 2]);
    assert_eq!(kinds(Some(EntryKind::Job)), vec![0, 3]);
    assert_eq!(kinds(None), vec![0, 1, 2, 3]);
    // A copy rebuilt from the leaves alone reads the same kind and fields.
    let entry = l.store().entry(1).unwrap().unwrap();
    let claims = ProtocolLeaves.read(&entry.leaf).unwrap();
    assert_eq!(claims.fields.first_difference(&entry.fields), None);
    // A usage entry proves like a job's.
    let bundle = prove(l.store(), &entry.fields.job_id).unwrap();
    let (_, fields) = verify_bundle_and_receipt(&bundle, &key.verifier(), &check).unwrap();
    assert_eq!(fields.kind, EntryKind::Usage);
}

/// The allow-list as the ledger applies it.
mod policies {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn publisher() -> SigningKey {
        SigningKey::from_bytes(&[0x51; 32])
    }

    fn enforcing(anchor: TrustAnchor, images: &[&DevEnclave]) -> Arc<ReceiptVerifier> {
        let signed = images.iter().enumerate().map(|(i, e)| (format!("image-{i}.json"), e.policy(&publisher()))).collect();
        let set = PolicySet::verify(&publisher().verifying_key(), signed).unwrap();
        Arc::new(ReceiptVerifier::enforcing(anchor, set).unwrap())
    }

    fn ledger(check: Arc<ReceiptVerifier>) -> Ledger<SqliteStore> {
        let signer = SignerKey::from_seed("ledger.ephem-batch.example/test", &[0x42; 32]).unwrap();
        Ledger::new(SqliteStore::open_in_memory().unwrap(), Box::new(check), Box::new(signer), CheckpointPolicy::default())
    }

    fn rejected(r: Result<AppendOutcome, LedgerError>) -> String {
        match r {
            Err(LedgerError::ReceiptRejected { reason, .. }) => reason.to_string(),
            other => panic!("not refused by the check: {other:?}"),
        }
    }

    fn policy_of(l: &Ledger<SqliteStore>, job: u64) -> Option<String> {
        l.store().entry_by_job(&crate::testing::test_job(job)).unwrap().unwrap().fields.policy
    }

    /// A host runs its own image on genuine hardware (same root, another PCR0) and signs a
    /// receipt for the victim's job id before the genuine one arrives.
    #[test]
    fn ledger_refuses_a_receipt_from_another_image() {
        let genuine = DevEnclave::new(1, T);
        let squatter = DevEnclave::with_image(1, 0xee, T);
        let squat = dev_request(&squatter, 5);
        // Without the allow-list the squatter takes the job's slot for good.
        let mut open = ledger(Arc::new(ReceiptVerifier::new(genuine.anchor())));
        open.append(squat.clone(), T).unwrap();
        assert_eq!(open.append(dev_request(&genuine, 5), T).unwrap(), AppendOutcome::Existing { index: 0, same_leaf: false });

        let check = enforcing(genuine.anchor(), &[&genuine]);
        let refusal = check.verify(&squat.leaf, &squat.attestation_document).unwrap_err();
        assert!(matches!(refusal, ReceiptCheckError::Policy { allowed: 1, debug_mode: false, .. }), "{refusal}");
        assert_eq!(refusal.check(), "policy");
        let mut l = ledger(check.clone());
        let reason = rejected(l.append(squat, T));
        assert!(reason.starts_with(&format!("policy: the document's measurements (PCR0 {}", "ee".repeat(48))), "{reason}");
        assert_eq!(l.store().size().unwrap(), 0, "a refused receipt takes no slot");
        let genuine_request = append_request(&check, genuine.sign(&genuine.receipt(5)), genuine.document.clone()).unwrap();
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
        l.append(dev_request(&old, 1), T).unwrap();
        l.append(dev_request(&new, 2), T).unwrap();
        assert!(rejected(l.append(dev_request(&third, 3), T)).starts_with("policy: "));
        assert_eq!(policy_of(&l, 1), Some(hex::encode(policy_id(&old.policy(&publisher())))));
        assert_eq!(policy_of(&l, 2), Some(hex::encode(policy_id(&new.policy(&publisher())))));
        assert_eq!(l.store().size().unwrap(), 2);
        // A claimed policy is not believed either.
        let mut lying = dev_request(&old, 4);
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
        let r = dev_request(&debug, 1);
        // Refused by the document verification itself: no policy allows debug.
        assert_eq!(strict.verify(&r.leaf, &r.attestation_document).unwrap_err().check(), "attestation");
        let mut policy = debug.policy(&publisher()).policy;
        policy.allow_debug = true;
        let set = PolicySet::verify(&publisher().verifying_key(), vec![("debug".into(), policy.sign(&publisher()).unwrap())]).unwrap();
        let lenient = ReceiptVerifier::enforcing(debug.anchor(), set).unwrap();
        assert!(lenient.verify(&r.leaf, &r.attestation_document).unwrap().debug_mode);
        // A debug-allowing policy of another image does not let this one in.
        let other = DevEnclave::with_image(1, 0x0b, T);
        let mut policy = other.policy(&publisher()).policy;
        policy.allow_debug = true;
        let set = PolicySet::verify(&publisher().verifying_key(), vec![("other".into(), policy.sign(&publisher()).unwrap())]).unwrap();
        let err = ReceiptVerifier::enforcing(debug.anchor(), set).unwrap().verify(&r.leaf, &r.attestation_document).unwrap_err();
        assert!(matches!(err, ReceiptCheckError::Policy { debug_mode: true, .. }), "{err}");
    }
}
