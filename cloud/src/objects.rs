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
    /// `key` whole if it holds at most `limit` bytes, else [`ObjectError::Rejected`] naming the
    /// key and the limit (not retried): one ranged read of `limit + 1` bytes, so an object that
    /// another principal made a few GB costs its reader `limit` bytes, whatever a listing said.
    fn get_at_most(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
        let bytes = self.read_range(key, 0, limit.saturating_add(1))?;
        if bytes.len() as u64 > limit {
            return Err(ObjectError::Rejected { key: key.to_owned(), message: format!("larger than {limit} bytes, the most read of it") });
        }
        Ok(bytes)
    }
    /// `None` when the key does not exist.
    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError>;
    /// Every object whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError>;
    /// At most `max_keys` objects under `prefix` whose keys sort after `start_after`, in key
    /// order (S3 `ListObjectsV2` `StartAfter` + `MaxKeys`): a bounded pass over a prefix that
    /// others may fill without limit. Fewer than `max_keys` means the end was reached. The
    /// default filters [`ObjectStore::list`], so it is bounded only in what it returns; stores
    /// that can list from a point override it.
    fn list_page(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        let mut page = self.list(prefix)?;
        page.retain(|meta| start_after.is_none_or(|after| meta.key.as_str() > after));
        page.truncate(max_keys);
        Ok(page)
    }
    /// Deletes an object; deleting a missing key is not an error (as in S3).
    fn delete(&self, key: &str) -> Result<(), ObjectError>;
    /// Copies `from` to `to` inside this store (`condition` is the destination's, as in
    /// [`ObjectStore::put`]). With `source_etag`, only that version of `from` is copied, else
    /// [`ObjectError::PreconditionFailed`] naming `from`: the version a caller checked, never one
    /// swapped in since. Stores override it to keep the bytes off the caller (S3: CopyObject,
    /// UploadPartCopy); the default streams them through this process, pinned to one version by
    /// a HEAD before and after (a write in between changes the etag).
    fn copy(&self, from: &str, to: &str, source_etag: Option<&str>, condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        let pinned = self.head(from)?.ok_or_else(|| ObjectError::NotFound { key: from.to_owned() })?;
        let changed = || ObjectError::PreconditionFailed { key: from.to_owned() };
        if source_etag.is_some_and(|etag| !same_etag(etag, &pinned.etag)) {
            return Err(changed());
        }
        let mut reader = self.reader(from)?;
        let mut writer = self.writer(to, condition)?;
        std::io::copy(&mut reader, &mut writer).map_err(|e| ObjectError::io(from, e))?;
        match self.head(from)? {
            Some(now) if same_etag(&now.etag, &pinned.etag) => writer.commit(),
            _ => Err(changed()), // the writer is dropped uncommitted: nothing appears at `to`
        }
    }
}

/// The most anyone reads whole of a small object another principal may write (receipt, status,
/// manifest, fleet-key record, attestation document, marker): each passes through one frame
/// (1 MiB) or is far smaller, so 4 MiB refuses only what no component wrote.
pub const MAX_SMALL_OBJECT: u64 = 4 << 20;

/// ETags compare without their quotes (S3 quotes them; callers may strip them).
pub fn same_etag(a: &str, b: &str) -> bool {
    a.trim_matches('"') == b.trim_matches('"')
}
