//! [`Hooked`]: an object store that lets its owner step into chosen calls of another — to
//! play a failing bucket, a writer racing between two reads, a host that swaps an object — while
//! every other call reaches the inner store unchanged. Tests and fault drills implement
//! [`StoreHooks`] with only the calls they change.

use std::io::Read;
use std::sync::Arc;

use crate::objects::{ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition};

/// The calls of [`ObjectStore`], each given the inner store; every default passes the call on.
#[allow(unused_variables)]
pub trait StoreHooks: Send + Sync {
    fn put(&self, inner: &dyn ObjectStore, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        inner.put(key, bytes, condition)
    }
    fn writer(&self, inner: &dyn ObjectStore, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        inner.writer(key, condition)
    }
    fn get(&self, inner: &dyn ObjectStore, key: &str) -> Result<Vec<u8>, ObjectError> {
        inner.get(key)
    }
    fn reader(&self, inner: &dyn ObjectStore, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        inner.reader(key)
    }
    fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        inner.read_range(key, offset, len)
    }
    fn head(&self, inner: &dyn ObjectStore, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        inner.head(key)
    }
    fn list(&self, inner: &dyn ObjectStore, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        inner.list(prefix)
    }
    fn list_page(&self, inner: &dyn ObjectStore, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        inner.list_page(prefix, start_after, max_keys)
    }
    fn delete(&self, inner: &dyn ObjectStore, key: &str) -> Result<(), ObjectError> {
        inner.delete(key)
    }
    fn copy(&self, inner: &dyn ObjectStore, from: &str, to: &str, source_etag: Option<&str>, condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        inner.copy(from, to, source_etag, condition)
    }
}

/// `inner`, with `hooks` stepping into the calls they implement.
pub struct Hooked<H> {
    pub inner: Arc<dyn ObjectStore>,
    pub hooks: H,
}

impl<H: StoreHooks> Hooked<H> {
    pub fn new(inner: Arc<dyn ObjectStore>, hooks: H) -> Self {
        Hooked { inner, hooks }
    }
}

impl<H: StoreHooks> ObjectStore for Hooked<H> {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.hooks.put(&*self.inner, key, bytes, condition)
    }
    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        self.hooks.writer(&*self.inner, key, condition)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.hooks.get(&*self.inner, key)
    }
    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        self.hooks.reader(&*self.inner, key)
    }
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        self.hooks.read_range(&*self.inner, key, offset, len)
    }
    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        self.hooks.head(&*self.inner, key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.hooks.list(&*self.inner, prefix)
    }
    fn list_page(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        self.hooks.list_page(&*self.inner, prefix, start_after, max_keys)
    }
    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.hooks.delete(&*self.inner, key)
    }
    fn copy(&self, from: &str, to: &str, source_etag: Option<&str>, condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.hooks.copy(&*self.inner, from, to, source_etag, condition)
    }
}

/// Puts under `prefix` answer 503 SlowDown while switched on, as S3 answers a throttled prefix
/// (a host may write one job's `status.json` as fast as it likes).
pub struct ThrottledPuts {
    prefix: String,
    on: std::sync::atomic::AtomicBool,
}

impl ThrottledPuts {
    /// Switched on.
    pub fn new(prefix: impl Into<String>) -> Self {
        ThrottledPuts { prefix: prefix.into(), on: true.into() }
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl StoreHooks for ThrottledPuts {
    fn put(&self, inner: &dyn ObjectStore, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        if self.on.load(std::sync::atomic::Ordering::SeqCst) && key.starts_with(&self.prefix) {
            return Err(ObjectError::Unavailable { key: key.to_owned(), message: "503 SlowDown".into() });
        }
        inner.put(key, bytes, condition)
    }
}

/// Another writer that runs once, just before the first put of `key` goes out (a second
/// appender committing before this one's compare-and-swap), and a count of the puts of `key`
/// their condition refused.
pub struct RaceBeforePut {
    key: String,
    racer: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
    refused: std::sync::atomic::AtomicU32,
}

impl RaceBeforePut {
    pub fn new(key: impl Into<String>, racer: impl FnOnce() + Send + 'static) -> Self {
        RaceBeforePut { key: key.into(), racer: std::sync::Mutex::new(Some(Box::new(racer))), refused: 0.into() }
    }

    /// Puts of the key refused by their condition (If-Match, If-None-Match) so far.
    pub fn refused(&self) -> u32 {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl StoreHooks for RaceBeforePut {
    fn put(&self, inner: &dyn ObjectStore, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        if key != self.key {
            return inner.put(key, bytes, condition);
        }
        let racer = self.racer.lock().expect("the racer's lock").take();
        if let Some(racer) = racer {
            racer();
        }
        let result = inner.put(key, bytes, condition);
        if matches!(result, Err(ObjectError::PreconditionFailed { .. } | ObjectError::AlreadyExists { .. })) {
            self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }
}
