//! The relay's HTTP side: routes, status codes and the one log line per request. Nothing here
//! reads into a body beyond its length: the host logs methods, routes, statuses, sizes and
//! durations, never a byte of what it carries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};

use super::admission::Busy;
use super::exchange::{ExchangeError, Outcome};
use super::State;

pub use protocol::ohttp::{REQUEST_MEDIA_TYPE, RESPONSE_MEDIA_TYPE};
const PROBLEM_MEDIA_TYPE: &str = "application/problem+json";
/// How long a health check waits for the worker's `Hello`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A health answer is reused this long: a balancer's checks do not each open a connection.
const PROBE_REUSE: Duration = Duration::from_secs(1);
/// Extra time the HTTP side gives the blocking side, whose own timeouts end it at the deadline.
const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// Answers one request and logs it.
pub(crate) async fn serve(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let started = Instant::now();
    let method = request.method().clone();
    let route = match request.uri().path() {
        "/v1/ohttp" => "/v1/ohttp",
        "/healthz" => "/healthz",
        // A path is the client's to choose: it is not logged.
        _ => "other",
    };
    let (response, request_bytes) = match (route, &method) {
        ("/v1/ohttp", &Method::POST) => relay(&state, request, started).await,
        ("/healthz", &Method::GET) => (health(&state).await, 0),
        ("/v1/ohttp", _) => (with_allow(problem(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "use POST"), "POST"), 0),
        ("/healthz", _) => (with_allow(problem(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "use GET"), "GET"), 0),
        _ => (problem(StatusCode::NOT_FOUND, "not-found", "no such route"), 0),
    };
    let status = response.status().as_u16();
    let response_bytes = hyper::body::Body::size_hint(response.body()).exact().unwrap_or(0);
    if route == "/v1/ohttp" {
        state.stats.count(status);
    }
    let duration_ms = started.elapsed().as_secs_f64() * 1e3;
    if route == "/healthz" {
        tracing::debug!(method = %method, route, status, duration_ms, "online relay");
    } else {
        tracing::info!(method = %method, route, status, request_bytes, response_bytes, duration_ms, "online relay");
    }
    Ok(response)
}

/// `POST /v1/ohttp`: the body to the enclave, its answer back. Returns the request's size too.
async fn relay(state: &Arc<State>, request: Request<Incoming>, started: Instant) -> (Response<Full<Bytes>>, usize) {
    let settings = &state.settings;
    let deadline = started + settings.request_timeout;
    let media_type = request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(|v| v.split(';').next().unwrap_or("").trim());
    if !media_type.is_some_and(|m| m.eq_ignore_ascii_case(REQUEST_MEDIA_TYPE)) {
        return (problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "media-type", "the body must be message/ohttp-req"), 0);
    }
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > settings.max_request as u64) {
        // Refused on its header: the body is never read.
        return (too_large(settings.max_request), 0);
    }
    let limited = Limited::new(request.into_body(), settings.max_request);
    let body = match tokio::time::timeout_at(deadline.into(), limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => return (too_large(settings.max_request), 0),
        Ok(Err(_)) => return (problem(StatusCode::BAD_REQUEST, "body", "the request body could not be read"), 0),
        Err(_) => return (problem(StatusCode::REQUEST_TIMEOUT, "timeout", "the request body did not arrive in time"), 0),
    };
    let size = body.len();
    let permit = match state.admission.admit().await {
        Ok(permit) => permit,
        Err(busy) => {
            let title = match busy {
                Busy::QueueFull => "the relay's queue is full",
                Busy::Waited => "no enclave slot came free in time",
            };
            let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, "busy", title);
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
            return (response, size);
        }
    };
    let worker = Arc::clone(&state.worker);
    let exchange = tokio::task::spawn_blocking(move || {
        // The slot is held for as long as the worker connection is in use.
        let _permit = permit;
        worker.exchange(body.to_vec(), deadline)
    });
    let outcome = match tokio::time::timeout_at((deadline + DEADLINE_GRACE).into(), exchange).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => return (problem(StatusCode::BAD_GATEWAY, "worker", "the relay's worker task failed"), size),
        Err(_) => Err(ExchangeError::Timeout),
    };
    let response = match outcome {
        Ok(Outcome::Response(data)) => {
            let mut response = Response::new(Full::new(Bytes::from(data)));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(RESPONSE_MEDIA_TYPE));
            response
        }
        Ok(Outcome::Refused { check }) => refused(check),
        Err(ExchangeError::Timeout) => problem(StatusCode::GATEWAY_TIMEOUT, "timeout", "the enclave did not answer in time"),
        Err(error) => {
            tracing::warn!(%error, "online request not relayed");
            problem(StatusCode::BAD_GATEWAY, "worker", "the enclave could not be reached or broke the protocol")
        }
    };
    (response, size)
}

/// `GET /healthz`: 200 when the worker takes an online connection, with the load.
async fn health(state: &Arc<State>) -> Response<Full<Bytes>> {
    let up = {
        let mut last = state.last_probe.lock().await;
        match *last {
            Some((at, up)) if at.elapsed() < PROBE_REUSE => up,
            _ => {
                let worker = Arc::clone(&state.worker);
                let probed = tokio::task::spawn_blocking(move || worker.probe(PROBE_TIMEOUT)).await;
                let up = matches!(probed, Ok(Ok(())));
                *last = Some((Instant::now(), up));
                up
            }
        }
    };
    let load = state.load();
    let body = serde_json::json!({
        "worker": if up { "up" } else { "unreachable" },
        "in_flight": load.in_flight,
        "queued": load.queued,
    });
    let status = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    json(status, "application/json", &body)
}

fn refused(check: protocol::FailedCheck) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": problem_type("refused"),
        "title": "the enclave refused the encapsulated request",
        "status": 400,
        "check": check.as_str(),
    });
    json(StatusCode::BAD_REQUEST, PROBLEM_MEDIA_TYPE, &body)
}

fn too_large(max: usize) -> Response<Full<Bytes>> {
    problem(StatusCode::PAYLOAD_TOO_LARGE, "too-large", &format!("the encapsulated request exceeds {max} bytes"))
}

fn problem_type(name: &str) -> String {
    format!("urn:ephem-batch:online-relay:{name}")
}

/// An RFC 9457 problem.
fn problem(status: StatusCode, name: &str, title: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "type": problem_type(name), "title": title, "status": status.as_u16() });
    json(status, PROBLEM_MEDIA_TYPE, &body)
}

fn json(status: StatusCode, media_type: &'static str, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(media_type));
    response
}

fn with_allow(mut response: Response<Full<Bytes>>, allow: &'static str) -> Response<Full<Bytes>> {
    response.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
    response
}
