//! The enclave as an Oblivious HTTP gateway (docs/protocol.md §9): each request on an online
//! connection is opened with the fleet key of the epoch its key id names, checked against the
//! replay window, answered by the same engine as batch jobs, and encapsulated back. The host sees
//! ciphertext sizes and, for a request that cannot be opened or was replayed, the check refused.

pub mod replay;
pub mod usage;

use std::io::{Read, Write};
use std::sync::Mutex;

use protocol::frame::{self, FrameIoError, Message, MAX_DATA_LEN};
use protocol::ohttp::{self, ResponseSealer};
use protocol::online::{self, ApiError, Call, EmbeddingsCall, OnlineRequest, RerankCall};
use protocol::records::{ErrorCode, RerankInput};
use protocol::FailedCheck;
use protocol::envelope::{JobOptions, OutputKind};

use crate::inference::{EmbedOptions, InferenceError, RecordFailure};
use crate::worker::Worker;
use replay::ReplayCache;
use usage::{Answered, UsageBook};

/// What the online gateway remembers across connections (one per worker process).
#[derive(Default)]
pub struct OnlineState {
    pub replay: Mutex<ReplayCache>,
    pub usage: Mutex<UsageBook>,
}

/// A request refused before anything could be encrypted to its sender.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("no fleet key with OHTTP key id {0} is held")]
    UnknownKeyId(u8),
    #[error("{0}")]
    Encapsulation(#[from] ohttp::OhttpError),
    #[error("replay: {0}")]
    Replay(#[from] replay::ReplayRefusal),
}

impl Refusal {
    pub fn check(&self) -> FailedCheck {
        match self {
            Refusal::UnknownKeyId(_) | Refusal::Encapsulation(_) => FailedCheck::Encapsulation,
            Refusal::Replay(_) => FailedCheck::Replay,
        }
    }
}

/// Serves an online connection after its `Hello`: requests one at a time until the host closes.
pub fn serve<C: Read + Write>(worker: &Worker, state: &OnlineState, connection: &mut C) -> Result<(), FrameIoError> {
    while let Some(message) = frame::read_frame(connection)? {
        let Message::OnlineRequest { request, encapsulated } = message else {
            frame::write_frame(connection, &Message::Error { message: "expected OnlineRequest".into() })?;
            return Ok(());
        };
        match answer(worker, state, &encapsulated) {
            Ok(response) => {
                let mut chunks = response.chunks(MAX_DATA_LEN).peekable();
                while let Some(chunk) = chunks.next() {
                    let last = chunks.peek().is_none();
                    frame::write_frame(connection, &Message::OnlineResponse { request, data: chunk.to_vec(), last })?;
                }
            }
            Err(refusal) => {
                tracing::info!(check = refusal.check().as_str(), %refusal, "online request refused");
                let refused = Message::OnlineRefused { request, check: refusal.check(), message: refusal.to_string() };
                frame::write_frame(connection, &refused)?;
            }
        }
        connection.flush()?;
    }
    Ok(())
}

/// Opens, checks, computes and encapsulates one request.
pub fn answer(worker: &Worker, state: &OnlineState, encapsulated: &[u8]) -> Result<Vec<u8>, Refusal> {
    let key_id = ohttp::request_key_id(encapsulated)?;
    let (epoch, held) = worker
        .epochs()
        .into_iter()
        .filter(|e| ohttp::key_id(*e) == key_id)
        .find_map(|e| worker.epoch(e).map(|held| (e, held)))
        .ok_or(Refusal::UnknownKeyId(key_id))?;
    let (plaintext, sealer) = ohttp::decapsulate_request(&held.secret, key_id, encapsulated)?;
    let now = worker.now_ms();
    let request = match online::decode_request(&plaintext) {
        Ok(request) => request,
        Err(error) => {
            let error = ApiError::invalid("input", "invalid_request", error.to_string());
            return seal(&sealer, &online::encode_response(error.status, &error.to_json()));
        }
    };
    lock(&state.replay).admit(sealer.encapsulated_key(), request.sent_ms, now)?;
    if let Ok(call) = &request.call
        && !lock(&state.usage).admits(request.client, call.model(), call.precision(), epoch, now)
    {
        let error = ApiError {
            status: 503,
            kind: "server_error",
            param: None,
            code: Some("usage_book_full"),
            message: "the enclave's usage book is full until the host collects usage receipts; nothing was computed".into(),
        };
        return seal(&sealer, &online::encode_response(error.status, &error.to_json()));
    }
    let (status, body, served) = match respond(worker, &request) {
        Ok((body, served)) => (200, body, Some(served)),
        Err(error) => (error.status, error.to_json(), None),
    };
    let Some(served) = served else {
        return seal(&sealer, &online::encode_response(status, &body));
    };
    // One lock from the slot to the record: the answer names the place it is recorded at.
    let mut usage = lock(&state.usage);
    let (start_ms, index) = usage.slot(request.client, &served.model_id, served.precision, epoch, now);
    let accounted = online::AccountedAs {
        receipt_key_id: hex::encode(protocol::keys::key_id(&worker.receipt_key().verifying_key().to_bytes())),
        start_ms,
        model: served.model_id.clone(),
        precision: served.precision.as_str().to_owned(),
        epoch,
        index,
    };
    let response = online::encode_response_accounted(status, &body, Some(&accounted));
    {
        let answered = Answered {
            client: request.client,
            model_id: &served.model_id,
            manifest_hash: served.manifest_hash,
            precision: served.precision,
            epoch,
            inputs: served.inputs,
            tokens: served.tokens,
            request: &plaintext,
            response: &response,
        };
        usage.record(answered, now);
    }
    drop(usage);
    seal(&sealer, &response)
}

fn seal(sealer: &ResponseSealer, response: &[u8]) -> Result<Vec<u8>, Refusal> {
    Ok(sealer.seal(response)?)
}

/// What a successful request is accounted as.
struct Served {
    model_id: String,
    manifest_hash: [u8; 32],
    precision: protocol::envelope::Precision,
    inputs: u64,
    tokens: u64,
}

fn respond(worker: &Worker, request: &OnlineRequest) -> Result<(Vec<u8>, Served), ApiError> {
    match request.call.as_ref().map_err(Clone::clone)? {
        Call::Embeddings(call) => embed(worker, call, request.manifest),
        Call::Rerank(call) => rerank(worker, call, request.manifest),
    }
}

/// The model a request names, as the client checked it (`ephem-manifest`).
fn loaded(worker: &Worker, model: &str, expected_manifest: Option<[u8; 32]>) -> Result<std::sync::Arc<crate::worker::LoadedModel>, ApiError> {
    let loaded = worker.model(model).ok_or_else(|| ApiError {
        status: 404,
        ..ApiError::invalid("model", "model_not_found", format!("model {model} is not loaded in this enclave"))
    })?;
    if let Some(expected) = expected_manifest.filter(|m| *m != loaded.manifest_hash) {
        let message = format!(
            "model {model}: the client checked manifest {}, this enclave runs {}",
            hex::encode(expected),
            hex::encode(loaded.manifest_hash)
        );
        return Err(ApiError { status: 409, ..ApiError::invalid("model", "model_manifest_mismatch", message) });
    }
    Ok(loaded)
}

/// A request's options refused by the model, by the field that asked for them.
fn refused_options(model: &str, error: InferenceError) -> ApiError {
    match error {
        InferenceError::UnknownPrompt(_) => ApiError::invalid("prompt_name", "unknown_prompt_name", error.to_string()),
        InferenceError::DimensionsNotOffered { .. } => ApiError::invalid("dimensions", "unsupported_dimensions", format!("{model}: {error}")),
        InferenceError::OutputNotOffered { .. } => ApiError::invalid("model", "unsupported_output", format!("{model}: {error}")),
        _ => ApiError::invalid("precision", "unsupported_precision", error.to_string()),
    }
}

fn input_error(what: &str, index: usize, failure: &RecordFailure, param: &'static str) -> ApiError {
    let code = if failure.code == ErrorCode::TooManyTokens { "context_length_exceeded" } else { "invalid_input" };
    ApiError::invalid(param, code, format!("{what} {index}: {}", failure.message))
}

fn embed(worker: &Worker, call: &EmbeddingsCall, expected_manifest: Option<[u8; 32]>) -> Result<(Vec<u8>, Served), ApiError> {
    let model = loaded(worker, &call.model, expected_manifest)?;
    let asked = JobOptions {
        truncate: call.truncate,
        precision: call.precision,
        prompt: model.manifest.prompts.chosen(call.prompt_name.as_deref()).map(str::to_owned),
        dimensions: call.dimensions,
        ..JobOptions::default()
    };
    let options = EmbedOptions::for_job(&asked, model.engine.embedder(), &model.manifest).map_err(|e| refused_options(&call.model, e))?;
    let mut vectors = Vec::with_capacity(call.inputs.len());
    let mut tokens = 0u64;
    for (index, result) in model.engine.embed_window(&call.inputs, &options).into_iter().enumerate() {
        let embedding = result.map_err(|failure| input_error("input", index, &failure, "input"))?;
        tokens += u64::from(embedding.tokens);
        vectors.push(embedding.vector);
    }
    let body = online::embeddings_body(&call.model, &vectors, tokens, call.encoding);
    let served = Served {
        model_id: call.model.clone(),
        manifest_hash: model.manifest_hash,
        precision: call.precision,
        inputs: vectors.len() as u64,
        tokens,
    };
    Ok((body, served))
}

/// A cross-encoder's scores for the request's documents, the `top_n` best answered; every
/// document is one input of the usage account.
fn rerank(worker: &Worker, call: &RerankCall, expected_manifest: Option<[u8; 32]>) -> Result<(Vec<u8>, Served), ApiError> {
    let model = loaded(worker, &call.model, expected_manifest)?;
    let asked = JobOptions { truncate: call.truncate, precision: call.precision, normalize: false, output: OutputKind::Scores, ..JobOptions::default() };
    let options = EmbedOptions::for_job(&asked, model.engine.embedder(), &model.manifest).map_err(|e| refused_options(&call.model, e))?;
    let text = RerankInput { query: call.query.clone(), documents: call.documents.clone() }.to_text();
    let scored = model.engine.rerank_window(&[text.as_slice()], &options).remove(0).map_err(|failure| {
        // The failure names its document ("document N: …"), or the query.
        ApiError::invalid("documents", if failure.code == ErrorCode::TooManyTokens { "context_length_exceeded" } else { "invalid_input" }, failure.message)
    })?;
    let tokens = u64::from(scored.tokens);
    let body = online::rerank_body(&call.model, &scored.vector, call.top_n, tokens);
    let served = Served {
        model_id: call.model.clone(),
        manifest_hash: model.manifest_hash,
        precision: call.precision,
        inputs: call.documents.len() as u64,
        tokens,
    };
    Ok((body, served))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
