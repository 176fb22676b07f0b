//! Server-side copies: the bytes stay in S3, so an object of any size is copied by a caller
//! with little memory and no bandwidth (a Lambda copying a multi-GB shard).
//!
//! * Up to [`MAX_COPY_OBJECT`] (S3's limit for one request): one `CopyObject`.
//! * Above: a multipart upload whose parts are `UploadPartCopy` ranges of the source, a few in
//!   flight, completed with the destination's condition; any failure aborts the upload.
//! * **One version.** Every request carries `x-amz-copy-source-if-match` with the etag the
//!   HEAD before the copy found (the caller's etag when it gave one): a source replaced during
//!   the copy fails it (412) instead of mixing two versions or copying one nobody checked.
//! * The destination's condition rides on `CopyObject` or `CompleteMultipartUpload`
//!   (`If-None-Match: *`, `If-Match`). A 412 on `CopyObject` may be either condition: a HEAD of
//!   the source tells which.
//! * Emulators may ignore the copy conditions (moto does): the HEADs before the copy — the
//!   source's etag, the destination's existence — refuse what they can see; S3 itself enforces
//!   the headers at the moment of the copy.

use std::collections::VecDeque;

use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};

use super::s3::{with_condition, S3ObjectStore, MIN_PART_SIZE};
use cloud::now_ms;
use cloud::objects::{same_etag, ObjectError, ObjectMeta, ObjectStore, PutCondition};

/// The largest object one `CopyObject` copies (5 GiB).
pub const MAX_COPY_OBJECT: u64 = 5 << 30;
/// Part size of a multipart copy: 512 MiB, so 5 TiB (S3's largest object) is 10,240 parts,
/// within S3's 10,000 only above 4.9 TiB, where the part size grows to fit.
pub const DEFAULT_COPY_PART_SIZE: u64 = 512 << 20;
/// S3's limit on the parts of one upload.
const MAX_PARTS: u64 = 10_000;
/// `UploadPartCopy` requests at once: S3 copies each part at its own pace.
const COPIES_IN_FLIGHT: usize = 4;

/// When a copy goes in parts, and how large they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyParts {
    pub max_single: u64,
    pub part_size: u64,
}

impl Default for CopyParts {
    fn default() -> Self {
        CopyParts { max_single: MAX_COPY_OBJECT, part_size: DEFAULT_COPY_PART_SIZE }
    }
}

impl CopyParts {
    /// The byte ranges (inclusive ends) of a multipart copy of `size` bytes.
    fn ranges(&self, size: u64) -> Vec<(u64, u64)> {
        let part = self.part_size.max(size.div_ceil(MAX_PARTS)).max(1);
        (0..size.div_ceil(part)).map(|i| (i * part, ((i + 1) * part).min(size) - 1)).collect()
    }
}

impl S3ObjectStore {
    /// Copies larger than `max_single` bytes go in parts of `part_size` (each at least S3's
    /// 5 MiB); tests use small values to exercise the multipart path quickly.
    pub fn with_copy_parts(mut self, max_single: u64, part_size: u64) -> S3ObjectStore {
        self.copy = CopyParts { max_single: max_single.min(MAX_COPY_OBJECT), part_size: part_size.max(MIN_PART_SIZE as u64) };
        self
    }

    pub(crate) fn server_side_copy(
        &self,
        from: &str,
        to: &str,
        source_etag: Option<&str>,
        condition: PutCondition,
    ) -> Result<ObjectMeta, ObjectError> {
        let source = self.head(from)?.ok_or_else(|| ObjectError::NotFound { key: from.to_owned() })?;
        if source_etag.is_some_and(|etag| !same_etag(etag, &source.etag)) {
            return Err(ObjectError::PreconditionFailed { key: from.to_owned() });
        }
        self.precheck_destination(to, &condition)?;
        let pinned = source_etag.map_or_else(|| source.etag.clone(), str::to_owned);
        let etag = if source.size <= self.copy.max_single {
            self.copy_whole(from, to, &pinned, &condition)?
        } else {
            self.copy_in_parts(from, to, &pinned, source.size, &condition)?
        };
        Ok(ObjectMeta { key: to.to_owned(), size: source.size, etag, modified_ms: now_ms() })
    }

    /// Refuses early what the destination's condition already rules out. A role that may write
    /// the key but not read it gets 403 here, and goes ahead: the copy carries the condition.
    fn precheck_destination(&self, to: &str, condition: &PutCondition) -> Result<(), ObjectError> {
        if *condition == PutCondition::Overwrite {
            return Ok(());
        }
        let current = match self.head(to) {
            Ok(current) => current,
            Err(ObjectError::AccessDenied { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        match (condition, current) {
            (PutCondition::CreateOnly, Some(_)) => Err(ObjectError::AlreadyExists { key: to.to_owned() }),
            (PutCondition::IfMatch(_), None) => Err(ObjectError::NotFound { key: to.to_owned() }),
            (PutCondition::IfMatch(etag), Some(meta)) if !same_etag(etag, &meta.etag) => {
                Err(ObjectError::PreconditionFailed { key: to.to_owned() })
            }
            _ => Ok(()),
        }
    }

    /// `bucket/key`, URL-encoded as `x-amz-copy-source` must be.
    fn copy_source(&self, from: &str) -> String {
        let mut out = format!("{}/", self.bucket);
        for byte in self.full_key(from).bytes() {
            match byte {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(byte as char),
                other => out.push_str(&format!("%{other:02X}")),
            }
        }
        out
    }

    fn copy_whole(&self, from: &str, to: &str, pinned: &str, condition: &PutCondition) -> Result<String, ObjectError> {
        let request = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(self.full_key(to))
            .copy_source(self.copy_source(from))
            .copy_source_if_match(pinned);
        let request = with_condition!(request, condition);
        match self.runtime.block_on(request.send()) {
            Ok(output) => Ok(output.copy_object_result.and_then(|r| r.e_tag).unwrap_or_default()),
            Err(error) => Err(match self.error("CopyObject", to, Some(condition), error) {
                // 412: the source's version or the destination's condition; the source says which.
                ObjectError::AlreadyExists { .. } | ObjectError::PreconditionFailed { .. } if self.source_changed(from, pinned)? => {
                    ObjectError::PreconditionFailed { key: from.to_owned() }
                }
                // 404: the source, unless an If-Match destination is missing while the source is not.
                ObjectError::NotFound { .. } if matches!(condition, PutCondition::IfMatch(_)) && !self.source_changed(from, pinned)? => {
                    ObjectError::NotFound { key: to.to_owned() }
                }
                ObjectError::NotFound { .. } => ObjectError::NotFound { key: from.to_owned() },
                other => other,
            }),
        }
    }

    fn source_changed(&self, from: &str, pinned: &str) -> Result<bool, ObjectError> {
        Ok(self.head(from)?.is_none_or(|now| !same_etag(&now.etag, pinned)))
    }

    fn copy_in_parts(&self, from: &str, to: &str, pinned: &str, size: u64, condition: &PutCondition) -> Result<String, ObjectError> {
        let request = self.client.create_multipart_upload().bucket(&self.bucket).key(self.full_key(to));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("CreateMultipartUpload", to, None, e))?;
        let upload_id = output.upload_id.ok_or_else(|| ObjectError::Unavailable {
            key: to.to_owned(),
            message: format!("S3 CreateMultipartUpload {}: no upload id in the answer", self.url(to)),
        })?;
        let result = self.copy_parts(from, to, pinned, size, &upload_id).and_then(|parts| {
            let request = self
                .client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(self.full_key(to))
                .upload_id(&upload_id)
                .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build());
            let request = with_condition!(request, condition);
            let output =
                self.runtime.block_on(request.send()).map_err(|e| self.error("CompleteMultipartUpload", to, Some(condition), e))?;
            Ok(output.e_tag.unwrap_or_default())
        });
        if result.is_err() {
            self.abort_upload(to, &upload_id);
        }
        result
    }

    /// Every part, [`COPIES_IN_FLIGHT`] at a time, each pinned to the source's version.
    fn copy_parts(&self, from: &str, to: &str, pinned: &str, size: u64, upload_id: &str) -> Result<Vec<CompletedPart>, ObjectError> {
        let source = self.copy_source(from);
        self.runtime.block_on(async {
            let mut in_flight = VecDeque::new();
            let mut done = Vec::new();
            for (index, (first, last)) in self.copy.ranges(size).into_iter().enumerate() {
                if in_flight.len() >= COPIES_IN_FLIGHT {
                    done.push(self.part_done(to, &mut in_flight).await?);
                }
                let number = index as i32 + 1;
                let request = self
                    .client
                    .upload_part_copy()
                    .bucket(&self.bucket)
                    .key(self.full_key(to))
                    .upload_id(upload_id)
                    .part_number(number)
                    .copy_source(&source)
                    .copy_source_range(format!("bytes={first}-{last}"))
                    .copy_source_if_match(pinned);
                let (store, from) = (self.clone(), from.to_owned());
                in_flight.push_back(tokio::spawn(async move {
                    // A 412 or 404 here is the source's: replaced or deleted since the HEAD.
                    let output = request.send().await.map_err(|e| store.error("UploadPartCopy", &from, None, e))?;
                    let etag = output.copy_part_result.and_then(|r| r.e_tag);
                    Ok::<_, ObjectError>(CompletedPart::builder().part_number(number).set_e_tag(etag).build())
                }));
            }
            while !in_flight.is_empty() {
                done.push(self.part_done(to, &mut in_flight).await?);
            }
            Ok(done)
        })
    }

    /// Waits for the oldest part; on a failure the others are cancelled.
    async fn part_done(
        &self,
        to: &str,
        in_flight: &mut VecDeque<tokio::task::JoinHandle<Result<CompletedPart, ObjectError>>>,
    ) -> Result<CompletedPart, ObjectError> {
        let handle = in_flight.pop_front().expect("a part in flight");
        let result = handle.await.map_err(|e| ObjectError::Unavailable {
            key: to.to_owned(),
            message: format!("S3 UploadPartCopy {}: the copy task failed: {e}", self.url(to)),
        });
        let result = result.and_then(|part| part);
        if result.is_err() {
            for other in in_flight.drain(..) {
                other.abort();
            }
        }
        result
    }

    fn abort_upload(&self, to: &str, upload_id: &str) {
        let request = self.client.abort_multipart_upload().bucket(&self.bucket).key(self.full_key(to)).upload_id(upload_id);
        if let Err(error) = self.runtime.block_on(request.send()) {
            tracing::warn!(url = %self.url(to), error = %aws_sdk_s3::error::DisplayErrorContext(&error), "multipart copy not aborted; the bucket's lifecycle rule will remove it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_object_once_and_stay_within_s3s_limit() {
        let parts = CopyParts { max_single: 10, part_size: 4 };
        assert_eq!(parts.ranges(10), [(0, 3), (4, 7), (8, 9)]);
        assert_eq!(parts.ranges(8), [(0, 3), (4, 7)]);
        let default = CopyParts::default();
        let five_tib = 5u64 << 40;
        let ranges = default.ranges(five_tib);
        assert!(ranges.len() as u64 <= MAX_PARTS, "{} parts", ranges.len());
        assert_eq!(ranges.last().unwrap().1, five_tib - 1);
        assert!(ranges.windows(2).all(|w| w[0].1 + 1 == w[1].0));
        assert_eq!(default.ranges(6 << 30).len(), 12);
    }
}
