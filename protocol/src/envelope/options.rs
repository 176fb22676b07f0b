//! What a job asks of the enclave (its header's `options`): the compute precision, the output's
//! kind and element type, the prompt, the Matryoshka length, the ranges of a compact encoding.

use crate::cbor::{MapBuilder, MapReader};

use super::{EnvelopeError, MAX_DIMENSIONS, MAX_SPARSE_DIMENSIONS};

/// Model compute precision; anything but fp32 is an explicit opt-in recorded in the receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
    Int8,
}

// The ranges of int8/uint8 output cover a vector's dimensions.
const _: () = assert!(crate::quantize::MAX_DIMENSIONS == MAX_DIMENSIONS);

/// Element type of the output vectors: floats, or a compact encoding ([`crate::quantize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputDtype {
    #[default]
    F32,
    F16,
    /// One signed byte per dimension, by the job's ranges.
    Int8,
    /// One byte per dimension, by the job's ranges.
    Uint8,
    /// One bit per dimension, packed, each byte − 128.
    Binary,
    /// One bit per dimension, packed.
    Ubinary,
}

/// What a job's records carry: one vector per text, or a sparse one (the nonzero weights of a
/// vocabulary-wide vector, by index), as the model's pooling gives ([`crate::manifest::Pooling::output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputKind {
    #[default]
    Dense,
    Sparse,
    /// A cross-encoder's relevance scores: each input record is a query and its documents
    /// ([`crate::records::RerankInput`]), its output one f32 score per document, in their order.
    Scores,
    /// One f32 vector per kept token, each L2-normalised, at the model's own dimensions
    /// ([`crate::records::MultiVector`]); the job's `max_record_bytes` bounds one record.
    MultiVector,
}

impl OutputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Dense => "dense",
            OutputKind::Sparse => "sparse",
            OutputKind::Scores => "scores",
            OutputKind::MultiVector => "multivector",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "dense" => Some(OutputKind::Dense),
            "sparse" => Some(OutputKind::Sparse),
            "scores" => Some(OutputKind::Scores),
            "multivector" => Some(OutputKind::MultiVector),
            _ => None,
        }
    }
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fp32" => Some(Precision::Fp32),
            "bf16" => Some(Precision::Bf16),
            "int8" => Some(Precision::Int8),
            _ => None,
        }
    }
}

impl OutputDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputDtype::F32 => "f32",
            OutputDtype::F16 => "f16",
            OutputDtype::Int8 => "int8",
            OutputDtype::Uint8 => "uint8",
            OutputDtype::Binary => "binary",
            OutputDtype::Ubinary => "ubinary",
        }
    }

    /// Whether the dtype quantises by per-dimension ranges (which the options must then carry).
    pub fn needs_ranges(self) -> bool {
        matches!(self, OutputDtype::Int8 | OutputDtype::Uint8)
    }

    /// Elements of an output vector of `dimensions` values: a byte per eight for the bit forms.
    pub fn elements(self, dimensions: usize) -> usize {
        match self {
            OutputDtype::Binary | OutputDtype::Ubinary => dimensions.div_ceil(8),
            _ => dimensions,
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "f32" => Some(OutputDtype::F32),
            "f16" => Some(OutputDtype::F16),
            "int8" => Some(OutputDtype::Int8),
            "uint8" => Some(OutputDtype::Uint8),
            "binary" => Some(OutputDtype::Binary),
            "ubinary" => Some(OutputDtype::Ubinary),
            _ => None,
        }
    }
}

/// How the enclave embeds a job's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOptions {
    /// Truncate texts longer than the model's maximum; if false they are per-record errors.
    pub truncate: bool,
    /// L2-normalise the vectors.
    pub normalize: bool,
    pub dtype: OutputDtype,
    pub precision: Precision,
    /// One of the model manifest's named prompts, put before every text (sentence-transformers'
    /// `prompt_name`); `None`: the texts as they are.
    pub prompt: Option<String>,
    /// Vectors of this many values (a Matryoshka length the manifest offers, or the model's own);
    /// `None`: the model's own.
    pub dimensions: Option<u32>,
    /// The per-dimension ranges of an `int8`/`uint8` job (present exactly for those dtypes), one
    /// per value of the vectors it asks for; the receipt records them with the rest.
    pub ranges: Option<crate::quantize::Ranges>,
    /// Dense vectors, sparse ones (f32 weights, unnormalised, the model's own dimensions), or a
    /// cross-encoder's scores (f32, one per document).
    pub output: OutputKind,
    /// A sparse job keeps each record's `top_k` largest weights (sentence-transformers'
    /// `max_active_dims`); `None`: every nonzero weight.
    pub top_k: Option<u32>,
    /// A multi-vector job's bound on one record's vector bytes (count × dimensions × 4); a
    /// record over it fails alone. Present exactly for multi-vector output.
    pub max_record_bytes: Option<u32>,
}

/// The largest `max_record_bytes` a job may ask for: 8,192 tokens of 1,024 f32 values.
pub const MAX_RECORD_BYTES: u32 = 32 << 20;

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            truncate: true,
            normalize: true,
            dtype: OutputDtype::F32,
            precision: Precision::Fp32,
            prompt: None,
            dimensions: None,
            ranges: None,
            output: OutputKind::Dense,
            top_k: None,
            max_record_bytes: None,
        }
    }
}

impl JobOptions {
    /// `prompt`, `dimensions`, `ranges`, a non-dense `output`, `top_k` and `max_record_bytes` are written only when set, so options without them
    /// encode as before they existed (and old receipts verify unchanged).
    pub fn to_cbor(&self) -> ciborium::Value {
        let mut map = MapBuilder::new()
            .text("dtype", self.dtype.as_str())
            .bool("truncate", self.truncate)
            .bool("normalize", self.normalize)
            .text("precision", self.precision.as_str());
        if let Some(prompt) = &self.prompt {
            map = map.text("prompt", prompt);
        }
        if let Some(dimensions) = self.dimensions {
            map = map.uint("dimensions", u64::from(dimensions));
        }
        if let Some(ranges) = &self.ranges {
            map = map.bytes("ranges", &ranges.to_bytes());
        }
        if self.output != OutputKind::Dense {
            map = map.text("output", self.output.as_str());
        }
        if let Some(top_k) = self.top_k {
            map = map.uint("top_k", u64::from(top_k));
        }
        if let Some(bytes) = self.max_record_bytes {
            map = map.uint("max_record_bytes", u64::from(bytes));
        }
        map.build()
    }

    pub fn read(mut map: MapReader) -> Result<Self, EnvelopeError> {
        let dtype = OutputDtype::parse(&map.text("dtype")?).ok_or(EnvelopeError::HeaderInvalid("unknown dtype"))?;
        let precision =
            Precision::parse(&map.text("precision")?).ok_or(EnvelopeError::HeaderInvalid("unknown precision"))?;
        let prompt = match map.optional("prompt") {
            None => None,
            Some(ciborium::Value::Text(name)) if valid_prompt_name(&name) => Some(name),
            Some(_) => return Err(EnvelopeError::HeaderInvalid("prompt")),
        };
        let dimensions = match map.optional("dimensions") {
            None => None,
            Some(value) => Some(
                value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0 && n as usize <= MAX_DIMENSIONS)
                    .ok_or(EnvelopeError::HeaderInvalid("dimensions"))?,
            ),
        };
        let ranges = match map.optional("ranges") {
            None => None,
            Some(ciborium::Value::Bytes(bytes)) => {
                Some(crate::quantize::Ranges::from_bytes(&bytes).map_err(|_| EnvelopeError::HeaderInvalid("ranges"))?)
            }
            Some(_) => return Err(EnvelopeError::HeaderInvalid("ranges")),
        };
        if ranges.is_some() != dtype.needs_ranges() {
            return Err(EnvelopeError::HeaderInvalid("ranges: present exactly for int8 and uint8 output"));
        }
        if let (Some(ranges), Some(dimensions)) = (&ranges, dimensions)
            && ranges.dimensions() != dimensions as usize
        {
            return Err(EnvelopeError::HeaderInvalid("ranges: one per dimension asked for"));
        }
        let output = match map.optional("output") {
            None => OutputKind::Dense,
            // Dense is the default and never written: one meaning, one encoding.
            Some(ciborium::Value::Text(kind)) => match OutputKind::parse(&kind) {
                Some(kind @ (OutputKind::Sparse | OutputKind::Scores | OutputKind::MultiVector)) => kind,
                Some(OutputKind::Dense) | None => return Err(EnvelopeError::HeaderInvalid("output")),
            },
            Some(_) => return Err(EnvelopeError::HeaderInvalid("output")),
        };
        let top_k = match map.optional("top_k") {
            None => None,
            Some(value) => Some(
                value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0 && n as usize <= MAX_SPARSE_DIMENSIONS)
                    .ok_or(EnvelopeError::HeaderInvalid("top_k"))?,
            ),
        };
        if output == OutputKind::Sparse && (dtype != OutputDtype::F32 || dimensions.is_some()) {
            return Err(EnvelopeError::HeaderInvalid("output: sparse weights are f32 at the model's own dimensions"));
        }
        if output == OutputKind::Scores && (dtype != OutputDtype::F32 || dimensions.is_some() || ranges.is_some()) {
            return Err(EnvelopeError::HeaderInvalid("output: scores are f32, one per document"));
        }
        if top_k.is_some() && output != OutputKind::Sparse {
            return Err(EnvelopeError::HeaderInvalid("top_k: for sparse output only"));
        }
        let max_record_bytes = match map.optional("max_record_bytes") {
            None => None,
            Some(value) => Some(
                value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0 && n <= MAX_RECORD_BYTES)
                    .ok_or(EnvelopeError::HeaderInvalid("max_record_bytes"))?,
            ),
        };
        if max_record_bytes.is_some() != (output == OutputKind::MultiVector) {
            return Err(EnvelopeError::HeaderInvalid("max_record_bytes: present exactly for multivector output"));
        }
        if output == OutputKind::MultiVector && (dtype != OutputDtype::F32 || dimensions.is_some() || ranges.is_some()) {
            return Err(EnvelopeError::HeaderInvalid("output: multi-vectors are f32 at the model's own dimensions"));
        }
        let options = Self {
            truncate: map.bool("truncate")?,
            normalize: map.bool("normalize")?,
            dtype,
            precision,
            prompt,
            dimensions,
            ranges,
            output,
            top_k,
            max_record_bytes,
        };
        map.finish()?;
        Ok(options)
    }
}

/// A prompt name (a job's `prompt` option, a manifest's prompts): 1 to 64 printable ASCII
/// characters.
pub fn valid_prompt_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}
