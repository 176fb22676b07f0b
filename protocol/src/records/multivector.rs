//! dtype 0x08, a multi-vector record (ColBERT): one f32 vector per kept token, laid out after
//! the dtype byte as `count u32 ‖ dimensions u16 ‖ count × dimensions × f32 LE`. `count` is
//! 1..=the record's tokens, `dimensions` 1..=[`MAX_DIMENSIONS`], and the values at most
//! [`MAX_RECORD_BYTES`]; anything else fails the stream.

use super::{Cursor, MAX_DIMENSIONS, RecordError};
use crate::envelope::MAX_RECORD_BYTES;

pub(super) const DTYPE_MULTIVECTOR: u8 = 0x08;

/// `count` vectors of `dimensions` f32 values each, row after row.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiVector {
    pub dimensions: u16,
    pub values: Vec<f32>,
}

impl MultiVector {
    /// Rows of `dimensions` values; `None` if `values` is not a whole number of them or the
    /// shape is outside what a record may carry.
    pub fn new(dimensions: usize, values: Vec<f32>) -> Option<Self> {
        let vector = Self { dimensions: u16::try_from(dimensions).ok()?, values };
        vector.shape_valid().then_some(vector)
    }

    /// How many vectors.
    pub fn count(&self) -> usize {
        self.values.len() / usize::from(self.dimensions).max(1)
    }

    pub fn rows(&self) -> std::slice::ChunksExact<'_, f32> {
        self.values.chunks_exact(usize::from(self.dimensions).max(1))
    }

    /// Bytes of the values on the wire.
    pub fn value_bytes(&self) -> usize {
        self.values.len() * 4
    }

    fn shape_valid(&self) -> bool {
        let dim = usize::from(self.dimensions);
        (1..=MAX_DIMENSIONS).contains(&dim)
            && !self.values.is_empty()
            && self.values.len().is_multiple_of(dim)
            && u32::try_from(self.count()).is_ok()
            && self.value_bytes() <= MAX_RECORD_BYTES as usize
    }

    /// Whether a record of `tokens` may carry it: a whole shape, at most one vector per token.
    pub(super) fn valid_for(&self, tokens: u32) -> bool {
        self.shape_valid() && self.count() <= tokens as usize
    }
}

pub(super) fn put(out: &mut Vec<u8>, vector: &MultiVector) {
    out.push(DTYPE_MULTIVECTOR);
    out.extend_from_slice(&(vector.count() as u32).to_be_bytes());
    out.extend_from_slice(&vector.dimensions.to_be_bytes());
    out.reserve(vector.value_bytes());
    for v in &vector.values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

pub(super) fn parse(cursor: &mut Cursor<'_>, offset: u64, tokens: u32) -> Result<Option<MultiVector>, RecordError> {
    let Some(count) = cursor.u32() else { return Ok(None) };
    let Some(dimensions) = cursor.u16() else { return Ok(None) };
    let refused = RecordError::MultiVector { offset, count, dimensions };
    let bytes = u64::from(count) * u64::from(dimensions) * 4;
    // Checked before anything is read, so a sender cannot make the reader buffer more.
    if count == 0 || count > tokens || dimensions == 0 || usize::from(dimensions) > MAX_DIMENSIONS || bytes > u64::from(MAX_RECORD_BYTES) {
        return Err(refused);
    }
    let Some(bytes) = cursor.take(bytes as usize) else { return Ok(None) };
    let values = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Some(MultiVector { dimensions, values }))
}

#[cfg(test)]
mod tests {
    use super::super::{OutputDecoder, OutputRecord, Vector, encode_output};
    use super::*;

    #[test]
    fn multivector_records_have_a_known_answer_and_refuse_disagreeing_lengths() {
        let vector = MultiVector::new(2, vec![1.0, 0.0, 0.6, -0.8, 0.0, 1.0]).unwrap();
        assert_eq!((vector.count(), vector.rows().nth(1).unwrap()), (3, [0.6, -0.8].as_slice()));
        let record = OutputRecord::Embedding { id: "m".into(), tokens: 3, vector: Vector::Multi(vector) };
        let mut out = Vec::new();
        encode_output(&record, &mut out).unwrap();
        // tag, id, tokens 3, dtype 0x08, count 3, dimensions 2, six f32 LE.
        assert_eq!(
            hex::encode(&out),
            "0200016d00000003 08 00000003 0002 0000803f 00000000 9a99193f cdcc4cbf 00000000 0000803f".replace(' ', "")
        );
        let mut decoder = OutputDecoder::new();
        decoder.push(&out);
        assert_eq!(decoder.next_record().unwrap(), Some(record.clone()));

        let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = out.clone();
            edit(&mut bad);
            let mut decoder = OutputDecoder::new();
            decoder.push(&bad);
            decoder.next_record()
        };
        // More vectors than tokens, none, zero or too many dimensions: the stream fails.
        let tokens_2 = refused(&|b| b[7] = 2);
        assert!(matches!(tokens_2, Err(RecordError::MultiVector { count: 3, dimensions: 2, .. })), "{tokens_2:?}");
        assert!(matches!(refused(&|b| b[12] = 0), Err(RecordError::MultiVector { count: 0, .. })));
        assert!(matches!(refused(&|b| b[13..15].copy_from_slice(&[0, 0])), Err(RecordError::MultiVector { dimensions: 0, .. })));
        assert!(matches!(refused(&|b| b[13..15].copy_from_slice(&[0x20, 0x01])), Err(RecordError::MultiVector { dimensions: 8193, .. })));
        // Over the record cap (tokens raised so only the bytes are wrong).
        let huge = refused(&|b| {
            b[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
            b[9..13].copy_from_slice(&(MAX_RECORD_BYTES / 8 + 1).to_be_bytes());
        });
        assert!(matches!(huge, Err(RecordError::MultiVector { .. })), "{huge:?}");
        // A count that says more values than the stream holds: the stream ends inside the record.
        let mut decoder = OutputDecoder::new();
        let mut long = out.clone();
        long[12] = 4;
        long[7] = 4;
        decoder.push(&long);
        assert!(matches!(decoder.next_record(), Ok(None)));
        assert!(matches!(decoder.finish(None), Err(RecordError::Truncated { .. })));
        // The encoder refuses what the decoder would.
        let lying = OutputRecord::Embedding { id: "m".into(), tokens: 2, vector: record_vector(&record) };
        assert!(matches!(encode_output(&lying, &mut Vec::new()), Err(RecordError::MultiVector { count: 3, .. })));
        assert!(MultiVector::new(4, vec![0.0; 6]).is_none());
    }

    fn record_vector(record: &OutputRecord) -> Vector {
        match record {
            OutputRecord::Embedding { vector, .. } => vector.clone(),
            OutputRecord::Error { .. } => unreachable!(),
        }
    }
}
