//! The worker as its own process on a local socket, with the development NSM. The test plays the
//! host: it serves objects and credentials, runs a KMS endpoint (HTTPS, the KMS JSON API, a
//! development TLS root the worker pins) that answers the way KMS does (verifying the attestation
//! document and sealing a real CMS envelope to the one-shot key it carries), then sends sealed
//! jobs as a client would and checks the sealed results and the receipt. A host that answers KMS
//! calls itself is refused by the worker's TLS check.
//!
//! Here, not in the enclave crate: the host it plays reaches the ports and the local adapters
//! (`cloud`, `cloud-local`), which the trusted crate's tree never does (`scripts/deny.sh`).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloud::kms::{DataKey, DataKeyPair, Decrypted, EncryptionContext};
use cloud_local::KmsEndpoint;
use cloud::{AwsCredentials, Kms, KmsError, Recipient};

use ed25519_dalek::VerifyingKey;
use p256::pkcs8::EncodePrivateKey;
use protocol::attestation::{self, TrustAnchor, UserDataBinding, VerifyOptions};
use protocol::envelope::{
    self, FleetSecretKey, JobHeader, JobId, JobOptions, Precision, Preamble, ResultSecretKey, StreamKind,
};
use protocol::fleet::{epoch_object_key, EpochRecord};
use protocol::frame::{read_frame, write_frame, Channel, Message, Role, MAX_DATA_LEN};
use protocol::manifest::{development_publisher, manifest_hash, Manifest};
use protocol::receipt::{PlaintextCommitment, SignedReceipt};
use protocol::records::{encode_input, ErrorCode, InputRecord, OutputDecoder, OutputRecord};
use sha2::{Digest, Sha256};

use enclave_worker::dev_model::{self, MODEL_ID};
const MANIFEST_KEY: &str = "models/all-MiniLM-L6-v2/v1/manifest.cose";

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The one key of [`TestKms`], as it names itself in answers.
const TEST_KEY_ARN: &str = "arn:aws:kms:local:000000000000:key/test-key";

/// The plaintexts "KMS" releases for each blob, under their encryption context.
type Released = BTreeMap<Vec<u8>, (BTreeMap<String, String>, Vec<u8>)>;

/// KMS as far as an enclave uses it: `Decrypt` with `Recipient`, checked the way KMS checks it
/// (the context must match, the document must verify) and answered with a CMS envelope to the
/// document's key. Served over HTTPS by [`KmsEndpoint`].
struct TestKms {
    released: Mutex<Released>,
    state_dir: PathBuf,
    /// `Decrypt` calls received.
    calls: AtomicU32,
    /// The next this many calls fail as KMS fails when it is down (`KMSInternalException`).
    outage: AtomicU32,
}

fn dev_root(state_dir: &Path) -> TrustAnchor {
    let pem = std::fs::read_to_string(state_dir.join("dev-root.pem")).expect("dev-root.pem in the state dir");
    TrustAnchor::from_pem(&pem).expect("development root")
}

impl Kms for TestKms {
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        Ok(local_access())
    }
    fn encrypt(&self, _: &str, _: &[u8], _: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        Err(KmsError::Validation("not served".into()))
    }
    fn generate_data_key(&self, _: &str, _: &EncryptionContext, _: Option<&Recipient>) -> Result<DataKey, KmsError> {
        Err(KmsError::Validation("not served".into()))
    }
    fn generate_data_key_pair_without_plaintext(&self, _: &str, _: &EncryptionContext) -> Result<DataKeyPair, KmsError> {
        Err(KmsError::Validation("not served".into()))
    }
    fn decrypt(
        &self,
        _: Option<&str>,
        blob: &[u8],
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.outage.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(KmsError::Unavailable("injected outage".into()));
        }
        let released = self.released.lock().unwrap();
        let (expected_context, plaintext) =
            released.get(blob).ok_or_else(|| KmsError::InvalidCiphertext("unknown ciphertext".into()))?;
        if expected_context != context {
            return Err(KmsError::InvalidCiphertext("encryption context mismatch".into()));
        }
        let document = &recipient.ok_or_else(|| KmsError::Validation("no recipient".into()))?.attestation_document;
        let verified = attestation::verify(document, &VerifyOptions::new(dev_root(&self.state_dir), now_ms()))
            .map_err(|e| KmsError::AccessDenied(e.to_string()))?;
        let public_key = verified.document.public_key.as_deref().ok_or_else(|| KmsError::Validation("no public_key".into()))?;
        let mut rng = rsa::rand_core::UnwrapErr(getrandom::SysRng);
        let envelope = protocol::cms::seal(public_key, plaintext, &mut rng).unwrap();
        Ok(Decrypted { key_id: TEST_KEY_ARN.into(), plaintext: None, ciphertext_for_recipient: Some(envelope) })
    }
}

fn local_access() -> AwsCredentials {
    AwsCredentials {
        region: "local".into(),
        access_key_id: "local".into(),
        secret_access_key: zeroize::Zeroizing::new("local".into()),
        session_token: None,
    }
}

/// What the host side holds: objects, the KMS it runs, the credentials it hands out, and the
/// documents the worker published.
struct Host {
    objects: BTreeMap<String, Vec<u8>>,
    kms: Arc<TestKms>,
    access: AwsCredentials,
    state_dir: PathBuf,
    published: Vec<Vec<u8>>,
}

impl Host {
    fn new(dir: &Path) -> Host {
        let state_dir = dir.join("state");
        Host {
            objects: BTreeMap::new(),
            kms: Arc::new(TestKms {
                released: Mutex::new(BTreeMap::new()),
                state_dir: state_dir.clone(),
                calls: AtomicU32::new(0),
                outage: AtomicU32::new(0),
            }),
            access: local_access(),
            state_dir,
            published: Vec::new(),
        }
    }

    fn dev_root(&self) -> TrustAnchor {
        dev_root(&self.state_dir)
    }

    /// Serves this host's KMS over HTTPS on `socket`, with the TLS identity under `dir`; returns
    /// its root (PEM file).
    fn serve_kms(&self, dir: &Path, socket: &Path) -> PathBuf {
        let endpoint = KmsEndpoint::open(dir, self.kms.clone()).unwrap();
        let root = endpoint.root_pem().to_path_buf();
        endpoint.serve_unix(socket).unwrap();
        root
    }

    /// Answers the worker's requests until it reports a status or an error.
    fn serve(&mut self, connection: &mut UnixStream) -> Message {
        loop {
            let message = read_frame(connection).unwrap().expect("worker closed the control connection");
            let answer = match message {
                Message::FetchObject { request, key } => match self.objects.get(&key) {
                    Some(bytes) => {
                        let mut chunks: Vec<&[u8]> = bytes.chunks(MAX_DATA_LEN).collect();
                        if chunks.is_empty() {
                            chunks.push(&[]);
                        }
                        let count = chunks.len();
                        for (i, chunk) in chunks.into_iter().enumerate() {
                            let data = Message::ObjectData { request, data: chunk.to_vec(), last: i + 1 == count };
                            write_frame(connection, &data).unwrap();
                        }
                        connection.flush().unwrap();
                        continue;
                    }
                    None => Message::ObjectMissing { request, message: "no such object".into() },
                },
                Message::KmsCredentialsRequest { request } => Message::KmsCredentials {
                    request,
                    region: self.access.region.clone(),
                    access_key_id: self.access.access_key_id.clone(),
                    secret_access_key: self.access.secret_access_key.to_string(),
                    session_token: None,
                },
                Message::PublishAttestation { document } => {
                    self.published.push(document);
                    continue;
                }
                done @ (Message::Status { .. } | Message::Error { .. } | Message::Attested { .. }) => return done,
                other => panic!("unexpected message from the worker: {other:?}"),
            };
            write_frame(connection, &answer).unwrap();
            connection.flush().unwrap();
        }
    }
}

struct WorkerProcess {
    child: Child,
    socket: PathBuf,
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the worker; it reaches KMS through `kms_relay` and trusts `kms_root` there.
fn spawn_worker(dir: &Path, kms_relay: &Path, kms_root: &Path) -> WorkerProcess {
    let socket = dir.join("worker.sock");
    let child = Command::new(worker_bin())
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--kms-relay")
        .arg(format!("unix:{}", kms_relay.display()))
        .arg("--kms-tls-root")
        .arg(kms_root)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--threads")
        .arg("2")
        .spawn()
        .expect("start enclave-worker");
    let started = Instant::now();
    while UnixStream::connect(&socket).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "worker did not listen within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    WorkerProcess { child, socket }
}

fn connect(socket: &Path, channel: Channel) -> UnixStream {
    let mut connection = UnixStream::connect(socket).unwrap();
    write_frame(&mut connection, &Message::Hello { role: Role::Host, channel }).unwrap();
    connection.flush().unwrap();
    assert_eq!(read_frame(&mut connection).unwrap(), Some(Message::Hello { role: Role::Enclave, channel }));
    connection
}

/// Encrypts the model directory and signs its manifest with the development publisher.
fn publish_model(host: &mut Host) -> [u8; 32] {
    let files = dev_model::read_files(&dev_model::model_dir());
    let mut dek = [0u8; 32];
    getrandom::fill(&mut dek).unwrap();
    let wrapped = b"wrapped model dek".to_vec();
    let manifest = dev_model::manifest(1, &files, "local:model", wrapped.clone(), now_ms());
    for (name, sealed) in dev_model::seal(&manifest, &dek, &files) {
        host.objects.insert(Manifest::file_object_key(MANIFEST_KEY, &name), sealed);
    }
    let signed = manifest.sign(&development_publisher());
    host.objects.insert(MANIFEST_KEY.into(), signed.clone());
    let context = [("model_id".to_owned(), MODEL_ID.to_owned()), ("version".to_owned(), "1".to_owned())].into_iter().collect();
    host.kms.released.lock().unwrap().insert(wrapped, (context, dek.to_vec()));
    manifest_hash(&signed)
}

fn publish_epoch(host: &mut Host, epoch: u64, fleet: &FleetSecretKey, not_after_ms: u64) {
    let der = p256::SecretKey::from_slice(&fleet.to_scalar_bytes()).unwrap().to_pkcs8_der().unwrap();
    let blob = format!("wrapped fleet key {epoch}").into_bytes();
    let record = EpochRecord {
        epoch,
        not_after_ms,
        kms_key_id: TEST_KEY_ARN.into(),
        public_key: hex::encode(fleet.public_key().to_bytes()),
        wrapped_private_key: hex::encode(&blob),
    };
    host.kms.released.lock().unwrap().insert(blob, (record.encryption_context(), der.as_bytes().to_vec()));
    host.objects.insert(epoch_object_key(epoch), record.to_json().into_bytes());
}

struct SealedJob {
    job_id: JobId,
    bytes: Vec<u8>,
    plaintext: Vec<u8>,
    commitment_key: zeroize::Zeroizing<[u8; 32]>,
}

/// One input record, encoded by hand so that a test can send what an honest client would refuse
/// to (a text over the size limit).
fn raw_record(id: &str, text: &[u8], out: &mut Vec<u8>) {
    out.push(0x01);
    out.extend_from_slice(&(id.len() as u16).to_be_bytes());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(text);
}

fn seal_job(fleet: &FleetSecretKey, client: &ResultSecretKey, manifest: [u8; 32], records: &[(&str, &[u8])]) -> SealedJob {
    seal_job_with(fleet, client, manifest, records, JobOptions::default())
}

fn seal_job_with(
    fleet: &FleetSecretKey,
    client: &ResultSecretKey,
    manifest: [u8; 32],
    records: &[(&str, &[u8])],
    options: JobOptions,
) -> SealedJob {
    seal_job_announcing(fleet, client, manifest, records, options, records.len() as u64)
}

/// [`seal_job_with`] under a header whose record count is `announced`, whatever `records` holds.
fn seal_job_announcing(
    fleet: &FleetSecretKey,
    client: &ResultSecretKey,
    manifest: [u8; 32],
    records: &[(&str, &[u8])],
    options: JobOptions,
    announced: u64,
) -> SealedJob {
    let header = JobHeader {
        fleet_key_id: fleet.public_key().key_id(),
        epoch: 1,
        model_id: MODEL_ID.into(),
        manifest_hash: manifest,
        options,
        result_public_key: client.public_key().to_bytes(),
        record_count: announced,
        created_ms: now_ms(),
    };
    let mut sealed = envelope::seal_job(&header, &fleet.public_key()).unwrap();
    let mut plaintext = Vec::new();
    for (id, text) in records {
        if text.len() <= protocol::records::MAX_TEXT_LEN {
            encode_input(&InputRecord { id: (*id).into(), text: text.to_vec() }, &mut plaintext).unwrap();
        } else {
            raw_record(id, text, &mut plaintext);
        }
    }
    let mut bytes = sealed.preamble.clone();
    sealed.sealer.push(&plaintext, &mut bytes).unwrap();
    sealed.sealer.finish(&mut bytes).unwrap();
    SealedJob { job_id: JobId(sealed.stream_id), bytes, plaintext, commitment_key: sealed.commitment_key }
}

/// Opens a sealed result stream: its plaintext and its records (`count` of them).
fn open_output(client: &ResultSecretKey, job_id: JobId, output: &[u8], count: usize) -> (Vec<u8>, Vec<OutputRecord>) {
    let (preamble, used) = Preamble::parse_complete(output, StreamKind::JobResult).unwrap();
    let mut opened = envelope::open_result(&preamble, client, Some(job_id)).unwrap();
    let mut plain = Vec::new();
    opened.opener.push(&output[used..], &mut plain).unwrap();
    opened.opener.finish(&mut plain).unwrap();
    let mut decoder = OutputDecoder::new();
    decoder.push(&plain);
    let mut outputs = Vec::new();
    while let Some(record) = decoder.next_record().unwrap() {
        outputs.push(record);
    }
    decoder.finish(Some(count as u64)).unwrap();
    (plain, outputs)
}

/// Sends a sealed job; returns the sealed output and the receipt, or the failure the worker named.
fn run_job(socket: &Path, claimed: JobId, sealed: &[u8]) -> Result<(Vec<u8>, Vec<u8>), (protocol::FailedCheck, String)> {
    let mut connection = connect(socket, Channel::Job);
    write_frame(&mut connection, &Message::JobStart { job_id: claimed, attempt: 1 }).unwrap();
    // The worker may refuse the job before all input is sent and close its side; the host then
    // stops writing and reads the verdict.
    let mut sent = sealed.chunks(100_000).all(|chunk| write_frame(&mut connection, &Message::Input { data: chunk.to_vec() }).is_ok());
    sent = sent && write_frame(&mut connection, &Message::InputEnd).is_ok();
    let _ = sent && connection.flush().is_ok();
    let mut output = Vec::new();
    loop {
        match read_frame(&mut connection).unwrap().expect("worker closed the job connection") {
            Message::Output { data } => output.extend_from_slice(&data),
            Message::Progress { .. } => {}
            Message::JobDone { receipt } => return Ok((output, receipt)),
            Message::JobFailed { check, message } => return Err((check, message)),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A worker process with epoch 1's fleet key released and the model loaded.
struct ReadyWorker {
    _dir: tempfile::TempDir,
    host: Host,
    worker: WorkerProcess,
    fleet: FleetSecretKey,
    manifest: [u8; 32],
}

fn ready_worker() -> ReadyWorker {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path());
    let kms_socket = dir.path().join("kms.sock");
    let kms_root = host.serve_kms(dir.path(), &kms_socket);
    let worker = spawn_worker(dir.path(), &kms_socket, &kms_root);
    let fleet = FleetSecretKey::generate();
    publish_epoch(&mut host, 1, &fleet, now_ms() + 3_600_000);
    let manifest = publish_model(&mut host);

    let mut control = connect(&worker.socket, Channel::Control);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    let status = host.serve(&mut control);
    assert!(matches!(status, Message::Status { .. }), "{status:?}");
    write_frame(&mut control, &Message::LoadModel { manifest_key: MANIFEST_KEY.into() }).unwrap();
    match host.serve(&mut control) {
        Message::Status { ready, models, .. } => assert!(ready && models == [MODEL_ID.to_owned()]),
        other => panic!("model did not load: {other:?}"),
    }
    ReadyWorker { _dir: dir, host, worker, fleet, manifest }
}

#[test]
fn worker_process_releases_keys_embeds_a_sealed_job_and_signs_its_receipt() {
    let ReadyWorker { _dir, host, worker, fleet, manifest } = ready_worker();

    // The published document verifies against the development root and binds the fleet key
    // the host stored and a receipt key the worker made.
    assert_eq!(host.published.len(), 1);
    let document = host.published[0].clone();
    let mut options = VerifyOptions::new(host.dev_root(), now_ms());
    options.require_binding = true;
    let verified = attestation::verify(&document, &options).unwrap();
    let binding = UserDataBinding::decode(verified.document.user_data.as_deref().unwrap()).unwrap();
    assert_eq!(binding.fleet_public_key.to_vec(), fleet.public_key().to_bytes());
    assert_eq!(binding.epoch, 1);
    assert!(verified.document.public_key.is_none(), "a published document carries no host-chosen public key");
    let receipt_key = VerifyingKey::from_bytes(&binding.receipt_public_key).unwrap();

    let client = ResultSecretKey::generate();
    let oversized = vec![b'x'; protocol::records::MAX_TEXT_LEN + 1];
    let records: [(&str, &[u8]); 6] = [
        ("a", b"What is the capital of France?"),
        ("b", b"   "),
        ("c", b"Confidential bulk embedding inside a Nitro enclave."),
        ("d", "Paris est la capitale de la France.".as_bytes()),
        ("e", b"caf\xe9 au lait"),
        ("f", &oversized),
    ];
    let job = seal_job(&fleet, &client, manifest, &records);
    let (output, receipt_bytes) = run_job(&worker.socket, job.job_id, &job.bytes).unwrap();
    let (plain, outputs) = open_output(&client, job.job_id, &output, records.len());
    let ids: Vec<&str> = outputs.iter().map(OutputRecord::id).collect();
    assert_eq!(ids, ["a", "b", "c", "d", "e", "f"], "results come back in input order");
    assert!(matches!(&outputs[1], OutputRecord::Error { code: ErrorCode::EmptyText, .. }));
    assert!(matches!(&outputs[4], OutputRecord::Error { code: ErrorCode::InvalidUtf8, .. }));
    assert!(matches!(&outputs[5], OutputRecord::Error { code: ErrorCode::TooLarge, .. }));
    let vector = |i: usize| match &outputs[i] {
        OutputRecord::Embedding { vector, tokens, .. } => {
            assert!(*tokens > 2);
            vector.to_f32()
        }
        other => panic!("record {i}: {other:?}"),
    };
    let first = vector(0);
    assert_eq!(first.len(), 384);
    let norm: f32 = first.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4);
    // STACK.md §5: the first five values of this text.
    for (got, want) in first.iter().zip([0.08204813f32, 0.0360555, -0.00389286, -0.0048811, 0.02565121]) {
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    }
    let dot: f32 = first.iter().zip(vector(3)).map(|(a, b)| a * b).sum();
    assert!(dot > 0.5, "the French sentence says the same thing ({dot})");

    let signed = SignedReceipt::decode(&receipt_bytes).unwrap();
    let receipt = signed.verify(&receipt_key).unwrap();
    assert_eq!(receipt.job_id, job.job_id);
    assert_eq!(receipt.input_sha256, <[u8; 32]>::from(Sha256::digest(&job.bytes)));
    assert_eq!(receipt.output_sha256, <[u8; 32]>::from(Sha256::digest(&output)));
    assert_eq!((receipt.records_ok, receipt.records_failed), (3, 3));
    assert_eq!(receipt.manifest_hash, manifest);
    assert_eq!(receipt.attestation_sha256, <[u8; 32]>::from(Sha256::digest(&document)));
    assert_eq!(receipt.pcrs.get(&0), verified.document.pcrs.get(&0));
    assert_eq!(receipt.fleet_key_id, fleet.public_key().key_id());
    assert_eq!(receipt.result_key_id, client.public_key().key_id());
    let mut commitment = PlaintextCommitment::new();
    commitment.input(&job.plaintext);
    commitment.output(&plain);
    assert_eq!(receipt.commitment, commitment.finish(&job.commitment_key), "keyed plaintext commitment");
    assert_eq!(receipt.options.precision, Precision::Fp32);

    // bf16 and int8 are the client's explicit choice: computed as asked where the CPU has AVX-512
    // BF16 / VNNI or AVX2 (close to, but not bit-equal with, fp32) and recorded in the receipt;
    // refused by name elsewhere.
    for (precision, feature, min_cosine) in [
        (Precision::Bf16, std::arch::is_x86_feature_detected!("avx512bf16"), 0.999),
        (
            Precision::Int8,
            std::arch::is_x86_feature_detected!("avx512vnni") || (std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")),
            0.99,
        ),
    ] {
        let options = JobOptions { precision, ..JobOptions::default() };
        // (Its own job: the tampering below needs a job that every CPU runs.)
        let reduced_job = seal_job_with(&fleet, &client, manifest, &records, options);
        match run_job(&worker.socket, reduced_job.job_id, &reduced_job.bytes) {
            Ok((output, receipt_bytes)) => {
                let signed = SignedReceipt::decode(&receipt_bytes).unwrap();
                let stated = signed.verify(&receipt_key).unwrap();
                assert_eq!(stated.options.precision, precision);
                let (_, reduced) = open_output(&client, reduced_job.job_id, &output, records.len());
                // How it computed: the precision's unit; an int8 job's records of at most 8
                // tokens at bf16 (fp32 where bf16 is not faster), counted (none here: tests/
                // int8_short_texts.rs runs short ones).
                let compute = stated.compute.clone().expect("a reduced-precision receipt states how it computed");
                let short = reduced.iter().filter(|r| matches!(r, OutputRecord::Embedding { tokens, .. } if *tokens <= 8)).count();
                match precision {
                    Precision::Bf16 => assert!(compute.bf16.is_some() && compute.int8.is_none() && compute.short.is_none(), "{compute:?}"),
                    _ => {
                        let stated = compute.short.expect("int8's short records");
                        assert!(compute.int8.is_some(), "{compute:?}");
                        assert_eq!((stated.max_tokens, stated.records), (8, short as u64), "{compute:?}");
                    }
                }
                for i in [0, 2, 3] {
                    let (OutputRecord::Embedding { vector: full, .. }, OutputRecord::Embedding { vector: low, .. }) =
                        (&outputs[i], &reduced[i])
                    else {
                        panic!("{precision:?} record {i}: {:?}", reduced[i]);
                    };
                    let (full, low) = (full.to_f32(), low.to_f32());
                    let cosine: f32 = full.iter().zip(&low).map(|(a, b)| a * b).sum();
                    assert!(cosine >= min_cosine && full != low, "{precision:?} record {i}: cosine {cosine}");
                }
            }
            Err((check, message)) => {
                assert!(!feature, "{precision:?} refused on a CPU that has its instructions: {message}");
                assert_eq!(check.as_str(), "options", "{message}");
            }
        }
    }

    // A tenant's own tool may seal any options: a prompt or a vector length the signed manifest
    // does not offer is refused by name, never served otherwise.
    for options in [
        JobOptions { prompt: Some("query".into()), ..JobOptions::default() },
        JobOptions { dimensions: Some(128), ..JobOptions::default() },
    ] {
        let shaped = seal_job_with(&fleet, &client, manifest, &records, options.clone());
        let (check, message) = run_job(&worker.socket, shaped.job_id, &shaped.bytes).unwrap_err();
        assert_eq!(check.as_str(), "options", "{options:?}: {message}");
    }
    // The model's own length is always offered, and recorded as asked.
    let own = seal_job_with(&fleet, &client, manifest, &records, JobOptions { dimensions: Some(384), ..JobOptions::default() });
    let (_, receipt_bytes) = run_job(&worker.socket, own.job_id, &own.bytes).unwrap();
    assert_eq!(SignedReceipt::decode(&receipt_bytes).unwrap().verify(&receipt_key).unwrap().options.dimensions, Some(384));

    // The job id is derived: presenting the job under another id is refused by name.
    let (check, _) = run_job(&worker.socket, JobId([7; 16]), &job.bytes).unwrap_err();
    assert_eq!(check.as_str(), "job_id");
    // A flipped ciphertext byte in the body fails the stream, after no plaintext left.
    let mut tampered = job.bytes.clone();
    let last = tampered.len() - 20;
    tampered[last] ^= 1;
    let (check, _) = run_job(&worker.socket, job.job_id, &tampered).unwrap_err();
    assert_eq!(check.as_str(), "stream");
    // A job for a model manifest the enclave does not run (a downgrade, say) is refused.
    let other = seal_job(&fleet, &client, [0xee; 32], &records);
    let (check, _) = run_job(&worker.socket, other.job_id, &other.bytes).unwrap_err();
    assert_eq!(check.as_str(), "model_manifest");
}

/// A tenant announces one record and sends thousands: the worker stops at the first record past
/// the announced count, naming it, instead of embedding them all and failing at the end.
#[test]
fn a_job_holding_more_records_than_announced_fails_at_the_first_extra() {
    let ReadyWorker { _dir, worker, fleet, manifest, .. } = ready_worker();
    let client = ResultSecretKey::generate();
    let ids: Vec<String> = (0..5000).map(|i| format!("r{i}")).collect();
    let records: Vec<(&str, &[u8])> = ids.iter().map(|id| (id.as_str(), b"a short text".as_slice())).collect();
    let job = seal_job_announcing(&fleet, &client, manifest, &records, JobOptions::default(), 1);
    let (check, message) = run_job(&worker.socket, job.job_id, &job.bytes).expect_err("more records than announced were embedded");
    assert_eq!(check.as_str(), "records");
    assert!(message.contains("announced 1 records and holds more"), "{message}");
}

#[test]
fn expired_epochs_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path());
    let kms_socket = dir.path().join("kms.sock");
    let kms_root = host.serve_kms(dir.path(), &kms_socket);
    let worker = spawn_worker(dir.path(), &kms_socket, &kms_root);
    let fleet = FleetSecretKey::generate();
    publish_epoch(&mut host, 1, &fleet, now_ms() - 1);
    let mut control = connect(&worker.socket, Channel::Control);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    match host.serve(&mut control) {
        Message::Error { message } => assert!(message.starts_with("fleet_epoch_expired"), "{message}"),
        other => panic!("an expired epoch was accepted: {other:?}"),
    }
    assert!(host.published.is_empty());
}

/// The forged-envelope attack: the host hands the worker a fleet key of its own (its own epoch
/// record, its own "KMS" sealing that key to the worker's one-shot key — CMS carries no MAC and
/// the one-shot key is public). Were the worker to accept, it would attest to a key the host
/// holds and clients would seal their texts to it. The worker calls KMS over TLS and pins the
/// root, so the host's KMS is refused (`kms_tls`); credentials for another region than the key's
/// are refused before connecting (`kms_region`); nothing is published.
#[test]
fn a_host_that_answers_kms_itself_gets_no_key_released() {
    let dir = tempfile::tempdir().unwrap();
    let genuine = dir.path().join("genuine");
    let forger = dir.path().join("forger");
    let mut host = Host::new(dir.path());
    let genuine_socket = dir.path().join("kms.sock");
    let pinned_root = host.serve_kms(&genuine, &genuine_socket);
    // The forger's endpoint answers for the very same blobs, with its own TLS identity.
    let forged_socket = dir.path().join("forged-kms.sock");
    let forged_root = host.serve_kms(&forger, &forged_socket);
    assert_ne!(std::fs::read(&pinned_root).unwrap(), std::fs::read(&forged_root).unwrap());
    let worker = spawn_worker(dir.path(), &forged_socket, &pinned_root);
    let host_fleet_key = FleetSecretKey::generate();
    publish_epoch(&mut host, 1, &host_fleet_key, now_ms() + 3_600_000);

    let mut control = connect(&worker.socket, Channel::Control);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    match host.serve(&mut control) {
        Message::Error { message } => assert!(message.starts_with("kms_tls"), "{message}"),
        other => panic!("a forged KMS answer was accepted: {other:?}"),
    }
    assert!(host.published.is_empty(), "no document binds a key the host chose");
    drop(worker);

    // The genuine endpoint, but the host's credentials are for another region than the key's
    // (the record names a key in `local`): refused before any connection, whatever the region
    // says — the worker talks only to the key's own KMS.
    let worker = spawn_worker(dir.path(), &genuine_socket, &pinned_root);
    let mut control = connect(&worker.socket, Channel::Control);
    for region in ["eu-west-1", "evil.example.com/"] {
        host.access.region = region.into();
        write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
        match host.serve(&mut control) {
            Message::Error { message } => assert!(message.starts_with("kms_region"), "{region}: {message}"),
            other => panic!("credentials for region {region} were used for a key in local: {other:?}"),
        }
    }
    // And with the genuine endpoint and region the same worker releases the key.
    host.access.region = "local".into();
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    assert!(matches!(host.serve(&mut control), Message::Status { .. }));
    assert_eq!(host.published.len(), 1);
}

/// KMS down: a short outage is ridden out inside the worker (bounded retries with backoff); a
/// long one ends the release with KMS's own error and the number of attempts, and publishes
/// nothing — the host asks again later.
#[test]
fn a_kms_outage_is_retried_a_bounded_number_of_times_then_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path());
    let socket = dir.path().join("kms.sock");
    let root = host.serve_kms(&dir.path().join("kms"), &socket);
    let worker = spawn_worker(dir.path(), &socket, &root);
    let mut control = connect(&worker.socket, Channel::Control);

    publish_epoch(&mut host, 1, &FleetSecretKey::generate(), now_ms() + 3_600_000);
    host.kms.outage.store(2, Ordering::SeqCst);
    let started = Instant::now();
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    assert!(matches!(host.serve(&mut control), Message::Status { .. }), "released on the third call");
    assert_eq!(host.kms.calls.load(Ordering::SeqCst), 3);
    assert!(started.elapsed() >= Duration::from_millis(150), "two backoff delays (≥ 50 + 100 ms)");
    assert_eq!(host.published.len(), 1);

    publish_epoch(&mut host, 2, &FleetSecretKey::generate(), now_ms() + 3_600_000);
    host.kms.outage.store(u32::MAX, Ordering::SeqCst);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 2, object_key: epoch_object_key(2) }).unwrap();
    match host.serve(&mut control) {
        Message::Error { message } => {
            assert!(message.starts_with("kms_failed: ") && message.contains("KMSInternalException: "), "{message}");
            assert!(message.contains("gave up after 5 attempts"), "{message}");
        }
        other => panic!("released during an outage: {other:?}"),
    }
    assert_eq!(host.kms.calls.load(Ordering::SeqCst), 3 + 5, "five calls, no more");
    assert_eq!(host.published.len(), 1, "nothing published for the epoch KMS did not release");

    // KMS back: the same worker takes the epoch up when asked again.
    host.kms.outage.store(0, Ordering::SeqCst);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 2, object_key: epoch_object_key(2) }).unwrap();
    assert!(matches!(host.serve(&mut control), Message::Status { .. }));
    assert_eq!(host.published.len(), 2);
}

/// The host-owned KMS key attack, through the real worker process and the real local KMS: the
/// host creates a key with no attestation condition (an unrestricted local key), wraps a fleet
/// private key it keeps under {epoch 999, a far not_after}, and points the worker at it. The
/// worker releases it through its own TLS session (KMS did answer) — and binds that key's ARN
/// into the document, so a client pinned to the deployment's fleet key refuses the document
/// (`fleet_kms_key`), while the deployment's own epoch verifies.
#[test]
fn a_fleet_key_wrapped_under_a_host_owned_kms_key_is_refused() {
    use cloud_local::{AttestationTrust, LocalKeyPolicy, LocalKms};
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path());
    let state_dir = dir.path().join("state");
    let trust = AttestationTrust { root_pem_path: state_dir.join("dev-root.pem"), max_document_age: Duration::from_secs(300) };
    let kms = Arc::new(LocalKms::open(dir.path().join("kms.sqlite"), trust).unwrap());
    let socket = dir.path().join("kms.sock");
    let endpoint = KmsEndpoint::open(&dir.path().join("kms-tls"), kms.clone()).unwrap();
    let root = endpoint.root_pem().to_path_buf();
    endpoint.serve_unix(&socket).unwrap();
    let worker = spawn_worker(dir.path(), &socket, &root);
    let deployment_key = kms.create_key(LocalKeyPolicy::fleet(worker_pcr0(), None), "deployment fleet key").unwrap();
    let host_key = kms.create_key(LocalKeyPolicy::unrestricted(), "the host's own key").unwrap();

    // The host's epoch: a private key it generated and keeps, wrapped with Encrypt.
    let host_fleet = FleetSecretKey::generate();
    let pkcs8 = p256::SecretKey::from_slice(&host_fleet.to_scalar_bytes()).unwrap().to_pkcs8_der().unwrap();
    let not_after_ms = now_ms() + 10 * 365 * 24 * 3_600_000;
    let context = protocol::fleet::encryption_context(999, not_after_ms);
    let record = EpochRecord {
        epoch: 999,
        not_after_ms,
        kms_key_id: host_key.clone(),
        public_key: hex::encode(host_fleet.public_key().to_bytes()),
        wrapped_private_key: hex::encode(kms.encrypt(&host_key, pkcs8.as_bytes(), &context).unwrap()),
    };
    host.objects.insert(epoch_object_key(999), record.to_json().into_bytes());
    // The deployment's epoch, made as rotation makes it.
    let genuine_not_after = now_ms() + 3_600_000;
    let pair = kms
        .generate_data_key_pair_without_plaintext(&deployment_key, &protocol::fleet::encryption_context(1, genuine_not_after))
        .unwrap();
    let genuine = EpochRecord {
        epoch: 1,
        not_after_ms: genuine_not_after,
        kms_key_id: pair.key_id.clone(),
        public_key: {
            use p256::pkcs8::DecodePublicKey;
            let public = p256::PublicKey::from_public_key_der(&pair.public_key_der).unwrap();
            hex::encode(p256::elliptic_curve::sec1::ToSec1Point::to_sec1_point(&public, false).as_bytes())
        },
        wrapped_private_key: hex::encode(&pair.private_key_ciphertext_blob),
    };
    host.objects.insert(epoch_object_key(1), genuine.to_json().into_bytes());

    let mut control = connect(&worker.socket, Channel::Control);
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 999, object_key: epoch_object_key(999) }).unwrap();
    let answer = host.serve(&mut control);
    assert!(matches!(answer, Message::Status { .. }), "real KMS does release under the host's key: {answer:?}");
    // "Now" a second on: a development leaf starts at the next whole second.
    let mut client = VerifyOptions::new(host.dev_root(), now_ms() + 1_000);
    client.expected_fleet_kms_key = Some(deployment_key.parse().unwrap());
    let error = attestation::verify(&host.published[0], &client).unwrap_err();
    assert_eq!(error.check().as_str(), "fleet_kms_key", "{error}");
    assert!(error.to_string().contains(&host_key), "{error}");

    // A second record for the held epoch changes nothing: the epoch's key is never replaced.
    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 999, object_key: epoch_object_key(1) }).unwrap();
    assert!(matches!(host.serve(&mut control), Message::Status { .. }));
    let again = attestation::AttestationDocument::parse_unverified(&host.published[1]).unwrap();
    let again = UserDataBinding::decode(again.user_data.as_deref().unwrap()).unwrap();
    assert_eq!(again.fleet_public_key.to_vec(), host_fleet.public_key().to_bytes());

    write_frame(&mut control, &Message::UseFleetEpoch { epoch: 1, object_key: epoch_object_key(1) }).unwrap();
    let answer = host.serve(&mut control);
    assert!(matches!(answer, Message::Status { .. }), "{answer:?}");
    // Verified at a "now" taken after the document was made (its leaf starts at the next second).
    client.now_ms = now_ms() + 1_000;
    let verified = attestation::verify(host.published.last().unwrap(), &client).unwrap();
    let binding = verified.binding.unwrap();
    assert_eq!((binding.epoch, binding.kms_key.as_str()), (1, deployment_key.as_str()));
    assert_eq!(binding.not_after_ms, genuine.not_after_ms);
}

/// The workspace's `enclave-worker` (`cargo build --workspace --bins`).
fn worker_bin() -> PathBuf {
    tests::bin_dir().join("enclave-worker")
}

/// The worker's PCR0 under the development NSM: SHA-384 of its binary (DESIGN.md §4).
fn worker_pcr0() -> Vec<u8> {
    sha2::Sha384::digest(std::fs::read(worker_bin()).unwrap()).to_vec()
}

mod online;
