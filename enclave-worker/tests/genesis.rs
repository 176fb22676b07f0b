//! Epoch genesis (docs/protocol.md §7.3.1) against a KMS stand-in that answers
//! `GenerateDataKeyPair` with a `Recipient` as KMS does — it verifies the document, generates a
//! P-256 pair and seals its PKCS#8 to the document's one-shot key as a real CMS envelope — and
//! `DescribeKey`/`GetKeyPolicy`/`ListGrants` with whatever evidence a test gives it. The clients'
//! side (`attestation::check_genesis`) is run on what the worker made, and on what an operator
//! would make instead.

use std::collections::BTreeMap;

use enclave_worker::key_release::genesis::{CreatedEpoch, create_fleet_epoch};
use enclave_worker::key_release::{FleetEpoch, KeyReleaseError, KmsTransport, KmsTransportError, RsaKeyPool};
use enclave_worker::nsm::{DevNsm, Nsm, own_binding};
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
use protocol::attestation::{GenesisError, VerifyOptions, check_epoch_lifetime, check_genesis, verify};
use protocol::envelope::FleetSecretKey;
use protocol::key_checks::{GrantSummary, KeyEvidence, KeyMetadata};
use protocol::kms_api::GenerateDataKeyPairResponse;
use protocol::kms_arn::KmsKeyArn;

const KEY_ARN: &str = "arn:aws:kms:eu-west-1:111122223333:key/fleet";
const DAY_MS: u64 = 86_400_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn key() -> KmsKeyArn {
    KEY_ARN.parse().unwrap()
}

/// The policy the CDK app gives the fleet key, for `image` (hex PCR0).
fn fleet_policy(image: &str) -> String {
    let release = ["kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyPair"];
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AllowAttestedEnclaveRelease", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:role/host"},
             "Action": ["kms:Decrypt", "kms:GenerateDataKeyPair"], "Resource": "*",
             "Condition": {"StringEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image}}},
            {"Sid": "DenyReleaseWithoutAttestation", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": release, "Resource": "*",
             "Condition": {"Null": {"kms:RecipientAttestation:ImageSha384": "true"}}},
            {"Sid": "DenyReleaseToOtherImages", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": release, "Resource": "*",
             "Condition": {"StringNotEqualsIgnoreCase": {"kms:RecipientAttestation:ImageSha384": image}}},
            {"Sid": "DenyWrapping", "Effect": "Deny", "Principal": {"AWS": "*"},
             "Action": ["kms:Encrypt", "kms:ReEncrypt*", "kms:CreateGrant", "kms:PutKeyPolicy", "kms:Import*"], "Resource": "*"}
        ]
    })
    .to_string()
}

fn evidence(policy: String) -> KeyEvidence {
    KeyEvidence {
        metadata: KeyMetadata {
            arn: KEY_ARN.into(),
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

/// How the stand-in answers `GenerateDataKeyPair`.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Honest,
    /// Names another key as the one that generated the pair.
    OtherKeyId,
    /// Sends another public key than the private key's.
    OtherPublicKey,
}

struct GenesisKms {
    evidence: KeyEvidence,
    answer: Answer,
    root: protocol::attestation::TrustAnchor,
    generated: u32,
}

impl KmsTransport for GenesisKms {
    fn decrypt(&mut self, _: Option<String>, _: Vec<u8>, _: BTreeMap<String, String>, _: Vec<u8>) -> Result<(String, Vec<u8>), KmsTransportError> {
        Err(KmsTransportError::new("ValidationException", "not served"))
    }

    fn key_evidence(&mut self, _: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        Ok(self.evidence.clone())
    }

    fn generate_data_key_pair(
        &mut self,
        key: &KmsKeyArn,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        self.generated += 1;
        assert_eq!(encryption_context.len(), 2, "{{epoch, not_after}}");
        let verified = verify(&recipient_attestation, &VerifyOptions::new(self.root.clone(), now_ms()))
            .map_err(|e| KmsTransportError::new("AccessDeniedException", e.to_string()))?;
        let one_shot = verified.document.public_key.unwrap();
        let secret = p256::SecretKey::from_slice(&FleetSecretKey::generate().to_scalar_bytes()).unwrap();
        let pkcs8 = secret.to_pkcs8_der().unwrap().as_bytes().to_vec();
        let mut public = secret.public_key();
        if self.answer == Answer::OtherPublicKey {
            public = p256::SecretKey::from_slice(&FleetSecretKey::generate().to_scalar_bytes()).unwrap().public_key();
        }
        let envelope = protocol::cms::seal(&one_shot, &pkcs8, &mut rsa::rand_core::UnwrapErr(getrandom::SysRng)).unwrap();
        let key_id = if self.answer == Answer::OtherKeyId { "arn:aws:kms:eu-west-1:444455556666:key/host".into() } else { key.to_string() };
        Ok(GenerateDataKeyPairResponse {
            key_id,
            public_key: public.to_public_key_der().unwrap().as_bytes().to_vec(),
            private_key_ciphertext_blob: b"wrapped under the fleet key".to_vec(),
            ciphertext_for_recipient: Some(envelope),
            private_key_plaintext: None,
        })
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    nsm: DevNsm,
    pool: RsaKeyPool,
    kms: GenesisKms,
}

fn setup(evidence_of: impl FnOnce(&str) -> KeyEvidence, answer: Answer) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let nsm = DevNsm::open(dir.path().join("nsm")).unwrap();
    let image = hex::encode(&nsm.pcrs()[&0]);
    let kms = GenesisKms { evidence: evidence_of(&image), answer, root: nsm.trust_anchor(), generated: 0 };
    Setup { _dir: dir, nsm, pool: RsaKeyPool::start(1, 1), kms }
}

fn create(s: &mut Setup, not_after_ms: u64) -> Result<CreatedEpoch, KeyReleaseError> {
    create_fleet_epoch(&s.nsm, &s.pool, &mut s.kms, &key(), FleetEpoch { epoch: 4, not_after_ms })
}

fn refusal(result: Result<CreatedEpoch, KeyReleaseError>) -> KeyReleaseError {
    match result {
        Ok(_) => panic!("expected the epoch to be refused"),
        Err(error) => error,
    }
}

/// What a client verifies the genesis with: the policy's root and PCR0, at the document's time.
fn client_options(s: &Setup) -> VerifyOptions {
    let mut options = VerifyOptions::new(s.nsm.trust_anchor(), now_ms());
    options.expected_pcrs = BTreeMap::from([(0, s.nsm.pcrs()[&0].clone())]);
    options.allow_debug = true;
    options
}

#[test]
fn an_epoch_created_inside_the_enclave_carries_its_proof() {
    let mut s = setup(|image| evidence(fleet_policy(image)), Answer::Honest);
    let not_after = now_ms() + 7 * DAY_MS;
    let created = create(&mut s, not_after).unwrap();
    assert_eq!(created.record.public_key, hex::encode(created.secret.public_key().to_bytes()));
    assert_eq!((created.record.epoch, created.record.not_after_ms, created.genesis.epoch), (4, not_after, 4));
    let receipt = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let binding = own_binding(&created.secret, &receipt, 4, not_after, &key()).unwrap();
    let born = check_genesis(&created.genesis, &binding, &client_options(&s)).unwrap();
    assert_eq!(born.evidence_digest, created.genesis.key_evidence.digest());
    check_epoch_lifetime(&binding, now_ms(), now_ms()).unwrap();

    // The operator's own key, published under the genuine genesis: refused.
    let operator = FleetSecretKey::generate();
    let forged = own_binding(&operator, &receipt, 4, not_after, &key()).unwrap();
    let error = check_genesis(&created.genesis, &forged, &client_options(&s)).unwrap_err();
    assert_eq!(error.check(), "fleet_key_genesis", "{error}");
    // Evidence edited after the fact (say, a grant hidden): the digest no longer matches.
    let mut edited = created.genesis.clone();
    edited.key_evidence.policy.push(' ');
    assert_eq!(check_genesis(&edited, &binding, &client_options(&s)).unwrap_err(), GenesisError::EvidenceDigest);
    // Another image's policy: the genesis document does not pass it.
    let mut other_image = client_options(&s);
    other_image.expected_pcrs = BTreeMap::from([(0, vec![0xcd; 48])]);
    assert_eq!(check_genesis(&created.genesis, &binding, &other_image).unwrap_err().check(), "fleet_key_genesis_document");
    // A binding whose epoch lasts a year: refused by the client whatever made it.
    let year = own_binding(&created.secret, &receipt, 4, now_ms() + 365 * DAY_MS, &key()).unwrap();
    assert_eq!(check_epoch_lifetime(&year, now_ms(), now_ms()).unwrap_err().check(), "fleet_epoch_lifetime");
}

#[test]
fn a_key_that_fails_the_checks_gets_no_epoch() {
    let grant = |image: &str| {
        let mut e = evidence(fleet_policy(image));
        e.grants.push(GrantSummary {
            grant_id: "g-1".into(),
            grantee_principal: "arn:aws:iam::111122223333:role/operator".into(),
            operations: vec!["Encrypt".into()],
        });
        e
    };
    let no_denies = |image: &str| {
        let mut policy: serde_json::Value = serde_json::from_str(&fleet_policy(image)).unwrap();
        policy["Statement"].as_array_mut().unwrap().truncate(1);
        evidence(policy.to_string())
    };
    let duplicate = |image: &str| evidence(fleet_policy(image).replacen("\"Effect\":\"Deny\"", "\"Effect\":\"Deny\",\"Effect\":\"Allow\"", 1));
    let imported = |image: &str| {
        let mut e = evidence(fleet_policy(image));
        e.metadata.origin = "EXTERNAL".into();
        e
    };
    for (name, case, failed) in [
        ("a pre-existing grant", &grant as &dyn Fn(&str) -> KeyEvidence, "key_grants"),
        ("no Deny statements", &no_denies, "key_policy_denies_wrapping"),
        ("a duplicate Effect", &duplicate, "key_policy_document"),
        ("imported material", &imported, "key_origin"),
    ] {
        let mut s = setup(case, Answer::Honest);
        let error = refusal(create(&mut s, now_ms() + DAY_MS));
        assert_eq!(error.check(), "fleet_key_checks", "{name}: {error}");
        assert!(error.to_string().contains(failed), "{name}: {error}");
        assert_eq!(s.kms.generated, 0, "{name}: nothing was generated under the key");
    }
}

#[test]
fn lifetimes_and_kms_answers_are_checked() {
    let mut s = setup(|image| evidence(fleet_policy(image)), Answer::Honest);
    assert_eq!(refusal(create(&mut s, now_ms() + 365 * DAY_MS)).check(), "fleet_epoch_lifetime");
    assert_eq!(refusal(create(&mut s, now_ms() - 1)).check(), "fleet_epoch_expired");
    assert_eq!(s.kms.generated, 0);
    let mut s = setup(|image| evidence(fleet_policy(image)), Answer::OtherKeyId);
    assert_eq!(refusal(create(&mut s, now_ms() + DAY_MS)).check(), "fleet_kms_key");
    let mut s = setup(|image| evidence(fleet_policy(image)), Answer::OtherPublicKey);
    assert_eq!(refusal(create(&mut s, now_ms() + DAY_MS)).check(), "fleet_key_mismatch");
}
