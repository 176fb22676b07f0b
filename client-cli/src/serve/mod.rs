//! `ephem-batch serve`: OpenAI's embeddings API on loopback, answered by the attested enclaves
//! through Oblivious HTTP (docs/protocol.md §9). An application sets `base_url` to this proxy; the
//! proxy verifies the fleet's attestation as `submit` does, pins each model's signed manifest,
//! encapsulates every request to the verified fleet key and opens the answer. It fails closed: when
//! no document verifies, it answers 503 naming the check and sends nothing.

pub mod access;
mod models;
pub mod proxy;
mod relay_client;
mod target;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use cloud::Services;
use protocol::online::ClientSecret;
use sha2::{Digest, Sha256};

use crate::home::Home;
use crate::trust::{ClientTrust, TrustArgs};

pub use relay_client::{RelayClient, Relayed};
pub use target::{AttestationFailed, Target, Targets};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where applications connect; loopback only (the proxy carries plaintext).
    #[arg(long, env = "EPHEM_SERVE_LISTEN", default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,
    /// The relay's OHTTP resource; by default the running local stack's (`dev status`).
    #[arg(long, env = "EPHEM_RELAY_URL")]
    pub relay: Option<String>,
    /// Re-verify the fleet's attestation document (and each model's manifest) this often.
    #[arg(long, default_value_t = 60)]
    pub refresh_seconds: u64,
    /// Require a bearer token: written (mode 0600) to `<home>/client/serve.token` if it is not
    /// there. Once that file exists every request must carry it, with or without this flag.
    #[arg(long)]
    pub require_token: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Everything a request needs.
pub struct Proxy {
    pub services: Services,
    pub targets: Targets,
    pub models: models::ModelPinning,
    pub relay: RelayClient,
    /// What this client's usage is accounted under: derived from its result secret key, so stable
    /// per home, known to no one else, and revealing nothing of the key.
    pub client: ClientSecret,
    /// Where each answered exchange is logged for reconciliation (`crate::usage_log`).
    pub usage_log: std::path::PathBuf,
}

impl Proxy {
    pub fn new(home: &Home, services: Services, args: &ServeArgs) -> anyhow::Result<Self> {
        if !args.listen.ip().is_loopback() {
            bail!("--listen {}: serve carries plaintext and listens on loopback only", args.listen);
        }
        let relay_url = match &args.relay {
            Some(url) => url.clone(),
            None => home.local_relay_url().ok_or_else(|| anyhow!("no relay: start the local stack (`ephem-batch dev up`) or give --relay URL"))?,
        };
        let trust = ClientTrust::load(home, &args.trust)?;
        trust.warn_if_development();
        let refresh = Duration::from_secs(args.refresh_seconds.max(1));
        let result_key = crate::keys::load_result_key(&home.result_key(), true)?;
        let client = ClientSecret(Sha256::new().chain_update(b"ephem-batch/v1 client secret").chain_update(&*result_key.to_bytes()).finalize().into());
        let models = models::ModelPinning::new(home.clone(), trust.model_publisher, refresh);
        let targets = Targets::new(services.clone(), trust, refresh);
        Ok(Self { services, targets, models, relay: RelayClient::new(&relay_url)?, client, usage_log: crate::usage_log::log_path(home) })
    }
}

/// Runs the proxy until the process is stopped.
pub fn run(home: &Home, services: Services, args: &ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("tokio runtime")?;
    runtime.block_on(async {
        // Beside the result key: the client directory, the owner's alone. Written before the
        // port opens, so whoever reaches the port finds the token required.
        let token_path = home.result_key().with_file_name(access::TOKEN_FILE);
        let token = if args.require_token { Some(access::ensure_token(&token_path)?) } else { access::read_token(&token_path)? };
        if token.is_some() {
            eprintln!("serve: requests must carry the bearer token in {}", token_path.display());
        }
        let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
        let access = access::Access::new(listener.local_addr()?.port(), token.as_deref());
        let proxy = Arc::new(tokio::task::block_in_place(|| Proxy::new(home, services, args))?);
        match proxy.targets.get() {
            Ok(target) => eprintln!("serve: fleet epoch {} verified", target.epoch),
            Err(failure) => eprintln!("serve: refusing requests until the fleet verifies — {failure}"),
        }
        eprintln!("serve: OpenAI embeddings API on http://{}/v1", listener.local_addr()?);
        proxy::accept(listener, proxy, access).await
    })
}

/// An online request the proxy or the enclave answered with an error (OpenAI's `error` object):
/// `code` names the check or parameter (`attestation`, `replay`, `model_not_found`, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} ({code}, HTTP {status}): {message}")]
pub struct OnlineError {
    pub status: u16,
    pub kind: String,
    pub code: String,
    pub message: String,
}

/// What an online request may ask beyond its texts (`None`: the model's length; its default
/// prompt, or `none` for no prompt).
#[derive(Debug, Clone, Default)]
pub struct OnlineShape {
    pub dimensions: Option<u32>,
    pub prompt_name: Option<String>,
}

/// The online path for a library caller (the Python SDK's `embed`): exactly a request to `serve`,
/// with the verified document and pinned manifests kept between calls and refreshed as `serve`
/// refreshes them.
pub struct OnlineClient {
    runtime: tokio::runtime::Runtime,
    proxy: Arc<Proxy>,
}

impl OnlineClient {
    pub fn new(home: &Home, services: Services, args: &ServeArgs) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
        Ok(Self { runtime, proxy: Arc::new(Proxy::new(home, services, args)?) })
    }

    /// The vectors of `texts`, row by row; an [`OnlineError`] for a refusal. `shape` asks for
    /// a Matryoshka length and a prompt, as OpenAI's `dimensions` and `prompt_name` do.
    pub fn embed(&self, model: &str, texts: &[String], shape: &OnlineShape) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut request = serde_json::json!({"input": texts, "model": model});
        if let Some(dimensions) = shape.dimensions {
            request["dimensions"] = dimensions.into();
        }
        if let Some(prompt) = &shape.prompt_name {
            request["prompt_name"] = prompt.as_str().into();
        }
        let answer = self.call(protocol::online::EMBEDDINGS_PATH, request)?;
        let data = answer["data"].as_array().ok_or_else(|| anyhow!("the answer has no data"))?;
        data.iter()
            .map(|item| {
                let values = item["embedding"].as_array().ok_or_else(|| anyhow!("an answer item has no embedding"))?;
                values.iter().map(|x| x.as_f64().map(|x| x as f32).ok_or_else(|| anyhow!("a vector value is not a number"))).collect()
            })
            .collect()
    }

    /// A cross-encoder's `(document index, relevance score)` for the `top_n` best of `documents`
    /// (all when `None`), best first.
    pub fn rerank(&self, model: &str, query: &str, documents: &[String], top_n: Option<usize>) -> anyhow::Result<Vec<(usize, f32)>> {
        let mut request = serde_json::json!({"model": model, "query": query, "documents": documents});
        if let Some(top_n) = top_n {
            request["top_n"] = top_n.into();
        }
        let answer = self.call(protocol::online::RERANK_PATH, request)?;
        let results = answer["results"].as_array().ok_or_else(|| anyhow!("the answer has no results"))?;
        results
            .iter()
            .map(|r| match (r["index"].as_u64(), r["relevance_score"].as_f64()) {
                (Some(index), Some(score)) => Ok((index as usize, score as f32)),
                _ => Err(anyhow!("a result lacks its index or score")),
            })
            .collect()
    }

    /// One request through the enclave; its JSON answer, or an [`OnlineError`].
    fn call(&self, path: &'static str, request: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let (status, answer) = self.runtime.block_on(proxy::forward(&self.proxy, path, request.to_string().into()));
        let answer: serde_json::Value = serde_json::from_slice(&answer).context("the answer is not JSON")?;
        if !status.is_success() {
            let field = |name: &str| answer["error"][name].as_str().unwrap_or_default().to_owned();
            return Err(OnlineError { status: status.as_u16(), kind: field("type"), code: field("code"), message: field("message") }.into());
        }
        Ok(answer)
    }
}
