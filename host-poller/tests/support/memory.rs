//! An in-memory cloud with the traits' semantics (create-only writes, visibility timeouts,
//! receive counts, a dead-letter limit), for tests that drive the poller against a scripted
//! worker. KMS here does not check anything: it "seals" by prefixing, which is all the relay
//! must pass through untouched.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloud::kms::{DataKey, DataKeyPair, Decrypted, EncryptionContext, Kms, KmsError, Recipient};
use cloud::workflow::{Completion, TaskTokens, WorkflowError};
use cloud::AwsCredentials;
use cloud::{KeyNames, ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition, Queue, QueueError, QueueStats, Received, SendOptions, Services};

#[derive(Default)]
struct Objects {
    map: Mutex<BTreeMap<String, (Vec<u8>, u64)>>,
    version: AtomicU64,
}

impl Objects {
    fn put(&self, key: &str, bytes: &[u8], condition: &PutCondition) -> Result<ObjectMeta, ObjectError> {
        let mut map = self.map.lock().unwrap();
        match (condition, map.get(key)) {
            (PutCondition::CreateOnly, Some(_)) => return Err(ObjectError::AlreadyExists { key: key.into() }),
            (PutCondition::IfMatch(etag), Some((_, v))) if v.to_string() != *etag => {
                return Err(ObjectError::PreconditionFailed { key: key.into() });
            }
            (PutCondition::IfMatch(_), None) => return Err(ObjectError::PreconditionFailed { key: key.into() }),
            _ => {}
        }
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        map.insert(key.to_owned(), (bytes.to_vec(), version));
        Ok(meta(key, bytes, version))
    }
}

fn meta(key: &str, bytes: &[u8], version: u64) -> ObjectMeta {
    ObjectMeta { key: key.to_owned(), size: bytes.len() as u64, etag: version.to_string(), modified_ms: 0 }
}

#[derive(Default)]
pub struct MemStore {
    objects: Arc<Objects>,
    /// An injected outage: reads of keys under this prefix fail as a throttled or 5xx store
    /// answers (transient), counted in `failed_reads`.
    outage: Mutex<Option<String>>,
    failed_reads: AtomicU64,
    /// Bytes handed out by `get` and `read_range`, per key.
    bytes_read: Mutex<std::collections::HashMap<String, u64>>,
    /// The most objects one `list` or `list_page` call returned.
    most_listed: AtomicU64,
}

impl MemStore {
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.objects.map.lock().unwrap().keys().filter(|k| k.starts_with(prefix)).cloned().collect()
    }

    /// From now on every read of a key under `prefix` fails with `Unavailable`.
    pub fn fail_reads(&self, prefix: &str) {
        *self.outage.lock().unwrap() = Some(prefix.to_owned());
    }

    /// Bytes read so far of `key`.
    pub fn bytes_read(&self, key: &str) -> u64 {
        self.bytes_read.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn count(&self, key: &str, bytes: &[u8]) {
        *self.bytes_read.lock().unwrap().entry(key.to_owned()).or_default() += bytes.len() as u64;
    }

    /// The most objects one listing returned so far.
    pub fn most_listed(&self) -> u64 {
        self.most_listed.load(Ordering::SeqCst)
    }

    fn listed(&self, page: Vec<ObjectMeta>) -> Vec<ObjectMeta> {
        self.most_listed.fetch_max(page.len() as u64, Ordering::SeqCst);
        page
    }

    pub fn failed_reads(&self) -> u64 {
        self.failed_reads.load(Ordering::SeqCst)
    }

    fn check_outage(&self, key: &str) -> Result<(), ObjectError> {
        match &*self.outage.lock().unwrap() {
            Some(prefix) if key.starts_with(prefix.as_str()) => {
                self.failed_reads.fetch_add(1, Ordering::SeqCst);
                Err(ObjectError::Unavailable { key: key.into(), message: "injected: 503 Slow Down".into() })
            }
            _ => Ok(()),
        }
    }
}

impl ObjectStore for MemStore {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.objects.put(key, bytes, &condition)
    }

    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        if condition == PutCondition::CreateOnly && self.objects.map.lock().unwrap().contains_key(key) {
            return Err(ObjectError::AlreadyExists { key: key.into() });
        }
        Ok(Box::new(MemWriter { objects: Arc::clone(&self.objects), key: key.to_owned(), condition, bytes: Vec::new() }))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.check_outage(key)?;
        let bytes =
            self.objects.map.lock().unwrap().get(key).map(|(b, _)| b.clone()).ok_or_else(|| ObjectError::NotFound { key: key.into() })?;
        self.count(key, &bytes);
        Ok(bytes)
    }

    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        Ok(Box::new(Cursor::new(self.get(key)?)))
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        self.check_outage(key)?;
        let map = self.objects.map.lock().unwrap();
        let bytes = &map.get(key).ok_or_else(|| ObjectError::NotFound { key: key.into() })?.0;
        let start = (offset as usize).min(bytes.len());
        let end = start.saturating_add(len as usize).min(bytes.len());
        let range = bytes[start..end].to_vec();
        drop(map);
        self.count(key, &range);
        Ok(range)
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        Ok(self.objects.map.lock().unwrap().get(key).map(|(b, v)| meta(key, b, *v)))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        let map = self.objects.map.lock().unwrap();
        Ok(self.listed(map.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, (b, v))| meta(k, b, *v)).collect()))
    }

    fn list_page(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        use std::ops::Bound;
        let map = self.objects.map.lock().unwrap();
        let from = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_owned()),
            _ => Bound::Included(prefix.to_owned()),
        };
        let page = map.range((from, Bound::Unbounded)).take_while(|(k, _)| k.starts_with(prefix)).take(max_keys);
        Ok(self.listed(page.map(|(k, (b, v))| meta(k, b, *v)).collect()))
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.objects.map.lock().unwrap().remove(key);
        Ok(())
    }
}

/// Nothing is visible before commit; dropping it abandons the bytes.
struct MemWriter {
    objects: Arc<Objects>,
    key: String,
    condition: PutCondition,
    bytes: Vec<u8>,
}

impl Write for MemWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for MemWriter {
    fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
        self.objects.put(&self.key, &self.bytes, &self.condition)
    }
}

pub fn mem_store() -> Arc<MemStore> {
    Arc::new(MemStore::default())
}

struct Message {
    id: String,
    body: String,
    visible_at: Instant,
    receive_count: u32,
    handle: Option<String>,
}

pub struct MemQueue {
    name: String,
    max_receives: u32,
    messages: Mutex<Vec<Message>>,
    pub dead: Mutex<Vec<String>>,
    pub sent: Mutex<Vec<(String, SendOptions)>>,
    next: AtomicU64,
}

impl MemQueue {
    pub fn new(name: &str, max_receives: u32) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            max_receives,
            messages: Mutex::new(Vec::new()),
            dead: Mutex::new(Vec::new()),
            sent: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
        })
    }

    /// Messages not deleted (in flight or waiting), with their receive counts.
    pub fn pending(&self) -> Vec<u32> {
        self.messages.lock().unwrap().iter().map(|m| m.receive_count).collect()
    }

    /// Seconds until the first pending message is visible again (negative: visible now).
    pub fn hidden_for(&self) -> Option<f64> {
        let now = Instant::now();
        self.messages.lock().unwrap().first().map(|m| {
            if m.visible_at > now { (m.visible_at - now).as_secs_f64() } else { -(now - m.visible_at).as_secs_f64() }
        })
    }
}

impl Queue for MemQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn send(&self, body: &str, options: &SendOptions) -> Result<String, QueueError> {
        let id = format!("m{}", self.next.fetch_add(1, Ordering::SeqCst));
        self.sent.lock().unwrap().push((body.to_owned(), options.clone()));
        self.messages.lock().unwrap().push(Message {
            id: id.clone(),
            body: body.to_owned(),
            visible_at: Instant::now() + options.delay,
            receive_count: 0,
            handle: None,
        });
        Ok(id)
    }

    fn receive(&self, max: usize, wait: Duration, visibility: Duration) -> Result<Vec<Received>, QueueError> {
        let deadline = Instant::now() + wait;
        loop {
            {
                let mut messages = self.messages.lock().unwrap();
                let now = Instant::now();
                let mut out = Vec::new();
                let mut i = 0;
                while i < messages.len() && out.len() < max {
                    if messages[i].visible_at <= now {
                        if messages[i].receive_count >= self.max_receives {
                            let dead = messages.remove(i);
                            self.dead.lock().unwrap().push(dead.body);
                            continue;
                        }
                        let handle = format!("h{}", self.next.fetch_add(1, Ordering::SeqCst));
                        let m = &mut messages[i];
                        m.receive_count += 1;
                        m.visible_at = now + visibility;
                        m.handle = Some(handle.clone());
                        out.push(Received {
                            message_id: m.id.clone(),
                            receipt_handle: handle,
                            body: m.body.clone(),
                            receive_count: m.receive_count,
                            sent_ms: 0,
                            group_id: None,
                            deduplication_id: None,
                        });
                    }
                    i += 1;
                }
                if !out.is_empty() {
                    return Ok(out);
                }
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn change_visibility(&self, receipt_handle: &str, visibility: Duration) -> Result<(), QueueError> {
        let mut messages = self.messages.lock().unwrap();
        let m = messages
            .iter_mut()
            .find(|m| m.handle.as_deref() == Some(receipt_handle))
            .ok_or_else(|| QueueError::InvalidReceiptHandle(receipt_handle.into()))?;
        m.visible_at = Instant::now() + visibility;
        Ok(())
    }

    fn delete(&self, receipt_handle: &str) -> Result<(), QueueError> {
        let mut messages = self.messages.lock().unwrap();
        let i = messages
            .iter()
            .position(|m| m.handle.as_deref() == Some(receipt_handle))
            .ok_or_else(|| QueueError::InvalidReceiptHandle(receipt_handle.into()))?;
        messages.remove(i);
        Ok(())
    }

    fn stats(&self) -> Result<QueueStats, QueueError> {
        Ok(QueueStats::default())
    }
}

/// (ciphertext blob, encryption context, recipient document) of one `Decrypt`.
pub type KmsCall = (Vec<u8>, EncryptionContext, Vec<u8>);

/// Answers `Decrypt` + `Recipient` with `sealed:` ‖ blob; refuses anything without a recipient.
#[derive(Default)]
pub struct FakeKms {
    pub calls: Mutex<Vec<KmsCall>>,
}

impl Kms for FakeKms {
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        Ok(AwsCredentials {
            region: "fake-region".into(),
            access_key_id: "fake-key-id".into(),
            secret_access_key: "fake-secret".to_owned().into(),
            session_token: Some("fake-token".into()),
        })
    }
    fn encrypt(&self, _: &str, _: &[u8], _: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        Err(KmsError::Validation("not in this fake".into()))
    }
    fn generate_data_key(&self, _: &str, _: &EncryptionContext, _: Option<&Recipient>) -> Result<DataKey, KmsError> {
        Err(KmsError::Validation("not in this fake".into()))
    }
    fn generate_data_key_pair_without_plaintext(&self, _: &str, _: &EncryptionContext) -> Result<DataKeyPair, KmsError> {
        Err(KmsError::Validation("not in this fake".into()))
    }
    fn decrypt(&self, _: Option<&str>, blob: &[u8], context: &EncryptionContext, recipient: Option<&Recipient>) -> Result<Decrypted, KmsError> {
        let recipient = recipient.ok_or_else(|| KmsError::AccessDenied("no attestation".into()))?;
        self.calls.lock().unwrap().push((blob.to_vec(), context.clone(), recipient.attestation_document.clone()));
        if blob == b"refuse me" {
            return Err(KmsError::AccessDenied("policy says no".into()));
        }
        Ok(Decrypted { key_id: "fake-key".into(), plaintext: None, ciphertext_for_recipient: Some([b"sealed:", blob].concat()) })
    }
}

/// A token and how it was closed: its output, or (error, cause).
pub type Closed = (String, Result<String, (String, String)>);

/// Task-token completions as Step Functions sees them: the first closes a token, later ones
/// answer `TaskTimedOut`.
#[derive(Default)]
pub struct RecordedTokens {
    /// (token, Ok(output) | Err((error, cause))), in call order, the closing ones only.
    pub completed: Mutex<Vec<Closed>>,
    pub late: AtomicU64,
}

impl RecordedTokens {
    fn close(&self, token: &str, result: Result<String, (String, String)>) -> Result<Completion, WorkflowError> {
        let mut completed = self.completed.lock().unwrap();
        if completed.iter().any(|(t, _)| t == token) {
            self.late.fetch_add(1, Ordering::SeqCst);
            return Ok(Completion::AlreadyClosed { code: "TaskTimedOut".into() });
        }
        completed.push((token.to_owned(), result));
        Ok(Completion::Completed)
    }
}

impl TaskTokens for RecordedTokens {
    fn succeed(&self, token: &str, output: &str) -> Result<Completion, WorkflowError> {
        self.close(token, Ok(output.to_owned()))
    }
    fn fail(&self, token: &str, error: &str, cause: &str) -> Result<Completion, WorkflowError> {
        self.close(token, Err((error.to_owned(), cause.to_owned())))
    }
}

pub struct MemCloud {
    pub jobs: Arc<MemStore>,
    pub models: Arc<MemStore>,
    pub attestations: Arc<MemStore>,
    pub job_queue: Arc<MemQueue>,
    pub ledger_queue: Arc<MemQueue>,
    pub kms: Arc<FakeKms>,
    pub tokens: Arc<RecordedTokens>,
}

impl MemCloud {
    pub fn new(max_receives: u32) -> Self {
        Self {
            jobs: mem_store(),
            models: mem_store(),
            attestations: mem_store(),
            job_queue: MemQueue::new("jobs", max_receives),
            ledger_queue: MemQueue::new("ledger", 100),
            kms: Arc::new(FakeKms::default()),
            tokens: Arc::new(RecordedTokens::default()),
        }
    }

    pub fn services(&self) -> Services {
        Services {
            jobs: self.jobs.clone(),
            models: self.models.clone(),
            attestations: self.attestations.clone(),
            job_queue: self.job_queue.clone(),
            ledger_queue: self.ledger_queue.clone(),
            kms: self.kms.clone(),
            task_tokens: Some(self.tokens.clone()),
            bulk_workflow: None,
            keys: KeyNames { fleet: "fleet".into(), model: "model".into() },
        }
    }
}
