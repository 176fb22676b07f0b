//! The fixed material every run uses, derived from labels so that the seed writer and the targets
//! agree without any key being stored: the fleet and result keys envelopes are opened with, the
//! STREAM key, an enclave (development CA, attestation document, receipt key) receipts are
//! checked against, the ledger's note key, and a one-shot RSA key for KMS envelopes.
//!
//! None of this is secret: it is test material, like the development issuer's seed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::OnceLock;

use ed25519_dalek::SigningKey;
use protocol::attestation::{DevIssuer, DocumentRequest, TrustAnchor, UserDataBinding};
use protocol::envelope::{FleetSecretKey, ResultSecretKey};
use protocol::stream::StreamId;
use receipts_ledger::note::{SignerKey, VerifierKey};
use rsa::RsaPrivateKey;
use sha2::{Digest, Sha256};

/// Verification time of the attestation target: the timestamp of the real
/// `aws-samples_us-east-2_prod_2023-06-06.cbor`, so that document passes every check.
pub const ATTESTATION_TIME_MS: u64 = 1_686_060_167_435;
/// PCR0 of that document (the attestation target expects it: `pcr_policy` is evaluated).
pub const ATTESTATION_PCR0_HEX: &str =
    "836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901";

/// The development CA's creation time and the enclave document's timestamp.
pub const DEV_CA_TIME_MS: u64 = 1_735_689_600_000;
pub const DEV_DOC_TIME_MS: u64 = 1_735_690_200_123;
/// The fleet key epoch the enclave's binding names.
pub const EPOCH: u64 = 7;
/// The model the seeds name.
pub const MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// The ledger's origin line and note key name.
pub const LEDGER_ORIGIN: &str = "fuzz.ephem-batch.example/ledger";

/// 32 bytes derived from a label.
pub fn seed(label: &str) -> [u8; 32] {
    Sha256::digest(format!("ephem-batch fuzz {label}").as_bytes()).into()
}

/// A deterministic generator (SHA-256 in counter mode) for the RSA key and the CMS seeds.
pub struct HashRng {
    seed: [u8; 32],
    counter: u64,
}

impl HashRng {
    pub fn new(label: &str) -> Self {
        HashRng { seed: seed(label), counter: 0 }
    }
}

impl rsa::rand_core::TryRng for HashRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut b = [0u8; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut b = [0u8; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(32) {
            let mut h = Sha256::new();
            h.update(self.seed);
            h.update(self.counter.to_be_bytes());
            self.counter += 1;
            let block: [u8; 32] = h.finalize().into();
            chunk.copy_from_slice(&block[..chunk.len()]);
        }
        Ok(())
    }
}

impl rsa::rand_core::TryCryptoRng for HashRng {}

/// The fleet key job inputs are sealed to.
pub fn fleet_secret() -> &'static FleetSecretKey {
    static KEY: OnceLock<FleetSecretKey> = OnceLock::new();
    KEY.get_or_init(|| FleetSecretKey::from_scalar_bytes(&seed("fleet key")).expect("fleet scalar"))
}

/// The client's result key job results are sealed to.
pub fn result_secret() -> &'static ResultSecretKey {
    static KEY: OnceLock<ResultSecretKey> = OnceLock::new();
    KEY.get_or_init(|| ResultSecretKey::from_bytes(&seed("result key")).expect("result key"))
}

/// Key and id of the bare STREAM the stream target opens.
pub fn stream_key() -> [u8; 32] {
    seed("stream key")
}

pub fn stream_id() -> StreamId {
    let mut id = [0u8; 16];
    id.copy_from_slice(&seed("stream id")[..16]);
    id
}

/// One enclave of the development shape: a deterministic development CA, the document it
/// published (user_data binds the fleet key, the receipt key and [`EPOCH`]), and its receipt key.
pub struct Enclave {
    pub root: TrustAnchor,
    pub document: Vec<u8>,
    pub receipt_key: SigningKey,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
}

pub fn enclave() -> &'static Enclave {
    static ENCLAVE: OnceLock<Enclave> = OnceLock::new();
    ENCLAVE.get_or_init(|| {
        let issuer = DevIssuer::from_seed(&seed("development CA"), DEV_CA_TIME_MS).expect("development CA");
        let receipt_key = SigningKey::from_bytes(&seed("receipt key"));
        let fleet_public: [u8; 65] =
            fleet_secret().public_key().to_bytes().try_into().expect("uncompressed P-256 point");
        let kms_key = protocol::attestation::vectors::BINDING_KMS_KEY.parse().expect("a key ARN");
        let binding = UserDataBinding::new(fleet_public, receipt_key.verifying_key().to_bytes(), EPOCH, u64::MAX, kms_key)
            .expect("binding");
        let mut request = DocumentRequest::new("i-0f0220ef0220ef022-enc0192fuzz0000000");
        for (index, byte) in [(0usize, 0x10u8), (1, 0x11), (2, 0x12), (8, 0x18)] {
            request = request.with_pcr(index, [byte; 48]);
        }
        request.user_data = Some(binding.encode());
        let pcrs = (0u8..).zip(request.pcrs.iter()).map(|(i, v)| (i, v.to_vec())).collect();
        let document = issuer.attest(&request, DEV_DOC_TIME_MS).expect("development document");
        Enclave { root: issuer.trust_anchor().expect("development root"), document, receipt_key, pcrs }
    })
}

/// The ledger's checkpoint signer and the key an auditor pins.
pub fn ledger_signer() -> &'static SignerKey {
    static KEY: OnceLock<SignerKey> = OnceLock::new();
    KEY.get_or_init(|| SignerKey::from_seed(LEDGER_ORIGIN, &seed("ledger key")).expect("ledger key"))
}

pub fn ledger_verifier() -> &'static VerifierKey {
    static KEY: OnceLock<VerifierKey> = OnceLock::new();
    KEY.get_or_init(|| ledger_signer().verifier())
}

/// The one-shot RSA-2048 recipient key KMS envelopes are sealed to (generated once per process
/// from a fixed seed, so the seed writer and the target derive the same key).
pub fn rsa_key() -> &'static RsaPrivateKey {
    static KEY: OnceLock<RsaPrivateKey> = OnceLock::new();
    KEY.get_or_init(|| RsaPrivateKey::new(&mut HashRng::new("rsa key"), 2048).expect("RSA key"))
}

/// The SPKI DER of [`rsa_key`], as an attestation document's `public_key` carries it.
pub fn rsa_spki() -> &'static [u8] {
    static SPKI: OnceLock<Vec<u8>> = OnceLock::new();
    SPKI.get_or_init(|| {
        use rsa::pkcs8::EncodePublicKey;
        rsa_key().to_public_key().to_public_key_der().expect("SPKI").as_bytes().to_vec()
    })
}
