//! The one HTTP call `serve` makes: an encapsulated request to the relay's OHTTP resource (HTTP on
//! loopback for the embedded default, HTTPS with the system's roots to a deployment's load
//! balancer). The relay is untrusted; its answers are only ciphertext or a refusal.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use protocol::ohttp::{REQUEST_MEDIA_TYPE, RESPONSE_MEDIA_TYPE};

/// Largest encapsulated response read from the relay.
const MAX_RESPONSE: usize = 16 << 20;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

pub struct RelayClient {
    url: hyper::Uri,
    client: Client<Https, Full<Bytes>>,
}

/// What the relay answered.
#[derive(Debug)]
pub enum Relayed {
    Response(Vec<u8>),
    /// The enclave refused the request before it could answer it (problem+json `check`).
    Refused { check: String, detail: String },
    /// Anything else: the relay's status and, for the log, its problem text.
    Failed { status: StatusCode, detail: String },
}

impl RelayClient {
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let url: hyper::Uri = url.parse().map_err(|e| anyhow::anyhow!("relay URL {url:?}: {e}"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) {
            anyhow::bail!("relay URL {url} is neither http nor https");
        }
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            // The provider is named here, not installed process-wide: the library has no edge.
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| anyhow::anyhow!("TLS roots: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Self { url, client: Client::builder(TokioExecutor::new()).build(connector) })
    }

    pub async fn send(&self, encapsulated: Vec<u8>) -> Relayed {
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header(CONTENT_TYPE, REQUEST_MEDIA_TYPE)
            .body(Full::new(Bytes::from(encapsulated)));
        let request = match request {
            Ok(request) => request,
            Err(error) => return Relayed::Failed { status: StatusCode::BAD_GATEWAY, detail: error.to_string() },
        };
        let response = match self.client.request(request).await {
            Ok(response) => response,
            Err(error) => return Relayed::Failed { status: StatusCode::BAD_GATEWAY, detail: format!("relay unreachable: {error}") },
        };
        let status = response.status();
        let media = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let body = match Limited::new(response.into_body(), MAX_RESPONSE).collect().await {
            Ok(body) => body.to_bytes().to_vec(),
            Err(error) => return Relayed::Failed { status: StatusCode::BAD_GATEWAY, detail: format!("relay response: {error}") },
        };
        if status == StatusCode::OK && media == RESPONSE_MEDIA_TYPE {
            return Relayed::Response(body);
        }
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let detail = problem["detail"].as_str().or(problem["title"].as_str()).unwrap_or("").to_owned();
        match problem["check"].as_str() {
            Some(check) if status == StatusCode::BAD_REQUEST => Relayed::Refused { check: check.to_owned(), detail },
            _ => Relayed::Failed { status, detail },
        }
    }
}
