use std::collections::BTreeMap;

use cloud::Kms;
use cloud_local::{AttestationTrust, LocalKeyPolicy, LocalKms};
use protocol::attestation::{Policy, TrustAnchor};

use super::*;

fn pcr0() -> Vec<u8> {
    vec![0xab; 48]
}

fn policy() -> Policy {
    Policy { root: TrustAnchor::aws_nitro_g1(), pcrs: BTreeMap::from([(0, pcr0())]), allow_debug: false, max_age_s: 3600 }
}

fn failed(report: &KeyReport) -> Vec<&'static str> {
    report.failed().into_iter().map(KeyCheck::as_str).collect()
}

/// The local KMS renders its keys' policies as IAM documents and lists their grants: the same
/// checks read them as they read a deployment's.
#[test]
fn local_keys_read_as_the_deployments_do() {
    let dir = tempfile::tempdir().unwrap();
    let trust = AttestationTrust { root_pem_path: dir.path().join("root.pem"), max_document_age: std::time::Duration::from_secs(300) };
    let kms = LocalKms::open(dir.path().join("kms.sqlite"), trust).unwrap();
    let check_key = |policy_of_key: LocalKeyPolicy| {
        let key = kms.create_key(policy_of_key, "test").unwrap();
        let evidence = kms.key_evidence(&key).unwrap();
        (key.clone(), failed(&check(&evidence, &key.parse().unwrap(), &policy())))
    };
    assert_eq!(check_key(LocalKeyPolicy::fleet(pcr0(), None)).1, Vec::<&str>::new());
    let (_, unrestricted) = check_key(LocalKeyPolicy::unrestricted());
    assert_eq!(
        unrestricted,
        ["key_policy_no_wrapping", "key_policy_denies_wrapping", "key_policy_attested_release", "key_policy_denies_unattested_release"]
    );
    let (_, model) = check_key(LocalKeyPolicy::model(pcr0(), None));
    assert_eq!(model, ["key_policy_no_wrapping", "key_policy_denies_wrapping"], "the model key lets its publisher Encrypt");
    // The fleet key of the old shape (no Deny of Encrypt) with a grant made while it was allowed.
    let old = LocalKeyPolicy { deny_wrapping: false, ..LocalKeyPolicy::fleet(pcr0(), None) };
    let key = kms.create_key(old, "old").unwrap();
    kms.create_grant(&key, "arn:aws:iam::000000000000:role/operator", &["Encrypt"]).unwrap();
    let evidence = kms.key_evidence(&key).unwrap();
    assert_eq!(failed(&check(&evidence, &key.parse().unwrap(), &policy())), ["key_grants", "key_policy_denies_wrapping"]);
}
