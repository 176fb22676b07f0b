//! Records inside a sealed stream: a compact, length-prefixed encoding (all integers big-endian).
//!
//! ```text
//! input     := 0x01 ‖ id_len u16 ‖ id ‖ text_len u32 ‖ text
//! embedding := 0x02 ‖ id_len u16 ‖ id ‖ tokens u32 ‖ dtype u8 ‖ dim u16 ‖ dim × element (LE)
//! error     := 0x03 ‖ id_len u16 ‖ id ‖ code u16 ‖ message_len u16 ‖ message
//! ```
//!
//! An id is 1..=[`MAX_ID_LEN`] bytes of UTF-8. A text is carried as raw bytes, at most
//! [`MAX_WIRE_TEXT_LEN`]; whether it is UTF-8 and at most [`MAX_TEXT_LEN`] bytes is for the enclave
//! to judge, per record. dtype 0x01
//! is f32, 0x02 is f16 (IEEE 754 binary16); one byte per element: 0x03 int8, 0x04 uint8,
//! 0x05 binary, 0x06 ubinary (the compact encodings of [`crate::quantize`]; `dim` counts bytes).
//! dtype 0x07 is a sparse vector, laid out after the dtype byte as
//! `dimensions u32 ‖ count u32 ‖ count × (index u32 ‖ weight f32 LE)`, indices ascending and below
//! `dimensions` (at most [`MAX_SPARSE_DIMENSIONS`]). dtype 0x08 is a multi-vector record
//! ([`multivector`]).

use crate::envelope::OutputDtype;
use crate::quantize::{self, Ranges};

pub const MAX_ID_LEN: usize = 512;
/// Largest text embedded; a longer one is a per-record `too_large` error.
pub const MAX_TEXT_LEN: usize = 256 * 1024;
/// Largest text a record may carry on the wire. Between [`MAX_TEXT_LEN`] and this, the record
/// decodes and the enclave reports it per record; beyond it the stream is malformed.
pub const MAX_WIRE_TEXT_LEN: usize = 4 * 1024 * 1024;
pub const MAX_MESSAGE_LEN: usize = 1024;
pub use crate::envelope::{MAX_DIMENSIONS, MAX_SPARSE_DIMENSIONS};

const DTYPE_SPARSE: u8 = 0x07;

mod multivector;
pub use multivector::MultiVector;

const TAG_INPUT: u8 = 0x01;
const TAG_EMBEDDING: u8 = 0x02;
const TAG_ERROR: u8 = 0x03;

/// Why a record stream could not be decoded. This fails the whole stream: the records are
/// authenticated, so a malformed one means a broken sender, not a bad line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record at offset {offset}: unknown record tag {tag:#04x}")]
    UnknownTag { offset: u64, tag: u8 },
    #[error("record at offset {offset}: id length {len} out of range (1..={MAX_ID_LEN})")]
    IdLength { offset: u64, len: usize },
    #[error("record at offset {offset}: id is not UTF-8")]
    IdNotUtf8 { offset: u64 },
    #[error("record at offset {offset}: text of {len} bytes exceeds {MAX_WIRE_TEXT_LEN}")]
    TextLength { offset: u64, len: usize },
    #[error("record at offset {offset}: unknown dtype {dtype:#04x}")]
    UnknownDtype { offset: u64, dtype: u8 },
    #[error("record at offset {offset}: {dim} dimensions exceed {MAX_DIMENSIONS}")]
    Dimensions { offset: u64, dim: usize },
    #[error("record at offset {offset}: a sparse vector whose indices do not ascend below its {dimensions} dimensions")]
    SparseIndices { offset: u64, dimensions: u32 },
    #[error("record at offset {offset}: {count} vectors of {dimensions} dimensions: none, more than the record's tokens, or over the record bytes' bound")]
    MultiVector { offset: u64, count: u32, dimensions: u16 },
    #[error("record at offset {offset}: error message too long or not UTF-8")]
    Message { offset: u64 },
    #[error("record at offset {offset}: unknown error code {code}")]
    UnknownCode { offset: u64, code: u16 },
    #[error("the stream ends inside a record at offset {offset}")]
    Truncated { offset: u64 },
    #[error("expected {expected} records, the stream holds {found}")]
    CountMismatch { expected: u64, found: u64 },
    /// Refused as the record arrives, not at the end: a header announcing 1 record must not buy
    /// the sender hours of work on millions.
    #[error("record at offset {offset}: the stream announced {announced} records and holds more")]
    MoreThanAnnounced { offset: u64, announced: u64 },
}

/// A record of a job's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    pub id: String,
    pub text: Vec<u8>,
}

/// Most documents one rerank record may carry (each is one sequence through the model).
pub const MAX_RERANK_DOCUMENTS: usize = 1024;

/// The text of a rerank job's input record (output kind `scores`): a query and the documents to
/// score against it, as the JSON object `{"query": …, "documents": [ … ]}` (no other field).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankInput {
    pub query: String,
    pub documents: Vec<String>,
}

impl RerankInput {
    pub fn to_text(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("strings serialise")
    }

    /// The record's text read back: a per-record failure (`invalid_json`, `missing_text`) when it
    /// is not such an object, has no document or more than [`MAX_RERANK_DOCUMENTS`].
    pub fn parse(text: &[u8]) -> Result<Self, (ErrorCode, String)> {
        let input: Self = serde_json::from_slice(text).map_err(|e| (ErrorCode::InvalidJson, format!("not a rerank input: {e}")))?;
        if input.documents.is_empty() || input.documents.len() > MAX_RERANK_DOCUMENTS {
            return Err((ErrorCode::MissingText, format!("{} documents: 1 to {MAX_RERANK_DOCUMENTS}", input.documents.len())));
        }
        Ok(input)
    }
}

/// Per-record failure reasons, shared by the client's local checks and the enclave's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The line is not valid JSON (client).
    InvalidJson = 1,
    /// The line lacks an id (client).
    MissingId = 2,
    /// The line lacks a text (client).
    MissingText = 3,
    /// An earlier line has the same id (client); the first one is embedded.
    DuplicateId = 4,
    /// The text exceeds the size limit (client and enclave).
    TooLarge = 5,
    /// The text is not UTF-8 (client and enclave).
    InvalidUtf8 = 6,
    /// The text is empty after normalisation (enclave).
    EmptyText = 7,
    /// The text has more tokens than the model takes and truncation is off (enclave).
    TooManyTokens = 8,
    /// The tokenizer refused the text (enclave).
    TokenizerFailed = 9,
    /// The line is not a request this service handles, e.g. another OpenAI endpoint (client).
    UnsupportedRequest = 10,
    /// Inference failed for this record (enclave).
    InferenceFailed = 11,
    /// The record's output is over the job's `max_record_bytes` (enclave, multi-vector jobs).
    OutputTooLarge = 12,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::InvalidJson,
        ErrorCode::MissingId,
        ErrorCode::MissingText,
        ErrorCode::DuplicateId,
        ErrorCode::TooLarge,
        ErrorCode::InvalidUtf8,
        ErrorCode::EmptyText,
        ErrorCode::TooManyTokens,
        ErrorCode::TokenizerFailed,
        ErrorCode::UnsupportedRequest,
        ErrorCode::InferenceFailed,
        ErrorCode::OutputTooLarge,
    ];

    pub fn from_u16(code: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|c| *c as u16 == code)
    }

    /// The name used in errors files.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::MissingId => "missing_id",
            ErrorCode::MissingText => "missing_text",
            ErrorCode::DuplicateId => "duplicate_id",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::InvalidUtf8 => "invalid_utf8",
            ErrorCode::EmptyText => "empty_text",
            ErrorCode::TooManyTokens => "too_many_tokens",
            ErrorCode::TokenizerFailed => "tokenizer_failed",
            ErrorCode::UnsupportedRequest => "unsupported_request",
            ErrorCode::InferenceFailed => "inference_failed",
            ErrorCode::OutputTooLarge => "output_too_large",
        }
    }
}

/// A vector, in the dtype the job asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Vector {
    F32(Vec<f32>),
    /// IEEE 754 binary16 bit patterns.
    F16(Vec<u16>),
    Int8(Vec<i8>),
    Uint8(Vec<u8>),
    /// Packed sign bits, each byte − 128.
    Binary(Vec<i8>),
    /// Packed sign bits.
    Ubinary(Vec<u8>),
    Sparse(SparseVector),
    /// One f32 vector per kept token (ColBERT).
    Multi(MultiVector),
}

/// The nonzero weights of a vector `dimensions` wide (a vocabulary), by ascending index.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseVector {
    pub dimensions: u32,
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

impl SparseVector {
    /// A dense row's nonzero values, or its `top_k` largest in magnitude (sentence-transformers'
    /// `max_active_dims`; of equal ones the lower index), in index order.
    pub fn from_dense(row: &[f32], top_k: Option<u32>) -> Self {
        let kept: Vec<u32> = (0..row.len() as u32).filter(|&i| row[i as usize] != 0.0).collect();
        Self { dimensions: row.len() as u32, values: kept.iter().map(|&i| row[i as usize]).collect(), indices: kept }.keep_largest(top_k)
    }

    /// Its `top_k` largest values in magnitude (of equal ones the lower index), in index order;
    /// all of them without `top_k`.
    pub fn keep_largest(self, top_k: Option<u32>) -> Self {
        let Some(k) = top_k.map(|k| k as usize).filter(|&k| self.indices.len() > k) else { return self };
        let mut order: Vec<usize> = (0..self.indices.len()).collect();
        order.sort_by(|&a, &b| self.values[b].abs().total_cmp(&self.values[a].abs()).then(self.indices[a].cmp(&self.indices[b])));
        order.truncate(k);
        order.sort_unstable();
        Self { dimensions: self.dimensions, indices: order.iter().map(|&i| self.indices[i]).collect(), values: order.iter().map(|&i| self.values[i]).collect() }
    }

    /// The dense row it stands for.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut row = vec![0.0; self.dimensions as usize];
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            row[i as usize] = v;
        }
        row
    }

    fn valid(&self) -> bool {
        self.dimensions as usize <= MAX_SPARSE_DIMENSIONS
            && self.indices.len() == self.values.len()
            && self.indices.windows(2).all(|w| w[0] < w[1])
            && self.indices.last().is_none_or(|&last| last < self.dimensions)
    }
}

impl Vector {
    pub fn dtype(&self) -> OutputDtype {
        match self {
            Vector::F32(_) => OutputDtype::F32,
            Vector::F16(_) => OutputDtype::F16,
            Vector::Int8(_) => OutputDtype::Int8,
            Vector::Uint8(_) => OutputDtype::Uint8,
            Vector::Binary(_) => OutputDtype::Binary,
            Vector::Ubinary(_) => OutputDtype::Ubinary,
            Vector::Sparse(_) | Vector::Multi(_) => OutputDtype::F32,
        }
    }

    /// Elements (bytes for the bit forms, the nonzero weights of a sparse vector).
    pub fn len(&self) -> usize {
        match self {
            Vector::Sparse(v) => v.values.len(),
            Vector::Multi(v) => v.values.len(),
            Vector::F32(v) => v.len(),
            Vector::F16(v) => v.len(),
            Vector::Int8(v) | Vector::Binary(v) => v.len(),
            Vector::Uint8(v) | Vector::Ubinary(v) => v.len(),
        }
    }

    /// The compact forms' elements as bytes (two's complement for the signed ones); `None` for
    /// the float forms.
    pub fn compact_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Vector::F32(_) | Vector::F16(_) | Vector::Sparse(_) | Vector::Multi(_) => None,
            Vector::Int8(v) | Vector::Binary(v) => Some(v.iter().map(|&b| b as u8).collect()),
            Vector::Uint8(v) | Vector::Ubinary(v) => Some(v.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `values` in the dtype a job asked for; `ranges` are the job's (needed for `int8`/`uint8`,
    /// [`crate::quantize`]).
    pub fn encode(values: Vec<f32>, dtype: OutputDtype, ranges: Option<&Ranges>) -> Result<Vector, EncodeError> {
        let ranged = |ranges: Option<&Ranges>| match ranges {
            None => Err(EncodeError::NoRanges(dtype.as_str())),
            Some(r) if r.dimensions() != values.len() => {
                Err(EncodeError::Dimensions { ranges: r.dimensions(), values: values.len() })
            }
            Some(r) => Ok(r.quantize(&values)),
        };
        Ok(match dtype {
            OutputDtype::F32 => Vector::F32(values),
            OutputDtype::F16 => Vector::F16(values.iter().map(|&v| f32_to_f16(v)).collect()),
            OutputDtype::Int8 => Vector::Int8(quantize::to_signed(ranged(ranges)?)),
            OutputDtype::Uint8 => Vector::Uint8(ranged(ranges)?),
            OutputDtype::Binary => Vector::Binary(quantize::to_signed(quantize::pack_bits(&values))),
            OutputDtype::Ubinary => Vector::Ubinary(quantize::pack_bits(&values)),
        })
    }

    /// The elements as f32 (f16 widened; a compact form's integers as they are; a sparse
    /// vector's dense row, a multi-vector's rows one after another).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Vector::Sparse(v) => v.to_dense(),
            Vector::Multi(v) => v.values.clone(),
            Vector::F32(v) => v.clone(),
            Vector::F16(v) => v.iter().map(|&bits| f16_to_f32(bits)).collect(),
            Vector::Int8(v) | Vector::Binary(v) => v.iter().map(|&b| f32::from(b)).collect(),
            Vector::Uint8(v) | Vector::Ubinary(v) => v.iter().map(|&b| f32::from(b)).collect(),
        }
    }
}

fn compact_tag(dtype: OutputDtype) -> u8 {
    match dtype {
        OutputDtype::F32 => 0x01,
        OutputDtype::F16 => 0x02,
        OutputDtype::Int8 => 0x03,
        OutputDtype::Uint8 => 0x04,
        OutputDtype::Binary => 0x05,
        OutputDtype::Ubinary => 0x06,
    }
}

fn put_sparse(out: &mut Vec<u8>, vector: &SparseVector) {
    out.push(DTYPE_SPARSE);
    out.extend_from_slice(&vector.dimensions.to_be_bytes());
    out.extend_from_slice(&(vector.indices.len() as u32).to_be_bytes());
    out.reserve(vector.indices.len() * 8);
    for (i, v) in vector.indices.iter().zip(&vector.values) {
        out.extend_from_slice(&i.to_be_bytes());
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Why a vector could not be put in a job's dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("{0} output needs the job's ranges")]
    NoRanges(&'static str),
    #[error("ranges for {ranges} dimensions, a vector of {values}")]
    Dimensions { ranges: usize, values: usize },
}

/// A record of a job's result: one per input record, in input order.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputRecord {
    Embedding { id: String, tokens: u32, vector: Vector },
    Error { id: String, code: ErrorCode, message: String },
}

impl OutputRecord {
    pub fn id(&self) -> &str {
        match self {
            OutputRecord::Embedding { id, .. } | OutputRecord::Error { id, .. } => id,
        }
    }
}

fn check_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN
}

fn put_id(out: &mut Vec<u8>, id: &str) {
    out.extend_from_slice(&(id.len() as u16).to_be_bytes());
    out.extend_from_slice(id.as_bytes());
}

/// Appends an input record. Fails (writing nothing) if the id or text is out of range.
pub fn encode_input(record: &InputRecord, out: &mut Vec<u8>) -> Result<(), RecordError> {
    if !check_id(&record.id) {
        return Err(RecordError::IdLength { offset: 0, len: record.id.len() });
    }
    if record.text.len() > MAX_TEXT_LEN {
        return Err(RecordError::TextLength { offset: 0, len: record.text.len() });
    }
    out.push(TAG_INPUT);
    put_id(out, &record.id);
    out.extend_from_slice(&(record.text.len() as u32).to_be_bytes());
    out.extend_from_slice(&record.text);
    Ok(())
}

/// Appends an output record. Over-long ids, messages or vectors are refused.
pub fn encode_output(record: &OutputRecord, out: &mut Vec<u8>) -> Result<(), RecordError> {
    if !check_id(record.id()) {
        return Err(RecordError::IdLength { offset: 0, len: record.id().len() });
    }
    match record {
        OutputRecord::Embedding { id, tokens, vector: Vector::Sparse(sparse) } => {
            if !sparse.valid() {
                return Err(RecordError::SparseIndices { offset: 0, dimensions: sparse.dimensions });
            }
            out.push(TAG_EMBEDDING);
            put_id(out, id);
            out.extend_from_slice(&tokens.to_be_bytes());
            put_sparse(out, sparse);
        }
        OutputRecord::Embedding { id, tokens, vector: Vector::Multi(multi) } => {
            if !multi.valid_for(*tokens) {
                let count = u32::try_from(multi.count()).unwrap_or(u32::MAX);
                return Err(RecordError::MultiVector { offset: 0, count, dimensions: multi.dimensions });
            }
            out.push(TAG_EMBEDDING);
            put_id(out, id);
            out.extend_from_slice(&tokens.to_be_bytes());
            multivector::put(out, multi);
        }
        OutputRecord::Embedding { id, tokens, vector } => {
            if vector.len() > MAX_DIMENSIONS {
                return Err(RecordError::Dimensions { offset: 0, dim: vector.len() });
            }
            out.push(TAG_EMBEDDING);
            put_id(out, id);
            out.extend_from_slice(&tokens.to_be_bytes());
            match vector {
                Vector::F32(values) => {
                    out.push(0x01);
                    out.extend_from_slice(&(values.len() as u16).to_be_bytes());
                    out.reserve(values.len() * 4);
                    for v in values {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
                Vector::F16(values) => {
                    out.push(0x02);
                    out.extend_from_slice(&(values.len() as u16).to_be_bytes());
                    for v in values {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
                Vector::Sparse(_) | Vector::Multi(_) => unreachable!("sparse and multi-vectors are written above"),
                compact => {
                    let bytes = compact.compact_bytes().expect("a compact form");
                    out.push(compact_tag(compact.dtype()));
                    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
                    out.extend_from_slice(&bytes);
                }
            }
        }
        OutputRecord::Error { id, code, message } => {
            if message.len() > MAX_MESSAGE_LEN {
                return Err(RecordError::Message { offset: 0 });
            }
            out.push(TAG_ERROR);
            put_id(out, id);
            out.extend_from_slice(&(*code as u16).to_be_bytes());
            out.extend_from_slice(&(message.len() as u16).to_be_bytes());
            out.extend_from_slice(message.as_bytes());
        }
    }
    Ok(())
}

/// Reads fields from a byte slice; `None` means "not enough bytes yet".
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Which record family a decoder reads.
trait RecordKind: Sized {
    fn parse(cursor: &mut Cursor<'_>, offset: u64) -> Result<Option<Self>, RecordError>;
}

fn parse_id(cursor: &mut Cursor<'_>, offset: u64) -> Result<Option<String>, RecordError> {
    let Some(len) = cursor.u16() else { return Ok(None) };
    let len = usize::from(len);
    if len == 0 || len > MAX_ID_LEN {
        return Err(RecordError::IdLength { offset, len });
    }
    let Some(bytes) = cursor.take(len) else { return Ok(None) };
    String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| RecordError::IdNotUtf8 { offset })
}

impl RecordKind for InputRecord {
    fn parse(cursor: &mut Cursor<'_>, offset: u64) -> Result<Option<Self>, RecordError> {
        let Some(tag) = cursor.u8() else { return Ok(None) };
        if tag != TAG_INPUT {
            return Err(RecordError::UnknownTag { offset, tag });
        }
        let Some(id) = parse_id(cursor, offset)? else { return Ok(None) };
        let Some(len) = cursor.u32() else { return Ok(None) };
        let len = len as usize;
        if len > MAX_WIRE_TEXT_LEN {
            return Err(RecordError::TextLength { offset, len });
        }
        let Some(text) = cursor.take(len) else { return Ok(None) };
        Ok(Some(InputRecord { id, text: text.to_vec() }))
    }
}

impl RecordKind for OutputRecord {
    fn parse(cursor: &mut Cursor<'_>, offset: u64) -> Result<Option<Self>, RecordError> {
        let Some(tag) = cursor.u8() else { return Ok(None) };
        if tag != TAG_EMBEDDING && tag != TAG_ERROR {
            return Err(RecordError::UnknownTag { offset, tag });
        }
        let Some(id) = parse_id(cursor, offset)? else { return Ok(None) };
        if tag == TAG_ERROR {
            let Some(code) = cursor.u16() else { return Ok(None) };
            let code = ErrorCode::from_u16(code).ok_or(RecordError::UnknownCode { offset, code })?;
            let Some(len) = cursor.u16() else { return Ok(None) };
            if usize::from(len) > MAX_MESSAGE_LEN {
                return Err(RecordError::Message { offset });
            }
            let Some(message) = cursor.take(usize::from(len)) else { return Ok(None) };
            let message = String::from_utf8(message.to_vec()).map_err(|_| RecordError::Message { offset })?;
            return Ok(Some(OutputRecord::Error { id, code, message }));
        }
        let Some(tokens) = cursor.u32() else { return Ok(None) };
        let Some(dtype) = cursor.u8() else { return Ok(None) };
        if dtype == DTYPE_SPARSE {
            let Some(sparse) = parse_sparse(cursor, offset)? else { return Ok(None) };
            return Ok(Some(OutputRecord::Embedding { id, tokens, vector: Vector::Sparse(sparse) }));
        }
        if dtype == multivector::DTYPE_MULTIVECTOR {
            let Some(multi) = multivector::parse(cursor, offset, tokens)? else { return Ok(None) };
            return Ok(Some(OutputRecord::Embedding { id, tokens, vector: Vector::Multi(multi) }));
        }
        let Some(dim) = cursor.u16() else { return Ok(None) };
        let dim = usize::from(dim);
        if dim > MAX_DIMENSIONS {
            return Err(RecordError::Dimensions { offset, dim });
        }
        let vector = match dtype {
            0x01 => {
                let Some(bytes) = cursor.take(dim * 4) else { return Ok(None) };
                Vector::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            0x02 => {
                let Some(bytes) = cursor.take(dim * 2) else { return Ok(None) };
                Vector::F16(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
            }
            0x03..=0x06 => {
                let Some(bytes) = cursor.take(dim) else { return Ok(None) };
                let signed = || bytes.iter().map(|&b| b as i8).collect();
                match dtype {
                    0x03 => Vector::Int8(signed()),
                    0x04 => Vector::Uint8(bytes.to_vec()),
                    0x05 => Vector::Binary(signed()),
                    _ => Vector::Ubinary(bytes.to_vec()),
                }
            }
            dtype => return Err(RecordError::UnknownDtype { offset, dtype }),
        };
        Ok(Some(OutputRecord::Embedding { id, tokens, vector }))
    }
}

fn parse_sparse(cursor: &mut Cursor<'_>, offset: u64) -> Result<Option<SparseVector>, RecordError> {
    let Some(dimensions) = cursor.u32() else { return Ok(None) };
    let Some(count) = cursor.u32() else { return Ok(None) };
    if dimensions as usize > MAX_SPARSE_DIMENSIONS || count > dimensions {
        return Err(RecordError::SparseIndices { offset, dimensions });
    }
    let Some(bytes) = cursor.take(count as usize * 8) else { return Ok(None) };
    let (indices, values) = bytes
        .chunks_exact(8)
        .map(|c| (u32::from_be_bytes([c[0], c[1], c[2], c[3]]), f32::from_le_bytes([c[4], c[5], c[6], c[7]])))
        .unzip();
    let sparse = SparseVector { dimensions, indices, values };
    if !sparse.valid() {
        return Err(RecordError::SparseIndices { offset, dimensions });
    }
    Ok(Some(sparse))
}

/// Decodes records from bytes pushed in pieces of any size (the plaintext of a stream), holding
/// at most one partial record.
pub struct Decoder<R> {
    buffer: Vec<u8>,
    start: usize,
    /// Stream offset of `buffer[start]`.
    offset: u64,
    count: u64,
    /// Records announced up front (a header's count): one more is an error at once.
    announced: Option<u64>,
    _kind: std::marker::PhantomData<R>,
}

pub type InputDecoder = Decoder<InputRecord>;
pub type OutputDecoder = Decoder<OutputRecord>;

#[allow(private_bounds)]
impl<R: RecordKind> Decoder<R> {
    pub fn new() -> Self {
        Self { buffer: Vec::new(), start: 0, offset: 0, count: 0, announced: None, _kind: std::marker::PhantomData }
    }

    /// A decoder for a stream that announced `announced` records: the record after the last
    /// announced one fails [`Decoder::next_record`] before it is returned.
    pub fn announced(announced: u64) -> Self {
        Self { announced: Some(announced), ..Self::new() }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete record, if one is buffered.
    pub fn next_record(&mut self) -> Result<Option<R>, RecordError> {
        let mut cursor = Cursor { bytes: &self.buffer[self.start..], at: 0 };
        match R::parse(&mut cursor, self.offset)? {
            Some(record) => {
                if self.announced.is_some_and(|announced| self.count >= announced) {
                    return Err(RecordError::MoreThanAnnounced { offset: self.offset, announced: self.count });
                }
                self.start += cursor.at;
                self.offset += cursor.at as u64;
                self.count += 1;
                Ok(Some(record))
            }
            None => Ok(None),
        }
    }

    /// Records decoded so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Ends the stream: fails if it stopped inside a record or if `expected` records were
    /// announced and another number arrived.
    pub fn finish(self, expected: Option<u64>) -> Result<u64, RecordError> {
        if self.start < self.buffer.len() {
            return Err(RecordError::Truncated { offset: self.offset });
        }
        if let Some(expected) = expected
            && expected != self.count
        {
            return Err(RecordError::CountMismatch { expected, found: self.count });
        }
        Ok(self.count)
    }
}

#[allow(private_bounds)]
impl<R: RecordKind> Default for Decoder<R> {
    fn default() -> Self {
        Self::new()
    }
}

/// Converts an f32 to IEEE 754 binary16 bits, rounding to nearest even.
pub fn f32_to_f16(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        // Inf or NaN (keep NaN quiet).
        return sign | 0x7c00 | if mantissa != 0 { 0x200 } else { 0 };
    }
    let unbiased = exponent - 127 + 15;
    if unbiased >= 0x1f {
        return sign | 0x7c00;
    }
    if unbiased <= 0 {
        if unbiased < -10 {
            return sign;
        }
        let m = mantissa | 0x80_0000;
        let shift = (14 - unbiased) as u32;
        let half = 1u32 << (shift - 1);
        let rounded = m + half - 1 + ((m >> shift) & 1);
        return sign | (rounded >> shift) as u16;
    }
    let rounded = mantissa + 0xfff + ((mantissa >> 13) & 1);
    if rounded & 0x80_0000 != 0 {
        let unbiased = unbiased + 1;
        if unbiased >= 0x1f {
            return sign | 0x7c00;
        }
        return sign | ((unbiased as u16) << 10);
    }
    sign | ((unbiased as u16) << 10) | (rounded >> 13) as u16
}

/// Widens IEEE 754 binary16 bits to f32 (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match exponent {
        0 => {
            // Subnormal (or zero): mantissa × 2^-24.
            let value = mantissa as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -value } else { value };
        }
        0x1f => 0x7f80_0000 | (mantissa << 13),
        e => ((e + 127 - 15) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sparse_records_have_a_known_answer_and_refuse_unordered_indices() {
        let sparse = SparseVector::from_dense(&[0.0, 1.5, 0.0, -0.25, 2.0], None);
        assert_eq!((sparse.indices.as_slice(), sparse.values.as_slice()), ([1, 3, 4].as_slice(), [1.5, -0.25, 2.0].as_slice()));
        let record = OutputRecord::Embedding { id: "s".into(), tokens: 7, vector: Vector::Sparse(sparse.clone()) };
        let mut out = Vec::new();
        encode_output(&record, &mut out).unwrap();
        // tag, id, tokens, dtype 0x07, dimensions 5, count 3, (index BE, weight LE) × 3.
        assert_eq!(
            hex::encode(&out),
            "020001730000000707000000050000000300000001 0000c03f 00000003 000080be 00000004 00000040".replace(' ', "")
        );
        let mut decoder = OutputDecoder::new();
        decoder.push(&out);
        assert_eq!(decoder.next_record().unwrap(), Some(record));
        assert_eq!(sparse.to_dense(), [0.0, 1.5, 0.0, -0.25, 2.0]);

        // A sender's bytes with indices out of order, repeated or past the dimensions: refused.
        for (at, index) in [(17, 5u32), (25, 1), (33, 3)] {
            let mut bad = out.clone();
            bad[at..at + 4].copy_from_slice(&index.to_be_bytes());
            let mut decoder = OutputDecoder::new();
            decoder.push(&bad);
            assert!(matches!(decoder.next_record(), Err(RecordError::SparseIndices { dimensions: 5, .. })), "index {index} at {at}");
        }
        // More weights announced than dimensions: refused before anything is read.
        let mut bad = out.clone();
        bad[13..17].copy_from_slice(&6u32.to_be_bytes());
        let mut decoder = OutputDecoder::new();
        decoder.push(&bad);
        assert!(matches!(decoder.next_record(), Err(RecordError::SparseIndices { .. })));
    }

    #[test]
    fn top_k_keeps_the_largest_weights_in_index_order() {
        let row = [0.5, 0.0, 3.0, 1.0, 3.0, 0.25];
        let top = SparseVector::from_dense(&row, Some(3));
        assert_eq!(top.indices, [2, 3, 4]);
        assert_eq!(top.values, [3.0, 1.0, 3.0]);
        // Of equal weights the lower index stays.
        assert_eq!(SparseVector::from_dense(&row, Some(1)).indices, [2]);
        assert_eq!(SparseVector::from_dense(&row, Some(10)).indices, [0, 2, 3, 4, 5]);
    }

    #[test]
    fn input_known_answer() {
        let mut out = Vec::new();
        encode_input(&InputRecord { id: "a1".into(), text: b"hi".to_vec() }, &mut out).unwrap();
        assert_eq!(hex::encode(&out), "0100026131000000026869");
    }

    #[test]
    fn decoder_waits_for_whole_records_and_names_truncation() {
        let mut bytes = Vec::new();
        for i in 0..3 {
            encode_input(&InputRecord { id: format!("r{i}"), text: vec![b'x'; i * 10] }, &mut bytes).unwrap();
        }
        let mut decoder = InputDecoder::new();
        let mut seen = Vec::new();
        for byte in &bytes {
            decoder.push(std::slice::from_ref(byte));
            while let Some(record) = decoder.next_record().unwrap() {
                seen.push(record.id);
            }
        }
        assert_eq!(seen, ["r0", "r1", "r2"]);
        assert_eq!(decoder.finish(Some(3)), Ok(3));

        let mut decoder = InputDecoder::new();
        decoder.push(&bytes[..bytes.len() - 1]);
        while decoder.next_record().unwrap().is_some() {}
        assert!(matches!(decoder.finish(Some(3)), Err(RecordError::Truncated { .. })));
    }

    #[test]
    fn count_mismatch_and_limits() {
        let mut decoder = InputDecoder::new();
        decoder.push(&[]);
        assert_eq!(decoder.finish(Some(1)), Err(RecordError::CountMismatch { expected: 1, found: 0 }));
        let mut out = Vec::new();
        assert!(encode_input(&InputRecord { id: String::new(), text: vec![] }, &mut out).is_err());
        assert!(encode_input(&InputRecord { id: "x".into(), text: vec![0; MAX_TEXT_LEN + 1] }, &mut out).is_err());
        assert!(out.is_empty());
        let mut decoder = InputDecoder::new();
        decoder.push(&[0x01, 0x00, 0x01, b'x', 0x00, 0x40, 0x00, 0x01]);
        assert!(matches!(decoder.next_record(), Err(RecordError::TextLength { .. })));
    }

    #[test]
    fn a_record_past_the_announced_count_fails_as_it_arrives() {
        let mut bytes = Vec::new();
        for id in ["a", "b", "c"] {
            encode_input(&InputRecord { id: id.into(), text: b"t".to_vec() }, &mut bytes).unwrap();
        }
        let mut decoder = InputDecoder::announced(2);
        decoder.push(&bytes);
        assert!(decoder.next_record().unwrap().is_some());
        assert!(decoder.next_record().unwrap().is_some());
        assert!(matches!(decoder.next_record(), Err(RecordError::MoreThanAnnounced { announced: 2, .. })));
        let mut zero = InputDecoder::announced(0);
        zero.push(&bytes);
        assert!(matches!(zero.next_record(), Err(RecordError::MoreThanAnnounced { announced: 0, offset: 0 })));
    }

    #[test]
    fn f16_conversion_matches_known_values() {
        for (value, bits) in [(1.0f32, 0x3c00u16), (-2.0, 0xc000), (0.0, 0), (65504.0, 0x7bff), (1e-8, 0), (5.960_464_5e-8, 1), (0.333_333_34, 0x3555)] {
            assert_eq!(f32_to_f16(value), bits, "{value}");
        }
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        for bits in 0u16..0x7c00 {
            assert_eq!(f32_to_f16(f16_to_f32(bits)), bits);
            assert_eq!(f32_to_f16(-f16_to_f32(bits)), bits | 0x8000);
        }
    }

    fn output_record() -> impl Strategy<Value = OutputRecord> {
        let id = "[a-z0-9]{1,20}";
        prop_oneof![
            (id, any::<u32>(), proptest::collection::vec(-1.0f32..1.0, 0..400))
                .prop_map(|(id, tokens, v)| OutputRecord::Embedding { id, tokens, vector: Vector::F32(v) }),
            (id, proptest::collection::vec(any::<u16>(), 0..50))
                .prop_map(|(id, v)| OutputRecord::Embedding { id, tokens: 3, vector: Vector::F16(v) }),
            (id, proptest::collection::vec(any::<i8>(), 0..40))
                .prop_map(|(id, v)| OutputRecord::Embedding { id, tokens: 4, vector: Vector::Int8(v) }),
            (id, proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(id, v)| OutputRecord::Embedding { id, tokens: 5, vector: Vector::Ubinary(v) }),
            (id, proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(id, v)| OutputRecord::Embedding { id, tokens: 6, vector: Vector::Uint8(v) }),
            (id, proptest::collection::vec(any::<i8>(), 0..40))
                .prop_map(|(id, v)| OutputRecord::Embedding { id, tokens: 7, vector: Vector::Binary(v) }),
            (id, 0usize..11, ".{0,60}").prop_map(|(id, code, message)| OutputRecord::Error {
                id,
                code: ErrorCode::ALL[code],
                message
            }),
        ]
    }

    proptest! {
        #[test]
        fn output_records_round_trip(records in proptest::collection::vec(output_record(), 0..20), split in 0usize..10_000) {
            let mut bytes = Vec::new();
            for record in &records {
                encode_output(record, &mut bytes).unwrap();
            }
            let split = split.min(bytes.len());
            let mut decoder = OutputDecoder::new();
            let mut decoded = Vec::new();
            for part in [&bytes[..split], &bytes[split..]] {
                decoder.push(part);
                while let Some(record) = decoder.next_record().unwrap() {
                    decoded.push(record);
                }
            }
            prop_assert_eq!(decoder.finish(Some(records.len() as u64)).unwrap(), records.len() as u64);
            prop_assert_eq!(decoded, records);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut input = InputDecoder::new();
            input.push(&bytes);
            while let Ok(Some(_)) = input.next_record() {}
            let mut output = OutputDecoder::new();
            output.push(&bytes);
            while let Ok(Some(_)) = output.next_record() {}
        }
    }
}
