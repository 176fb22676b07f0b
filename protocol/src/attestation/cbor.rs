//! A small, strict CBOR (RFC 8949) reader and writer for the attestation formats.
//!
//! One job: turn bytes into a borrowed [`Value`] tree and back, with limits fit for untrusted input.
//! The reader accepts definite-length items only (the NSM never emits indefinite lengths), rejects
//! duplicate map keys, reserved additional-information values, invalid UTF-8 text and trailing
//! bytes, and stops at a nesting depth of [`MAX_DEPTH`]. It never allocates more than the input
//! can justify. The writer always emits the shortest head (RFC 8949 §4.2.1 "preferred
//! serialization"); callers that need deterministic encoding order their map keys themselves.

use core::fmt;

/// Deepest nesting the reader follows. The attestation document needs 4 (COSE array → payload is a
/// separate decode → map → pcrs map), the other formats less.
pub const MAX_DEPTH: usize = 16;

/// Most entries a map may have. The formats here need at most 32 (the PCR map); the bound also
/// keeps the duplicate-key check (quadratic in the entry count) cheap on hostile input.
pub const MAX_MAP_ENTRIES: usize = 64;

/// A decoded CBOR item borrowing its byte and text strings from the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Major type 0.
    Unsigned(u64),
    /// Major type 1: the value is `-1 - n`.
    Negative(u64),
    /// Major type 2.
    Bytes(&'a [u8]),
    /// Major type 3.
    Text(&'a str),
    /// Major type 4.
    Array(Vec<Value<'a>>),
    /// Major type 5, in input order.
    Map(Vec<(Value<'a>, Value<'a>)>),
    /// Major type 6.
    Tag(u64, Box<Value<'a>>),
    /// Simple values 20/21.
    Bool(bool),
    /// Simple value 22.
    Null,
    /// Simple value 23.
    Undefined,
    /// Any other simple value (0..=19, 32..=255).
    Simple(u8),
    /// A float of 2, 4 or 8 bytes, kept as its raw big-endian bits.
    Float(u64),
}

impl Value<'_> {
    /// A short name of the item's type, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Unsigned(_) => "unsigned integer",
            Value::Negative(_) => "negative integer",
            Value::Bytes(_) => "byte string",
            Value::Text(_) => "text string",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
            Value::Tag(..) => "tagged item",
            Value::Bool(_) => "boolean",
            Value::Null => "null",
            Value::Undefined => "undefined",
            Value::Simple(_) => "simple value",
            Value::Float(_) => "float",
        }
    }

    /// The integer value as i128 (covers the whole CBOR integer range), if it is an integer.
    pub fn as_integer(&self) -> Option<i128> {
        match *self {
            Value::Unsigned(n) => Some(i128::from(n)),
            Value::Negative(n) => Some(-1i128 - i128::from(n)),
            _ => None,
        }
    }
}

/// Why bytes are not well-formed CBOR (as this reader accepts it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CborError {
    #[error("input ends inside an item at byte {offset}")]
    UnexpectedEnd { offset: usize },
    #[error("indefinite-length item at byte {offset} (only definite lengths are accepted)")]
    IndefiniteLength { offset: usize },
    #[error("reserved additional information {info} at byte {offset}")]
    Reserved { offset: usize, info: u8 },
    #[error("invalid simple value encoding at byte {offset}")]
    InvalidSimple { offset: usize },
    #[error("text string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: usize },
    #[error("nesting deeper than {MAX_DEPTH} at byte {offset}")]
    TooDeep { offset: usize },
    #[error("duplicate map key at byte {offset}")]
    DuplicateKey { offset: usize },
    #[error("{count} trailing byte(s) after the item, at byte {offset}")]
    TrailingBytes { offset: usize, count: usize },
    #[error("map at byte {offset} has {count} entries (at most {MAX_MAP_ENTRIES})")]
    TooManyEntries { offset: usize, count: usize },
    #[error("input is {len} bytes (at most {max})")]
    TooLarge { len: usize, max: usize },
    #[error("empty input")]
    Empty,
}

/// Decodes exactly one item spanning the whole input.
pub fn decode(input: &[u8]) -> Result<Value<'_>, CborError> {
    if input.is_empty() {
        return Err(CborError::Empty);
    }
    let mut reader = Reader { input, pos: 0 };
    let value = reader.item(0)?;
    let rest = input.len().saturating_sub(reader.pos);
    if rest != 0 {
        return Err(CborError::TrailingBytes { offset: reader.pos, count: rest });
    }
    Ok(value)
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.input.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, offset: usize) -> Result<&'a [u8], CborError> {
        let end = self.pos.checked_add(n).ok_or(CborError::UnexpectedEnd { offset })?;
        let bytes = self.input.get(self.pos..end).ok_or(CborError::UnexpectedEnd { offset })?;
        self.pos = end;
        Ok(bytes)
    }

    fn byte(&mut self, offset: usize) -> Result<u8, CborError> {
        let b = *self.input.get(self.pos).ok_or(CborError::UnexpectedEnd { offset })?;
        self.pos = self.pos.saturating_add(1);
        Ok(b)
    }

    /// Reads the argument of a head whose additional information is `info`.
    fn argument(&mut self, info: u8, offset: usize) -> Result<u64, CborError> {
        let width = match info {
            0..=23 => return Ok(u64::from(info)),
            24 => 1,
            25 => 2,
            26 => 4,
            27 => 8,
            28..=30 => return Err(CborError::Reserved { offset, info }),
            _ => return Err(CborError::IndefiniteLength { offset }),
        };
        let bytes = self.take(width, offset)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A length that must fit in what is left of the input (each element needs at least a byte).
    fn length(&mut self, info: u8, offset: usize) -> Result<usize, CborError> {
        let n = self.argument(info, offset)?;
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(CborError::UnexpectedEnd { offset }),
        }
    }

    fn item(&mut self, depth: usize) -> Result<Value<'a>, CborError> {
        let offset = self.pos;
        if depth > MAX_DEPTH {
            return Err(CborError::TooDeep { offset });
        }
        let initial = self.byte(offset)?;
        let major = initial >> 5;
        let info = initial & 0x1f;
        match major {
            0 => Ok(Value::Unsigned(self.argument(info, offset)?)),
            1 => Ok(Value::Negative(self.argument(info, offset)?)),
            2 => {
                let n = self.length(info, offset)?;
                Ok(Value::Bytes(self.take(n, offset)?))
            }
            3 => {
                let n = self.length(info, offset)?;
                let bytes = self.take(n, offset)?;
                let text = core::str::from_utf8(bytes).map_err(|_| CborError::InvalidUtf8 { offset })?;
                Ok(Value::Text(text))
            }
            4 => {
                let n = self.length(info, offset)?;
                let mut items = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    items.push(self.item(depth.saturating_add(1))?);
                }
                Ok(Value::Array(items))
            }
            5 => {
                let n = self.length(info, offset)?;
                if n > MAX_MAP_ENTRIES {
                    return Err(CborError::TooManyEntries { offset, count: n });
                }
                let mut entries: Vec<(Value<'a>, Value<'a>)> = Vec::with_capacity(n);
                for _ in 0..n {
                    let key_offset = self.pos;
                    let key = self.item(depth.saturating_add(1))?;
                    if entries.iter().any(|(k, _)| *k == key) {
                        return Err(CborError::DuplicateKey { offset: key_offset });
                    }
                    let value = self.item(depth.saturating_add(1))?;
                    entries.push((key, value));
                }
                Ok(Value::Map(entries))
            }
            6 => {
                let tag = self.argument(info, offset)?;
                let inner = self.item(depth.saturating_add(1))?;
                Ok(Value::Tag(tag, Box::new(inner)))
            }
            _ => match info {
                20 => Ok(Value::Bool(false)),
                21 => Ok(Value::Bool(true)),
                22 => Ok(Value::Null),
                23 => Ok(Value::Undefined),
                0..=19 => Ok(Value::Simple(info)),
                24 => {
                    let v = self.byte(offset)?;
                    // RFC 8949 §3.3: simple values 0..=31 must not use the one-byte extension.
                    if v < 32 {
                        return Err(CborError::InvalidSimple { offset });
                    }
                    Ok(Value::Simple(v))
                }
                25..=27 => Ok(Value::Float(self.argument(info, offset)?)),
                28..=30 => Err(CborError::Reserved { offset, info }),
                _ => Err(CborError::IndefiniteLength { offset }),
            },
        }
    }
}

/// Appends CBOR items to a buffer, always with the shortest head.
#[derive(Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    fn head(&mut self, major: u8, value: u64) -> &mut Self {
        let m = major << 5;
        if value < 24 {
            // value < 24 fits in the low five bits.
            self.out.push(m | (value as u8));
        } else if let Ok(v) = u8::try_from(value) {
            self.out.extend_from_slice(&[m | 24, v]);
        } else if let Ok(v) = u16::try_from(value) {
            self.out.push(m | 25);
            self.out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = u32::try_from(value) {
            self.out.push(m | 26);
            self.out.extend_from_slice(&v.to_be_bytes());
        } else {
            self.out.push(m | 27);
            self.out.extend_from_slice(&value.to_be_bytes());
        }
        self
    }

    pub fn unsigned(&mut self, value: u64) -> &mut Self {
        self.head(0, value)
    }

    /// Any integer in i64 range.
    pub fn integer(&mut self, value: i64) -> &mut Self {
        match u64::try_from(value) {
            Ok(v) => self.head(0, v),
            // -1 - value is non-negative and fits in u64 for every negative i64.
            Err(_) => self.head(1, (-1i128 - i128::from(value)) as u64),
        }
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.head(2, value.len() as u64);
        self.out.extend_from_slice(value);
        self
    }

    pub fn text(&mut self, value: &str) -> &mut Self {
        self.head(3, value.len() as u64);
        self.out.extend_from_slice(value.as_bytes());
        self
    }

    pub fn array(&mut self, len: usize) -> &mut Self {
        self.head(4, len as u64)
    }

    pub fn map(&mut self, len: usize) -> &mut Self {
        self.head(5, len as u64)
    }

    pub fn tag(&mut self, tag: u64) -> &mut Self {
        self.head(6, tag)
    }

    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.out.push(if value { 0xf5 } else { 0xf4 });
        self
    }

    pub fn null(&mut self) -> &mut Self {
        self.out.push(0xf6);
        self
    }

    /// A byte string, or null when absent.
    pub fn opt_bytes(&mut self, value: Option<&[u8]>) -> &mut Self {
        match value {
            Some(v) => self.bytes(v),
            None => self.null(),
        }
    }

    /// Appends an already encoded item.
    pub fn raw(&mut self, encoded: &[u8]) -> &mut Self {
        self.out.extend_from_slice(encoded);
        self
    }
}

/// Hex of a byte string, shortened for error messages.
pub(crate) struct ShortHex<'a>(pub &'a [u8]);

impl fmt::Display for ShortHex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KEEP: usize = 8;
        if self.0.len() <= 2 * KEEP {
            return f.write_str(&hex::encode(self.0));
        }
        let head = self.0.get(..KEEP).unwrap_or_default();
        let tail = self.0.get(self.0.len().saturating_sub(KEEP)..).unwrap_or_default();
        write!(f, "{}…{}", hex::encode(head), hex::encode(tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new();
        f(&mut w);
        w.into_bytes()
    }

    #[test]
    fn heads_are_shortest() {
        assert_eq!(enc(|w| { w.unsigned(0); }), [0x00]);
        assert_eq!(enc(|w| { w.unsigned(23); }), [0x17]);
        assert_eq!(enc(|w| { w.unsigned(24); }), [0x18, 24]);
        assert_eq!(enc(|w| { w.unsigned(256); }), [0x19, 1, 0]);
        assert_eq!(enc(|w| { w.unsigned(65536); }), [0x1a, 0, 1, 0, 0]);
        assert_eq!(enc(|w| { w.unsigned(u64::MAX); }), [0x1b, 255, 255, 255, 255, 255, 255, 255, 255]);
        assert_eq!(enc(|w| { w.integer(-35); }), [0x38, 0x22]);
        assert_eq!(enc(|w| { w.integer(-1); }), [0x20]);
        assert_eq!(enc(|w| { w.integer(i64::MIN); }), [0x3b, 0x7f, 255, 255, 255, 255, 255, 255, 255]);
    }

    #[test]
    fn round_trip() {
        let bytes = enc(|w| {
            w.map(3).text("a").bytes(b"xyz").unsigned(1).integer(-35).text("n").null();
        });
        let v = decode(&bytes).unwrap();
        assert_eq!(
            v,
            Value::Map(vec![
                (Value::Text("a"), Value::Bytes(b"xyz")),
                (Value::Unsigned(1), Value::Negative(34)),
                (Value::Text("n"), Value::Null),
            ])
        );
        assert_eq!(v.clone(), v);
    }

    #[test]
    fn rejects() {
        assert_eq!(decode(&[]), Err(CborError::Empty));
        assert_eq!(decode(&[0x5f, 0xff]), Err(CborError::IndefiniteLength { offset: 0 }));
        assert_eq!(decode(&[0x1c]), Err(CborError::Reserved { offset: 0, info: 28 }));
        assert_eq!(decode(&[0x00, 0x00]), Err(CborError::TrailingBytes { offset: 1, count: 1 }));
        assert_eq!(decode(&[0x62, 0xff, 0xfe]), Err(CborError::InvalidUtf8 { offset: 0 }));
        assert_eq!(decode(&[0xa2, 0x01, 0x00, 0x01, 0x00]), Err(CborError::DuplicateKey { offset: 3 }));
        assert_eq!(decode(&[0xf8, 0x10]), Err(CborError::InvalidSimple { offset: 0 }));
        // A length far beyond the input is refused before any allocation.
        assert_eq!(
            decode(&[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Err(CborError::UnexpectedEnd { offset: 0 })
        );
        assert_eq!(decode(&[0x5a, 0xff, 0xff, 0xff, 0xff, 0x00]), Err(CborError::UnexpectedEnd { offset: 0 }));
        let mut big_map = vec![0xb8, 65];
        for i in 0..65u8 {
            big_map.extend([0x18, i, 0x00]);
        }
        assert_eq!(decode(&big_map), Err(CborError::TooManyEntries { offset: 0, count: 65 }));
        let deep = vec![0x81u8; MAX_DEPTH + 2];
        assert!(matches!(decode(&deep), Err(CborError::TooDeep { .. })));
    }

    #[test]
    fn short_hex() {
        assert_eq!(ShortHex(&[1, 2]).to_string(), "0102");
        assert_eq!(ShortHex(&[0u8; 48]).to_string(), "0000000000000000…0000000000000000");
    }
}
