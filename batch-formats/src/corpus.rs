//! Reading a corpus file: one JSON object per line, checked line by line before anything is
//! sealed. A bad line becomes a [`LineError`] that stays on this machine; the good lines become
//! [`InputRecord`]s for the sealed stream.
//!
//! Two line forms are accepted, one per file (the first line that yields records sets it):
//!
//! ```text
//! plain   {"id": "doc-1" | 17, "text": "…"}                       (other fields ignored)
//! openai  {"custom_id": "req-1", "method": "POST", "url": "/v1/embeddings",
//!          "body": {"model": "…", "input": "…" | ["…", …]}}        (OpenAI Batch request line)
//! ```
//!
//! A plain line is one record whose id is the line's id (an integer kept as its decimal string).
//! An OpenAI line is one record per input string, with id [`openai_record_id`]`(custom_id,
//! index)`, so the output side can regroup the strings of a line; `body.model`, when present,
//! must name the job's model (the full id or its last path segment).
//!
//! Error codes (the `code` of a [`LineError`], stable strings): `invalid_json`, `invalid_utf8`,
//! `missing_id`, `missing_text`, `invalid_text`, `duplicate_id`, `too_large`, `id_too_long`,
//! `unsupported_request`, `model_mismatch`, `mixed_forms`. Empty texts pass: whether a text is
//! empty after normalisation is for the enclave to say (`empty_text`). Blank lines are skipped.
//! An id is taken by the first line that yields records with it; a later line with the same id
//! is a `duplicate_id` error (a line that failed earlier takes no id).
//!
//! Memory stays flat whatever the file size: a line longer than
//! [`CorpusOptions::max_line_len`] is skipped to its newline without being buffered, and only a
//! 16-byte digest and a line number are kept per id for the duplicate check.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use protocol::records::{InputRecord, MAX_ID_LEN, MAX_RERANK_DOCUMENTS, MAX_TEXT_LEN, RerankInput};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Default cap on one line: room for a maximal text even if every byte is `\u00XX`-escaped,
/// and for OpenAI lines holding several texts.
pub const DEFAULT_MAX_LINE_LEN: usize = 16 * 1024 * 1024;

/// The only OpenAI endpoint this service answers.
pub const OPENAI_EMBEDDINGS_URL: &str = "/v1/embeddings";

/// Why a line of the corpus was not sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineErrorCode {
    InvalidJson,
    InvalidUtf8,
    MissingId,
    MissingText,
    InvalidText,
    DuplicateId,
    TooLarge,
    IdTooLong,
    UnsupportedRequest,
    ModelMismatch,
    MixedForms,
}

impl LineErrorCode {
    pub const ALL: [LineErrorCode; 11] = [
        LineErrorCode::InvalidJson,
        LineErrorCode::InvalidUtf8,
        LineErrorCode::MissingId,
        LineErrorCode::MissingText,
        LineErrorCode::InvalidText,
        LineErrorCode::DuplicateId,
        LineErrorCode::TooLarge,
        LineErrorCode::IdTooLong,
        LineErrorCode::UnsupportedRequest,
        LineErrorCode::ModelMismatch,
        LineErrorCode::MixedForms,
    ];

    /// The name written to errors files.
    pub fn as_str(self) -> &'static str {
        match self {
            LineErrorCode::InvalidJson => "invalid_json",
            LineErrorCode::InvalidUtf8 => "invalid_utf8",
            LineErrorCode::MissingId => "missing_id",
            LineErrorCode::MissingText => "missing_text",
            LineErrorCode::InvalidText => "invalid_text",
            LineErrorCode::DuplicateId => "duplicate_id",
            LineErrorCode::TooLarge => "too_large",
            LineErrorCode::IdTooLong => "id_too_long",
            LineErrorCode::UnsupportedRequest => "unsupported_request",
            LineErrorCode::ModelMismatch => "model_mismatch",
            LineErrorCode::MixedForms => "mixed_forms",
        }
    }
}

impl std::fmt::Display for LineErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A line that was not sealed. Serialises as `{"line", "id", "code", "message"}`, so the client
/// can keep the errors of a submission until it writes the results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineError {
    /// 1-based line number in the file (blank lines count).
    pub line: u64,
    /// The line's id (`custom_id` for OpenAI lines), when it could be read.
    pub id: Option<String>,
    pub code: LineErrorCode,
    pub message: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}", self.line)?;
        if let Some(id) = &self.id {
            write!(f, " (id {id:?})")?;
        }
        write!(f, ": {}: {}", self.code, self.message)
    }
}

/// Which of the two line forms a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorpusForm {
    /// `{"id", "text"}`.
    Plain,
    /// OpenAI Batch request lines.
    OpenAi,
    /// `{"id", "query", "documents"}`: a cross-encoder's input (one record per line, whose text
    /// is the [`RerankInput`]).
    Rerank,
}

impl CorpusForm {
    pub fn as_str(self) -> &'static str {
        match self {
            CorpusForm::Plain => "plain",
            CorpusForm::OpenAi => "openai",
            CorpusForm::Rerank => "rerank",
        }
    }
}

/// Reading failed as a whole (the file, not a line).
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The cause is the error's source, not part of its text: a chain (`{:#}`) says it once.
    #[error("reading the corpus{}", path.as_ref().map(|p| format!(" {p}")).unwrap_or_default())]
    Io {
        path: Option<String>,
        #[source]
        source: io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorpusOptions {
    /// The job's model: OpenAI lines naming another model are `model_mismatch`.
    pub model_id: String,
    /// The job's vector length (the model's dimensions, or the Matryoshka length asked for), if
    /// known: an OpenAI `body.dimensions` must equal it (one length per job).
    pub dimensions: Option<u32>,
    /// Longest line read (bytes, without the newline); longer lines are `too_large`.
    pub max_line_len: usize,
    /// `Some(true)`: the job scores documents (a cross-encoder), every line is a rerank line;
    /// `Some(false)`: none is. `None` (a check before the model is known): as the first line's
    /// shape says.
    pub rerank: Option<bool>,
}

impl CorpusOptions {
    pub fn new(model_id: impl Into<String>) -> Self {
        Self { model_id: model_id.into(), dimensions: None, max_line_len: DEFAULT_MAX_LINE_LEN, rerank: None }
    }

    fn accepts_model(&self, name: &str) -> bool {
        name == self.model_id || name == last_segment(&self.model_id)
    }
}

fn last_segment(model_id: &str) -> &str {
    model_id.rsplit('/').next().unwrap_or(model_id)
}

/// What one non-blank line of the corpus gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorpusItem {
    /// The records to seal (one for a plain line, one per input string for an OpenAI line).
    Records {
        line: u64,
        records: Vec<InputRecord>,
    },
    Error(LineError),
}

/// Counts of a pass over a corpus.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CorpusSummary {
    /// Records to seal: what the sealed header announces.
    pub records: u64,
    /// Non-blank lines.
    pub lines: u64,
    /// Lines that yielded records.
    pub accepted_lines: u64,
    /// Lines refused locally.
    pub errors: u64,
    /// `None` when no line was accepted.
    pub form: Option<CorpusForm>,
}

/// The record id of string `index` of the OpenAI line `custom_id`: `<custom_id>#<index>`, the
/// index in decimal. Unambiguous for any custom_id: the index, which holds no `#`, follows the
/// last `#`.
pub fn openai_record_id(custom_id: &str, index: usize) -> String {
    format!("{custom_id}#{index}")
}

/// Inverse of [`openai_record_id`]; `None` for anything it cannot have produced.
pub fn parse_openai_record_id(id: &str) -> Option<(&str, usize)> {
    let (custom_id, index) = id.rsplit_once('#')?;
    let canonical =
        !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) && (index == "0" || !index.starts_with('0'));
    if custom_id.is_empty() || !canonical {
        return None;
    }
    Some((custom_id, index.parse().ok()?))
}

/// Reads a corpus line by line. Iterating yields one [`CorpusItem`] per non-blank line; an
/// `Err` is an I/O failure of the reader and ends the pass.
pub struct CorpusReader<R> {
    reader: R,
    options: CorpusOptions,
    line: u64,
    buffer: Vec<u8>,
    /// 128-bit digest of each taken id → the line that took it.
    seen: HashMap<[u8; 16], u64>,
    summary: CorpusSummary,
    failed: bool,
}

/// One raw line, as [`read_capped_line`] found it.
enum RawLine {
    Eof,
    /// In the buffer, without the newline.
    Line,
    /// Longer than the cap; consumed but not kept.
    TooLong {
        len: u64,
    },
}

/// Reads up to the next `\n` into `buffer`, keeping at most `cap` bytes: a longer line is
/// consumed to its end without growing the buffer.
fn read_capped_line<R: BufRead>(reader: &mut R, buffer: &mut Vec<u8>, cap: usize) -> io::Result<RawLine> {
    buffer.clear();
    let mut len: u64 = 0;
    let mut consumed_any = false;
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            if !consumed_any {
                return Ok(RawLine::Eof);
            }
            break;
        }
        consumed_any = true;
        let newline = available.iter().position(|&b| b == b'\n');
        let part = &available[..newline.unwrap_or(available.len())];
        len += part.len() as u64;
        if !too_long {
            if buffer.len() + part.len() > cap {
                too_long = true;
                buffer.clear();
            } else {
                buffer.extend_from_slice(part);
            }
        }
        let used = newline.map_or(part.len(), |at| at + 1);
        reader.consume(used);
        if newline.is_some() {
            break;
        }
    }
    if too_long {
        return Ok(RawLine::TooLong { len });
    }
    if buffer.last() == Some(&b'\r') {
        buffer.pop();
    }
    Ok(RawLine::Line)
}

impl<R: BufRead> CorpusReader<R> {
    pub fn new(reader: R, options: CorpusOptions) -> Self {
        Self {
            reader,
            options,
            line: 0,
            buffer: Vec::new(),
            seen: HashMap::new(),
            summary: CorpusSummary::default(),
            failed: false,
        }
    }

    /// Counts so far (complete once the iterator is exhausted).
    pub fn summary(&self) -> &CorpusSummary {
        &self.summary
    }

    /// The next non-blank line's records or error; `None` at the end of the input.
    pub fn next_item(&mut self) -> Result<Option<CorpusItem>, CorpusError> {
        loop {
            let raw = read_capped_line(&mut self.reader, &mut self.buffer, self.options.max_line_len)
                .map_err(|source| CorpusError::Io { path: None, source })?;
            self.line += 1;
            let item = match raw {
                RawLine::Eof => return Ok(None),
                RawLine::TooLong { len } => Err(LineError {
                    line: self.line,
                    id: None,
                    code: LineErrorCode::TooLarge,
                    message: format!("line of {len} bytes exceeds the limit of {} bytes", self.options.max_line_len),
                }),
                RawLine::Line => {
                    if self.line == 1 && self.buffer.starts_with(b"\xEF\xBB\xBF") {
                        self.buffer.drain(..3);
                    }
                    if self.buffer.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let buffer = std::mem::take(&mut self.buffer);
                    let parsed = self.parse_line(&buffer);
                    self.buffer = buffer;
                    parsed
                }
            };
            self.summary.lines += 1;
            return Ok(Some(match item {
                Ok(records) => {
                    self.summary.accepted_lines += 1;
                    self.summary.records += records.len() as u64;
                    CorpusItem::Records { line: self.line, records }
                }
                Err(error) => {
                    self.summary.errors += 1;
                    CorpusItem::Error(error)
                }
            }));
        }
    }

    fn error(&self, id: Option<&str>, code: LineErrorCode, message: impl Into<String>) -> LineError {
        LineError { line: self.line, id: id.map(str::to_owned), code, message: message.into() }
    }

    fn parse_line(&mut self, bytes: &[u8]) -> Result<Vec<InputRecord>, LineError> {
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                // Name the id if the rest of the line still parses, for the errors file.
                let id = serde_json::from_str::<Value>(&String::from_utf8_lossy(bytes))
                    .ok()
                    .and_then(|value| value.as_object().and_then(peek_id))
                    .filter(|id| !id.contains(char::REPLACEMENT_CHARACTER));
                return Err(self.error(
                    id.as_deref(),
                    LineErrorCode::InvalidUtf8,
                    format!("the line is not valid UTF-8 (invalid byte at offset {})", e.valid_up_to()),
                ));
            }
        };
        let value: Value = serde_json::from_str(text)
            .map_err(|e| self.error(None, LineErrorCode::InvalidJson, format!("not valid JSON: {e}")))?;
        let Value::Object(object) = value else {
            return Err(self.error(None, LineErrorCode::InvalidJson, "the line is JSON but not an object"));
        };
        let rerank = self.options.rerank.unwrap_or_else(|| match self.summary.form {
            Some(form) => form == CorpusForm::Rerank,
            None => object.contains_key("query") && object.contains_key("documents"),
        });
        if rerank {
            let (id, records) = self.parse_rerank(&object)?;
            self.take_id(&id)?;
            self.summary.form = Some(CorpusForm::Rerank);
            return Ok(records);
        }
        let shape = shape_of(&object);
        if let (Some(form), Some(shape)) = (self.summary.form, shape)
            && form != shape
        {
            return Err(self.error(
                peek_id(&object).as_deref(),
                LineErrorCode::MixedForms,
                format!("a {} line in a file of {} lines", shape.as_str(), form.as_str()),
            ));
        }
        let form = self.summary.form.or(shape).unwrap_or(CorpusForm::Plain);
        let (id, records) = match form {
            CorpusForm::Plain => self.parse_plain(&object)?,
            CorpusForm::OpenAi => self.parse_openai(&object)?,
            CorpusForm::Rerank => unreachable!("rerank lines are read above"),
        };
        self.take_id(&id)?;
        self.summary.form = Some(form);
        Ok(records)
    }

    /// Claims `id` for this line, or names the line that has it.
    fn take_id(&mut self, id: &str) -> Result<(), LineError> {
        let digest: [u8; 32] = Sha256::digest(id.as_bytes()).into();
        let key: [u8; 16] = digest[..16].try_into().unwrap_or_default();
        match self.seen.get(&key) {
            Some(&first) => Err(self.error(
                Some(id),
                LineErrorCode::DuplicateId,
                format!("id already used on line {first} (the first occurrence is embedded)"),
            )),
            None => {
                self.seen.insert(key, self.line);
                Ok(())
            }
        }
    }

    fn parse_plain(&self, object: &Map<String, Value>) -> Result<(String, Vec<InputRecord>), LineError> {
        let id = self.plain_id(object)?;
        let text = match object.get("text") {
            None | Some(Value::Null) => {
                return Err(self.error(Some(&id), LineErrorCode::MissingText, "the line has no \"text\""));
            }
            Some(Value::String(text)) => text,
            Some(other) => {
                return Err(self.error(
                    Some(&id),
                    LineErrorCode::InvalidText,
                    format!("\"text\" must be a string, not {}", kind(other)),
                ));
            }
        };
        if text.len() > MAX_TEXT_LEN {
            return Err(self.too_large(&id, "\"text\"", text.len()));
        }
        let record = InputRecord { id: id.clone(), text: text.as_bytes().to_vec() };
        Ok((id, vec![record]))
    }

    /// `{"id", "query", "documents": [ … ]}`: one record whose text is the [`RerankInput`].
    fn parse_rerank(&self, object: &Map<String, Value>) -> Result<(String, Vec<InputRecord>), LineError> {
        let id = self.plain_id(object)?;
        let invalid = |message: String| self.error(Some(&id), LineErrorCode::InvalidText, message);
        let query = match object.get("query") {
            None | Some(Value::Null) => return Err(self.error(Some(&id), LineErrorCode::MissingText, "the line has no \"query\"")),
            Some(Value::String(query)) => query.clone(),
            Some(other) => return Err(invalid(format!("\"query\" must be a string, not {}", kind(other)))),
        };
        let documents: Vec<String> = match object.get("documents") {
            None | Some(Value::Null) => return Err(self.error(Some(&id), LineErrorCode::MissingText, "the line has no \"documents\"")),
            Some(Value::Array(items)) => items
                .iter()
                .map(|d| d.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("\"documents\" must be strings".into()))?,
            Some(other) => return Err(invalid(format!("\"documents\" must be an array, not {}", kind(other)))),
        };
        if documents.is_empty() || documents.len() > MAX_RERANK_DOCUMENTS {
            return Err(invalid(format!("{} documents: 1 to {MAX_RERANK_DOCUMENTS}", documents.len())));
        }
        let text = RerankInput { query, documents }.to_text();
        if text.len() > MAX_TEXT_LEN {
            return Err(self.too_large(&id, "the query and documents", text.len()));
        }
        Ok((id.clone(), vec![InputRecord { id, text }]))
    }

    /// A plain or rerank line's `"id"`: a string or an integer, 1..=[`MAX_ID_LEN`] bytes.
    fn plain_id(&self, object: &Map<String, Value>) -> Result<String, LineError> {
        let id = match object.get("id") {
            None | Some(Value::Null) => {
                return Err(self.error(None, LineErrorCode::MissingId, "the line has no \"id\""));
            }
            Some(value) => id_text(value)
                .ok_or_else(|| self.error(None, LineErrorCode::MissingId, "\"id\" must be a string or an integer"))?,
        };
        if id.is_empty() {
            return Err(self.error(None, LineErrorCode::MissingId, "\"id\" is empty"));
        }
        if id.len() > MAX_ID_LEN {
            return Err(self.id_too_long(&id, MAX_ID_LEN));
        }
        Ok(id)
    }

    fn parse_openai(&self, object: &Map<String, Value>) -> Result<(String, Vec<InputRecord>), LineError> {
        let custom_id = match object.get("custom_id") {
            None | Some(Value::Null) => {
                return Err(self.error(None, LineErrorCode::MissingId, "the line has no \"custom_id\""));
            }
            Some(Value::String(id)) if id.is_empty() => {
                return Err(self.error(None, LineErrorCode::MissingId, "\"custom_id\" is empty"));
            }
            Some(Value::String(id)) => id.as_str(),
            Some(_) => return Err(self.error(None, LineErrorCode::MissingId, "\"custom_id\" must be a string")),
        };
        let id = Some(custom_id);
        let unsupported = |message: String| self.error(id, LineErrorCode::UnsupportedRequest, message);
        match object.get("method") {
            Some(Value::String(method)) if method == "POST" => {}
            other => return Err(unsupported(format!("\"method\" must be \"POST\", not {}", shown(other)))),
        }
        match object.get("url") {
            Some(Value::String(url)) if url == OPENAI_EMBEDDINGS_URL => {}
            other => {
                return Err(unsupported(format!("\"url\" must be \"{OPENAI_EMBEDDINGS_URL}\", not {}", shown(other))));
            }
        }
        let body = match object.get("body") {
            None | Some(Value::Null) => {
                return Err(self.error(id, LineErrorCode::MissingText, "the request has no \"body\""));
            }
            Some(Value::Object(body)) => body,
            Some(other) => return Err(unsupported(format!("\"body\" must be an object, not {}", kind(other)))),
        };
        match body.get("model") {
            None | Some(Value::Null) => {}
            Some(Value::String(model)) if self.options.accepts_model(model) => {}
            Some(Value::String(model)) => {
                return Err(self.error(
                    id,
                    LineErrorCode::ModelMismatch,
                    format!("the request names model {model:?}, the job embeds with {:?}", self.options.model_id),
                ));
            }
            Some(other) => return Err(unsupported(format!("\"body.model\" must be a string, not {}", kind(other)))),
        }
        match body.get("encoding_format") {
            None | Some(Value::Null) => {}
            Some(Value::String(format)) if format == "float" => {}
            other => {
                return Err(unsupported(format!(
                    "\"body.encoding_format\" {} is not supported (only \"float\")",
                    shown(other)
                )));
            }
        }
        match (body.get("dimensions"), self.options.dimensions) {
            (None | Some(Value::Null), _) => {}
            (Some(Value::Number(n)), Some(dims)) if n.as_u64() == Some(u64::from(dims)) => {}
            (Some(other), _) => {
                return Err(unsupported(format!(
                    "\"body.dimensions\" {other} is not this job's length (one per job: submit --dimensions N)"
                )));
            }
        }
        let texts: Vec<&str> = match body.get("input") {
            None | Some(Value::Null) => {
                return Err(self.error(id, LineErrorCode::MissingText, "the request has no \"body.input\""));
            }
            Some(Value::String(text)) => vec![text.as_str()],
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(self.error(id, LineErrorCode::MissingText, "\"body.input\" is an empty array"));
            }
            Some(Value::Array(items)) => {
                let mut texts = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    match item {
                        Value::String(text) => texts.push(text.as_str()),
                        Value::Number(_) | Value::Array(_) => {
                            return Err(unsupported(format!(
                                "\"body.input\" holds token ids (at index {index}); only strings are supported"
                            )));
                        }
                        other => {
                            return Err(self.error(
                                id,
                                LineErrorCode::InvalidText,
                                format!("\"body.input[{index}]\" must be a string, not {}", kind(other)),
                            ));
                        }
                    }
                }
                texts
            }
            Some(other) => {
                return Err(self.error(
                    id,
                    LineErrorCode::InvalidText,
                    format!("\"body.input\" must be a string or an array of strings, not {}", kind(other)),
                ));
            }
        };
        if let Some((index, text)) = texts.iter().enumerate().find(|(_, t)| t.len() > MAX_TEXT_LEN) {
            return Err(self.too_large(custom_id, &format!("\"body.input[{index}]\""), text.len()));
        }
        let longest = openai_record_id(custom_id, texts.len() - 1);
        if longest.len() > MAX_ID_LEN {
            // The record ids append "#<index>" to the custom_id.
            return Err(self.id_too_long(custom_id, MAX_ID_LEN - (longest.len() - custom_id.len())));
        }
        let records = texts
            .iter()
            .enumerate()
            .map(|(index, text)| InputRecord { id: openai_record_id(custom_id, index), text: text.as_bytes().to_vec() })
            .collect();
        Ok((custom_id.to_owned(), records))
    }

    fn too_large(&self, id: &str, what: &str, len: usize) -> LineError {
        self.error(
            Some(id),
            LineErrorCode::TooLarge,
            format!("{what} of {len} bytes exceeds the limit of {MAX_TEXT_LEN} bytes"),
        )
    }

    /// The id is left out of the error (it may be huge); the message shows its start.
    fn id_too_long(&self, id: &str, limit: usize) -> LineError {
        let start: String = id.chars().take(40).collect();
        self.error(
            None,
            LineErrorCode::IdTooLong,
            format!("id {start:?}… of {} bytes exceeds the limit of {limit} bytes", id.len()),
        )
    }
}

impl<R: BufRead> Iterator for CorpusReader<R> {
    type Item = Result<CorpusItem, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_item().transpose();
        self.failed = matches!(item, Some(Err(_)));
        item
    }
}

/// Which form a line's fields point to; `None` when they point to neither.
fn shape_of(object: &Map<String, Value>) -> Option<CorpusForm> {
    if ["custom_id", "method", "url", "body"].iter().any(|k| object.contains_key(*k)) {
        Some(CorpusForm::OpenAi)
    } else if ["id", "text"].iter().any(|k| object.contains_key(*k)) {
        Some(CorpusForm::Plain)
    } else {
        None
    }
}

/// The line's id in either form, if it has a usable one (for error reports only).
fn peek_id(object: &Map<String, Value>) -> Option<String> {
    let id = match object.get("custom_id") {
        Some(Value::String(id)) => id.clone(),
        _ => id_text(object.get("id")?)?,
    };
    (!id.is_empty() && id.len() <= MAX_ID_LEN).then_some(id)
}

/// A plain id: a string as is, an integer as its decimal string.
fn id_text(value: &Value) -> Option<String> {
    match value {
        Value::String(id) => Some(id.clone()),
        Value::Number(n) => n.as_u64().map(|v| v.to_string()).or_else(|| n.as_i64().map(|v| v.to_string())),
        _ => None,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short rendering of a field's value for a message.
fn shown(value: Option<&Value>) -> String {
    match value {
        None => "absent".into(),
        Some(Value::String(s)) => format!("{:?}", s.chars().take(60).collect::<String>()),
        Some(other) => kind(other).into(),
    }
}

/// A first pass over a corpus file: counts what a sealing pass with the same options will
/// yield, so the sealed header can state the record count before the records.
pub fn count_records(path: &Path, options: &CorpusOptions) -> Result<CorpusSummary, CorpusError> {
    let io_error = |source| CorpusError::Io { path: Some(path.display().to_string()), source };
    let file = File::open(path).map_err(io_error)?;
    let mut reader = CorpusReader::new(BufReader::with_capacity(1 << 20, file), options.clone());
    while reader.next_item().map_err(|CorpusError::Io { source, .. }| io_error(source))?.is_some() {}
    Ok(reader.summary)
}

#[cfg(test)]
mod tests;
