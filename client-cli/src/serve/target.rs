//! Where `serve` sends requests: the key configuration of the freshest fleet document that passes
//! every check of the policy (the same checks as `submit`), re-verified periodically and before
//! the document's certificates or epoch run out. When verification fails, the target is the
//! failure: nothing is sent until a document verifies again.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use cloud::Services;
use protocol::ohttp::KeyConfig;

use crate::trust::{current_enclave, ClientTrust};

/// A verified enclave to encapsulate to.
#[derive(Debug, Clone)]
pub struct Target {
    pub config: KeyConfig,
    pub epoch: u64,
    /// When the document stops verifying (chain) or its epoch ends, whichever is first.
    pub valid_until_ms: u64,
    /// The attested image's PCR0: requests name a model version for this image.
    pub image_pcr0: Vec<u8>,
}

/// Why nothing is sent: the check that failed, in `submit`'s words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attestation: {0}")]
pub struct AttestationFailed(pub String);

/// A document is re-verified this long before it would stop verifying.
const MARGIN_MS: u64 = 60_000;

pub struct Targets {
    services: Services,
    trust: ClientTrust,
    refresh: Duration,
    current: RwLock<(Result<Target, AttestationFailed>, Instant)>,
}

impl Targets {
    /// Verifies once now; `serve` starts even if that fails (and refuses until it passes).
    pub fn new(services: Services, trust: ClientTrust, refresh: Duration) -> Self {
        let first = verify(&services, &trust);
        Self { services, trust, refresh, current: RwLock::new((first, Instant::now())) }
    }

    /// The current target, re-verified if it is due.
    pub fn get(&self) -> Result<Target, AttestationFailed> {
        let (current, checked) = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        let due = checked.elapsed() >= self.refresh
            || current.as_ref().map_or(true, |t| cloud::now_ms() + MARGIN_MS >= t.valid_until_ms);
        if due { self.refresh() } else { current }
    }

    /// Verifies again now (also after the enclave refused a request's key).
    pub fn refresh(&self) -> Result<Target, AttestationFailed> {
        let fresh = verify(&self.services, &self.trust);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (fresh.clone(), Instant::now());
        fresh
    }
}

fn verify(services: &Services, trust: &ClientTrust) -> Result<Target, AttestationFailed> {
    let now = cloud::now_ms();
    let enclave = current_enclave(services, trust, now).map_err(|e| AttestationFailed(format!("{e:#}")))?;
    let valid_until_ms = enclave.verified.chain_not_after_ms.min(enclave.binding.not_after_ms);
    let image_pcr0 = enclave.verified.document.pcrs.get(&0).cloned().unwrap_or_default();
    Ok(Target { config: KeyConfig::for_epoch(enclave.binding.epoch, enclave.fleet), epoch: enclave.binding.epoch, valid_until_ms, image_pcr0 })
}
