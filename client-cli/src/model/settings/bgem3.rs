//! bge-m3's lexical and ColBERT heads beside its dense vectors, as the published BAAI/bge-m3
//! directory holds them: `sparse_linear.pt` and `colbert_linear.pt`, each `torch.save` of a
//! `Linear`'s state dict, which FlagEmbedding's `BGEM3FlagModel` loads. They are torch pickles,
//! read here only (outside the enclave, with candle-core's reader of torch's zip archives: the
//! `torch-heads` feature) and sealed as safetensors ([`LEXICAL_HEAD_FILE`], [`COLBERT_HEAD_FILE`], f32 `weight` and `bias`),
//! listed and hashed in the manifest, whose `outputs` then offer `sparse` (the vocabulary's
//! width) and `multivector` (the ColBERT head's). Refused by file and field: another key, dtype
//! or shape; a head beside anything but XLM-RoBERTa with CLS pooling and no Dense module; a
//! tokenizer whose `<s>`, `</s>`, `<pad>`, `<unk>` are not the tokens FlagEmbedding drops.

use std::path::Path;

use protocol::envelope::OutputKind;
use protocol::manifest::{COLBERT_HEAD_FILE, LEXICAL_HEAD_FILE, Pooling};
use protocol::records::MAX_SPARSE_DIMENSIONS;
use serde_json::Value;

use super::super::{ModelError, read_json};
use super::{ModelSettings, unsupported};

/// The heads' files in a bge-m3 directory, with the sealed name and output of each.
const HEADS: [(&str, &str, OutputKind); 2] =
    [("sparse_linear.pt", LEXICAL_HEAD_FILE, OutputKind::Sparse), ("colbert_linear.pt", COLBERT_HEAD_FILE, OutputKind::MultiVector)];

/// The tokenizer_config.json fields whose tokens FlagEmbedding drops from the lexical weights,
/// with the tokens the enclave drops (its `LEXICAL_DROPPED_TOKENS`).
const DROPPED: [(&str, &str); 4] = [("cls_token", "<s>"), ("eos_token", "</s>"), ("pad_token", "<pad>"), ("unk_token", "<unk>")];

/// One head, converted: its sealed name, output kind, dimensions and safetensors bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub file: &'static str,
    pub output: OutputKind,
    pub dimensions: u32,
    pub safetensors: Vec<u8>,
}

/// Whether the directory holds either head.
pub(super) fn has_heads(dir: &Path) -> bool {
    HEADS.iter().any(|(pt, _, _)| dir.join(pt).is_file())
}

/// The dense settings read as for any model, plus the heads.
pub(super) fn add_heads(dir: &Path, mut settings: ModelSettings) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.unwrap_or(Value::Null);
    if let Some(kind) = config.get("model_type").and_then(Value::as_str).filter(|&k| k != "xlm-roberta") {
        return Err(unsupported(&config_path, "model_type", kind, "bge-m3's heads are read beside XLM-RoBERTa only"));
    }
    if settings.pooling != Pooling::Cls || !settings.dense.is_empty() {
        let found = format!("{} pooling, {} Dense modules", settings.pooling.as_str(), settings.dense.len());
        return Err(unsupported(&dir.join("modules.json"), "type", found, "bge-m3's heads go beside CLS pooling without Dense modules"));
    }
    let tokenizer_path = dir.join("tokenizer_config.json");
    let tokenizer = read_json(&tokenizer_path)?.unwrap_or(Value::Null);
    for (field, token) in DROPPED {
        let found = tokenizer.get(field).map(|v| v.get("content").unwrap_or(v)).and_then(Value::as_str);
        if found != Some(token) {
            return Err(unsupported(&tokenizer_path, field, format!("{found:?}"), "the lexical weights drop <s>, </s>, <pad> and <unk>, XLM-RoBERTa's"));
        }
    }
    let hidden = settings.dimensions as usize;
    let vocabulary = config.get("vocab_size").and_then(Value::as_u64).filter(|&v| v > 0 && v as usize <= MAX_SPARSE_DIMENSIONS);
    for (pt, file, output) in HEADS {
        let path = dir.join(pt);
        if !path.is_file() {
            continue;
        }
        let (width, safetensors) = convert(&path, hidden, output == OutputKind::Sparse)?;
        let dimensions = match output {
            OutputKind::Sparse => vocabulary.ok_or_else(|| unsupported(&config_path, "vocab_size", config.get("vocab_size").cloned().unwrap_or(Value::Null), "the lexical weights index the vocabulary"))? as u32,
            _ => width as u32,
        };
        settings.heads.push(Head { file, output, dimensions, safetensors });
    }
    Ok(settings)
}

/// Built without the `torch-heads` feature (`make demo`'s build): the pickle is refused by name
/// rather than read by anything but candle-core's reader.
#[cfg(not(feature = "torch-heads"))]
fn convert(path: &Path, _hidden: usize, _lexical: bool) -> Result<(usize, Vec<u8>), ModelError> {
    let reason = "this build reads no torch pickles: build ephem-batch with --features torch-heads (make test's workspace build has it)";
    Err(unsupported(path, "(file)", "a torch pickle", reason))
}

/// A `Linear`'s state dict from a torch pickle: exactly `weight` `[out, hidden]` and `bias`
/// `[out]`, F32, F16 or BF16 (widened exactly to f32); `out` 1 for the lexical head, at most
/// MAX_DIMENSIONS for the ColBERT head. Returns `out` and the safetensors bytes.
#[cfg(feature = "torch-heads")]
fn convert(path: &Path, hidden: usize, lexical: bool) -> Result<(usize, Vec<u8>), ModelError> {
    use protocol::records::MAX_DIMENSIONS;
    let refused = |field: &'static str, found: String, reason: &'static str| unsupported(path, field, found, reason);
    let tensors = candle_core::pickle::read_all(path).map_err(|e| refused("(file)", e.to_string(), "not a torch.save of a Linear's state dict"))?;
    let mut names: Vec<&str> = tensors.iter().map(|(name, _)| name.as_str()).collect();
    names.sort_unstable();
    if names != ["bias", "weight"] {
        return Err(refused("(keys)", names.join(", "), "a Linear's state dict holds weight and bias only"));
    }
    let get = |name: &str| &tensors.iter().find(|(n, _)| n == name).expect("checked above").1;
    let (weight, bias) = (get("weight"), get("bias"));
    for (field, tensor) in [("weight", weight), ("bias", bias)] {
        if !matches!(tensor.dtype(), candle_core::DType::F32 | candle_core::DType::F16 | candle_core::DType::BF16) {
            return Err(refused(field, format!("{:?}", tensor.dtype()), "F32, F16 or BF16 only"));
        }
    }
    let out = match weight.dims() {
        &[out, inp] if inp == hidden && out > 0 && (if lexical { out == 1 } else { out <= MAX_DIMENSIONS }) => out,
        dims => {
            let reason = if lexical { "the lexical head is Linear(hidden_size, 1)" } else { "the ColBERT head is Linear(hidden_size, d), d at most 65,535" };
            return Err(refused("weight", format!("shape {dims:?}"), reason));
        }
    };
    if bias.dims() != [out] {
        return Err(refused("bias", format!("shape {:?}", bias.dims()), "one value per output of weight"));
    }
    let values = |t: &candle_core::Tensor| -> Result<Vec<u8>, ModelError> {
        let flat = t.to_dtype(candle_core::DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>());
        let flat = flat.map_err(|e| refused("(values)", e.to_string(), "unreadable tensor"))?;
        Ok(flat.iter().flat_map(|v| v.to_le_bytes()).collect())
    };
    let (w, b) = (values(weight)?, values(bias)?);
    let views = [
        ("bias", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![out], &b)),
        ("weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![out, hidden], &w)),
    ];
    let views = views.into_iter().map(|(n, v)| v.map(|v| (n, v))).collect::<Result<Vec<_>, _>>();
    let bytes = views
        .and_then(|views| safetensors::serialize(views, None))
        .map_err(|e| refused("(values)", e.to_string(), "not writable as safetensors"))?;
    Ok((out, bytes))
}

#[cfg(test)]
mod tests;
