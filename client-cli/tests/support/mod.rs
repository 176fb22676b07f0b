//! A client home against a local cloud, and an enclave played with the real envelope, stream,
//! receipt and development attestation code (no model): enough to seal through the client's
//! own code, complete the job as a worker would, and read its results back.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cloud_local::{LocalCloud, LocalKeyPolicy};
use cloud::{layout, PutCondition, Services};
use ed25519_dalek::SigningKey;
use ephem_batch_client::corpus::CorpusOptions;
use ephem_batch_client::home::Home;
use ephem_batch_client::jobstate::ClientJob;
use ephem_batch_client::keys;
use ephem_batch_client::results;
use ephem_batch_client::submit::{self, CheckedModel, Sealing};
use ephem_batch_client::fleet_key::memory::KeyMemory;
use ephem_batch_client::trust::{self, ClientTrust};
use protocol::attestation::dev_issuer::development_pcrs;
use protocol::attestation::{vectors, DevIssuer, DocumentRequest, GenesisBinding, Policy, UserDataBinding};
use protocol::fleet::{genesis_object_key, EpochGenesis};
use protocol::kms_arn::KmsKeyArn;
use protocol::envelope::{self, FleetSecretKey, JobId, JobOptions, Preamble, ResultHeader, ResultPublicKey, ResultSecretKey, StreamKind};
use protocol::manifest::{Manifest, ModelFile, Pooling, SignedManifest};
use protocol::receipt::{PlaintextCommitment, Receipt};
use protocol::records::{encode_output, InputDecoder, OutputRecord, Vector};
use sha2::{Digest, Sha256};

pub const MODEL: &str = "example/tiny-bert";
pub const DIMENSIONS: usize = 4;
/// Everything happens at this time (2025-06-01), so the development documents stay valid.
pub const T0: u64 = 1_748_736_000_000;

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

pub fn rand32() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).unwrap();
    bytes
}

/// What the enclave saw and made for one attempt.
pub struct Ran {
    /// SHA-256 of the input plaintext record stream the enclave opened.
    pub input_plain_sha256: [u8; 32],
    pub output_plain_sha256: [u8; 32],
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub work: PathBuf,
    pub home: Home,
    pub services: Services,
    fleet: FleetSecretKey,
    receipt_key: SigningKey,
    document: Vec<u8>,
    pcrs: std::collections::BTreeMap<u8, Vec<u8>>,
    issuer_root: protocol::attestation::TrustAnchor,
    publisher: SigningKey,
    manifest_key: String,
}

/// How long the fixtures' epochs last.
pub const EPOCH_MS: u64 = 7 * 24 * 3_600_000;

/// What an enclave of `request`'s image does to create `binding`'s epoch (docs/protocol.md
/// §7.3.2): a fleet KMS key that releases only to that PCR0, its evidence, and a genesis document
/// binding both, stored beside the epoch. Returns the key's ARN, which `binding` must name.
pub fn publish_genesis(
    home: &Home,
    services: &Services,
    issuer: &DevIssuer,
    request: &DocumentRequest,
    binding: &mut UserDataBinding,
) -> KmsKeyArn {
    let local = LocalCloud::open(home.root()).unwrap();
    let kms = local.kms();
    let arn = kms.create_key(LocalKeyPolicy::fleet(request.pcrs[0].to_vec(), None), "fixture fleet key").unwrap();
    let evidence = cloud::Kms::key_evidence(&*kms, &arn).unwrap();
    binding.kms_key = arn.parse().unwrap();
    let born = GenesisBinding {
        fleet_public_key: binding.fleet_public_key,
        epoch: binding.epoch,
        not_after_ms: binding.not_after_ms,
        kms_key: binding.kms_key.clone(),
        evidence_digest: evidence.digest(),
    };
    let mut genesis_request = request.clone();
    genesis_request.user_data = Some(born.encode());
    let document = issuer.attest(&genesis_request, T0 - 60_000).unwrap();
    let genesis = EpochGenesis { epoch: binding.epoch, document: hex::encode(document), key_evidence: evidence };
    services.attestations.put(&genesis_object_key(binding.epoch), genesis.to_json().as_bytes(), PutCondition::Overwrite).unwrap();
    binding.kms_key.clone()
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(&dir.path().join("home"))).unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let services = LocalCloud::open(home.root()).unwrap().services();

        let issuer = DevIssuer::generate(T0 - 3_600_000).unwrap();
        let fleet = FleetSecretKey::generate();
        let receipt_key = SigningKey::from_bytes(&rand32());
        let mut binding = vectors::binding_sample();
        binding.fleet_public_key = fleet.public_key().to_bytes().try_into().unwrap();
        binding.receipt_public_key = receipt_key.verifying_key().to_bytes();
        binding.epoch = 3;
        let mut request = DocumentRequest::new("i-0123456789abcdef0-enc0123456789abcdef");
        request.pcrs = development_pcrs([7; 48]);
        binding.not_after_ms = T0 + EPOCH_MS;
        binding.kms_key = publish_genesis(&home, &services, &issuer, &request, &mut binding);
        request.user_data = Some(binding.encode());
        let document = issuer.attest(&request, T0).unwrap();
        let pcrs = (0u8..3).map(|i| (i, request.pcrs[i as usize].to_vec())).collect();
        services.attestations.put(&layout::attestation_current("host-a"), &document, PutCondition::Overwrite).unwrap();
        services.attestations.put(&layout::attestation_by_hash(&sha256(&document)), &document, PutCondition::Overwrite).unwrap();

        let publisher = SigningKey::from_bytes(&rand32());
        let manifest_key = layout::model_manifest(MODEL, 1);
        services.models.put(&manifest_key, &manifest().sign(&publisher), PutCondition::CreateOnly).unwrap();
        let issuer_root = issuer.trust_anchor().unwrap();
        Fixture { _dir: dir, work, home, services, fleet, receipt_key, document, pcrs, issuer_root, publisher, manifest_key }
    }

    pub fn trust(&self) -> ClientTrust {
        let mut policy = Policy::aws(self.pcrs.clone());
        policy.root = self.issuer_root.clone();
        ClientTrust {
            policy,
            policy_file: "test-policy.json".into(),
            model_publisher: self.publisher.verifying_key(),
            development: true,
            fleet_kms_key: None,
            key_memory: KeyMemory::of(&self.home),
            witnesses: None,
        }
    }

    pub fn result_key(&self) -> ResultSecretKey {
        keys::load_result_key(&self.home.result_key(), true).unwrap()
    }

    /// A corpus of `ids`, each with the text `text of <id>`.
    pub fn corpus(&self, ids: &[String]) -> PathBuf {
        let corpus = self.work.join(format!("{}.jsonl", ids[0]));
        let lines: Vec<String> = ids.iter().map(|id| serde_json::json!({"id": id, "text": format!("text of {id}")}).to_string()).collect();
        std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();
        corpus
    }

    /// Seals `corpus` through the client's own sealing code, uploading through `services`.
    pub fn seal(&self, services: &Services, corpus: &Path) -> anyhow::Result<ClientJob> {
        let trust = self.trust();
        let enclave = trust::current_enclave(&self.services, &trust, T0 + 1_000).unwrap();
        let bytes = self.services.models.get(&self.manifest_key).unwrap();
        let signed = SignedManifest::decode(&bytes).unwrap();
        let model = CheckedModel { key: self.manifest_key.clone(), manifest: signed.manifest.clone(), hash: signed.hash };
        let sealing = Sealing {
            trust,
            enclave,
            model,
            result_key: self.result_key(),
            corpus_options: CorpusOptions { dimensions: Some(DIMENSIONS as u32), ..CorpusOptions::new(MODEL) },
            options: JobOptions::default(),
            now_ms: T0 + 2_000,
        };
        submit::seal_file(&self.home, services, &sealing, corpus)
    }

    /// The enclave runs attempt 1 of `job` and the host commits its output and receipt.
    pub fn complete(&self, job: &JobId) -> Ran {
        let input = self.services.jobs.get(&layout::job_input(job)).unwrap();
        let (preamble, used) = Preamble::parse_complete(&input, StreamKind::JobInput).unwrap();
        let mut opened = envelope::open_job(&preamble, &self.fleet, Some(*job)).unwrap();
        let mut plain = Vec::new();
        opened.opener.push(&input[used..], &mut plain).unwrap();
        opened.opener.finish(&mut plain).unwrap();
        let mut decoder = InputDecoder::new();
        decoder.push(&plain);
        let mut records = Vec::new();
        while let Some(record) = decoder.next_record().unwrap() {
            let vector = Vector::F32(vec![1.0, records.len() as f32, 0.5, -0.5]);
            records.push(OutputRecord::Embedding { id: record.id, tokens: 5, vector });
        }
        let header = &opened.header;
        let client = ResultPublicKey::from_bytes(&header.result_public_key).unwrap();
        let mut output_plain = Vec::new();
        for record in &records {
            encode_output(record, &mut output_plain).unwrap();
        }
        let result_header = ResultHeader { job_id: *job, result_key_id: client.key_id(), attempt: 1, created_ms: T0 + 3_000 };
        let sealed = envelope::seal_result(&result_header, &client).unwrap();
        let (mut output, mut sealer) = (sealed.preamble, sealed.sealer);
        sealer.push(&output_plain, &mut output).unwrap();
        sealer.finish(&mut output).unwrap();
        let receipt = Receipt {
            job_id: *job,
            input_sha256: sha256(&input),
            output_sha256: sha256(&output),
            records_ok: records.len() as u64,
            records_failed: 0,
            tokens: 5 * records.len() as u64,
            model_id: header.model_id.clone(),
            manifest_hash: header.manifest_hash,
            options: header.options.clone(),
            result_key_id: client.key_id(),
            attempt: 1,
            attestation_sha256: sha256(&self.document),
            pcrs: self.pcrs.clone(),
            fleet_key_id: self.fleet.public_key().key_id(),
            epoch: header.epoch,
            started_ms: T0 + 2_500,
            finished_ms: T0 + 3_000,
            commitment: PlaintextCommitment::from_digests(&opened.commitment_key, &sha256(&plain), &sha256(&output_plain)),
            records_root: None,
            compute: None,
        };
        self.services.jobs.put(&layout::job_output(job, 1), &output, PutCondition::CreateOnly).unwrap();
        self.services.jobs.put(&layout::job_receipt(job), &receipt.sign(&self.receipt_key), PutCondition::CreateOnly).unwrap();
        Ran { input_plain_sha256: sha256(&plain), output_plain_sha256: sha256(&output_plain) }
    }

    pub fn results(&self, job: &JobId, out: &Path) -> anyhow::Result<results::Written> {
        results::run(&self.home, &self.services, &self.trust(), &self.result_key(), job, Some(out), Some(results::Format::Jsonl))
    }
}

fn manifest() -> Manifest {
    Manifest {
        model_id: MODEL.into(),
        version: 1,
        files: vec![ModelFile { name: "model.safetensors".into(), sha256: [1; 32], size: 10 }],
        dimensions: DIMENSIONS as u32,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 128,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: "alias/test-model".into(),
        wrapped_dek: vec![9; 48],
        created_ms: T0 - 1_000,
    }
}

pub fn ids(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}
