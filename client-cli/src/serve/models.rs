//! The model manifest each requested model is pinned to: chosen and checked exactly as `submit`
//! chooses it (signature, publisher, minimum version, this client's ratchet), remembered per model
//! for a refresh period. The enclave refuses a request whose model runs another manifest.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cloud::ObjectStore;
use ed25519_dalek::VerifyingKey;

use crate::home::Home;
use crate::model_choice::{choose_model, ModelPins};

pub struct ModelPinning {
    home: Home,
    publisher: VerifyingKey,
    refresh: Duration,
    /// Per model id and image PCR0.
    checked: Mutex<BTreeMap<(String, Vec<u8>), ([u8; 32], Instant)>>,
}

impl ModelPinning {
    pub fn new(home: Home, publisher: VerifyingKey, refresh: Duration) -> Self {
        Self { home, publisher, refresh, checked: Mutex::new(BTreeMap::new()) }
    }

    pub fn publisher(&self) -> VerifyingKey {
        self.publisher
    }

    /// The manifest hash requests for `model_id` must be served with.
    pub fn manifest(&self, models: &dyn ObjectStore, model_id: &str, image_pcr0: &[u8]) -> Result<[u8; 32], String> {
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        let cache_key = (model_id.to_owned(), image_pcr0.to_vec());
        if let Some((hash, _)) = checked.get(&cache_key).filter(|(_, at)| at.elapsed() < self.refresh) {
            return Ok(*hash);
        }
        let model = choose_model(models, model_id, &self.publisher, &self.home, &ModelPins::default(), image_pcr0)
            .map_err(|e| e.to_string())?;
        checked.insert(cache_key, (model.hash, Instant::now()));
        Ok(model.hash)
    }
}
