//! A scripted worker on a Unix socket: it speaks the real frames, but "releases keys" by
//! asking the host for an object and a KMS call, "embeds" by echoing the input bit-flipped, and
//! signs a real receipt with a fixed key. Each test sets how jobs end.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use protocol::envelope::JobOptions;
use protocol::FailedCheck;
use protocol::frame::{read_frame, write_frame, Channel, Message, Role};
use protocol::receipt::Receipt;
use sha2::{Digest, Sha256};

pub const MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobMode {
    /// Output = input with every bit flipped, then a receipt.
    Echo,
    /// Like `Echo`, but waits this long before the receipt.
    Slow(Duration),
    /// `JobFailed{check}` after the first input frame, then drains the input.
    Fail(FailedCheck),
    /// Reads the input and never answers.
    Hang,
    /// Closes the connection after the first input frame.
    Die,
}

pub struct FakeState {
    pub mode: JobMode,
    pub job_starts: Vec<(String, u64)>,
    pub epochs: Vec<u64>,
    pub models: Vec<String>,
    /// Every object the worker asked for: key → what came back.
    pub fetched: Vec<(String, Result<Vec<u8>, String>)>,
    pub kms_answers: Vec<Message>,
    /// The document published for the newest epoch (receipts name it).
    pub document: Vec<u8>,
    /// Control connections the host opened.
    pub control_connections: u32,
    /// Usage receipts the next `CollectUsage` hands over (real ones, signed by [`receipt_key`]).
    pub usage_to_hand_over: u64,
    /// Usage receipts handed over so far (the next one's sequence number).
    pub usage_issued: u64,
    /// The `flush` of every `CollectUsage` received.
    pub usage_collections: Vec<bool>,
}

pub struct FakeWorker {
    pub socket: PathBuf,
    pub state: Arc<Mutex<FakeState>>,
    _dir: tempfile::TempDir,
}

pub fn receipt_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

impl FakeWorker {
    pub fn start(mode: JobMode) -> FakeWorker {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let state = Arc::new(Mutex::new(FakeState {
            mode,
            job_starts: Vec::new(),
            epochs: Vec::new(),
            models: Vec::new(),
            fetched: Vec::new(),
            kms_answers: Vec::new(),
            document: Vec::new(),
            control_connections: 0,
            usage_to_hand_over: 0,
            usage_issued: 0,
            usage_collections: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                let Ok(connection) = connection else { return };
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(connection, &state));
            }
        });
        FakeWorker { socket, state, _dir: dir }
    }

    pub fn set_mode(&self, mode: JobMode) {
        self.state.lock().unwrap().mode = mode;
    }

    pub fn job_starts(&self) -> Vec<(String, u64)> {
        self.state.lock().unwrap().job_starts.clone()
    }
}

fn serve(mut connection: UnixStream, state: &Mutex<FakeState>) {
    let Ok(Some(Message::Hello { role: Role::Host, channel })) = read_frame(&mut connection) else { return };
    send(&mut connection, &Message::Hello { role: Role::Enclave, channel });
    match channel {
        Channel::Control => {
            state.lock().unwrap().control_connections += 1;
            control(connection, state)
        }
        Channel::Job => job(connection, state),
        Channel::Online => {}
    }
}

fn send(connection: &mut UnixStream, message: &Message) {
    let _ = write_frame(connection, message);
    let _ = connection.flush();
}

fn fetch(connection: &mut UnixStream, request: u64, key: &str) -> Result<Vec<u8>, String> {
    send(connection, &Message::FetchObject { request, key: key.into() });
    let mut bytes = Vec::new();
    loop {
        match read_frame(connection) {
            Ok(Some(Message::ObjectData { request: r, data, last })) if r == request => {
                bytes.extend(data);
                if last {
                    return Ok(bytes);
                }
            }
            Ok(Some(Message::ObjectMissing { request: r, message })) if r == request => return Err(message),
            other => panic!("fake worker: expected object data, got {other:?}"),
        }
    }
}

fn control(mut connection: UnixStream, state: &Mutex<FakeState>) {
    let mut request = 0;
    while let Ok(Some(message)) = read_frame(&mut connection) {
        request += 1;
        match message {
            Message::UseFleetEpoch { epoch, object_key } => {
                let record = fetch(&mut connection, request, &object_key);
                state.lock().unwrap().fetched.push((object_key, record.clone()));
                if let Err(message) = record {
                    send(&mut connection, &Message::Error { message: format!("object: {message}") });
                    continue;
                }
                // The real worker now calls KMS itself over TLS with these credentials; this
                // fake treats epoch 99 as one KMS refuses.
                send(&mut connection, &Message::KmsCredentialsRequest { request: request + 1000 });
                let answer = read_frame(&mut connection).unwrap().unwrap();
                let credentials = matches!(answer, Message::KmsCredentials { .. });
                state.lock().unwrap().kms_answers.push(answer);
                if !credentials || epoch == 99 {
                    send(&mut connection, &Message::Error { message: "kms_failed: AccessDeniedException: policy says no".into() });
                    continue;
                }
                let document = format!("document for epoch {epoch}").into_bytes();
                send(&mut connection, &Message::PublishAttestation { document: document.clone() });
                // Usage receipts come unasked: inside a request, and on the idle connection.
                let usage = || Message::UsageReceipt { receipt: b"usage receipt".to_vec(), attestation_document: document.clone() };
                send(&mut connection, &usage());
                let mut s = state.lock().unwrap();
                s.document = document.clone();
                s.epochs.push(epoch);
                send(&mut connection, &status(&s));
                send(&mut connection, &usage());
            }
            Message::LoadModel { manifest_key } | Message::LoadModelIfFits { manifest_key } => {
                let manifest = fetch(&mut connection, request, &manifest_key);
                // A worker that asks for a job object gets nothing on the control channel.
                let secret = fetch(&mut connection, request + 500, "jobs/0123/input.sealed");
                let mut s = state.lock().unwrap();
                s.fetched.push((manifest_key.clone(), manifest));
                s.fetched.push(("jobs/0123/input.sealed".into(), secret));
                s.models.push(manifest_key);
                send(&mut connection, &status(&s));
                // The last request of a pass: this receipt waits on the idle connection.
                send(&mut connection, &Message::UsageReceipt { receipt: b"usage receipt".to_vec(), attestation_document: s.document.clone() });
            }
            Message::CollectUsage { flush } => {
                let mut s = state.lock().unwrap();
                s.usage_collections.push(flush);
                while s.usage_to_hand_over > 0 {
                    s.usage_to_hand_over -= 1;
                    let receipt = usage_receipt(s.usage_issued, &s.document);
                    s.usage_issued += 1;
                    send(&mut connection, &Message::UsageReceipt { receipt, attestation_document: s.document.clone() });
                }
                send(&mut connection, &status(&s));
            }
            Message::Attest { request, nonce } => {
                let mut document = b"fresh:".to_vec();
                document.extend(&nonce);
                send(&mut connection, &Message::Attested { request, document });
                send(&mut connection, &status(&state.lock().unwrap()));
            }
            Message::CreateFleetEpoch { .. } => {
                send(&mut connection, &Message::Error { message: "fleet_key_checks: the fake worker creates no epochs".into() });
            }
            other => panic!("fake worker: unexpected control message {other:?}"),
        }
    }
}

/// A usage receipt as the real worker signs them (the host reads only its id).
pub fn usage_receipt(sequence: u64, document: &[u8]) -> Vec<u8> {
    protocol::usage::UsageReceipt {
        client: protocol::online::ClientLabel([0x55; 32]),
        model_id: MODEL_ID.into(),
        manifest_hash: [0x33; 32],
        precision: protocol::envelope::Precision::Fp32,
        period_start_ms: 60_000 * (sequence + 1),
        period_end_ms: 60_000 * (sequence + 2),
        requests: 2,
        inputs: 3,
        tokens: 40,
        commitment: [0x66; 32],
        sequence,
        attestation_sha256: Sha256::digest(document).into(),
        pcrs: BTreeMap::from([(0u8, vec![0xa1; 48])]),
        fleet_key_id: [0x22; 32],
        epoch: 1,
    }
    .sign(&receipt_key())
}

fn status(state: &FakeState) -> Message {
    Message::Status {
        ready: !state.epochs.is_empty() && !state.models.is_empty(),
        epochs: state.epochs.clone(),
        models: state.models.clone(),
        detail: "ok".into(),
    }
}

fn job(mut connection: UnixStream, state: &Mutex<FakeState>) {
    let Ok(Some(Message::JobStart { job_id, attempt })) = read_frame(&mut connection) else { return };
    let mode = {
        let mut s = state.lock().unwrap();
        s.job_starts.push((job_id.to_hex(), attempt));
        s.mode.clone()
    };
    let mut input = Sha256::new();
    let mut output = Sha256::new();
    let mut frames = 0u64;
    loop {
        match read_frame(&mut connection) {
            Ok(Some(Message::Input { data })) => {
                frames += 1;
                input.update(&data);
                match &mode {
                    JobMode::Die => return,
                    JobMode::Fail(check) if frames == 1 => {
                        send(&mut connection, &Message::JobFailed { check: *check, message: "scripted".into() });
                    }
                    JobMode::Fail(_) | JobMode::Hang => {}
                    JobMode::Echo | JobMode::Slow(_) => {
                        let flipped: Vec<u8> = data.iter().map(|b| !b).collect();
                        output.update(&flipped);
                        send(&mut connection, &Message::Output { data: flipped });
                        send(&mut connection, &Message::Progress { records: frames, tokens: frames * 10 });
                    }
                }
            }
            Ok(Some(Message::InputEnd)) => break,
            _ => return,
        }
    }
    match mode {
        JobMode::Fail(_) | JobMode::Die => return,
        JobMode::Hang => {
            let _ = read_frame(&mut connection);
            return;
        }
        JobMode::Slow(delay) => std::thread::sleep(delay),
        JobMode::Echo => {}
    }
    let document = state.lock().unwrap().document.clone();
    let receipt = Receipt {
        job_id,
        input_sha256: input.finalize().into(),
        output_sha256: output.finalize().into(),
        records_ok: 2,
        records_failed: 1,
        tokens: 30,
        model_id: MODEL_ID.into(),
        manifest_hash: [1; 32],
        options: JobOptions::default(),
        result_key_id: [2; 32],
        attempt,
        attestation_sha256: Sha256::digest(&document).into(),
        pcrs: BTreeMap::new(),
        fleet_key_id: [3; 32],
        epoch: 1,
        started_ms: 1,
        finished_ms: 2,
        commitment: [4; 32],
        records_root: None,
        compute: None,
    };
    send(&mut connection, &Message::JobDone { receipt: receipt.sign(&receipt_key()) });
}
