//! Compact encodings of a pooled vector (docs/protocol.md §2.2), computed as sentence-transformers'
//! `quantize_embeddings` (6.x) computes them, so a tenant's index built from either is the same:
//!
//! - `int8` / `uint8`: per dimension `q = clip(floor((v − min) / step), 0, 255)` with
//!   `step = (max − min) / 255` (1 where that is 0), all in f32; `uint8` is `q`, `int8` is `q − 128`.
//!   The ranges (`min`, `max` per dimension) are the job's: the client states them in the sealed
//!   header and the receipt records them, since quantised values mean nothing without them.
//! - `binary` / `ubinary`: one bit per dimension, `v > 0`, packed eight to a byte, most significant
//!   bit first, the last byte padded with zeros (NumPy's `packbits`); `ubinary` is the bytes,
//!   `binary` each byte − 128 as a signed byte.
//!
//! `records::Vector::encode` puts a vector in the dtype a job asked for with these.

/// Most dimensions a range covers: the records' `MAX_DIMENSIONS` (checked in `envelope`).
pub const MAX_DIMENSIONS: usize = 8192;

/// Per-dimension calibration ranges of `int8`/`uint8` output.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranges {
    min: Vec<f32>,
    max: Vec<f32>,
}

// Every value is finite (checked by `new`), so `==` is an equivalence.
impl Eq for Ranges {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangesError {
    #[error("ranges of {0} bytes: two rows of 1..={MAX_DIMENSIONS} little-endian f32 (min, then max) expected")]
    Length(usize),
    #[error("{min} rows of minima and {max} of maxima")]
    Rows { min: usize, max: usize },
    #[error("dimension {0}: a range must be finite with min ≤ max")]
    Bounds(usize),
}

impl Ranges {
    pub fn new(min: Vec<f32>, max: Vec<f32>) -> Result<Self, RangesError> {
        if min.len() != max.len() || min.is_empty() || min.len() > MAX_DIMENSIONS {
            return Err(RangesError::Rows { min: min.len(), max: max.len() });
        }
        if let Some(bad) = (0..min.len()).find(|&i| !(min[i].is_finite() && max[i].is_finite() && min[i] <= max[i])) {
            return Err(RangesError::Bounds(bad));
        }
        Ok(Self { min, max })
    }

    /// The minima and maxima of every dimension over `vectors` (`quantize_embeddings`'s
    /// calibration when it is given calibration embeddings).
    pub fn of<'a>(vectors: impl IntoIterator<Item = &'a [f32]>) -> Result<Self, RangesError> {
        let mut min: Vec<f32> = Vec::new();
        let mut max: Vec<f32> = Vec::new();
        for vector in vectors {
            if min.is_empty() {
                min = vector.to_vec();
                max = vector.to_vec();
            } else if vector.len() != min.len() {
                return Err(RangesError::Rows { min: min.len(), max: vector.len() });
            }
            for (i, &v) in vector.iter().enumerate() {
                min[i] = min[i].min(v);
                max[i] = max[i].max(v);
            }
        }
        Self::new(min, max)
    }

    pub fn dimensions(&self) -> usize {
        self.min.len()
    }

    pub fn min(&self) -> &[f32] {
        &self.min
    }

    pub fn max(&self) -> &[f32] {
        &self.max
    }

    /// Little-endian f32: every minimum, then every maximum.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.min.iter().chain(&self.max).flat_map(|v| v.to_le_bytes()).collect()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, RangesError> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(8) || bytes.len() / 8 > MAX_DIMENSIONS {
            return Err(RangesError::Length(bytes.len()));
        }
        let values: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let (min, max) = values.split_at(values.len() / 2);
        Self::new(min.to_vec(), max.to_vec())
    }

    /// `clip(floor((v − min) / step), 0, 255)` per dimension. `values` has
    /// [`Ranges::dimensions`] values (the caller checked it against the job's length).
    pub fn quantize(&self, values: &[f32]) -> Vec<u8> {
        assert_eq!(values.len(), self.min.len(), "one range per dimension");
        values
            .iter()
            .zip(self.min.iter().zip(&self.max))
            .map(|(&v, (&start, &end))| {
                let step = (end - start) / 255.0;
                let step = if step == 0.0 { 1.0 } else { step };
                // NaN (no vector has one) would land on 0, as `as` saturates.
                ((v - start) / step).floor().clamp(0.0, 255.0) as u8
            })
            .collect()
    }
}

/// `q − 128` of [`Ranges::quantize`]'s bytes, or of [`pack_bits`]': the signed forms.
pub fn to_signed(bytes: Vec<u8>) -> Vec<i8> {
    bytes.into_iter().map(|b| (i16::from(b) - 128) as i8).collect()
}

/// One bit per value, `v > 0`, eight to a byte from the most significant bit, zero-padded.
pub fn pack_bits(values: &[f32]) -> Vec<u8> {
    values
        .chunks(8)
        .map(|chunk| chunk.iter().enumerate().fold(0u8, |byte, (i, &v)| if v > 0.0 { byte | (0x80 >> i) } else { byte }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_pack_like_numpy() {
        // np.packbits([1,0,1,1,0,0,0,1, 1,0,1]) == [0b10110001, 0b10100000]
        let values = [0.5, -1.0, 2.0, 0.1, 0.0, -0.0, -3.0, 1e-9, 7.0, -7.0, 1.0];
        assert_eq!(pack_bits(&values), [0b1011_0001, 0b1010_0000]);
        assert_eq!(to_signed(vec![0, 128, 255]), [-128, 0, 127]);
    }

    #[test]
    fn quantisation_floors_clips_and_survives_a_zero_width_range() {
        let ranges = Ranges::new(vec![-1.0, 0.0, 2.0], vec![1.0, 0.0, 4.0]).unwrap();
        // (0 + 1) / (2/255) = 127.5 → 127; the zero-width range steps by 1 (3.7 → 3); below and
        // above the ranges clip.
        assert_eq!(ranges.quantize(&[0.0, 3.7, 1.0]), [127, 3, 0]);
        // The maximum itself: 2 / (2/255) is 254.99998 in f32, so 254, as NumPy computes it.
        assert_eq!(ranges.quantize(&[1.0, -2.0, 5.0]), [254, 0, 255]);
    }

    #[test]
    fn ranges_round_trip_and_refuse_what_they_cannot_be() {
        let ranges = Ranges::of([[0.5f32, -1.0].as_slice(), [-0.25, 3.0].as_slice()]).unwrap();
        assert_eq!((ranges.min(), ranges.max()), ([-0.25, -1.0].as_slice(), [0.5, 3.0].as_slice()));
        assert_eq!(Ranges::from_bytes(&ranges.to_bytes()).unwrap(), ranges);
        assert_eq!(Ranges::from_bytes(&[0; 12]), Err(RangesError::Length(12)));
        assert_eq!(Ranges::from_bytes(&[]), Err(RangesError::Length(0)));
        assert_eq!(Ranges::new(vec![1.0], vec![0.0]), Err(RangesError::Bounds(0)));
        assert_eq!(Ranges::new(vec![f32::NAN], vec![0.0]), Err(RangesError::Bounds(0)));
        assert_eq!(Ranges::new(vec![0.0, 0.0], vec![1.0]), Err(RangesError::Rows { min: 2, max: 1 }));
    }
}
