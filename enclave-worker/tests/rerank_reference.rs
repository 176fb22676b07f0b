//! Cross-encoders in the fused encoder against sentence-transformers' own `CrossEncoder` on tiny
//! random checkpoints (`tests/testdata/outputs/rerank/` XLM-RoBERTa and `rerank-bert/` BERT,
//! written by `scripts/make_output_models.py rerank rerank_bert`): every query's scores for the
//! matrix's 24 texts within 1e-4, `rank()`'s order, and every pair's token count (pairs past 128
//! tokens cut longest-first); BERT's pairs read their second segment as token type 1.

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles};
use protocol::envelope::{OutputKind, Precision};
use protocol::manifest::Pooling;
use protocol::records::{ErrorCode, RerankInput};
use serde_json::Value;

const SCORE_TOLERANCE: f32 = 1e-4;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

/// A generated cross-encoder: its folder under `tests/testdata/outputs/`, hidden size, and the
/// bound on its scores at bf16 (measured: XLM-RoBERTa 0.0051, BERT 0.0106; both random models
/// have weights spread wider than trained ones).
#[derive(Clone, Copy, Debug)]
struct Fixture {
    folder: &'static str,
    hidden: usize,
    bf16_bound: f32,
}

const XLM_ROBERTA: Fixture = Fixture { folder: "rerank", hidden: 36, bf16_bound: 0.01 };
const BERT: Fixture = Fixture { folder: "rerank-bert", hidden: 24, bf16_bound: 0.02 };

fn reference(fixture: Fixture) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(format!("{}-reference.json", fixture.folder))).unwrap()).unwrap()
}

fn engine(fixture: Fixture, reference: &Value, pooling: Pooling) -> Result<Engine, InferenceError> {
    let read = |name: &str| std::fs::read(dir().join(fixture.folder).join(name)).unwrap();
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings {
        pooling,
        normalize: false,
        max_tokens: reference["max_length"].as_u64().unwrap() as usize,
        dimensions: Some(fixture.hidden),
        backend: Backend::Fused,
    };
    let embedder = Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings)?;
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() })
}

fn records(reference: &Value) -> Vec<Vec<u8>> {
    let documents: Vec<String> = serde_json::from_value(reference["documents"].clone()).unwrap();
    reference["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| RerankInput { query: q["query"].as_str().unwrap().to_owned(), documents: documents.clone() }.to_text())
        .collect()
}

/// Indices by descending score (of equal scores the lower index first, as a stable sort).
fn order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

#[test]
fn rerank_scores_equal_cross_encoder() {
    check_scores(XLM_ROBERTA);
}

#[test]
fn bert_rerank_scores_equal_cross_encoder() {
    check_scores(BERT);
}

fn check_scores(fixture: Fixture) {
    let reference = reference(fixture);
    let engine = engine(fixture, &reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let texts = records(&reference);
    let texts: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, ..Default::default() };
    let mut worst = 0f32;
    for (case, result) in reference["queries"].as_array().unwrap().iter().zip(engine.rerank_window(&texts, &options)) {
        let query = case["query"].as_str().unwrap();
        let scored = result.unwrap_or_else(|e| panic!("{query}: {e:?}"));
        let expected: Vec<f32> = case["scores"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        for (i, (a, b)) in scored.vector.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= SCORE_TOLERANCE, "{query} document {i}: {a} against {b}");
            worst = worst.max((a - b).abs());
        }
        let want: Vec<usize> = case["order"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(order(&scored.vector), want, "{query}: rank()'s order");
        let tokens: Vec<u64> = case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(u64::from(scored.tokens), tokens.iter().sum::<u64>(), "{query}: the pairs' tokens");
        for (document, &n) in reference["documents"].as_array().unwrap().iter().zip(&tokens) {
            let pair = engine.embedder().tokenize_pair(query, document.as_str().unwrap(), true).unwrap();
            assert_eq!(pair.tokens() as u64, n, "{query}: a pair's token count");
            check_segments(fixture, &pair);
        }
    }
    eprintln!("{}: {} queries x 24 documents, largest score difference {worst:e}", fixture.folder, texts.len());
}

/// BERT's pair: `[CLS] query [SEP]` type 0, `document [SEP]` type 1; XLM-RoBERTa's all type 0.
fn check_segments(fixture: Fixture, pair: &enclave_worker::inference::Tokenized) {
    if fixture.folder == XLM_ROBERTA.folder {
        assert_eq!(pair.second_segment, None, "XLM-RoBERTa's pairs are all type 0");
        return;
    }
    // The GTE WordPiece tokenizer's [SEP].
    const SEP: u32 = 3;
    let start = pair.second_segment.expect("a BERT pair has a second segment");
    assert!(start >= 3 && start < pair.ids.len(), "second segment at {start} of {}", pair.ids.len());
    assert_eq!((pair.ids[start - 1], pair.ids.last().copied()), (SEP, Some(SEP)), "{:?}", pair.ids);
    assert!(!pair.ids[1..start - 1].contains(&SEP) && !pair.ids[start..pair.ids.len() - 1].contains(&SEP), "{:?}", pair.ids);
}

/// bf16 (the body at bf16, the head f32) keeps the scores close.
#[test]
fn rerank_at_bf16_stays_close() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("rerank bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    for fixture in [XLM_ROBERTA, BERT] {
        bf16_close(fixture);
    }
}

fn bf16_close(fixture: Fixture) {
    let reference = reference(fixture);
    let engine = engine(fixture, &reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let texts = records(&reference);
    let texts: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, precision: Precision::Bf16, ..Default::default() };
    let mut worst = 0f32;
    for (case, result) in reference["queries"].as_array().unwrap().iter().zip(engine.rerank_window(&texts, &options)) {
        for (a, b) in result.unwrap().vector.iter().zip(case["scores"].as_array().unwrap()) {
            worst = worst.max((a - b.as_f64().unwrap() as f32).abs());
        }
    }
    assert!(worst < fixture.bf16_bound, "{}: bf16: a score differs by {worst}", fixture.folder);
    eprintln!("{} bf16: largest score difference {worst:.5}", fixture.folder);
}

/// The logit form gives the sigmoid's inverse; bad records fail alone, by name; another
/// architecture's head, and a BERT body without its classification head, are refused by name.
#[test]
fn rerank_logits_bad_records_and_refusals() {
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, ..Default::default() };
    for fixture in [XLM_ROBERTA, BERT] {
        let reference = reference(fixture);
        let texts = records(&reference);
        let first: Vec<&[u8]> = vec![texts[0].as_slice()];
        let logits = engine(fixture, &reference, Pooling::Rerank { sigmoid: false }).unwrap().rerank_window(&first, &options).remove(0).unwrap();
        for (logit, score) in logits.vector.iter().zip(reference["queries"][0]["scores"].as_array().unwrap()) {
            let sigmoid = 1.0 / (1.0 + (-logit).exp());
            assert!((sigmoid - score.as_f64().unwrap() as f32).abs() <= SCORE_TOLERANCE, "{}", fixture.folder);
        }
    }

    let reference = reference(XLM_ROBERTA);
    let texts = records(&reference);
    let engine = engine(XLM_ROBERTA, &reference, Pooling::Rerank { sigmoid: true }).unwrap();
    let bad: Vec<&[u8]> = vec![b"not json", br#"{"query": "q", "documents": []}"#, br#"{"query": " ", "documents": ["d"]}"#, br#"{"query": "q", "documents": ["d"], "top_n": 1}"#, texts[1].as_slice()];
    let results = engine.rerank_window(&bad, &options);
    let codes: Vec<Option<ErrorCode>> = results.iter().map(|r| r.as_ref().err().map(|f| f.code)).collect();
    assert_eq!(codes, [Some(ErrorCode::InvalidJson), Some(ErrorCode::MissingText), Some(ErrorCode::EmptyText), Some(ErrorCode::InvalidJson), None]);
    assert_eq!(results[4].as_ref().unwrap().vector.len(), 24, "the good record beside them is scored");

    let settings = EmbedderSettings { pooling: Pooling::Rerank { sigmoid: true }, normalize: false, max_tokens: 128, dimensions: None, backend: Backend::Fused };
    let load = |arch: &str, folder: &str| {
        let models = dir().parent().unwrap().join("models").join(arch);
        // One label, so that the head is what is refused.
        let mut config: Value = serde_json::from_slice(&std::fs::read(models.join(folder).join("config.json")).unwrap()).unwrap();
        config["id2label"] = serde_json::json!({"0": "LABEL_0"});
        let config = serde_json::to_vec(&config).unwrap();
        let weights = std::fs::read(models.join("model.safetensors")).unwrap();
        let tokenizer = std::fs::read(dir().join("rerank-bert/tokenizer.json")).unwrap();
        Embedder::load(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings).unwrap_err()
    };
    // The matrix's MPNet: no sequence-classification head the engine reads.
    let err = load("mpnet", "v6-mean");
    assert!(matches!(err, InferenceError::UnsupportedArchitecture(_)) && err.to_string().contains("not mpnet's"), "{err}");
    // The matrix's BERT is a BertModel: no pooler or classifier tensors.
    let err = load("bert", "classic-cls");
    assert!(matches!(err, InferenceError::Weights(_)) && err.to_string().contains("bert.pooler.dense.weight"), "{err}");
}
