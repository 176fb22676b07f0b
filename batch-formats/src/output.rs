//! Writing a job's results as the client opens them: the records arrive in input order, one
//! [`OutputRecord`] per sealed input record, and are written as they come (constant memory,
//! but for the strings of one OpenAI request line).
//!
//! Files, for an output path `OUT` = `dir/<stem>.<ext>`:
//!
//! ```text
//! OUT                          the embeddings, in the chosen format
//! dir/<stem>.errors.jsonl      every record or line that has no embedding, always created
//! dir/<stem>.ids.jsonl         (npy only) row i's id, one JSON string per line
//! ```
//!
//! (`vectors.npy` → `vectors.errors.jsonl`, `vectors.ids.jsonl`; `out` → `out.errors.jsonl`.)
//! Each file is written as `<name>.partial` and renamed into place by
//! [`OutputWriter::finish`], so a file under its final name is complete; an unfinished writer
//! removes its partial files when dropped.
//!
//! Formats:
//!
//! * **jsonl** — `{"id": …, "embedding": [f32, …], "tokens": n}` per embedded record; a sparse
//!   job's as `{"id": …, "sparse": {"<index>": weight, …}, "tokens": n}` (index: the token id of
//!   a SPLADE model's vocabulary, ascending); a rerank job's as `{"id": …, "scores": [f32, …],
//!   "tokens": n}`, a score per document in the line's order, tokens those of every pair; a
//!   multi-vector job's as `{"id": …, "vectors": [[f32, …], …], "tokens": n}`, a vector per kept
//!   token in the text's order.
//! * **openai** — OpenAI Batch output lines, one per request line (the records' ids are
//!   [`openai_record_id`](crate::corpus::openai_record_id)s, regrouped by custom_id):
//!   `{"id": "batch_req_…", "custom_id", "response": {"status_code": 200, "request_id": "req_…",
//!   "body": {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": […]}],
//!   "model", "usage": {"prompt_tokens", "total_tokens"}}}, "error": null}`. The `batch_req_` and
//!   `req_` ids are derived from the job id and the custom_id, so writing the same results again
//!   gives the same bytes.
//! * **npy** — NumPy format 1.0, `<f4` (`|i1` for int8 and binary, `|u1` for uint8 and
//!   ubinary output), C order, shape `(rows, elements)`; the header is
//!   written with a placeholder shape and fixed up at the end (it has a fixed size, 128 bytes),
//!   so the matrix streams to disk. Row `i` belongs to line `i` of the ids file.
//!
//! Vectors sent as f16 are widened to f32 in every format; the compact encodings (int8, uint8,
//! binary, ubinary: docs/protocol.md §2.2) are written as integers, as the enclave computed them
//! (binary and ubinary: the packed bytes).
//!
//! The errors file, in the jsonl and npy formats, has one `{"id", "code", "message"}` line per
//! failed record, plus `"line"` (1-based line of the corpus) for the lines refused locally at
//! submission ([`LineError`]s; their `id` is null when the line had none). In the openai format
//! it has OpenAI's shape for a failed request: `{"id": "batch_req_…", "custom_id", "response":
//! {"status_code": 400, "request_id": "req_…", "body": {"error": {"message", "type":
//! "invalid_request_error", "param", "code"}}}, "error": null}`, one line per request line with
//! any failed string (`code` is the first failure's, `message` names every failed index), plus
//! `"line"` for local errors. Lines appear in the order they were given to the writer.

use std::borrow::Cow;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use protocol::envelope::{JobId, OutputDtype, OutputKind};
use protocol::records::{ErrorCode, MultiVector, OutputRecord, SparseVector, Vector};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::corpus::{LineError, parse_openai_record_id};

mod npz;
use npz::NpzSink;

/// How the embeddings are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Jsonl,
    OpenAi,
    Npy,
    Npz,
}

impl OutputFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::Jsonl => "jsonl",
            OutputFormat::OpenAi => "openai",
            OutputFormat::Npy => "npy",
            OutputFormat::Npz => "npz",
        }
    }

    /// Whether the format writes records of `kind`: jsonl every kind; openai and npy dense
    /// vectors; npz sparse and multi-vector records.
    pub fn writes(self, kind: OutputKind) -> bool {
        match self {
            OutputFormat::Jsonl => true,
            OutputFormat::OpenAi | OutputFormat::Npy => kind == OutputKind::Dense,
            OutputFormat::Npz => matches!(kind, OutputKind::Sparse | OutputKind::MultiVector),
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "jsonl" => Some(OutputFormat::Jsonl),
            "openai" => Some(OutputFormat::OpenAi),
            "npy" => Some(OutputFormat::Npy),
            "npz" => Some(OutputFormat::Npz),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    // The cause is the source: a chain printer (`{:#}`) shows it once, after the path.
    #[error("writing {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("output path {} does not name a file", .0.display())]
    NoFileName(PathBuf),
    #[error("record {id:?} has {found} dimensions, the others {expected}")]
    Dimensions { id: String, expected: usize, found: usize },
    #[error("record {id:?} is {found}, the records before it {expected}")]
    Dtype { id: String, expected: &'static str, found: &'static str },
    #[error("record {id:?} holds {kind} output, which the {format} format does not write (dense vectors: jsonl, openai, npy; sparse and multivector: jsonl, npz; scores: jsonl)")]
    KindIn { id: String, kind: &'static str, format: &'static str },
    #[error("record id {id:?} is not <custom_id>#<index>: the openai format needs a corpus of OpenAI request lines")]
    NotOpenAiId { id: String },
    #[error("the strings of request {custom_id:?} arrive out of order: expected index {expected}, got {found}")]
    OpenAiOrder { custom_id: String, expected: usize, found: usize },
}

/// Where a writer puts its files (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPaths {
    pub output: PathBuf,
    pub errors: PathBuf,
    /// The npy and npz formats' ids file.
    pub ids: Option<PathBuf>,
}

impl OutputPaths {
    pub fn new(output: &Path, format: OutputFormat) -> Result<Self, OutputError> {
        let stem = output.file_stem().ok_or_else(|| OutputError::NoFileName(output.to_owned()))?;
        let beside = |suffix: &str| {
            let mut name = OsString::from(stem);
            name.push(suffix);
            output.with_file_name(name)
        };
        // The derived names add a suffix to the stem, so they never equal the output's name.
        Ok(Self {
            output: output.to_owned(),
            errors: beside(".errors.jsonl"),
            ids: matches!(format, OutputFormat::Npy | OutputFormat::Npz).then(|| beside(".ids.jsonl")),
        })
    }

    /// Every file the writer produces.
    pub fn all(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.output, &self.errors].into_iter().chain(self.ids.as_ref())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputOptions {
    pub format: OutputFormat,
    /// Named in OpenAI output lines (`model`).
    pub model_id: String,
    /// Whose results these are; seeds the OpenAI `batch_req_`/`req_` ids.
    pub results_of: ResultsOf,
    /// The model's dimensions, if known; otherwise the first vector sets them. Every vector
    /// must have them (but scores: one per document of each record).
    pub dimensions: Option<usize>,
    /// What the records hold: vectors, sparse weights or a cross-encoder's scores.
    pub kind: OutputKind,
}

/// Whose results a writer writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultsOf {
    /// One job's.
    Job(JobId),
    /// A bulk run's, every shard's in one file: named by its bulk id.
    Bulk(String),
}

impl ResultsOf {
    /// The text the derived ids hash: the job id in hex, or the bulk id.
    fn seed(&self) -> Cow<'_, str> {
        match self {
            ResultsOf::Job(job) => Cow::Owned(job.to_hex()),
            ResultsOf::Bulk(bulk_id) => Cow::Borrowed(bulk_id),
        }
    }
}

/// What a writer wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OutputSummary {
    /// Embeddings written to the output (rows, for npy).
    pub records: u64,
    /// Lines of the errors file.
    pub errors: u64,
    /// Records the enclave reported as failed.
    pub failed_records: u64,
    /// Lines refused locally at submission.
    pub local_errors: u64,
    /// Records received (embeddings and failures).
    pub received: u64,
    /// Tokens of every embedding received (including those of an OpenAI request line that went
    /// to the errors file because another of its strings failed).
    pub tokens: u64,
    pub dimensions: Option<usize>,
    /// The element type of the vectors written (all of a job's have one).
    #[serde(serialize_with = "dtype_name", skip_serializing_if = "Option::is_none")]
    pub dtype: Option<OutputDtype>,
}

fn dtype_name<S: serde::Serializer>(dtype: &Option<OutputDtype>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(dtype.map_or("f32", OutputDtype::as_str))
}

/// A new file at `path`, never one reached through a link: a leftover is removed (the link itself,
/// not its target) and the file is created exclusively, so a name planted in between fails.
fn create_fresh(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(path)
}

/// One file being written under `<name>.partial`.
struct PartFile {
    path: PathBuf,
    partial: PathBuf,
    out: BufWriter<File>,
}

impl PartFile {
    fn create(path: &Path) -> Result<Self, OutputError> {
        let mut name = path.as_os_str().to_owned();
        name.push(".partial");
        let partial = PathBuf::from(name);
        let file = create_fresh(&partial).map_err(|source| OutputError::Io { path: partial.clone(), source })?;
        Ok(Self { path: path.to_owned(), partial, out: BufWriter::with_capacity(1 << 16, file) })
    }

    fn io(&self, source: io::Error) -> OutputError {
        OutputError::Io { path: self.partial.clone(), source }
    }

    fn write_json(&mut self, value: &impl Serialize) -> Result<(), OutputError> {
        serde_json::to_writer(&mut self.out, value).map_err(|e| self.io(e.into()))?;
        self.out.write_all(b"\n").map_err(|e| self.io(e))
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), OutputError> {
        self.out.write_all(bytes).map_err(|e| self.io(e))
    }

    /// Flushes and syncs; `header` (if any) overwrites the file's first bytes.
    fn close(self, header: Option<&[u8]>) -> Result<(PathBuf, PathBuf), OutputError> {
        let partial = self.partial.clone();
        let io = |source| OutputError::Io { path: partial.clone(), source };
        let mut file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        if let Some(header) = header {
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.write_all(header).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        Ok((self.partial, self.path))
    }
}

enum Sink {
    Jsonl(PartFile),
    OpenAi { out: PartFile, group: Option<Group> },
    Npy { data: PartFile, ids: PartFile },
    Npz { archive: NpzSink, ids: PartFile },
}

/// The strings of one OpenAI request line seen so far.
struct Group {
    custom_id: String,
    /// Strings seen: the index the next one must have.
    strings: usize,
    embeddings: Vec<Values<'static>>,
    /// (index, code, message) of each failed string.
    failures: Vec<(usize, ErrorCode, String)>,
    tokens: u64,
}

/// Writes results; see the module docs for the files and formats.
pub struct OutputWriter {
    paths: OutputPaths,
    options: OutputOptions,
    sink: Option<Sink>,
    errors: Option<PartFile>,
    summary: OutputSummary,
}

impl OutputWriter {
    /// Creates the partial files (and the output's directory).
    pub fn create(output: &Path, options: OutputOptions) -> Result<Self, OutputError> {
        let paths = OutputPaths::new(output, options.format)?;
        if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| OutputError::Io { path: parent.to_owned(), source })?;
        }
        let mut writer = Self {
            summary: OutputSummary { dimensions: options.dimensions, ..OutputSummary::default() },
            paths,
            options,
            sink: None,
            errors: None,
        };
        // Fields are filled one by one so that Drop removes whatever was created if a later
        // file fails.
        writer.errors = Some(PartFile::create(&writer.paths.errors)?);
        let output = PartFile::create(&writer.paths.output);
        writer.sink = Some(match writer.options.format {
            OutputFormat::Jsonl => Sink::Jsonl(output?),
            OutputFormat::OpenAi => Sink::OpenAi { out: output?, group: None },
            OutputFormat::Npy => {
                let mut data = output?;
                // Placeholder; the real shape is written by finish().
                data.write_all(&npy_header(0, 0))?;
                let ids = match PartFile::create(writer.paths.ids.as_ref().expect("npy has an ids path")) {
                    Ok(ids) => ids,
                    Err(e) => {
                        let _ = std::fs::remove_file(&data.partial);
                        return Err(e);
                    }
                };
                Sink::Npy { data, ids }
            }
            OutputFormat::Npz => {
                let archive = NpzSink::create(output?)?;
                let ids = match PartFile::create(writer.paths.ids.as_ref().expect("npz has an ids path")) {
                    Ok(ids) => ids,
                    Err(e) => {
                        archive.partials().iter().for_each(|p| drop(std::fs::remove_file(p)));
                        return Err(e);
                    }
                };
                Sink::Npz { archive, ids }
            }
        });
        Ok(writer)
    }

    pub fn paths(&self) -> &OutputPaths {
        &self.paths
    }

    /// Counts so far.
    pub fn summary(&self) -> &OutputSummary {
        &self.summary
    }

    fn errors_file(&mut self) -> &mut PartFile {
        self.errors.as_mut().expect("errors file open until finish")
    }

    /// Records a line refused at submission in the errors file.
    pub fn line_error(&mut self, error: &LineError) -> Result<(), OutputError> {
        self.summary.local_errors += 1;
        self.summary.errors += 1;
        if self.options.format == OutputFormat::OpenAi {
            let key = format!("line:{}", error.line);
            let line = OpenAiLine {
                id: derived_id("batch_req_", &self.options.results_of.seed(), &key),
                custom_id: error.id.as_deref(),
                response: OpenAiResponse {
                    status_code: 400,
                    request_id: derived_id("req_", &self.options.results_of.seed(), &key),
                    body: OpenAiBody::Error {
                        error: OpenAiError {
                            message: Cow::Borrowed(&error.message),
                            kind: "invalid_request_error",
                            param: None,
                            code: error.code.as_str(),
                        },
                    },
                },
                error: None,
                line: Some(error.line),
            };
            return self.errors_file().write_json(&line);
        }
        let line = ErrorLine {
            id: error.id.as_deref(),
            code: error.code.as_str(),
            message: &error.message,
            line: Some(error.line),
        };
        self.errors_file().write_json(&line)
    }

    /// Writes one record of the result stream.
    pub fn record(&mut self, record: &OutputRecord) -> Result<(), OutputError> {
        self.summary.received += 1;
        let vector = match record {
            OutputRecord::Embedding { id, tokens, vector } => {
                let values = Values::of(vector);
                let kind = match values {
                    Values::Sparse(_) => OutputKind::Sparse,
                    Values::Multi(_) => OutputKind::MultiVector,
                    _ => self.options.kind,
                };
                if !self.options.format.writes(kind) {
                    return Err(OutputError::KindIn { id: id.to_owned(), kind: kind.as_str(), format: self.options.format.as_str() });
                }
                self.summary.tokens += u64::from(*tokens);
                // f16 is written widened, as f32 is: only the element type written must agree.
                match self.summary.dtype {
                    Some(expected) if npy_descr(expected) != npy_descr(vector.dtype()) => {
                        return Err(OutputError::Dtype { id: id.clone(), expected: expected.as_str(), found: vector.dtype().as_str() });
                    }
                    Some(_) => {}
                    None => self.summary.dtype = Some(vector.dtype()),
                }
                match self.summary.dimensions {
                    _ if self.options.kind == OutputKind::Scores => {}
                    Some(expected) if expected != values.len() => {
                        return Err(OutputError::Dimensions { id: id.clone(), expected, found: values.len() });
                    }
                    _ => self.summary.dimensions = Some(values.len()),
                }
                Some((*tokens, values))
            }
            OutputRecord::Error { .. } => {
                self.summary.failed_records += 1;
                None
            }
        };
        let id = record.id();
        let scores = self.options.kind == OutputKind::Scores;
        match self.sink.as_mut().expect("sink open until finish") {
            Sink::Jsonl(out) => match vector {
                Some((tokens, Values::Sparse(sparse))) => {
                    out.write_json(&SparseLine { id, sparse: SparseWeights(sparse), tokens })?;
                    self.summary.records += 1;
                }
                Some((tokens, Values::Multi(multi))) => {
                    out.write_json(&MultiLine { id, vectors: Rows(multi), tokens })?;
                    self.summary.records += 1;
                }
                Some((tokens, values)) if scores => {
                    out.write_json(&ScoresLine { id, scores: &values, tokens })?;
                    self.summary.records += 1;
                }
                Some((tokens, values)) => {
                    out.write_json(&JsonlLine { id, embedding: &values, tokens })?;
                    self.summary.records += 1;
                }
                None => self.record_error(record)?,
            },
            Sink::Npy { data, ids } => match vector {
                Some((_, values)) => {
                    data.write_all(&values.to_le_bytes())?;
                    ids.write_json(&id)?;
                    self.summary.records += 1;
                }
                None => self.record_error(record)?,
            },
            Sink::Npz { archive, ids } => match vector {
                Some((_, Values::Sparse(sparse))) => {
                    archive.sparse(sparse)?;
                    ids.write_json(&id)?;
                    self.summary.records += 1;
                }
                Some((_, Values::Multi(multi))) => {
                    archive.multi(multi)?;
                    ids.write_json(&id)?;
                    self.summary.records += 1;
                }
                Some(_) => unreachable!("dense vectors and scores are refused before the npz format"),
                None => self.record_error(record)?,
            },
            Sink::OpenAi { group, .. } => {
                let (custom_id, index) =
                    parse_openai_record_id(id).ok_or_else(|| OutputError::NotOpenAiId { id: id.to_owned() })?;
                if group.as_ref().is_some_and(|g| g.custom_id != custom_id) {
                    let done = group.take();
                    self.write_group(done)?;
                }
                let Some(Sink::OpenAi { group, .. }) = self.sink.as_mut() else { unreachable!() };
                let current = group.get_or_insert_with(|| Group {
                    custom_id: custom_id.to_owned(),
                    strings: 0,
                    embeddings: Vec::new(),
                    failures: Vec::new(),
                    tokens: 0,
                });
                if index != current.strings {
                    return Err(OutputError::OpenAiOrder {
                        custom_id: custom_id.to_owned(),
                        expected: current.strings,
                        found: index,
                    });
                }
                current.strings += 1;
                match (vector, record) {
                    (Some((tokens, values)), _) => {
                        current.tokens += u64::from(tokens);
                        current.embeddings.push(values.into_owned());
                    }
                    (None, OutputRecord::Error { code, message, .. }) => {
                        current.failures.push((index, *code, message.clone()));
                    }
                    (None, OutputRecord::Embedding { .. }) => unreachable!("embeddings carry a vector"),
                }
            }
        }
        Ok(())
    }

    fn record_error(&mut self, record: &OutputRecord) -> Result<(), OutputError> {
        let OutputRecord::Error { id, code, message } = record else { return Ok(()) };
        self.summary.errors += 1;
        self.errors_file().write_json(&ErrorLine { id: Some(id), code: code.as_str(), message, line: None })
    }

    /// Writes a finished OpenAI request line: to the output if every string was embedded,
    /// else to the errors file.
    fn write_group(&mut self, group: Option<Group>) -> Result<(), OutputError> {
        let Some(group) = group else { return Ok(()) };
        let key = format!("custom_id:{}", group.custom_id);
        let seed = self.options.results_of.seed();
        let id = derived_id("batch_req_", &seed, &key);
        let request_id = derived_id("req_", &seed, &key);
        if let Some((_, first_code, _)) = group.failures.first() {
            let message = group
                .failures
                .iter()
                .map(|(index, code, message)| format!("input[{index}]: {}: {message}", code.as_str()))
                .collect::<Vec<_>>()
                .join("; ");
            let line = OpenAiLine {
                id,
                custom_id: Some(&group.custom_id),
                response: OpenAiResponse {
                    status_code: 400,
                    request_id,
                    body: OpenAiBody::Error {
                        error: OpenAiError {
                            message: Cow::Owned(message),
                            kind: "invalid_request_error",
                            param: Some("input"),
                            code: first_code.as_str(),
                        },
                    },
                },
                error: None,
                line: None,
            };
            self.summary.errors += 1;
            return self.errors_file().write_json(&line);
        }
        let data = group
            .embeddings
            .iter()
            .enumerate()
            .map(|(index, embedding)| OpenAiEmbedding { object: "embedding", index, embedding })
            .collect();
        let line = OpenAiLine {
            id,
            custom_id: Some(&group.custom_id),
            response: OpenAiResponse {
                status_code: 200,
                request_id,
                body: OpenAiBody::List {
                    object: "list",
                    data,
                    model: &self.options.model_id,
                    usage: Usage { prompt_tokens: group.tokens, total_tokens: group.tokens },
                },
            },
            error: None,
            line: None,
        };
        let Some(Sink::OpenAi { out, .. }) = self.sink.as_mut() else { unreachable!() };
        out.write_json(&line)?;
        self.summary.records += group.embeddings.len() as u64;
        Ok(())
    }

    /// Writes what is pending (the last OpenAI request line, the npy header), syncs, and renames
    /// every file into place.
    pub fn finish(mut self) -> Result<OutputSummary, OutputError> {
        if let Some(Sink::OpenAi { group, .. }) = self.sink.as_mut() {
            let last = group.take();
            self.write_group(last)?;
        }
        let errors = self.errors.take().expect("errors file open until finish");
        let sink = self.sink.take().expect("sink open until finish");
        let mut partials = vec![errors.partial.clone()];
        // The output is renamed last: once it is in place, so are the others.
        let (output, ids) = match sink {
            Sink::Jsonl(out) | Sink::OpenAi { out, .. } => (Output::File(out), None),
            Sink::Npy { data, ids } => (Output::File(data), Some(ids)),
            Sink::Npz { archive, ids } => (Output::Archive(archive), Some(ids)),
        };
        partials.extend(ids.iter().map(|f| f.partial.clone()));
        partials.extend(output.partials());
        let descr = self.summary.dtype.map_or(F32_DESCR, npy_descr);
        let header = (self.options.format == OutputFormat::Npy)
            .then(|| npy_header_of(descr, self.summary.records, self.summary.dimensions.unwrap_or(0)));
        let result = (|| {
            let mut closed = vec![errors.close(None)?];
            if let Some(ids) = ids {
                closed.push(ids.close(None)?);
            }
            closed.push(match output {
                Output::File(file) => file.close(header.as_ref().map(|h| h.as_slice()))?,
                Output::Archive(archive) => archive.finish(self.summary.dimensions.unwrap_or(0))?,
            });
            for (partial, path) in &closed {
                std::fs::rename(partial, path).map_err(|source| OutputError::Io { path: path.clone(), source })?;
            }
            Ok(())
        })();
        if result.is_err() {
            for partial in partials {
                let _ = std::fs::remove_file(partial);
            }
        }
        result.map(|()| self.summary.clone())
    }
}

impl Drop for OutputWriter {
    /// An unfinished writer leaves no partial files behind.
    fn drop(&mut self) {
        let partials: Vec<PathBuf> = self
            .errors
            .iter()
            .map(|f| f.partial.clone())
            .chain(self.sink.iter().flat_map(|sink| match sink {
                Sink::Jsonl(out) | Sink::OpenAi { out, .. } => vec![out.partial.clone()],
                Sink::Npy { data, ids } => vec![data.partial.clone(), ids.partial.clone()],
                Sink::Npz { archive, ids } => archive.partials().into_iter().chain([ids.partial.clone()]).collect(),
            }))
            .collect();
        self.errors = None;
        self.sink = None;
        for partial in partials {
            let _ = std::fs::remove_file(partial);
        }
    }
}

/// The file the results go to: written as they come, or an archive assembled at the end.
enum Output {
    File(PartFile),
    Archive(NpzSink),
}

impl Output {
    fn partials(&self) -> Vec<PathBuf> {
        match self {
            Output::File(file) => vec![file.partial.clone()],
            Output::Archive(archive) => archive.partials(),
        }
    }
}

/// A vector's elements as a format writes them: floats (f16 widened), or the compact
/// encodings' integers.
#[derive(Serialize)]
#[serde(untagged)]
enum Values<'a> {
    Float(Cow<'a, [f32]>),
    Signed(Cow<'a, [i8]>),
    Unsigned(Cow<'a, [u8]>),
    #[serde(skip)]
    Sparse(&'a SparseVector),
    #[serde(skip)]
    Multi(&'a MultiVector),
}

impl<'a> Values<'a> {
    fn of(vector: &'a Vector) -> Self {
        match vector {
            Vector::F32(values) => Values::Float(Cow::Borrowed(values)),
            Vector::F16(_) => Values::Float(Cow::Owned(vector.to_f32())),
            Vector::Int8(values) | Vector::Binary(values) => Values::Signed(Cow::Borrowed(values)),
            Vector::Uint8(values) | Vector::Ubinary(values) => Values::Unsigned(Cow::Borrowed(values)),
            Vector::Sparse(sparse) => Values::Sparse(sparse),
            Vector::Multi(multi) => Values::Multi(multi),
        }
    }

    /// The dimensions of the vector (a sparse one's too, not its nonzero count).
    fn len(&self) -> usize {
        match self {
            Values::Sparse(v) => v.dimensions as usize,
            Values::Multi(v) => usize::from(v.dimensions),
            Values::Float(v) => v.len(),
            Values::Signed(v) => v.len(),
            Values::Unsigned(v) => v.len(),
        }
    }

    fn into_owned(self) -> Values<'static> {
        match self {
            Values::Float(v) => Values::Float(Cow::Owned(v.into_owned())),
            Values::Signed(v) => Values::Signed(Cow::Owned(v.into_owned())),
            Values::Unsigned(v) => Values::Unsigned(Cow::Owned(v.into_owned())),
            Values::Sparse(_) | Values::Multi(_) => unreachable!("sparse and multi-vectors are refused before the openai format"),
        }
    }

    /// The elements as the npy data stores them (little-endian).
    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Values::Float(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Signed(v) => v.iter().map(|&x| x as u8).collect(),
            Values::Unsigned(v) => v.to_vec(),
            Values::Sparse(_) | Values::Multi(_) => unreachable!("sparse and multi-vectors are refused before the npy format"),
        }
    }
}

/// NumPy's type string for the elements of a dtype's vectors.
fn npy_descr(dtype: OutputDtype) -> &'static str {
    match dtype {
        OutputDtype::F32 | OutputDtype::F16 => F32_DESCR,
        OutputDtype::Int8 | OutputDtype::Binary => "|i1",
        OutputDtype::Uint8 | OutputDtype::Ubinary => "|u1",
    }
}

const F32_DESCR: &str = "<f4";

fn derived_id(prefix: &str, seed: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    for part in ["ephem-batch openai id", prefix, seed, key] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    format!("{prefix}{}", hex::encode(&hasher.finalize()[..16]))
}

/// Total size of the npy preamble (magic, version, length, header dict, padding).
pub const NPY_HEADER_LEN: usize = 128;

/// A NumPy format 1.0 preamble for a C-order little-endian f32 matrix, padded with spaces to
/// [`NPY_HEADER_LEN`] bytes (a multiple of 64, as the format asks) whatever the shape.
pub fn npy_header(rows: u64, columns: usize) -> [u8; NPY_HEADER_LEN] {
    npy_header_of(F32_DESCR, rows, columns)
}

/// [`npy_header`] for elements of NumPy type `descr` (`<f4`, `|i1`, `|u1`).
fn npy_header_of(descr: &str, rows: u64, columns: usize) -> [u8; NPY_HEADER_LEN] {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, {columns}), }}");
    let mut header = [b' '; NPY_HEADER_LEN];
    header[..6].copy_from_slice(b"\x93NUMPY");
    header[6..8].copy_from_slice(&[1, 0]);
    header[8..10].copy_from_slice(&((NPY_HEADER_LEN - 10) as u16).to_le_bytes());
    // The longest dict (u64::MAX rows, usize::MAX columns) is 104 bytes: it always fits.
    header[10..10 + dict.len()].copy_from_slice(dict.as_bytes());
    header[NPY_HEADER_LEN - 1] = b'\n';
    header
}

#[derive(Serialize)]
struct JsonlLine<'a> {
    id: &'a str,
    embedding: &'a Values<'a>,
    tokens: u32,
}

#[derive(Serialize)]
struct ScoresLine<'a> {
    id: &'a str,
    scores: &'a Values<'a>,
    tokens: u32,
}

#[derive(Serialize)]
struct SparseLine<'a> {
    id: &'a str,
    sparse: SparseWeights<'a>,
    tokens: u32,
}

#[derive(Serialize)]
struct MultiLine<'a> {
    id: &'a str,
    vectors: Rows<'a>,
    tokens: u32,
}

/// A multi-vector record as a JSON array of its rows.
struct Rows<'a>(&'a MultiVector);

impl Serialize for Rows<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.rows())
    }
}

/// A sparse vector as a JSON object from index to weight (the indices ascending).
struct SparseWeights<'a>(&'a SparseVector);

impl Serialize for SparseWeights<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.indices.len()))?;
        for (index, weight) in self.0.indices.iter().zip(&self.0.values) {
            map.serialize_entry(index, weight)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    id: Option<&'a str>,
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
}

#[derive(Serialize)]
struct OpenAiLine<'a> {
    id: String,
    custom_id: Option<&'a str>,
    response: OpenAiResponse<'a>,
    /// Always null: failures are HTTP-style responses.
    error: Option<()>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
}

#[derive(Serialize)]
struct OpenAiResponse<'a> {
    status_code: u16,
    request_id: String,
    body: OpenAiBody<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OpenAiBody<'a> {
    List { object: &'static str, data: Vec<OpenAiEmbedding<'a>>, model: &'a str, usage: Usage },
    Error { error: OpenAiError<'a> },
}

#[derive(Serialize)]
struct OpenAiEmbedding<'a> {
    object: &'static str,
    index: usize,
    embedding: &'a Values<'static>,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    message: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'static str>,
    code: &'static str,
}

#[cfg(test)]
mod tests;
