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

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

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
