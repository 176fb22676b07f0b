//! Streamed writes: a multipart upload whose parts go up while the next one fills.
//!
//! Nothing is visible until `commit`, which completes the upload with the write's condition
//! (`If-None-Match: *` / `If-Match`) — so a `CreateOnly` receipt or output is checked at the
//! moment it would appear, not when the upload began. An object smaller than one part never
//! starts a multipart upload: `commit` sends a single conditional `PutObject`. A writer
//! dropped without a successful commit aborts its upload (and the jobs bucket's lifecycle
//! rule removes uploads a crashed process left behind).

use std::collections::VecDeque;
use std::io::{self, Write};

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use tokio::task::JoinHandle;

use super::s3::{with_condition, S3ObjectStore};
use cloud::now_ms;
use cloud::objects::{ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition};

/// Parts uploading at once while the writer fills the next: throughput without unbounded memory.
const PARTS_IN_FLIGHT: usize = 2;

type PartUpload = JoinHandle<Result<CompletedPart, ObjectError>>;

pub(crate) struct S3Writer {
    store: S3ObjectStore,
    key: String,
    condition: PutCondition,
    buffer: Vec<u8>,
    written: u64,
    upload: Option<Multipart>,
    /// The first failure: later writes and the commit report it.
    broken: Option<ObjectError>,
}

struct Multipart {
    upload_id: String,
    next_part: i32,
    in_flight: VecDeque<PartUpload>,
    done: Vec<CompletedPart>,
    completed: bool,
}

impl S3Writer {
    pub(crate) fn new(store: S3ObjectStore, key: &str, condition: PutCondition) -> S3Writer {
        S3Writer { key: key.to_owned(), condition, buffer: Vec::new(), written: 0, upload: None, broken: None, store }
    }

    fn start_upload(&mut self) -> Result<(), ObjectError> {
        if self.upload.is_some() {
            return Ok(());
        }
        let request = self
            .store
            .client
            .create_multipart_upload()
            .bucket(&self.store.bucket)
            .key(self.store.full_key(&self.key))
            // Per-part CRC32s, listed again at completion: S3 checks each part and the whole.
            .checksum_algorithm(ChecksumAlgorithm::Crc32);
        let output =
            self.store.runtime.block_on(request.send()).map_err(|e| self.store.error("CreateMultipartUpload", &self.key, None, e))?;
        let upload_id = output.upload_id.ok_or_else(|| ObjectError::Unavailable {
            key: self.key.clone(),
            message: format!("S3 CreateMultipartUpload {}: no upload id in the answer", self.store.url(&self.key)),
        })?;
        self.upload = Some(Multipart { upload_id, next_part: 1, in_flight: VecDeque::new(), done: Vec::new(), completed: false });
        Ok(())
    }

    /// Starts uploading `part` in the background; waits while too many are in flight.
    fn send_part(&mut self, part: Vec<u8>) -> Result<(), ObjectError> {
        self.start_upload()?;
        let upload = self.upload.as_mut().expect("started above");
        let number = upload.next_part;
        upload.next_part += 1;
        let request = self
            .store
            .client
            .upload_part()
            .bucket(&self.store.bucket)
            .key(self.store.full_key(&self.key))
            .upload_id(&upload.upload_id)
            .part_number(number)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .body(ByteStream::from(Bytes::from(part)));
        let (store, key) = (self.store.clone(), self.key.clone());
        upload.in_flight.push_back(self.store.runtime.spawn(async move {
            let output = request.send().await.map_err(|e| store.error("UploadPart", &key, None, e))?;
            Ok(CompletedPart::builder().part_number(number).set_e_tag(output.e_tag).set_checksum_crc32(output.checksum_crc32).build())
        }));
        while self.upload.as_ref().is_some_and(|u| u.in_flight.len() > PARTS_IN_FLIGHT) {
            self.wait_oldest()?;
        }
        Ok(())
    }

    fn wait_oldest(&mut self) -> Result<(), ObjectError> {
        let Some(upload) = self.upload.as_mut() else { return Ok(()) };
        let Some(handle) = upload.in_flight.pop_front() else { return Ok(()) };
        let part = self.store.runtime.block_on(handle).map_err(|e| ObjectError::Unavailable {
            key: self.key.clone(),
            message: format!("S3 UploadPart {}: the upload task failed: {e}", self.store.url(&self.key)),
        })??;
        upload.done.push(part);
        Ok(())
    }

    fn fail(&mut self, error: ObjectError) -> io::Error {
        let io_error = io::Error::other(error.to_string());
        self.broken.get_or_insert(error);
        io_error
    }

    fn complete(&mut self) -> Result<ObjectMeta, ObjectError> {
        if let Some(error) = self.broken.take() {
            return Err(error);
        }
        if self.upload.is_none() {
            // Smaller than one part: one conditional PutObject.
            let bytes = std::mem::take(&mut self.buffer);
            return self.store.put(&self.key, &bytes, self.condition.clone());
        }
        if !self.buffer.is_empty() {
            let last = std::mem::take(&mut self.buffer);
            self.send_part(last)?;
        }
        while self.upload.as_ref().is_some_and(|u| !u.in_flight.is_empty()) {
            self.wait_oldest()?;
        }
        let upload = self.upload.as_mut().expect("a multipart upload");
        let mut parts = std::mem::take(&mut upload.done);
        parts.sort_by_key(|p| p.part_number());
        let request = self
            .store
            .client
            .complete_multipart_upload()
            .bucket(&self.store.bucket)
            .key(self.store.full_key(&self.key))
            .upload_id(&upload.upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build());
        let request = with_condition!(request, &self.condition);
        let output = self
            .store
            .runtime
            .block_on(request.send())
            .map_err(|e| self.store.error("CompleteMultipartUpload", &self.key, Some(&self.condition), e))?;
        upload.completed = true;
        Ok(ObjectMeta { key: self.key.clone(), size: self.written, etag: output.e_tag.unwrap_or_default(), modified_ms: now_ms() })
    }
}

impl Write for S3Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(error) = &self.broken {
            return Err(io::Error::other(format!("an earlier part of this write failed: {error}")));
        }
        let part_size = self.store.part_size;
        self.buffer.extend_from_slice(buf);
        self.written += buf.len() as u64;
        while self.buffer.len() >= part_size {
            let rest = self.buffer.split_off(part_size);
            let part = std::mem::replace(&mut self.buffer, rest);
            if let Err(error) = self.send_part(part) {
                return Err(self.fail(error));
            }
        }
        Ok(buf.len())
    }

    /// Parts go up as they fill; there is nothing to flush before `commit`.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for S3Writer {
    fn commit(mut self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
        self.complete()
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        let Some(upload) = self.upload.as_mut() else { return };
        if upload.completed {
            return;
        }
        for part in upload.in_flight.drain(..) {
            part.abort();
        }
        let request = self
            .store
            .client
            .abort_multipart_upload()
            .bucket(&self.store.bucket)
            .key(self.store.full_key(&self.key))
            .upload_id(&upload.upload_id);
        let url = self.store.url(&self.key);
        let abort = async move {
            if let Err(error) = request.send().await {
                tracing::warn!(%url, error = %aws_sdk_s3::error::DisplayErrorContext(&error), "multipart upload not aborted; the bucket's lifecycle rule will remove it");
            }
        };
        self.store.runtime.finish(abort);
    }
}
