//! Key release against a KMS stand-in that behaves like KMS with a `Recipient`: it verifies the
//! recipient attestation document (development root, a PCR0 policy, freshness), takes its
//! `public_key`, checks the encryption context the blob was made under, and answers with
//! `protocol::cms::seal` — BER CMS EnvelopedData in the real KMS shape — so every envelope the
//! worker opens here is a real one.
//!
//! Also: the DESIGN.md §3 invariant (no host-chosen bytes in `public_key` / `user_data`), checked
//! on every document the NSM produced during releases driven by honest and hostile transports.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use enclave_worker::key_release::{
    self, FleetEpoch, KeyReleaseError, KmsTransport, KmsTransportError, OneShotKey, RsaKeyPool,
};
use enclave_worker::nsm::{self, AttestationRequest, DevNsm, Nsm, NsmError};
use p256::pkcs8::EncodePrivateKey;
use protocol::attestation::{AttestationDocument, TrustAnchor, UserDataBinding, VerifyOptions, verify};
use protocol::cms::EnvelopedData;
use protocol::envelope::FleetSecretKey;
use protocol::fleet::EpochRecord;
use protocol::manifest::{Manifest, Pooling};

const KEY_ARN: &str = "arn:aws:kms:us-east-1:111122223333:key/test-fleet";
/// A key in an account the host owns, with no attestation condition in its policy.
const HOST_KEY_ARN: &str = "arn:aws:kms:us-east-1:444455556666:key/host-owned";
const HOUR_MS: u64 = 3_600_000;

fn rng() -> rsa::rand_core::UnwrapErr<getrandom::SysRng> {
    rsa::rand_core::UnwrapErr(getrandom::SysRng)
}

/// A development NSM that remembers every document it produced.
struct RecordingNsm {
    inner: DevNsm,
    documents: Mutex<Vec<Vec<u8>>>,
}

impl RecordingNsm {
    fn new(dir: &std::path::Path) -> Self {
        RecordingNsm { inner: DevNsm::open(dir).unwrap(), documents: Mutex::new(Vec::new()) }
    }

    fn documents(&self) -> Vec<AttestationDocument> {
        let docs = self.documents.lock().unwrap();
        docs.iter().map(|d| AttestationDocument::parse_unverified(d).unwrap()).collect()
    }

    fn raw(&self) -> Vec<Vec<u8>> {
        self.documents.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.documents.lock().unwrap().len()
    }
}

impl Nsm for RecordingNsm {
    fn attest(&self, request: AttestationRequest) -> Result<Vec<u8>, NsmError> {
        let document = self.inner.attest(request)?;
        self.documents.lock().unwrap().push(document.clone());
        Ok(document)
    }
    fn pcrs(&self) -> &BTreeMap<u8, Vec<u8>> {
        self.inner.pcrs()
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn trust_anchor(&self) -> TrustAnchor {
        self.inner.trust_anchor()
    }
    fn is_development(&self) -> bool {
        self.inner.is_development()
    }
}

/// How the stand-in (or the host in front of it) answers.
#[derive(Clone)]
enum Answer {
    /// As KMS: sealed to the attested key.
    Honest,
    /// Sealed to an RSA key that is not the attested one (e.g. the host's).
    SealToOtherKey,
    /// The honest envelope with one bit of the RSA-wrapped content key flipped.
    FlipWrappedKey,
    /// The honest envelope with one bit of the first AES-CBC ciphertext block flipped.
    FlipContent,
    /// This envelope, whatever was asked (a replay of an earlier answer).
    Replay(Vec<u8>),
    /// The host swaps the document's `public_key` for its own key before KMS sees it.
    SwapPublicKey,
    /// The host says KMS failed, with a message stuffed with bytes of its choosing.
    HostFailure,
    /// An honest envelope, but the answer names another key than the one asked.
    OtherKeyId,
}

/// An encryption context and the plaintext KMS holds under it.
type Held = (BTreeMap<String, String>, Vec<u8>);

/// KMS with a `Recipient`, as the key policy of DESIGN.md §3 configures it.
struct TestKms {
    root: TrustAnchor,
    /// `kms:RecipientAttestation:PCR0` (ImageSha384).
    policy_pcr0: Vec<u8>,
    /// blob → (encryption context, plaintext).
    keys: BTreeMap<Vec<u8>, Held>,
    answer: Answer,
    /// Every envelope returned, in order.
    envelopes: Vec<Vec<u8>>,
    /// Every recipient attestation received.
    attestations: Vec<Vec<u8>>,
    calls: usize,
    host_key: OneShotKey,
    /// The ARN this KMS key answers to.
    key_arn: String,
}

impl TestKms {
    fn new(nsm: &dyn Nsm) -> Self {
        TestKms {
            root: nsm.trust_anchor(),
            policy_pcr0: nsm.pcrs()[&0].clone(),
            keys: BTreeMap::new(),
            answer: Answer::Honest,
            envelopes: Vec::new(),
            attestations: Vec::new(),
            calls: 0,
            host_key: OneShotKey::generate().unwrap(),
            key_arn: KEY_ARN.to_owned(),
        }
    }

    fn insert(&mut self, blob: &[u8], context: BTreeMap<String, String>, plaintext: &[u8]) {
        self.keys.insert(blob.to_vec(), (context, plaintext.to_vec()));
    }

    fn kms_decrypt(
        &self,
        key_id: &Option<String>,
        blob: &[u8],
        context: &BTreeMap<String, String>,
        attestation: &[u8],
    ) -> Result<Vec<u8>, KmsTransportError> {
        if key_id.as_deref().is_some_and(|id| id != self.key_arn) {
            return Err(KmsTransportError::new("NotFoundException", "no such key"));
        }
        let options = VerifyOptions::new(self.root.clone(), now_ms()).expect_pcr(0, self.policy_pcr0.clone());
        let verified = verify(attestation, &options).map_err(|e| {
            KmsTransportError::new("AccessDeniedException", format!("recipient attestation refused: {e}"))
        })?;
        let public_key = verified
            .document
            .public_key
            .ok_or_else(|| KmsTransportError::new("ValidationException", "attestation document has no public_key"))?;
        let (expected_context, plaintext) =
            self.keys.get(blob).ok_or_else(|| KmsTransportError::new("InvalidCiphertextException", "unknown blob"))?;
        if expected_context != context {
            return Err(KmsTransportError::new("InvalidCiphertextException", "encryption context differs"));
        }
        protocol::cms::seal(&public_key, plaintext, &mut rng())
            .map_err(|e| KmsTransportError::new("ValidationException", e.to_string()))
    }
}

impl KmsTransport for TestKms {
    fn decrypt(
        &mut self,
        key_id: Option<String>,
        ciphertext_blob: Vec<u8>,
        encryption_context: BTreeMap<String, String>,
        mut recipient_attestation: Vec<u8>,
    ) -> Result<(String, Vec<u8>), KmsTransportError> {
        self.calls += 1;
        self.attestations.push(recipient_attestation.clone());
        match &self.answer {
            Answer::SwapPublicKey => {
                let doc = AttestationDocument::parse_unverified(&recipient_attestation).unwrap();
                let theirs = doc.public_key.unwrap();
                let mine = self.host_key.public_key_der().to_vec();
                assert_eq!(theirs.len(), mine.len(), "same-length swap keeps the CBOR well-formed");
                let at = recipient_attestation.windows(theirs.len()).position(|w| w == theirs).unwrap();
                recipient_attestation[at..at + mine.len()].copy_from_slice(&mine);
            }
            Answer::HostFailure => {
                let spki = hex::encode(self.host_key.public_key_der());
                return Err(KmsTransportError::new("AccessDeniedException", format!("use my key {spki} instead")));
            }
            _ => {}
        }
        let honest = self.kms_decrypt(&key_id, &ciphertext_blob, &encryption_context, &recipient_attestation)?;
        let envelope = match &self.answer {
            Answer::Honest | Answer::SwapPublicKey | Answer::HostFailure | Answer::OtherKeyId => honest,
            Answer::SealToOtherKey => {
                let (_, plaintext) = &self.keys[&ciphertext_blob];
                protocol::cms::seal(self.host_key.public_key_der(), plaintext, &mut rng()).unwrap()
            }
            Answer::FlipWrappedKey => {
                let wrapped = EnvelopedData::parse(&honest).unwrap().encrypted_key;
                let mut envelope = honest.clone();
                let at = envelope.windows(wrapped.len()).position(|w| w == wrapped.as_slice()).unwrap();
                envelope[at + 100] ^= 0x01;
                envelope
            }
            Answer::FlipContent => {
                let content = EnvelopedData::parse(&honest).unwrap().encrypted_content;
                let mut envelope = honest.clone();
                let at = envelope.windows(16).position(|w| w == &content[..16]).unwrap();
                envelope[at + 3] ^= 0x01;
                envelope
            }
            Answer::Replay(envelope) => envelope.clone(),
        };
        self.envelopes.push(envelope.clone());
        let answered_by = if matches!(self.answer, Answer::OtherKeyId) { HOST_KEY_ARN } else { self.key_arn.as_str() };
        Ok((answered_by.to_owned(), envelope))
    }
}

fn key_arn() -> protocol::kms_arn::KmsKeyArn {
    KEY_ARN.parse().unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A fleet key as KMS `GenerateDataKeyPair` (ECC_NIST_P256) makes it: PKCS#8 private key.
fn fleet_pkcs8() -> (Vec<u8>, FleetSecretKey) {
    let fleet = FleetSecretKey::generate();
    let secret = p256::SecretKey::from_slice(&fleet.to_scalar_bytes()).unwrap();
    let der = secret.to_pkcs8_der().unwrap().as_bytes().to_vec();
    assert_eq!(FleetSecretKey::from_pkcs8_der(&der).unwrap().to_scalar_bytes(), fleet.to_scalar_bytes());
    (der, fleet)
}

struct Setup {
    _dir: tempfile::TempDir,
    nsm: RecordingNsm,
    pool: RsaKeyPool,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let nsm = RecordingNsm::new(&dir.path().join("nsm"));
    Setup { _dir: dir, nsm, pool: RsaKeyPool::start(2, 1) }
}

/// An epoch record as a host stores it, with KMS holding its key.
fn epoch_record(kms: &mut TestKms, epoch: u64, not_after_ms: u64) -> (EpochRecord, FleetSecretKey) {
    let (pkcs8, fleet) = fleet_pkcs8();
    let blob = format!("wrapped fleet key of epoch {epoch}").into_bytes();
    kms.insert(&blob, protocol::fleet::encryption_context(epoch, not_after_ms), &pkcs8);
    let record = EpochRecord {
        epoch,
        not_after_ms,
        kms_key_id: kms.key_arn.clone(),
        public_key: hex::encode(fleet.public_key().to_bytes()),
        wrapped_private_key: hex::encode(&blob),
    };
    (record, fleet)
}

/// The error of a release that must fail (released keys have no `Debug`, on purpose).
fn err<T>(result: Result<T, KeyReleaseError>) -> KeyReleaseError {
    match result {
        Ok(_) => panic!("expected the release to fail"),
        Err(error) => {
            assert!(error.to_string().starts_with(&format!("{}: ", error.check())), "{error}");
            error
        }
    }
}

fn check_of<T>(result: Result<T, KeyReleaseError>) -> &'static str {
    err(result).check()
}

#[test]
fn fleet_key_is_released_and_its_public_key_derived() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, fleet) = epoch_record(&mut kms, 7, now_ms() + 24 * HOUR_MS);
    let released = key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record).unwrap();
    assert_eq!(released.secret.public_key().to_bytes(), fleet.public_key().to_bytes());
    assert_eq!(released.secret.to_scalar_bytes(), fleet.to_scalar_bytes());
    assert_eq!(released.kms_key.as_str(), KEY_ARN);
    assert_eq!(kms.calls, 1);
    // The envelope KMS returned is BER CMS in the KMS shape, addressed to the attested key.
    let envelope = &kms.envelopes[0];
    assert_eq!(&envelope[..2], &[0x30, 0x80], "indefinite-length BER");
    let doc = AttestationDocument::parse_unverified(&kms.attestations[0]).unwrap();
    let parsed = EnvelopedData::parse(envelope).unwrap();
    assert_eq!(parsed.subject_key_identifier, protocol::cms::subject_key_identifier(doc.public_key.as_ref().unwrap()));

    // Without a published key to compare, through the parts API, with the public key derived.
    let (pkcs8, fleet2) = fleet_pkcs8();
    let epoch = FleetEpoch { epoch: 8, not_after_ms: now_ms() + HOUR_MS };
    kms.insert(b"blob8", epoch.encryption_context(), &pkcs8);
    let released =
        key_release::release_fleet_key_parts(&s.nsm, &s.pool, &mut kms, &key_arn(), b"blob8".to_vec(), epoch, None).unwrap();
    assert_eq!(released.public_key().to_bytes(), fleet2.public_key().to_bytes());

    // The published key may also come as SPKI DER (what KMS GenerateDataKeyPair returns).
    use p256::pkcs8::EncodePublicKey;
    let spki = p256::PublicKey::from_sec1_bytes(&fleet2.public_key().to_bytes()).unwrap().to_public_key_der().unwrap();
    let released =
        key_release::release_fleet_key_parts(&s.nsm, &s.pool, &mut kms, &key_arn(), b"blob8".to_vec(), epoch, Some(spki.as_bytes()))
            .unwrap();
    assert_eq!(released.public_key().to_bytes(), fleet2.public_key().to_bytes());
}

#[test]
fn published_attestation_binds_the_released_fleet_key_and_the_receipt_key() {
    // Issue 3 item 3, at the NSM level: the document the worker publishes verifies against the
    // development root and its binding names the keys the worker holds.
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 11, now_ms() + HOUR_MS);
    let fleet = key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record).unwrap();
    let receipt = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    let binding = nsm::own_binding(&fleet.secret, &receipt, record.epoch, record.not_after_ms, &fleet.kms_key).unwrap();
    let document = s.nsm.attest(AttestationRequest::publication(&binding)).unwrap();
    let mut options = VerifyOptions::new(s.nsm.trust_anchor(), now_ms()).expect_pcr(0, s.nsm.pcrs()[&0].clone());
    options.require_binding = true;
    let verified = verify(&document, &options).unwrap();
    assert_eq!(verified.binding.as_ref(), Some(&binding));
    assert_eq!(binding.fleet_public_key.to_vec(), hex::decode(&record.public_key).unwrap());
    assert_eq!(verified.document.public_key, None);
    assert_eq!(verified.document.nonce, None);
    assert!(verified.root.is_development());
}

#[test]
fn envelope_sealed_to_another_key_is_refused() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 1, now_ms() + HOUR_MS);
    kms.answer = Answer::SealToOtherKey;
    let error = err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record));
    assert!(matches!(error, KeyReleaseError::Cms(protocol::cms::CmsError::KeyUnwrap)), "{error}");
}

#[test]
fn tampered_envelopes_are_refused() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 1, now_ms() + HOUR_MS);
    kms.answer = Answer::FlipWrappedKey;
    let error = err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record));
    assert!(matches!(error, KeyReleaseError::Cms(protocol::cms::CmsError::KeyUnwrap)), "{error}");
    // AES-CBC has no MAC: a flipped content bit garbles the PKCS#8, which is then refused.
    kms.answer = Answer::FlipContent;
    assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "invalid_pkcs8");
    // A truncated envelope.
    let mut envelope = kms.envelopes.last().unwrap().clone();
    envelope.truncate(envelope.len() - 5);
    kms.answer = Answer::Replay(envelope);
    assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "cms");
}

#[test]
fn replayed_envelope_does_not_open_with_a_new_one_shot_key() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, fleet) = epoch_record(&mut kms, 2, now_ms() + HOUR_MS);
    let released = key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record).unwrap();
    assert_eq!(released.secret.public_key().to_bytes(), fleet.public_key().to_bytes());
    // The key that opened it is gone (`OneShotKey::open` took it by value); the next release
    // attests a new key, so the earlier envelope, replayed, opens with nothing.
    let earlier = kms.envelopes[0].clone();
    kms.answer = Answer::Replay(earlier);
    let error = err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record));
    assert!(matches!(error, KeyReleaseError::Cms(protocol::cms::CmsError::KeyUnwrap)), "{error}");
    let docs = s.nsm.documents();
    assert_eq!(docs.len(), 2);
    assert_ne!(docs[0].public_key, docs[1].public_key, "every release attests a new key");
    // Same for a DEK replay.
    kms.answer = Answer::Honest;
    kms.insert(b"dek", key_release::data_key_context("m", 1), &[9; 32]);
    key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"dek".to_vec(), "m", 1).unwrap();
    kms.answer = Answer::Replay(kms.envelopes.last().unwrap().clone());
    let result = key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"dek".to_vec(), "m", 1);
    assert_eq!(check_of(result), "cms");
}

#[test]
fn expired_epoch_is_refused_before_kms_is_asked() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 3, now_ms() - 1);
    match err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)) {
        KeyReleaseError::FleetEpochExpired { epoch: 3, not_after_ms, now_ms } => assert!(not_after_ms <= now_ms),
        other => panic!("{other}"),
    }
    assert_eq!(kms.calls, 0, "nothing went to KMS");
    assert_eq!(s.nsm.count(), 0, "no key was attested");
    // not_after == now is expired too (the key is refused from that instant on).
    let epoch = FleetEpoch { epoch: 4, not_after_ms: s.nsm.now_ms() };
    let result = key_release::release_fleet_key_parts(&s.nsm, &s.pool, &mut kms, &key_arn(), b"x".to_vec(), epoch, None);
    assert_eq!(check_of(result), "fleet_epoch_expired");
}

#[test]
fn a_lying_record_gets_no_key() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (mut record, _) = epoch_record(&mut kms, 5, now_ms() + HOUR_MS);
    // The host extends not_after in the record: the context no longer matches what KMS holds.
    record.not_after_ms += 365 * 24 * HOUR_MS;
    let error = err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record));
    assert!(
        matches!(&error, KeyReleaseError::KmsFailed { code, .. } if code == "InvalidCiphertextException"),
        "{error}"
    );
}

#[test]
fn mismatched_published_public_key_is_refused() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (mut record, fleet) = epoch_record(&mut kms, 6, now_ms() + HOUR_MS);
    let other = FleetSecretKey::generate();
    record.public_key = hex::encode(other.public_key().to_bytes());
    match err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)) {
        KeyReleaseError::FleetKeyMismatch { derived, published } => {
            assert_eq!(derived, hex::encode(fleet.public_key().key_id()));
            assert_eq!(published, hex::encode(other.public_key().key_id()));
        }
        other => panic!("{other}"),
    }
    record.public_key = "04".repeat(65);
    assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "invalid_published_key");
    record.public_key = "not hex".into();
    assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "fleet_epoch_record");
}

#[test]
fn kms_refuses_a_document_whose_pcr0_differs_from_its_policy() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 1, now_ms() + HOUR_MS);
    kms.policy_pcr0 = vec![0x11; 48];
    match err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)) {
        KeyReleaseError::KmsFailed { code, message } => {
            assert_eq!(code, "AccessDeniedException");
            assert!(message.contains("PCR0"), "{message}");
        }
        other => panic!("{other}"),
    }
    // The same refusal for a DEK.
    kms.insert(b"dek", key_release::data_key_context("m", 1), &[1; 32]);
    let result = key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"dek".to_vec(), "m", 1);
    assert_eq!(check_of(result), "kms_failed");
    // A transport failure is named apart from a KMS refusal.
    struct Broken;
    impl KmsTransport for Broken {
        fn decrypt(
            &mut self,
            _: Option<String>,
            _: Vec<u8>,
            _: BTreeMap<String, String>,
            _: Vec<u8>,
        ) -> Result<(String, Vec<u8>), KmsTransportError> {
            Err(KmsTransportError::new(KmsTransportError::TRANSPORT, "connection closed"))
        }
    }
    let result = key_release::release_data_key_parts(&s.nsm, &s.pool, &mut Broken, None, b"dek".to_vec(), "m", 1);
    assert_eq!(check_of(result), "kms_transport");
}

#[test]
fn data_keys_are_released_and_must_be_32_bytes() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let dek = [0x5a; 32];
    kms.insert(b"dek-v3", key_release::data_key_context("all-MiniLM-L6-v2", 3), &dek);
    let manifest = Manifest {
        model_id: "all-MiniLM-L6-v2".into(),
        version: 3,
        files: Vec::new(),
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: KEY_ARN.into(),
        wrapped_dek: b"dek-v3".to_vec(),
        created_ms: 0,
    };
    let released = key_release::release_data_key(&s.nsm, &s.pool, &mut kms, &manifest).unwrap();
    assert_eq!(*released, dek);
    assert_eq!(kms.keys[&b"dek-v3".to_vec()].0["version"], "3");

    // Another version's context: KMS refuses.
    let result = key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"dek-v3".to_vec(), "all-MiniLM-L6-v2", 4);
    assert_eq!(check_of(result), "kms_failed");

    for len in [0usize, 16, 31, 33, 64] {
        let blob = format!("dek-{len}").into_bytes();
        kms.insert(&blob, key_release::data_key_context("m", 1), &vec![7; len]);
        match err(key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, blob, "m", 1)) {
            KeyReleaseError::WrongLength { expected: 32, actual, .. } => assert_eq!(actual, len),
            other => panic!("length {len}: {other}"),
        }
    }
    let result = key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"x".to_vec(), "bad id/..", 1);
    assert_eq!(check_of(result), "encryption_context");
}

/// DESIGN.md §3: the worker never puts host-chosen bytes into `public_key` or `user_data`.
///
/// The guarantee is the type: `AttestationRequest` has private fields and three constructors
/// (`key_release(&OneShotKey)`, `publication(&UserDataBinding)`, `fresh(&UserDataBinding,
/// nonce)`), none of which takes bytes for `public_key` or `user_data`. This test drives releases
/// through honest and hostile hosts and then decodes **every** document the NSM produced: each
/// `public_key` is exactly the SPKI of a one-shot key the worker generated (a new one each
/// time), each `user_data` is absent or the binding of the worker's own keys, and only a fresh
/// attestation carries a nonce — the client's.
#[test]
fn no_host_bytes_reach_public_key_or_user_data() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 21, now_ms() + HOUR_MS);
    kms.insert(b"dek", key_release::data_key_context("m", 1), &[3; 32]);
    let host_spki = kms.host_key.public_key_der().to_vec();
    let mut generated: Vec<Vec<u8>> = Vec::new();

    // Releases with keys whose SPKI the test knows, through every kind of host.
    for answer in [
        Answer::Honest,
        Answer::SealToOtherKey,
        Answer::FlipWrappedKey,
        Answer::SwapPublicKey,
        Answer::HostFailure,
        Answer::Replay(protocol::cms::seal(&host_spki, b"host plaintext", &mut rng()).unwrap()),
    ] {
        kms.answer = answer.clone();
        let key = OneShotKey::generate().unwrap();
        generated.push(key.public_key_der().to_vec());
        let result =
            key_release::release_with_key(&s.nsm, key, &mut kms, None, b"dek".to_vec(), key_release::data_key_context("m", 1));
        match answer {
            Answer::Honest => assert_eq!(&**result.unwrap(), &[3; 32]),
            // The swapped document no longer verifies (signature): KMS refuses it.
            Answer::SwapPublicKey => assert_eq!(check_of(result), "kms_failed"),
            Answer::HostFailure => assert_eq!(check_of(result), "kms_failed"),
            _ => assert_eq!(check_of(result), "cms"),
        }
    }
    // Releases through the pool, honest and hostile.
    kms.answer = Answer::Honest;
    let fleet = key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record).unwrap();
    key_release::release_data_key_parts(&s.nsm, &s.pool, &mut kms, None, b"dek".to_vec(), "m", 1).unwrap();
    kms.answer = Answer::SealToOtherKey;
    assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "cms");
    // Publication and a fresh attestation for a client's nonce (relayed by the host).
    let receipt = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let binding = nsm::own_binding(&fleet.secret, &receipt, record.epoch, record.not_after_ms, &fleet.kms_key).unwrap();
    s.nsm.attest(AttestationRequest::publication(&binding)).unwrap();
    let client_nonce = host_spki[..64].to_vec(); // whatever the client sent: it only reaches `nonce`
    s.nsm.attest(AttestationRequest::fresh(&binding, &client_nonce).unwrap()).unwrap();

    let documents = s.nsm.documents();
    assert_eq!(documents.len(), generated.len() + 3 + 2);
    let own_binding = binding.encode();
    let mut release_keys = BTreeSet::new();
    let mut key_release_docs = 0;
    for (i, doc) in documents.iter().enumerate() {
        assert_ne!(doc.public_key.as_deref(), Some(host_spki.as_slice()), "document {i}");
        match (&doc.public_key, &doc.user_data) {
            (Some(public_key), None) => {
                key_release_docs += 1;
                assert_eq!(doc.nonce, None, "document {i}");
                // An RSA-2048 SPKI the worker generated, never attested twice.
                assert_eq!(public_key.len(), 294, "document {i}");
                if let Some(known) = generated.get(i) {
                    assert_eq!(public_key, known, "document {i} carries exactly its one-shot key");
                }
                assert!(release_keys.insert(public_key.clone()), "document {i}: a one-shot key was attested twice");
            }
            (None, Some(user_data)) => {
                assert_eq!(user_data, &own_binding, "document {i}");
                assert_eq!(UserDataBinding::decode(user_data).unwrap(), binding);
                assert!(doc.nonce.is_none() || doc.nonce.as_deref() == Some(client_nonce.as_slice()), "document {i}");
            }
            other => panic!("document {i}: unexpected public_key/user_data combination {other:?}"),
        }
    }
    assert_eq!(key_release_docs, generated.len() + 3);
    // What went to KMS (through the host) were exactly the key-release documents, in order.
    let raw = s.nsm.raw();
    assert_eq!(kms.attestations.as_slice(), &raw[..key_release_docs]);
}

#[test]
fn a_oneshot_key_opens_at_most_one_envelope() {
    // The type system does the work (`open(self)`); this shows the pool never hands out a key twice.
    let pool = RsaKeyPool::start(3, 2);
    let keys: Vec<OneShotKey> = (0..5).map(|_| pool.take().unwrap()).collect();
    let distinct: BTreeSet<Vec<u8>> = keys.iter().map(|k| k.public_key_der().to_vec()).collect();
    assert_eq!(distinct.len(), 5);
    let on_demand = RsaKeyPool::on_demand();
    assert_eq!(on_demand.ready(), 0);
    assert_eq!(on_demand.take().unwrap().public_key_der().len(), 294);
}

#[test]
fn a_fleet_key_wrapped_under_a_host_owned_kms_key_is_refused() {
    // The host made a KMS key in its own account (no attestation condition), wrapped a private
    // key it keeps under {epoch 999, a far not_after}, wrote the record and handed the worker
    // that account's credentials. Real KMS releases it to the genuine enclave; what stops the
    // attack is that the document then names the host's key and clients pin their deployment's.
    let s = setup();
    let mut host_kms = TestKms::new(&s.nsm);
    host_kms.key_arn = HOST_KEY_ARN.to_owned();
    let (record, host_fleet) = epoch_record(&mut host_kms, 999, now_ms() + 10 * 365 * 24 * HOUR_MS);
    let released = key_release::release_fleet_key(&s.nsm, &s.pool, &mut host_kms, &record).unwrap();
    assert_eq!(released.secret.to_scalar_bytes(), host_fleet.to_scalar_bytes(), "the host knows this key");
    assert_eq!(released.kms_key.as_str(), HOST_KEY_ARN, "the binding names the key that released it");

    let receipt = ed25519_dalek::SigningKey::from_bytes(&[6; 32]);
    let binding = nsm::own_binding(&released.secret, &receipt, 999, record.not_after_ms, &released.kms_key).unwrap();
    let document = s.nsm.attest(AttestationRequest::publication(&binding)).unwrap();
    let mut client = VerifyOptions::new(s.nsm.trust_anchor(), now_ms()).expect_pcr(0, s.nsm.pcrs()[&0].clone());
    client.expected_fleet_kms_key = Some(key_arn());
    client.now_ms = s.nsm.now_ms() + 1_000;
    let error = verify(&document, &client).unwrap_err();
    assert_eq!(error.check().as_str(), "fleet_kms_key", "{error}");
    assert!(error.to_string().contains(HOST_KEY_ARN) && error.to_string().contains(KEY_ARN), "{error}");

    // The deployment's own key verifies.
    let mut kms = TestKms::new(&s.nsm);
    let (record, _) = epoch_record(&mut kms, 1, now_ms() + HOUR_MS);
    let genuine = key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record).unwrap();
    let binding = nsm::own_binding(&genuine.secret, &receipt, 1, record.not_after_ms, &genuine.kms_key).unwrap();
    let document = s.nsm.attest(AttestationRequest::publication(&binding)).unwrap();
    // Verified at a "now" taken after the document was made (its leaf starts at the next second).
    client.now_ms = s.nsm.now_ms() + 1_000;
    let verified = verify(&document, &client).unwrap();
    let bound = verified.binding.unwrap();
    assert_eq!((bound.kms_key.as_str(), bound.not_after_ms), (KEY_ARN, record.not_after_ms));
}

#[test]
fn kms_must_answer_for_the_key_the_record_names() {
    let s = setup();
    let mut kms = TestKms::new(&s.nsm);
    let (mut record, _) = epoch_record(&mut kms, 2, now_ms() + HOUR_MS);
    // An answer naming another key than the one asked is refused.
    kms.answer = Answer::OtherKeyId;
    match err(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)) {
        KeyReleaseError::FleetKmsKey(message) => assert!(message.contains(HOST_KEY_ARN), "{message}"),
        other => panic!("{other}"),
    }
    // A record naming its key by alias, bare id or nothing: KMS would resolve it, so it pins
    // nothing; refused before anything is attested or asked.
    kms.answer = Answer::Honest;
    let calls = kms.calls;
    for name in ["alias/ephem-fleet", "test-fleet", "", "arn:aws:kms:us-east-1:111122223333:alias/ephem-fleet"] {
        record.kms_key_id = name.to_owned();
        assert_eq!(check_of(key_release::release_fleet_key(&s.nsm, &s.pool, &mut kms, &record)), "fleet_kms_key", "{name:?}");
    }
    assert_eq!(kms.calls, calls, "nothing went to KMS");
}
