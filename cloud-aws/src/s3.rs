//! [`S3ObjectStore`]: the object store on an S3 bucket, optionally under a key prefix.
//!
//! * **Conditions are S3's own**: `CreateOnly` sends `If-None-Match: *` and `IfMatch` sends
//!   `If-Match: <etag>`, on `PutObject` and, for streamed writes, on `CompleteMultipartUpload`,
//!   so the condition is checked at the moment the object becomes visible. S3's 412 becomes
//!   [`ObjectError::AlreadyExists`] or [`ObjectError::PreconditionFailed`].
//! * **Streamed writes** are multipart uploads ([`super::s3_write`]); small objects go in one
//!   `PutObject`. **Streamed reads** resume a broken download with a ranged GET pinned to the
//!   first answer's ETag ([`super::s3_read`]), so a reader never mixes two versions.
//! * **Dates**: `head` and `list` carry S3's `Last-Modified` (whole seconds); the meta a write
//!   returns carries this machine's clock, because S3's answer to a write has no date.
//! * **Errors** name the operation and the object (`S3 PutObject s3://bucket/jobs/…: …`):
//!   `NoSuchKey`/404 → `NotFound`, `NoSuchBucket` → `NoSuchBucket`, 403 → `AccessDenied`,
//!   throttling/5xx/network (after the SDK's own retries) → `Unavailable`, anything else →
//!   `Rejected`.

use std::io::Read;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, DateTime};

use super::error::Failure;
use super::runtime::AwsRuntime;
use super::s3_read::S3Reader;
use super::s3_write::S3Writer;
use cloud::now_ms;
use cloud::objects::{ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition};

/// S3's limit on key length (bytes of UTF-8, prefix included).
pub const MAX_KEY_LEN: usize = 1024;
/// S3's smallest part (every part but the last).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// Part size of streamed writes: a writer holds about three parts in memory.
pub const DEFAULT_PART_SIZE: usize = 8 * 1024 * 1024;

/// Adds a [`PutCondition`] to a `PutObject` or `CompleteMultipartUpload` request.
macro_rules! with_condition {
    ($request:expr, $condition:expr) => {
        match $condition {
            PutCondition::Overwrite => $request,
            PutCondition::CreateOnly => $request.if_none_match("*"),
            PutCondition::IfMatch(etag) => $request.if_match(etag.clone()),
        }
    };
}
pub(crate) use with_condition;

/// One bucket (and key prefix) as an [`ObjectStore`]. Cheap to clone.
#[derive(Clone)]
pub struct S3ObjectStore {
    pub(crate) client: aws_sdk_s3::Client,
    pub(crate) runtime: AwsRuntime,
    pub(crate) bucket: String,
    pub(crate) prefix: String,
    pub(crate) part_size: usize,
    /// Server-side copies: one CopyObject up to `max_single_copy`, parts of `copy_part_size` above.
    pub(crate) copy: super::s3_copy::CopyParts,
}

impl std::fmt::Debug for S3ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3ObjectStore").field("bucket", &self.bucket).field("prefix", &self.prefix).finish()
    }
}

impl S3ObjectStore {
    /// Objects of `bucket` whose keys start with `prefix` (empty: the whole bucket); the prefix
    /// is invisible to callers.
    pub fn new(client: aws_sdk_s3::Client, runtime: AwsRuntime, bucket: &str, prefix: &str) -> S3ObjectStore {
        S3ObjectStore {
            client,
            runtime,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            part_size: DEFAULT_PART_SIZE,
            copy: super::s3_copy::CopyParts::default(),
        }
    }

    /// Streamed writes upload parts of this size (at least S3's 5 MiB).
    pub fn with_part_size(mut self, part_size: usize) -> S3ObjectStore {
        self.part_size = part_size.max(MIN_PART_SIZE);
        self
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(crate) fn url(&self, key: &str) -> String {
        format!("s3://{}/{}{key}", self.bucket, self.prefix)
    }

    fn validate(&self, key: &str) -> Result<(), ObjectError> {
        let invalid = |reason| Err(ObjectError::InvalidKey { key: key.to_owned(), reason });
        if key.is_empty() {
            return invalid("empty");
        }
        if self.prefix.len() + key.len() > MAX_KEY_LEN {
            return invalid("longer than 1024 bytes (with the store's prefix)");
        }
        Ok(())
    }

    /// The object error for a failed request on `key` (`condition`: the write's, if any).
    pub(crate) fn error<E>(&self, op: &str, key: &str, condition: Option<&PutCondition>, error: SdkError<E, HttpResponse>) -> ObjectError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.classify(op, key, condition, Failure::of(&error))
    }

    pub(crate) fn classify(&self, op: &str, key: &str, condition: Option<&PutCondition>, failure: Failure) -> ObjectError {
        let key = key.to_owned();
        let message = || format!("S3 {op} {}: {}", self.url(&key), failure.message);
        if failure.is("NoSuchBucket") {
            return ObjectError::NoSuchBucket { bucket: self.bucket.clone(), key };
        }
        if failure.is("PreconditionFailed") || failure.status_is(412) {
            return match condition {
                Some(PutCondition::CreateOnly) => ObjectError::AlreadyExists { key },
                _ => ObjectError::PreconditionFailed { key },
            };
        }
        if failure.is("NoSuchKey") || (failure.status_is(404) && !failure.is("NoSuchUpload")) {
            return ObjectError::NotFound { key };
        }
        if failure.is("AccessDenied") || failure.status_is(403) {
            let message = message();
            return ObjectError::AccessDenied { key, message };
        }
        let message = message();
        if failure.transient {
            ObjectError::Unavailable { key, message }
        } else {
            ObjectError::Rejected { key, message }
        }
    }

    /// A body that broke off while it was read.
    pub(crate) fn body_error(&self, op: &str, key: &str, error: impl std::fmt::Display) -> ObjectError {
        ObjectError::Unavailable { key: key.to_owned(), message: format!("S3 {op} {}: reading the body: {error}", self.url(key)) }
    }

    /// GetObject, whole or `(offset, len)`. The body is gathered chunk by chunk into one
    /// buffer, and a ranged read keeps at most `len` bytes even if the server sent more (an
    /// endpoint that ignores `Range` must not make a bounded read unbounded).
    /// A listed object as the trait names it: its key relative to this store's prefix.
    fn listed(&self, object: &aws_sdk_s3::types::Object) -> Option<ObjectMeta> {
        let key = object.key()?.strip_prefix(self.prefix.as_str())?;
        Some(ObjectMeta {
            key: key.to_owned(),
            size: object.size().unwrap_or(0).max(0) as u64,
            etag: object.e_tag().unwrap_or_default().to_owned(),
            modified_ms: millis(object.last_modified()),
        })
    }

    fn get_range(&self, key: &str, range: Option<(u64, u64)>) -> Result<Vec<u8>, ObjectError> {
        let header = range.map(|(offset, len)| format!("bytes={offset}-{}", offset.saturating_add(len.saturating_sub(1))));
        let limit = range.map_or(u64::MAX, |(_, len)| len);
        self.runtime.block_on(async {
            let sent = self.client.get_object().bucket(&self.bucket).key(self.full_key(key)).set_range(header).send().await;
            let output = match sent {
                Ok(output) => output,
                Err(error) => {
                    let failure = Failure::of(&error);
                    // S3 answers a range that starts at or past the end (or any range of an
                    // empty object) with 416; the trait's answer is "no bytes".
                    if range.is_some() && (failure.is("InvalidRange") || failure.status_is(416)) {
                        return Ok(Vec::new());
                    }
                    return Err(self.classify("GetObject", key, None, failure));
                }
            };
            // The announced length only sizes the first allocation, and never past 8 MiB.
            let announced = output.content_length.unwrap_or(0).max(0) as u64;
            let mut bytes = Vec::with_capacity(announced.min(limit).min(8 << 20) as usize);
            let mut body = output.body;
            while (bytes.len() as u64) < limit {
                let Some(chunk) = body.next().await else { break };
                let chunk = chunk.map_err(|e| self.body_error("GetObject", key, e))?;
                let room = usize::try_from(limit - bytes.len() as u64).unwrap_or(usize::MAX);
                bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(bytes)
        })
    }
}

pub(crate) fn millis(date: Option<&DateTime>) -> u64 {
    date.and_then(|d| d.to_millis().ok()).map(|ms| ms.max(0) as u64).unwrap_or(0)
}

pub(crate) use cloud::objects::same_etag;

impl ObjectStore for S3ObjectStore {
    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.validate(key)?;
        let request = self.client.put_object().bucket(&self.bucket).key(self.full_key(key)).body(ByteStream::from(bytes.to_vec()));
        let request = with_condition!(request, &condition);
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("PutObject", key, Some(&condition), e))?;
        Ok(ObjectMeta { key: key.to_owned(), size: bytes.len() as u64, etag: output.e_tag.unwrap_or_default(), modified_ms: now_ms() })
    }

    fn writer(&self, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        self.validate(key)?;
        // Fail before any byte is uploaded when the condition already cannot hold. Only an
        // optimisation (the write itself carries the condition): a role that may write a key
        // but not read it gets 403 here, and goes ahead.
        let current = match self.head(key) {
            Ok(current) => current,
            Err(ObjectError::AccessDenied { .. }) => return Ok(Box::new(S3Writer::new(self.clone(), key, condition))),
            Err(error) => return Err(error),
        };
        match (&condition, current) {
            (PutCondition::CreateOnly, Some(_)) => return Err(ObjectError::AlreadyExists { key: key.to_owned() }),
            (PutCondition::IfMatch(_), None) => return Err(ObjectError::NotFound { key: key.to_owned() }),
            (PutCondition::IfMatch(etag), Some(meta)) if !same_etag(etag, &meta.etag) => {
                return Err(ObjectError::PreconditionFailed { key: key.to_owned() });
            }
            _ => {}
        }
        Ok(Box::new(S3Writer::new(self.clone(), key, condition)))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        self.validate(key)?;
        self.get_range(key, None)
    }

    fn reader(&self, key: &str) -> Result<Box<dyn Read + Send>, ObjectError> {
        self.validate(key)?;
        Ok(Box::new(S3Reader::open(self.clone(), key)?))
    }

    fn read_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
        self.validate(key)?;
        if len == 0 {
            return match self.head(key)? {
                Some(_) => Ok(Vec::new()),
                None => Err(ObjectError::NotFound { key: key.to_owned() }),
            };
        }
        self.get_range(key, Some((offset, len)))
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, ObjectError> {
        self.validate(key)?;
        let request = self.client.head_object().bucket(&self.bucket).key(self.full_key(key));
        match self.runtime.block_on(request.send()) {
            Ok(output) => Ok(Some(ObjectMeta {
                key: key.to_owned(),
                size: output.content_length.unwrap_or(0).max(0) as u64,
                etag: output.e_tag.unwrap_or_default(),
                modified_ms: millis(output.last_modified.as_ref()),
            })),
            Err(error) => {
                let failure = Failure::of(&error);
                // HEAD answers carry no body, so no error code: the status says it.
                if failure.status_is(404) { Ok(None) } else { Err(self.classify("HeadObject", key, None, failure)) }
            }
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectError> {
        let full = self.full_key(prefix);
        let mut objects = self.runtime.block_on(async {
            let mut pages =
                self.client.list_objects_v2().bucket(&self.bucket).prefix(&full).into_paginator().send();
            let mut objects = Vec::new();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| self.error("ListObjectsV2", prefix, None, e))?;
                for object in page.contents() {
                    objects.extend(self.listed(object));
                }
            }
            Ok::<_, ObjectError>(objects)
        })?;
        // S3 lists in UTF-8 byte order already; sorting keeps an emulator that does not in line.
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    fn list_page(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<Vec<ObjectMeta>, ObjectError> {
        let full = self.full_key(prefix);
        let after = start_after.map(|key| self.full_key(key));
        let mut objects = self.runtime.block_on(async {
            let mut objects = Vec::new();
            let mut token: Option<String> = None;
            while objects.len() < max_keys {
                // S3 pages hold at most 1,000 keys; ask for no more than still wanted.
                let want = (max_keys - objects.len()).min(1000) as i32;
                let request = self.client.list_objects_v2().bucket(&self.bucket).prefix(&full).max_keys(want);
                let request = match &token {
                    Some(token) => request.continuation_token(token),
                    None => request.set_start_after(after.clone()),
                };
                let page = request.send().await.map_err(|e| self.error("ListObjectsV2", prefix, None, e))?;
                for object in page.contents() {
                    objects.extend(self.listed(object));
                }
                token = page.next_continuation_token().map(str::to_owned);
                if token.is_none() || page.contents().is_empty() {
                    break;
                }
            }
            Ok::<_, ObjectError>(objects)
        })?;
        // An emulator may ignore StartAfter, MaxKeys or the order: the trait's answer holds anyway.
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        objects.retain(|meta| start_after.is_none_or(|after| meta.key.as_str() > after));
        objects.truncate(max_keys);
        Ok(objects)
    }

    fn copy(&self, from: &str, to: &str, source_etag: Option<&str>, condition: PutCondition) -> Result<ObjectMeta, ObjectError> {
        self.validate(from)?;
        self.validate(to)?;
        self.server_side_copy(from, to, source_etag, condition)
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.validate(key)?;
        let request = self.client.delete_object().bucket(&self.bucket).key(self.full_key(key));
        match self.runtime.block_on(request.send()) {
            Ok(_) => Ok(()),
            Err(error) => match self.error("DeleteObject", key, None, error) {
                ObjectError::NotFound { .. } => Ok(()),
                other => Err(other),
            },
        }
    }
}
