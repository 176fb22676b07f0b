//! The per-dimension ranges of `int8`/`uint8` output (`submit --dtype int8 --ranges FILE`):
//! read from and written to `.npy` files of shape `(2, N)` float32 (row 0 the minima, row 1 the
//! maxima), the array sentence-transformers' `quantize_embeddings(…, ranges=…)` takes, and
//! computed from a job's f32 vectors (`ephem-batch ranges EMBEDDINGS.npy -o RANGES.npy`).

use std::path::Path;

use anyhow::{Context, bail};
use batch_formats::output::npy_header;
use protocol::envelope::OutputDtype;
use protocol::quantize::Ranges;
use sha2::{Digest, Sha256};

/// Largest `.npy` read here: a (2, 8192) or (rows, 8192) f32 array of a million rows fits.
const MAX_NPY_BYTES: u64 = 64 << 30;

/// The ranges a job at `dtype` carries: read from `path` for `int8`/`uint8` (and then required,
/// one per value of the job's `dimensions`), refused for the other dtypes.
pub fn for_job(dtype: OutputDtype, path: Option<&Path>, dimensions: u32) -> anyhow::Result<Option<Ranges>> {
    match (dtype.needs_ranges(), path) {
        (false, None) => Ok(None),
        (false, Some(_)) => bail!("--ranges: only --dtype int8 and uint8 quantise by ranges, not {}", dtype.as_str()),
        (true, None) => bail!(
            "--dtype {} needs --ranges FILE: a (2, {dimensions}) float32 .npy of per-dimension minima and maxima \
             (`ephem-batch ranges` computes one from a job's f32 vectors)",
            dtype.as_str()
        ),
        (true, Some(path)) => {
            let ranges = read(path)?;
            if ranges.dimensions() != dimensions as usize {
                bail!("--ranges {}: {} dimensions, the job's vectors have {dimensions}", path.display(), ranges.dimensions());
            }
            Ok(Some(ranges))
        }
    }
}

/// Hex SHA-256 of the ranges' bytes as the job options carry them.
pub fn sha256_hex(ranges: &Ranges) -> String {
    hex::encode(Sha256::digest(ranges.to_bytes()))
}

/// Reads a `(2, N)` little-endian float32 `.npy`.
pub fn read(path: &Path) -> anyhow::Result<Ranges> {
    let (rows, columns, values) = read_f32_matrix(path)?;
    if rows != 2 {
        bail!("{}: shape ({rows}, {columns}), ranges are (2, N)", path.display());
    }
    let (min, max) = values.split_at(columns);
    Ranges::new(min.to_vec(), max.to_vec()).with_context(|| format!("{}: not ranges", path.display()))
}

/// Writes `ranges` as a `(2, N)` float32 `.npy`.
pub fn write(ranges: &Ranges, path: &Path) -> anyhow::Result<()> {
    let mut bytes = npy_header(2, ranges.dimensions()).to_vec();
    bytes.extend_from_slice(&ranges.to_bytes());
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The ranges of the rows of a `(rows, N)` float32 `.npy` (e.g. `results --format npy` of an f32
/// job): every dimension's minimum and maximum.
pub fn of_embeddings(path: &Path) -> anyhow::Result<Ranges> {
    let (rows, columns, values) = read_f32_matrix(path)?;
    if rows == 0 {
        bail!("{}: no rows to take ranges from", path.display());
    }
    Ranges::of(values.chunks_exact(columns)).with_context(|| format!("{}: not finite vectors", path.display()))
}

/// A C-order little-endian float32 2-D array: (rows, columns, values).
fn read_f32_matrix(path: &Path) -> anyhow::Result<(usize, usize, Vec<f32>)> {
    let size = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    if size > MAX_NPY_BYTES {
        bail!("{}: {size} bytes, more than an array of vectors this reads", path.display());
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bad = |why: &str| anyhow::anyhow!("{}: not a float32 .npy matrix: {why}", path.display());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("no NumPy magic"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        _ => return Err(bad("unknown format version")),
    };
    let header = bytes.get(start..start + header_len).and_then(|h| std::str::from_utf8(h).ok()).ok_or_else(|| bad("header"))?;
    let compact: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("'descr':'<f4'") || !compact.contains("'fortran_order':False") {
        return Err(bad("descr must be '<f4' in C order"));
    }
    let shape = compact.split("'shape':(").nth(1).and_then(|rest| rest.split(')').next()).ok_or_else(|| bad("no shape"))?;
    let dims: Vec<usize> = shape.split(',').filter(|d| !d.is_empty()).map(str::parse).collect::<Result<_, _>>().map_err(|_| bad("shape"))?;
    let [rows, columns] = dims[..] else { return Err(bad("not 2-D")) };
    let data = &bytes[start + header_len..];
    if columns == 0 || rows.checked_mul(columns).and_then(|n| n.checked_mul(4)) != Some(data.len()) {
        return Err(bad("data length does not match the shape"));
    }
    Ok((rows, columns, data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_through_npy_and_come_from_embeddings() {
        let dir = tempfile::tempdir().unwrap();
        let embeddings = dir.path().join("e.npy");
        let mut bytes = npy_header(3, 2).to_vec();
        for v in [0.5f32, -1.0, -0.25, 3.0, 0.0, 0.0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        std::fs::write(&embeddings, bytes).unwrap();
        let ranges = of_embeddings(&embeddings).unwrap();
        assert_eq!((ranges.min(), ranges.max()), ([-0.25, -1.0].as_slice(), [0.5, 3.0].as_slice()));
        let file = dir.path().join("r.npy");
        write(&ranges, &file).unwrap();
        assert_eq!(read(&file).unwrap(), ranges);
        // A (3, 2) array is not ranges; ranges of another length are refused for the job.
        assert!(read(&embeddings).unwrap_err().to_string().contains("shape (3, 2)"));
        let refused = for_job(OutputDtype::Int8, Some(&file), 4).unwrap_err().to_string();
        assert!(refused.contains("2 dimensions, the job's vectors have 4"), "{refused}");
        assert!(for_job(OutputDtype::Uint8, None, 2).unwrap_err().to_string().contains("needs --ranges"));
        assert!(for_job(OutputDtype::Binary, Some(&file), 2).is_err());
        assert_eq!(for_job(OutputDtype::Int8, Some(&file), 2).unwrap(), Some(ranges));
    }

    #[test]
    fn what_is_not_a_float32_matrix_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.npy");
        std::fs::write(&file, b"not numpy").unwrap();
        assert!(read(&file).unwrap_err().to_string().contains("no NumPy magic"));
        let mut short = npy_header(2, 3).to_vec();
        short.extend_from_slice(&[0; 20]);
        std::fs::write(&file, short).unwrap();
        assert!(read(&file).unwrap_err().to_string().contains("data length"));
    }
}
