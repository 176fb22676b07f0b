//! The control connection: the host asks the worker to take up a fleet epoch, load a model or
//! produce a fresh attestation document; the worker answers, asking the host in turn for objects
//! and the credentials for its own KMS calls. Whatever the host sends is checked: objects against
//! the signed manifest and the AEAD; KMS answers come through the worker's own TLS session with
//! KMS and open only with the one-shot key they are sealed to.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use protocol::envelope::FleetSecretKey;
use protocol::fleet::EpochRecord;
use protocol::kms_arn::KmsKeyArn;
use protocol::key_checks::KeyEvidence;
use protocol::kms_api::{self, AwsCredentials, DecryptRequest, GenerateDataKeyPairRequest, GenerateDataKeyPairResponse, RecipientInfo};
use protocol::frame::{self, FrameIoError, Message};
use protocol::manifest::{Manifest, SignedManifest};
use protocol::stream::StreamOpener;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::inference::{DenseFiles, Embedder, EmbedderSettings, Engine, HeadFiles, ModelFiles};
use crate::key_release::kms_https::KmsHttps;
use crate::key_release::{self, FleetEpoch, KmsTransport, KmsTransportError, RsaKeyPool};
use crate::model_memory::{MemoryError, Room};
use crate::nsm::AttestationRequest;
use crate::online::OnlineState;
use crate::worker::{Epoch, LoadedModel, Worker};

/// Largest object the worker fetches (model weights included).
const MAX_OBJECT_LEN: usize = 2 << 30;
/// Largest manifest or epoch record.
const MAX_SMALL_OBJECT_LEN: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("connection: {0}")]
    Connection(#[from] FrameIoError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("object {key}: {message}")]
    Object { key: String, message: String },
    #[error("fleet epoch record: {0}")]
    EpochRecord(#[from] protocol::fleet::EpochRecordError),
    #[error("key release: {0}")]
    KeyRelease(#[from] key_release::KeyReleaseError),
    #[error("model manifest: {0}")]
    Manifest(#[from] protocol::manifest::ManifestError),
    #[error("model file {file}: {message}")]
    ModelFile { file: String, message: String },
    #[error("model: {0}")]
    Model(String),
    #[error("attestation: {0}")]
    Attestation(String),
    #[error("fleet_epoch_in_use: {0}")]
    EpochInUse(String),
    /// The model needs more than the whole model memory budget.
    #[error("{0}")]
    OverBudget(MemoryError),
    /// A load only if it fits would have had to evict: answered by `ModelWouldEvict`.
    #[error("{0}")]
    WouldEvict(MemoryError),
}

impl From<MemoryError> for ControlError {
    fn from(error: MemoryError) -> Self {
        match error {
            MemoryError::OverBudget { .. } => ControlError::OverBudget(error),
            MemoryError::WouldEvict { .. } => ControlError::WouldEvict(error),
        }
    }
}

impl ControlError {
    /// The check a failure names, as reported to the host.
    pub fn check(&self) -> &'static str {
        match self {
            ControlError::Connection(_) | ControlError::Protocol(_) => "protocol",
            ControlError::Object { .. } => "object",
            ControlError::EpochRecord(_) => "fleet_epoch_record",
            ControlError::KeyRelease(e) => e.check(),
            ControlError::Manifest(_) => "model_manifest",
            ControlError::ModelFile { .. } => "model_file",
            ControlError::Model(_) => "model",
            ControlError::Attestation(_) => "attestation",
            ControlError::EpochInUse(_) => "fleet_epoch_in_use",
            ControlError::OverBudget(_) => "model_over_budget",
            ControlError::WouldEvict(_) => "model_would_evict",
        }
    }
}

/// The worker's side of a control connection.
pub struct Control<'c, C> {
    connection: &'c mut C,
    next_request: u64,
    kms: &'c KmsHttps,
}

impl<C: Read + Write> Control<'_, C> {
    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn send(&mut self, message: &Message) -> Result<(), ControlError> {
        frame::write_frame(self.connection, message)?;
        self.connection.flush().map_err(FrameIoError::from)?;
        Ok(())
    }

    fn receive(&mut self) -> Result<Message, ControlError> {
        frame::read_frame(self.connection)?.ok_or_else(|| ControlError::Protocol("control connection closed".into()))
    }

    /// Asks the host for an object and hands its bytes to `sink` as they arrive.
    fn fetch(&mut self, key: &str, limit: usize, mut sink: impl FnMut(&[u8]) -> Result<(), ControlError>) -> Result<(), ControlError> {
        let request = self.request_id();
        self.send(&Message::FetchObject { request, key: key.to_owned() })?;
        let mut received = 0usize;
        loop {
            match self.receive()? {
                Message::ObjectData { request: r, data, last } if r == request => {
                    received += data.len();
                    if received > limit {
                        return Err(ControlError::Object { key: key.into(), message: format!("larger than {limit} bytes") });
                    }
                    sink(&data)?;
                    if last {
                        return Ok(());
                    }
                }
                Message::ObjectMissing { request: r, message } if r == request => {
                    return Err(ControlError::Object { key: key.into(), message });
                }
                other => return Err(ControlError::Protocol(format!("expected object data for request {request}, got {other:?}"))),
            }
        }
    }

    fn fetch_small(&mut self, key: &str) -> Result<Vec<u8>, ControlError> {
        let mut bytes = Vec::new();
        self.fetch(key, MAX_SMALL_OBJECT_LEN, |data| {
            bytes.extend_from_slice(data);
            Ok(())
        })?;
        Ok(bytes)
    }
}

impl<C: Read + Write> Control<'_, C> {
    /// The host role's credentials for one KMS call.
    fn credentials(&mut self) -> Result<AwsCredentials, KmsTransportError> {
        let transport = |e: ControlError| KmsTransportError::new(KmsTransportError::TRANSPORT, e.to_string());
        let request = self.request_id();
        self.send(&Message::KmsCredentialsRequest { request }).map_err(transport)?;
        let credentials = match self.receive().map_err(transport)? {
            Message::KmsCredentials { request: r, region, access_key_id, secret_access_key, session_token } if r == request => {
                AwsCredentials { region, access_key_id, secret_access_key: Zeroizing::new(secret_access_key), session_token }
            }
            Message::KmsFailed { request: r, code, message } if r == request => return Err(KmsTransportError::new(code, message)),
            other => {
                return Err(KmsTransportError::new(KmsTransportError::TRANSPORT, format!("unexpected answer {other:?}")));
            }
        };
        Ok(credentials)
    }
}

fn recipient(attestation_document: Vec<u8>) -> RecipientInfo {
    RecipientInfo { key_encryption_algorithm: kms_api::RSAES_OAEP_SHA_256.into(), attestation_document }
}

impl<C: Read + Write> KmsTransport for Control<'_, C> {
    fn decrypt(
        &mut self,
        key_id: Option<String>,
        ciphertext_blob: Vec<u8>,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<(String, Vec<u8>), KmsTransportError> {
        let credentials = self.credentials()?;
        let request = DecryptRequest { ciphertext_blob, key_id, encryption_context, recipient: Some(recipient(recipient_attestation)) };
        self.kms.decrypt(&credentials, &request)
    }

    fn key_evidence(&mut self, key: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        let credentials = self.credentials()?;
        self.kms.key_evidence(&credentials, key)
    }

    fn generate_data_key_pair(
        &mut self,
        key: &KmsKeyArn,
        encryption_context: BTreeMap<String, String>,
        recipient_attestation: Vec<u8>,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        let credentials = self.credentials()?;
        let request = GenerateDataKeyPairRequest {
            key_id: key.to_string(),
            key_pair_spec: kms_api::ECC_NIST_P256.into(),
            encryption_context,
            recipient: Some(recipient(recipient_attestation)),
        };
        self.kms.generate_data_key_pair(&credentials, key, &request)
    }
}

/// Serves a control connection after its `Hello` until the host closes it.
pub fn serve<C: Read + Write>(worker: &Worker, online: &OnlineState, pool: &RsaKeyPool, connection: &mut C) -> Result<(), ControlError> {
    let mut control = Control { connection, next_request: 0, kms: worker.kms() };
    loop {
        let Some(message) = frame::read_frame(control.connection)? else {
            return Ok(());
        };
        let outcome = match message {
            Message::UseFleetEpoch { epoch, object_key } => use_epoch(worker, pool, &mut control, epoch, &object_key),
            Message::CreateFleetEpoch { epoch, not_after_ms, kms_key } => {
                create_epoch(worker, pool, &mut control, FleetEpoch { epoch, not_after_ms }, &kms_key)
            }
            Message::LoadModel { manifest_key } => load_model(worker, pool, &mut control, &manifest_key, Room::Evict),
            Message::LoadModelIfFits { manifest_key } => load_model(worker, pool, &mut control, &manifest_key, Room::OnlyIfFits),
            Message::ListModels => list_models(worker, &mut control),
            Message::Attest { request, nonce } => attest(worker, &mut control, request, &nonce),
            Message::CollectUsage { flush } => collect_usage(worker, online, &mut control, flush),
            other => Err(ControlError::Protocol(format!("unexpected message {other:?}"))),
        };
        match outcome {
            Ok(()) => control.send(&status(worker, "ok"))?,
            Err(ControlError::Connection(error)) => return Err(ControlError::Connection(error)),
            Err(ControlError::WouldEvict(MemoryError::WouldEvict { model_id, bytes, free, .. })) => {
                tracing::info!(model = model_id, bytes, free, "model not loaded: it would evict another");
                control.send(&Message::ModelWouldEvict { model_id, bytes, free })?;
            }
            Err(error) => {
                tracing::warn!(check = error.check(), %error, "control request failed");
                control.send(&Message::Error { message: format!("{}: {error}", error.check()) })?;
            }
        }
    }
}

/// Sends the usage receipts of ended periods (all if `flush`); `Status` follows.
fn collect_usage<C: Read + Write>(worker: &Worker, online: &OnlineState, control: &mut Control<'_, C>, flush: bool) -> Result<(), ControlError> {
    let receipts = online.usage.lock().unwrap_or_else(|e| e.into_inner()).collect(worker, worker.now_ms(), flush);
    for (receipt, attestation_document) in receipts {
        control.send(&Message::UsageReceipt { receipt, attestation_document })?;
    }
    Ok(())
}

fn status(worker: &Worker, detail: &str) -> Message {
    Message::Status {
        ready: !worker.epochs().is_empty() && !worker.models().is_empty(),
        epochs: worker.epochs(),
        models: worker.models(),
        detail: detail.to_owned(),
    }
}

/// Releases the fleet key of an epoch through KMS and publishes a document binding it. An epoch
/// the worker already holds is only published again: its key is never replaced, whatever record
/// the host sends now.
fn use_epoch<C: Read + Write>(
    worker: &Worker,
    pool: &RsaKeyPool,
    control: &mut Control<'_, C>,
    epoch: u64,
    object_key: &str,
) -> Result<(), ControlError> {
    if let Some(held) = worker.epoch(epoch) {
        let document = publish(worker, control, &held.secret, epoch, held.not_after_ms, &held.kms_key)?;
        let document_sha256 = Sha256::digest(&document).into();
        worker.republished(epoch, document, document_sha256);
        tracing::info!(epoch, "fleet epoch published again");
        return Ok(());
    }
    // Held but expired: never released again under the same number, so no document is ever
    // published for a key the worker would then refuse to hold.
    if worker.held_epoch(epoch).is_some() {
        return Err(ControlError::EpochInUse(format!("epoch {epoch} was held and has ended; it is not taken up again")));
    }
    let record = EpochRecord::from_json(&control.fetch_small(object_key)?)?;
    if record.epoch != epoch {
        return Err(ControlError::Protocol(format!("object {object_key} holds epoch {}, not {epoch}", record.epoch)));
    }
    let released = key_release::release_fleet_key(worker.nsm(), pool, control, &record)?;
    let document = publish(worker, control, &released.secret, epoch, record.not_after_ms, &released.kms_key)?;
    let document_sha256 = Sha256::digest(&document).into();
    let held = Epoch {
        secret: released.secret,
        not_after_ms: record.not_after_ms,
        kms_key: released.kms_key,
        document,
        document_sha256,
    };
    worker.add_epoch(epoch, held).map_err(|e| ControlError::EpochInUse(e.to_string()))?;
    tracing::info!(epoch, "fleet epoch in use, attestation published");
    Ok(())
}

/// Creates an epoch (`key_release::genesis`) and sends its record and genesis to the host. The
/// worker does not hold the key yet: it takes the epoch up, as any other, when the host asks it to
/// use the record the host stored (another host may have won the race for the number).
fn create_epoch<C: Read + Write>(
    worker: &Worker,
    pool: &RsaKeyPool,
    control: &mut Control<'_, C>,
    epoch: FleetEpoch,
    kms_key: &str,
) -> Result<(), ControlError> {
    let kms_key = kms_key.parse::<KmsKeyArn>().map_err(|e| key_release::KeyReleaseError::FleetKmsKey(e.to_string()))?;
    let created = key_release::genesis::create_fleet_epoch(worker.nsm(), pool, control, &kms_key, epoch)?;
    tracing::info!(epoch = epoch.epoch, kms_key = %kms_key, "fleet epoch created");
    control.send(&Message::FleetEpochCreated {
        record: created.record.to_json().into_bytes(),
        genesis: created.genesis.to_json().into_bytes(),
    })
}

/// Makes and publishes the document binding an epoch's keys; returns it.
fn publish<C: Read + Write>(
    worker: &Worker,
    control: &mut Control<'_, C>,
    secret: &FleetSecretKey,
    epoch: u64,
    not_after_ms: u64,
    kms_key: &KmsKeyArn,
) -> Result<Vec<u8>, ControlError> {
    let binding = worker.binding(secret, epoch, not_after_ms, kms_key).map_err(|e| ControlError::Attestation(e.to_string()))?;
    let document = worker
        .nsm()
        .attest(AttestationRequest::publication(&binding))
        .map_err(|e| ControlError::Attestation(e.to_string()))?;
    control.send(&Message::PublishAttestation { document: document.clone() })?;
    Ok(document)
}

/// A fresh document for a client's nonce, binding the newest epoch's keys.
fn attest<C: Read + Write>(worker: &Worker, control: &mut Control<'_, C>, request: u64, nonce: &[u8]) -> Result<(), ControlError> {
    let newest = worker.epochs().into_iter().filter_map(|e| worker.epoch(e).map(|k| (e, k))).last();
    let (number, epoch) = newest.ok_or_else(|| ControlError::Attestation("no fleet epoch in use".into()))?;
    let binding = worker
        .binding(&epoch.secret, number, epoch.not_after_ms, &epoch.kms_key)
        .map_err(|e| ControlError::Attestation(e.to_string()))?;
    let request_document = AttestationRequest::fresh(&binding, nonce).map_err(|e| ControlError::Attestation(e.to_string()))?;
    let document = worker.nsm().attest(request_document).map_err(|e| ControlError::Attestation(e.to_string()))?;
    control.send(&Message::Attested { request, document })
}

/// The models held and the budget (`ModelMemory`); `Status` follows.
fn list_models<C: Read + Write>(worker: &Worker, control: &mut Control<'_, C>) -> Result<(), ControlError> {
    let models = worker
        .resident_models()
        .into_iter()
        .map(|r| frame::ResidentModel {
            model_id: r.model_id,
            manifest_hash: r.value.manifest_hash.to_vec(),
            version: r.value.manifest.version,
            bytes: r.bytes,
            last_use_ms: r.last_use_ms,
        })
        .collect();
    control.send(&Message::ModelMemory { budget: worker.model_budget(), models })
}

/// Verifies a signed manifest, releases its DEK, decrypts and checks every file, loads the model
/// under the memory budget (evicting least recently used models if `room` allows: each evicted
/// one is reported by `ModelEvicted`).
fn load_model<C: Read + Write>(
    worker: &Worker,
    pool: &RsaKeyPool,
    control: &mut Control<'_, C>,
    manifest_key: &str,
    room: Room,
) -> Result<(), ControlError> {
    let started = std::time::Instant::now();
    let signed = SignedManifest::decode(&control.fetch_small(manifest_key)?)?;
    let manifest = signed.verify(worker.publisher())?.clone();
    // A manifest measured before is refused before its key is released and its files decrypted.
    worker.check_model_room(&manifest.model_id, &signed.hash, room)?;
    let dek = key_release::release_data_key(worker.nsm(), pool, control, &manifest)?;
    // The three files of every model, then the Dense modules' the signed list names, in order.
    let dense_modules = manifest.dense_modules()?;
    let mut names: Vec<String> = ["config.json", "tokenizer.json", "model.safetensors"].map(String::from).to_vec();
    names.extend((0..dense_modules).flat_map(protocol::manifest::dense_file_names));
    // bge-m3's heads, listed exactly when the manifest's outputs offer them (checked as it was read).
    let heads = [protocol::manifest::LEXICAL_HEAD_FILE, protocol::manifest::COLBERT_HEAD_FILE];
    names.extend(heads.iter().filter(|name| manifest.file(name).is_some()).map(|name| (*name).to_owned()));
    let mut files: BTreeMap<&str, Zeroizing<Vec<u8>>> = BTreeMap::new();
    for name in &names {
        let name = name.as_str();
        let file = manifest
            .file(name)
            .ok_or_else(|| ControlError::ModelFile { file: name.into(), message: "not in the manifest".into() })?;
        let bytes = fetch_model_file(control, &manifest, &dek, manifest_key, name)?;
        if bytes.len() as u64 != file.size || <[u8; 32]>::from(Sha256::digest(bytes.as_slice())) != file.sha256 {
            return Err(ControlError::ModelFile { file: name.into(), message: "size or SHA-256 differs from the manifest".into() });
        }
        files.insert(name, bytes);
    }
    let dense: Vec<DenseFiles<'_>> = (0..dense_modules)
        .map(|i| {
            let [config, weights] = protocol::manifest::dense_file_names(i);
            DenseFiles { config: &files[config.as_str()], weights: &files[weights.as_str()] }
        })
        .collect();
    let embedder = Embedder::load_with_template(
        ModelFiles { config: &files["config.json"], tokenizer: &files["tokenizer.json"], weights: &files["model.safetensors"], dense: &dense },
        EmbedderSettings::from_manifest(&manifest),
        manifest.rerank_template.as_ref(),
    )
    .and_then(|embedder| {
        embedder.with_heads(HeadFiles { lexical: files.get(heads[0]).map(|f| f.as_slice()), colbert: files.get(heads[1]).map(|f| f.as_slice()) })
    })
    .map_err(|e| ControlError::Model(e.to_string()))?;
    drop(dense);
    drop(files);
    let engine = Engine::new(Arc::new(embedder), worker.engine_settings()).map_err(|e| ControlError::Model(e.to_string()))?;
    let model_id = manifest.model_id.clone();
    let evicted = worker.add_model(LoadedModel { manifest, manifest_hash: signed.hash, engine }, room)?;
    for gone in evicted {
        tracing::info!(model = gone.model_id, bytes = gone.bytes, "model evicted (least recently used) to make room");
        control.send(&Message::ModelEvicted { model_id: gone.model_id, manifest_hash: gone.value.manifest_hash.to_vec() })?;
    }
    tracing::info!(model = %model_id, seconds = started.elapsed().as_secs_f64(), "model loaded");
    Ok(())
}

/// Streams one encrypted model file in and decrypts it as it arrives.
fn fetch_model_file<C: Read + Write>(
    control: &mut Control<'_, C>,
    manifest: &Manifest,
    dek: &[u8; 32],
    manifest_key: &str,
    name: &str,
) -> Result<Zeroizing<Vec<u8>>, ControlError> {
    let expected = manifest.file(name).map(|f| f.size as usize).unwrap_or(0);
    let mut opener = StreamOpener::new(&manifest.file_key(dek, name), manifest.file_stream_id(name));
    let mut plaintext = Zeroizing::new(Vec::with_capacity(expected));
    let file_error = |e: protocol::stream::StreamError| ControlError::ModelFile { file: name.into(), message: e.to_string() };
    control.fetch(&Manifest::file_object_key(manifest_key, name), MAX_OBJECT_LEN, |data| {
        opener.push(data, &mut plaintext).map_err(file_error)
    })?;
    opener.finish(&mut plaintext).map_err(file_error)?;
    Ok(plaintext)
}
