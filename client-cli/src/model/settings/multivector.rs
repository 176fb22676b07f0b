//! A ColBERT model's directory, as sentence-transformers 6.x's `MultiVectorEncoder` saves it:
//! Transformer at the root, a token-level Dense (the projection), `MultiVectorMask`, a
//! token-level `Normalize`. The engine computes a document's vectors: every real token's state
//! projected and normalised. What would make another text's vectors differ is refused by file and
//! field: a skiplist or a keep-list (tokens dropped), query expansion, prompts with text, token
//! pooling or any other module, a pooled Dense, another task. The manifest's dimensions are the
//! projection's width.

use std::path::Path;

use protocol::manifest::Pooling;
use protocol::records::MAX_DIMENSIONS;
use serde_json::Value;

use super::super::{ModelError, read_json};
use super::{ModelSettings, check_architecture, config_error, module_folder, module_kinds, object, positive_field, read_dense_of, read_max_tokens, read_prompts, unsupported};

const TOKEN_EMBEDDINGS: &str = "token_embeddings";

/// Whether the directory is a multi-vector encoder's: modules.json names a `MultiVectorMask`,
/// config_sentence_transformers.json says `MultiVectorEncoder` (or PyLate's `ColBERT`), or
/// config.json is Stanford-NLP's `HF_ColBERT` (which would otherwise read as a mean-pooled model).
pub(super) fn is_multi_vector_encoder(dir: &Path) -> Result<bool, ModelError> {
    let masked = match read_json(&dir.join("modules.json"))? {
        Some(modules) => module_kinds(&modules).iter().any(|(kind, _)| *kind == "MultiVectorMask"),
        None => false,
    };
    let named = read_json(&dir.join("config_sentence_transformers.json"))?
        .and_then(|c| c.get("model_type").and_then(Value::as_str).map(|t| matches!(t, "MultiVectorEncoder" | "ColBERT")))
        .unwrap_or(false);
    let stanford = read_json(&dir.join("config.json"))?
        .and_then(|c| c.get("architectures").and_then(Value::as_array).map(|a| a.iter().any(|x| x == "HF_ColBERT")))
        .unwrap_or(false);
    Ok(masked || named || stanford)
}

pub(super) fn read_settings(dir: &Path) -> Result<ModelSettings, ModelError> {
    let config_path = dir.join("config.json");
    let config = read_json(&config_path)?.ok_or_else(|| ModelError::MissingFile { dir: dir.to_owned(), name: "config.json" })?;
    let hidden = positive_field(&config_path, &config, "hidden_size")?.ok_or_else(|| config_error(&config_path, "no \"hidden_size\"".into()))?;
    if hidden as usize > MAX_DIMENSIONS {
        return Err(config_error(&config_path, format!("\"hidden_size\" {hidden} exceeds {MAX_DIMENSIONS}")));
    }
    let offset = check_architecture(&config_path, &config)?;
    let table = positive_field(&config_path, &config, "max_position_embeddings")?.unwrap_or(super::BERT_DEFAULT_POSITIONS);
    let positions = table.saturating_sub(offset);

    let modules_path = dir.join("modules.json");
    let modules = read_json(&modules_path)?.unwrap_or(Value::Null);
    let (dense, mask, normalize) = match module_kinds(&modules).as_slice() {
        [("Transformer", ""), ("Dense", dense), ("MultiVectorMask", mask), ("Normalize", normalize)] => (
            module_folder(&modules_path, "Dense", dense)?,
            module_folder(&modules_path, "Pooling", mask)?,
            module_folder(&modules_path, "Pooling", normalize)?,
        ),
        kinds => {
            let found = kinds.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ");
            return Err(unsupported(&modules_path, "type", found, "a multi-vector encoder must be Transformer (at the root), Dense, MultiVectorMask, Normalize"));
        }
    };

    let sbert_path = dir.join("sentence_bert_config.json");
    let sbert = read_json(&sbert_path)?;
    if let Some(sbert) = &sbert {
        for (field, value) in object(&sbert_path, sbert)? {
            match field.as_str() {
                "transformer_task" if value == "feature-extraction" => {}
                "transformer_task" => return Err(unsupported(&sbert_path, "transformer_task", value, "the projection reads the encoder's token states")),
                "query_expansion" if value.is_null() => {}
                "query_expansion" => return Err(unsupported(&sbert_path, "query_expansion", value, "queries padded with expansion tokens are not computed; the engine encodes documents")),
                "query_length" | "document_length" if value.is_null() => {}
                "query_length" => return Err(unsupported(&sbert_path, "query_length", value, "the engine encodes documents, cut at max_seq_length")),
                "document_length" => return Err(unsupported(&sbert_path, "document_length", value, "the engine cuts texts at max_seq_length only")),
                "do_lower_case" if value == false => {}
                "do_lower_case" => return Err(unsupported(&sbert_path, "do_lower_case", value, "the engine tokenizes the text as given")),
                _ => {}
            }
        }
    }

    let mask_path = dir.join(&mask).join("config.json");
    if let Some(mask) = read_json(&mask_path)? {
        for (field, value) in object(&mask_path, &mask)? {
            match field.as_str() {
                "skiplist_words" if value.as_array().is_some_and(Vec::is_empty) || value.is_null() => {}
                "skiplist_words" => return Err(unsupported(&mask_path, "skiplist_words", value, "a document's skiplisted tokens would be dropped; the engine keeps every token")),
                "keep_only_token_ids" if value.is_null() => {}
                "keep_only_token_ids" => return Err(unsupported(&mask_path, "keep_only_token_ids", value, "the engine keeps every token")),
                // Which tasks a skiplist applies to: nothing without one.
                "skiplist_tasks" => {}
                _ => return Err(unsupported(&mask_path, "(unknown field)", field, "a MultiVectorMask setting the engine does not compute")),
            }
        }
    }
    let normalize_path = dir.join(&normalize).join("config.json");
    let normalize_config = read_json(&normalize_path)?.unwrap_or(Value::Null);
    for field in ["module_input_name", "module_output_name"] {
        // Normalize's default is the sentence embedding: the token vectors would stay unnormalised.
        let value = normalize_config.get(field).cloned().unwrap_or(Value::Null);
        if value != TOKEN_EMBEDDINGS {
            let field = if field == "module_input_name" { "module_input_name" } else { "module_output_name" };
            return Err(unsupported(&normalize_path, field, value, "the token vectors must be normalised each"));
        }
    }

    let dimensions = read_dense_of(&dir.join(&dense), hidden, TOKEN_EMBEDDINGS)?;
    let max_tokens = read_max_tokens(dir, sbert.as_ref(), positions)?;
    let st_path = dir.join("config_sentence_transformers.json");
    let (prompts, _) = read_prompts(&st_path)?;
    if let Some((name, _)) = prompts.iter().find(|(_, text)| !text.is_empty()) {
        return Err(unsupported(&st_path, "prompts", name, "a query or document prompt with text is not computed"));
    }
    // Empty prompts change nothing: none are signed, a job names none.
    Ok(ModelSettings { dimensions, max_tokens, pooling: Pooling::MultiVector, normalize: false, prompts: Vec::new(), default_prompt: None, dense: vec![dense], heads: Vec::new(), rerank_template: None })
}

#[cfg(test)]
mod tests;
