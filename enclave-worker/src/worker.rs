//! What one enclave holds: its NSM, its per-boot receipt key, the fleet keys of the epochs it has
//! released, the models it has loaded (under its model memory budget, [`crate::model_memory`]),
//! and the attestation documents it has published.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use ed25519_dalek::{SigningKey, VerifyingKey};
use protocol::attestation::UserDataBinding;
use protocol::envelope::FleetSecretKey;
use protocol::kms_arn::KmsKeyArn;
use protocol::manifest::Manifest;

use crate::inference::{Engine, EngineSettings};
use crate::key_release::kms_https::KmsHttps;
use crate::model_memory::{Evicted, Measured, MemoryError, ModelMemory, Resident, Room};
use crate::nsm::{Nsm, NsmError};

/// The fleet key of one epoch and the document that publishes it.
pub struct Epoch {
    pub secret: FleetSecretKey,
    pub not_after_ms: u64,
    /// The KMS key that released `secret` (as KMS answered).
    pub kms_key: KmsKeyArn,
    /// The published attestation document binding {fleet key, receipt key, epoch, not_after,
    /// KMS key}.
    pub document: Vec<u8>,
    pub document_sha256: [u8; 32],
}

/// A verified, decrypted, loaded model.
pub struct LoadedModel {
    pub manifest: Manifest,
    pub manifest_hash: [u8; 32],
    pub engine: Engine,
}

impl Measured for LoadedModel {
    /// What the engine holds as measured; for an engine that cannot measure itself (the candle
    /// backend), the sizes of its weights and tokenizer files.
    fn memory_bytes(&self) -> u64 {
        self.engine.embedder().memory_bytes().unwrap_or_else(|| {
            ["model.safetensors", "tokenizer.json"].iter().filter_map(|name| self.manifest.file(name)).map(|f| f.size).sum()
        })
    }
}

/// The model memory budget when none is given: half the memory of the machine (in an enclave,
/// the memory allocated to it), the other half left to jobs' batches and buffers; 2 GiB where
/// the total cannot be read.
pub fn default_model_budget() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| {
        info.lines().find_map(|line| line.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    });
    total_kib.map_or(2 << 30, |kib| kib * 1024 / 2)
}

/// `add_epoch` of an epoch the worker already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("epoch {0} is already in use; an epoch's key is never replaced")]
pub struct EpochInUse(pub u64);

pub struct Worker {
    nsm: Arc<dyn Nsm>,
    receipt_key: SigningKey,
    publisher: VerifyingKey,
    engine_settings: EngineSettings,
    kms: KmsHttps,
    epochs: RwLock<BTreeMap<u64, Arc<Epoch>>>,
    models: Mutex<ModelMemory<LoadedModel>>,
    /// Measured bytes of every manifest loaded since boot, so that a load only if it fits can
    /// be refused before the model is decrypted again.
    measured: Mutex<HashMap<[u8; 32], u64>>,
}

impl Worker {
    /// A worker with a fresh receipt key, generated here and never exported.
    /// `kms` is how the worker reaches KMS itself (the relay and the roots it trusts).
    pub fn new(nsm: Arc<dyn Nsm>, publisher: VerifyingKey, engine_settings: EngineSettings, kms: KmsHttps) -> Self {
        let receipt_key = SigningKey::generate(&mut rand_core::UnwrapErr(getrandom::SysRng));
        Self {
            nsm,
            receipt_key,
            publisher,
            engine_settings,
            kms,
            epochs: RwLock::new(BTreeMap::new()),
            models: Mutex::new(ModelMemory::new(default_model_budget())),
            measured: Mutex::new(HashMap::new()),
        }
    }

    /// The same worker with a model memory budget of `bytes`.
    pub fn with_model_budget(self, bytes: u64) -> Self {
        Self { models: Mutex::new(ModelMemory::new(bytes)), ..self }
    }

    pub fn nsm(&self) -> &dyn Nsm {
        self.nsm.as_ref()
    }

    pub fn now_ms(&self) -> u64 {
        self.nsm.now_ms()
    }

    pub fn receipt_key(&self) -> &SigningKey {
        &self.receipt_key
    }

    pub fn publisher(&self) -> &VerifyingKey {
        &self.publisher
    }

    pub fn kms(&self) -> &KmsHttps {
        &self.kms
    }

    pub fn engine_settings(&self) -> EngineSettings {
        self.engine_settings
    }

    /// PCRs a receipt records: 0, 1, 2 and 8 when set.
    pub fn receipt_pcrs(&self) -> BTreeMap<u8, Vec<u8>> {
        self.nsm
            .pcrs()
            .iter()
            .filter(|(index, value)| matches!(index, 0..=2) || (**index == 8 && value.iter().any(|b| *b != 0)))
            .map(|(i, v)| (*i, v.clone()))
            .collect()
    }

    /// The binding the worker publishes for an epoch: keys it holds itself and the KMS key that
    /// released the fleet key, nothing else from the host.
    pub fn binding(
        &self,
        secret: &FleetSecretKey,
        epoch: u64,
        not_after_ms: u64,
        kms_key: &KmsKeyArn,
    ) -> Result<UserDataBinding, NsmError> {
        crate::nsm::own_binding(secret, &self.receipt_key, epoch, not_after_ms, kms_key)
    }

    /// Takes up an epoch. An epoch already in use is never replaced: jobs sealed to its key and
    /// the document published for it stay valid, and a host cannot swap the key under them.
    pub fn add_epoch(&self, epoch_number: u64, epoch: Epoch) -> Result<(), EpochInUse> {
        let mut epochs = self.epochs.write().unwrap_or_else(|e| e.into_inner());
        if epochs.contains_key(&epoch_number) {
            return Err(EpochInUse(epoch_number));
        }
        epochs.insert(epoch_number, Arc::new(epoch));
        Ok(())
    }

    /// Records a fresh publication of an epoch already held: later receipts name the newest
    /// document. The key stays the one released.
    pub fn republished(&self, epoch_number: u64, document: Vec<u8>, document_sha256: [u8; 32]) {
        let mut epochs = self.epochs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = epochs.get(&epoch_number) {
            let fresh = Epoch {
                secret: held.secret.clone(),
                not_after_ms: held.not_after_ms,
                kms_key: held.kms_key.clone(),
                document,
                document_sha256,
            };
            epochs.insert(epoch_number, Arc::new(fresh));
        }
    }

    /// The fleet key of `epoch`, unless it has expired.
    pub fn epoch(&self, epoch: u64) -> Option<Arc<Epoch>> {
        let now = self.now_ms();
        self.epochs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&epoch)
            .filter(|e| e.not_after_ms > now)
            .cloned()
    }

    /// The epoch as held, expired or not: what a receipt about past work names.
    pub fn held_epoch(&self, epoch: u64) -> Option<Arc<Epoch>> {
        self.epochs.read().unwrap_or_else(|e| e.into_inner()).get(&epoch).cloned()
    }

    pub fn epochs(&self) -> Vec<u64> {
        self.epochs.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, ModelMemory<LoadedModel>> {
        self.models.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a manifest measured before would be refused now (`Ok` when it fits, or was never
    /// measured: then only loading it tells).
    pub fn check_model_room(&self, model_id: &str, manifest_hash: &[u8; 32], room: Room) -> Result<(), MemoryError> {
        let known = self.measured.lock().unwrap_or_else(|e| e.into_inner()).get(manifest_hash).copied();
        match known {
            Some(bytes) => self.memory().check(model_id, bytes, room),
            None => Ok(()),
        }
    }

    /// Holds a loaded model under the budget (replacing the held one of its id); returns the
    /// models evicted for it. Jobs that hold an evicted model finish with it.
    pub fn add_model(&self, model: LoadedModel, room: Room) -> Result<Vec<Evicted<LoadedModel>>, MemoryError> {
        let bytes = model.memory_bytes();
        self.measured.lock().unwrap_or_else(|e| e.into_inner()).insert(model.manifest_hash, bytes);
        let id = model.manifest.model_id.clone();
        let now = self.now_ms();
        self.memory().insert(&id, Arc::new(model), now, room)
    }

    /// The model for a job or online request: taking it counts as a use.
    pub fn model(&self, model_id: &str) -> Option<Arc<LoadedModel>> {
        let now = self.now_ms();
        self.memory().take(model_id, now)
    }

    pub fn models(&self) -> Vec<String> {
        self.memory().ids()
    }

    /// The held models, their bytes now and last use.
    pub fn resident_models(&self) -> Vec<Resident<LoadedModel>> {
        self.memory().residents()
    }

    pub fn model_budget(&self) -> u64 {
        self.memory().budget()
    }
}
