//! A development enclave for tests and benchmarks (feature `dev-issuer`): a seeded development
//! CA, a per-boot receipt key and the attestation document that binds it, signing real receipts.
//! Every crate that checks receipts tests against the same enclave.

use sha2::{Digest, Sha256};

use crate::attestation::{DevIssuer, UserDataBinding, vectors};

/// A development enclave for tests: a seeded development CA, a per-boot receipt key and
/// the attestation document that binds it, signing real protocol receipts.
pub struct DevEnclave {
    pub issuer: DevIssuer,
    pub receipt_key: ed25519_dalek::SigningKey,
    pub binding: UserDataBinding,
    /// PCR0, PCR1, PCR2 of this enclave.
    pub pcrs: [[u8; 48]; 3],
    /// The published document every receipt of [`DevEnclave::receipt`] names.
    pub document: Vec<u8>,
    pub document_ms: u64,
}

/// The id of test job `job`: its number, big-endian (every test names jobs this way).
pub fn job_id(job: u64) -> crate::envelope::JobId {
    crate::envelope::JobId(u128::from(job).to_be_bytes())
}

/// Fleet key epoch of every [`DevEnclave`].
pub const DEV_EPOCH: u64 = 7;

impl DevEnclave {
    /// An enclave whose keys derive from `seed`, publishing its document at `document_ms`
    /// (its CA was created a day earlier).
    pub fn new(seed: u8, document_ms: u64) -> Self {
        let issuer = DevIssuer::from_seed(&[seed; 32], document_ms - 86_400_000).expect("development CA");
        let receipt_key = ed25519_dalek::SigningKey::from_bytes(&[seed ^ 0x5a; 32]);
        let sample = vectors::binding_sample();
        let binding = UserDataBinding::new(
            sample.fleet_public_key,
            receipt_key.verifying_key().to_bytes(),
            DEV_EPOCH,
            sample.not_after_ms,
            sample.kms_key,
        )
        .expect("valid binding");
        let pcrs = [[0xa0 ^ seed; 48], [0xa1; 48], [0xa2; 48]];
        let mut enclave = Self { issuer, receipt_key, binding, pcrs, document: Vec::new(), document_ms };
        enclave.document = enclave.attest(Some(enclave.binding.encode()), document_ms);
        enclave
    }

    /// An enclave of another image — PCR0 `[image; 48]`, its own receipt key — on the same
    /// development CA as `new(seed, …)`: genuine hardware running other code.
    pub fn with_image(seed: u8, image: u8, document_ms: u64) -> Self {
        let mut enclave = Self::new(seed, document_ms);
        enclave.pcrs[0] = [image; 48];
        enclave.receipt_key = ed25519_dalek::SigningKey::from_bytes(&[image ^ 0x3c; 32]);
        enclave.binding.receipt_public_key = enclave.receipt_key.verifying_key().to_bytes();
        enclave.document = enclave.attest(Some(enclave.binding.encode()), document_ms);
        enclave
    }

    /// The policy `publisher` signs for this enclave's image (its root and PCR0/1/2).
    pub fn policy(&self, publisher: &ed25519_dalek::SigningKey) -> crate::attestation::SignedPolicy {
        let pcrs = (0u8..).zip(self.pcrs.iter().map(|p| p.to_vec())).collect();
        let mut policy = crate::attestation::Policy::aws(pcrs);
        policy.root = self.anchor();
        policy.sign(publisher).expect("a valid policy")
    }

    /// The development root to pin.
    pub fn anchor(&self) -> crate::attestation::TrustAnchor {
        self.issuer.trust_anchor().expect("development root")
    }

    /// Another document of this enclave (same PCRs) carrying `user_data`, at `at_ms`.
    pub fn attest(&self, user_data: Option<Vec<u8>>, at_ms: u64) -> Vec<u8> {
        let mut request = crate::attestation::DocumentRequest::new(format!("i-dev0000000000000{:02x}-enc01", self.pcrs[0][0]));
        for (i, pcr) in self.pcrs.iter().enumerate() {
            request = request.with_pcr(i, *pcr);
        }
        request.user_data = user_data;
        self.issuer.attest(&request, at_ms).expect("development document")
    }

    /// The receipt this enclave signs for test job `job`, naming [`DevEnclave::document`].
    pub fn receipt(&self, job: u64) -> crate::receipt::Receipt {
        let job_id = self::job_id(job).0;
        crate::receipt::Receipt {
            job_id: self::job_id(job),
            input_sha256: Sha256::digest([b"input".as_slice(), &job_id].concat()).into(),
            output_sha256: Sha256::digest([b"output".as_slice(), &job_id].concat()).into(),
            records_ok: 1000 + job % 7,
            records_failed: job % 3,
            tokens: 50_000 + job,
            model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
            manifest_hash: [0x33; 32],
            options: crate::envelope::JobOptions::default(),
            result_key_id: [0x44; 32],
            attempt: 1,
            attestation_sha256: Sha256::digest(&self.document).into(),
            pcrs: (0u8..).zip(self.pcrs.iter()).map(|(i, v)| (i, v.to_vec())).collect(),
            fleet_key_id: self.binding.fleet_key_id(),
            epoch: DEV_EPOCH,
            started_ms: self.document_ms + job * 1000,
            finished_ms: self.document_ms + job * 1000 + 500,
            commitment: [0x77; 32],
            records_root: None,
            compute: None,
        }
    }

    /// The usage receipt this enclave signs as its `sequence`-th, naming [`DevEnclave::document`].
    pub fn usage_receipt(&self, sequence: u64) -> crate::usage::UsageReceipt {
        crate::usage::UsageReceipt {
            client: crate::online::ClientLabel([0x55; 32]),
            model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
            manifest_hash: [0x33; 32],
            precision: crate::envelope::Precision::Fp32,
            period_start_ms: self.document_ms + sequence * 60_000,
            period_end_ms: self.document_ms + (sequence + 1) * 60_000,
            requests: 3 + sequence,
            inputs: 7 + sequence,
            tokens: 90 + sequence,
            commitment: [0x66; 32],
            sequence,
            attestation_sha256: Sha256::digest(&self.document).into(),
            pcrs: (0u8..).zip(self.pcrs.iter()).map(|(i, v)| (i, v.to_vec())).collect(),
            fleet_key_id: self.binding.fleet_key_id(),
            epoch: DEV_EPOCH,
        }
    }

    /// Signs `receipt` with this enclave's receipt key.
    pub fn sign(&self, receipt: &crate::receipt::Receipt) -> Vec<u8> {
        receipt.sign(&self.receipt_key)
    }
}
