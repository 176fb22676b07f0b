use super::*;

pub(crate) fn job_header(fleet: &FleetPublicKey, client: &ResultPublicKey) -> JobHeader {
    JobHeader {
        fleet_key_id: fleet.key_id(),
        epoch: 3,
        model_id: "sentence-transformers/all-MiniLM-L6-v2".into(),
        manifest_hash: [0x11; 32],
        options: JobOptions::default(),
        result_public_key: client.to_bytes(),
        record_count: 2,
        created_ms: 1_700_000_000_000,
    }
}

fn seal_all(sealed: Sealed, plaintext: &[u8]) -> Vec<u8> {
    let Sealed { mut preamble, mut sealer, .. } = sealed;
    sealer.push(plaintext, &mut preamble).unwrap();
    sealer.finish(&mut preamble).unwrap();
    preamble
}

fn open_all(bytes: &[u8], fleet: &FleetSecretKey, claimed: Option<JobId>) -> Result<Vec<u8>, String> {
    let (preamble, used) = Preamble::parse_complete(bytes, StreamKind::JobInput).map_err(|e| e.to_string())?;
    let mut opened = open_job(&preamble, fleet, claimed).map_err(|e| format!("{e:?}"))?;
    let mut out = Vec::new();
    opened.opener.push(&bytes[used..], &mut out).map_err(|e| format!("{e:?}"))?;
    opened.opener.finish(&mut out).map_err(|e| format!("{e:?}"))?;
    Ok(out)
}

#[test]
fn job_round_trip_and_job_id() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let header = job_header(&fleet.public_key(), &client.public_key());
    let sealed = seal_job(&header, &fleet.public_key()).unwrap();
    let job_id = JobId(sealed.stream_id);
    let bytes = seal_all(sealed, b"hello records");
    assert_eq!(open_all(&bytes, &fleet, Some(job_id)).unwrap(), b"hello records");
    let other = JobId([0; 16]);
    assert!(open_all(&bytes, &fleet, Some(other)).unwrap_err().contains("JobIdMismatch"));
}

#[test]
fn wrong_key_and_tampered_header_are_named() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let header = job_header(&fleet.public_key(), &client.public_key());
    let bytes = seal_all(seal_job(&header, &fleet.public_key()).unwrap(), b"x");
    let stranger = FleetSecretKey::generate();
    assert!(open_all(&bytes, &stranger, None).unwrap_err().contains("WrongRecipientKey"));

    // Change the epoch inside the header (3 → 4): still well-formed, no longer authentic.
    let mut tampered = bytes.clone();
    let header_bytes = header.to_bytes();
    let at = 8 + header_bytes.iter().position(|&b| b == 0x03).unwrap();
    tampered[at] = 0x04;
    assert!(open_all(&tampered, &fleet, None).unwrap_err().contains("HeaderAuthentication"));

    // Flip a byte of the confirmation.
    let mut tampered = bytes.clone();
    tampered[8 + header_bytes.len() + 65] ^= 1;
    assert!(open_all(&tampered, &fleet, None).unwrap_err().contains("HeaderAuthentication"));
}

#[test]
fn chunks_from_another_job_are_named() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let header = job_header(&fleet.public_key(), &client.public_key());
    let a = seal_all(seal_job(&header, &fleet.public_key()).unwrap(), b"first job");
    let b = seal_all(seal_job(&header, &fleet.public_key()).unwrap(), b"other job");
    let split = a.len() - (16 + 9 + 16);
    let mut spliced = a[..split].to_vec();
    spliced.extend_from_slice(&b[split..]);
    let error = open_all(&spliced, &fleet, None).unwrap_err();
    assert!(error.contains("SplicedChunk"), "{error}");
}

#[test]
fn result_round_trip_and_wrong_client() {
    let client = ResultSecretKey::generate();
    let header = ResultHeader { job_id: JobId([5; 16]), result_key_id: client.public_key().key_id(), attempt: 1, created_ms: 5 };
    let sealed = seal_result(&header, &client.public_key()).unwrap();
    let bytes = seal_all(sealed, b"vectors");
    let (preamble, used) = Preamble::parse_complete(&bytes, StreamKind::JobResult).unwrap();
    let mut opened = open_result(&preamble, &client, Some(JobId([5; 16]))).unwrap();
    let mut out = Vec::new();
    opened.opener.push(&bytes[used..], &mut out).unwrap();
    opened.opener.finish(&mut out).unwrap();
    assert_eq!(out, b"vectors");
    let other = ResultSecretKey::generate();
    assert!(matches!(open_result(&preamble, &other, None), Err(EnvelopeError::WrongRecipientKey { .. })));
    // The host hands over another of the same client's results for this job: named, not opened.
    assert!(matches!(open_result(&preamble, &client, Some(JobId([6; 16]))), Err(EnvelopeError::JobIdMismatch { .. })));
    assert!(matches!(
        Preamble::parse_complete(&bytes, StreamKind::JobInput),
        Err(EnvelopeError::WrongKind { .. })
    ));
}

#[test]
fn pkcs8_fleet_key_derives_its_public_key() {
    use p256::pkcs8::EncodePrivateKey;
    let secret = p256::SecretKey::from_slice(&[0x42; 32]).unwrap();
    let der = secret.to_pkcs8_der().unwrap();
    let fleet = FleetSecretKey::from_pkcs8_der(der.as_bytes()).unwrap();
    assert_eq!(fleet.public_key().to_bytes(), secret.public_key().to_sec1_bytes().to_vec());
}

#[test]
fn job_ids_parse_only_canonical_hex() {
    let id = JobId([0xab; 16]);
    assert_eq!(JobId::from_hex(&id.to_hex()), Some(id));
    assert_eq!(JobId::from_hex(&id.to_hex().to_uppercase()), None);
    assert_eq!(JobId::from_hex("abcd"), None);
}

#[test]
fn job_ids_travel_as_their_hex_text() {
    let id = JobId([0xab; 16]);
    assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{}\"", id.to_hex()));
    assert_eq!(serde_json::from_str::<JobId>(&format!("\"{}\"", id.to_hex())).unwrap(), id);
    for bad in ["\"ABABABABABABABABABABABABABABABAB\"", "\"abcd\"", "\"\"", "7"] {
        assert!(serde_json::from_str::<JobId>(bad).is_err(), "{bad}");
    }
    assert_eq!("abcd".parse::<JobId>(), Err(InvalidJobId("abcd".into())));
}

#[test]
fn prompt_and_dimensions_are_sealed_in_the_header_and_absent_when_unset() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let plain = job_header(&fleet.public_key(), &client.public_key());
    let bytes = plain.to_bytes();
    assert!(!String::from_utf8_lossy(&bytes).contains("prompt"), "unset: encoded as before the fields existed");
    assert!(!String::from_utf8_lossy(&bytes).contains("dimensions"));

    let mut shaped = plain.clone();
    shaped.options.prompt = Some("query".into());
    shaped.options.dimensions = Some(128);
    let decoded = JobHeader::from_bytes(&shaped.to_bytes()).unwrap();
    assert_eq!(decoded.options, shaped.options);
    assert_eq!(crate::cbor::decode_deterministic(&shaped.to_bytes()).map(|_| ()), Ok(()));

    // Bytes a tenant's tool could write that no client would: refused by field.
    let refused = |edit: fn(&mut JobOptions)| {
        let mut header = plain.clone();
        edit(&mut header.options);
        JobHeader::from_bytes(&header.to_bytes()).unwrap_err()
    };
    assert_eq!(refused(|o| o.prompt = Some(String::new())), EnvelopeError::HeaderInvalid("prompt"));
    assert_eq!(refused(|o| o.prompt = Some("\n".into())), EnvelopeError::HeaderInvalid("prompt"));
    assert_eq!(refused(|o| o.dimensions = Some(0)), EnvelopeError::HeaderInvalid("dimensions"));
    let too_many = crate::records::MAX_DIMENSIONS as u32 + 1;
    let mut header = plain.clone();
    header.options.dimensions = Some(too_many);
    assert_eq!(JobHeader::from_bytes(&header.to_bytes()).unwrap_err(), EnvelopeError::HeaderInvalid("dimensions"));
}

#[test]
fn sparse_output_is_sealed_in_the_header_and_absent_when_dense() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let plain = job_header(&fleet.public_key(), &client.public_key());
    let bytes = plain.to_bytes();
    assert!(!String::from_utf8_lossy(&bytes).contains("output"), "dense: encoded as before the field existed");
    assert!(!String::from_utf8_lossy(&bytes).contains("top_k"));

    let mut sparse = plain.clone();
    sparse.options.output = OutputKind::Sparse;
    sparse.options.normalize = false;
    sparse.options.top_k = Some(64);
    assert_eq!(JobHeader::from_bytes(&sparse.to_bytes()).unwrap().options, sparse.options);

    let refused = |edit: fn(&mut JobOptions)| {
        let mut header = sparse.clone();
        edit(&mut header.options);
        JobHeader::from_bytes(&header.to_bytes()).unwrap_err()
    };
    assert_eq!(refused(|o| o.top_k = Some(0)), EnvelopeError::HeaderInvalid("top_k"));
    assert_eq!(
        refused(|o| {
            o.output = OutputKind::Dense;
        }),
        EnvelopeError::HeaderInvalid("top_k: for sparse output only")
    );
    let mixed = EnvelopeError::HeaderInvalid("output: sparse weights are f32 at the model's own dimensions");
    assert_eq!(refused(|o| o.dtype = OutputDtype::F16), mixed);
    assert_eq!(refused(|o| o.dimensions = Some(16)), mixed);
    // Scores are f32, one per document: a tenant's tool cannot ask them shaped as vectors.
    let scores = EnvelopeError::HeaderInvalid("output: scores are f32, one per document");
    let as_scores = |edit: fn(&mut JobOptions)| {
        let mut header = plain.clone();
        header.options.output = OutputKind::Scores;
        header.options.normalize = false;
        edit(&mut header.options);
        JobHeader::from_bytes(&header.to_bytes())
    };
    assert_eq!(as_scores(|_| {}).unwrap().options.output, OutputKind::Scores);
    assert_eq!(as_scores(|o| o.dtype = OutputDtype::Binary).unwrap_err(), scores);
    assert_eq!(as_scores(|o| o.dimensions = Some(16)).unwrap_err(), scores);
    assert_eq!(as_scores(|o| o.top_k = Some(3)).unwrap_err(), EnvelopeError::HeaderInvalid("top_k: for sparse output only"));
    // "dense" is never written: a header that spells it out is not one a client makes.
    let mut map = match crate::cbor::decode_deterministic(&plain.to_bytes()).unwrap() {
        ciborium::Value::Map(map) => map,
        _ => unreachable!(),
    };
    for (key, value) in map.iter_mut() {
        if key.as_text() == Some("options")
            && let ciborium::Value::Map(options) = value
        {
            options.push((ciborium::Value::Text("output".into()), ciborium::Value::Text("dense".into())));
            options.sort_by(|a, b| crate::cbor::encode(&a.0).cmp(&crate::cbor::encode(&b.0)));
        }
    }
    let spelled = crate::cbor::encode(&ciborium::Value::Map(map));
    assert_eq!(JobHeader::from_bytes(&spelled).unwrap_err(), EnvelopeError::HeaderInvalid("output"));
}

#[test]
fn multivector_output_carries_its_record_cap_and_nothing_else() {
    let fleet = FleetSecretKey::generate();
    let client = ResultSecretKey::generate();
    let plain = job_header(&fleet.public_key(), &client.public_key());
    assert!(!String::from_utf8_lossy(&plain.to_bytes()).contains("max_record_bytes"), "dense: encoded as before the field existed");
    let mut multi = plain.clone();
    multi.options.output = OutputKind::MultiVector;
    multi.options.normalize = false;
    multi.options.max_record_bytes = Some(1 << 20);
    assert_eq!(JobHeader::from_bytes(&multi.to_bytes()).unwrap().options, multi.options);

    let refused = |edit: fn(&mut JobOptions)| {
        let mut header = multi.clone();
        edit(&mut header.options);
        JobHeader::from_bytes(&header.to_bytes()).unwrap_err()
    };
    let cap = EnvelopeError::HeaderInvalid("max_record_bytes: present exactly for multivector output");
    assert_eq!(refused(|o| o.max_record_bytes = None), cap);
    assert_eq!(refused(|o| o.output = OutputKind::Dense), cap);
    assert_eq!(refused(|o| o.output = OutputKind::Sparse), cap);
    assert_eq!(refused(|o| o.max_record_bytes = Some(0)), EnvelopeError::HeaderInvalid("max_record_bytes"));
    assert_eq!(refused(|o| o.max_record_bytes = Some(crate::envelope::MAX_RECORD_BYTES + 1)), EnvelopeError::HeaderInvalid("max_record_bytes"));
    assert_eq!(refused(|o| o.top_k = Some(8)), EnvelopeError::HeaderInvalid("top_k: for sparse output only"));
    let mixed = EnvelopeError::HeaderInvalid("output: multi-vectors are f32 at the model's own dimensions");
    assert_eq!(refused(|o| o.dtype = OutputDtype::F16), mixed);
    assert_eq!(refused(|o| o.dimensions = Some(8)), mixed);
}
