//! What travels inside an Oblivious HTTP request to the enclave (docs/protocol.md §9.2): a Binary
//! HTTP (RFC 9292) `POST /v1/embeddings` whose body is OpenAI's embeddings request, answered by a
//! Binary HTTP response whose body is OpenAI's embeddings response or error object.
//!
//! Two headers travel inside the encryption, so the relay never sees them:
//! - `ephem-sent-ms`: when the client sent the request (ms since the UNIX epoch); the gateway
//!   refuses one outside its replay window;
//! - `ephem-client-secret`: 32 bytes (hex) only the client knows; the gateway accounts the
//!   request under the label SHA-256(label prefix ‖ secret) ([`ClientSecret::label`]), so a
//!   request can be charged to a label only by whoever holds its secret;
//! - `ephem-manifest` (optional): the SHA-256 (hex) of the signed model manifest the client
//!   checked; the gateway answers 409 if the model it runs is another (as a job header's
//!   manifest hash).
//!
//! Both messages are padded with zero bytes (RFC 9292 §3.8) to a size bucket ([`padded_len`]), so
//! the relay sees the bucket of a request or response, not its length.

use std::io::Cursor;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::envelope::{valid_model_id, Precision};

pub const EMBEDDINGS_PATH: &str = "/v1/embeddings";
/// Reranking by a cross-encoder, in the request and response shape the rerank APIs share
/// (`query`, `documents`, `top_n` → `results` of `index` and `relevance_score`).
pub const RERANK_PATH: &str = "/v1/rerank";
pub const SENT_HEADER: &str = "ephem-sent-ms";
pub const CLIENT_SECRET_HEADER: &str = "ephem-client-secret";
/// The header that once carried a bare label; refused, so an old client is never silently
/// accounted as anonymous.
pub const RETIRED_CLIENT_HEADER: &str = "ephem-client";
const LABEL_PREFIX: &[u8] = b"ephem-batch/v1 client label";
pub const MANIFEST_HEADER: &str = "ephem-manifest";
/// In a 200 answer: where the gateway accounted the request ([`AccountedAs`], JSON).
pub const USAGE_HEADER: &str = "ephem-usage";
/// Inputs in one request.
pub const MAX_INPUTS: usize = 256;
/// Bytes of one request's JSON body.
pub const MAX_BODY: usize = 256 * 1024;

/// Who a request's usage is accounted to (docs/protocol.md §9.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientLabel(pub [u8; 32]);

/// What a client proves its label with: sent only inside the encryption, so the relay never
/// sees it, and the label it hashes to is all that usage receipts and the ledger show.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientSecret(pub [u8; 32]);

impl ClientSecret {
    /// The label this secret's requests are accounted under.
    pub fn label(&self) -> ClientLabel {
        use sha2::{Digest, Sha256};
        ClientLabel(Sha256::new().chain_update(LABEL_PREFIX).chain_update(self.0).finalize().into())
    }
}

impl std::fmt::Debug for ClientSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientSecret(label {})", self.label().to_hex())
    }
}

impl ClientLabel {
    /// The label of a request that sent no secret.
    pub const ANONYMOUS: ClientLabel = ClientLabel([0; 32]);

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// How the vectors are written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    /// Little-endian f32, base64 (what OpenAI's clients ask for by default).
    Base64,
}

/// A request the gateway will compute.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsCall {
    pub inputs: Vec<String>,
    pub model: String,
    pub encoding: Encoding,
    /// OpenAI's `dimensions`: the model's own length or one of its manifest's Matryoshka lengths.
    pub dimensions: Option<u32>,
    /// `prompt_name` (as text-embeddings-inference names it): one of the manifest's prompts, or
    /// [`crate::manifest::NO_PROMPT`]; absent, the manifest's default prompt applies, as in sentence-transformers.
    pub prompt_name: Option<String>,
    /// Extension field `precision` (fp32 by default), as `submit --precision`.
    pub precision: Precision,
    /// Extension field `truncate` (false by default: an over-long input is an error, as OpenAI's).
    pub truncate: bool,
}

/// A rerank request: score each document against the query with a cross-encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankCall {
    pub model: String,
    pub query: String,
    pub documents: Vec<String>,
    /// Answer the `top_n` best (all when absent).
    pub top_n: Option<usize>,
    pub precision: Precision,
    /// Cut an over-long (query, document) pair longest-first: true by default, as
    /// sentence-transformers' `CrossEncoder` and the rerank APIs do (false: such a pair is an error).
    pub truncate: bool,
}

/// What a request asks the enclave to compute.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Embeddings(EmbeddingsCall),
    Rerank(RerankCall),
}

impl Call {
    pub fn model(&self) -> &str {
        match self {
            Call::Embeddings(call) => &call.model,
            Call::Rerank(call) => &call.model,
        }
    }

    pub fn precision(&self) -> Precision {
        match self {
            Call::Embeddings(call) => call.precision,
            Call::Rerank(call) => call.precision,
        }
    }
}

/// An opened request: its routing headers and the call, or the error to answer with.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineRequest {
    pub sent_ms: u64,
    pub client: ClientLabel,
    /// The manifest hash the client expects, if it named one.
    pub manifest: Option<[u8; 32]>,
    pub call: Result<Call, ApiError>,
}

/// Why an opened request is not a request at all: no answer can be meaningful, so the gateway
/// refuses it like a replay (the relay learns only that).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestFormError {
    #[error("not Binary HTTP: {0}")]
    NotBinaryHttp(String),
    /// Bytes after the message that are not zero padding (RFC 9292 §3.8).
    #[error("padding: a non-zero byte follows the Binary HTTP message")]
    Padding,
    #[error("no {SENT_HEADER} header, or not a decimal number")]
    SentTime,
    #[error("{CLIENT_SECRET_HEADER} is not 64 hex digits, or the retired {RETIRED_CLIENT_HEADER} label header was sent")]
    ClientLabel,
    #[error("{MANIFEST_HEADER} is not 64 hex digits")]
    Manifest,
}

/// An OpenAI-shaped error (`{"error": {"message", "type", "param", "code"}}`) and its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub fn invalid(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self { status: 400, kind: "invalid_request_error", param: Some(param), code: Some(code), message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self { status: 404, kind: "invalid_request_error", param: None, code: Some("not_found"), message: message.into() }
    }

    pub fn server(message: impl Into<String>) -> Self {
        Self { status: 500, kind: "server_error", param: None, code: None, message: message.into() }
    }

    pub fn to_json(&self) -> Vec<u8> {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        body.to_string().into_bytes()
    }
}

/// The routing headers a client puts inside its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaders {
    pub sent_ms: u64,
    /// `None`: the request is accounted as [`ClientLabel::ANONYMOUS`].
    pub client: Option<ClientSecret>,
    pub manifest: Option<[u8; 32]>,
}

/// Builds the Binary HTTP request the client encapsulates.
pub fn encode_request(method: &str, path: &str, body: &[u8], sent_ms: u64, client: Option<ClientSecret>) -> Vec<u8> {
    encode_request_with(method, path, body, RequestHeaders { sent_ms, client, manifest: None })
}

/// [`encode_request`] with every header.
pub fn encode_request_with(method: &str, path: &str, body: &[u8], headers: RequestHeaders) -> Vec<u8> {
    let RequestHeaders { sent_ms, client, manifest } = headers;
    let mut message = bhttp::Message::request(
        method.as_bytes().to_vec(),
        b"https".to_vec(),
        b"enclave.ephem-batch.invalid".to_vec(),
        path.as_bytes().to_vec(),
    );
    message.put_header("content-type", "application/json");
    message.put_header(SENT_HEADER, sent_ms.to_string());
    if let Some(secret) = client {
        message.put_header(CLIENT_SECRET_HEADER, hex::encode(secret.0));
    }
    if let Some(manifest) = manifest {
        message.put_header(MANIFEST_HEADER, hex::encode(manifest));
    }
    message.write_content(body);
    padded(&message)
}

/// The smallest padded size of a `len`-byte message: 4 KiB, then powers of two up to 256 KiB,
/// then whole 64 KiB (a request body is at most [`MAX_BODY`], so a padded request stays well under
/// the relay's limit; a large response costs at most 64 KiB more).
pub fn padded_len(len: usize) -> usize {
    const MIN: usize = 4 * 1024;
    const STEP: usize = 64 * 1024;
    if len <= 256 * 1024 {
        len.next_power_of_two().max(MIN)
    } else {
        len.div_ceil(STEP) * STEP
    }
}

/// `message` in known-length Binary HTTP, zero-padded to [`padded_len`].
fn padded(message: &bhttp::Message) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = message.write_bhttp(bhttp::Mode::KnownLength, &mut out);
    out.resize(padded_len(out.len()), 0);
    out
}

/// Reads one Binary HTTP message followed by nothing but zero padding.
fn read_padded(bytes: &[u8]) -> Result<bhttp::Message, RequestFormError> {
    let mut cursor = Cursor::new(bytes);
    let message = bhttp::Message::read_bhttp(&mut cursor).map_err(|e| RequestFormError::NotBinaryHttp(e.to_string()))?;
    let end = usize::try_from(cursor.position()).unwrap_or(bytes.len());
    if bytes[end.min(bytes.len())..].iter().any(|&b| b != 0) {
        return Err(RequestFormError::Padding);
    }
    Ok(message)
}

/// Reads a decapsulated request. `Err` only when there is nothing to answer (see
/// [`RequestFormError`]); a request that is well formed but wrong answers with an [`ApiError`].
pub fn decode_request(bytes: &[u8]) -> Result<OnlineRequest, RequestFormError> {
    let message = read_padded(bytes)?;
    let header = message.header();
    let sent_ms = header
        .get(SENT_HEADER.as_bytes())
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
        .ok_or(RequestFormError::SentTime)?;
    if header.get(RETIRED_CLIENT_HEADER.as_bytes()).is_some() {
        return Err(RequestFormError::ClientLabel);
    }
    let client = match header.get(CLIENT_SECRET_HEADER.as_bytes()) {
        None => ClientLabel::ANONYMOUS,
        Some(value) => hex::decode(value)
            .ok()
            .and_then(|b| b.try_into().ok())
            .map(|secret| ClientSecret(secret).label())
            .ok_or(RequestFormError::ClientLabel)?,
    };
    let manifest = match header.get(MANIFEST_HEADER.as_bytes()) {
        None => None,
        Some(value) => Some(hex::decode(value).ok().and_then(|b| b.try_into().ok()).ok_or(RequestFormError::Manifest)?),
    };
    let control = message.control();
    let call = match (control.method(), control.path()) {
        (Some(b"POST"), Some(path)) if path == EMBEDDINGS_PATH.as_bytes() => parse_call(message.content()).map(Call::Embeddings),
        (Some(b"POST"), Some(path)) if path == RERANK_PATH.as_bytes() => parse_rerank(message.content()).map(Call::Rerank),
        (method, path) => Err(ApiError::not_found(format!(
            "{} {} is not served; the enclave serves POST {EMBEDDINGS_PATH} and POST {RERANK_PATH}",
            String::from_utf8_lossy(method.unwrap_or_default()),
            String::from_utf8_lossy(path.unwrap_or_default()),
        ))),
    };
    Ok(OnlineRequest { sent_ms, client, manifest, call })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    input: Value,
    model: String,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u64>,
    #[serde(default)]
    prompt_name: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    precision: Option<String>,
    #[serde(default)]
    truncate: Option<bool>,
}

fn parse_call(body: &[u8]) -> Result<EmbeddingsCall, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::invalid("input", "request_too_large", format!("the body is {} bytes; at most {MAX_BODY}", body.len())));
    }
    let raw: RawCall = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("input", "invalid_json", format!("the body is not an embeddings request: {e}")))?;
    let _ = raw.user;
    let inputs = match raw.input {
        Value::String(text) => vec![text],
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.into_iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()
        }
        Value::Array(_) => {
            return Err(ApiError::invalid("input", "unsupported_input", "input as token ids is not supported; send text"))
        }
        _ => return Err(ApiError::invalid("input", "invalid_input", "input must be a string or an array of strings")),
    };
    if inputs.is_empty() {
        return Err(ApiError::invalid("input", "invalid_input", "input is empty"));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(ApiError::invalid("input", "too_many_inputs", format!("{} inputs; at most {MAX_INPUTS} per request", inputs.len())));
    }
    if !valid_model_id(&raw.model) {
        return Err(ApiError::invalid("model", "invalid_model", "model is not a model id"));
    }
    let encoding = match raw.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => return Err(ApiError::invalid("encoding_format", "invalid_encoding_format", format!("{other:?} is not float or base64"))),
    };
    let precision = match raw.precision.as_deref() {
        None => Precision::Fp32,
        Some(name) => Precision::parse(name)
            .ok_or_else(|| ApiError::invalid("precision", "invalid_precision", format!("{name:?} is not fp32, bf16 or int8")))?,
    };
    let dimensions = raw
        .dimensions
        .map(|d| u32::try_from(d).ok().filter(|d| *d > 0 && *d as usize <= crate::records::MAX_DIMENSIONS))
        .map(|d| d.ok_or_else(|| ApiError::invalid("dimensions", "invalid_dimensions", "dimensions must be a positive integer")))
        .transpose()?;
    if let Some(name) = raw.prompt_name.as_deref().filter(|name| !crate::envelope::valid_prompt_name(name)) {
        return Err(ApiError::invalid("prompt_name", "invalid_prompt_name", format!("{name:?} is not a prompt name")));
    }
    Ok(EmbeddingsCall {
        inputs,
        model: raw.model,
        encoding,
        dimensions,
        prompt_name: raw.prompt_name,
        precision,
        truncate: raw.truncate.unwrap_or(false),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRerank {
    model: String,
    query: String,
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<u64>,
    #[serde(default)]
    return_documents: Option<bool>,
    #[serde(default)]
    precision: Option<String>,
    #[serde(default)]
    truncate: Option<bool>,
}

fn parse_rerank(body: &[u8]) -> Result<RerankCall, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::invalid("documents", "request_too_large", format!("the body is {} bytes; at most {MAX_BODY}", body.len())));
    }
    let raw: RawRerank = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("documents", "invalid_json", format!("the body is not a rerank request: {e}")))?;
    if !valid_model_id(&raw.model) {
        return Err(ApiError::invalid("model", "invalid_model", "model is not a model id"));
    }
    // Documents as strings, or as `{"text": …}` objects (as some rerank APIs accept them).
    let documents: Vec<String> = raw
        .documents
        .into_iter()
        .map(|d| match d {
            Value::String(text) => Some(text),
            Value::Object(mut object) if object.len() == 1 => match object.remove("text") {
                Some(Value::String(text)) => Some(text),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| ApiError::invalid("documents", "invalid_documents", "documents must be strings or {\"text\": string} objects"))?;
    if documents.is_empty() || documents.len() > crate::records::MAX_RERANK_DOCUMENTS {
        let message = format!("{} documents; 1 to {} per request", documents.len(), crate::records::MAX_RERANK_DOCUMENTS);
        return Err(ApiError::invalid("documents", "invalid_documents", message));
    }
    if raw.return_documents == Some(true) {
        return Err(ApiError::invalid("return_documents", "unsupported_return_documents", "the documents are not sent back: the client holds them, and which ones rank first stays inside the answer's scores"));
    }
    let top_n = match raw.top_n {
        None => None,
        Some(0) => return Err(ApiError::invalid("top_n", "invalid_top_n", "top_n must be at least 1")),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX).min(documents.len())),
    };
    let precision = match raw.precision.as_deref() {
        None => Precision::Fp32,
        Some(name) => Precision::parse(name)
            .ok_or_else(|| ApiError::invalid("precision", "invalid_precision", format!("{name:?} is not fp32, bf16 or int8")))?,
    };
    Ok(RerankCall { model: raw.model, query: raw.query, documents, top_n, precision, truncate: raw.truncate.unwrap_or(true) })
}

/// The JSON body of a rerank answer: the `top_n` best documents by descending score (of equal
/// scores the earlier document first), each with its index and score. Scores and indices are
/// written at a fixed width, so the body's length depends on the number of results only, not on
/// which documents they are.
pub fn rerank_body(model: &str, scores: &[f32], top_n: Option<usize>, tokens: u64) -> Vec<u8> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n.unwrap_or(scores.len()));
    let width = scores.len().saturating_sub(1).to_string().len();
    let mut out = String::from(r#"{"object":"list","results":["#);
    for (rank, &index) in order.iter().enumerate() {
        if rank > 0 {
            out.push(',');
        }
        out.push_str(&format!(r#"{{"index":{index:>width$},"relevance_score":"#));
        fixed_width(scores[index], &mut out);
        out.push('}');
    }
    let model = Value::from(model).to_string();
    out.push_str(&format!(r#"],"model":{model},"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#));
    out.into_bytes()
}

/// The JSON body of a successful answer. Float vectors are written with every number the same
/// width ([`fixed_width`]), so the body's length depends on the shape of the answer, never on the
/// values in it.
pub fn embeddings_body(model: &str, vectors: &[Vec<f32>], tokens: u64, encoding: Encoding) -> Vec<u8> {
    let mut out = String::from(r#"{"object":"list","data":["#);
    for (index, vector) in vectors.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&format!(r#"{{"object":"embedding","index":{index},"embedding":"#));
        match encoding {
            Encoding::Float => {
                out.push('[');
                for (i, &x) in vector.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    fixed_width(x, &mut out);
                }
                out.push(']');
            }
            Encoding::Base64 => {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                out.push_str(&Value::from(base64::engine::general_purpose::STANDARD.encode(bytes)).to_string());
            }
        }
        out.push('}');
    }
    let model = Value::from(model).to_string();
    out.push_str(&format!(r#"],"model":{model},"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#));
    out.into_bytes()
}

/// Width of one number in a float answer.
const FLOAT_WIDTH: usize = 15;

/// `x` as a JSON number of exactly [`FLOAT_WIDTH`] characters: a sign or a space (JSON
/// whitespace), nine significant digits (enough to read back the same f32) and a two-digit signed
/// exponent, e.g. ` 1.23456780e-01`; a non-finite value (never produced for an embedding) as a
/// padded `null`.
fn fixed_width(x: f32, out: &mut String) {
    if !x.is_finite() {
        out.push_str(&format!("{:>FLOAT_WIDTH$}", "null"));
        return;
    }
    let text = format!("{:.8e}", x.abs());
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let sign = if x.is_sign_negative() && x != 0.0 { '-' } else { ' ' };
    let exp_sign = if exponent < 0 { '-' } else { '+' };
    out.push_str(&format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.abs()));
}

/// Where the gateway accounted one answered request (docs/protocol.md §9.5): the usage account
/// (enclave receipt key, period start, model, precision, epoch) and the request's place in it.
/// The client logs it with the digests of its exchange and recomputes the account's commitment
/// from its log (`ephem-batch ledger reconcile-usage`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountedAs {
    /// The enclave receipt key's id (hex): each enclave keeps its own book.
    pub receipt_key_id: String,
    pub start_ms: u64,
    pub model: String,
    pub precision: String,
    pub epoch: u64,
    /// The requests of the account before this one.
    pub index: u64,
}

/// Builds the Binary HTTP response the gateway encapsulates.
pub fn encode_response(status: u16, body: &[u8]) -> Vec<u8> {
    encode_response_accounted(status, body, None)
}

/// [`encode_response`] saying where the request was accounted.
pub fn encode_response_accounted(status: u16, body: &[u8], accounted: Option<&AccountedAs>) -> Vec<u8> {
    let status = bhttp::StatusCode::try_from(status).unwrap_or_else(|_| bhttp::StatusCode::try_from(500u16).expect("500"));
    let mut message = bhttp::Message::response(status);
    message.put_header("content-type", "application/json");
    if let Some(accounted) = accounted {
        message.put_header(USAGE_HEADER, serde_json::to_string(accounted).unwrap_or_default());
    }
    message.write_content(body);
    padded(&message)
}

/// An opened answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedResponse {
    pub status: u16,
    pub body: Vec<u8>,
    /// Where the request was accounted, if the gateway said (a 200 answer does).
    pub accounted: Option<AccountedAs>,
}

/// Reads a decapsulated response: its status and body.
pub fn decode_response(bytes: &[u8]) -> Result<(u16, Vec<u8>), RequestFormError> {
    open_response(bytes).map(|opened| (opened.status, opened.body))
}

/// Reads a decapsulated response with where it was accounted.
pub fn open_response(bytes: &[u8]) -> Result<OpenedResponse, RequestFormError> {
    let message = read_padded(bytes)?;
    let status = message.control().status().map(|s| s.code()).ok_or_else(|| RequestFormError::NotBinaryHttp("a request, not a response".into()))?;
    let accounted = match message.header().get(USAGE_HEADER.as_bytes()) {
        None => None,
        Some(value) => Some(serde_json::from_slice(value).map_err(|e| RequestFormError::NotBinaryHttp(format!("{USAGE_HEADER}: {e}")))?),
    };
    Ok(OpenedResponse { status, body: message.content().to_vec(), accounted })
}

#[cfg(test)]
mod tests;
