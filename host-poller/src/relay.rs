//! What the host does for the worker on the control channel: read objects it asks for, relay
//! its KMS calls, and publish its attestation documents. The host sees only what is public or
//! sealed anyway: encrypted model files, wrapped keys, and KMS answers sealed to the worker's
//! one-shot key.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

use cloud::{layout, ObjectError, ObjectStore, PutCondition, Services};
use protocol::frame::{Message, MAX_DATA_LEN};
use sha2::{Digest, Sha256};

use cloud::MAX_SMALL_OBJECT;
use crate::retry;
use crate::worker_link::{LinkError, WorkerLink};

/// Prefix of the attestation documents in the attestations store.
const ATTESTATIONS_PREFIX: &str = "attestations/";

pub(crate) struct Relay {
    services: Services,
    host_id: String,
    /// Documents this host published, by SHA-256: a receipt names one, the ledger message
    /// carries it, and a failed upload must not lose it.
    published: Mutex<HashMap<[u8; 32], Arc<Vec<u8>>>>,
}

impl Relay {
    pub fn new(services: Services, host_id: String) -> Self {
        Self { services, host_id, published: Mutex::new(HashMap::new()) }
    }

    /// The store the worker may read a key from: model files and manifests, fleet-key epochs
    /// and attestation documents. Never job objects: those reach the worker only on job
    /// channels, in the order the host chose.
    fn store_for(&self, key: &str) -> Option<&Arc<dyn ObjectStore>> {
        if key.starts_with(layout::MODELS_PREFIX) {
            Some(&self.services.models)
        } else if key.starts_with(layout::FLEET_KEYS_PREFIX) || key.starts_with(ATTESTATIONS_PREFIX) {
            Some(&self.services.attestations)
        } else {
            None
        }
    }

    /// Streams an object as `ObjectData` frames, or answers `ObjectMissing`.
    pub fn fetch(&self, link: &mut WorkerLink, request: u64, key: &str) -> Result<(), LinkError> {
        let Some(store) = self.store_for(key) else {
            tracing::warn!(key, "worker asked for an object outside models/, fleet-keys/, attestations/");
            return link.send(&Message::ObjectMissing { request, message: format!("{key}: not an object the host serves") });
        };
        let mut reader = match retry::transient("open object", || store.reader(key)) {
            Ok(reader) => reader,
            Err(error) => {
                tracing::warn!(key, %error, "object for the worker unavailable");
                return link.send(&Message::ObjectMissing { request, message: error.to_string() });
            }
        };
        // One chunk of look-ahead so the last frame can say it is the last.
        let mut current = Vec::new();
        let mut next = Vec::new();
        let mut sent = 0u64;
        if let Err(error) = read_chunk(&mut reader, &mut current) {
            return link.send(&Message::ObjectMissing { request, message: ObjectError::io(key, error).to_string() });
        }
        loop {
            if let Err(error) = read_chunk(&mut reader, &mut next) {
                tracing::warn!(key, %error, "object read failed mid-stream");
                return link.send(&Message::ObjectMissing { request, message: ObjectError::io(key, error).to_string() });
            }
            let last = next.is_empty();
            sent += current.len() as u64;
            link.send(&Message::ObjectData { request, data: std::mem::take(&mut current), last })?;
            if last {
                tracing::debug!(key, bytes = sent, "object sent to the worker");
                return Ok(());
            }
            std::mem::swap(&mut current, &mut next);
        }
    }

    /// Gives the worker the region and credentials for its own KMS call. The worker calls KMS
    /// over TLS that ends inside it; the host only relays its bytes (vsock-proxy in AWS, the
    /// local KMS endpoint here), so it never sees or shapes KMS's answer.
    pub fn kms_credentials(&self, link: &mut WorkerLink, request: u64) -> Result<(), LinkError> {
        let answer = match retry::transient("KMS credentials", || self.services.kms.enclave_access()) {
            Ok(access) => Message::KmsCredentials {
                request,
                region: access.region,
                access_key_id: access.access_key_id,
                secret_access_key: access.secret_access_key.to_string(),
                session_token: access.session_token,
            },
            Err(error) => {
                tracing::warn!(code = error.code(), %error, "no KMS credentials for the worker");
                Message::KmsFailed { request, code: error.code().into(), message: error.to_string() }
            }
        };
        link.send(&answer)
    }

    /// Stores a document by hash (create-only: the same bytes may already be there) and as
    /// this host's current one.
    pub fn publish(&self, document: Vec<u8>) {
        let sha256: [u8; 32] = Sha256::digest(&document).into();
        let document = Arc::new(document);
        self.published.lock().unwrap_or_else(|p| p.into_inner()).insert(sha256, Arc::clone(&document));
        let store = &self.services.attestations;
        let by_hash = layout::attestation_by_hash(&sha256);
        match retry::transient("publish attestation", || store.put(&by_hash, &document, PutCondition::CreateOnly)) {
            Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {}
            Err(error) => tracing::error!(key = by_hash, %error, "attestation document not stored"),
        }
        let current = layout::attestation_current(&self.host_id);
        match retry::transient("publish attestation", || store.put(&current, &document, PutCondition::Overwrite)) {
            Ok(_) => tracing::info!(sha256 = %hex::encode(sha256), key = current, "attestation published"),
            Err(error) => tracing::error!(key = current, %error, "current attestation not stored"),
        }
    }

    /// The document a receipt names: from memory if this host published it (stored again if the
    /// store lost it), else from the store.
    pub fn attestation_document(&self, sha256: &[u8; 32]) -> Result<Arc<Vec<u8>>, ObjectError> {
        let key = layout::attestation_by_hash(sha256);
        let known = self.published.lock().unwrap_or_else(|p| p.into_inner()).get(sha256).cloned();
        if let Some(document) = known {
            let store = &self.services.attestations;
            if retry::transient("head attestation", || store.head(&key))?.is_none() {
                match retry::transient("publish attestation", || store.put(&key, &document, PutCondition::CreateOnly)) {
                    Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            return Ok(document);
        }
        let document = retry::transient("get attestation", || self.services.attestations.get_at_most(&key, MAX_SMALL_OBJECT))?;
        if <[u8; 32]>::from(Sha256::digest(&document)) != *sha256 {
            return Err(ObjectError::Unavailable { key, message: "stored document does not have its name's hash".into() });
        }
        Ok(Arc::new(document))
    }
}

/// Fills `buf` with up to [`MAX_DATA_LEN`] bytes; empty at the end.
fn read_chunk(reader: &mut dyn Read, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    buf.resize(MAX_DATA_LEN, 0);
    let mut filled = 0;
    while filled < MAX_DATA_LEN {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(())
}
