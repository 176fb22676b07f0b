//! The seed corpora, written at run time (never committed): the real fixtures (`$EPHEM_FIXTURES`:
//! Nitro attestation documents, the KMS CMS envelope, C2SP signed notes), the project's example
//! corpus, and valid objects of every format made with the project's own code under the fixed
//! keys of [`crate::fixed`] — so each target starts from inputs that pass every check and the
//! fuzzer mutates from there.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use protocol::attestation::{DevIssuer, DocumentRequest};
use protocol::envelope::{self, JobHeader, JobOptions, OutputDtype, Precision, ResultHeader, Sealed};
use protocol::frame::{self, Channel, Message, Role};
use protocol::manifest::{self, Manifest, ModelFile, Pooling};
use protocol::receipt::Receipt;
use protocol::records::{self, ErrorCode, InputRecord, OutputRecord, Vector};
use protocol::stream::StreamSealer;
use receipts_ledger::checkpoint::Checkpoint;
use sha2::{Digest, Sha256};

use crate::fixed::{self, HashRng};

/// Every fuzz target, in the order scripts/fuzz.sh runs them.
pub const TARGETS: [&str; 10] =
    ["attestation", "envelope", "stream", "records", "frame", "receipt", "manifest", "checkpoint", "cms", "jsonl"];

/// Where the seeds come from.
pub struct Sources {
    /// The shared fixtures folder (`$EPHEM_FIXTURES`); `None`: generated seeds only.
    pub fixtures: Option<PathBuf>,
    /// The project's example corpus (`examples/corpus.jsonl`).
    pub example_corpus: Option<PathBuf>,
}

struct Writer<'a> {
    root: &'a Path,
    counts: BTreeMap<&'static str, usize>,
}

impl Writer<'_> {
    fn put(&mut self, target: &'static str, name: &str, bytes: &[u8]) -> io::Result<()> {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(format!("seed-{name}")), bytes)?;
        *self.counts.entry(target).or_default() += 1;
        Ok(())
    }
}

/// Writes every target's seeds under `root/<target>/seed-*` and returns how many each got.
pub fn write_all(root: &Path, sources: &Sources) -> io::Result<BTreeMap<&'static str, usize>> {
    let mut w = Writer { root, counts: BTreeMap::new() };
    if let Some(dir) = &sources.fixtures {
        fixture_seeds(&mut w, dir)?;
    }
    if let Some(path) = &sources.example_corpus {
        let text = fs::read_to_string(path)?;
        let lines: Vec<&str> = text.lines().take(3).collect();
        w.put("jsonl", "example-corpus-head", format!("{}\n", lines.join("\n")).as_bytes())?;
    }
    attestation_seeds(&mut w)?;
    envelope_seeds(&mut w)?;
    stream_seeds(&mut w)?;
    frame_seeds(&mut w)?;
    receipt_seeds(&mut w)?;
    manifest_seeds(&mut w)?;
    checkpoint_seeds(&mut w)?;
    cms_seeds(&mut w)?;
    jsonl_seeds(&mut w)?;
    check_valid_seeds(root)?;
    Ok(w.counts)
}

/// The generated seeds must pass every check of their target, or the fuzzer would start below
/// the code worth reaching: fail loudly if the fixed material and the project's code drift apart.
fn check_valid_seeds(root: &Path) -> io::Result<()> {
    let read = |target: &str, name: &str| fs::read(root.join(target).join(format!("seed-{name}")));
    let fail = |what: &str, e: &dyn std::fmt::Display| io::Error::other(format!("seed {what} does not verify: {e}"));
    let enclave = fixed::enclave();
    let checker = protocol::receipt_check::ReceiptVerifier::new(enclave.root.clone());
    for name in ["valid", "valid-pcr0-only"] {
        checker.verify(&read("receipt", name)?, &enclave.document).map_err(|e| fail(name, &e))?;
    }
    let signed = manifest::SignedManifest::decode(&read("manifest", "minilm")?).map_err(|e| fail("minilm", &e))?;
    signed.verify(&manifest::development_publisher().verifying_key()).map_err(|e| fail("minilm", &e))?;
    Checkpoint::open(&read("checkpoint", "signed-million")?, fixed::ledger_verifier()).map_err(|e| fail("checkpoint", &e))?;
    let job = read("envelope", "job-three")?;
    let (preamble, _) = envelope::Preamble::parse_complete(&job, envelope::StreamKind::JobInput).map_err(|e| fail("job", &e))?;
    envelope::open_job(&preamble, fixed::fleet_secret(), None).map_err(|e| fail("job", &e))?;
    protocol::cms::open(&read("cms", "data-key")?, fixed::rsa_key()).map_err(|e| fail("cms", &e))?;
    Ok(())
}

fn files_with(dir: &Path, extension: &str) -> io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    out.sort();
    Ok(out)
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn fixture_seeds(w: &mut Writer<'_>, dir: &Path) -> io::Result<()> {
    let nitro = dir.join("nitro-attestation");
    for path in files_with(&nitro, "cbor")?.into_iter().chain(files_with(&nitro.join("negative"), "cbor")?) {
        w.put("attestation", &format!("fixture-{}", stem(&path)), &fs::read(&path)?)?;
    }
    for path in files_with(&dir.join("kms-cms"), "ber")? {
        w.put("cms", &format!("fixture-{}", stem(&path)), &fs::read(&path)?)?;
    }
    let notes: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("merkle/signed_note_vectors.json"))?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    for (i, vector) in notes["vectors"].as_array().into_iter().flatten().enumerate() {
        for field in ["note", "vkey", "text"] {
            if let Some(text) = vector[field].as_str() {
                w.put("checkpoint", &format!("fixture-signed-note-{i}-{field}"), text.as_bytes())?;
            }
        }
    }
    Ok(())
}

fn attestation_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let enclave = fixed::enclave();
    w.put("attestation", "dev-enclave", &enclave.document)?;
    // Tagged form (18), which the verifier accepts as well.
    let mut tagged = vec![0xd2];
    tagged.extend_from_slice(&enclave.document);
    w.put("attestation", "dev-enclave-tagged", &tagged)?;
    // A document for a KMS call: public_key is the one-shot RSA key, a nonce, debug PCRs.
    let issuer = DevIssuer::from_seed(&fixed::seed("development CA"), fixed::DEV_CA_TIME_MS).map_err(io::Error::other)?;
    let mut request = DocumentRequest::new("i-0f0220ef0220ef022-enc0192fuzz0000001");
    request.public_key = Some(fixed::rsa_spki().to_vec());
    request.nonce = Some(vec![0x5a; 32]);
    let doc = issuer.attest(&request, fixed::DEV_DOC_TIME_MS + 1).map_err(io::Error::other)?;
    w.put("attestation", "dev-recipient", &doc)
}

fn header(record_count: u64) -> JobHeader {
    JobHeader {
        fleet_key_id: fixed::fleet_secret().public_key().key_id(),
        epoch: fixed::EPOCH,
        model_id: fixed::MODEL_ID.into(),
        manifest_hash: [0x4d; 32],
        options: JobOptions::default(),
        result_public_key: fixed::result_secret().public_key().to_bytes(),
        record_count,
        created_ms: fixed::DEV_DOC_TIME_MS,
    }
}

fn seal(sealed: Sealed, plaintext: &[u8]) -> Vec<u8> {
    let Sealed { preamble: mut out, mut sealer, .. } = sealed;
    sealer.push(plaintext, &mut out).expect("seal");
    sealer.finish(&mut out).expect("seal");
    out
}

fn input_records(records: &[InputRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        records::encode_input(record, &mut out).expect("input record");
    }
    out
}

fn output_records(records: &[OutputRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        records::encode_output(record, &mut out).expect("output record");
    }
    out
}

fn sample_inputs() -> Vec<InputRecord> {
    vec![
        InputRecord { id: "doc-1".into(), text: b"What is the capital of France?".to_vec() },
        InputRecord { id: "req-7#0".into(), text: "Gr\u{fc}\u{df}e, \u{4e16}\u{754c}".as_bytes().to_vec() },
        InputRecord { id: "17".into(), text: Vec::new() },
    ]
}

fn sample_outputs() -> Vec<OutputRecord> {
    vec![
        OutputRecord::Embedding { id: "doc-1".into(), tokens: 9, vector: Vector::F32(vec![0.082, -0.0039, 1.0, -0.0]) },
        OutputRecord::Embedding {
            id: "req-7#0".into(),
            tokens: 6,
            vector: Vector::F16([0.5f32, -2.0, 65504.0].iter().map(|v| records::f32_to_f16(*v)).collect()),
        },
        OutputRecord::Error { id: "17".into(), code: ErrorCode::EmptyText, message: "empty after normalisation".into() },
    ]
}

fn envelope_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let fleet = fixed::fleet_secret().public_key();
    let inputs = sample_inputs();
    for (name, records) in [("job-empty", &inputs[..0]), ("job-one", &inputs[..1]), ("job-three", &inputs[..])] {
        let header = header(records.len() as u64);
        let sealed = envelope::seal_job_with_ephemeral_ikm(&header, &fleet, &fixed::seed(name)).map_err(io::Error::other)?;
        w.put("envelope", name, &seal(sealed, &input_records(records)))?;
    }
    // Options other than the defaults, and a body of two STREAM chunks.
    let mut other = header(1);
    other.options = JobOptions { truncate: false, normalize: false, dtype: OutputDtype::F16, precision: Precision::Bf16, prompt: Some("query".into()), dimensions: Some(128), ranges: None, output: Default::default(), top_k: None, max_record_bytes: None };
    let long = [InputRecord { id: "long".into(), text: vec![b'a'; 70_000] }];
    let sealed = envelope::seal_job_with_ephemeral_ikm(&other, &fleet, &fixed::seed("job-long")).map_err(io::Error::other)?;
    w.put("envelope", "job-two-chunks", &seal(sealed, &input_records(&long)))?;

    let client = fixed::result_secret().public_key();
    let result = ResultHeader { job_id: envelope::JobId([0x6a; 16]), result_key_id: client.key_id(), attempt: 2, created_ms: 1 };
    let sealed =
        envelope::seal_result_with_ephemeral_ikm(&result, &client, &fixed::seed("result")).map_err(io::Error::other)?;
    w.put("envelope", "result-three", &seal(sealed, &output_records(&sample_outputs())))
}

fn stream_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    for (name, len) in [("empty", 0usize), ("short", 100), ("one-full-chunk", 65_536), ("two-chunks", 65_537)] {
        let plaintext: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut sealer = StreamSealer::new(&fixed::stream_key(), fixed::stream_id());
        let mut out = Vec::new();
        sealer.push(&plaintext, &mut out).expect("seal");
        sealer.finish(&mut out).expect("seal");
        w.put("stream", name, &out)?;
    }
    w.put("records", "inputs", &input_records(&sample_inputs()))?;
    w.put("records", "outputs", &output_records(&sample_outputs()))
}

fn frame_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let messages = vec![
        Message::Hello { role: Role::Host, channel: Channel::Control },
        Message::Hello { role: Role::Enclave, channel: Channel::Job },
        Message::KmsCredentialsRequest { request: 1 },
        Message::KmsCredentials {
            request: 1,
            region: "eu-west-1".into(),
            access_key_id: "AKIAFUZZ".into(),
            secret_access_key: "s".repeat(40),
            session_token: Some("t".repeat(64)),
        },
        Message::KmsFailed { request: 2, code: "AccessDeniedException".into(), message: "no".into() },
        Message::FetchObject { request: 3, key: "models/minilm/manifest.cose".into() },
        Message::ObjectData { request: 3, data: vec![0xab; 40], last: true },
        Message::ObjectMissing { request: 4, message: "NoSuchKey".into() },
        Message::PublishAttestation { document: vec![0x84, 0x44] },
        Message::Attest { request: 5, nonce: vec![9; 16] },
        Message::Attested { request: 5, document: vec![0x84] },
        Message::UseFleetEpoch { epoch: fixed::EPOCH, object_key: "fleet/epoch-7.json".into() },
        Message::LoadModel { manifest_key: "models/minilm/manifest.cose".into() },
        Message::Status { ready: true, epochs: vec![6, 7], models: vec![fixed::MODEL_ID.into()], detail: "ok".into() },
        Message::JobStart { job_id: protocol::JobId([0x6a; 16]), attempt: 1 },
        Message::Input { data: b"EPHB\x01\x01".to_vec() },
        Message::InputEnd,
        Message::Output { data: vec![0; 8] },
        Message::Progress { records: 3, tokens: 21 },
        Message::JobDone { receipt: vec![0xd2, 0x84] },
        Message::JobFailed { check: protocol::FailedCheck::HeaderAuthentication, message: "bad".into() },
        Message::Error { message: "protocol error".into() },
        // The model memory budget's messages (after the others: earlier seeds keep their names).
        Message::LoadModelIfFits { manifest_key: "models/minilm/manifest.cose".into() },
        Message::ModelWouldEvict { model_id: fixed::MODEL_ID.into(), bytes: 93_000_000, free: 1 << 20 },
        Message::ModelEvicted { model_id: fixed::MODEL_ID.into(), manifest_hash: vec![0x11; 32] },
        Message::ListModels,
        Message::ModelMemory {
            budget: 1 << 30,
            models: vec![protocol::frame::ResidentModel {
                model_id: fixed::MODEL_ID.into(),
                manifest_hash: vec![0x11; 32],
                version: 1,
                bytes: 93_000_000,
                last_use_ms: 1_700_000_000_000,
            }],
        },
    ];
    let mut all = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let bytes = frame::encode(message).map_err(io::Error::other)?;
        w.put("frame", &format!("message-{i:02}"), &bytes)?;
        all.extend_from_slice(&bytes);
    }
    w.put("frame", "conversation", &all)
}

fn receipt(job: u8) -> Receipt {
    let enclave = fixed::enclave();
    Receipt {
        job_id: envelope::JobId([job; 16]),
        input_sha256: Sha256::digest(b"sealed input").into(),
        output_sha256: Sha256::digest(b"sealed output").into(),
        records_ok: 3,
        records_failed: 1,
        tokens: 42,
        model_id: fixed::MODEL_ID.into(),
        manifest_hash: [0x4d; 32],
        options: JobOptions::default(),
        result_key_id: fixed::result_secret().public_key().key_id(),
        attempt: 1,
        attestation_sha256: Sha256::digest(&enclave.document).into(),
        pcrs: enclave.pcrs.iter().filter(|(i, _)| [0u8, 1, 2, 8].contains(i)).map(|(i, v)| (*i, v.clone())).collect(),
        fleet_key_id: fixed::fleet_secret().public_key().key_id(),
        epoch: fixed::EPOCH,
        started_ms: fixed::DEV_DOC_TIME_MS + 1_000,
        finished_ms: fixed::DEV_DOC_TIME_MS + 9_000,
        commitment: [0xc0; 32],
        records_root: None,
        compute: None,
    }
}

fn receipt_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let key = &fixed::enclave().receipt_key;
    w.put("receipt", "valid", &receipt(1).sign(key))?;
    let mut other = receipt(2);
    other.options = JobOptions { truncate: false, normalize: true, dtype: OutputDtype::F16, precision: Precision::Int8, ..JobOptions::default() };
    other.pcrs.retain(|i, _| *i == 0);
    other.records_failed = 0;
    w.put("receipt", "valid-pcr0-only", &other.sign(key))
}

fn manifest_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let file = |name: &str, size: u64| ModelFile { name: name.into(), sha256: Sha256::digest(name.as_bytes()).into(), size };
    let manifest = Manifest {
        model_id: fixed::MODEL_ID.into(),
        version: 3,
        files: vec![file("config.json", 612), file("model.safetensors", 90_868_376), file("tokenizer.json", 466_247)],
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: "arn:aws:kms:eu-west-1:111122223333:key/model".into(),
        wrapped_dek: vec![0x01; 184],
        created_ms: fixed::DEV_DOC_TIME_MS,
    };
    let publisher = manifest::development_publisher();
    w.put("manifest", "minilm", &manifest.sign(&publisher))?;
    let small = Manifest { files: vec![file("weights.bin", 1)], pooling: Pooling::Cls, normalize: false, ..manifest };
    w.put("manifest", "cls-one-file", &small.sign(&publisher))
}

fn checkpoint_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let signer = fixed::ledger_signer();
    let sign = |cp: &Checkpoint| cp.sign(signer).map_err(io::Error::other);
    let empty = Checkpoint::new(fixed::LEDGER_ORIGIN, 0, Sha256::digest(b"").into());
    w.put("checkpoint", "signed-empty", sign(&empty)?.as_bytes())?;
    let big = Checkpoint::new(fixed::LEDGER_ORIGIN, 1_000_000, Sha256::digest(b"root").into());
    w.put("checkpoint", "signed-million", sign(&big)?.as_bytes())?;
    let mut extended = Checkpoint::new(fixed::LEDGER_ORIGIN, 12, [7; 32]);
    extended.extensions = vec!["Timestamp: 1735690200".into(), "x".into()];
    w.put("checkpoint", "signed-extensions", sign(&extended)?.as_bytes())?;
    w.put("checkpoint", "body", big.to_text().as_bytes())?;
    w.put("checkpoint", "verifier-key", fixed::ledger_verifier().to_string().as_bytes())
}

fn cms_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let spki = fixed::rsa_spki();
    let mut rng = HashRng::new("cms seeds");
    for (name, plaintext) in [("data-key", vec![0x11u8; 32]), ("private-key", vec![0x22; 138]), ("two-chunks", vec![0x33; 2000])] {
        let envelope = protocol::cms::seal(spki, &plaintext, &mut rng).map_err(io::Error::other)?;
        w.put("cms", name, &envelope)?;
    }
    Ok(())
}

fn jsonl_seeds(w: &mut Writer<'_>) -> io::Result<()> {
    let seeds: [(&str, &str); 7] = [
        ("plain", "{\"id\": \"doc-1\", \"text\": \"What is the capital of France?\"}\n{\"id\": 17, \"text\": \"\"}\n"),
        (
            "openai",
            "{\"custom_id\": \"req-1\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"all-MiniLM-L6-v2\", \"input\": \"one\"}}\n\
             {\"custom_id\": \"req-2\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": [\"a\", \"b\"], \"encoding_format\": \"float\", \"dimensions\": 384}}\n",
        ),
        ("bom-crlf-blank", "\u{feff}{\"id\": \"a\", \"text\": \"x\"}\r\n\r\n  \n{\"id\": \"b\", \"text\": \"y\"}"),
        (
            "errors",
            "not json\n[1]\n{\"text\": \"no id\"}\n{\"id\": \"x\"}\n{\"id\": \"x\", \"text\": 5}\n{\"id\": \"d\", \"text\": \"1\"}\n{\"id\": \"d\", \"text\": \"2\"}\n{\"id\": 1.5, \"text\": \"f\"}\n",
        ),
        (
            "openai-errors",
            "{\"custom_id\": \"r\", \"method\": \"GET\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": \"x\"}}\n\
             {\"custom_id\": \"s\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"other\", \"input\": \"x\"}}\n\
             {\"custom_id\": \"t\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": [[1, 2]]}}\n\
             {\"custom_id\": \"u\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": []}}\n\
             {\"id\": \"plain\", \"text\": \"mixed\"}\n",
        ),
        ("invalid-utf8", "{\"id\": \"bad\", \"text\": \"\u{0}\"}\n"),
        ("duplicate-across-types", "{\"id\": 17, \"text\": \"a\"}\n{\"id\": \"17\", \"text\": \"b\"}\n"),
    ];
    for (name, text) in seeds {
        w.put("jsonl", name, text.as_bytes())?;
    }
    // A line that is not UTF-8, with the id still readable.
    w.put("jsonl", "invalid-utf8-bytes", b"{\"id\": \"bad\", \"text\": \"\xff\xfe\"}\n")?;
    // An id over the record limit (id_too_long) and a line over the target's 2 KiB line cap
    // (too_large).
    let long = format!(
        "{{\"id\": \"{}\", \"text\": \"x\"}}\n{{\"id\": \"big\", \"text\": \"{}\"}}\n",
        "i".repeat(600),
        "t".repeat(2100)
    );
    w.put("jsonl", "long-id-long-line", long.as_bytes())
}
