//! The known-answer vectors of `docs/protocol.md`, recomputed from fixed keys and checked against
//! the document, so the specification cannot drift from the code.
//!
//! Each vector in the document is a fenced `hex` block preceded by `<!-- kat:NAME -->`. After an
//! intended format change, `EPHEM_BLESS_KATS=1 cargo test -p protocol --test known_answers`
//! rewrites the blocks; review the diff like any other change to the specification.

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use protocol::envelope::{
    seal_job_with_ephemeral_ikm, seal_result_with_ephemeral_ikm, FleetSecretKey, JobHeader, JobId, JobOptions,
    OutputDtype, Precision, ResultHeader, ResultSecretKey,
};
use protocol::frame::{self, Message};
use protocol::manifest::{Manifest, ModelFile, Pooling, RerankTemplate};
use protocol::receipt::{Compute, ComputeUnit, PlaintextCommitment, Receipt, ShortRecords};
use protocol::records::{encode_input, encode_output, ErrorCode, InputRecord, OutputRecord, Vector};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");

fn fleet_key() -> FleetSecretKey {
    FleetSecretKey::from_scalar_bytes(&hex::decode("0101010101010101010101010101010101010101010101010101010101010101").unwrap())
        .unwrap()
}

fn client_key() -> ResultSecretKey {
    ResultSecretKey::from_bytes(&[0x02; 32]).unwrap()
}

fn input_records() -> Vec<u8> {
    let mut out = Vec::new();
    for (id, text) in [("doc-1", "What is the capital of France?"), ("doc-2", "")] {
        encode_input(&InputRecord { id: id.into(), text: text.as_bytes().to_vec() }, &mut out).unwrap();
    }
    out
}

fn output_records() -> Vec<u8> {
    let mut out = Vec::new();
    let records = [
        OutputRecord::Embedding { id: "doc-1".into(), tokens: 9, vector: Vector::F32(vec![0.5, -0.25, 0.0, 1.0]) },
        OutputRecord::Error { id: "doc-2".into(), code: ErrorCode::EmptyText, message: "text is empty".into() },
    ];
    for record in &records {
        encode_output(record, &mut out).unwrap();
    }
    out
}

fn job_header() -> JobHeader {
    JobHeader {
        fleet_key_id: fleet_key().public_key().key_id(),
        epoch: 1,
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: [0x33; 32],
        options: JobOptions { truncate: true, normalize: true, dtype: OutputDtype::F32, precision: Precision::Fp32, ..JobOptions::default() },
        result_public_key: client_key().public_key().to_bytes(),
        record_count: 2,
        created_ms: 1_767_225_600_000,
    }
}

/// Every vector the document carries, by name.
fn vectors() -> BTreeMap<&'static str, Vec<u8>> {
    let mut v = BTreeMap::new();
    v.insert("keys.fleet_public", fleet_key().public_key().to_bytes());
    v.insert("keys.client_public", client_key().public_key().to_bytes().to_vec());

    let header = job_header();
    v.insert("job.header", header.to_bytes());
    let sealed = seal_job_with_ephemeral_ikm(&header, &fleet_key().public_key(), &[0x03; 32]).unwrap();
    let job_id = JobId(sealed.stream_id);
    v.insert("job.id", job_id.0.to_vec());
    let mut job = sealed.preamble.clone();
    v.insert("job.preamble", sealed.preamble);
    let input = input_records();
    let mut sealer = sealed.sealer;
    sealer.push(&input, &mut job).unwrap();
    sealer.finish(&mut job).unwrap();
    v.insert("records.input", input.clone());
    v.insert("job.sealed", job);

    let result_header = ResultHeader {
        job_id,
        result_key_id: client_key().public_key().key_id(),
        attempt: 1,
        created_ms: 1_767_225_601_000,
    };
    let sealed_result =
        seal_result_with_ephemeral_ikm(&result_header, &client_key().public_key(), &[0x04; 32]).unwrap();
    let output = output_records();
    let mut result = sealed_result.preamble;
    let mut sealer = sealed_result.sealer;
    sealer.push(&output, &mut result).unwrap();
    sealer.finish(&mut result).unwrap();
    v.insert("records.output", output.clone());
    v.insert("result.sealed", result);
    // A multi-vector record (§3.3): 3 tokens, 3 vectors of 2 dimensions.
    let multi = protocol::records::MultiVector::new(2, vec![1.0, 0.0, 0.6, -0.8, 0.0, 1.0]).unwrap();
    let mut bytes = Vec::new();
    encode_output(&OutputRecord::Embedding { id: "m".into(), tokens: 3, vector: Vector::Multi(multi) }, &mut bytes).unwrap();
    v.insert("records.multivector", bytes);

    // A cancel of the job by its submitter: XEdDSA with the nonce input Z = 08 × 64.
    v.insert("cancel.message", protocol::cancel::message(&job_id));
    v.insert("cancel.edwards_public", protocol::cancel::edwards_public(&client_key().public_key().to_bytes()).unwrap().to_vec());
    v.insert("cancel.signature", protocol::cancel::sign_with_z(&client_key(), &job_id, &[0x08; 64]).to_vec());

    let mut commitment = PlaintextCommitment::new();
    commitment.input(&input);
    commitment.output(&output);
    let commitment = commitment.finish(&sealed.commitment_key);
    v.insert("receipt.commitment", commitment.to_vec());

    // The record tree over the one embedded record (doc-1; doc-2 failed and has no leaf).
    let record_key = protocol::record_tree::record_key(&sealed.commitment_key, 0);
    let embedded = OutputRecord::Embedding { id: "doc-1".into(), tokens: 9, vector: Vector::F32(vec![0.5, -0.25, 0.0, 1.0]) };
    let leaf = protocol::record_tree::RecordLeaf::new(&record_key, 0, b"What is the capital of France?", &embedded).unwrap();
    let mut records = protocol::record_tree::RecordTree::default();
    records.push(leaf.hash());
    v.insert("record.key_0", record_key.to_vec());
    v.insert("record.leaf_0", leaf.to_bytes());
    v.insert("record.root", records.root().to_vec());

    let receipt = Receipt {
        job_id,
        input_sha256: sha256(&v["job.sealed"]),
        output_sha256: sha256(&v["result.sealed"]),
        records_ok: 1,
        records_failed: 1,
        tokens: 9,
        model_id: header.model_id.clone(),
        manifest_hash: header.manifest_hash,
        options: header.options.clone(),
        result_key_id: client_key().public_key().key_id(),
        attempt: 1,
        attestation_sha256: [0x55; 32],
        pcrs: [(0u8, vec![0xa0; 48]), (1, vec![0xa1; 48]), (2, vec![0xa2; 48])].into_iter().collect(),
        fleet_key_id: header.fleet_key_id,
        epoch: 1,
        started_ms: 1_767_225_600_500,
        finished_ms: 1_767_225_601_000,
        commitment,
        records_root: Some(records.root()),
        compute: None,
    };
    let receipt_key = SigningKey::from_bytes(&[0x05; 32]);
    v.insert("receipt.key_public", receipt_key.verifying_key().as_bytes().to_vec());
    v.insert("receipt.payload", receipt.to_payload());
    v.insert("receipt.cose", receipt.sign(&receipt_key));
    // The `compute` value of an int8 job's receipt on AVX-512 whose 12 records of at most 8
    // tokens ran at bf16.
    let compute = Compute {
        bf16: Some(ComputeUnit::Avx512),
        int8: Some(ComputeUnit::Avx512),
        short: Some(ShortRecords { max_tokens: 8, precision: Precision::Bf16, records: 12 }),
    };
    v.insert("receipt.compute", protocol::cbor::encode(&compute.to_cbor()));

    let manifest = Manifest {
        model_id: header.model_id.clone(),
        version: 1,
        files: vec![
            ModelFile { name: "config.json".into(), sha256: sha256(b"{}"), size: 2 },
            ModelFile { name: "model.safetensors".into(), sha256: sha256(b"weights"), size: 7 },
        ],
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: "local:model".into(),
        wrapped_dek: vec![0xde; 8],
        created_ms: 1_767_225_600_000,
    };
    let publisher = SigningKey::from_bytes(&[0x06; 32]);
    v.insert("manifest.publisher_public", publisher.verifying_key().as_bytes().to_vec());
    v.insert("manifest.cose", manifest.sign(&publisher));
    v.insert("manifest.file_key", manifest.file_key(&[0x07; 32], "model.safetensors").to_vec());
    v.insert("manifest.file_stream_id", manifest.file_stream_id("model.safetensors").to_vec());
    // bge-m3's form: CLS pooling, the two heads listed, `outputs` offering their kinds.
    let mut m3 = Manifest {
        pooling: Pooling::Cls,
        dimensions: 1024,
        outputs: vec![(protocol::envelope::OutputKind::MultiVector, 1024), (protocol::envelope::OutputKind::Sparse, 250_002)],
        ..manifest.clone()
    };
    m3.files.push(ModelFile { name: protocol::manifest::COLBERT_HEAD_FILE.into(), sha256: sha256(b"colbert"), size: 7 });
    m3.files.push(ModelFile { name: protocol::manifest::LEXICAL_HEAD_FILE.into(), sha256: sha256(b"sparse"), size: 6 });
    m3.files.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(Manifest::from_payload(&m3.to_payload()).unwrap(), m3);
    v.insert("manifest.outputs_payload", m3.to_payload());
    // A decoder reranker's manifest payload: pooling rerank_yesno with its template.
    let reranker = Manifest {
        pooling: Pooling::RerankYesNo { sigmoid: true },
        normalize: false,
        dimensions: 1024,
        rerank_template: Some(RerankTemplate {
            prefix: "<|im_start|>system\nJudge.<|im_end|>\n<|im_start|>user\n<Instruct>: ".into(),
            after_instruction: "\n<Query>: ".into(),
            after_query: "\n<Document>: ".into(),
            suffix: "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".into(),
            instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
            yes: 9693,
            no: 2152,
        }),
        ..manifest.clone()
    };
    v.insert("manifest.rerank_yesno_payload", reranker.to_payload());

    v.insert("frame.input", frame::encode(&Message::Input { data: vec![1, 2, 3] }).unwrap());
    v.insert("frame.job_start", frame::encode(&Message::JobStart { job_id, attempt: 1 }).unwrap());

    // Attestation vectors: the unit tests of `protocol::attestation` regenerate these constants
    // from their seeds; here they are held against the document.
    use protocol::attestation::vectors as att;
    for (name, value) in [
        ("attestation.binding", att::BINDING_HEX),
        ("attestation.binding_fleet_key_id", att::BINDING_FLEET_KEY_ID_HEX),
        ("attestation.binding_receipt_key_id", att::BINDING_RECEIPT_KEY_ID_HEX),
        ("attestation.policy_signed_bytes", att::POLICY_SIGNED_BYTES_HEX),
        ("attestation.policy_signature", att::POLICY_SIGNATURE_HEX),
        ("attestation.dev_root_der", att::DEV_ROOT_DER_HEX),
        ("attestation.dev_root_sha256", att::DEV_ROOT_SHA256_HEX),
        ("attestation.dev_intermediate_sha256", att::DEV_INTERMEDIATE_SHA256_HEX),
        ("attestation.dev_leaf_sha256", att::DEV_LEAF_SHA256_HEX),
        ("attestation.dev_document_sha256", att::DEV_DOC_SHA256_HEX),
    ] {
        v.insert(name, hex::decode(value).unwrap());
    }
    v.insert("attestation.binding", att::binding_sample().encode());
    v
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// (name, hex, byte range of the hex block's body) for every vector in the document.
fn document_vectors(doc: &str) -> Vec<(String, String, std::ops::Range<usize>)> {
    let mut found = Vec::new();
    let mut rest = 0;
    while let Some(at) = doc[rest..].find("<!-- kat:") {
        let start = rest + at + "<!-- kat:".len();
        let end = start + doc[start..].find(" -->").expect("unterminated kat marker");
        let name = doc[start..end].to_owned();
        let open = end + doc[end..].find("```hex\n").expect("kat marker without a hex block") + "```hex\n".len();
        let close = open + doc[open..].find("```").expect("unterminated hex block");
        let hex: String = doc[open..close].chars().filter(|c| !c.is_whitespace()).collect();
        found.push((name, hex, open..close));
        rest = close;
    }
    found
}

fn wrap(hex: &str) -> String {
    hex.as_bytes().chunks(96).map(|line| format!("{}\n", std::str::from_utf8(line).unwrap())).collect()
}

#[test]
fn protocol_md_vectors_match_the_code() {
    let expected = vectors();
    let doc = std::fs::read_to_string(DOC).expect("docs/protocol.md");
    let in_doc = document_vectors(&doc);

    if std::env::var_os("EPHEM_BLESS_KATS").is_some() {
        let mut blessed = doc.clone();
        for (name, _, range) in in_doc.iter().rev() {
            let value = expected.get(name.as_str()).unwrap_or_else(|| panic!("unknown vector {name}"));
            blessed.replace_range(range.clone(), &wrap(&hex::encode(value)));
        }
        std::fs::write(DOC, blessed).unwrap();
        return;
    }

    let mut problems = Vec::new();
    for (name, value) in &expected {
        match in_doc.iter().find(|(n, _, _)| n == name) {
            None => problems.push(format!("{name}: missing from docs/protocol.md")),
            Some((_, hex, _)) if *hex != hex::encode(value) => {
                problems.push(format!("{name}: document says\n{hex}\ncode gives\n{}", hex::encode(value)))
            }
            Some(_) => {}
        }
    }
    for (name, _, _) in &in_doc {
        if !expected.contains_key(name.as_str()) {
            problems.push(format!("{name}: in the document but not computed by any test"));
        }
    }
    assert!(problems.is_empty(), "docs/protocol.md disagrees with the code:\n{}", problems.join("\n"));
}

#[test]
fn protocol_md_vectors_open_and_verify() {
    // The sealed vectors are not just stable bytes: they open with the documented keys.
    use protocol::envelope::{open_job, open_result, Preamble, StreamKind};
    use protocol::receipt::SignedReceipt;
    let v = vectors();
    let (preamble, used) = Preamble::parse_complete(&v["job.sealed"], StreamKind::JobInput).unwrap();
    let mut opened = open_job(&preamble, &fleet_key(), Some(JobId(v["job.id"].clone().try_into().unwrap()))).unwrap();
    let mut plain = Vec::new();
    opened.opener.push(&v["job.sealed"][used..], &mut plain).unwrap();
    opened.opener.finish(&mut plain).unwrap();
    assert_eq!(plain, v["records.input"]);

    let (preamble, used) = Preamble::parse_complete(&v["result.sealed"], StreamKind::JobResult).unwrap();
    let mut opened = open_result(&preamble, &client_key(), None).unwrap();
    let mut plain = Vec::new();
    opened.opener.push(&v["result.sealed"][used..], &mut plain).unwrap();
    opened.opener.finish(&mut plain).unwrap();
    assert_eq!(plain, v["records.output"]);

    // The cancel signature verifies against the job header's result key, and as plain Ed25519
    // against the documented Edwards key.
    let job_id = JobId(v["job.id"].clone().try_into().unwrap());
    let signature: [u8; 64] = v["cancel.signature"].clone().try_into().unwrap();
    protocol::cancel::verify(&client_key().public_key().to_bytes(), &job_id, &signature).unwrap();
    let edwards = ed25519_dalek::VerifyingKey::from_bytes(&v["cancel.edwards_public"].clone().try_into().unwrap()).unwrap();
    edwards.verify_strict(&v["cancel.message"], &ed25519_dalek::Signature::from_bytes(&signature)).unwrap();
    let body = protocol::cancel::CancelRequest { v: 1, job_id, requested_ms: 0, signature: hex::encode(signature) };
    protocol::cancel::check(&v["job.preamble"], &job_id, body.to_json().as_bytes()).unwrap();

    let signed = SignedReceipt::decode(&v["receipt.cose"]).unwrap();
    let key = ed25519_dalek::VerifyingKey::from_bytes(&v["receipt.key_public"].clone().try_into().unwrap()).unwrap();
    assert_eq!(signed.verify(&key).unwrap().commitment.to_vec(), v["receipt.commitment"]);
}
