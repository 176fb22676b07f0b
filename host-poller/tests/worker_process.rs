//! The poller with the real `enclave-worker` (started and supervised by the poller) and the
//! local cloud in a temporary home: real key release through the local KMS, a real model, real
//! sealed jobs. Set up the way `ephem-batch dev up` does: KMS keys bound to PCR0 = SHA-384 of the
//! worker binary, a fleet epoch, an encrypted and signed model.
//!
//! Needs the worker binary (`cargo build -p enclave-worker`; `scripts/test-rust.sh` builds every
//! binary first), found next to this test's directory or in `$EPHEM_BIN_DIR`, and the model
//! files (`$EPHEM_MODEL_DIR`, default `.ephem/models/all-MiniLM-L6-v2`).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloud_local::{LocalCloud, LocalKeyPolicy, FLEET_KEY_ALIAS, MODEL_KEY_ALIAS};
use cloud::messages::{JobState, LedgerMessage};
use cloud::{layout, Kms, ObjectStore, PutCondition, Queue};
use ed25519_dalek::VerifyingKey;
use host_poller::{PollerConfig, SpawnConfig, WorkerSource};
use p256::pkcs8::DecodePublicKey;
use protocol::attestation::{self, TrustAnchor, UserDataBinding, VerifyOptions};
use protocol::envelope::{self, FleetPublicKey, JobHeader, JobId, JobOptions, Preamble, ResultSecretKey, StreamKind};
use protocol::fleet::{encryption_context, epoch_object_key, genesis_object_key, EpochRecord};
use protocol::manifest::{development_publisher, manifest_hash, Manifest};
use protocol::{ohttp, online};
use protocol::receipt::SignedReceipt;
use protocol::records::{encode_input, InputRecord, OutputDecoder, OutputRecord};
use sha2::{Digest, Sha256, Sha384};
use support::{enqueue, status, wait_until, Running};

use enclave_worker::dev_model::{self, MODEL_ID};
const WAIT: Duration = Duration::from_secs(120);

fn worker_binary() -> PathBuf {
    let dir = std::env::var_os("EPHEM_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        // target/<profile>/deps/<this test> → target/<profile>
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(Path::parent).unwrap().to_path_buf()
    });
    let binary = dir.join("enclave-worker");
    assert!(
        binary.is_file(),
        "{} is missing: build it first (`cargo build -p enclave-worker`; scripts/test-rust.sh builds every binary)",
        binary.display()
    );
    binary
}

/// What `ephem-batch dev up` puts in place: keys, epoch 1, the model. Returns the fleet public key
/// and the manifest hash.
fn provision(local: &LocalCloud, worker: &Path) -> (FleetPublicKey, [u8; 32]) {
    let pcr0 = Sha384::digest(std::fs::read(worker).unwrap()).to_vec();
    let kms = local.kms();
    let fleet_key = kms.create_key(LocalKeyPolicy::fleet(pcr0.clone(), None), "fleet keys (test)").unwrap();
    kms.set_alias(FLEET_KEY_ALIAS, &fleet_key).unwrap();
    let model_key = kms.create_key(LocalKeyPolicy::model(pcr0, None), "model keys (test)").unwrap();
    kms.set_alias(MODEL_KEY_ALIAS, &model_key).unwrap();

    // Longer than the two days after which a host asks its worker for the next epoch: this test's
    // documents must keep binding epoch 1.
    let not_after_ms = cloud::now_ms() + 3 * 24 * 3_600_000;
    let pair = kms.generate_data_key_pair_without_plaintext(&fleet_key, &encryption_context(1, not_after_ms)).unwrap();
    let public = p256::PublicKey::from_public_key_der(&pair.public_key_der).unwrap();
    let point = p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&public, false);
    let fleet = FleetPublicKey::from_bytes(point.as_bytes()).unwrap();
    let record = EpochRecord {
        epoch: 1,
        not_after_ms,
        kms_key_id: pair.key_id,
        public_key: hex::encode(fleet.to_bytes()),
        wrapped_private_key: hex::encode(&pair.private_key_ciphertext_blob),
    };
    let attestations = local.attestations_store();
    attestations.put(&epoch_object_key(1), record.to_json().as_bytes(), PutCondition::CreateOnly).unwrap();
    // The host offers only epochs with a genesis (its content is the clients' to check).
    attestations.put(&genesis_object_key(1), b"{}", PutCondition::CreateOnly).unwrap();

    let files = dev_model::read_files(&dev_model::model_dir());
    let mut dek = [0u8; 32];
    getrandom::fill(&mut dek).unwrap();
    let context = [("model_id".to_owned(), MODEL_ID.to_owned()), ("version".to_owned(), "1".to_owned())].into_iter().collect();
    let wrapped_dek = kms.encrypt(&model_key, &dek, &context).unwrap();
    let manifest = dev_model::manifest(1, &files, &model_key, wrapped_dek, cloud::now_ms());
    let manifest_key = layout::model_manifest(MODEL_ID, 1);
    let models = local.models_store();
    for (name, sealed) in dev_model::seal(&manifest, &dek, &files) {
        models.put(&Manifest::file_object_key(&manifest_key, &name), &sealed, PutCondition::CreateOnly).unwrap();
    }
    let signed = manifest.sign(&development_publisher());
    models.put(&manifest_key, &signed, PutCondition::CreateOnly).unwrap();
    (fleet, manifest_hash(&signed))
}

struct Job {
    id: JobId,
    bytes: Vec<u8>,
    records: u64,
}

/// Seals `records` texts as a client does and uploads the input.
fn submit(local: &LocalCloud, fleet: &FleetPublicKey, client: &ResultSecretKey, manifest: [u8; 32], texts: &[String]) -> Job {
    let header = JobHeader {
        fleet_key_id: fleet.key_id(),
        epoch: 1,
        model_id: MODEL_ID.into(),
        manifest_hash: manifest,
        options: JobOptions::default(),
        result_public_key: client.public_key().to_bytes(),
        record_count: texts.len() as u64,
        created_ms: cloud::now_ms(),
    };
    let mut sealed = envelope::seal_job(&header, fleet).unwrap();
    let mut plaintext = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        encode_input(&InputRecord { id: format!("r{i}"), text: text.clone().into_bytes() }, &mut plaintext).unwrap();
    }
    let mut bytes = sealed.preamble.clone();
    sealed.sealer.push(&plaintext, &mut bytes).unwrap();
    sealed.sealer.finish(&mut bytes).unwrap();
    let id = JobId(sealed.stream_id);
    local.jobs_store().put(&layout::job_input(&id), &bytes, PutCondition::CreateOnly).unwrap();
    Job { id, bytes, records: texts.len() as u64 }
}

fn send(local: &LocalCloud, job: &Job, manifest: [u8; 32]) {
    enqueue(&*local.job_queue(), &job.id, job.bytes.len() as u64, job.records, manifest);
}

fn state(local: &LocalCloud, job: &JobId) -> Option<JobState> {
    status(&*local.jobs_store(), job).map(|s| s.state)
}

fn queue_empty(local: &LocalCloud) -> bool {
    local.job_queue().stats().map(|s| s.visible + s.in_flight + s.delayed == 0).unwrap_or(false)
}

/// `POST /v1/ohttp` over HTTP/1.1: (status, content type, body).
fn post_ohttp(relay: std::net::SocketAddr, encapsulated: &[u8]) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(relay).unwrap();
    let head = format!(
        "POST /v1/ohttp HTTP/1.1\r\nHost: relay\r\nConnection: close\r\nContent-Type: message/ohttp-req\r\nContent-Length: {}\r\n\r\n",
        encapsulated.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(encapsulated).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let media_type = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    (status, media_type, raw[split + 4..].to_vec())
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("Document {i}: confidential embedding of sealed records inside an enclave, line {i}.")).collect()
}

#[test]
fn the_poller_runs_sealed_jobs_through_the_real_worker() {
    let home = tempfile::tempdir().unwrap();
    let local = LocalCloud::open(home.path()).unwrap();
    let binary = worker_binary();
    let (fleet, manifest) = provision(&local, &binary);

    let mut spawn = SpawnConfig::local(home.path(), &home.path().join("run"), binary);
    spawn.threads = 2;
    spawn.log_file = Some(home.path().join("logs").join("enclave-worker.log"));
    spawn.serve_local_kms(home.path(), local.services().kms).unwrap();
    let mut config = PollerConfig::new(WorkerSource::Spawn(spawn));
    config.host_id = "test-host".into();
    config.poll_wait = Duration::from_millis(200);
    config.retry_base = Duration::from_millis(300);
    config.retry_max = Duration::from_secs(2);
    config.visibility = Duration::from_secs(10);
    config.pid_file = Some(home.path().join("run").join("host-poller.pid"));
    let relay_address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    config.online = Some(host_poller::OnlineSettings::new(relay_address));
    let started = Instant::now();
    let poller = Running::start(local.services(), config);
    let client = ResultSecretKey::generate();

    // 1. A job completes: output under attempt 1, receipt committed, ledger told, message gone.
    let job = submit(&local, &fleet, &client, manifest, &texts(3));
    send(&local, &job, manifest);
    wait_until("the first job to complete", WAIT, || state(&local, &job.id) == Some(JobState::Completed));
    eprintln!("first job done {:?} after start (worker boot, key release, model load included)", started.elapsed());
    wait_until("the message to be deleted", WAIT, || queue_empty(&local));
    assert!(home.path().join("run/host-poller.pid").is_file() && home.path().join("run/enclave-worker.pid").is_file());

    let jobs = local.jobs_store();
    let output = jobs.get(&layout::job_output(&job.id, 1)).unwrap();
    let receipt_bytes = jobs.get(&layout::job_receipt(&job.id)).unwrap();
    let status1 = status(&*jobs, &job.id).unwrap();
    assert_eq!((status1.attempt, status1.records_ok, status1.records_failed), (Some(1), Some(3), Some(0)));

    // The receipt verifies with the receipt key the published document binds, and names the
    // exact bytes that went in and came out.
    let current = local.attestations_store().get(&layout::attestation_current("test-host")).unwrap();
    let root = TrustAnchor::from_pem(&std::fs::read_to_string(local.dev_root_pem_path()).unwrap()).unwrap();
    let verified = attestation::verify(&current, &VerifyOptions::new(root, cloud::now_ms())).unwrap();
    let binding = UserDataBinding::decode(verified.document.user_data.as_deref().unwrap()).unwrap();
    let signed = SignedReceipt::decode(&receipt_bytes).unwrap();
    let receipt = signed.verify(&VerifyingKey::from_bytes(&binding.receipt_public_key).unwrap()).unwrap();
    assert_eq!(receipt.input_sha256, <[u8; 32]>::from(Sha256::digest(&job.bytes)));
    assert_eq!(receipt.output_sha256, <[u8; 32]>::from(Sha256::digest(&output)));
    assert_eq!(receipt.attestation_sha256, <[u8; 32]>::from(Sha256::digest(&current)));

    // The client opens the output.
    let (preamble, used) = Preamble::parse_complete(&output, StreamKind::JobResult).unwrap();
    let mut opened = envelope::open_result(&preamble, &client, Some(job.id)).unwrap();
    let mut plain = Vec::new();
    opened.opener.push(&output[used..], &mut plain).unwrap();
    opened.opener.finish(&mut plain).unwrap();
    let mut decoder = OutputDecoder::new();
    decoder.push(&plain);
    let mut batch_vectors = Vec::new();
    while let Some(record) = decoder.next_record().unwrap() {
        let OutputRecord::Embedding { vector, .. } = record else { panic!("{record:?}") };
        batch_vectors.push(vector.to_f32());
    }
    assert_eq!(batch_vectors.len(), 3);

    // The same texts online, through the Oblivious HTTP relay: the same vectors; the same
    // encapsulated request again is refused as a replay, by name.
    let key_config = ohttp::KeyConfig::for_epoch(1, fleet.clone());
    let body = serde_json::json!({"input": texts(3), "model": MODEL_ID}).to_string();
    let request = online::encode_request("POST", online::EMBEDDINGS_PATH, body.as_bytes(), cloud::now_ms(), Some(online::ClientSecret([3; 32])));
    let (encapsulated, opener) = ohttp::encapsulate_request(&key_config, &request).unwrap();
    let (http_status, media_type, answer) = post_ohttp(relay_address, &encapsulated);
    assert_eq!((http_status, media_type.as_str()), (200, "message/ohttp-res"));
    let (api_status, answer) = online::decode_response(&opener.open(&answer).unwrap()).unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(api_status, 200, "{answer}");
    let data = answer["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (item, batch) in data.iter().zip(&batch_vectors) {
        let online: Vec<f32> = item["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let cosine: f32 = online.iter().zip(batch).map(|(a, b)| a * b).sum();
        assert!(cosine > 0.9999, "online and batch differ: cosine {cosine}");
    }
    let (http_status, media_type, problem) = post_ohttp(relay_address, &encapsulated);
    assert_eq!((http_status, media_type.as_str()), (400, "application/problem+json"));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&problem).unwrap()["check"], "replay");

    // The ledger queue holds the receipt and the document it names.
    let ledger = local.ledger_queue().receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap();
    assert_eq!(ledger.len(), 1);
    let message: LedgerMessage = serde_json::from_str(&ledger[0].body).unwrap();
    assert_eq!(message.job_id, job.id);

    // A client's nonce comes back in a fresh document from the same enclave.
    let nonce = b"a client's nonce".to_vec();
    let request = format!(r#"{{"nonce":"{}","requested_ms":{}}}"#, hex::encode(&nonce), cloud::now_ms());
    let attestations = local.attestations_store();
    attestations.put(&layout::attestation_request(&nonce), request.as_bytes(), PutCondition::CreateOnly).unwrap();
    wait_until("a fresh document", WAIT, || attestations.head(&layout::attestation_fresh(&nonce)).unwrap().is_some());
    let fresh = attestations.get(&layout::attestation_fresh(&nonce)).unwrap();
    let root = TrustAnchor::from_pem(&std::fs::read_to_string(local.dev_root_pem_path()).unwrap()).unwrap();
    let mut options = VerifyOptions::new(root, cloud::now_ms());
    options.expected_nonce = Some(nonce);
    let fresh = attestation::verify(&fresh, &options).unwrap();
    assert_eq!(fresh.document.user_data, verified.document.user_data, "same keys as the published document");

    // 2. A duplicate delivery ends without a new attempt.
    send(&local, &job, manifest);
    wait_until("the duplicate to be deleted", WAIT, || queue_empty(&local));
    assert_eq!(jobs.list(&layout::job_attempts_prefix(&job.id)).unwrap().len(), 1, "no second attempt");
    assert_eq!(jobs.get(&layout::job_receipt(&job.id)).unwrap(), receipt_bytes);

    // 3. A tampered input fails by name, for good.
    let mut tampered = submit(&local, &fleet, &client, manifest, &texts(2));
    let at = tampered.bytes.len() - 20;
    tampered.bytes[at] ^= 1;
    jobs.put(&layout::job_input(&tampered.id), &tampered.bytes, PutCondition::Overwrite).unwrap();
    send(&local, &tampered, manifest);
    wait_until("the tampered job to fail", WAIT, || state(&local, &tampered.id) == Some(JobState::Failed));
    let failure = status(&*jobs, &tampered.id).unwrap().failure.unwrap();
    assert_eq!(failure.check, "stream", "{failure:?}");
    wait_until("its message to be deleted", WAIT, || queue_empty(&local));
    assert!(jobs.head(&layout::job_receipt(&tampered.id)).unwrap().is_none());

    // 4. The worker is killed mid-job: the supervisor restarts it, control sets it up again, and
    // the redelivered message completes under a later attempt.
    let long = submit(&local, &fleet, &client, manifest, &texts(300));
    send(&local, &long, manifest);
    wait_until("the long job to start", WAIT, || state(&local, &long.id) == Some(JobState::InProgress));
    let pid = std::fs::read_to_string(home.path().join("run/enclave-worker.pid")).unwrap();
    let killed = std::process::Command::new("kill").arg("-KILL").arg(pid.trim()).status().unwrap();
    assert!(killed.success());
    wait_until("the long job to complete", WAIT, || state(&local, &long.id) == Some(JobState::Completed));
    let status4 = status(&*jobs, &long.id).unwrap();
    assert!(status4.attempt.unwrap() >= 2, "{status4:?}");
    assert_eq!(status4.records_ok, Some(300));
    let new_pid = std::fs::read_to_string(home.path().join("run/enclave-worker.pid")).unwrap();
    assert_ne!(new_pid, pid, "a new worker process");
    let committed = SignedReceipt::decode(&jobs.get(&layout::job_receipt(&long.id)).unwrap()).unwrap();
    assert_eq!(committed.receipt.attempt, status4.attempt.unwrap());
    wait_until("its message to be deleted", WAIT, || queue_empty(&local));

    let stopping = poller.stop();
    eprintln!("stopped in {stopping:?}; whole test {:?}", started.elapsed());
    assert!(!home.path().join("run/host-poller.pid").exists() && !home.path().join("run/enclave-worker.pid").exists());
}
