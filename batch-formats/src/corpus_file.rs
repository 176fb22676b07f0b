//! The checks a corpus file passes before anything leaves the machine (`ephem-batch submit`,
//! the Python SDK's `submit`): it exists, is a regular file this process can read to its end,
//! and yields at least one record. Every line is checked on the way, as sealing will check it.
//! Each failure is one sentence naming the file and what is wrong with it; the operating
//! system's reason, when there is one, appears once.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use crate::corpus::{CorpusError, CorpusItem, CorpusOptions, CorpusReader, CorpusSummary, LineError};

/// Why a file cannot be submitted as a corpus.
#[derive(Debug, thiserror::Error)]
pub enum CorpusFileError {
    #[error("{}: no such file", .0.display())]
    Missing(PathBuf),
    #[error("{} is a directory, not a corpus file", .0.display())]
    Directory(PathBuf),
    #[error("{} is not a regular file (a corpus is a file of JSON lines)", .0.display())]
    NotRegular(PathBuf),
    /// Opening or reading it failed; `reason` is the operating system's, said once (it is not
    /// an error source: a chain would print it twice).
    #[error("{} cannot be read: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: io::Error },
    #[error("{} is empty: a corpus needs at least one record, nothing was submitted", .0.display())]
    Empty(PathBuf),
    #[error("{} holds no record: all {lines} of its lines were refused, nothing was submitted (first: {first})", path.display())]
    NoRecords { path: PathBuf, lines: u64, first: LineError },
}

impl CorpusFileError {
    /// The file the check failed on.
    pub fn path(&self) -> &Path {
        match self {
            Self::Missing(p) | Self::Directory(p) | Self::NotRegular(p) | Self::Empty(p) => p,
            Self::Unreadable { path, .. } | Self::NoRecords { path, .. } => path,
        }
    }
}

/// Reads `path` through, as a sealing pass with `options` will, and says whether it can be a
/// corpus: what the pass counted, or the first check it fails. Lines refused here are not an
/// error as long as some line yields records: they stay on this machine, in the job's local
/// errors file.
pub fn check_corpus_file(path: &Path, options: &CorpusOptions) -> Result<CorpusSummary, CorpusFileError> {
    let owned = || path.to_path_buf();
    let unreadable = |reason: io::Error| CorpusFileError::Unreadable { path: owned(), reason };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(CorpusFileError::Missing(owned())),
        Err(e) => return Err(unreadable(e)),
    };
    if meta.is_dir() {
        return Err(CorpusFileError::Directory(owned()));
    }
    if !meta.is_file() {
        return Err(CorpusFileError::NotRegular(owned()));
    }
    let file = File::open(path).map_err(unreadable)?;
    let mut reader = CorpusReader::new(BufReader::with_capacity(1 << 20, file), options.clone());
    let mut first_refused = None;
    loop {
        match reader.next_item() {
            Ok(None) => break,
            Ok(Some(CorpusItem::Error(error))) => {
                first_refused.get_or_insert(error);
            }
            Ok(Some(CorpusItem::Records { .. })) => {}
            Err(CorpusError::Io { source, .. }) => return Err(unreadable(source)),
        }
    }
    let summary = reader.summary().clone();
    match (summary.records, first_refused) {
        (0, None) => Err(CorpusFileError::Empty(owned())),
        (0, Some(first)) => Err(CorpusFileError::NoRecords { path: owned(), lines: summary.errors, first }),
        _ => Ok(summary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(path: &Path) -> Result<CorpusSummary, CorpusFileError> {
        check_corpus_file(path, &CorpusOptions::new("sentence-transformers/all-MiniLM-L6-v2"))
    }

    fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_corpus_with_records_passes_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(&dir, "c.jsonl", "{\"id\": 1, \"text\": \"a\"}\nnot json\n{\"id\": 2, \"text\": \"b\"}\n");
        let summary = check(&path).unwrap();
        assert_eq!((summary.records, summary.errors), (2, 1));
    }

    #[test]
    fn each_unusable_file_is_refused_by_name_in_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (dir.path().join("missing.jsonl"), "missing.jsonl: no such file"),
            (dir.path().to_path_buf(), "is a directory, not a corpus file"),
            (file(&dir, "empty.jsonl", ""), "empty.jsonl is empty: a corpus needs at least one record"),
            (file(&dir, "blank.jsonl", "\n  \n"), "blank.jsonl is empty"),
            (PathBuf::from("/dev/null"), "/dev/null is not a regular file"),
        ];
        for (path, want) in cases {
            let error = check(&path).unwrap_err();
            assert_eq!(error.path(), path);
            let text = error.to_string();
            assert!(text.contains(want), "{text:?} does not say {want:?}");
            assert!(!text.contains('\n'), "{text:?}");
            assert!(std::error::Error::source(&error).is_none(), "a chain would repeat the cause: {error:?}");
        }
    }

    #[test]
    fn a_corpus_whose_every_line_is_refused_names_the_first_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(&dir, "bad.jsonl", "{\"text\": \"no id\"}\nnot json\n");
        let error = check(&path).unwrap_err();
        assert!(matches!(&error, CorpusFileError::NoRecords { lines: 2, first, .. } if first.line == 1), "{error:?}");
        assert!(error.to_string().contains("all 2 of its lines were refused"), "{error}");
    }

    /// A regular file whose read fails (for any user, root included): reading a process's own
    /// memory at address 0.
    #[test]
    fn a_file_that_cannot_be_read_gives_the_system_s_reason_once() {
        let path = Path::new("/proc/self/mem");
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            eprintln!("skipped: {} is not a regular file here", path.display());
            return;
        }
        let error = check(path).unwrap_err();
        assert!(matches!(error, CorpusFileError::Unreadable { .. }), "{error:?}");
        let text = error.to_string();
        assert!(text.starts_with("/proc/self/mem cannot be read: "), "{text}");
        assert_eq!(text.matches("os error").count(), 1, "{text}");
    }
}
