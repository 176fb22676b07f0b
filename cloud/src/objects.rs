//! Object storage with S3's semantics: whole-object atomic writes (a reader sees the old object
//! or the new one, never a mix), streaming reads and writes, listing by prefix, and conditional
//! writes — `CreateOnly` is S3's `If-None-Match: *`, `IfMatch` its `If-Match: <etag>`.

use std::io::{Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object {key} does not exist")]
    NotFound { key: String },
    /// A `CreateOnly` write found the key taken (S3: 412 on If-None-Match).
    #[error("object {key} already exists")]
    AlreadyExists { key: String },
    /// An `IfMatch` write found another version (S3: 412 on If-Match).
    #[error("object {key} changed since it was read (etag mismatch)")]
    PreconditionFailed { key: String },
    #[error("object key {key:?} is not valid: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("access to object {key} denied: {message}")]
    AccessDenied { key: String, message: String },
    #[error("object store I/O on {key}: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("object store unavailable for {key}: {message}")]
    Unavailable { key: String, message: String },
    /// The bucket itself does not exist (a configuration error, not a missing object).
    #[error("bucket {bucket} does not exist (reading or writing {key})")]
    NoSuchBucket { bucket: String, key: String },
    /// The store refused the request for a reason trying again will not change.
    #[error("object store refused the request for {key}: {message}")]
    Rejected { key: String, message: String },
}

impl ObjectError {
    pub fn io(key: &str, source: std::io::Error) -> Self {
        ObjectError::Io { key: key.to_owned(), source }
    }

    /// Worth retrying with backoff (throttling, 5xx, transient I/O).
    pub fn is_transient(&self) -> bool {
        matches!(self, ObjectError::Unavailable { .. } | ObjectError::Io { .. })
    }
}

/// Write semantics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Replace whatever is there.
    Overwrite,
    /// Fail with [`ObjectError::AlreadyExists`] if the key exists (`If-None-Match: *`).
    CreateOnly,
    /// Replace only the version with this etag (`If-Match`), else [`ObjectError::PreconditionFailed`].
    IfMatch(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// Opaque version tag; changes with every write.
    pub etag: String,
    pub modified_ms: u64,
}

/// A streaming write. Nothing is visible under the key until [`ObjectWriter::commit`] succeeds;
/// dropping the writer without committing abandons it (S3: abort the multipart upload).
pub trait ObjectWriter: Write + Send {
    fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError>;
}

pub trait ObjectStore: Send + Sync {
    /// Writes a whole object from memory.
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError>;
    /// Starts a streaming write; the condition is checked again at commit.
    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError>;
    /// Reads a whole object into memory (manifests, receipts, status files).
    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError>;
    /// Streams an object; the reader sees one version from start to end.
    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError>;
    /// Streams `len` bytes from `offset` (S3 ranged GET); fewer at the end of the object.
    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError>;
    /// `None` when the key does not exist.
    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError>;
    /// Every object whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError>;
    /// Deletes an object; deleting a missing key is not an error (as in S3).
    fn delete(&self, key: &str) -> Result<(), ObjectError>;
}
