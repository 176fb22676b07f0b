//! `results` and `verify` against a host that controls the jobs and models buckets: it swaps
//! the receipt between two reads, moves outputs between attempts, and replaces the manifest.
//! The enclave here is played with the real envelope, stream, receipt and development
//! attestation code (no model): it opens the sealed input with the fleet key, embeds each record
//! as a fixed vector, seals the result to the client and signs the receipt with the key its
//! attestation document binds.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cloud::hooked::{Hooked, StoreHooks};
use cloud_local::LocalCloud;
use cloud::{layout, ObjectError, ObjectMeta, ObjectStore, PutCondition, Services};
use ed25519_dalek::SigningKey;
use ephem_batch_client::corpus::CorpusOptions;
use ephem_batch_client::home::Home;
use ephem_batch_client::jobstate::ClientJob;
use ephem_batch_client::results::{self, ResultsError};
use ephem_batch_client::submit::{self, CheckedModel, Sealing};
use ephem_batch_client::fleet_key::memory::KeyMemory;
use ephem_batch_client::trust::{self, ClientTrust};
use ephem_batch_client::{keys, verify};
use protocol::attestation::dev_issuer::development_pcrs;
use protocol::attestation::{vectors, DevIssuer, DocumentRequest, Policy};
use protocol::envelope::{self, FleetSecretKey, JobId, JobOptions, Preamble, ResultHeader, ResultPublicKey, ResultSecretKey, StreamKind};
use protocol::manifest::{Manifest, ModelFile, Pooling, SignedManifest};
use protocol::receipt::{PlaintextCommitment, Receipt, SignedReceipt};
use protocol::records::{encode_output, InputDecoder, OutputRecord, Vector};
use sha2::{Digest, Sha256};

mod support;

const MODEL: &str = "example/tiny-bert";
const DIMENSIONS: usize = 4;
/// Everything happens at this time (2025-06-01), so the development documents stay valid.
const T0: u64 = 1_748_736_000_000;

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The host's view of a bucket: reads of some keys answered with other bytes, and the reads of
/// the receipt answered in turn from a list (the last one repeats), counted.
struct Host {
    overrides: Mutex<HashMap<String, Vec<u8>>>,
    receipt_key: String,
    receipts: Vec<Vec<u8>>,
    receipt_reads: AtomicUsize,
}

impl Host {
    fn new(receipt_key: String, receipts: Vec<Vec<u8>>) -> Host {
        Host { overrides: Mutex::new(HashMap::new()), receipt_key, receipts, receipt_reads: AtomicUsize::new(0) }
    }

    fn replace(self, key: &str, bytes: Vec<u8>) -> Host {
        self.overrides.lock().unwrap().insert(key.to_owned(), bytes);
        self
    }

    fn answer(&self, key: &str) -> Option<Result<Vec<u8>, ObjectError>> {
        if key == self.receipt_key && !self.receipts.is_empty() {
            let n = self.receipt_reads.fetch_add(1, Ordering::SeqCst);
            return Some(Ok(self.receipts[n.min(self.receipts.len() - 1)].clone()));
        }
        self.overrides.lock().unwrap().get(key).cloned().map(Ok)
    }
}

impl StoreHooks for Host {
    fn get(&self, inner: &dyn ObjectStore, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.answer(key).unwrap_or_else(|| inner.get(key))
    }
    fn reader(&self, inner: &dyn ObjectStore, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        match self.answer(key) {
            Some(bytes) => Ok(Box::new(std::io::Cursor::new(bytes?))),
            None => inner.reader(key),
        }
    }
    fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        // Bounded reads (`get_at_most`) of the receipt and the replaced keys get the host's answer.
        match self.answer(key) {
            Some(bytes) => Ok(bytes?.into_iter().skip(offset as usize).take(len as usize).collect()),
            None => inner.read_range(key, offset, len),
        }
    }
    fn head(&self, inner: &dyn ObjectStore, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        match self.overrides.lock().unwrap().get(key) {
            Some(bytes) => Ok(Some(ObjectMeta { key: key.into(), size: bytes.len() as u64, etag: "x".into(), modified_ms: 0 })),
            None => inner.head(key),
        }
    }
}

/// The enclave's keys and the document that binds them.
struct Enclave {
    fleet: FleetSecretKey,
    receipt_key: SigningKey,
    document: Vec<u8>,
    pcrs: std::collections::BTreeMap<u8, Vec<u8>>,
}

/// One finished attempt: its signed receipt and its sealed output.
struct Attempt {
    receipt: Vec<u8>,
    output: Vec<u8>,
}

struct Fixture {
    _dir: tempfile::TempDir,
    work: PathBuf,
    home: Home,
    services: Services,
    enclave: Enclave,
    issuer_root: protocol::attestation::TrustAnchor,
    publisher: SigningKey,
    manifest_key: String,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::resolve(Some(&dir.path().join("home"))).unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let services = LocalCloud::open(home.root()).unwrap().services();

        let issuer = DevIssuer::generate(T0 - 3_600_000).unwrap();
        let fleet = FleetSecretKey::generate();
        let receipt_key = SigningKey::from_bytes(&rand32());
        // The sample binding with this enclave's keys (its other fields are valid at T0).
        let mut binding = vectors::binding_sample();
        binding.fleet_public_key = fleet.public_key().to_bytes().try_into().unwrap();
        binding.receipt_public_key = receipt_key.verifying_key().to_bytes();
        binding.epoch = 3;
        let mut request = DocumentRequest::new("i-0123456789abcdef0-enc0123456789abcdef");
        request.pcrs = development_pcrs([7; 48]);
        binding.not_after_ms = T0 + support::EPOCH_MS;
        support::publish_genesis(&home, &services, &issuer, &request, &mut binding);
        request.user_data = Some(binding.encode());
        let document = issuer.attest(&request, T0).unwrap();
        let pcrs = (0u8..3).map(|i| (i, request.pcrs[i as usize].to_vec())).collect();
        services.attestations.put(&layout::attestation_current("host-a"), &document, PutCondition::Overwrite).unwrap();
        services.attestations.put(&layout::attestation_by_hash(&sha256(&document)), &document, PutCondition::Overwrite).unwrap();

        let publisher = SigningKey::from_bytes(&rand32());
        let manifest_key = layout::model_manifest(MODEL, 1);
        services.models.put(&manifest_key, &manifest(1).sign(&publisher), PutCondition::CreateOnly).unwrap();
        let issuer_root = issuer.trust_anchor().unwrap();
        Fixture { _dir: dir, work, home, services, enclave: Enclave { fleet, receipt_key, document, pcrs }, issuer_root, publisher, manifest_key }
    }

    fn trust(&self) -> ClientTrust {
        let mut policy = Policy::aws(self.enclave.pcrs.clone());
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

    fn result_key(&self) -> ResultSecretKey {
        keys::load_result_key(&self.home.result_key(), true).unwrap()
    }

    /// Seals a corpus of `ids` through the client's own sealing code.
    fn submit(&self, ids: &[String]) -> (ClientJob, JobId) {
        let corpus = self.work.join(format!("{}.jsonl", ids[0]));
        let lines: Vec<String> = ids.iter().map(|id| serde_json::json!({"id": id, "text": format!("text of {id}")}).to_string()).collect();
        std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();
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
        let job = submit::seal_file(&self.home, &self.services, &sealing, &corpus).unwrap();
        let id = job.job_id.clone();
        (job, id)
    }

    /// The enclave runs `attempt` of `job`: opens the input, embeds each record (as the ids
    /// `claim` names, when given, instead of the ids it read), seals, signs, stores the output.
    fn run(&self, job: &JobId, attempt: u64, claim: Option<&[String]>) -> Attempt {
        let input = self.services.jobs.get(&layout::job_input(job)).unwrap();
        let (preamble, used) = Preamble::parse_complete(&input, StreamKind::JobInput).unwrap();
        let mut opened = envelope::open_job(&preamble, &self.enclave.fleet, Some(*job)).unwrap();
        let mut plain = Vec::new();
        opened.opener.push(&input[used..], &mut plain).unwrap();
        opened.opener.finish(&mut plain).unwrap();
        let mut decoder = InputDecoder::new();
        decoder.push(&plain);
        let mut ids = Vec::new();
        while let Some(record) = decoder.next_record().unwrap() {
            ids.push(record.id);
        }
        let ids = claim.map(<[String]>::to_vec).unwrap_or(ids);
        let records: Vec<OutputRecord> = ids.iter().enumerate().map(|(i, id)| embedding(id, attempt as f32, i)).collect();
        let header = &opened.header;
        let client = ResultPublicKey::from_bytes(&header.result_public_key).unwrap();
        let (output, output_plain) = seal_output(&ResultHeader { job_id: *job, result_key_id: client.key_id(), attempt, created_ms: T0 + 3_000 }, &client, &records);
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
            attempt,
            attestation_sha256: sha256(&self.enclave.document),
            pcrs: self.enclave.pcrs.clone(),
            fleet_key_id: self.enclave.fleet.public_key().key_id(),
            epoch: header.epoch,
            started_ms: T0 + 2_500,
            finished_ms: T0 + 3_000,
            commitment: PlaintextCommitment::from_digests(&opened.commitment_key, &sha256(&plain), &sha256(&output_plain)),
            records_root: None,
            compute: None,
        };
        self.services.jobs.put(&layout::job_output(job, attempt), &output, PutCondition::Overwrite).unwrap();
        Attempt { receipt: receipt.sign(&self.enclave.receipt_key), output }
    }

    /// The jobs bucket as the host serves it to the client.
    fn host(&self, host: Host) -> Services {
        Services { jobs: Arc::new(Hooked::new(self.services.jobs.clone(), host)), ..self.services.clone() }
    }

    fn results(&self, services: &Services, job: &JobId, out: &Path) -> anyhow::Result<results::Written> {
        results::run(&self.home, services, &self.trust(), &self.result_key(), job, Some(out), Some(results::Format::Jsonl))
    }
}

fn rand32() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).unwrap();
    bytes
}

fn manifest(version: u64) -> Manifest {
    Manifest {
        model_id: MODEL.into(),
        version,
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

/// Record `i`'s vector names the attempt (or 666 for the host's own) that made it.
fn embedding(id: &str, made_by: f32, i: usize) -> OutputRecord {
    OutputRecord::Embedding { id: id.into(), tokens: 5, vector: Vector::F32(vec![made_by, i as f32, 0.5, -0.5]) }
}

fn seal_output(header: &ResultHeader, client: &ResultPublicKey, records: &[OutputRecord]) -> (Vec<u8>, Vec<u8>) {
    let mut plain = Vec::new();
    for record in records {
        encode_output(record, &mut plain).unwrap();
    }
    let sealed = envelope::seal_result(header, client).unwrap();
    let (mut out, mut sealer) = (sealed.preamble, sealed.sealer);
    sealer.push(&plain, &mut out).unwrap();
    sealer.finish(&mut out).unwrap();
    (out, plain)
}

/// What the host can make on its own: an output sealed to the client's public key (it is in
/// the job header) for `attempt`, with vectors of its choosing, and a receipt naming it signed
/// by a key of its own.
fn fabricate(job: &ClientJob, id: &JobId, attempt: u64, client: &ResultPublicKey, genuine: &[u8]) -> Attempt {
    let ids: Vec<String> = (0..job.records).map(|i| format!("a-{i}")).collect();
    let records: Vec<OutputRecord> = ids.iter().enumerate().map(|(i, id)| embedding(id, 666.0, i)).collect();
    let header = ResultHeader { job_id: *id, result_key_id: client.key_id(), attempt, created_ms: T0 + 3_000 };
    let (output, _) = seal_output(&header, client, &records);
    let mut receipt = SignedReceipt::decode(genuine).unwrap().receipt;
    receipt.attempt = attempt;
    receipt.output_sha256 = sha256(&output);
    Attempt { receipt: receipt.sign(&SigningKey::from_bytes(&rand32())), output }
}

fn ids(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// The first number of each embedding written: the attempt that made it.
fn written_makers(out: &Path) -> Vec<f64> {
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["embedding"][0].as_f64().unwrap())
        .collect()
}

fn failed_checks(result: anyhow::Result<results::Written>) -> Vec<&'static str> {
    match result {
        Ok(_) => vec!["<none: written>"],
        Err(error) => error.downcast_ref::<ResultsError>().unwrap_or_else(|| panic!("not a named check: {error:#}")).checks(),
    }
}

#[test]
fn results_refuses_a_receipt_swapped_between_reads() {
    let f = Fixture::new();
    let (job, id) = f.submit(&ids("a", 5));
    let first = f.run(&id, 1, None);
    let second = f.run(&id, 2, None);
    let client = f.result_key().public_key();
    let receipt_key = layout::job_receipt(&id);

    // A receipt of the host's own naming its own attempt, then the genuine one: the output of
    // the first must never be written.
    let forged = fabricate(&job, &id, 7, &client, &first.receipt);
    let host = Host::new(receipt_key.clone(), vec![forged.receipt.clone(), first.receipt.clone()])
        .replace(&layout::job_output(&id, 7), forged.output.clone());
    let out = f.work.join("forged-first.jsonl");
    let result = f.results(&f.host(host), &id, &out);
    if result.is_ok() {
        assert_eq!(written_makers(&out), vec![1.0; 5], "only the verified attempt's output may be written");
    } else {
        assert!(!out.exists(), "nothing written on refusal");
        assert!(failed_checks(result).contains(&"receipt_attestation"));
    }

    // The genuine receipt of attempt 1, then attempt 2's; the host put an output of its own
    // under attempt 1.
    let fake_first = fabricate(&job, &id, 1, &client, &first.receipt);
    let host = Host::new(receipt_key.clone(), vec![first.receipt.clone(), second.receipt.clone()])
        .replace(&layout::job_output(&id, 1), fake_first.output.clone());
    let out = f.work.join("genuine-then-other-attempt.jsonl");
    let result = f.results(&f.host(host), &id, &out);
    assert!(!out.exists(), "nothing written for an output the verified receipt does not name");
    assert!(failed_checks(result).contains(&"output_sha256"));

    // Genuine outputs: the receipt is read once, so a later swap (to another job's) is moot.
    let (_, other_id) = f.submit(&ids("b", 5));
    let other = f.run(&other_id, 1, None);
    let host = Arc::new(Hooked::new(f.services.jobs.clone(), Host::new(receipt_key.clone(), vec![first.receipt.clone(), other.receipt.clone()])));
    let services = Services { jobs: host.clone(), ..f.services.clone() };
    let out = f.work.join("read-once.jsonl");
    let written = f.results(&services, &id, &out).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(written_makers(&out), vec![1.0; 5]);
    assert_eq!(host.hooks.receipt_reads.load(Ordering::SeqCst), 1, "results reads the receipt once");
    assert!(written.verification.checks.iter().any(|c| c.name == "record_ids" && c.passed));
}

#[test]
fn an_output_of_another_attempt_fails_output_sha256() {
    let f = Fixture::new();
    let (_, id) = f.submit(&ids("a", 4));
    let first = f.run(&id, 1, None);
    let second = f.run(&id, 2, None);
    let receipt_key = layout::job_receipt(&id);

    // results: attempt 2's genuine output under attempt 1's key.
    let host = Host::new(receipt_key.clone(), vec![first.receipt.clone()])
        .replace(&layout::job_output(&id, 1), second.output.clone());
    let out = f.work.join("moved.jsonl");
    assert!(failed_checks(f.results(&f.host(host), &id, &out)).contains(&"output_sha256"));
    assert!(!out.exists());

    // verify: attempt 1 was written; the committed receipt now names attempt 2.
    let host = Host::new(receipt_key.clone(), vec![first.receipt.clone()]);
    f.results(&f.host(host), &id, &f.work.join("written.jsonl")).unwrap_or_else(|e| panic!("{e:#}"));
    let host = Host::new(receipt_key, vec![second.receipt.clone()]);
    let verification = verify::verify_job(&f.home, &f.host(host), &f.trust(), &id, &f.result_key(), None).unwrap();
    let check = verification.checks.iter().find(|c| c.name == "output_sha256").expect("output_sha256 checked");
    assert!(!check.passed, "the attempt written is not the attempt verified: {}", check.detail);
    assert!(check.detail.contains("attempt 1") && check.detail.contains("attempt 2"), "{}", check.detail);
}

/// A receipt, signed by the enclave, that states other options than the client sealed — another
/// prompt, a Matryoshka length, another precision — is refused by the `options` check, and
/// nothing is written.
#[test]
fn results_refuses_a_receipt_stating_other_options() {
    let f = Fixture::new();
    let (_, id) = f.submit(&ids("o", 3));
    let genuine = f.run(&id, 1, None);
    let restatements: [fn(&mut JobOptions); 3] = [
        |o| o.prompt = Some("query".into()),
        |o| o.dimensions = Some(128),
        |o| o.precision = protocol::envelope::Precision::Int8,
    ];
    for (i, restate) in restatements.iter().enumerate() {
        let mut receipt = SignedReceipt::decode(&genuine.receipt).unwrap().receipt;
        restate(&mut receipt.options);
        let host = Host::new(layout::job_receipt(&id), vec![receipt.sign(&f.enclave.receipt_key)]);
        let out = f.work.join(format!("restated-{i}.jsonl"));
        assert_eq!(failed_checks(f.results(&f.host(host), &id, &out)), ["options"], "restatement {i}");
        assert!(!out.exists(), "restatement {i}: nothing written");
    }
}

#[test]
fn results_refuses_output_ids_other_than_those_sealed() {
    let f = Fixture::new();
    let (_, id) = f.submit(&ids("a", 5));
    let out = f.work.join("ids.jsonl");

    // A signed receipt over an output with another job's ids, then with the ids reordered.
    for claim in [ids("b", 5), ids("a", 5).into_iter().rev().collect()] {
        let attempt = f.run(&id, 1, Some(&claim));
        let host = Host::new(layout::job_receipt(&id), vec![attempt.receipt]);
        let failed = failed_checks(f.results(&f.host(host), &id, &out));
        assert_eq!(failed, vec!["record_ids"], "ids {claim:?}");
        assert!(!out.exists());
    }

    // A genuine output of another job sealed to the same client key, under this job's attempt.
    let (_, other_id) = f.submit(&ids("b", 5));
    let other = f.run(&other_id, 1, None);
    let mine = f.run(&id, 1, None);
    let host = Host::new(layout::job_receipt(&id), vec![mine.receipt])
        .replace(&layout::job_output(&id, 1), other.output);
    assert!(failed_checks(f.results(&f.host(host), &id, &out)).contains(&"output_sha256"));
    assert!(!out.exists());
}

#[test]
fn results_refuses_dimensions_from_a_manifest_the_job_did_not_pin() {
    let f = Fixture::new();
    let (_, id) = f.submit(&ids("a", 3));
    let attempt = f.run(&id, 1, None);
    let out = f.work.join("manifest.jsonl");
    let services = |models: Host| {
        let jobs = Host::new(layout::job_receipt(&id), vec![attempt.receipt.clone()]);
        Services {
            jobs: Arc::new(Hooked::new(f.services.jobs.clone(), jobs)),
            models: Arc::new(Hooked::new(f.services.models.clone(), models)),
            ..f.services.clone()
        }
    };
    let models = || Host::new(String::new(), vec![]);

    // Another manifest the publisher signed (same dimensions even), served under the pinned key.
    let v2 = manifest(2).sign(&f.publisher);
    let error = f.results(&services(models().replace(&f.manifest_key, v2)), &id, &out).err().expect("refused");
    assert!(matches!(error.downcast_ref::<ResultsError>(), Some(ResultsError::Manifest { .. })), "{error:#}");
    assert!(error.to_string().contains("check `manifest` failed"), "{error:#}");
    assert!(!out.exists());

    // Bytes that are no manifest: no dimensions to trust.
    let error = f.results(&services(models().replace(&f.manifest_key, b"not a manifest".to_vec())), &id, &out).err().expect("refused");
    assert!(matches!(error.downcast_ref::<ResultsError>(), Some(ResultsError::Manifest { .. })), "{error:#}");

    // The pinned manifest: written.
    f.results(&services(models()), &id, &out).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(written_makers(&out), vec![1.0; 3]);
}
