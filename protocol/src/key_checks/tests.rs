use serde_json::json;

use super::*;

const ARN: &str = "arn:aws:kms:eu-central-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";

fn pcr0() -> Vec<u8> {
    vec![0xab; 48]
}

fn arn() -> KmsKeyArn {
    ARN.parse().unwrap()
}

fn evidence(policy: String) -> KeyEvidence {
    KeyEvidence {
        metadata: KeyMetadata {
            arn: ARN.into(),
            key_state: "Enabled".into(),
            enabled: true,
            origin: "AWS_KMS".into(),
            key_spec: "SYMMETRIC_DEFAULT".into(),
            key_usage: "ENCRYPT_DECRYPT".into(),
            multi_region: false,
        },
        policy,
        grants: Vec::new(),
        grants_truncated: false,
    }
}

/// The statements cdk/lib/keys.ts gives the fleet key (policy version 4, without PCR8; principals
/// shortened).
fn deployed_fleet_policy(image: &str) -> serde_json::Value {
    let release = ["kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyPair"];
    json!({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AllowAccountReadKeyPolicy", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
             "Action": ["kms:DescribeKey", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ListResourceTags", "kms:ListGrants"],
             "Resource": "*"},
            {"Sid": "AllowAccountKeyLifecycle", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
             "Action": ["kms:TagResource", "kms:UntagResource", "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion", "kms:EnableKeyRotation"],
             "Resource": "*"},
            {"Sid": "AllowBreakGlassKillSwitch", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/break-glass"},
             "Action": ["kms:DisableKey", "kms:EnableKey"], "Resource": "*"},
            {"Sid": "AllowAttestedEnclaveDecrypt", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/host"},
             "Action": "kms:Decrypt", "Resource": "*",
             "Condition": {"StringEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image}}},
            {"Sid": "AllowAttestedEnclaveNewEpochKeyPairs", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/host"},
             "Action": "kms:GenerateDataKeyPair", "Resource": "*",
             "Condition": {"StringEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image},
                           "StringEquals": {"kms:DataKeyPairSpec": "ECC_NIST_P256"},
                           "Null": {"kms:EncryptionContext:epoch": "false", "kms:EncryptionContext:not_after": "false"}}},
            {"Sid": "AllowHostReadKeyEvidence", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/host"},
             "Action": ["kms:DescribeKey", "kms:GetKeyPolicy", "kms:ListGrants"], "Resource": "*"},
            {"Sid": "DenyReleaseWithoutAttestation", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": release, "Resource": "*",
             "Condition": {"Null": {"kms:RecipientAttestation:ImageSha384": "true"}}},
            {"Sid": "DenyReleaseToOtherImages", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": release, "Resource": "*",
             "Condition": {"StringNotEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image}}},
            {"Sid": "DenyPolicyChangesGrantsReEncryptImportEncrypt", "Effect": "Deny", "Principal": {"AWS": "*"},
             "Action": ["kms:PutKeyPolicy", "kms:CreateGrant", "kms:ReEncrypt*", "kms:Import*", "kms:Encrypt"], "Resource": "*"}
        ]
    })
}

/// The statement of `doc` named `sid`.
fn statement<'a>(doc: &'a mut serde_json::Value, sid: &str) -> &'a mut serde_json::Value {
    doc["Statement"].as_array_mut().unwrap().iter_mut().find(|s| s["Sid"] == sid).unwrap()
}

const FORBIDDEN: &str = "DenyPolicyChangesGrantsReEncryptImportEncrypt";

fn failed(report: &KeyReport) -> Vec<&'static str> {
    report.failed().into_iter().map(KeyCheck::as_str).collect()
}

fn check_policy(doc: &serde_json::Value) -> Vec<&'static str> {
    failed(&evaluate(&evidence(doc.to_string()), &arn(), &pcr0()))
}

#[test]
fn the_deployed_fleet_key_policy_passes() {
    let report = evaluate(&evidence(deployed_fleet_policy(&hex::encode(pcr0())).to_string()), &arn(), &pcr0());
    assert!(report.passed(), "{:?}", report.checks);
    assert_eq!(report.checks.len(), 11, "every check is evaluated");
    assert!(check_policy(&deployed_fleet_policy(&hex::encode_upper(pcr0()))).is_empty(), "IgnoreCase");
}

#[test]
fn a_policy_without_the_deny_statements_is_named() {
    let image = hex::encode(pcr0());
    let without = |sid: &str| {
        let mut doc = deployed_fleet_policy(&image);
        doc["Statement"].as_array_mut().unwrap().retain(|s| s["Sid"] != sid);
        check_policy(&doc)
    };
    assert_eq!(without(FORBIDDEN), ["key_policy_denies_wrapping"]);
    assert_eq!(without("DenyReleaseWithoutAttestation"), ["key_policy_denies_unattested_release"]);
    assert_eq!(without("DenyReleaseToOtherImages"), ["key_policy_denies_unattested_release"]);
    // The policy the CDK app wrote before kms:Encrypt was denied.
    let mut old = deployed_fleet_policy(&image);
    statement(&mut old, FORBIDDEN)["Action"] = json!(["kms:PutKeyPolicy", "kms:CreateGrant", "kms:ReEncrypt*"]);
    assert_eq!(check_policy(&old), ["key_policy_denies_wrapping"]);
    // A Deny that exempts a principal, is conditioned, or names only some principals does not count.
    for (field, value) in [
        ("NotPrincipal", json!({"AWS": "arn:aws:iam::123456789012:role/operator"})),
        ("Condition", json!({"StringEquals": {"aws:PrincipalAccount": "999999999999"}})),
        ("Principal", json!({"AWS": "arn:aws:iam::123456789012:role/host"})),
        ("Resource", json!("arn:aws:kms:eu-central-2:123456789012:key/other")),
    ] {
        let mut doc = deployed_fleet_policy(&image);
        statement(&mut doc, FORBIDDEN)[field] = value;
        assert_eq!(check_policy(&doc), ["key_policy_denies_wrapping"], "{field}");
    }
    // A release Deny for another image's PCR0 protects nothing.
    let mut doc = deployed_fleet_policy(&image);
    statement(&mut doc, "DenyReleaseToOtherImages")["Condition"] = json!({"StringNotEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": "cd".repeat(48)}});
    assert_eq!(check_policy(&doc), ["key_policy_denies_unattested_release"]);
}

#[test]
fn a_duplicate_key_anywhere_is_refused() {
    let image = hex::encode(pcr0());
    let text = deployed_fleet_policy(&image).to_string();
    // The forbidden-operations Deny also says "Allow": which one IAM takes is not ours to guess.
    let duplicated = text.replacen(r#""Effect":"Deny","Principal":{"AWS":"*"},"Resource":"*","Sid":"DenyPolicyChangesGrantsReEncryptImportEncrypt""#,
        r#""Effect":"Deny","Effect":"Allow","Principal":{"AWS":"*"},"Resource":"*","Sid":"DenyPolicyChangesGrantsReEncryptImportEncrypt""#, 1);
    assert_ne!(duplicated, text);
    let report = evaluate(&evidence(duplicated), &arn(), &pcr0());
    assert_eq!(failed(&report)[0], "key_policy_document");
    assert!(report.failures().contains("duplicate key \"Effect\""), "{}", report.failures());
}

#[test]
fn grants_are_named() {
    let mut e = evidence(deployed_fleet_policy(&hex::encode(pcr0())).to_string());
    e.grants.push(GrantSummary {
        grant_id: "g-1".into(),
        grantee_principal: "arn:aws:iam::123456789012:role/operator".into(),
        operations: vec!["Encrypt".into()],
    });
    let report = evaluate(&e, &arn(), &pcr0());
    assert_eq!(failed(&report), ["key_grants"]);
    assert!(report.failures().contains("role/operator"));
    e.grants.clear();
    e.grants_truncated = true;
    assert_eq!(failed(&evaluate(&e, &arn(), &pcr0())), ["key_grants"]);
}

#[test]
fn every_way_to_wrap_chosen_material_or_release_outside_the_image_is_named() {
    let image = hex::encode(pcr0());
    let with = |extra: serde_json::Value| {
        let mut doc = deployed_fleet_policy(&image);
        doc["Statement"].as_array_mut().unwrap().push(extra);
        check_policy(&doc)
    };
    let allow = |action: &str| json!({"Sid": "Extra", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": action, "Resource": "*"});
    for action in ["kms:Encrypt", "kms:ReEncrypt*", "kms:Import*", "kms:PutKeyPolicy", "kms:CreateGrant", "kms:*", "*", "KMS:encrypt", "kms:En?rypt"] {
        assert!(with(allow(action)).contains(&"key_policy_no_wrapping"), "{action}");
    }
    for action in ["kms:GenerateDataKeyPair", "kms:GenerateDataKey", "kms:Decrypt"] {
        assert_eq!(with(allow(action)), ["key_policy_attested_release"], "{action}");
    }
    let other_image = json!({"Sid": "Other", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:Decrypt", "Resource": "*",
        "Condition": {"StringEquals": {"kms:RecipientAttestation:ImageSha384": [image.clone(), "cd".repeat(48)]}}});
    assert_eq!(with(other_image), ["key_policy_attested_release"]);
    let like = json!({"Sid": "Like", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "kms:Decrypt", "Resource": "*",
        "Condition": {"StringLike": {"kms:RecipientAttestation:ImageSha384": "*"}}});
    assert_eq!(with(like), ["key_policy_attested_release"]);
    let not_action = json!({"Sid": "Not", "Effect": "Allow", "Principal": {"AWS": "*"}, "NotAction": "kms:Decrypt", "Resource": "*"});
    assert_eq!(with(not_action)[0], "key_policy_document");
    assert!(with(allow("kms:Describe*")).is_empty(), "read-only operations are fine");
}

#[test]
fn key_metadata_that_lets_material_be_known_is_named() {
    let good = evidence(deployed_fleet_policy(&hex::encode(pcr0())).to_string());
    let cases: [(fn(&mut KeyMetadata), &str); 6] = [
        (|m| m.origin = "EXTERNAL".into(), "key_origin"),
        (|m| m.multi_region = true, "key_multi_region"),
        (|m| m.enabled = false, "key_state"),
        (|m| m.key_state = "PendingDeletion".into(), "key_state"),
        (|m| m.key_spec = "RSA_2048".into(), "key_spec"),
        (|m| m.arn = "arn:aws:kms:eu-central-2:444455556666:key/host".into(), "key_arn"),
    ];
    for (change, name) in cases {
        let mut e = good.clone();
        change(&mut e.metadata);
        assert_eq!(failed(&evaluate(&e, &arn(), &pcr0())), [name]);
    }
    assert_eq!(failed(&evaluate(&evidence("not json".into()), &arn(), &pcr0())).len(), 5);
}

#[test]
fn the_digest_covers_every_field() {
    let e = evidence(deployed_fleet_policy(&hex::encode(pcr0())).to_string());
    let mut other = e.clone();
    other.grants_truncated = true;
    assert_ne!(e.digest(), other.digest());
    let round: KeyEvidence = serde_json::from_str(&e.to_json()).unwrap();
    assert_eq!(round.digest(), e.digest());
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
