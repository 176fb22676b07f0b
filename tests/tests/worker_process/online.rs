//! The worker as an Oblivious HTTP gateway, played by a host that relays, replays and tampers.

use protocol::ohttp::{self, KeyConfig};
use protocol::online::{self, ClientSecret, EMBEDDINGS_PATH};
use protocol::usage::{SignedUsageReceipt, UsageCommitment};
use protocol::FailedCheck;

use super::*;

const CANARY: &str = "canary 7f3a9c: the merger closes on Friday";

/// What the relay gets back for one encapsulated request.
#[derive(Debug)]
enum Relayed {
    Response(Vec<u8>),
    Refused(FailedCheck, String),
}

fn relay(connection: &mut UnixStream, request: u64, encapsulated: &[u8]) -> Relayed {
    write_frame(connection, &Message::OnlineRequest { request, encapsulated: encapsulated.to_vec() }).unwrap();
    connection.flush().unwrap();
    let mut response = Vec::new();
    loop {
        match read_frame(connection).unwrap().expect("worker closed the online connection") {
            Message::OnlineResponse { request: r, data, last } => {
                assert_eq!(r, request);
                response.extend_from_slice(&data);
                if last {
                    return Relayed::Response(response);
                }
            }
            Message::OnlineRefused { request: r, check, message } => {
                assert_eq!(r, request);
                return Relayed::Refused(check, message);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

struct Exchange {
    request: Vec<u8>,
    encapsulated: Vec<u8>,
    opener: ohttp::ResponseOpener,
}

fn exchange(config: &KeyConfig, body: &serde_json::Value, sent_ms: u64) -> Exchange {
    let request = online::encode_request("POST", EMBEDDINGS_PATH, body.to_string().as_bytes(), sent_ms, Some(ClientSecret([9; 32])));
    let (encapsulated, opener) = ohttp::encapsulate_request(config, &request).unwrap();
    Exchange { request, encapsulated, opener }
}

fn opened(exchange: &Exchange, relayed: Relayed) -> (u16, serde_json::Value, Vec<u8>) {
    let Relayed::Response(encapsulated) = relayed else { panic!("refused: {relayed:?}") };
    let plaintext = exchange.opener.open(&encapsulated).unwrap();
    let (status, body) = online::decode_response(&plaintext).unwrap();
    (status, serde_json::from_slice(&body).unwrap(), plaintext)
}

#[test]
fn online_requests_are_answered_as_batch_jobs_once_and_accounted_in_a_signed_usage_receipt() {
    let ReadyWorker { _dir, mut host, worker, fleet, manifest } = ready_worker();
    let config = KeyConfig::for_epoch(1, fleet.public_key());
    let texts = ["What is the capital of France?", CANARY];
    let mut connection = connect(&worker.socket, Channel::Online);

    // Answered, equal to the batch path's vectors for the same texts.
    let ask = exchange(&config, &serde_json::json!({"input": texts, "model": MODEL_ID}), now_ms());
    let relayed = relay(&mut connection, 1, &ask.encapsulated);
    let (status, body, response_plaintext) = opened(&ask, relayed);
    assert_eq!(status, 200, "{body}");
    let online_vectors: Vec<Vec<f32>> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    let client = ResultSecretKey::generate();
    let records: Vec<(&str, &[u8])> = vec![("q", texts[0].as_bytes()), ("c", texts[1].as_bytes())];
    let job = seal_job(&fleet, &client, manifest, &records);
    let (output, _) = run_job(&worker.socket, job.job_id, &job.bytes).unwrap();
    let (_, outputs) = open_output(&client, job.job_id, &output, 2);
    for (online_vector, record) in online_vectors.iter().zip(&outputs) {
        let OutputRecord::Embedding { vector, .. } = record else { panic!("{record:?}") };
        let cosine: f32 = online_vector.iter().zip(vector.to_f32()).map(|(a, b)| a * b).sum();
        assert!(cosine > 0.9999, "online and batch differ: cosine {cosine}");
    }
    let tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 10);

    // The same ciphertext again is a replay; so is one sent long ago.
    assert!(matches!(relay(&mut connection, 2, &ask.encapsulated), Relayed::Refused(FailedCheck::Replay, _)));
    let stale = exchange(&config, &serde_json::json!({"input": "x", "model": MODEL_ID}), now_ms() - 3_600_000);
    assert!(matches!(relay(&mut connection, 3, &stale.encapsulated), Relayed::Refused(FailedCheck::Replay, _)));
    // A flipped bit, or a key id naming no held epoch, does not open.
    let fresh = exchange(&config, &serde_json::json!({"input": "x", "model": MODEL_ID}), now_ms());
    let mut tampered = fresh.encapsulated.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(matches!(relay(&mut connection, 4, &tampered), Relayed::Refused(FailedCheck::Encapsulation, _)));
    let other_epoch = exchange(&KeyConfig::for_epoch(2, fleet.public_key()), &serde_json::json!({"input": "x", "model": MODEL_ID}), now_ms());
    assert!(matches!(relay(&mut connection, 5, &other_epoch.encapsulated), Relayed::Refused(FailedCheck::Encapsulation, m) if m.contains("key id 2")));

    // Wrong requests get OpenAI-shaped errors, encrypted to their sender.
    let unknown = exchange(&config, &serde_json::json!({"input": "x", "model": "nobody/nothing"}), now_ms());
    let (status, body, _) = opened(&unknown, relay(&mut connection, 6, &unknown.encapsulated));
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")));
    let narrow = exchange(&config, &serde_json::json!({"input": "x", "model": MODEL_ID, "dimensions": 128}), now_ms());
    let (status, body, _) = opened(&narrow, relay(&mut connection, 7, &narrow.encapsulated));
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("dimensions")));
    let headers = online::RequestHeaders { sent_ms: now_ms(), client: Some(ClientSecret([9; 32])), manifest: Some([1; 32]) };
    let request = online::encode_request_with("POST", EMBEDDINGS_PATH, br#"{"input":"x","model":"sentence-transformers/all-MiniLM-L6-v2"}"#, headers);
    let (encapsulated, opener) = ohttp::encapsulate_request(&config, &request).unwrap();
    let pinned = Exchange { request, encapsulated, opener };
    let (status, body, _) = opened(&pinned, relay(&mut connection, 10, &pinned.encapsulated));
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("model_manifest_mismatch")));
    let long = exchange(&config, &serde_json::json!({"input": "word ".repeat(600), "model": MODEL_ID}), now_ms());
    let (status, body, _) = opened(&long, relay(&mut connection, 8, &long.encapsulated));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")));
    let cut = exchange(&config, &serde_json::json!({"input": "word ".repeat(600), "model": MODEL_ID, "truncate": true, "encoding_format": "base64"}), now_ms());
    let (status, body, cut_plaintext) = opened(&cut, relay(&mut connection, 9, &cut.encapsulated));
    assert_eq!(status, 200);
    assert_eq!(body["data"][0]["embedding"].as_str().unwrap().len(), 2048, "base64 of 384 little-endian f32");

    // The usage receipt: two requests served, their tokens, a commitment the client recomputes.
    let mut control = connect(&worker.socket, Channel::Control);
    write_frame(&mut control, &Message::CollectUsage { flush: true }).unwrap();
    let mut receipts = Vec::new();
    loop {
        match read_frame(&mut control).unwrap().unwrap() {
            Message::UsageReceipt { receipt, attestation_document } => receipts.push((receipt, attestation_document)),
            Message::Status { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(receipts.len(), 1);
    let (receipt_bytes, document) = &receipts[0];
    assert_eq!(document, host.published.last().unwrap());
    let mut options = VerifyOptions::new(host.dev_root(), now_ms());
    options.require_binding = true;
    let verified = attestation::verify(document, &options).unwrap();
    let binding = UserDataBinding::decode(verified.document.user_data.as_deref().unwrap()).unwrap();
    let signed = SignedUsageReceipt::decode(receipt_bytes).unwrap();
    let usage = signed.verify(&VerifyingKey::from_bytes(&binding.receipt_public_key).unwrap()).unwrap();
    assert_eq!((usage.requests, usage.inputs, usage.client, usage.epoch), (2, 3, ClientSecret([9; 32]).label(), 1));
    assert_eq!(usage.manifest_hash, manifest);
    assert_eq!(usage.attestation_sha256, <[u8; 32]>::from(Sha256::digest(document)));
    let cut_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage.tokens, tokens + cut_tokens);
    let mut commitment = UsageCommitment::default();
    commitment.absorb(&ask.request, &response_plaintext);
    commitment.absorb(&cut.request, &cut_plaintext);
    assert_eq!(usage.commitment, commitment.0, "the client recomputes the commitment from its own exchanges");
    assert!(!String::from_utf8_lossy(receipt_bytes).contains("canary"));

    // Nothing left to collect; the ledger never sees a period twice.
    write_frame(&mut control, &Message::CollectUsage { flush: true }).unwrap();
    assert!(matches!(read_frame(&mut control).unwrap().unwrap(), Message::Status { .. }));
    let _ = &mut host;
}
