use super::*;

pub(crate) fn sample() -> Manifest {
    Manifest {
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        version: 1,
        files: vec![
            ModelFile { name: "config.json".into(), sha256: [1; 32], size: 612 },
            ModelFile { name: "model.safetensors".into(), sha256: [2; 32], size: 90_868_376 },
            ModelFile { name: "tokenizer.json".into(), sha256: [3; 32], size: 466_247 },
        ],
        dimensions: 384,
        pooling: Pooling::Mean,
        normalize: true,
        max_tokens: 256,
        prompts: Prompts::default(),
        matryoshka: Vec::new(),
        images: Vec::new(),
        outputs: Vec::new(),
        rerank_template: None,
        kms_key_id: "local:model".into(),
        wrapped_dek: vec![0xde; 48],
        created_ms: 1_760_000_000_000,
    }
}

#[test]
fn round_trip_and_signature() {
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let bytes = sample().sign(&publisher);
    let signed = SignedManifest::decode(&bytes).unwrap();
    assert_eq!(signed.verify(&publisher.verifying_key()).unwrap(), &sample());
    assert_eq!(signed.hash, manifest_hash(&bytes));
    let stranger = SigningKey::from_bytes(&[4; 32]);
    assert!(signed.verify(&stranger.verifying_key()).is_err());
}

/// Dense modules are files of the signed list: both files of each index from 0 round-trip and
/// count; a lone file, a gap or a stray `dense.` name is refused when the manifest is read.
#[test]
fn dense_module_files_are_counted_and_checked() {
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let with = |names: &[&str]| -> Result<usize, ManifestError> {
        let mut manifest = sample();
        manifest.files.extend(names.iter().map(|n| ModelFile { name: (*n).into(), sha256: [9; 32], size: 10 }));
        manifest.files.sort_by(|a, b| a.name.cmp(&b.name));
        let signed = SignedManifest::decode(&manifest.sign(&publisher))?;
        signed.verify(&publisher.verifying_key())?.dense_modules()
    };
    assert_eq!(with(&[]).unwrap(), 0);
    let two = ["dense.0.config.json", "dense.0.safetensors", "dense.1.config.json", "dense.1.safetensors"];
    assert_eq!(with(&two).unwrap(), 2);
    assert_eq!(dense_file_names(1), ["dense.1.config.json", "dense.1.safetensors"]);
    for wrong in [&two[..3], &two[1..], &two[2..], &["dense.0.config.json", "dense.0.safetensors", "dense.0.bin", "dense.x"][..]] {
        assert!(matches!(with(wrong), Err(ManifestError::Invalid(m)) if m.starts_with("dense module files")), "{wrong:?}");
    }
}

/// Each pooling is written by name and read back; a name the protocol does not know is refused.
#[test]
fn every_pooling_round_trips_by_name() {
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let names = [(Pooling::Mean, "mean"), (Pooling::Cls, "cls"), (Pooling::LastToken, "lasttoken"), (Pooling::Splade, "splade"), (Pooling::Rerank { sigmoid: true }, "rerank"), (Pooling::Rerank { sigmoid: false }, "rerank_logit"), (Pooling::MultiVector, "multivector"), (Pooling::RerankYesNo { sigmoid: true }, "rerank_yesno"), (Pooling::RerankYesNo { sigmoid: false }, "rerank_yesno_logit")];
    assert_eq!(names.map(|(p, _)| p), Pooling::ALL, "every pooling has its name here");
    for (pooling, name) in names {
        assert_eq!(Pooling::from_name(name), Some(pooling));
        let mut manifest = Manifest { pooling, ..sample() };
        if pooling == Pooling::MultiVector {
            let unprojected = SignedManifest::decode(&manifest.sign(&publisher));
            assert!(matches!(unprojected, Err(ManifestError::Invalid(m)) if m.starts_with("multivector")));
            manifest.files.extend(dense_file_names(0).map(|name| ModelFile { name, sha256: [9; 32], size: 10 }));
            manifest.files.sort_by(|a, b| a.name.cmp(&b.name));
        }
        if matches!(pooling, Pooling::RerankYesNo { .. }) {
            manifest.rerank_template = Some(sample_template());
        }
        assert!(String::from_utf8_lossy(&manifest.to_payload()).contains(name), "{name}");
        let signed = SignedManifest::decode(&manifest.sign(&publisher)).unwrap();
        assert_eq!(signed.verify(&publisher.verifying_key()).unwrap().pooling, pooling);
    }
    let payload = sample().to_payload();
    let at = payload.windows(4).position(|w| w == b"mean").unwrap();
    let mut other = payload.clone();
    other[at..at + 4].copy_from_slice(b"last");
    assert!(matches!(Manifest::from_payload(&other), Err(ManifestError::Invalid("unknown pooling"))));
}

#[test]
fn prompts_are_optional_signed_and_checked() {
    let plain = sample().to_payload();
    assert!(!String::from_utf8_lossy(&plain).contains("prompt"), "no prompts, no field: old payloads unchanged");
    let mut manifest = sample();
    manifest.prompts = Prompts {
        entries: vec![("passage".into(), "passage: ".into()), ("query".into(), "query: ".into())],
        default: Some("query".into()),
    };
    let payload = manifest.to_payload();
    assert_eq!(Manifest::from_payload(&payload).unwrap(), manifest);
    assert_eq!(crate::cbor::decode_deterministic(&payload).map(|_| ()), Ok(()));
    // A signature over the manifest covers its prompts: a host cannot swap one.
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let signed = manifest.sign(&publisher);
    let tampered = {
        let mut bytes = signed.clone();
        let at = bytes.windows(7).position(|w| w == b"query: ").unwrap();
        bytes[at] = b'Q';
        bytes
    };
    assert!(SignedManifest::decode(&tampered).unwrap().verify(&publisher.verifying_key()).is_err());
    let refused = |prompts: Prompts| {
        let mut m = sample();
        m.prompts = prompts;
        Manifest::from_payload(&m.to_payload())
    };
    let unsorted = vec![("query".into(), "q".into()), ("passage".into(), "p".into())];
    assert!(matches!(refused(Prompts { entries: unsorted, default: None }), Err(ManifestError::Invalid(_))));
    let dangling = Prompts { entries: vec![("query".into(), "q".into())], default: Some("passage".into()) };
    assert!(matches!(refused(dangling), Err(ManifestError::Invalid("default_prompt names no prompt"))));
    let long = Prompts { entries: vec![("query".into(), "x".repeat(MAX_PROMPT_BYTES + 1))], default: None };
    assert!(matches!(refused(long), Err(ManifestError::Invalid("prompt"))));
    // An empty list is written by omission only.
    let empty = crate::cbor::encode(&match crate::cbor::decode_deterministic(&plain).unwrap() {
        Value::Map(mut entries) => {
            entries.push((Value::Text("prompts".into()), Value::Array(vec![])));
            entries.sort_by(|a, b| {
                let (Value::Text(a), Value::Text(b)) = (&a.0, &b.0) else { unreachable!() };
                a.len().cmp(&b.len()).then(a.cmp(b))
            });
            Value::Map(entries)
        }
        _ => unreachable!(),
    });
    assert!(matches!(Manifest::from_payload(&empty), Err(ManifestError::Invalid("number of prompts"))));
}

#[test]
fn the_chosen_prompt_is_the_named_one_none_or_the_default() {
    let prompts = Prompts { entries: vec![("query".into(), "query: ".into())], default: Some("query".into()) };
    assert_eq!(prompts.chosen(None), Some("query"));
    assert_eq!(prompts.chosen(Some(NO_PROMPT)), None);
    assert_eq!(prompts.chosen(Some("passage")), Some("passage"), "named, checked by the caller");
    assert_eq!(Prompts::default().chosen(None), None);
}

#[test]
fn matryoshka_lengths_are_optional_signed_and_checked() {
    assert!(!String::from_utf8_lossy(&sample().to_payload()).contains("matryoshka"), "old payloads unchanged");
    let mut manifest = sample();
    manifest.matryoshka = vec![64, 128, 256];
    assert_eq!(Manifest::from_payload(&manifest.to_payload()).unwrap(), manifest);
    assert!(manifest.offers_dimensions(128) && manifest.offers_dimensions(384));
    assert!(!manifest.offers_dimensions(100) && !manifest.offers_dimensions(0));
    assert_eq!(manifest.offered_dimensions(), [64, 128, 256, 384]);
    let refused = |lengths: Vec<u32>| {
        let mut m = sample();
        m.matryoshka = lengths;
        Manifest::from_payload(&m.to_payload()).unwrap_err()
    };
    assert_eq!(refused(vec![128, 64]), ManifestError::Invalid("matryoshka dimensions must ascend, without duplicates"));
    assert_eq!(refused(vec![64, 64]), ManifestError::Invalid("matryoshka dimensions must ascend, without duplicates"));
    assert_eq!(refused(vec![0, 64]), ManifestError::Invalid("matryoshka dimension"));
    assert_eq!(refused(vec![64, 384]), ManifestError::Invalid("matryoshka dimensions must be below the model's dimensions"));
    assert_eq!(refused(vec![1; MAX_MATRYOSHKA + 1]), ManifestError::Invalid("number of matryoshka dimensions"));
}

#[test]
fn images_are_optional_signed_and_checked() {
    assert!(!String::from_utf8_lossy(&sample().to_payload()).contains("images"), "old payloads unchanged");
    assert!(sample().is_for_image(&[0xa0; 48]), "a version naming no image is for every image");
    let mut manifest = sample();
    manifest.images = vec![[0xa0; 48], [0xb0; 48]];
    assert_eq!(Manifest::from_payload(&manifest.to_payload()).unwrap(), manifest);
    assert!(manifest.is_for_image(&[0xb0; 48]) && !manifest.is_for_image(&[0xc0; 48]) && !manifest.is_for_image(&[0xb0; 47]));
    let refused = |images: Vec<[u8; 48]>| {
        let mut m = sample();
        m.images = images;
        Manifest::from_payload(&m.to_payload()).unwrap_err()
    };
    assert_eq!(refused(vec![[0xb0; 48], [0xa0; 48]]), ManifestError::Invalid("images must ascend, without duplicates"));
    assert_eq!(refused(vec![[0xa0; 48]; 2]), ManifestError::Invalid("images must ascend, without duplicates"));
    let many: Vec<[u8; 48]> = (0..=MAX_IMAGES as u8).map(|i| [i; 48]).collect();
    assert_eq!(refused(many), ManifestError::Invalid("number of images"));
    // A PCR0 of another length (a SHA-256 where SHA-384 belongs) is refused, not truncated.
    let mut one = sample();
    one.images = vec![[0xa0; 48]];
    let (payload, long) = (one.to_payload(), [&[0x58, 48][..], &[0xa0; 48]].concat());
    let at = payload.windows(long.len()).position(|w| w == long.as_slice()).expect("the PCR0's encoding");
    let payload = [&payload[..at], &[0x58, 32][..], &[0xa0; 32], &payload[at + long.len()..]].concat();
    assert_eq!(Manifest::from_payload(&payload).unwrap_err(), ManifestError::Invalid("an image's PCR0 is not 48 bytes"));
}

/// bge-m3: a dense model offering sparse and multi-vector output through its head files. The
/// key is absent for old manifests; each output needs its file and each file its output.
#[test]
fn extra_outputs_are_optional_signed_and_tied_to_their_head_files() {
    use crate::envelope::OutputKind;
    assert!(!String::from_utf8_lossy(&sample().to_payload()).contains("outputs"), "old payloads unchanged");
    assert_eq!(sample().offered_outputs(), [(OutputKind::Dense, 384)]);
    let heads = |names: &[&str]| {
        let mut m = Manifest { pooling: Pooling::Cls, ..sample() };
        m.files.extend(names.iter().map(|n| ModelFile { name: (*n).into(), sha256: [7; 32], size: 10 }));
        m.files.sort_by(|a, b| a.name.cmp(&b.name));
        m
    };
    let mut manifest = heads(&[LEXICAL_HEAD_FILE, COLBERT_HEAD_FILE]);
    manifest.outputs = vec![(OutputKind::MultiVector, 384), (OutputKind::Sparse, 250_002)];
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let signed = SignedManifest::decode(&manifest.sign(&publisher)).unwrap();
    assert_eq!(signed.verify(&publisher.verifying_key()).unwrap(), &manifest);
    assert_eq!(manifest.output_dimensions(OutputKind::Sparse), Some(250_002));
    assert_eq!(manifest.output_dimensions(OutputKind::Dense), Some(384));
    assert_eq!(manifest.output_dimensions(OutputKind::Scores), None);
    let refused = |m: &Manifest| Manifest::from_payload(&m.to_payload()).unwrap_err();
    // An output without its head, a head without its output, a head swapped for the other.
    let mut lone = heads(&[COLBERT_HEAD_FILE]);
    lone.outputs = vec![(OutputKind::MultiVector, 384), (OutputKind::Sparse, 250_002)];
    assert_eq!(refused(&lone), ManifestError::Invalid("outputs: sparse is offered exactly when sparse_linear.safetensors is listed"));
    let unoffered = heads(&[COLBERT_HEAD_FILE]);
    assert_eq!(refused(&unoffered), ManifestError::Invalid("outputs: multivector is offered exactly when colbert_linear.safetensors is listed"));
    let mut swapped = heads(&[LEXICAL_HEAD_FILE]);
    swapped.outputs = vec![(OutputKind::MultiVector, 384)];
    assert!(matches!(refused(&swapped), ManifestError::Invalid(m) if m.starts_with("outputs:")));
    let mut zero = heads(&[LEXICAL_HEAD_FILE]);
    zero.outputs = vec![(OutputKind::Sparse, 0)];
    assert_eq!(refused(&zero), ManifestError::Invalid("outputs: dimensions"));
    let mut splade = heads(&[LEXICAL_HEAD_FILE]);
    splade.pooling = Pooling::Splade;
    splade.outputs = vec![(OutputKind::Sparse, 384)];
    assert_eq!(refused(&splade), ManifestError::Invalid("outputs: only a model with dense vectors offers other outputs"));
    // Another key in the map (`sparsf`, written over `sparse`'s bytes) is refused by name.
    let payload = manifest.to_payload();
    let at = payload.windows(7).position(|w| w == b"\x66sparse").unwrap() + 1;
    let mut other = payload.clone();
    other[at..at + 6].copy_from_slice(b"sparsf");
    assert!(matches!(Manifest::from_payload(&other), Err(ManifestError::Payload(CborError::Unknown(k))) if k == "sparsf"));
}

#[test]
fn refuses_unsorted_files_and_bad_names() {
    let mut manifest = sample();
    manifest.files.swap(0, 1);
    assert!(Manifest::from_payload(&manifest.to_payload()).is_err());
    let mut manifest = sample();
    manifest.files[0].name = "../etc/passwd".into();
    assert!(matches!(Manifest::from_payload(&manifest.to_payload()), Err(ManifestError::Invalid("file name"))));
}

#[test]
fn sealed_files_open_with_their_key_only() {
    let manifest = sample();
    let sealed = manifest.seal_file(&[1; 32], "config.json", b"{}");
    let mut opener = crate::stream::StreamOpener::new(&manifest.file_key(&[1; 32], "config.json"), manifest.file_stream_id("config.json"));
    let mut out = Vec::new();
    opener.push(&sealed, &mut out).unwrap();
    opener.finish(&mut out).unwrap();
    assert_eq!(out, b"{}");
    let mut wrong = crate::stream::StreamOpener::new(&manifest.file_key(&[2; 32], "config.json"), manifest.file_stream_id("config.json"));
    wrong.push(&sealed, &mut out).unwrap();
    assert!(wrong.finish(&mut out).is_err());
    assert_eq!(Manifest::file_object_key("models/m/v1/manifest.cose", "config.json"), "models/m/v1/config.json.sealed");
}

#[test]
fn file_keys_differ_per_file_and_dek() {
    let manifest = sample();
    let a = manifest.file_key(&[1; 32], "model.safetensors");
    assert_ne!(*a, *manifest.file_key(&[1; 32], "tokenizer.json"));
    assert_ne!(*a, *manifest.file_key(&[2; 32], "model.safetensors"));
    assert_ne!(manifest.file_stream_id("a"), manifest.file_stream_id("b"));
}

#[test]
fn model_minimum_round_trip_and_domain_separation() {
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let minimum = ModelMinimum { model_id: "example/tiny".into(), minimum_version: 4, issued_ms: 1_760_000_000_000 };
    let bytes = minimum.sign(&publisher);
    let signed = SignedModelMinimum::decode(&bytes).unwrap();
    assert_eq!(signed.verify(&publisher.verifying_key()).unwrap(), &minimum);
    assert!(signed.verify(&SigningKey::from_bytes(&[4; 32]).verifying_key()).is_err());
    // The same key's manifest signature is not a minimum, nor the reverse.
    assert!(matches!(SignedModelMinimum::decode(&sample().sign(&publisher)), Err(ManifestError::Cose(CoseError::Header { .. }))));
    assert!(matches!(SignedManifest::decode(&bytes), Err(ManifestError::Cose(CoseError::Header { .. }))));
    // One flipped signature bit: refused.
    let mut tampered = bytes.clone();
    *tampered.last_mut().unwrap() ^= 1;
    let decoded = SignedModelMinimum::decode(&tampered).unwrap();
    assert!(matches!(decoded.verify(&publisher.verifying_key()), Err(ManifestError::Cose(CoseError::BadSignature))));
}

pub(crate) fn sample_template() -> RerankTemplate {
    RerankTemplate {
        prefix: "<|im_start|>system\nJudge.<|im_end|>\n<|im_start|>user\n<Instruct>: ".into(),
        after_instruction: "\n<Query>: ".into(),
        after_query: "\n<Document>: ".into(),
        suffix: "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".into(),
        instruction: "Given a web search query, retrieve relevant passages that answer the query".into(),
        yes: 9693,
        no: 2152,
    }
}

/// A decoder reranker's template is signed with its pooling and only with it; a manifest
/// without it keeps its bytes; the two tokens must differ, the texts stay within a prompt's size.
#[test]
fn a_rerank_template_goes_with_rerank_yesno_only() {
    assert!(!String::from_utf8_lossy(&sample().to_payload()).contains("rerank_template"), "absent: old payloads unchanged");
    let manifest = Manifest { pooling: Pooling::RerankYesNo { sigmoid: true }, rerank_template: Some(sample_template()), ..sample() };
    assert_eq!(Manifest::from_payload(&manifest.to_payload()).unwrap(), manifest);
    assert_eq!(
        manifest.rerank_template.as_ref().unwrap().render("q", "d"),
        "<|im_start|>system\nJudge.<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: q\n<Document>: d<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let refused = |m: Manifest| Manifest::from_payload(&m.to_payload());
    let without = Manifest { rerank_template: None, ..manifest.clone() };
    assert!(matches!(refused(without), Err(ManifestError::Invalid(m)) if m.starts_with("rerank_template goes with")));
    let stray = Manifest { pooling: Pooling::Rerank { sigmoid: true }, ..manifest.clone() };
    assert!(matches!(refused(stray), Err(ManifestError::Invalid(m)) if m.starts_with("rerank_template goes with")));
    let same = Manifest { rerank_template: Some(RerankTemplate { no: 9693, ..sample_template() }), ..manifest.clone() };
    assert!(matches!(refused(same), Err(ManifestError::Invalid(m)) if m.contains("same token")));
    let long = Manifest { rerank_template: Some(RerankTemplate { suffix: "x".repeat(MAX_PROMPT_BYTES + 1), ..sample_template() }), ..manifest.clone() };
    assert!(matches!(refused(long), Err(ManifestError::Invalid(m)) if m.contains("4096")));
    // The signature covers the template: a host cannot change the instruction.
    let publisher = SigningKey::from_bytes(&[3; 32]);
    let mut bytes = manifest.sign(&publisher);
    let at = bytes.windows(5).position(|w| w == b"Given").unwrap();
    bytes[at] = b'g';
    assert!(SignedManifest::decode(&bytes).unwrap().verify(&publisher.verifying_key()).is_err());
}

