//! A decoder reranker's chat template reduced to fixed text around the instruction, the query and
//! the document. It is rendered as transformers renders one (Jinja with `trim_blocks` and
//! `lstrip_blocks`, the last newline not kept; `messages` as sentence-transformers passes a pair
//! in the flat format: an optional `system` message with the instruction, then `query` and
//! `document`) with marker strings in place of the three, twice with different markers — one
//! set padded with spaces, a tab and a newline, so a template that trims, escapes or otherwise
//! changes its content is caught — and once without the system message, which gives the
//! template's default instruction (empty for a template with its instruction in its fixed text). Anything else is refused: a marker missing, repeated or out
//! of order, text around them that depends on them, a default that does not sit where the system
//! message does.

use std::path::{Path, PathBuf};

use minijinja::{Environment, context};
use protocol::manifest::{MAX_PROMPT_BYTES, RerankTemplate};
use serde_json::Value;

use super::super::super::{ModelError, read_json};
use super::super::{config_error, unsupported};

/// Two sets of markers for (instruction, query, document), from Unicode's private use area.
const MARKS: [[&str; 3]; 2] = [
    ["\u{E000}instruction\u{E001}", "\u{E000}query\u{E001}", "\u{E000}document\u{E001}"],
    ["  \u{E002}Instruct 2\u{E003} ", "\n\u{E002}Query 2\u{E003}\t", " \u{E002}Document 2\u{E003}\n"],
];

const SHAPE: &str = "must render the instruction (a system message), the query and the document once each, in that order and unchanged";

/// The template: `chat_template.jinja` (where transformers 5 saves it), else
/// `tokenizer_config.json`'s `chat_template` string.
pub(super) fn find(dir: &Path) -> Result<(PathBuf, String), ModelError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let source = std::fs::read_to_string(&jinja).map_err(|source| ModelError::Io { path: jinja.clone(), source })?;
        return Ok((jinja, source));
    }
    let path = dir.join("tokenizer_config.json");
    match read_json(&path)?.and_then(|t| t.get("chat_template").cloned()) {
        Some(Value::String(source)) => Ok((path, source)),
        Some(other) => Err(unsupported(&path, "chat_template", if other.is_array() { "named templates".to_owned() } else { other.to_string() }, "one template string")),
        None => Err(unsupported(&path, "chat_template", "(absent, and no chat_template.jinja)", "a decoder reranker renders each pair through its chat template")),
    }
}

fn render(path: &Path, source: &str, messages: &[(&str, &str)]) -> Result<String, ModelError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    let failed = |e: minijinja::Error| config_error(path, format!("chat_template: {e}"));
    env.add_template("chat_template", source).map_err(failed)?;
    let messages: Vec<_> = messages.iter().map(|&(role, content)| context! { role => role, content => content }).collect();
    env.get_template("chat_template").map_err(failed)?.render(context! { messages => messages, add_generation_prompt => false }).map_err(failed)
}

/// The text before, between and after the three markers, each of which must appear once, in
/// order; a template that renders no instruction at all (its own is fixed text) has an empty one.
fn split(text: &str, marks: [&str; 3]) -> Result<[String; 4], String> {
    let mut pieces = Vec::with_capacity(4);
    let mut rest = text;
    for (mark, name) in marks.into_iter().zip(["instruction", "query", "document"]) {
        let count = text.matches(mark).count();
        if count == 0 && name == "instruction" {
            pieces.push(String::new());
            continue;
        }
        if count != 1 {
            return Err(format!("the {name} rendered {count} times"));
        }
        let (before, after) = rest.split_once(mark).ok_or_else(|| format!("the {name} out of order"))?;
        pieces.push(before.to_owned());
        rest = after;
    }
    pieces.push(rest.to_owned());
    if !text.contains(marks[0]) {
        pieces.swap(0, 1);
    }
    Ok(pieces.try_into().expect("four pieces"))
}

/// The template's fixed text and default instruction (`yes` and `no` are the caller's).
pub(super) fn reduce(path: &Path, source: &str) -> Result<RerankTemplate, ModelError> {
    let shape = |found: String| unsupported(path, "chat_template", found, SHAPE);
    let mut pieces: Option<[String; 4]> = None;
    for marks in MARKS {
        let [instruction, query, document] = marks;
        let text = render(path, source, &[("system", instruction), ("query", query), ("document", document)])?;
        let split = split(&text, marks).map_err(shape)?;
        if pieces.as_ref().is_some_and(|first| *first != split) {
            return Err(shape("other fixed text for other content".into()));
        }
        pieces = Some(split);
    }
    let [prefix, after_instruction, after_query, suffix] = pieces.expect("rendered");
    let [_, query, document] = MARKS[0];
    let text = render(path, source, &[("query", query), ("document", document)])?;
    let tail = format!("{after_instruction}{query}{after_query}{document}{suffix}");
    let instruction = text
        .strip_prefix(prefix.as_str())
        .and_then(|rest| rest.strip_suffix(tail.as_str()))
        .filter(|i| !i.contains(['\u{E000}', '\u{E001}']))
        .ok_or_else(|| shape("without a system message, no default instruction where the instruction goes".into()))?
        .to_owned();
    if [&prefix, &after_instruction, &after_query, &suffix, &instruction].iter().any(|t| t.len() > MAX_PROMPT_BYTES) {
        return Err(unsupported(path, "chat_template", "a fixed text over 4096 bytes", "each piece of a reranker's template is at most 4096 bytes"));
    }
    Ok(RerankTemplate { prefix, after_instruction, after_query, suffix, instruction, yes: 0, no: 0 })
}
