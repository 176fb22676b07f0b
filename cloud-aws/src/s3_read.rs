//! Streamed reads of one object version. A long download that breaks off (a reset connection,
//! a truncated body) resumes with a ranged GET from where it stopped, pinned to the first
//! answer's ETag with `If-Match`: if the object was replaced meanwhile the read fails rather
//! than splicing two versions.

use std::io::{self, Read};

use bytes::{Buf, Bytes};
use aws_sdk_s3::primitives::ByteStream;

use super::s3::S3ObjectStore;
use cloud::objects::ObjectError;

/// Resumes of one read before it gives up.
const RESUMES: u32 = 3;

pub(crate) struct S3Reader {
    store: S3ObjectStore,
    key: String,
    body: ByteStream,
    chunk: Bytes,
    etag: Option<String>,
    position: u64,
    size: Option<u64>,
    resumes_left: u32,
}

impl S3Reader {
    pub(crate) fn open(store: S3ObjectStore, key: &str) -> Result<S3Reader, ObjectError> {
        let request = store.client.get_object().bucket(&store.bucket).key(store.full_key(key));
        let output = store.runtime.block_on(request.send()).map_err(|e| store.error("GetObject", key, None, e))?;
        Ok(S3Reader {
            key: key.to_owned(),
            body: output.body,
            chunk: Bytes::new(),
            etag: output.e_tag,
            position: 0,
            size: output.content_length.map(|n| n.max(0) as u64),
            resumes_left: RESUMES,
            store,
        })
    }

    /// Continues the same version from `position`, or says why it cannot.
    fn resume(&mut self, why: String) -> io::Result<()> {
        let fail = |message: String| io::Error::other(format!("S3 GetObject {}: {message}", self.store.url(&self.key)));
        if self.resumes_left == 0 {
            return Err(fail(format!("{why} at byte {} (after {RESUMES} resumes)", self.position)));
        }
        self.resumes_left -= 1;
        tracing::debug!(key = %self.key, position = self.position, why, "resuming an S3 download");
        let request = self
            .store
            .client
            .get_object()
            .bucket(&self.store.bucket)
            .key(self.store.full_key(&self.key))
            .range(format!("bytes={}-", self.position))
            .set_if_match(self.etag.clone());
        match self.store.runtime.block_on(request.send()) {
            Ok(output) => {
                self.body = output.body;
                Ok(())
            }
            Err(error) => match self.store.error("GetObject", &self.key, None, error) {
                ObjectError::PreconditionFailed { .. } => Err(fail("the object was replaced while it was being read".into())),
                other => Err(io::Error::other(other.to_string())),
            },
        }
    }
}

impl Read for S3Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.chunk.is_empty() {
                let n = buf.len().min(self.chunk.len());
                buf[..n].copy_from_slice(&self.chunk[..n]);
                self.chunk.advance(n);
                self.position += n as u64;
                return Ok(n);
            }
            match self.store.runtime.block_on(self.body.next()) {
                Some(Ok(bytes)) => self.chunk = bytes,
                Some(Err(error)) => self.resume(error.to_string())?,
                None => match self.size {
                    Some(size) if self.position < size => self.resume(format!("the body ended early ({size} bytes expected)"))?,
                    _ => return Ok(0),
                },
            }
        }
    }
}
