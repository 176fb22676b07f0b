use protocol::attestation::{DevIssuer, DocumentRequest};
use rsa::RsaPrivateKey;
use rsa::pkcs8::EncodePublicKey;

use super::*;

const PCR0: [u8; PCR_LEN] = [0x11; PCR_LEN];
const PCR1: [u8; PCR_LEN] = [0x22; PCR_LEN];
const PCR2: [u8; PCR_LEN] = [0x33; PCR_LEN];
const PCR8: [u8; PCR_LEN] = [0x88; PCR_LEN];

struct Fixture {
    _dir: tempfile::TempDir,
    kms: LocalKms,
    issuer: DevIssuer,
    root_pem: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let issuer = DevIssuer::generate(now_ms() - 60_000).unwrap();
    let root_pem = dir.path().join("enclave").join("dev-root.pem");
    std::fs::create_dir_all(root_pem.parent().unwrap()).unwrap();
    std::fs::write(&root_pem, issuer.trust_anchor().unwrap().to_pem()).unwrap();
    let trust = AttestationTrust { root_pem_path: root_pem.clone(), max_document_age: Duration::from_secs(300) };
    let kms = LocalKms::open(dir.path().join("kms.sqlite"), trust).unwrap();
    Fixture { _dir: dir, kms, issuer, root_pem }
}

fn rng() -> getrandom::rand_core::UnwrapErr<getrandom::SysRng> {
    getrandom::rand_core::UnwrapErr(getrandom::SysRng)
}

/// A one-shot RSA-2048 key and a document carrying it, as the enclave makes them.
fn attested(issuer: &DevIssuer, pcr0: [u8; PCR_LEN], at_ms: u64) -> (RsaPrivateKey, Recipient) {
    let key = RsaPrivateKey::new(&mut rng(), 2048).unwrap();
    let spki = key.to_public_key().to_public_key_der().unwrap();
    let mut request = DocumentRequest::new("i-local-enc0").with_pcr(0, pcr0).with_pcr(1, PCR1).with_pcr(2, PCR2);
    request = request.with_pcr(8, PCR8);
    request.public_key = Some(spki.as_bytes().to_vec());
    let document = issuer.attest(&request, at_ms).unwrap();
    (key, Recipient { attestation_document: document })
}

fn ctx(pairs: &[(&str, &str)]) -> EncryptionContext {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn denied(result: Result<impl std::fmt::Debug, KmsError>) -> String {
    match result {
        Err(KmsError::AccessDenied(m)) => m,
        other => panic!("expected AccessDenied, got {other:?}"),
    }
}

#[test]
fn keys_aliases_and_policies() {
    let f = fixture();
    let a = f.kms.create_key(LocalKeyPolicy::fleet(PCR0, Some(PCR8.to_vec())), "fleet").unwrap();
    let b = f.kms.create_key(LocalKeyPolicy::unrestricted(), "other").unwrap();
    let id = a.strip_prefix(KEY_ARN_PREFIX).unwrap();
    assert_eq!(id.len(), 36);
    assert_eq!(id.matches('-').count(), 4);
    assert_eq!(f.kms.resolve(&a).unwrap(), a);
    assert_eq!(f.kms.resolve(id).unwrap(), a);
    assert!(matches!(f.kms.resolve("alias/ephem-fleet"), Err(KmsError::NotFound { .. })));
    f.kms.set_alias("alias/ephem-fleet", &a).unwrap();
    assert_eq!(f.kms.resolve("alias/ephem-fleet").unwrap(), a);
    assert_eq!(f.kms.resolve("arn:aws:kms:local:000000000000:alias/ephem-fleet").unwrap(), a);
    f.kms.set_alias("alias/ephem-fleet", &b).unwrap(); // repoint
    assert_eq!(f.kms.resolve("alias/ephem-fleet").unwrap(), b);
    assert_eq!(f.kms.aliases().unwrap(), vec![("alias/ephem-fleet".to_owned(), b.clone())]);
    assert!(matches!(f.kms.set_alias("ephem", &a), Err(KmsError::Validation(_))));
    assert!(matches!(f.kms.set_alias("alias/aws/x", &a), Err(KmsError::Validation(_))));
    assert!(matches!(f.kms.set_alias("alias/x", "nope"), Err(KmsError::NotFound { .. })));

    let policy = f.kms.key_policy(&a).unwrap();
    assert_eq!(policy, LocalKeyPolicy::fleet(PCR0, Some(PCR8.to_vec())));
    let json = policy.to_json();
    assert!(json.contains(&hex::encode(PCR0)), "{json}");
    assert_eq!(LocalKeyPolicy::from_json(&json).unwrap(), policy);

    // A Recipient-only key must pin PCR0; PCRs are SHA-384 sized.
    let mut no_pcr0 = LocalKeyPolicy::model(PCR0, None);
    no_pcr0.recipient_pcrs.clear();
    assert!(matches!(f.kms.create_key(no_pcr0, "x"), Err(KmsError::Validation(_))));
    assert!(matches!(f.kms.create_key(LocalKeyPolicy::model(vec![1; 32], None), "x"), Err(KmsError::Validation(_))));
}

#[test]
fn encrypt_decrypt_round_trip_and_context_binding() {
    let f = fixture();
    let key = f.kms.create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
    let other = f.kms.create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
    let c = ctx(&[("model_id", "m"), ("version", "3")]);
    let blob = f.kms.encrypt(&key, b"data key bytes", &c).unwrap();
    let out = f.kms.decrypt(None, &blob, &c, None).unwrap();
    assert_eq!(out.plaintext.as_deref().map(Vec::as_slice), Some(&b"data key bytes"[..]));
    assert_eq!(out.key_id, key);
    assert!(out.ciphertext_for_recipient.is_none());
    assert!(f.kms.decrypt(Some(&key), &blob, &c, None).is_ok());

    for wrong in [ctx(&[("model_id", "m"), ("version", "4")]), ctx(&[("model_id", "m")]), EncryptionContext::new()] {
        assert!(matches!(f.kms.decrypt(None, &blob, &wrong, None), Err(KmsError::InvalidCiphertext(_))), "{wrong:?}");
    }
    // Context encoding is unambiguous: moving bytes between key and value changes it.
    let shifted = ctx(&[("model_idm", ""), ("version", "3")]);
    assert!(matches!(f.kms.decrypt(None, &blob, &shifted, None), Err(KmsError::InvalidCiphertext(_))));
    // Every single-byte change is caught (header, key id, nonce, ciphertext, tag).
    for at in 0..blob.len() {
        let mut tampered = blob.clone();
        tampered[at] ^= 0x01;
        let result = f.kms.decrypt(None, &tampered, &c, None);
        assert!(
            matches!(result, Err(KmsError::InvalidCiphertext(_) | KmsError::NotFound { .. })),
            "byte {at}: {result:?}"
        );
    }
    assert!(matches!(f.kms.decrypt(None, &blob[..blob.len() - 1], &c, None), Err(KmsError::InvalidCiphertext(_))));
    assert!(matches!(f.kms.decrypt(None, b"junk", &c, None), Err(KmsError::InvalidCiphertext(_))));
    // Naming another key than the blob's is refused.
    assert!(matches!(f.kms.decrypt(Some(&other), &blob, &c, None), Err(KmsError::InvalidCiphertext(_))));
    assert!(matches!(f.kms.encrypt(&key, &[0; 4097], &c), Err(KmsError::Validation(_))));
    assert!(matches!(f.kms.encrypt("alias/none", b"x", &c), Err(KmsError::NotFound { .. })));

    f.kms.set_key_enabled(&key, false).unwrap();
    assert!(matches!(f.kms.decrypt(None, &blob, &c, None), Err(KmsError::Disabled { .. })));
    assert!(matches!(f.kms.encrypt(&key, b"x", &c), Err(KmsError::Disabled { .. })));
}

#[test]
fn data_keys_and_key_pairs_without_recipient() {
    let f = fixture();
    let key = f.kms.create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
    let c = ctx(&[("epoch", "7"), ("not_after", "1900000000000")]);
    let dk = f.kms.generate_data_key(&key, &c, None).unwrap();
    let plain = dk.plaintext.unwrap();
    assert_eq!(plain.len(), DATA_KEY_LEN);
    assert_eq!(f.kms.decrypt(None, &dk.ciphertext_blob, &c, None).unwrap().plaintext.unwrap(), plain);

    let pair = f.kms.generate_data_key_pair_without_plaintext(&key, &c).unwrap();
    let pkcs8 = f.kms.decrypt(None, &pair.private_key_ciphertext_blob, &c, None).unwrap().plaintext.unwrap();
    use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};
    let secret = p256::SecretKey::from_pkcs8_der(&pkcs8).unwrap();
    let public = p256::PublicKey::from_public_key_der(&pair.public_key_der).unwrap();
    assert_eq!(secret.public_key(), public);
}

#[test]
fn policies_deny_what_they_do_not_allow() {
    let f = fixture();
    let fleet = f.kms.create_key(LocalKeyPolicy::fleet(PCR0, None), "fleet").unwrap();
    let model = f.kms.create_key(LocalKeyPolicy::model(PCR0, None), "model").unwrap();
    let epoch = ctx(&[("epoch", "1"), ("not_after", "2")]);
    let m = ctx(&[("model_id", "m"), ("version", "1")]);

    // Rotation may create key pairs (only under {epoch, not_after}); nobody gets plaintext.
    let pair = f.kms.generate_data_key_pair_without_plaintext(&fleet, &epoch).unwrap();
    let msg = denied(f.kms.generate_data_key_pair_without_plaintext(&fleet, &ctx(&[("epoch", "1")])));
    assert!(msg.contains("`not_after`"), "{msg}");
    let msg = denied(f.kms.decrypt(None, &pair.private_key_ciphertext_blob, &epoch, None));
    assert!(msg.starts_with("Decrypt without a Recipient is denied by the key policy"), "{msg}");
    denied(f.kms.encrypt(&fleet, b"x", &epoch));
    denied(f.kms.generate_data_key(&fleet, &epoch, None));

    // The publisher may Encrypt under the model key; data keys go to enclaves only.
    let wrapped = f.kms.encrypt(&model, &[9; 32], &m).unwrap();
    let msg = denied(f.kms.decrypt(None, &wrapped, &m, None));
    assert!(msg.contains("without a Recipient"), "{msg}");
    let msg = denied(f.kms.generate_data_key(&model, &m, None));
    assert!(msg.starts_with("GenerateDataKey without a Recipient is denied"), "{msg}");
    denied(f.kms.generate_data_key_pair_without_plaintext(&model, &m));
    denied(f.kms.encrypt(&model, b"x", &ctx(&[("model_id", "m")])));
}

#[test]
fn recipient_gets_a_cms_envelope_it_can_open() {
    let f = fixture();
    let model = f.kms.create_key(LocalKeyPolicy::model(PCR0, Some(PCR8.to_vec())), "model").unwrap();
    f.kms.set_alias("alias/ephem-model", &model).unwrap();
    let m = ctx(&[("model_id", "sentence-transformers/all-MiniLM-L6-v2"), ("version", "1")]);
    let dek = [0x5a; 32];
    let wrapped = f.kms.encrypt("alias/ephem-model", &dek, &m).unwrap();

    let (rsa_key, recipient) = attested(&f.issuer, PCR0, now_ms());
    let out = f.kms.decrypt(Some("alias/ephem-model"), &wrapped, &m, Some(&recipient)).unwrap();
    assert!(out.plaintext.is_none(), "never plaintext with a Recipient");
    assert_eq!(out.key_id, model);
    let envelope = out.ciphertext_for_recipient.unwrap();
    assert_eq!(&envelope[..2], &[0x30, 0x80], "BER, indefinite length, as KMS sends it");
    assert_eq!(&*protocol::cms::open(&envelope, &rsa_key).unwrap(), &dek);

    // GenerateDataKey with a Recipient: the blob and the envelope hold the same key.
    let (rsa_key, recipient2) = attested(&f.issuer, PCR0, now_ms());
    let dk = f.kms.generate_data_key(&model, &m, Some(&recipient2)).unwrap();
    assert!(dk.plaintext.is_none());
    let released = protocol::cms::open(&dk.ciphertext_for_recipient.unwrap(), &rsa_key).unwrap();
    let (rsa_key3, recipient3) = attested(&f.issuer, PCR0, now_ms());
    let again = f.kms.decrypt(None, &dk.ciphertext_blob, &m, Some(&recipient3)).unwrap();
    assert_eq!(protocol::cms::open(&again.ciphertext_for_recipient.unwrap(), &rsa_key3).unwrap(), released);

    // The fleet key releases a P-256 PKCS#8 the same way.
    let fleet = f.kms.create_key(LocalKeyPolicy::fleet(PCR0, None), "fleet").unwrap();
    let epoch = ctx(&[("epoch", "3"), ("not_after", "99")]);
    let pair = f.kms.generate_data_key_pair_without_plaintext(&fleet, &epoch).unwrap();
    let (rsa_key, recipient4) = attested(&f.issuer, PCR0, now_ms());
    let out = f.kms.decrypt(None, &pair.private_key_ciphertext_blob, &epoch, Some(&recipient4)).unwrap();
    let pkcs8 = protocol::cms::open(&out.ciphertext_for_recipient.unwrap(), &rsa_key).unwrap();
    use p256::pkcs8::DecodePrivateKey;
    let secret = p256::SecretKey::from_pkcs8_der(&pkcs8).unwrap();
    use p256::pkcs8::EncodePublicKey as _;
    assert_eq!(secret.public_key().to_public_key_der().unwrap().as_bytes(), pair.public_key_der.as_slice());

    // A Recipient is verified even where the policy does not require one.
    let open_key = f.kms.create_key(LocalKeyPolicy::unrestricted(), "open").unwrap();
    let blob = f.kms.encrypt(&open_key, b"x", &m).unwrap();
    let mut garbled = recipient.clone();
    garbled.attestation_document[10] ^= 0xff;
    denied(f.kms.decrypt(None, &blob, &m, Some(&garbled)));
}

#[test]
fn recipient_with_other_measurements_is_denied_naming_the_pcr() {
    let f = fixture();
    let model = f.kms.create_key(LocalKeyPolicy::model(PCR0, None), "model").unwrap();
    let m = ctx(&[("model_id", "m"), ("version", "1")]);
    let wrapped = f.kms.encrypt(&model, &[1; 32], &m).unwrap();
    let (_, other_image) = attested(&f.issuer, [0x44; PCR_LEN], now_ms());
    let msg = denied(f.kms.decrypt(None, &wrapped, &m, Some(&other_image)));
    assert!(msg.starts_with("PCR0 does not match the key policy"), "{msg}");
    assert!(msg.contains("ImageSha384"), "{msg}");
    let msg = denied(f.kms.generate_data_key(&model, &m, Some(&other_image)));
    assert!(msg.starts_with("PCR0 does not match"), "{msg}");

    // PCR8 pinned: a document with another PCR8 is refused, naming PCR8.
    let signed = f.kms.create_key(LocalKeyPolicy::model(PCR0, Some(vec![0x99; PCR_LEN])), "signed").unwrap();
    let wrapped = f.kms.encrypt(&signed, &[1; 32], &m).unwrap();
    let (_, right_image) = attested(&f.issuer, PCR0, now_ms());
    let msg = denied(f.kms.decrypt(None, &wrapped, &m, Some(&right_image)));
    assert!(msg.starts_with("PCR8 does not match"), "{msg}");
}

#[test]
fn bad_attestation_documents_are_denied_naming_the_check() {
    let f = fixture();
    let model = f.kms.create_key(LocalKeyPolicy::model(PCR0, None), "model").unwrap();
    let m = ctx(&[("model_id", "m"), ("version", "1")]);
    let wrapped = f.kms.encrypt(&model, &[1; 32], &m).unwrap();
    let check = |recipient: &Recipient, name: &str| {
        let msg = denied(f.kms.decrypt(None, &wrapped, &m, Some(recipient)));
        assert!(msg.starts_with(&format!("attestation document: check `{name}` failed")), "{name}: {msg}");
    };

    // Older than the five minutes KMS accepts.
    let (_, old) = attested(&f.issuer, PCR0, now_ms() - 6 * 60 * 1000);
    check(&old, "freshness");
    // A flipped signature byte.
    let (_, mut tampered) = attested(&f.issuer, PCR0, now_ms());
    let last = tampered.attestation_document.len() - 1;
    tampered.attestation_document[last] ^= 0x01;
    check(&tampered, "signature");
    // Not CBOR at all.
    check(&Recipient { attestation_document: b"not a document".to_vec() }, "cbor");
    // Signed by another (development) CA than the pinned one.
    let stranger = DevIssuer::generate(now_ms() - 60_000).unwrap();
    let (_, foreign) = attested(&stranger, PCR0, now_ms());
    check(&foreign, "root_pinned");

    // No public key in the document: nothing to encrypt to.
    let mut request = DocumentRequest::new("i-local-enc0").with_pcr(0, PCR0).with_pcr(1, PCR1).with_pcr(2, PCR2);
    request.public_key = None;
    let bare = Recipient { attestation_document: f.issuer.attest(&request, now_ms()).unwrap() };
    assert!(matches!(f.kms.decrypt(None, &wrapped, &m, Some(&bare)), Err(KmsError::Validation(_))));

    // The root file is read at each request: without it, nothing is trusted.
    let (_, fine) = attested(&f.issuer, PCR0, now_ms());
    std::fs::remove_file(&f.root_pem).unwrap();
    let msg = denied(f.kms.decrypt(None, &wrapped, &m, Some(&fine)));
    assert!(msg.contains("cannot read the trusted root"), "{msg}");
    std::fs::write(&f.root_pem, f.issuer.trust_anchor().unwrap().to_pem()).unwrap();
    assert!(f.kms.decrypt(None, &wrapped, &m, Some(&fine)).is_ok());
}

#[test]
fn a_second_handle_sees_the_same_keys() {
    let f = fixture();
    let key = f.kms.create_key(LocalKeyPolicy::unrestricted(), "shared").unwrap();
    f.kms.set_alias("alias/shared", &key).unwrap();
    let c = ctx(&[("k", "v")]);
    let blob = f.kms.encrypt("alias/shared", b"secret", &c).unwrap();
    let other = LocalKms::open(&f.kms.path, f.kms.trust().clone()).unwrap();
    assert_eq!(other.resolve("alias/shared").unwrap(), key);
    assert_eq!(other.decrypt(None, &blob, &c, None).unwrap().plaintext.unwrap().as_slice(), b"secret");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&f.kms.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key database is private to its owner");
    }
}
