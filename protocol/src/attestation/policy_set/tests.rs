use super::*;
use crate::dev_enclave::DevEnclave;
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
