//! The control channel: tell the worker which fleet epochs and models to take up, and serve what
//! it asks for meanwhile (objects, KMS calls, publishing its attestation). Runs on its own
//! thread for the poller's life: reconnects and starts over when the worker is replaced, looks
//! at the stores again periodically (a fleet-key rotation adds an epoch, a publisher a model
//! version), re-sends the newest epoch now and then so that the published document — whose
//! certificate lives about three hours — stays fresh, and answers clients' requests for a fresh
//! document carrying their nonce (`attestations/requests/<nonce>.json` →
//! `attestations/fresh/<nonce>.cbor`), and collects the usage receipts of online requests for
//! the ledger ([`crate::usage`]).
//!
//! Models live under the worker's memory budget: the periodic pass loads a model only if it fits
//! beside those held (`LoadModelIfFits`), so it never evicts what jobs use; a job whose model the
//! worker does not hold asks control for it ([`Shared::demand_model`]), and that load may evict
//! the least recently used. The worker names what it evicted, so control's view stays true, and
//! with a status file set control writes the held models and budget there after every change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud::{layout, ObjectError, ObjectMeta, PutCondition, Services};
use protocol::fleet::{epoch_object_key, genesis_object_key, EpochRecord, GENESIS_PREFIX};
use protocol::frame::{Channel, Message, ResidentModel};
use sha2::{Digest, Sha256};

use cloud::MAX_SMALL_OBJECT;
use crate::image_versions::{ImageVersions, Listed};
use crate::models_status::ModelsStatus;
use crate::relay::Relay;
use crate::retry;
use crate::shared::{Inflight, Shared};
use crate::usage::{UsageDelivery, UsageSettings};
use crate::worker_link::{describe, LinkError, WorkerEndpoint, WorkerLink};

#[derive(Debug, Clone)]
pub(crate) struct ControlSettings {
    pub rescan_interval: Duration,
    pub republish_interval: Duration,
    /// First delay before a refused request is sent again (doubling up to [`MAX_REFUSAL_DELAY`]).
    pub refusal_retry: Duration,
    /// How often to look for clients' attestation requests.
    pub attestation_poll: Duration,
    /// How long one control request may go without a frame from the worker.
    pub request_timeout: Duration,
    /// Picks where this host starts its passes over clients' attestation requests.
    pub host_id: String,
    pub usage: UsageSettings,
    /// Where to keep the worker's held models and budget (JSON, [`crate::ModelsStatus`]); none if unset.
    pub models_status: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The worker answered the request with `Error` (e.g. `fleet_epoch_expired: …`).
    #[error("the worker refused: {0}")]
    Refused(String),
    #[error("worker sent {0} on the control channel")]
    Unexpected(&'static str),
    /// A load only if it fits would have evicted another model: not loaded.
    #[error("model {model_id} needs {bytes} bytes, {free} are free without evicting another model")]
    WouldEvict { model_id: String, bytes: u64, free: u64 },
}

/// How long an epoch this host creates lasts, and how long before the newest one ends the next
/// is created (clients seal to the newest; older epochs stay usable until their own end).
const EPOCH_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
const EPOCH_RENEWAL: Duration = Duration::from_secs(2 * 24 * 3600);

/// What a control request is about, for the failure memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Target {
    Epoch(u64),
    Manifest(String),
    /// Creating the next epoch (the number it would have).
    Creation(u64),
}

/// A request the worker refused: not asked again before `next`, unless the object changed.
struct Refusal {
    etag: String,
    next: Instant,
    delay: Duration,
}

const MAX_REFUSAL_DELAY: Duration = Duration::from_secs(15 * 60);
const RECONNECT_DELAY: Duration = Duration::from_millis(200);
/// Failed connection attempts between two warnings (30 s at [`RECONNECT_DELAY`]).
const UNREACHABLE_REMINDER: u32 = 150;
/// A client waits about half a minute for its fresh document; older requests are dropped.
const REQUEST_TTL_MS: u64 = 120_000;
/// Requests answered per pass, so a flood of them cannot starve the rest of control.
const MAX_REQUESTS_PER_PASS: usize = 16;
/// Request keys listed per pass: the prefix is tenant-writable, so it may hold millions.
const REQUESTS_LISTED_PER_PASS: usize = 256;
/// Largest attestation request read: its body only dates it (`{"requested_ms": …}`; the key
/// names the nonce).
const MAX_REQUEST_LEN: u64 = 1024;

/// What became of one attestation request.
#[derive(Debug, PartialEq, Eq)]
enum Handled {
    /// The worker was asked for a document (answered or refused).
    Attested,
    /// Removed or left without asking the worker.
    Skipped,
}

/// What the worker answered a request with.
struct Reply {
    /// `Status.ready`: a fleet key and a model in use.
    ready: bool,
    /// `Attested`: the fresh document.
    document: Option<Vec<u8>>,
    /// `ModelMemory`: the budget and the models held.
    memory: Option<(u64, Vec<ResidentModel>)>,
    /// `FleetEpochCreated`: the record and genesis (JSON) to store.
    created: Option<(Vec<u8>, Vec<u8>)>,
}

/// What the stores hold that the worker should have.
struct Wanted {
    /// Unexpired epochs that have a genesis, oldest first (so the newest is published last and
    /// stays "current").
    epochs: BTreeMap<u64, (String, String)>,
    /// The KMS key and end (ms) of each of `epochs`.
    ends: BTreeMap<u64, (String, u64)>,
    /// The highest epoch number any record holds, expired or without genesis included.
    highest_epoch: u64,
    /// Model directory (`models/<name>`) → its listed versions, ascending.
    manifests: BTreeMap<String, Vec<Listed>>,
}

pub(crate) struct Control {
    services: Services,
    endpoint: WorkerEndpoint,
    relay: Arc<Relay>,
    shared: Arc<Shared>,
    settings: ControlSettings,
    /// Per connection: what the worker took up.
    epochs: BTreeSet<u64>,
    manifests: BTreeMap<String, String>,
    /// Per connection: manifests that fit only by evicting, left to jobs to demand.
    unfit: BTreeSet<String>,
    refusals: HashMap<Target, Refusal>,
    last_publication: Instant,
    /// The last attestation request key handled: the next pass lists from there.
    request_cursor: Option<String>,
    usage: UsageDelivery,
    /// Which version of each model is for the worker's image.
    versions: ImageVersions,
}

impl Control {
    pub fn new(services: Services, endpoint: WorkerEndpoint, relay: Arc<Relay>, shared: Arc<Shared>, settings: ControlSettings) -> Self {
        Self {
            usage: UsageDelivery::new(Arc::clone(&services.ledger_queue)),
            services,
            endpoint,
            relay,
            shared,
            epochs: BTreeSet::new(),
            manifests: BTreeMap::new(),
            unfit: BTreeSet::new(),
            refusals: HashMap::new(),
            last_publication: Instant::now(),
            request_cursor: Some(first_request_cursor(&settings.host_id)),
            versions: ImageVersions::default(),
            settings,
        }
    }

    /// Runs until the poller stops.
    pub fn run(mut self) {
        // The connection, its worker generation, and its registration (so that shutdown can cut
        // a request that waits on the worker, a model load say).
        let mut link: Option<(WorkerLink, u64, Option<Inflight>)> = None;
        let mut next_scan = Instant::now();
        let mut next_usage = Instant::now() + self.settings.usage.interval;
        let mut unreachable = 0u32;
        while !self.shared.is_stopping() {
            let generation = self.shared.generation();
            if link.as_ref().is_some_and(|(_, g, _)| *g != generation) {
                tracing::info!("worker replaced: setting it up again");
                link = None;
            }
            let (connection, generation) = match &mut link {
                Some((connection, generation, _)) => (connection, *generation),
                None => match self.endpoint.connect(Channel::Control) {
                    Ok(connected) => {
                        unreachable = 0;
                        let _ = connected.set_read_timeout(Some(self.settings.request_timeout));
                        tracing::info!(endpoint = %self.endpoint, "control channel open");
                        self.epochs.clear();
                        self.manifests.clear();
                        self.shared.set_loaded(&self.manifests);
                        self.unfit.clear();
                        self.refusals.clear();
                        next_scan = Instant::now();
                        let tracked = connected.try_clone().ok().map(|clone| self.shared.track(clone));
                        let (connection, generation, _) = link.insert((connected, generation, tracked));
                        (connection, *generation)
                    }
                    Err(error) => {
                        unreachable += 1;
                        // Quiet while a worker boots; then a reminder every half minute.
                        if unreachable % UNREACHABLE_REMINDER == UNREACHABLE_REMINDER / 3 {
                            tracing::warn!(%error, "worker not reachable");
                        } else {
                            tracing::debug!(%error, "worker not reachable yet");
                        }
                        self.shared.set_ready(generation, false);
                        self.shared.sleep(RECONNECT_DELAY);
                        continue;
                    }
                },
            };
            let mut outcome = self.serve_demands(connection);
            let mut backlog = false;
            if outcome.is_ok() && Instant::now() >= next_scan {
                outcome = self.configure(connection, generation);
                next_scan = Instant::now() + self.settings.rescan_interval;
            }
            if outcome.is_ok() {
                outcome = self.answer_attestation_requests(connection).map(|more| backlog = more);
            }
            if outcome.is_ok() && Instant::now() >= next_usage {
                outcome = self.collect_usage(connection, self.settings.usage.flush_each);
                next_usage = Instant::now() + self.settings.usage.interval;
            }
            if let Err(error) = outcome {
                if self.shared.is_stopping() {
                    break;
                }
                tracing::warn!(%error, "control channel lost");
                self.shared.set_ready(generation, false);
                link = None;
                self.shared.sleep(RECONNECT_DELAY);
                continue;
            }
            // An idle control connection shows a dead or restarted worker only when read; what
            // it sends unasked meanwhile (usage receipts) is taken, anything else ends it.
            if let Err(error) = take_unasked(connection, &self.usage) {
                tracing::warn!(%error, "control channel closed by the worker");
                self.shared.set_ready(generation, false);
                link = None;
                continue;
            }
            // With requests left over, the next pass starts at once (configure still gets its turn).
            let until_next = next_scan.min(next_usage).saturating_duration_since(Instant::now());
            let wait = if backlog { Duration::ZERO } else { until_next.min(self.settings.attestation_poll) };
            if self.shared.wait_for_control(generation, wait) {
                next_scan = Instant::now();
            }
        }
        // What the worker accounted so far, before the host goes (best effort: a stop may already
        // have cut the connection; the periods then end unsigned, no receipt is lost from the sequence).
        if let Some((connection, _, _)) = &mut link
            && let Err(error) = self.collect_usage(connection, true)
        {
            tracing::debug!(%error, "usage not collected at stop");
        }
        tracing::debug!("control stopped");
    }

    /// Asks the worker for its usage receipts (those of ended periods, or all with `flush`) and
    /// sends them, with any left from before, to the ledger queue.
    fn collect_usage(&mut self, link: &mut WorkerLink, flush: bool) -> Result<(), ControlError> {
        match self.request(link, &Message::CollectUsage { flush }) {
            Ok(_) => {}
            Err(ControlError::Refused(message)) => tracing::warn!(message, "worker refused to hand over usage receipts"),
            Err(error) => return Err(error),
        }
        self.usage.send_pending();
        Ok(())
    }

    /// One pass: every epoch and newest manifest the worker does not have yet, then a fresh
    /// publication if the last one is getting old.
    fn configure(&mut self, link: &mut WorkerLink, generation: u64) -> Result<(), ControlError> {
        let mut wanted = match self.wanted() {
            Ok(wanted) => wanted,
            Err(error) => {
                tracing::warn!(%error, "cannot list fleet keys or models");
                return Ok(());
            }
        };
        if self.renew_epoch(link, &wanted)? {
            match self.wanted() {
                Ok(fresh) => wanted = fresh,
                Err(error) => tracing::warn!(%error, "cannot list fleet keys or models"),
            }
        }
        let mut ready = None;
        for (epoch, (key, etag)) in &wanted.epochs {
            if self.epochs.contains(epoch) || self.refused(&Target::Epoch(*epoch), etag) {
                continue;
            }
            let request = Message::UseFleetEpoch { epoch: *epoch, object_key: key.clone() };
            match self.request(link, &request) {
                Ok(reply) => {
                    tracing::info!(epoch, "worker took up fleet epoch");
                    self.epochs.insert(*epoch);
                    self.last_publication = Instant::now();
                    ready = Some(reply.ready);
                }
                Err(ControlError::Refused(message)) => self.refusal(Target::Epoch(*epoch), etag, &message),
                Err(error) => return Err(error),
            }
        }
        // Only what fits beside the models held: this pass never evicts (jobs demand the rest).
        for (dir, versions) in &wanted.manifests {
            let chosen = match self.versions.choose(self.services.models.as_ref(), versions) {
                Ok(Some((_, key, etag))) => (key, etag),
                Ok(None) => {
                    tracing::debug!(dir, "no version of this model is for the worker's image");
                    continue;
                }
                Err(error) => {
                    tracing::warn!(dir, %error, "cannot read the model's manifests");
                    continue;
                }
            };
            let (key, etag) = chosen;
            if self.manifests.get(dir) == Some(key) || self.unfit.contains(key) || self.refused(&Target::Manifest(key.clone()), etag) {
                continue;
            }
            match self.request(link, &Message::LoadModelIfFits { manifest_key: key.clone() }) {
                Ok(reply) => {
                    tracing::info!(manifest = key, "worker loaded model");
                    self.manifests.insert(dir.clone(), key.clone());
                    ready = Some(reply.ready);
                }
                Err(ControlError::WouldEvict { model_id, bytes, free }) => {
                    tracing::info!(manifest = key, model_id, bytes, free, "model left to be loaded when a job needs it: it fits only by evicting");
                    self.unfit.insert(key.clone());
                }
                Err(ControlError::Refused(message)) => self.refusal(Target::Manifest(key.clone()), etag, &message),
                Err(error) => return Err(error),
            }
        }
        self.shared.set_loaded(&self.manifests);
        self.write_models_status(link)?;
        let newest = self.epochs.iter().copied().rfind(|e| wanted.epochs.contains_key(e));
        if let Some(epoch) = newest
            && self.last_publication.elapsed() >= self.settings.republish_interval
        {
            let key = wanted.epochs[&epoch].0.clone();
            match self.request(link, &Message::UseFleetEpoch { epoch, object_key: key }) {
                Ok(reply) => ready = Some(reply.ready),
                Err(ControlError::Refused(message)) => tracing::warn!(epoch, message, "re-publication refused"),
                Err(error) => return Err(error),
            }
            self.last_publication = Instant::now();
        }
        if let Some(ready) = ready {
            self.shared.set_ready(generation, ready);
        } else if !self.epochs.is_empty() && !self.manifests.is_empty() {
            self.shared.set_ready(generation, true);
        }
        Ok(())
    }

    /// Has the worker create the next epoch when no epoch with a genesis lasts beyond
    /// [`EPOCH_RENEWAL`], and stores it create-only: the record first (so two hosts never both
    /// claim a number), then its genesis. `true` when a new epoch was stored.
    fn renew_epoch(&mut self, link: &mut WorkerLink, wanted: &Wanted) -> Result<bool, ControlError> {
        let epoch = wanted.highest_epoch + 1;
        let target = Target::Creation(epoch);
        if self.refused(&target, "") {
            return Ok(false);
        }
        // The operator names the key (an alias or an ARN); the worker checks whatever it is.
        let kms_key = match self.services.kms.describe_key(&self.services.keys.fleet) {
            Ok(described) => described.arn,
            Err(error) => {
                self.refusal(target, "", &format!("fleet key {}: {error}", self.services.keys.fleet));
                return Ok(false);
            }
        };
        // Only epochs under this host's key count: a new image's hosts (a new key, which releases
        // only to them) create their own beside the old image's.
        let now = cloud::now_ms();
        let renew_at = now + EPOCH_RENEWAL.as_millis() as u64;
        if wanted.ends.values().any(|(key, end)| *key == kms_key && *end > renew_at) {
            return Ok(false);
        }
        let not_after_ms = now + EPOCH_VALIDITY.as_millis() as u64;
        let request = Message::CreateFleetEpoch { epoch, not_after_ms, kms_key: kms_key.clone() };
        let (record, genesis) = match self.request(link, &request) {
            Ok(Reply { created: Some(created), .. }) => created,
            Ok(_) => return Err(ControlError::Unexpected("Status without FleetEpochCreated")),
            Err(ControlError::Refused(message)) => {
                self.refusal(target, "", &message);
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        let store = &self.services.attestations;
        for (key, bytes) in [(epoch_object_key(epoch), record), (genesis_object_key(epoch), genesis)] {
            match retry::transient("store the new epoch", || store.put(&key, &bytes, PutCondition::CreateOnly)) {
                Ok(_) => {}
                Err(ObjectError::AlreadyExists { .. }) => {
                    tracing::info!(epoch, key, "another host stored this epoch first");
                    return Ok(true);
                }
                Err(error) => {
                    tracing::warn!(epoch, key, %error, "new epoch not stored");
                    return Ok(false);
                }
            }
        }
        tracing::info!(epoch, kms_key, not_after_ms, "fleet epoch created by the worker and stored");
        Ok(true)
    }

    fn refused(&mut self, target: &Target, etag: &str) -> bool {
        match self.refusals.get(target) {
            Some(refusal) if refusal.etag == etag => Instant::now() < refusal.next,
            Some(_) => {
                self.refusals.remove(target);
                false
            }
            None => false,
        }
    }

    fn refusal(&mut self, target: Target, etag: &str, message: &str) {
        let first = self.settings.refusal_retry.min(MAX_REFUSAL_DELAY);
        let delay = self.refusals.get(&target).map_or(first, |r| (r.delay * 2).min(MAX_REFUSAL_DELAY));
        tracing::warn!(?target, message, retry_in = ?delay, "worker refused");
        self.refusals.insert(target, Refusal { etag: etag.to_owned(), next: Instant::now() + delay, delay });
    }

    /// Fresh documents for clients' nonces. A request is answered once (create-only: the first
    /// host wins), then removed; a stale, malformed, oversized or refused one is removed
    /// unanswered. One pass lists at most [`REQUESTS_LISTED_PER_PASS`] keys from the cursor and
    /// asks the worker at most [`MAX_REQUESTS_PER_PASS`] times; `true` when it left work for
    /// the next pass, which then starts at once.
    fn answer_attestation_requests(&mut self, link: &mut WorkerLink) -> Result<bool, ControlError> {
        let store = Arc::clone(&self.services.attestations);
        let from = self.request_cursor.clone();
        let listed = retry::transient("list attestation requests", || {
            store.list_page(layout::ATTESTATION_REQUESTS_PREFIX, from.as_deref(), REQUESTS_LISTED_PER_PASS)
        });
        let page = match listed {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(%error, "cannot list attestation requests");
                return Ok(false);
            }
        };
        let full = page.len() == REQUESTS_LISTED_PER_PASS;
        let now = cloud::now_ms();
        let mut attested = 0;
        for meta in page {
            if attested == MAX_REQUESTS_PER_PASS {
                return Ok(true);
            }
            self.request_cursor = Some(meta.key.clone());
            if self.answer_request(link, &meta, now)? == Handled::Attested {
                attested += 1;
            }
        }
        if !full {
            // The end of the prefix: the next pass starts from its beginning, at once if this
            // one started further on (keys before the cursor have not been looked at).
            self.request_cursor = None;
            return Ok(from.is_some());
        }
        Ok(true)
    }

    /// One request. Tenant-written: its listed size is checked before anything is read, and no
    /// more than [`MAX_REQUEST_LEN`] bytes are read whatever it has become since.
    fn answer_request(&mut self, link: &mut WorkerLink, meta: &ObjectMeta, now: u64) -> Result<Handled, ControlError> {
        let store = Arc::clone(&self.services.attestations);
        let remove = || {
            if let Err(error) = store.delete(&meta.key) {
                tracing::debug!(key = meta.key, %error, "attestation request not removed");
            }
            Ok(Handled::Skipped)
        };
        let Some(nonce) = layout::nonce_of_request(&meta.key).filter(|n| !n.is_empty() && n.len() <= layout::MAX_REQUEST_NONCE_LEN) else {
            return remove();
        };
        if meta.size > MAX_REQUEST_LEN {
            tracing::warn!(key = meta.key, size = meta.size, "attestation request over {MAX_REQUEST_LEN} bytes removed unread");
            return remove();
        }
        let answer = layout::attestation_fresh(&nonce);
        if matches!(store.head(&answer), Ok(Some(_))) {
            return remove();
        }
        let body = match store.get_at_most(&meta.key, MAX_REQUEST_LEN) {
            Ok(body) => body,
            // Answered and removed by another host meanwhile.
            Err(ObjectError::NotFound { .. }) => return Ok(Handled::Skipped),
            Err(error) if error.is_transient() => {
                tracing::debug!(key = meta.key, %error, "attestation request left for the next pass");
                return Ok(Handled::Skipped);
            }
            Err(error) => {
                tracing::warn!(key = meta.key, %error, "attestation request removed unread");
                return remove();
            }
        };
        let requested_ms = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|body| body.get("requested_ms")?.as_u64());
        if !requested_ms.is_some_and(|at| is_fresh(at, now)) {
            return remove();
        }
        match self.request(link, &Message::Attest { request: 1, nonce: nonce.clone() }) {
            Ok(Reply { document: Some(document), .. }) => {
                match retry::transient("store fresh attestation", || store.put(&answer, &document, PutCondition::CreateOnly)) {
                    Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {
                        tracing::info!(key = answer, "fresh attestation for a client nonce");
                        remove()?;
                    }
                    Err(error) => tracing::warn!(key = answer, %error, "fresh attestation not stored"),
                }
            }
            Ok(Reply { document: None, .. }) => return Err(ControlError::Unexpected("Status without Attested")),
            Err(ControlError::Refused(message)) => {
                tracing::warn!(message, "worker refused a fresh attestation");
                remove()?;
            }
            Err(error) => return Err(error),
        }
        Ok(Handled::Attested)
    }

    /// Loads the models jobs wait for, evicting if the worker must; tells the waiters.
    fn serve_demands(&mut self, link: &mut WorkerLink) -> Result<(), ControlError> {
        for key in self.shared.take_demands() {
            let Some(dir) = model_dir(&key).map(str::to_owned) else {
                self.shared.demand_refused(&key);
                continue;
            };
            if self.manifests.get(&dir) == Some(&key) {
                self.shared.set_loaded(&self.manifests);
                continue;
            }
            match self.request(link, &Message::LoadModel { manifest_key: key.clone() }) {
                Ok(_) => {
                    tracing::info!(manifest = key, "worker loaded a model a job needs");
                    self.manifests.insert(dir, key.clone());
                    self.unfit.remove(&key);
                }
                Err(ControlError::Refused(message)) => {
                    tracing::warn!(manifest = key, message, "worker refused a model a job needs");
                    self.shared.demand_refused(&key);
                }
                Err(error) => {
                    self.shared.demand_refused(&key);
                    return Err(error);
                }
            }
            self.shared.set_loaded(&self.manifests);
            self.write_models_status(link)?;
        }
        Ok(())
    }

    /// With a status file set: asks the worker for its held models and budget and writes them
    /// there (replacing the file whole, so a reader never sees half of it).
    fn write_models_status(&mut self, link: &mut WorkerLink) -> Result<(), ControlError> {
        let Some(path) = self.settings.models_status.clone() else { return Ok(()) };
        let (budget, models) = match self.request(link, &Message::ListModels) {
            Ok(Reply { memory: Some(memory), .. }) => memory,
            Ok(_) => return Err(ControlError::Unexpected("Status without ModelMemory")),
            Err(ControlError::Refused(message)) => {
                tracing::debug!(message, "worker does not list its models");
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let status = ModelsStatus::new(budget, &models, |id| self.manifests.get(&model_dir_of(id)).cloned());
        if let Err(error) = status.write(&path) {
            tracing::warn!(path = %path.display(), %error, "models status not written");
        }
        Ok(())
    }

    /// Sends one request and serves the worker until it answers with its `Status` (or, to a load
    /// only if it fits, `ModelWouldEvict`). Models the worker evicted leave control's view.
    fn request(&mut self, link: &mut WorkerLink, request: &Message) -> Result<Reply, ControlError> {
        link.send(request)?;
        let mut document = None;
        let mut memory = None;
        let mut created = None;
        loop {
            match link.recv()? {
                Message::FetchObject { request, key } => self.relay.fetch(link, request, &key)?,
                Message::KmsCredentialsRequest { request } => self.relay.kms_credentials(link, request)?,
                Message::PublishAttestation { document } => {
                    self.versions.learn(&document);
                    self.relay.publish(document)
                }
                Message::Attested { document: fresh, .. } => document = Some(fresh),
                Message::UsageReceipt { receipt, attestation_document } => self.usage.received(&receipt, &attestation_document),
                Message::ModelEvicted { model_id, .. } => {
                    tracing::info!(model_id, "worker evicted a model (least recently used) to make room");
                    let dir = model_dir_of(&model_id);
                    self.manifests.retain(|held, _| *held != dir);
                }
                Message::ModelMemory { budget, models } => memory = Some((budget, models)),
                Message::FleetEpochCreated { record, genesis } => created = Some((record, genesis)),
                Message::ModelWouldEvict { model_id, bytes, free } => return Err(ControlError::WouldEvict { model_id, bytes, free }),
                Message::Status { ready, epochs, models, detail } => {
                    tracing::debug!(ready, ?epochs, ?models, detail, "worker status");
                    return Ok(Reply { ready, document, memory, created });
                }
                Message::Error { message } => return Err(ControlError::Refused(message)),
                other => return Err(ControlError::Unexpected(describe(&other))),
            }
        }
    }

    /// Reads what the stores hold now.
    fn wanted(&self) -> Result<Wanted, ObjectError> {
        let now = cloud::now_ms();
        let mut epochs = BTreeMap::new();
        let (mut ends, mut highest_epoch) = (BTreeMap::new(), 0);
        let attestations = &self.services.attestations;
        // Only an epoch whose genesis exists is offered to the worker: no client seals to any
        // other (the genesis is checked by clients, not here).
        let with_genesis: BTreeSet<String> = retry::transient("list fleet geneses", || attestations.list(GENESIS_PREFIX))?
            .into_iter()
            .map(|meta| meta.key)
            .collect();
        for meta in retry::transient("list fleet keys", || attestations.list(layout::FLEET_KEYS_PREFIX))? {
            let bytes = match retry::transient("get fleet key", || attestations.get_at_most(&meta.key, MAX_SMALL_OBJECT)) {
                Ok(bytes) => bytes,
                Err(ObjectError::NotFound { .. }) => continue,
                Err(error) => return Err(error),
            };
            // The record is untrusted here as everywhere; the host only needs its epoch and
            // expiry to decide what to ask for, and the worker checks both again.
            match EpochRecord::from_json(&bytes) {
                Ok(record) => {
                    highest_epoch = highest_epoch.max(record.epoch);
                    if record.not_after_ms <= now || meta.key != epoch_object_key(record.epoch) {
                        continue;
                    }
                    if !with_genesis.contains(&genesis_object_key(record.epoch)) {
                        tracing::debug!(epoch = record.epoch, "skipping an epoch without genesis");
                        continue;
                    }
                    ends.insert(record.epoch, (record.kms_key_id.clone(), record.not_after_ms));
                    epochs.insert(record.epoch, (meta.key.clone(), meta.etag.clone()));
                }
                Err(error) => tracing::warn!(key = meta.key, %error, "skipping fleet-key object"),
            }
        }
        let mut manifests: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        let models = &self.services.models;
        for meta in retry::transient("list models", || models.list(layout::MODELS_PREFIX))? {
            let Some(version) = layout::manifest_version(&meta.key) else { continue };
            let Some(dir) = model_dir(&meta.key) else { continue };
            manifests.entry(dir.to_owned()).or_default().push((version, meta.key.clone(), meta.etag.clone()));
        }
        for versions in manifests.values_mut() {
            versions.sort();
        }
        Ok(Wanted { epochs, ends, highest_epoch, manifests })
    }
}

/// Reads what the worker sent unasked on the idle connection, until nothing is waiting.
fn take_unasked(link: &mut WorkerLink, usage: &UsageDelivery) -> Result<(), ControlError> {
    while let Some(message) = link.poll_frame()? {
        match message {
            Message::UsageReceipt { receipt, attestation_document } => usage.received(&receipt, &attestation_document),
            other => return Err(ControlError::Unexpected(describe(&other))),
        }
    }
    Ok(())
}

/// A request dated within the TTL either side of now (saturating: any `u64` is a date here).
fn is_fresh(requested_ms: u64, now: u64) -> bool {
    now.saturating_sub(REQUEST_TTL_MS) <= requested_ms && requested_ms <= now.saturating_add(REQUEST_TTL_MS)
}

/// Where a host's first pass over the requests starts: a point of the key space picked by its
/// id, so that hosts do not all work the same first keys.
fn first_request_cursor(host_id: &str) -> String {
    let digest = Sha256::digest(host_id.as_bytes());
    format!("{}{}", layout::ATTESTATION_REQUESTS_PREFIX, hex::encode(&digest[..2]))
}

/// `models/<name>`: the directory of a model id's manifests.
pub(crate) fn model_dir_of(model_id: &str) -> String {
    let probe = layout::model_manifest(model_id, 0);
    model_dir(&probe).unwrap_or_default().to_owned()
}

/// `models/<name>` of `models/<name>/v<N>/manifest.cose`.
fn model_dir(manifest_key: &str) -> Option<&str> {
    let (version_dir, _) = manifest_key.rsplit_once('/')?;
    let (dir, _) = version_dir.rsplit_once('/')?;
    Some(dir)
}

/// The newest manifest key of the model directory `manifest_key` belongs to, if the store holds
/// one: a job that names a manifest newer than the worker runs waits for control to load it.
pub(crate) fn newest_manifest(models: &dyn cloud::ObjectStore, model_id: &str) -> Result<Option<String>, ObjectError> {
    let dir = model_dir_of(model_id);
    let dir = dir.as_str();
    if dir.is_empty() {
        return Ok(None);
    }
    let prefix = format!("{dir}/");
    let newest = retry::transient("list models", || models.list(&prefix))?
        .into_iter()
        .filter_map(|meta| layout::manifest_version(&meta.key).map(|v| (v, meta.key)))
        .filter(|(_, key)| model_dir(key) == Some(dir))
        .max();
    Ok(newest.map(|(_, key)| key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_dirs() {
        assert_eq!(model_dir("models/all-MiniLM-L6-v2/v3/manifest.cose"), Some("models/all-MiniLM-L6-v2"));
        assert_eq!(model_dir("manifest.cose"), None);
    }

    #[test]
    fn request_dates_saturate() {
        assert!(is_fresh(1_000_000, 1_000_000 + REQUEST_TTL_MS));
        assert!(!is_fresh(1_000_000, 1_000_001 + REQUEST_TTL_MS));
        assert!(!is_fresh(u64::MAX - 5, 1_000_000));
        assert!(is_fresh(u64::MAX, u64::MAX));
        assert!(is_fresh(0, 0));
        assert!(!is_fresh(0, REQUEST_TTL_MS + 1));
    }

    #[test]
    fn hosts_start_their_passes_at_different_points() {
        let starts: BTreeSet<String> = (0..8).map(|n| first_request_cursor(&format!("i-{n:017x}"))).collect();
        assert_eq!(starts.len(), 8);
        assert!(starts.iter().all(|s| s.starts_with(layout::ATTESTATION_REQUESTS_PREFIX) && s.len() == layout::ATTESTATION_REQUESTS_PREFIX.len() + 4));
        assert_eq!(first_request_cursor("host-a"), first_request_cursor("host-a"));
    }
}
