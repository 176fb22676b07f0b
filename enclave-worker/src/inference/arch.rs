//! The encoder architectures the fused encoder computes, read from the model's `config.json`
//! (`model_type`): BERT, XLM-RoBERTa, MPNet, ModernBERT, Qwen3 and Gemma 3's text body (their
//! specs and tensor names: [`super::modernbert`], [`super::qwen3`], [`super::gemma3`]) and
//! NomicBERT ([`super::nomic_bert`]) and GTE ([`super::gte`]). `config.json` is one of the files the signed manifest hashes, so a
//! host cannot change the architecture a model is run as.
//!
//! Each architecture is a [`ArchConfig`]: the sizes, where the norms sit ([`Placement`]), the
//! feed-forward activation ([`Activation`]) and each layer's attention ([`LayerAttention`]:
//! rotary base, local window); the encoder's one layer loop computes all of them.
//!
//! What differs between them (facts from the transformers documentation and configs):
//!
//! | | BERT | XLM-RoBERTa | MPNet |
//! |---|---|---|---|
//! | position of token `p` | `p` | `padding_idx + 1 + p` (a `<pad>` token: `padding_idx`) | as XLM-RoBERTa, `padding_idx` always 1 |
//! | usable tokens | `max_position_embeddings` | `max_position_embeddings − padding_idx − 1` | as XLM-RoBERTa |
//! | token types | row 0 of `type_vocab_size` | the single row | none |
//! | attention | `softmax(q·kᵀ/√d)` | as BERT | `+ bias[bucket(j − i)][head]`, one table for all layers |
//! | tensor names | `encoder.layer.N.attention.self.query` … | as BERT | `encoder.layer.N.attention.attn.q` … |
//!
//! MPNet's buckets are T5's bidirectional ones: 32 buckets, half per direction; distances below
//! 8 exact, then logarithmic up to 128, beyond which they share the last bucket.

use serde_json::Value;

use super::InferenceError;

/// Buckets of MPNet's relative position table: transformers computes them for 32 whatever the
/// config says, so a config with another count is refused (the table rows would not match).
pub(crate) const MPNET_BUCKETS: usize = 32;
/// Beyond this distance MPNet's buckets stop growing.
const MPNET_MAX_DISTANCE: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Bert,
    XlmRoberta,
    MpNet,
    ModernBert,
    Qwen3,
    /// Gemma 3's text body with bidirectional attention (EmbeddingGemma), `model_type`
    /// `"gemma3_text"`.
    Gemma3,
    /// NomicBERT (nomic-embed-text), `model_type` `"nomic_bert"`.
    NomicBert,
    /// GTE v1.5 / mGTE (Alibaba's rotary encoder), `model_type` `"gte"`.
    Gte,
}

/// Where a layer's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// BERT: `x ← Norm(x + Attention(x))`, `x ← Norm(x + FFN(x))`, after the embedding's norm.
    Post,
    /// ModernBERT: `x ← x + Attention(Norm(x))`, `x ← x + FFN(Norm(x))`, a final norm after the
    /// last layer; the first layer's attention norm may be absent (identity).
    Pre,
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// `gelu(x·W1 + b1)`, erf GELU.
    Gelu,
    /// `gelu(a) · g` with `[a | g] = x·W1 + b1`: the first linear layer is twice the width.
    GeGlu,
    /// `silu(g) · u` with `[g | u] = x·W1` (Qwen3's gate and up projections fused at load).
    SwiGlu,
    /// `gelu_tanh(g) · u` with `[g | u] = x·W1` (Gemma's `gelu_pytorch_tanh`).
    GeGluTanh,
}

/// One layer's attention: softmax over the sequence, bidirectional or causal, optionally with
/// rotary positions and a local window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayerAttention {
    /// The rotary base (`rope_theta`), or none (absolute positions at the embedding).
    pub rotary_base: Option<f32>,
    /// A query sees only keys at most this far from it (`|i − j| ≤ window`), or every key.
    pub window: Option<usize>,
    /// A query sees no key after it (decoders: Qwen3).
    pub causal: bool,
}

impl LayerAttention {
    pub(crate) const GLOBAL: Self = Self { rotary_base: None, window: None, causal: false };
}

impl Architecture {
    /// The `model_type` of `config.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Bert => "bert",
            Architecture::XlmRoberta => "xlm-roberta",
            Architecture::MpNet => "mpnet",
            Architecture::ModernBert => "modernbert",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3_text",
            Architecture::NomicBert => "nomic_bert",
            Architecture::Gte => "gte",
        }
    }

    /// The prefix of the tensor names when the checkpoint was saved from a task model
    /// (`BertForMaskedLM` …) rather than the bare encoder.
    pub(crate) fn weight_prefix(self) -> &'static str {
        match self {
            Architecture::Bert => "bert.",
            Architecture::XlmRoberta => "roberta.",
            Architecture::MpNet => "mpnet.",
            Architecture::ModernBert | Architecture::Qwen3 | Architecture::Gemma3 => "model.",
            Architecture::NomicBert => "nomic_bert.",
            Architecture::Gte => "new.",
        }
    }
}

/// What the fused encoder needs from `config.json`, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ArchConfig {
    pub arch: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Key/value heads: fewer than the query heads in grouped-query attention (Qwen3), each shared
    /// by `num_attention_heads / num_key_value_heads` query heads in order.
    pub num_key_value_heads: usize,
    /// Each head's width: `hidden_size / num_attention_heads` but where a config states another.
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    /// 0 for MPNet (no token type embeddings).
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    /// The padding index positions are offset by (XLM-RoBERTa, MPNet); `None` for BERT.
    pub padding_idx: Option<u32>,
    /// Checked by [`ArchConfig::fused_computes`]: BERT models the fused encoder does not compute
    /// fall back to candle's `BertModel`, the others are refused.
    pub hidden_act: String,
    pub position_embedding_type: String,
    pub placement: Placement,
    pub activation: Activation,
    /// One per layer.
    pub attention: Vec<LayerAttention>,
    /// What scores are multiplied by before the softmax, where not `1/√head_dim` (Gemma:
    /// `query_pre_attn_scalar^−0.5`).
    pub query_scale: Option<f32>,
}

pub(crate) fn field<'a>(config: &'a Value, name: &str) -> Option<&'a Value> {
    config.get(name).filter(|v| !v.is_null())
}

pub(crate) fn size(config: &Value, name: &str) -> Result<usize, InferenceError> {
    let value = field(config, name).ok_or_else(|| InferenceError::Config(format!("{name}: missing")))?;
    value
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v > 0 && v <= 1 << 24)
        .ok_or_else(|| InferenceError::Config(format!("{name}: {value} is not a size")))
}

pub(crate) fn text<'a>(config: &'a Value, name: &str, default: &'a str) -> Result<&'a str, InferenceError> {
    match field(config, name) {
        None => Ok(default),
        Some(v) => v.as_str().ok_or_else(|| InferenceError::Config(format!("{name}: not a string"))),
    }
}

impl ArchConfig {
    /// Reads `config.json`. A `model_type` other than the three is refused by name (a BERT
    /// computation over, say, a RoBERTa checkpoint would silently give other vectors), as is any
    /// setting the fused encoder does not compute exactly.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, InferenceError> {
        let config: Value = serde_json::from_slice(bytes).map_err(|e| InferenceError::Config(e.to_string()))?;
        if !config.is_object() {
            return Err(InferenceError::Config("not a JSON object".into()));
        }
        let arch = match text(&config, "model_type", "bert")? {
            "bert" => Architecture::Bert,
            "xlm-roberta" => Architecture::XlmRoberta,
            "mpnet" => Architecture::MpNet,
            "modernbert" => return super::modernbert::parse(&config),
            "qwen3" => return super::qwen3::parse(&config),
            "gemma3_text" => return super::gemma3::parse(&config),
            "nomic_bert" => return super::nomic_bert::parse(&config),
            "gte" => return super::gte::parse(&config),
            other => return Err(InferenceError::UnsupportedArchitecture(format!("model_type {other:?}"))),
        };
        let hidden_size = size(&config, "hidden_size")?;
        let num_attention_heads = size(&config, "num_attention_heads")?;
        if !hidden_size.is_multiple_of(num_attention_heads) {
            return Err(InferenceError::Config(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"
            )));
        }
        let max_position_embeddings = size(&config, "max_position_embeddings")?;
        let layer_norm_eps = match field(&config, "layer_norm_eps") {
            None => 1e-12,
            Some(v) => v
                .as_f64()
                .filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0)
                .ok_or_else(|| InferenceError::Config(format!("layer_norm_eps: {v}")))?,
        };
        let unsupported = |what: String| Err(InferenceError::UnsupportedArchitecture(format!("{}: {what}", arch.as_str())));
        let (type_vocab_size, padding_idx) = match arch {
            Architecture::Bert => (size(&config, "type_vocab_size")?, None),
            Architecture::XlmRoberta => {
                // transformers offsets positions by the config's pad_token_id.
                let pad = field(&config, "pad_token_id")
                    .and_then(Value::as_u64)
                    .and_then(|p| u32::try_from(p).ok())
                    .ok_or_else(|| InferenceError::Config("pad_token_id: missing or not an integer".into()))?;
                (size(&config, "type_vocab_size")?, Some(pad))
            }
            // Returned above from their own specs; never read as BERT-family configs.
            Architecture::ModernBert | Architecture::Qwen3 | Architecture::Gemma3 | Architecture::NomicBert | Architecture::Gte => {
                return Err(InferenceError::Config(format!("{}: not a BERT-family config", arch.as_str())));
            }
            Architecture::MpNet => {
                let buckets = field(&config, "relative_attention_num_buckets").map_or(Some(32), Value::as_u64);
                if buckets != Some(MPNET_BUCKETS as u64) {
                    return unsupported(format!(
                        "relative_attention_num_buckets {buckets:?} (transformers computes {MPNET_BUCKETS} buckets)"
                    ));
                }
                // MPNet's embeddings use padding index 1 whatever pad_token_id says.
                (0, Some(1))
            }
        };
        if let Some(pad) = padding_idx
            && max_position_embeddings <= pad as usize + 1
        {
            return Err(InferenceError::Config(format!(
                "max_position_embeddings {max_position_embeddings} leaves no position after padding_idx {pad}"
            )));
        }
        let num_hidden_layers = size(&config, "num_hidden_layers")?;
        Ok(Self {
            arch,
            vocab_size: size(&config, "vocab_size")?,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: num_attention_heads,
            head_dim: hidden_size / num_attention_heads,
            intermediate_size: size(&config, "intermediate_size")?,
            max_position_embeddings,
            type_vocab_size,
            layer_norm_eps,
            padding_idx,
            hidden_act: text(&config, "hidden_act", "gelu")?.to_owned(),
            position_embedding_type: text(&config, "position_embedding_type", "absolute")?.to_owned(),
            placement: Placement::Post,
            activation: Activation::Gelu,
            attention: vec![LayerAttention::GLOBAL; num_hidden_layers],
            query_scale: None,
        })
    }

    /// Whether the fused encoder computes this model exactly; if not, why (naming the field).
    pub(crate) fn fused_computes(&self) -> Result<(), String> {
        if matches!(self.arch, Architecture::ModernBert | Architecture::Qwen3 | Architecture::Gemma3 | Architecture::NomicBert | Architecture::Gte) {
            // Their specs refused at parse what the encoder does not compute.
            return Ok(());
        }
        if self.hidden_act != "gelu" {
            return Err(format!("hidden_act {:?} (the fused encoder computes erf GELU)", self.hidden_act));
        }
        if self.position_embedding_type != "absolute" {
            return Err(format!("position_embedding_type {:?}", self.position_embedding_type));
        }
        Ok(())
    }

    /// The most tokens one sequence may have (specials included): the position table less the
    /// offset.
    pub(crate) fn max_tokens(&self) -> usize {
        self.max_position_embeddings - self.padding_idx.map_or(0, |p| p as usize + 1)
    }
}

/// Position ids of one sequence, as transformers computes them: `p` for BERT; for the offset
/// architectures the padding index for a padding token and `padding_idx + 1 + (non-padding
/// tokens before it)` otherwise — a `<pad>` typed into a text is a real token to the attention
/// mask but does not advance the position.
pub(crate) fn positions(ids: &[u32], padding_idx: Option<u32>, out: &mut Vec<usize>) {
    match padding_idx {
        None => out.extend(0..ids.len()),
        Some(pad) => {
            let mut next = pad as usize;
            out.extend(ids.iter().map(|&id| {
                if id == pad {
                    pad as usize
                } else {
                    next += 1;
                    next
                }
            }));
        }
    }
}

/// MPNet's bucket for a key at `relative = key − query` positions from its query: T5's
/// bidirectional bucketing with 32 buckets and maximum distance 128, computed in f32 as
/// transformers does (the logarithmic part is truncated toward zero).
pub(crate) fn mpnet_bucket(relative: i64) -> usize {
    let half = (MPNET_BUCKETS / 2) as i64;
    let max_exact = half / 2;
    let n = -relative;
    let base = if n < 0 { half } else { 0 };
    let n = n.abs();
    if n < max_exact {
        return (base + n) as usize;
    }
    let log_ratio = (n as f32 / max_exact as f32).ln();
    let log_span = (MPNET_MAX_DISTANCE as f64 / max_exact as f64).ln() as f32;
    let large = max_exact + (log_ratio / log_span * (half - max_exact) as f32) as i64;
    (base + large.min(half - 1)) as usize
}

/// MPNet's relative position bias for every distance the encoder can meet, per head:
/// `table[head][j − i + span − 1]` for query `i`, key `j`, with `span` = the most tokens of a
/// sequence. A query row's biases are then one contiguous slice: `[span − 1 − i, span − 1 − i + n)`.
pub(crate) struct RelativeBias {
    /// `(heads, 2·span − 1)`.
    table: Vec<f32>,
    span: usize,
}

impl RelativeBias {
    /// `weights`: the `(buckets, heads)` embedding `encoder.relative_attention_bias.weight`.
    pub(crate) fn new(weights: &[f32], heads: usize, span: usize) -> Self {
        let width = 2 * span - 1;
        let mut table = vec![0f32; heads * width];
        for k in 0..width {
            let bucket = mpnet_bucket(k as i64 - (span as i64 - 1));
            for head in 0..heads {
                table[head * width + k] = weights[bucket * heads + head];
            }
        }
        Self { table, span }
    }

    /// The biases of query `i`'s keys `0..n` in `head`.
    #[inline(always)]
    pub(crate) fn row(&self, head: usize, i: usize, n: usize) -> &[f32] {
        let width = 2 * self.span - 1;
        let start = head * width + self.span - 1 - i;
        &self.table[start..start + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_t5_bidirectional_bucketing() {
        // Keys before the query (relative < 0) take buckets 0..16, keys after it 16..32.
        assert_eq!(mpnet_bucket(0), 0);
        assert_eq!(mpnet_bucket(-1), 1);
        assert_eq!(mpnet_bucket(-7), 7);
        assert_eq!(mpnet_bucket(1), 17);
        assert_eq!(mpnet_bucket(7), 23);
        assert_eq!(mpnet_bucket(-8), 8);
        assert_eq!(mpnet_bucket(-128), 15);
        assert_eq!(mpnet_bucket(-10_000), 15);
        assert_eq!(mpnet_bucket(10_000), 31);
        let mut last = 0;
        for d in 0..600 {
            let b = mpnet_bucket(-d);
            assert!(b >= last && b < 16, "{d}: {b}");
            last = b;
        }
    }

    /// transformers' own buckets for every distance from −700 to 700, written by the generator.
    #[test]
    fn buckets_equal_transformers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/models/reference.json");
        let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let from = doc["buckets"]["from"].as_i64().unwrap();
        let values = doc["buckets"]["values"].as_array().unwrap();
        assert_eq!(values.len(), 1401);
        for (k, expected) in values.iter().enumerate() {
            let relative = from + k as i64;
            assert_eq!(mpnet_bucket(relative) as u64, expected.as_u64().unwrap(), "key − query = {relative}");
        }
    }

    #[test]
    fn offset_positions_skip_padding_tokens() {
        let mut out = Vec::new();
        positions(&[0, 5, 1, 7, 2], Some(1), &mut out);
        assert_eq!(out, [2, 3, 1, 4, 5]);
        out.clear();
        positions(&[0, 5, 1], None, &mut out);
        assert_eq!(out, [0, 1, 2]);
    }

    #[test]
    fn bias_rows_are_the_buckets_of_each_distance() {
        let (heads, span) = (2, 20);
        let weights: Vec<f32> = (0..MPNET_BUCKETS * heads).map(|v| v as f32).collect();
        let bias = RelativeBias::new(&weights, heads, span);
        for n in [1, 7, 20] {
            for i in 0..n {
                for head in 0..heads {
                    let row = bias.row(head, i, n);
                    for (j, &b) in row.iter().enumerate() {
                        assert_eq!(b, weights[mpnet_bucket(j as i64 - i as i64) * heads + head]);
                    }
                }
            }
        }
    }

    #[test]
    fn unknown_architectures_and_settings_are_refused_by_name() {
        let base = serde_json::json!({
            "model_type": "xlm-roberta", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 20,
            "type_vocab_size": 1, "pad_token_id": 1, "hidden_act": "gelu"
        });
        let parse = |edit: &dyn Fn(&mut Value)| {
            let mut c = base.clone();
            edit(&mut c);
            ArchConfig::parse(&serde_json::to_vec(&c).unwrap())
        };
        let ok = parse(&|_| {}).unwrap();
        assert_eq!((ok.arch, ok.max_tokens(), ok.padding_idx), (Architecture::XlmRoberta, 18, Some(1)));
        let err = parse(&|c| c["model_type"] = "roberta".into()).unwrap_err();
        assert!(matches!(&err, InferenceError::UnsupportedArchitecture(m) if m.contains("\"roberta\"")), "{err}");
        let err = parse(&|c| c["hidden_act"] = "gelu_new".into()).unwrap().fused_computes().unwrap_err();
        assert!(err.contains("hidden_act"), "{err}");
        let err = parse(&|c| c["position_embedding_type"] = "relative_key".into()).unwrap().fused_computes().unwrap_err();
        assert!(err.contains("position_embedding_type"), "{err}");
        let err = parse(&|c| c.as_object_mut().unwrap().remove("pad_token_id").map(|_| ()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("pad_token_id"), "{err}");
        let err = parse(&|c| {
            c["model_type"] = "mpnet".into();
            c["relative_attention_num_buckets"] = 64.into();
        })
        .unwrap_err();
        assert!(err.to_string().contains("relative_attention_num_buckets"), "{err}");
        let mpnet = parse(&|c| {
            c["model_type"] = "mpnet".into();
            c["pad_token_id"] = 0.into();
        })
        .unwrap();
        assert_eq!((mpnet.padding_idx, mpnet.type_vocab_size), (Some(1), 0), "MPNet's padding index is always 1");
        let bert = parse(&|c| c["model_type"] = "bert".into()).unwrap();
        assert_eq!((bert.max_tokens(), bert.padding_idx), (20, None));
        let err = parse(&|c| c["num_attention_heads"] = 3.into()).unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
    }
}

/// A setting of `config.json` the engine does not compute, by field (the family specs').
pub(crate) fn unsupported(field: impl Into<String>, found: impl std::fmt::Display, reason: &'static str) -> InferenceError {
    InferenceError::UnsupportedSetting { file: "config.json", field: field.into(), found: found.to_string(), reason }
}

/// A count: present (or its default), an integer in `1..=max`.
/// The counts every family's config spec caps (a config over one is refused by field).
pub(crate) mod caps {
    pub(crate) const MAX_VOCAB: usize = 1 << 20;
    pub(crate) const MAX_HIDDEN: usize = 8192;
    pub(crate) const MAX_HEADS: usize = 128;
    pub(crate) const MAX_HEAD_DIM: usize = 512;
    pub(crate) const MAX_LAYERS: usize = 96;
    pub(crate) const MAX_INTERMEDIATE: usize = 65_536;
    pub(crate) const MAX_TOKEN_TYPES: usize = 1024;
}

pub(crate) fn count(config: &Value, name: &str, default: Option<u64>, max: usize) -> Result<usize, InferenceError> {
    let value = match (field(config, name), default) {
        (Some(v), _) => v.clone(),
        (None, Some(d)) => Value::from(d),
        (None, None) => return Err(unsupported(name, "(absent)", "must be stated")),
    };
    value
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .filter(|&v| v >= 1 && v <= max)
        .ok_or_else(|| unsupported(name, &value, "not a count within the engine's cap"))
}

/// A rotary base: finite, above 1, at most 1e9.
pub(crate) fn theta(name: &str, value: &Value) -> Result<f32, InferenceError> {
    value
        .as_f64()
        .filter(|t| t.is_finite() && *t > 1.0 && *t <= 1e9)
        .map(|t| t as f32)
        .ok_or_else(|| unsupported(name, value, "not a rotary base (1, 1e9]"))
}

/// One rotary base for every layer (Qwen3, NomicBERT): `rope_parameters` (the default kind, nothing else) over `rope_theta`, both
/// stated must agree; the architecture's default otherwise.
pub(crate) fn rotary_base(config: &Value, default: f32) -> Result<f32, InferenceError> {
    if let Some(v) = field(config, "rope_scaling") {
        return Err(unsupported("rope_scaling", v, "rotary scaling is not computed"));
    }
    let stated = field(config, "rope_theta").map(|t| theta("rope_theta", t)).transpose()?;
    let Some(parameters) = field(config, "rope_parameters") else { return Ok(stated.unwrap_or(default)) };
    let parameters: &serde_json::Map<String, Value> =
        parameters.as_object().ok_or_else(|| unsupported("rope_parameters", parameters, "not an object"))?;
    for (key, value) in parameters {
        match key.as_str() {
            "rope_type" if value == "default" => {}
            "rope_type" => return Err(unsupported("rope_parameters.rope_type", value, "only the default rotary kind is computed")),
            "rope_theta" => {}
            _ => return Err(unsupported(format!("rope_parameters.{key}"), value, "a rotary setting the engine does not compute")),
        }
    }
    let from_parameters = parameters.get("rope_theta").map(|t| theta("rope_parameters.rope_theta", t)).transpose()?;
    match (from_parameters, stated) {
        (Some(t), Some(other)) if t != other => Err(unsupported("rope_theta", other, "disagrees with rope_parameters")),
        (Some(t), _) | (None, Some(t)) => Ok(t),
        (None, None) => Ok(default),
    }
}
