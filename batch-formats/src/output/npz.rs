//! The npz format: a sparse or multi-vector job's results as NumPy arrays in one zip archive,
//! row `i` belonging to line `i` of the ids file.
//!
//! * **sparse** — the arrays `scipy.sparse.save_npz` writes for a CSR matrix, so
//!   `scipy.sparse.load_npz` reads the file: `data` (`<f4`, the weights), `indices` (`<i4`, the
//!   vocabulary index of each weight, ascending within a row), `indptr` (`<i8`, rows + 1: row
//!   `i`'s weights are `data[indptr[i]:indptr[i+1]]`), `format` (`b"csr"`) and `shape` (`<i8`,
//!   rows and the vocabulary's size).
//! * **multi-vector** — `vectors` (`<f4`, every record's token vectors one after the other,
//!   shape `(all vectors, dimensions)`) and `indptr` (`<i8`, rows + 1: row `i`'s vectors are
//!   `vectors[indptr[i]:indptr[i+1]]`).
//!
//! The values stream to scratch files beside the output while the records arrive, and
//! [`NpzSink::finish`] copies them into the archive (stored, not compressed: the weights of
//! random-looking floats hardly compress), so memory stays at one record.

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};

use protocol::records::{MultiVector, SparseVector};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use super::{OutputError, PartFile};

/// What the archive holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Sparse,
    Multi,
}

/// An npz output being written: the archive's file, the scratch files of its long arrays, and the
/// row offsets so far.
pub(super) struct NpzSink {
    output: PartFile,
    layout: Option<Layout>,
    /// `data` (sparse) or `vectors` (multi-vector) values, little-endian f32.
    values: PartFile,
    /// `indices`, little-endian i32 (sparse only).
    indices: PartFile,
    /// `indptr`, little-endian i64; starts with its first 0.
    indptr: PartFile,
    /// Values (sparse) or vectors (multi-vector) written so far.
    stored: u64,
    rows: u64,
}

impl NpzSink {
    pub(super) fn create(output: PartFile) -> Result<Self, OutputError> {
        let scratch = |suffix: &str| PartFile::create(&with_suffix(&output.path, suffix));
        let values = scratch(".values")?;
        let indices = scratch(".indices").inspect_err(|_| remove(&values))?;
        let mut indptr = scratch(".indptr").inspect_err(|_| [&values, &indices].into_iter().for_each(remove))?;
        indptr.write_all(&0i64.to_le_bytes())?;
        Ok(Self { output, layout: None, values, indices, indptr, stored: 0, rows: 0 })
    }

    /// Every partial file, for the writer's clean-up.
    pub(super) fn partials(&self) -> Vec<PathBuf> {
        [&self.output, &self.values, &self.indices, &self.indptr].iter().map(|f| f.partial.clone()).collect()
    }

    pub(super) fn sparse(&mut self, sparse: &SparseVector) -> Result<(), OutputError> {
        self.layout = Some(Layout::Sparse);
        for (&index, &weight) in sparse.indices.iter().zip(&sparse.values) {
            // Indices are below the vocabulary's size, at most 2^20 (protocol::records).
            self.indices.write_all(&(index as i32).to_le_bytes())?;
            self.values.write_all(&weight.to_le_bytes())?;
        }
        self.end_row(sparse.indices.len() as u64)
    }

    pub(super) fn multi(&mut self, multi: &MultiVector) -> Result<(), OutputError> {
        self.layout = Some(Layout::Multi);
        for value in &multi.values {
            self.values.write_all(&value.to_le_bytes())?;
        }
        self.end_row(multi.count() as u64)
    }

    fn end_row(&mut self, stored: u64) -> Result<(), OutputError> {
        self.stored += stored;
        self.rows += 1;
        self.indptr.write_all(&(self.stored as i64).to_le_bytes())
    }

    /// Writes the archive into the output's partial file and removes the scratch files; returns
    /// the output's (partial, final) paths for the writer to rename. A job with no record at all
    /// has no kind to tell: its archive is the sparse one with zero rows.
    pub(super) fn finish(self, dimensions: usize) -> Result<(PathBuf, PathBuf), OutputError> {
        let Self { output, layout, values, indices, indptr, stored, rows } = self;
        let (partial, path) = output.close(None)?;
        let io = |source: io::Error| OutputError::Io { path: partial.clone(), source };
        let zip_error = |e: zip::result::ZipError| io(io::Error::other(e));
        let scratch: Vec<PathBuf> = [values, indices, indptr].into_iter().map(|f| f.close(None).map(|(p, _)| p)).collect::<Result<_, _>>()?;
        let file = std::fs::OpenOptions::new().write(true).truncate(true).open(&partial).map_err(io)?;
        let mut zip = ZipWriter::new(io::BufWriter::new(file));
        let mut entry = |name: &str, preamble: Vec<u8>, body: Option<&Path>| -> Result<(), OutputError> {
            let body_len = match body {
                Some(path) => std::fs::metadata(path).map_err(io)?.len(),
                None => 0,
            };
            let large = preamble.len() as u64 + body_len >= u64::from(u32::MAX);
            let options = SimpleFileOptions::default().compression_method(CompressionMethod::Stored).large_file(large);
            zip.start_file(name, options).map_err(zip_error)?;
            zip.write_all(&preamble).map_err(io)?;
            if let Some(path) = body {
                let mut reader = BufReader::new(File::open(path).map_err(io)?);
                io::copy(&mut reader, &mut zip).map_err(io)?;
            }
            Ok(())
        };
        let [values, indices, indptr] = &scratch[..] else { unreachable!("three scratch files") };
        let indptr_header = npy_preamble("<i8", &[rows + 1]);
        let result = match layout.unwrap_or(Layout::Sparse) {
            Layout::Sparse => (|| {
                entry("indices.npy", npy_preamble("<i4", &[stored]), Some(indices))?;
                entry("indptr.npy", indptr_header, Some(indptr))?;
                let mut format = npy_preamble("|S3", &[]);
                format.extend_from_slice(b"csr");
                entry("format.npy", format, None)?;
                let mut shape = npy_preamble("<i8", &[2]);
                shape.extend((rows as i64).to_le_bytes().into_iter().chain((dimensions as i64).to_le_bytes()));
                entry("shape.npy", shape, None)?;
                entry("data.npy", npy_preamble("<f4", &[stored]), Some(values))
            })(),
            Layout::Multi => (|| {
                entry("vectors.npy", npy_preamble("<f4", &[stored, dimensions as u64]), Some(values))?;
                entry("indptr.npy", indptr_header, Some(indptr))
            })(),
        };
        for path in &scratch {
            let _ = std::fs::remove_file(path);
        }
        result?;
        let file = zip.finish().map_err(zip_error)?.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok((partial, path))
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn remove(file: &PartFile) {
    let _ = std::fs::remove_file(&file.partial);
}

/// A NumPy format 1.0 preamble for a C-order array of `descr` elements and `shape`, padded with
/// spaces to a multiple of 64 bytes as the format asks.
fn npy_preamble(descr: &str, shape: &[u64]) -> Vec<u8> {
    let shape = match shape {
        [] => "()".to_owned(),
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let len = (10 + dict.len() + 1).next_multiple_of(64);
    let mut preamble = Vec::with_capacity(len);
    preamble.extend_from_slice(b"\x93NUMPY\x01\x00");
    preamble.extend_from_slice(&((len - 10) as u16).to_le_bytes());
    preamble.extend_from_slice(dict.as_bytes());
    preamble.resize(len - 1, b' ');
    preamble.push(b'\n');
    preamble
}

#[cfg(test)]
mod tests {
    use super::npy_preamble;

    #[test]
    fn preambles_are_padded_to_64_bytes_and_name_the_shape() {
        for (descr, shape, text) in [("|S3", &[][..], "()"), ("<i8", &[5][..], "(5,)"), ("<f4", &[3, 16][..], "(3, 16)")] {
            let preamble = npy_preamble(descr, shape);
            assert_eq!(preamble.len() % 64, 0);
            assert_eq!(&preamble[..8], b"\x93NUMPY\x01\x00");
            assert_eq!(usize::from(u16::from_le_bytes([preamble[8], preamble[9]])), preamble.len() - 10);
            let dict = std::str::from_utf8(&preamble[10..]).unwrap();
            assert!(dict.starts_with(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {text}, }}")), "{dict}");
            assert!(dict.ends_with('\n'));
        }
    }
}
