//! The proxy's HTTP side: OpenAI's `/v1/embeddings` and `/v1/models`, every error in OpenAI's
//! shape. Nothing here logs a body.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use protocol::ohttp;
use protocol::online::{self, ApiError, RequestHeaders, EMBEDDINGS_PATH, MAX_BODY, RERANK_PATH};

use super::access::Access;
use super::{Proxy, Relayed, Target};

/// Serves connections on `listener`; each request passes `access` before anything else.
pub async fn accept(listener: tokio::net::TcpListener, proxy: Arc<Proxy>, access: Access) -> anyhow::Result<()> {
    let access = Arc::new(access);
    loop {
        let (stream, _) = listener.accept().await?;
        let proxy = Arc::clone(&proxy);
        let access = Arc::clone(&access);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&proxy), Arc::clone(&access), request));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

type Answer = Response<Full<Bytes>>;

async fn handle(proxy: Arc<Proxy>, access: Arc<Access>, request: Request<Incoming>) -> Result<Answer, std::convert::Infallible> {
    if let Err(refused) = access.admit(request.headers()) {
        let status = StatusCode::from_u16(refused.status()).unwrap_or(StatusCode::FORBIDDEN);
        let (status, body) = refusal_body(status, "permission_error", refused.check(), &refused.to_string());
        let mut answer = json(status, body);
        if status == StatusCode::UNAUTHORIZED {
            answer.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, hyper::header::HeaderValue::from_static("Bearer"));
        }
        return Ok(answer);
    }
    Ok(match (request.method(), request.uri().path()) {
        (&Method::POST, EMBEDDINGS_PATH) => call(proxy, EMBEDDINGS_PATH, request).await,
        (&Method::POST, RERANK_PATH) => call(proxy, RERANK_PATH, request).await,
        (&Method::GET, "/v1/models") => models(proxy).await,
        _ => error(&ApiError::not_found("this proxy serves POST /v1/embeddings, POST /v1/rerank and GET /v1/models")),
    })
}

async fn call(proxy: Arc<Proxy>, path: &'static str, request: Request<Incoming>) -> Answer {
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return error(&ApiError { status: 413, ..ApiError::invalid("input", "request_too_large", format!("the body exceeds {MAX_BODY} bytes")) }),
    };
    let (status, body) = forward(&proxy, path, body).await;
    json(status, body)
}

/// One request body for `path` (OpenAI's embeddings, or a rerank request) through the verified
/// enclave: the answer's status and JSON body, or an OpenAI-shaped error of the proxy's own.
pub async fn forward(proxy: &Arc<Proxy>, path: &'static str, body: Bytes) -> (StatusCode, Vec<u8>) {
    // The model is read here only to pin its manifest; the enclave reads the request itself.
    let model = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["model"].as_str().map(str::to_owned));
    let Some(model) = model else {
        return error_body(&ApiError::invalid("model", "invalid_model", "the request names no model"));
    };
    let checked = {
        let proxy = Arc::clone(proxy);
        tokio::task::spawn_blocking(move || {
            let target = proxy.targets.get();
            let manifest = match &target {
                Ok(target) => proxy.models.manifest(proxy.services.models.as_ref(), &model, &target.image_pcr0),
                Err(_) => Err(String::new()),
            };
            (target, manifest)
        })
        .await
    };
    let (target, manifest) = match checked {
        Ok(pair) => pair,
        Err(join) => return error_body(&ApiError::server(format!("verification task: {join}"))),
    };
    let mut target = match target {
        Ok(target) => target,
        Err(failure) => return refusal_body(StatusCode::SERVICE_UNAVAILABLE, "attestation_error", "attestation", &failure.to_string()),
    };
    let manifest = match manifest {
        Ok(hash) => hash,
        Err(message) => return error_body(&ApiError { status: 404, ..ApiError::invalid("model", "model_not_found", message) }),
    };
    // One retry after re-verifying, when the enclave no longer holds the key (epoch rotated).
    // Only then: the relay may have delivered the request and answered `encapsulation` anyway,
    // and a resend to the same key would be a second enclave answer, counted twice.
    for attempt in 0..2 {
        let headers = RequestHeaders { sent_ms: cloud::now_ms(), client: Some(proxy.client.clone()), manifest: Some(manifest) };
        let plaintext = online::encode_request_with("POST", path, &body, headers);
        let (encapsulated, opener) = match ohttp::encapsulate_request(&target.config, &plaintext) {
            Ok(pair) => pair,
            Err(e) => return error_body(&ApiError::server(format!("encapsulation: {e}"))),
        };
        match proxy.relay.send(encapsulated).await {
            Relayed::Response(encapsulated) => {
                let opened = opener
                    .open(&encapsulated)
                    .map_err(|e| e.to_string())
                    .and_then(|plain| online::open_response(&plain).map(|opened| (opened, plain)).map_err(|e| e.to_string()));
                return match opened {
                    Ok((opened, plain)) => {
                        if let Some(accounted) = opened.accounted {
                            log_exchange(proxy, accounted, &plaintext, &plain);
                        }
                        (StatusCode::from_u16(opened.status).unwrap_or(StatusCode::BAD_GATEWAY), opened.body)
                    }
                    Err(check) => refusal_body(StatusCode::BAD_GATEWAY, "relay_error", "response", &format!("the response did not open: {check}")),
                };
            }
            Relayed::Refused { check, .. } if check == "encapsulation" && attempt == 0 => {
                let proxy = Arc::clone(proxy);
                match tokio::task::spawn_blocking(move || proxy.targets.refresh()).await {
                    Ok(Ok(fresh)) if rotated(&target, &fresh) => target = fresh,
                    Ok(Ok(_)) => {
                        return refusal_body(
                            StatusCode::BAD_GATEWAY,
                            "relay_error",
                            "encapsulation",
                            &format!("the relay says the enclave refused the key of epoch {}, which is still the verified one: not sent again", target.epoch),
                        );
                    }
                    Ok(Err(failure)) => return refusal_body(StatusCode::SERVICE_UNAVAILABLE, "attestation_error", "attestation", &failure.to_string()),
                    Err(join) => return error_body(&ApiError::server(format!("verification task: {join}"))),
                }
            }
            Relayed::Refused { check, detail } => {
                return refusal_body(StatusCode::BAD_GATEWAY, "relay_error", &check, &format!("the enclave refused the request ({check}) {detail}"));
            }
            Relayed::Failed { status, detail } => {
                let status = if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS { status } else { StatusCode::BAD_GATEWAY };
                return refusal_body(status, "relay_error", "relay", &format!("relay answered {status}: {detail}"));
            }
        }
    }
    refusal_body(StatusCode::BAD_GATEWAY, "relay_error", "encapsulation", "the enclave refused the freshly verified key")
}

/// Logs an answered exchange for reconciliation; a log that cannot be written is said, not fatal
/// (the answer is the caller's either way; reconciliation then reports the account incomplete).
fn log_exchange(proxy: &Proxy, accounted: online::AccountedAs, request: &[u8], response: &[u8]) {
    use sha2::{Digest, Sha256};
    let exchange = crate::usage_log::Exchange {
        label: proxy.client.label().to_hex(),
        accounted,
        request_sha256: hex::encode(Sha256::digest(request)),
        response_sha256: hex::encode(Sha256::digest(response)),
    };
    if let Err(error) = crate::usage_log::append(&proxy.usage_log, &exchange) {
        eprintln!("serve: usage log: {error:#}");
    }
}

/// Whether a re-verified target is another key than the one a request was refused under.
fn rotated(refused: &Target, fresh: &Target) -> bool {
    fresh.epoch != refused.epoch || fresh.config != refused.config
}

/// The models a client can use: every model with a manifest the trusted publisher signed.
async fn models(proxy: Arc<Proxy>) -> Answer {
    let listed = tokio::task::spawn_blocking(move || crate::model_choice::published_model_ids(proxy.services.models.as_ref(), &proxy.models.publisher())).await;
    match listed {
        Ok(Ok(ids)) => {
            let data: Vec<serde_json::Value> =
                ids.iter().map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "ephem-batch"})).collect();
            json(StatusCode::OK, serde_json::json!({"object": "list", "data": data}).to_string().into_bytes())
        }
        Ok(Err(e)) => error(&ApiError::server(format!("listing models: {e}"))),
        Err(join) => error(&ApiError::server(format!("listing models: {join}"))),
    }
}

fn refusal_body(status: StatusCode, kind: &'static str, code: &str, message: &str) -> (StatusCode, Vec<u8>) {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (status, body.to_string().into_bytes())
}

fn error_body(error: &ApiError) -> (StatusCode, Vec<u8>) {
    (StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), error.to_json())
}

fn error(error: &ApiError) -> Answer {
    let (status, body) = error_body(error);
    json(status, body)
}

fn json(status: StatusCode, body: Vec<u8>) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}
