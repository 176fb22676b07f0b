//! The chunked STREAM layer: any amount of plaintext sealed in 64 KiB chunks under one key, in
//! constant memory, so that truncation, reordering and splicing are detected.
//!
//! A sealed chunk is `stream_id (16) ‖ ChaCha20-Poly1305(key, nonce, aad = stream_id, chunk)`.
//! The nonce is an 11-byte big-endian chunk counter followed by a flag byte, 0x01 on the final
//! chunk and 0x00 on every other. Every chunk but the last carries exactly [`CHUNK_SIZE`]
//! plaintext bytes; the last carries 0..=[`CHUNK_SIZE`] (it is empty only when the whole
//! plaintext is). The stream id travels in clear: it costs 16 bytes per chunk and lets a reader
//! name a chunk spliced in from another stream instead of reporting a bare MAC failure.

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};

/// Plaintext bytes per chunk.
pub const CHUNK_SIZE: usize = 64 * 1024;
/// Poly1305 tag length.
pub const TAG_SIZE: usize = 16;
/// Length of a stream id.
pub const STREAM_ID_LEN: usize = 16;
/// Size of a full sealed chunk on the wire.
pub const SEALED_CHUNK_SIZE: usize = STREAM_ID_LEN + CHUNK_SIZE + TAG_SIZE;
/// How far from the expected position a reader looks to name a reordered chunk.
const REORDER_SEARCH: u64 = 64;

/// Identifies one sealed stream; its first 16 bytes are repeated at the head of every chunk.
pub type StreamId = [u8; STREAM_ID_LEN];

/// Why a sealed stream was refused. Each tampering has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("stream truncated: it ends before its final chunk (after {chunks} chunks)")]
    Truncated { chunks: u64 },
    #[error("data follows the final chunk (chunk {chunk})")]
    TrailingData { chunk: u64 },
    #[error("chunk {position} is out of order: it was sealed as chunk {sealed_as}")]
    OutOfOrder { position: u64, sealed_as: u64 },
    #[error("chunk {chunk} belongs to another stream (stream id {found})")]
    SplicedChunk { chunk: u64, found: String },
    #[error("chunk {chunk} fails authentication (modified ciphertext or wrong key)")]
    ChunkAuthentication { chunk: u64 },
    #[error("stream too long: chunk counter exhausted")]
    CounterExhausted,
    #[error("stream used after it failed or finished")]
    Poisoned,
}

fn nonce(counter: u64, last: bool) -> chacha20poly1305::Nonce {
    let mut nonce = [0u8; 12];
    nonce[3..11].copy_from_slice(&counter.to_be_bytes());
    nonce[11] = u8::from(last);
    nonce.into()
}

fn cipher(key: &[u8; 32]) -> ChaCha20Poly1305 {
    ChaCha20Poly1305::new(&(*key).into())
}

/// Seals plaintext pushed in pieces of any size.
pub struct StreamSealer {
    aead: ChaCha20Poly1305,
    stream_id: StreamId,
    counter: u64,
    pending: Vec<u8>,
    finished: bool,
}

impl StreamSealer {
    pub fn new(key: &[u8; 32], stream_id: StreamId) -> Self {
        Self { aead: cipher(key), stream_id, counter: 0, pending: Vec::with_capacity(CHUNK_SIZE), finished: false }
    }

    /// Appends plaintext; writes every chunk that is known not to be the last to `out`.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.finished {
            return Err(StreamError::Poisoned);
        }
        while !data.is_empty() {
            if self.pending.len() == CHUNK_SIZE {
                self.seal_pending(false, out)?;
            }
            let take = (CHUNK_SIZE - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(())
    }

    /// Seals the final chunk; the sealer takes no more data after it.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.finished {
            return Err(StreamError::Poisoned);
        }
        self.finished = true;
        self.seal_pending(true, out)
    }

    fn seal_pending(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let start = out.len();
        out.extend_from_slice(&self.stream_id);
        out.extend_from_slice(&self.pending);
        let tag = self
            .aead
            .encrypt_inout_detached(
                &nonce(self.counter, last),
                &self.stream_id,
                (&mut out[start + STREAM_ID_LEN..]).into(),
            )
            .map_err(|_| StreamError::CounterExhausted)?;
        out.extend_from_slice(&tag);
        self.pending.clear();
        self.counter = self.counter.checked_add(1).ok_or(StreamError::CounterExhausted)?;
        Ok(())
    }
}

/// Opens a sealed stream pushed in pieces of any size. It holds at most one sealed chunk.
pub struct StreamOpener {
    aead: ChaCha20Poly1305,
    stream_id: StreamId,
    counter: u64,
    buffer: Vec<u8>,
    poisoned: bool,
}

impl StreamOpener {
    pub fn new(key: &[u8; 32], stream_id: StreamId) -> Self {
        Self {
            aead: cipher(key),
            stream_id,
            counter: 0,
            buffer: Vec::with_capacity(SEALED_CHUNK_SIZE + 1),
            poisoned: false,
        }
    }

    /// Number of chunks opened so far.
    pub fn chunks_opened(&self) -> u64 {
        self.counter
    }

    /// Appends sealed bytes; writes the plaintext of every chunk known not to be the last.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.poisoned {
            return Err(StreamError::Poisoned);
        }
        while !data.is_empty() {
            // A full chunk followed by at least one more byte cannot be the last one.
            let take = (SEALED_CHUNK_SIZE + 1 - self.buffer.len()).min(data.len());
            self.buffer.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buffer.len() == SEALED_CHUNK_SIZE + 1 {
                let next = self.buffer[SEALED_CHUNK_SIZE];
                self.buffer.truncate(SEALED_CHUNK_SIZE);
                let opened = self.open_buffered(false, out);
                self.buffer.clear();
                self.buffer.push(next);
                opened?;
            }
        }
        Ok(())
    }

    /// Opens the final chunk; fails if the stream ended early. The opener takes no more data
    /// after it.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.poisoned {
            return Err(StreamError::Poisoned);
        }
        self.poisoned = true;
        if self.buffer.len() < STREAM_ID_LEN + TAG_SIZE {
            return Err(StreamError::Truncated { chunks: self.counter });
        }
        self.open_buffered(true, out)
    }

    fn open_buffered(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let result = self.try_open(last, out);
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn try_open(&mut self, last: bool, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let chunk = self.counter;
        let (id, rest) = self.buffer.split_at(STREAM_ID_LEN);
        if id != self.stream_id {
            return Err(StreamError::SplicedChunk { chunk, found: hex::encode(id) });
        }
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_SIZE);
        let start = out.len();
        out.extend_from_slice(ciphertext);
        let tag: chacha20poly1305::Tag = match <[u8; TAG_SIZE]>::try_from(tag) {
            Ok(t) => t.into(),
            Err(_) => return Err(StreamError::ChunkAuthentication { chunk }),
        };
        let opened = self.aead.decrypt_inout_detached(
            &nonce(chunk, last),
            &self.stream_id,
            (&mut out[start..]).into(),
            &tag,
        );
        if opened.is_ok() {
            self.counter = chunk.checked_add(1).ok_or(StreamError::CounterExhausted)?;
            return Ok(());
        }
        out.truncate(start);
        Err(self.diagnose(chunk, last, ciphertext, &tag))
    }

    /// Names the failure of chunk `position` by finding which nonce, if any, it was sealed
    /// under. Runs only on the failure path.
    fn diagnose(&self, position: u64, last: bool, ciphertext: &[u8], tag: &chacha20poly1305::Tag) -> StreamError {
        let authentic = |counter: u64, flag: bool| {
            let mut scratch = ciphertext.to_vec();
            self.aead
                .decrypt_inout_detached(&nonce(counter, flag), &self.stream_id, scratch.as_mut_slice().into(), tag)
                .is_ok()
        };
        if authentic(position, !last) {
            return if last {
                StreamError::Truncated { chunks: position + 1 }
            } else {
                StreamError::TrailingData { chunk: position }
            };
        }
        let low = position.saturating_sub(REORDER_SEARCH);
        let high = position.saturating_add(REORDER_SEARCH);
        for counter in (low..=high).filter(|c| *c != position) {
            if authentic(counter, false) || authentic(counter, true) {
                return StreamError::OutOfOrder { position, sealed_as: counter };
            }
        }
        StreamError::ChunkAuthentication { chunk: position }
    }
}

/// Size of the sealed form of `plaintext_len` bytes.
pub fn sealed_len(plaintext_len: u64) -> u64 {
    let chunk = CHUNK_SIZE as u64;
    let chunks = if plaintext_len == 0 { 1 } else { plaintext_len.div_ceil(chunk) };
    plaintext_len + chunks * (STREAM_ID_LEN + TAG_SIZE) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const ID: StreamId = [9; 16];

    fn seal(plaintext: &[u8]) -> Vec<u8> {
        let mut sealer = StreamSealer::new(&KEY, ID);
        let mut out = Vec::new();
        sealer.push(plaintext, &mut out).unwrap();
        sealer.finish(&mut out).unwrap();
        out
    }

    fn open(sealed: &[u8]) -> Result<Vec<u8>, StreamError> {
        let mut opener = StreamOpener::new(&KEY, ID);
        let mut out = Vec::new();
        opener.push(sealed, &mut out)?;
        opener.finish(&mut out)?;
        Ok(out)
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn round_trips_at_chunk_boundaries() {
        for len in [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE] {
            let plaintext = sample(len);
            let sealed = seal(&plaintext);
            assert_eq!(sealed.len() as u64, sealed_len(len as u64), "len {len}");
            assert_eq!(open(&sealed).unwrap(), plaintext, "len {len}");
        }
    }

    #[test]
    fn truncation_at_a_chunk_boundary_is_named() {
        let sealed = seal(&sample(2 * CHUNK_SIZE + 10));
        assert_eq!(open(&sealed[..SEALED_CHUNK_SIZE]), Err(StreamError::Truncated { chunks: 1 }));
        assert_eq!(open(&sealed[..2 * SEALED_CHUNK_SIZE]), Err(StreamError::Truncated { chunks: 2 }));
        assert_eq!(open(&sealed[..20]), Err(StreamError::Truncated { chunks: 0 }));
        assert_eq!(open(&[]), Err(StreamError::Truncated { chunks: 0 }));
    }

    #[test]
    fn appended_data_is_named() {
        let first = seal(&sample(CHUNK_SIZE));
        let mut sealed = first.clone();
        sealed.extend_from_slice(&first[..40]);
        assert_eq!(open(&sealed), Err(StreamError::TrailingData { chunk: 0 }));
    }

    #[test]
    fn reordering_is_named() {
        let sealed = seal(&sample(3 * CHUNK_SIZE + 5));
        let mut swapped = sealed.clone();
        swapped[..SEALED_CHUNK_SIZE].copy_from_slice(&sealed[SEALED_CHUNK_SIZE..2 * SEALED_CHUNK_SIZE]);
        swapped[SEALED_CHUNK_SIZE..2 * SEALED_CHUNK_SIZE].copy_from_slice(&sealed[..SEALED_CHUNK_SIZE]);
        assert_eq!(open(&swapped), Err(StreamError::OutOfOrder { position: 0, sealed_as: 1 }));
    }

    #[test]
    fn splicing_from_another_stream_is_named() {
        let sealed = seal(&sample(2 * CHUNK_SIZE));
        let mut other = StreamSealer::new(&[8; 32], [1; 16]);
        let mut foreign = Vec::new();
        other.push(&sample(2 * CHUNK_SIZE), &mut foreign).unwrap();
        other.finish(&mut foreign).unwrap();
        let mut spliced = sealed.clone();
        spliced[SEALED_CHUNK_SIZE..2 * SEALED_CHUNK_SIZE].copy_from_slice(&foreign[SEALED_CHUNK_SIZE..2 * SEALED_CHUNK_SIZE]);
        assert!(matches!(open(&spliced), Err(StreamError::SplicedChunk { chunk: 1, .. })));
    }

    #[test]
    fn flipped_bytes_and_wrong_keys_fail_authentication() {
        let sealed = seal(&sample(100));
        let mut flipped = sealed.clone();
        flipped[40] ^= 1;
        assert_eq!(open(&flipped), Err(StreamError::ChunkAuthentication { chunk: 0 }));
        let mut opener = StreamOpener::new(&[1; 32], ID);
        let mut out = Vec::new();
        opener.push(&sealed, &mut out).unwrap();
        assert_eq!(opener.finish(&mut out), Err(StreamError::ChunkAuthentication { chunk: 0 }));
    }

    #[test]
    fn a_failed_opener_stays_failed() {
        let sealed = seal(&sample(3 * CHUNK_SIZE));
        let mut flipped = sealed.clone();
        flipped[40] ^= 1;
        let mut opener = StreamOpener::new(&KEY, ID);
        let mut out = Vec::new();
        assert!(opener.push(&flipped, &mut out).is_err());
        assert_eq!(opener.push(&sealed, &mut out), Err(StreamError::Poisoned));
        assert!(out.is_empty());
    }
}
