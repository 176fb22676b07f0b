//! Every decoder of untrusted bytes returns an error, never a panic: random bytes, and random
//! mutations of valid encodings (which reach deeper into each parser).

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use protocol::envelope::{JobHeader, Preamble, ResultHeader, StreamKind};
use protocol::manifest::{Manifest, ModelFile, Pooling, SignedManifest};
use protocol::receipt::{Receipt, SignedReceipt};

fn receipt_bytes() -> Vec<u8> {
    let receipt = Receipt {
        job_id: protocol::envelope::JobId([1; 16]),
        input_sha256: [2; 32],
        output_sha256: [3; 32],
        records_ok: 10,
        records_failed: 1,
        tokens: 99,
        model_id: "m".into(),
        manifest_hash: [4; 32],
        options: Default::default(),
        result_key_id: [5; 32],
        attempt: 1,
        attestation_sha256: [6; 32],
        pcrs: [(0u8, vec![7; 48])].into_iter().collect(),
        fleet_key_id: [8; 32],
        epoch: 2,
        started_ms: 1,
        finished_ms: 2,
        commitment: [9; 32],
        records_root: None,
        compute: None,
    };
    receipt.sign(&SigningKey::from_bytes(&[1; 32]))
}

fn manifest_bytes() -> Vec<u8> {
    Manifest {
        model_id: "m".into(),
        version: 1,
        files: vec![ModelFile { name: "model.safetensors".into(), sha256: [1; 32], size: 3 }],
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Default::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: "k".into(),
        wrapped_dek: vec![1; 8],
        created_ms: 0,
    }
    .sign(&SigningKey::from_bytes(&[2; 32]))
}

fn decode_everything(bytes: &[u8]) {
    let _ = SignedReceipt::decode(bytes);
    let _ = SignedManifest::decode(bytes);
    let _ = JobHeader::from_bytes(bytes);
    let _ = ResultHeader::from_bytes(bytes);
    let _ = Preamble::parse(bytes, StreamKind::JobInput);
    let _ = Preamble::parse(bytes, StreamKind::JobResult);
    let _ = protocol::cms::EnvelopedData::parse(bytes);
    let _ = protocol::frame::decode_body(bytes);
    let _ = protocol::cancel::CancelRequest::from_json(bytes);
    let _ = protocol::cancel::check(bytes, &protocol::envelope::JobId([1; 16]), bytes);
    if let (Some(key), Some(signature)) = (bytes.get(..32), bytes.get(32..96)) {
        let _ = protocol::cancel::verify(key.try_into().unwrap(), &protocol::envelope::JobId([1; 16]), signature.try_into().unwrap());
    }
}

fn mutate(mut bytes: Vec<u8>, edits: &[(prop::sample::Index, u8)], cut: Option<prop::sample::Index>) -> Vec<u8> {
    for (at, value) in edits {
        let i = at.index(bytes.len());
        bytes[i] = *value;
    }
    if let Some(cut) = cut {
        bytes.truncate(cut.index(bytes.len() + 1));
    }
    bytes
}

/// A sealed job's preamble and its submitter's signed cancel.
fn cancelled_job() -> (Vec<u8>, protocol::envelope::JobId, protocol::cancel::CancelRequest) {
    use protocol::envelope::{seal_job, FleetSecretKey, JobId, ResultSecretKey};
    let fleet = FleetSecretKey::from_scalar_bytes(&[1; 32]).unwrap().public_key();
    let client = ResultSecretKey::from_bytes(&[2; 32]).unwrap();
    let header = JobHeader {
        fleet_key_id: fleet.key_id(),
        epoch: 1,
        model_id: "m".into(),
        manifest_hash: [3; 32],
        options: Default::default(),
        result_public_key: client.public_key().to_bytes(),
        record_count: 1,
        created_ms: 0,
    };
    let sealed = seal_job(&header, &fleet).unwrap();
    let job = JobId(sealed.stream_id);
    (sealed.preamble, job, protocol::cancel::CancelRequest::new(&client, &job, 0))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_cancels_never_panic_and_verify_only_unchanged(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        in_input in any::<bool>(),
    ) {
        let (input, job, request) = cancelled_job();
        let body = request.to_json().into_bytes();
        let (input, body) = if in_input { (mutate(input.clone(), &edits, cut), body) } else { (input, mutate(body, &edits, cut)) };
        if protocol::cancel::check(&input, &job, &body).is_ok() {
            // Only an edit of the informative date (or nothing) leaves a cancel that verifies.
            let parsed = protocol::cancel::CancelRequest::from_json(&body).unwrap();
            prop_assert_eq!((parsed.job_id, parsed.signature), (request.job_id.clone(), request.signature.clone()));
            prop_assert_eq!(Preamble::parse_complete(&input, StreamKind::JobInput).unwrap().0.stream_id(), job.0);
        }
    }

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_receipts_and_manifests(
        which in 0usize..2,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let valid = if which == 0 { receipt_bytes() } else { manifest_bytes() };
        let bytes = mutate(valid.clone(), &edits, cut);
        decode_everything(&bytes);
        // A mutation that changed anything must not verify.
        if bytes != valid {
            let key = SigningKey::from_bytes(&[if which == 0 { 1 } else { 2 }; 32]).verifying_key();
            if which == 0 {
                prop_assert!(SignedReceipt::decode(&bytes).and_then(|r| r.verify(&key).cloned()).is_err());
            } else {
                prop_assert!(SignedManifest::decode(&bytes).and_then(|m| m.verify(&key).cloned()).is_err());
            }
        }
    }
}
