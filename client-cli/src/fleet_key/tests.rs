use std::collections::BTreeMap;

use cloud_local::LocalKeyPolicy;
use protocol::attestation::{Policy, TrustAnchor};
use serde_json::json;

use super::*;

const ARN: &str = "arn:aws:kms:eu-central-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";

fn pcr0() -> Vec<u8> {
    vec![0xab; 48]
}

fn policy() -> Policy {
    Policy { root: TrustAnchor::aws_nitro_g1(), pcrs: BTreeMap::from([(0, pcr0())]), allow_debug: false, max_age_s: 3600 }
}

fn described(policy: String) -> KeyDescription {
    KeyDescription {
        arn: ARN.into(),
        origin: "AWS_KMS".into(),
        key_spec: "SYMMETRIC_DEFAULT".into(),
        key_usage: "ENCRYPT_DECRYPT".into(),
        enabled: true,
        multi_region: false,
        policy,
    }
}

/// The statements cdk/lib/keys.ts gives the fleet key (principals shortened).
fn deployed_fleet_policy(image: &str) -> serde_json::Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AllowAccountReadKeyPolicy", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
             "Action": ["kms:DescribeKey", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ListResourceTags"], "Resource": "*"},
            {"Sid": "AllowAccountKeyLifecycle", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
             "Action": ["kms:TagResource", "kms:UntagResource", "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion", "kms:EnableKeyRotation"], "Resource": "*"},
            {"Sid": "AllowAttestedEnclaveDecrypt", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/host"},
             "Action": "kms:Decrypt", "Resource": "*",
             "Condition": {"StringEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image}}},
            {"Sid": "AllowRotationNewEpochKeyPairs", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/rotation"},
             "Action": "kms:GenerateDataKeyPairWithoutPlaintext", "Resource": "*",
             "Condition": {"StringEquals": {"kms:DataKeyPairSpec": "ECC_NIST_P256"}}},
            {"Sid": "DenyReleaseWithoutAttestation", "Effect": "Deny", "Principal": {"AWS": "*"},
             "Action": ["kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyPair"], "Resource": "*",
             "Condition": {"Null": {"kms:RecipientAttestation:ImageSha384": "true"}}},
            {"Sid": "DenyForbidden", "Effect": "Deny", "Principal": {"AWS": "*"},
             "Action": ["kms:PutKeyPolicy", "kms:CreateGrant", "kms:ReEncrypt*"], "Resource": "*"}
        ]
    })
}

fn failed(report: &KeyReport) -> Vec<&'static str> {
    report.failed().into_iter().map(KeyCheck::as_str).collect()
}

#[test]
fn the_deployed_fleet_key_policy_passes() {
    let pin: KmsKeyArn = ARN.parse().unwrap();
    let report = check(&described(deployed_fleet_policy(&hex::encode(pcr0())).to_string()), &pin, &policy());
    assert!(report.passed(), "{:?}", report.checks);
    assert_eq!(report.checks.len(), 8, "every check is evaluated");
    // Upper-case hex in the condition is the same value (StringEqualsIgnoreCase).
    let upper = deployed_fleet_policy(&hex::encode_upper(pcr0())).to_string();
    assert!(check(&described(upper), &pin, &policy()).passed());
}

#[test]
fn the_local_fleet_key_policy_passes_and_an_unrestricted_key_fails() {
    let pin: KmsKeyArn = ARN.parse().unwrap();
    let fleet = LocalKeyPolicy::fleet(pcr0(), None).to_iam_policy().to_string();
    let report = check(&described(fleet), &pin, &policy());
    assert!(report.passed(), "{:?}", report.checks);
    let unrestricted = LocalKeyPolicy::unrestricted().to_iam_policy().to_string();
    assert_eq!(failed(&check(&described(unrestricted), &pin, &policy())), ["key_policy_no_wrapping", "key_policy_attested_release"]);
    // The model key lets its publisher Encrypt: never a fleet key.
    let model = LocalKeyPolicy::model(pcr0(), None).to_iam_policy().to_string();
    assert_eq!(failed(&check(&described(model), &pin, &policy())), ["key_policy_no_wrapping"]);
}

#[test]
fn every_way_to_wrap_chosen_material_or_release_outside_the_image_is_named() {
    let pin: KmsKeyArn = ARN.parse().unwrap();
    let image = hex::encode(pcr0());
    let with = |extra: serde_json::Value| {
        let mut doc = deployed_fleet_policy(&image);
        doc["Statement"].as_array_mut().unwrap().push(extra);
        failed(&check(&described(doc.to_string()), &pin, &policy()))
    };
    let allow = |action: &str| json!({"Sid": "Extra", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": action, "Resource": "*"});
    for action in ["kms:Encrypt", "kms:ReEncrypt*", "kms:Import*", "kms:PutKeyPolicy", "kms:CreateGrant", "kms:*", "*", "KMS:encrypt", "kms:En?rypt"] {
        assert!(with(allow(action)).contains(&"key_policy_no_wrapping"), "{action}");
    }
    for action in ["kms:GenerateDataKeyPair", "kms:GenerateDataKey", "kms:Decrypt"] {
        assert_eq!(with(allow(action)), ["key_policy_attested_release"], "{action}");
    }
    // Released to another image, or to any of a list that holds another image.
    let other_image = json!({"Sid": "Other", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:Decrypt", "Resource": "*",
        "Condition": {"StringEquals": {"kms:RecipientAttestation:ImageSha384": [image.clone(), "cd".repeat(48)]}}});
    assert_eq!(with(other_image), ["key_policy_attested_release"]);
    let like = json!({"Sid": "Like", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:Decrypt", "Resource": "*",
        "Condition": {"StringLike": {"kms:RecipientAttestation:ImageSha384": "*"}}});
    assert_eq!(with(like), ["key_policy_attested_release"]);
    let not_action = json!({"Sid": "Not", "Effect": "Allow", "Principal": {"AWS": "*"}, "NotAction": "kms:Decrypt", "Resource": "*"});
    assert_eq!(with(not_action), ["key_policy_document", "key_policy_no_wrapping", "key_policy_attested_release"]);
    // Read-only and lifecycle grants are fine.
    assert!(with(allow("kms:Describe*")).is_empty());
}

#[test]
fn key_metadata_that_lets_material_be_known_is_named() {
    let pin: KmsKeyArn = ARN.parse().unwrap();
    let good = described(deployed_fleet_policy(&hex::encode(pcr0())).to_string());
    let cases: [(fn(&mut KeyDescription), &str); 5] = [
        (|d| d.origin = "EXTERNAL".into(), "key_origin"),
        (|d| d.multi_region = true, "key_multi_region"),
        (|d| d.enabled = false, "key_state"),
        (|d| d.key_spec = "RSA_2048".into(), "key_spec"),
        (|d| d.arn = "arn:aws:kms:eu-central-2:444455556666:key/host".into(), "key_arn"),
    ];
    for (change, name) in cases {
        let mut d = good.clone();
        change(&mut d);
        assert_eq!(failed(&check(&d, &pin, &policy())), [name]);
    }
    assert_eq!(failed(&check(&described("not json".into()), &pin, &policy())).len(), 3);
}

#[test]
fn iam_wildcards() {
    assert!(glob("kms:*", "kms:encrypt"));
    assert!(glob("kms:re*", "kms:reencryptfrom"));
    assert!(glob("*", "kms:decrypt"));
    assert!(glob("kms:?ecrypt", "kms:decrypt"));
    assert!(!glob("kms:decrypt", "kms:decrypts"));
    assert!(!glob("kms:g*plaintext", "kms:generatedatakey"));
}
