use super::*;

fn call(body: &str) -> Result<EmbeddingsCall, ApiError> {
    let secret = ClientSecret([5; 32]);
    let request = decode_request(&encode_request("POST", EMBEDDINGS_PATH, body.as_bytes(), 1_700, Some(secret.clone()))).unwrap();
    assert_eq!((request.sent_ms, request.client), (1_700, secret.label()));
    request.call.map(|call| match call {
        Call::Embeddings(call) => call,
        Call::Rerank(call) => panic!("not an embeddings call: {call:?}"),
    })
}

#[test]
fn openai_requests_are_read_as_openai_sends_them() {
    let one = call(r#"{"input":"a query","model":"m/x"}"#).unwrap();
    assert_eq!(one.inputs, ["a query"]);
    assert_eq!((one.encoding, one.precision, one.truncate, one.dimensions), (Encoding::Float, Precision::Fp32, false, None));
    let many = call(r#"{"input":["a","b"],"model":"m/x","encoding_format":"base64","user":"u","dimensions":384,"precision":"bf16","truncate":true}"#).unwrap();
    assert_eq!(many.inputs, ["a", "b"]);
    assert_eq!((many.encoding, many.precision, many.truncate, many.dimensions), (Encoding::Base64, Precision::Bf16, true, Some(384)));
    assert_eq!(many.prompt_name, None, "absent: the model's default prompt");
    let prompted = call(r#"{"input":"q","model":"m/x","prompt_name":"query","dimensions":128}"#).unwrap();
    assert_eq!((prompted.prompt_name.as_deref(), prompted.dimensions), (Some("query"), Some(128)));
}

#[test]
fn bad_requests_get_openai_errors_naming_the_parameter() {
    let cases = [
        (r#"{"input":[1,2,3],"model":"m"}"#, "input", "unsupported_input"),
        (r#"{"input":[],"model":"m"}"#, "input", "invalid_input"),
        (r#"{"input":7,"model":"m"}"#, "input", "invalid_input"),
        (r#"{"input":"x","model":""}"#, "model", "invalid_model"),
        (r#"{"input":"x","model":"m","encoding_format":"int"}"#, "encoding_format", "invalid_encoding_format"),
        (r#"{"input":"x","model":"m","precision":"fp64"}"#, "precision", "invalid_precision"),
        (r#"{"input":"x","model":"m","dimensions":0}"#, "dimensions", "invalid_dimensions"),
        (r#"{"input":"x","model":"m","dimensions":99999999999}"#, "dimensions", "invalid_dimensions"),
        (r#"{"input":"x","model":"m","prompt_name":""}"#, "prompt_name", "invalid_prompt_name"),
        (r#"{"input":"x","model":"m","prompt_name":"a\nb"}"#, "prompt_name", "invalid_prompt_name"),
        (r#"{"input":"x","model":"m","surprise":1}"#, "input", "invalid_json"),
        ("not json", "input", "invalid_json"),
    ];
    for (body, param, code) in cases {
        let error = call(body).unwrap_err();
        assert_eq!((error.status, error.param, error.code), (400, Some(param), Some(code)), "{body}");
        let json: Value = serde_json::from_slice(&error.to_json()).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
    }
    let too_many = format!(r#"{{"input":[{}],"model":"m"}}"#, vec!["\"t\""; MAX_INPUTS + 1].join(","));
    assert_eq!(call(&too_many).unwrap_err().code, Some("too_many_inputs"));
    let huge = format!(r#"{{"input":"{}","model":"m"}}"#, "x".repeat(MAX_BODY));
    assert_eq!(call(&huge).unwrap_err().code, Some("request_too_large"));
}

#[test]
fn the_manifest_the_client_checked_travels_inside() {
    let headers = RequestHeaders { sent_ms: 3, client: None, manifest: Some([0xab; 32]) };
    let request = decode_request(&encode_request_with("POST", EMBEDDINGS_PATH, b"{}", headers)).unwrap();
    assert_eq!(request.manifest, Some([0xab; 32]));
    assert_eq!(decode_request(&encode_request("POST", EMBEDDINGS_PATH, b"{}", 3, None)).unwrap().manifest, None);
}

#[test]
fn only_post_embeddings_is_served() {
    let request = decode_request(&encode_request("GET", "/v1/models", b"", 1, None)).unwrap();
    assert_eq!(request.call.unwrap_err().status, 404);
}

#[test]
fn requests_without_a_sent_time_or_with_a_bad_label_are_not_requests() {
    assert!(matches!(decode_request(b"\x00garbage"), Err(RequestFormError::NotBinaryHttp(_))));
    let mut message = bhttp::Message::request(b"POST".to_vec(), b"https".to_vec(), b"a".to_vec(), EMBEDDINGS_PATH.as_bytes().to_vec());
    let mut bytes = Vec::new();
    message.write_bhttp(bhttp::Mode::KnownLength, &mut bytes).unwrap();
    assert_eq!(decode_request(&bytes), Err(RequestFormError::SentTime));
    message.put_header(SENT_HEADER, "5");
    message.put_header(CLIENT_SECRET_HEADER, "zz");
    let mut bytes = Vec::new();
    message.write_bhttp(bhttp::Mode::KnownLength, &mut bytes).unwrap();
    assert_eq!(decode_request(&bytes), Err(RequestFormError::ClientLabel));
}

#[test]
fn a_label_is_charged_only_by_the_holder_of_its_secret() {
    let victim = ClientSecret([7; 32]);
    let label = victim.label();
    // Whoever knows only the victim's label (every usage row shows it) cannot send it: the bare
    // label header is refused, and a label sent as a secret hashes to another label.
    let mut message = bhttp::Message::request(b"POST".to_vec(), b"https".to_vec(), b"a".to_vec(), EMBEDDINGS_PATH.as_bytes().to_vec());
    message.put_header(SENT_HEADER, "5");
    message.put_header(RETIRED_CLIENT_HEADER, label.to_hex());
    let mut bytes = Vec::new();
    message.write_bhttp(bhttp::Mode::KnownLength, &mut bytes).unwrap();
    assert_eq!(decode_request(&bytes), Err(RequestFormError::ClientLabel));
    let posing = decode_request(&encode_request("POST", EMBEDDINGS_PATH, b"{}", 5, Some(ClientSecret(label.0)))).unwrap();
    assert_ne!(posing.client, label);
    let genuine = decode_request(&encode_request("POST", EMBEDDINGS_PATH, b"{}", 5, Some(victim))).unwrap();
    assert_eq!(genuine.client, label);
    assert_eq!(decode_request(&encode_request("POST", EMBEDDINGS_PATH, b"{}", 5, None)).unwrap().client, ClientLabel::ANONYMOUS);
}

#[test]
fn responses_round_trip_and_base64_is_little_endian_f32() {
    let vectors = vec![vec![1.0f32, -0.5], vec![0.25, 3.0e-8]];
    let float: Value = serde_json::from_slice(&embeddings_body("m", &vectors, 9, Encoding::Float)).unwrap();
    assert_eq!(float["data"][1]["embedding"][1].as_f64().unwrap() as f32, 3.0e-8);
    assert_eq!(float["usage"]["prompt_tokens"], 9);
    let b64: Value = serde_json::from_slice(&embeddings_body("m", &vectors, 9, Encoding::Base64)).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
    assert_eq!(bytes, [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
    let (status, body) = decode_response(&encode_response(200, b"{}")).unwrap();
    assert_eq!((status, body.as_slice()), (200, b"{}".as_slice()));
    assert!(decode_response(&encode_request("POST", "/", b"", 1, None)).is_err());
}

#[test]
fn requests_and_responses_are_padded_to_their_bucket() {
    let body = |text: &str| json!({"model": "m", "input": [text]}).to_string();
    let short = encode_request("POST", EMBEDDINGS_PATH, body(&"a".repeat(10)).as_bytes(), 1_700, Some(ClientSecret([1; 32])));
    let long = encode_request("POST", EMBEDDINGS_PATH, body(&"a".repeat(1_000)).as_bytes(), 1_700, Some(ClientSecret([1; 32])));
    assert_eq!(short.len(), 4096, "texts of 10 and 1,000 bytes share a bucket");
    assert_eq!(long.len(), short.len());
    let Ok(Call::Embeddings(call)) = decode_request(&long).unwrap().call else { panic!("an embeddings call") };
    assert_eq!(call.inputs, ["a".repeat(1_000)]);
    // Float responses whose values print to different lengths: one size.
    let answer = |v: f32| encode_response(200, &embeddings_body("m", &[vec![v; 384]], 3, Encoding::Float));
    assert_eq!(answer(0.5).len(), answer(-0.123_456_79).len());
    assert_eq!(decode_response(&answer(0.5)).unwrap().0, 200);
    // Padding is zeros only; anything else after the message is refused by name.
    let mut tampered = short.clone();
    *tampered.last_mut().unwrap() = 1;
    assert_eq!(decode_request(&tampered).unwrap_err(), RequestFormError::Padding);
    let mut tampered = answer(0.5);
    *tampered.last_mut().unwrap() = 7;
    assert_eq!(decode_response(&tampered).unwrap_err(), RequestFormError::Padding);
    // The buckets.
    assert_eq!([padded_len(1), padded_len(4097), padded_len(300 * 1024)], [4096, 8192, 320 * 1024]);
}

#[test]
fn float_answers_read_back_the_same_f32_at_one_width() {
    let values = [0.0f32, -0.0, 1.0, -1.0, 0.1, -0.123_456_79, 3.0e-8, -2.5e-38, f32::MIN_POSITIVE, 9.999_999e-1, 1.0e10];
    let body = embeddings_body("m", &[values.to_vec()], 1, Encoding::Float);
    let parsed: Value = serde_json::from_slice(&body).unwrap();
    let read: Vec<f32> = parsed["data"][0]["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    for (a, b) in values.iter().zip(&read) {
        assert_eq!(a.to_bits() & 0x7fff_ffff, b.to_bits() & 0x7fff_ffff, "{a} read back as {b}");
    }
    let text = std::str::from_utf8(&body).unwrap();
    let start = text.find(r#""embedding":["#).unwrap() + r#""embedding":["#.len();
    let array = &text[start..start + text[start..].find(']').unwrap()];
    assert!(array.split(',').all(|n| n.len() == FLOAT_WIDTH), "{array}");
    assert_eq!(parsed["model"], "m");
    assert_eq!(parsed["usage"]["total_tokens"], 1);
}

fn rerank(body: &str) -> Result<RerankCall, ApiError> {
    match decode_request(&encode_request("POST", RERANK_PATH, body.as_bytes(), 1_700, None)).unwrap().call? {
        Call::Rerank(call) => Ok(call),
        Call::Embeddings(call) => panic!("not a rerank call: {call:?}"),
    }
}

#[test]
fn rerank_requests_in_the_shared_shape_and_refusals_by_field() {
    let call = rerank(r#"{"model":"m/r","query":"q","documents":["a",{"text":"b"}],"top_n":5,"return_documents":false}"#).unwrap();
    assert_eq!((call.query.as_str(), call.documents.as_slice(), call.top_n), ("q", ["a".to_owned(), "b".to_owned()].as_slice(), Some(2)));
    for (body, param) in [
        (r#"{"model":"m/r","query":"q","documents":[]}"#, "documents"),
        (r#"{"model":"m/r","query":"q","documents":[1]}"#, "documents"),
        (r#"{"model":"m/r","query":"q","documents":["a"],"top_n":0}"#, "top_n"),
        (r#"{"model":"m/r","query":"q","documents":["a"],"return_documents":true}"#, "return_documents"),
        (r#"{"model":"m/r","query":"q","documents":["a"],"rank_fields":["x"]}"#, "documents"),
        (r#"{"model":"m r","query":"q","documents":["a"]}"#, "model"),
    ] {
        assert_eq!(rerank(body).unwrap_err().param, Some(param), "{body}");
    }
}

#[test]
fn rerank_answers_are_ordered_cut_and_their_length_does_not_say_which_documents_won() {
    let body = |scores: &[f32], top_n| String::from_utf8(rerank_body("m/r", scores, top_n, 9)).unwrap();
    let answer: Value = serde_json::from_str(&body(&[0.1, 0.9, 0.5, 0.9], None)).unwrap();
    let ranked: Vec<(u64, f64)> = answer["results"].as_array().unwrap().iter().map(|r| (r["index"].as_u64().unwrap(), r["relevance_score"].as_f64().unwrap())).collect();
    assert_eq!(ranked.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 3, 2, 0], "by score, ties in document order");
    assert_eq!(answer["usage"]["total_tokens"], 9);
    let mut scores = vec![0.0f32; 12];
    scores[3] = 1.0;
    let first = body(&scores, Some(1));
    scores[3] = 0.0;
    scores[11] = 1.0;
    assert_eq!(first.len(), body(&scores, Some(1)).len(), "document 3 or 11 on top: the same length");
}
