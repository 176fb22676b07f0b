//! Deterministic CBOR (RFC 8949 §4.2.1) for our own maps: build them with sorted keys, and read
//! them back strictly — definite lengths, minimal integers, keys in order, no duplicates, no
//! unknown keys, no trailing bytes. Because every format is decoded strictly, each has exactly
//! one encoding, which is what signatures and hashes are computed over.

use std::collections::BTreeMap;

use ciborium::value::{Integer, Value};

/// Why a deterministic CBOR map was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CborError {
    #[error("not well-formed CBOR: {0}")]
    Malformed(String),
    #[error("{0} trailing bytes after the CBOR item")]
    TrailingBytes(usize),
    #[error("not deterministically encoded (RFC 8949 §4.2.1)")]
    NotDeterministic,
    #[error("expected a CBOR map")]
    NotAMap,
    #[error("map keys must be text, sorted, without duplicates")]
    BadKeys,
    #[error("missing field `{0}`")]
    Missing(&'static str),
    #[error("field `{0}` has the wrong type or size")]
    WrongType(&'static str),
    #[error("unknown field `{0}`")]
    Unknown(String),
}

/// Encodes a value; maps built by [`MapBuilder`] are already in deterministic order.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail, and Value holds no floats we produce.
    if ciborium::into_writer(value, &mut out).is_err() {
        out.clear();
    }
    out
}

/// Decodes exactly one CBOR item from `bytes` and checks that re-encoding gives the same bytes.
pub fn decode_deterministic(bytes: &[u8]) -> Result<Value, CborError> {
    let mut reader = bytes;
    let value: Value = ciborium::de::from_reader_with_recursion_limit(&mut reader, 16)
        .map_err(|e| CborError::Malformed(e.to_string()))?;
    if !reader.is_empty() {
        return Err(CborError::TrailingBytes(reader.len()));
    }
    if encode(&value) != bytes {
        return Err(CborError::NotDeterministic);
    }
    Ok(value)
}

/// RFC 8949 deterministic order for text keys: shorter first, then bytewise.
fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Builds a map with text keys in deterministic order.
#[derive(Default)]
pub struct MapBuilder {
    entries: Vec<(&'static str, Value)>,
}

impl MapBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn uint(mut self, key: &'static str, value: u64) -> Self {
        self.entries.push((key, Value::Integer(value.into())));
        self
    }

    pub fn bytes(mut self, key: &'static str, value: &[u8]) -> Self {
        self.entries.push((key, Value::Bytes(value.to_vec())));
        self
    }

    pub fn text(mut self, key: &'static str, value: &str) -> Self {
        self.entries.push((key, Value::Text(value.to_owned())));
        self
    }

    pub fn bool(mut self, key: &'static str, value: bool) -> Self {
        self.entries.push((key, Value::Bool(value)));
        self
    }

    pub fn value(mut self, key: &'static str, value: Value) -> Self {
        self.entries.push((key, value));
        self
    }

    pub fn build(mut self) -> Value {
        self.entries.sort_by(|a, b| key_order(a.0, b.0));
        Value::Map(
            self.entries
                .into_iter()
                .map(|(k, v)| (Value::Text(k.to_owned()), v))
                .collect(),
        )
    }
}

/// A map with integer keys (PCR index → value), in ascending order.
pub fn uint_map(entries: &BTreeMap<u8, Vec<u8>>) -> Value {
    Value::Map(
        entries
            .iter()
            .map(|(k, v)| (Value::Integer(u64::from(*k).into()), Value::Bytes(v.clone())))
            .collect(),
    )
}

/// Reads the fields of a map with text keys; every field must be taken exactly once and no
/// unknown field may remain ([`MapReader::finish`]).
pub struct MapReader {
    fields: BTreeMap<String, Value>,
}

impl MapReader {
    pub fn new(value: Value) -> Result<Self, CborError> {
        let Value::Map(entries) = value else {
            return Err(CborError::NotAMap);
        };
        let mut fields = BTreeMap::new();
        let mut previous: Option<String> = None;
        for (key, value) in entries {
            let Value::Text(key) = key else {
                return Err(CborError::BadKeys);
            };
            if let Some(prev) = &previous
                && key_order(prev, &key) != std::cmp::Ordering::Less
            {
                return Err(CborError::BadKeys);
            }
            previous = Some(key.clone());
            fields.insert(key, value);
        }
        Ok(Self { fields })
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CborError> {
        Self::new(decode_deterministic(bytes)?)
    }

    pub fn take(&mut self, key: &'static str) -> Result<Value, CborError> {
        self.fields.remove(key).ok_or(CborError::Missing(key))
    }

    pub fn optional(&mut self, key: &'static str) -> Option<Value> {
        self.fields.remove(key)
    }

    pub fn uint(&mut self, key: &'static str) -> Result<u64, CborError> {
        as_uint(self.take(key)?, key)
    }

    pub fn bytes(&mut self, key: &'static str) -> Result<Vec<u8>, CborError> {
        match self.take(key)? {
            Value::Bytes(b) => Ok(b),
            _ => Err(CborError::WrongType(key)),
        }
    }

    pub fn array<const N: usize>(&mut self, key: &'static str) -> Result<[u8; N], CborError> {
        self.bytes(key)?
            .try_into()
            .map_err(|_| CborError::WrongType(key))
    }

    /// [`MapReader::array`] of a key that may be absent.
    pub fn optional_array<const N: usize>(&mut self, key: &'static str) -> Result<Option<[u8; N]>, CborError> {
        if !self.fields.contains_key(key) {
            return Ok(None);
        }
        self.array(key).map(Some)
    }

    pub fn text(&mut self, key: &'static str) -> Result<String, CborError> {
        match self.take(key)? {
            Value::Text(t) => Ok(t),
            _ => Err(CborError::WrongType(key)),
        }
    }

    pub fn bool(&mut self, key: &'static str) -> Result<bool, CborError> {
        match self.take(key)? {
            Value::Bool(b) => Ok(b),
            _ => Err(CborError::WrongType(key)),
        }
    }

    pub fn map(&mut self, key: &'static str) -> Result<MapReader, CborError> {
        MapReader::new(self.take(key)?).map_err(|e| match e {
            CborError::NotAMap => CborError::WrongType(key),
            other => other,
        })
    }

    /// Fails if a field was not taken.
    pub fn finish(self) -> Result<(), CborError> {
        match self.fields.into_keys().next() {
            Some(unknown) => Err(CborError::Unknown(unknown)),
            None => Ok(()),
        }
    }
}

pub fn as_uint(value: Value, key: &'static str) -> Result<u64, CborError> {
    match value {
        Value::Integer(i) => u64::try_from(i).map_err(|_| CborError::WrongType(key)),
        _ => Err(CborError::WrongType(key)),
    }
}

/// Reads a map with small unsigned integer keys in ascending order (PCR index → bytes).
pub fn read_uint_map(value: Value, key: &'static str) -> Result<BTreeMap<u8, Vec<u8>>, CborError> {
    let Value::Map(entries) = value else {
        return Err(CborError::WrongType(key));
    };
    let mut out = BTreeMap::new();
    let mut previous: Option<u8> = None;
    for (k, v) in entries {
        let index = match k {
            Value::Integer(i) => u8::try_from(i).map_err(|_| CborError::WrongType(key))?,
            _ => return Err(CborError::WrongType(key)),
        };
        if previous.is_some_and(|p| p >= index) {
            return Err(CborError::BadKeys);
        }
        previous = Some(index);
        let Value::Bytes(bytes) = v else {
            return Err(CborError::WrongType(key));
        };
        out.insert(index, bytes);
    }
    Ok(out)
}

pub fn integer(value: u64) -> Value {
    Value::Integer(Integer::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_sorts_shorter_keys_first() {
        let value = MapBuilder::new().uint("bb", 1).uint("a", 2).uint("ab", 3).build();
        let bytes = encode(&value);
        // {"a": 2, "ab": 3, "bb": 1}
        assert_eq!(hex::encode(&bytes), "a36161026261620362626201");
        let mut reader = MapReader::from_bytes(&bytes).unwrap();
        assert_eq!(reader.uint("bb").unwrap(), 1);
        assert_eq!(reader.uint("a").unwrap(), 2);
        assert_eq!(reader.finish(), Err(CborError::Unknown("ab".into())));
    }

    #[test]
    fn refuses_non_deterministic_encodings() {
        // {"a": 2} with the integer in a two-byte head.
        assert_eq!(
            MapReader::from_bytes(&hex::decode("a161611802").unwrap()).err(),
            Some(CborError::NotDeterministic)
        );
        // Indefinite-length map.
        assert_eq!(
            MapReader::from_bytes(&hex::decode("bf616102ff").unwrap()).err(),
            Some(CborError::NotDeterministic)
        );
        // Keys out of order: {"b": 1, "a": 2}.
        assert_eq!(
            MapReader::from_bytes(&hex::decode("a2616201616102").unwrap()).err(),
            Some(CborError::BadKeys)
        );
        // Duplicate key.
        assert_eq!(
            MapReader::from_bytes(&hex::decode("a2616101616102").unwrap()).err(),
            Some(CborError::BadKeys)
        );
        assert_eq!(
            MapReader::from_bytes(&hex::decode("a1616102ff").unwrap()).err(),
            Some(CborError::TrailingBytes(1))
        );
    }
}
