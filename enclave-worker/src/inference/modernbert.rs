//! ModernBERT (transformers' `ModernBertModel`): its `config.json` spec and its tensor names. The
//! computation is the encoder's shared layer loop: pre-norm LayerNorm without bias (the first
//! layer's attention norm the identity, a final norm), GeGLU, no biases, rotary positions with a
//! base per layer kind, and local layers whose queries see `local_attention / 2` keys on either
//! side.
//!
//! Both forms of the config are read: the one the published checkpoints carry
//! (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`) and the one
//! transformers 5 writes (`layer_types`, `rope_parameters`); where both are present they must
//! agree. Every count is capped; a field the engine does not know, or a variant it does not
//! compute (biases, another activation, rope scaling), is refused by name.

use serde_json::{Map, Value};

use super::InferenceError;
use super::arch::{self, Activation, ArchConfig, Architecture, LayerAttention, Placement, count, theta, unsupported};
use super::arch::caps::{MAX_VOCAB, MAX_HIDDEN, MAX_HEADS, MAX_LAYERS, MAX_INTERMEDIATE};
use super::encoder::blocks::{Embeddings, Tensors};
use super::encoder::{FamilyWeights, Layer};


/// ModernBERT's trained length; the attention's memory grows with its square.
const MAX_POSITIONS: usize = 8192;

/// transformers' defaults when the config does not state them.
const DEFAULT_GLOBAL_EVERY: u64 = 3;
const DEFAULT_GLOBAL_THETA: f64 = 160_000.0;
const DEFAULT_LOCAL_THETA: f64 = 10_000.0;
const DEFAULT_LOCAL_ATTENTION: u64 = 128;

/// Fields the encoder computes with.
const COMPUTED: &[&str] = &[
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim",
    "max_position_embeddings", "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "hidden_activation",
    "local_attention", "global_attn_every_n_layers", "layer_types", "global_rope_theta", "local_rope_theta",
    "rope_parameters", "rope_scaling", "model_type",
];

/// Fields that do not change `ModernBertModel`'s output: training (dropouts, initialisation,
/// flash-attention determinism), the masked-LM and classifier heads, special token ids (the
/// tokenizer places the tokens), metadata. `layer_norm_eps` and `position_embedding_type` appear
/// in published configs but `ModernBertModel` reads neither.
const IGNORED: &[&str] = &[
    "architectures", "attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout",
    "initializer_range", "initializer_cutoff_factor", "deterministic_flash_attn", "gradient_checkpointing",
    "reference_compile", "repad_logits_with_grad", "sparse_prediction", "sparse_pred_ignore_index",
    "decoder_bias", "classifier_activation", "classifier_bias", "classifier_pooling", "tie_word_embeddings",
    "id2label", "label2id", "num_labels", "problem_type", "pad_token_id", "bos_token_id", "eos_token_id",
    "cls_token_id", "sep_token_id", "dtype", "torch_dtype", "transformers_version", "_name_or_path",
    "layer_norm_eps", "position_embedding_type", "use_cache", "output_attentions", "output_hidden_states",
    "return_dict",
];

/// `rope_parameters.{kind}`: the default rotary kind with its base, nothing else.
fn rope_kind(parameters: &Map<String, Value>, kind: &str) -> Result<Option<f32>, InferenceError> {
    let Some(entry) = parameters.get(kind).filter(|v| !v.is_null()) else { return Ok(None) };
    let name = format!("rope_parameters.{kind}");
    let entry = entry.as_object().ok_or_else(|| unsupported(&name, entry, "not an object"))?;
    for (key, value) in entry {
        match key.as_str() {
            "rope_type" if value == "default" => {}
            "rope_type" => return Err(unsupported(format!("{name}.rope_type"), value, "only the default rotary kind is computed")),
            "rope_theta" => {}
            _ => return Err(unsupported(format!("{name}.{key}"), value, "a rotary setting the engine does not compute")),
        }
    }
    entry.get("rope_theta").map(|t| theta(&format!("{name}.rope_theta"), t)).transpose()
}

/// The two rotary bases (global, local), from `rope_parameters` or the published form's fields.
fn thetas(config: &Value) -> Result<(f32, f32), InferenceError> {
    let legacy = |name: &str, default: f64| -> Result<(f32, bool), InferenceError> {
        match arch::field(config, name) {
            Some(v) => Ok((theta(name, v)?, true)),
            None => Ok((default as f32, false)),
        }
    };
    let (global, global_stated) = legacy("global_rope_theta", DEFAULT_GLOBAL_THETA)?;
    let (local, local_stated) = legacy("local_rope_theta", DEFAULT_LOCAL_THETA)?;
    let Some(parameters) = arch::field(config, "rope_parameters") else { return Ok((global, local)) };
    let parameters = parameters.as_object().ok_or_else(|| unsupported("rope_parameters", parameters, "not an object"))?;
    if let Some(key) = parameters.keys().find(|k| !matches!(k.as_str(), "full_attention" | "sliding_attention")) {
        return Err(unsupported(format!("rope_parameters.{key}"), &parameters[key], "not a layer kind ModernBERT has"));
    }
    // transformers takes rope_parameters' bases over the published fields; both stated must agree.
    let pick = |kind: &str, stated: (f32, bool), field: &str| -> Result<f32, InferenceError> {
        match (rope_kind(parameters, kind)?, stated) {
            (Some(t), (other, true)) if t != other => Err(unsupported(field, other, "disagrees with rope_parameters")),
            (Some(t), _) => Ok(t),
            (None, (other, _)) => Ok(other),
        }
    };
    Ok((
        pick("full_attention", (global, global_stated), "global_rope_theta")?,
        pick("sliding_attention", (local, local_stated), "local_rope_theta")?,
    ))
}

/// Which layers are local: `layer_types`, or every layer but each `global_attn_every_n_layers`-th.
fn local_layers(config: &Value, layers: usize) -> Result<Vec<bool>, InferenceError> {
    let every = count(config, "global_attn_every_n_layers", Some(DEFAULT_GLOBAL_EVERY), MAX_LAYERS)?;
    let from_every: Vec<bool> = (0..layers).map(|i| i % every != 0).collect();
    let Some(types) = arch::field(config, "layer_types") else { return Ok(from_every) };
    let types = types.as_array().filter(|t| t.len() == layers).ok_or_else(|| unsupported("layer_types", types, "not one entry per layer"))?;
    let local = types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(false),
            Some("sliding_attention") => Ok(true),
            _ => Err(unsupported("layer_types", t, "not full_attention or sliding_attention")),
        })
        .collect::<Result<Vec<bool>, _>>()?;
    if arch::field(config, "global_attn_every_n_layers").is_some() && local != from_every {
        return Err(unsupported("layer_types", types.len(), "disagrees with global_attn_every_n_layers"));
    }
    Ok(local)
}

/// Reads a ModernBERT `config.json` (already a JSON object whose `model_type` is `modernbert`).
pub(crate) fn parse(config: &Value) -> Result<ArchConfig, InferenceError> {
    let object = config.as_object().ok_or_else(|| InferenceError::Config("not a JSON object".into()))?;
    if let Some((key, value)) = object.iter().find(|(k, _)| !COMPUTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str())) {
        return Err(unsupported(key.as_str(), value, "a field the engine does not know"));
    }
    let hidden = count(config, "hidden_size", None, MAX_HIDDEN)?;
    let heads = count(config, "num_attention_heads", None, MAX_HEADS)?;
    if !hidden.is_multiple_of(heads) || !(hidden / heads).is_multiple_of(2) {
        return Err(unsupported("num_attention_heads", heads, "hidden_size / num_attention_heads must be an even head size"));
    }
    if let Some(d) = arch::field(config, "head_dim")
        && d.as_u64() != Some((hidden / heads) as u64)
    {
        return Err(unsupported("head_dim", d, "the attention's head size is hidden_size / num_attention_heads"));
    }
    let layers = count(config, "num_hidden_layers", None, MAX_LAYERS)?;
    let positions = count(config, "max_position_embeddings", Some(MAX_POSITIONS as u64), MAX_POSITIONS)?;
    let eps = match arch::field(config, "norm_eps") {
        None => 1e-5,
        Some(v) => v.as_f64().filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0).ok_or_else(|| unsupported("norm_eps", v, "not in (0, 1)"))?,
    };
    for flag in ["norm_bias", "attention_bias", "mlp_bias"] {
        if let Some(v) = arch::field(config, flag)
            && v != false
        {
            return Err(unsupported(flag, v, "ModernBERT with biases is not computed"));
        }
    }
    let activation = arch::text(config, "hidden_activation", "gelu")?;
    if activation != "gelu" {
        return Err(unsupported("hidden_activation", format!("{activation:?}"), "the engine computes erf GELU"));
    }
    if let Some(v) = arch::field(config, "rope_scaling") {
        return Err(unsupported("rope_scaling", v, "rotary scaling is not computed"));
    }
    let local_attention = count(config, "local_attention", Some(DEFAULT_LOCAL_ATTENTION), 2 * MAX_POSITIONS)?;
    let (global, local) = thetas(config)?;
    let attention = local_layers(config, layers)?
        .into_iter()
        .map(|is_local| match is_local {
            true => LayerAttention { rotary_base: Some(local), window: Some(local_attention / 2), causal: false },
            false => LayerAttention { rotary_base: Some(global), window: None, causal: false },
        })
        .collect();
    Ok(ArchConfig {
        arch: Architecture::ModernBert,
        vocab_size: count(config, "vocab_size", None, MAX_VOCAB)?,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim: hidden / heads,
        intermediate_size: count(config, "intermediate_size", None, MAX_INTERMEDIATE)?,
        max_position_embeddings: positions,
        type_vocab_size: 0,
        layer_norm_eps: eps,
        padding_idx: None,
        hidden_act: activation.to_owned(),
        position_embedding_type: "rotary".to_owned(),
        placement: Placement::Pre,
        activation: Activation::GeGlu,
        attention,
        query_scale: None,
    })
}

/// ModernBERT's tensor names (`model.` first when saved from a task model).
pub(crate) fn weights(t: &Tensors<'_>, config: &ArchConfig) -> Result<FamilyWeights, InferenceError> {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for (i, &attention) in config.attention.iter().enumerate() {
        let p = format!("layers.{i}");
        layers.push(Layer {
            qkv: t.linear(&format!("{p}.attn.Wqkv"), 3 * hidden, hidden, false)?,
            out: t.linear(&format!("{p}.attn.Wo"), hidden, hidden, false)?,
            // The first layer's attention norm is the identity: it has no weights.
            attn_norm: if i == 0 { None } else { Some(t.norm(&format!("{p}.attn_norm"), hidden, false)?) },
            qk_norm: None,
            sandwich: None,
            ff1: t.linear(&format!("{p}.mlp.Wi"), 2 * inter, hidden, false)?,
            ff2: t.linear(&format!("{p}.mlp.Wo"), hidden, inter, false)?,
            ff_norm: t.norm(&format!("{p}.mlp_norm"), hidden, false)?,
            attention,
        });
    }
    Ok(FamilyWeights {
        embeddings: Embeddings {
            word: t.values("embeddings.tok_embeddings.weight", &[config.vocab_size, hidden])?,
            position: None,
            token_type: Vec::new(),
            second_type: None,
            norm: Some(t.norm("embeddings.norm", hidden, false)?),
        },
        layers,
        final_norm: Some(t.norm("final_norm", hidden, false)?),
        relative: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/models/modernbert/v6-mean/config.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn parse_with(edit: impl Fn(&mut Map<String, Value>)) -> Result<ArchConfig, InferenceError> {
        let mut config = base();
        edit(config.as_object_mut().unwrap());
        ArchConfig::parse(&serde_json::to_vec(&config).unwrap())
    }

    fn refused_field(result: Result<ArchConfig, InferenceError>) -> String {
        match result {
            Err(InferenceError::UnsupportedSetting { file: "config.json", field, .. }) => field,
            other => panic!("not refused by field: {other:?}"),
        }
    }

    #[test]
    fn the_generated_config_reads_as_its_layers() {
        let config = parse_with(|_| {}).unwrap();
        assert_eq!(config.arch, Architecture::ModernBert);
        assert_eq!((config.hidden_size, config.num_attention_heads, config.intermediate_size, config.max_tokens()), (36, 3, 38, 8192));
        let global = LayerAttention { rotary_base: Some(160_000.0), window: None, causal: false };
        let local = LayerAttention { rotary_base: Some(10_000.0), window: Some(8), causal: false };
        assert_eq!(config.attention, [global, local, local, global]);
        // The published form says the same with its own fields.
        let published = parse_with(|c| {
            c.remove("layer_types");
            c.remove("rope_parameters");
            c.insert("global_rope_theta".into(), 160_000.0.into());
            c.insert("local_rope_theta".into(), 10_000.0.into());
            c.insert("position_embedding_type".into(), "absolute".into());
        })
        .unwrap();
        assert_eq!(published.attention, config.attention);
    }

    #[test]
    fn unknown_fields_variants_and_counts_are_refused_by_name() {
        type Edit = Box<dyn Fn(&mut Map<String, Value>)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("fancy_new_flag", Box::new(|c| { c.insert("fancy_new_flag".into(), true.into()); })),
            ("norm_bias", Box::new(|c| { c.insert("norm_bias".into(), true.into()); })),
            ("attention_bias", Box::new(|c| { c.insert("attention_bias".into(), true.into()); })),
            ("mlp_bias", Box::new(|c| { c.insert("mlp_bias".into(), true.into()); })),
            ("hidden_activation", Box::new(|c| { c.insert("hidden_activation".into(), "gelu_pytorch_tanh".into()); })),
            ("rope_scaling", Box::new(|c| { c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "linear", "factor": 2.0})); })),
            ("rope_parameters.full_attention.rope_type", Box::new(|c| { c["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into(); })),
            ("rope_parameters.sliding_attention.factor", Box::new(|c| { c["rope_parameters"]["sliding_attention"]["factor"] = 4.0.into(); })),
            ("global_rope_theta", Box::new(|c| { c.insert("global_rope_theta".into(), 10_000.0.into()); })),
            ("layer_types", Box::new(|c| { c["layer_types"][1] = "full_attention".into(); })),
            ("layer_types", Box::new(|c| { c["layer_types"][1] = "chunked_attention".into(); })),
            ("max_position_embeddings", Box::new(|c| { c.insert("max_position_embeddings".into(), 8193.into()); })),
            ("num_hidden_layers", Box::new(|c| { c.insert("num_hidden_layers".into(), 0.into()); })),
            ("num_attention_heads", Box::new(|c| { c.insert("num_attention_heads".into(), 4.into()); })),
            ("head_dim", Box::new(|c| { c.insert("head_dim".into(), 16.into()); })),
            ("hidden_size", Box::new(|c| { c.insert("hidden_size".into(), 1_000_000.into()); })),
        ];
        for (field, edit) in cases {
            assert_eq!(refused_field(parse_with(edit)), field);
        }
    }
}
