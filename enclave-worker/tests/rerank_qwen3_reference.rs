//! The Qwen3 reranker (a `Qwen3ForCausalLM` scored by its "yes"/"no" logits) in the fused encoder
//! against sentence-transformers 6.2's `CrossEncoder` on the tiny random checkpoint of
//! `tests/testdata/outputs/rerank-qwen3/` (`scripts/make_output_models.py rerank_qwen3`): every
//! query's scores for the matrix's 24 texts within 1e-4, `rank()`'s order, every pair's token
//! count (pairs past 256 tokens cut, the template's tail written back over their last tokens).

use std::path::PathBuf;
use std::sync::Arc;

use enclave_worker::inference::{Backend, EmbedOptions, Embedder, EmbedderSettings, Engine, EngineSettings, InferenceError, ModelFiles};
use protocol::envelope::{OutputKind, Precision};
use protocol::manifest::{Pooling, RerankTemplate};
use protocol::records::RerankInput;
use serde_json::Value;

const SCORE_TOLERANCE: f32 = 1e-4;
/// Measured 0.0074 on the random checkpoint (its weights spread wider than trained ones).
const BF16_BOUND: f32 = 0.03;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/testdata/outputs"))
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("rerank-qwen3-reference.json")).unwrap()).unwrap()
}

/// The pieces onboarding reduces the template to (client-cli's tests check it does).
fn template(reference: &Value) -> RerankTemplate {
    let t = &reference["template"];
    let text = |k: &str| t[k].as_str().unwrap().to_owned();
    RerankTemplate {
        prefix: text("prefix"),
        after_instruction: text("after_instruction"),
        after_query: text("after_query"),
        suffix: text("suffix"),
        instruction: text("instruction"),
        yes: reference["yes"].as_u64().unwrap() as u32,
        no: reference["no"].as_u64().unwrap() as u32,
    }
}

fn embedder(reference: &Value, sigmoid: bool, template: Option<&RerankTemplate>) -> Result<Embedder, InferenceError> {
    let read = |name: &str| std::fs::read(dir().join("rerank-qwen3").join(name)).unwrap();
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings {
        pooling: Pooling::RerankYesNo { sigmoid },
        normalize: false,
        max_tokens: reference["max_length"].as_u64().unwrap() as usize,
        dimensions: Some(48),
        backend: Backend::Fused,
    };
    Embedder::load_with_template(ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] }, settings, template)
}

fn engine(reference: &Value, sigmoid: bool) -> Engine {
    let embedder = embedder(reference, sigmoid, Some(&template(reference))).unwrap();
    Engine::new(Arc::new(embedder), EngineSettings { threads: 2, ..Default::default() }).unwrap()
}

fn records(reference: &Value) -> Vec<Vec<u8>> {
    let documents: Vec<String> = serde_json::from_value(reference["documents"].clone()).unwrap();
    let queries = reference["queries"].as_array().unwrap();
    queries.iter().map(|q| RerankInput { query: q["query"].as_str().unwrap().to_owned(), documents: documents.clone() }.to_text()).collect()
}

fn order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

/// The largest score difference to the reference over every query, at `precision`.
fn worst_difference(engine: &Engine, reference: &Value, precision: Precision, check: bool) -> f32 {
    let texts = records(reference);
    let texts: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, precision, ..Default::default() };
    let mut worst = 0f32;
    for (case, result) in reference["queries"].as_array().unwrap().iter().zip(engine.rerank_window(&texts, &options)) {
        let query = case["query"].as_str().unwrap();
        let scored = result.unwrap_or_else(|e| panic!("{query}: {e:?}"));
        let expected: Vec<f32> = case["scores"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        for (a, b) in scored.vector.iter().zip(&expected) {
            worst = worst.max((a - b).abs());
        }
        if check {
            assert!(worst <= SCORE_TOLERANCE, "{query}: a score differs by {worst}");
            let want: Vec<usize> = case["order"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            assert_eq!(order(&scored.vector), want, "{query}: rank()'s order");
            let tokens: Vec<u64> = case["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(u64::from(scored.tokens), tokens.iter().sum::<u64>(), "{query}: the pairs' tokens");
        }
    }
    worst
}

#[test]
fn qwen3_rerank_scores_equal_cross_encoder() {
    let reference = reference();
    let engine = engine(&reference, true);
    let worst = worst_difference(&engine, &reference, Precision::Fp32, true);
    // Every pair's count, and every pair ends with the assistant turn, cut or not.
    let template = template(&reference);
    let (mut cut, mut pairs) = (0, 0);
    for case in reference["queries"].as_array().unwrap() {
        let query = case["query"].as_str().unwrap();
        let truncated = case["truncated"].as_array().unwrap();
        for ((document, n), was_cut) in reference["documents"].as_array().unwrap().iter().zip(case["tokens"].as_array().unwrap()).zip(truncated) {
            let pair = engine.embedder().tokenize_pair(query, document.as_str().unwrap(), true).unwrap();
            assert_eq!(pair.tokens() as u64, n.as_u64().unwrap(), "{query}: a pair's token count");
            let whole = engine.embedder().tokenize_pair(query, "", true).unwrap();
            let tail = &whole.ids[whole.ids.len() - 8..];
            assert!(pair.ids.ends_with(tail), "{query}: a pair ends with the template's tail");
            cut += usize::from(was_cut.as_bool().unwrap());
            pairs += 1;
        }
    }
    assert!(cut > 0 && cut < pairs, "some pairs cut at {}", reference["max_length"]);
    assert!(template.render("q", "d").ends_with("</think>\n\n"));
    eprintln!("rerank-qwen3: {pairs} pairs ({cut} cut), largest score difference {worst:e}");
}

/// bf16 (the body at bf16, the head f32) keeps the scores close; int8 is refused by name, as for
/// every family but BERT.
#[test]
fn qwen3_rerank_at_bf16_stays_close_and_int8_is_refused() {
    let reference = reference();
    let engine = engine(&reference, true);
    let err = engine.embedder().check_precision(Precision::Int8).unwrap_err();
    assert!(err.to_string().contains("qwen3"), "{err}");
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("rerank-qwen3 bf16: skipped, this CPU has no AVX-512 BF16");
        return;
    }
    let worst = worst_difference(&engine, &reference, Precision::Bf16, false);
    assert!(worst < BF16_BOUND, "bf16: a score differs by {worst}");
    eprintln!("rerank-qwen3 bf16: largest score difference {worst:.5}");
}

/// The logit form is the sigmoid's inverse; swapping yes and no gives 1 − score; a reranker
/// without its template, or a template for another pooling, is refused by name.
#[test]
fn qwen3_rerank_logits_swapped_tokens_and_refusals() {
    let reference = reference();
    let texts = records(&reference);
    let first: Vec<&[u8]> = vec![texts[0].as_slice()];
    let options = EmbedOptions { normalize: false, output: OutputKind::Scores, ..Default::default() };
    let expected: Vec<f32> = reference["queries"][0]["scores"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let logits = engine(&reference, false).rerank_window(&first, &options).remove(0).unwrap();
    for (logit, score) in logits.vector.iter().zip(&expected) {
        assert!((1.0 / (1.0 + (-logit).exp()) - score).abs() <= SCORE_TOLERANCE);
    }
    let swapped = RerankTemplate { yes: template(&reference).no, no: template(&reference).yes, ..template(&reference) };
    let engine = Engine::new(Arc::new(embedder(&reference, true, Some(&swapped)).unwrap()), EngineSettings { threads: 2, ..Default::default() }).unwrap();
    let scores = engine.rerank_window(&first, &options).remove(0).unwrap();
    let worst = scores.vector.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(scores.vector.iter().zip(&expected).all(|(a, b)| (a + b - 1.0).abs() <= SCORE_TOLERANCE) && worst > 0.1, "swapped: {worst}");

    let err = embedder(&reference, true, None).unwrap_err();
    assert!(err.to_string().contains("rerank_template"), "{err}");
    let read = |name: &str| std::fs::read(dir().join("rerank-qwen3").join(name)).unwrap();
    let (config, tokenizer, weights) = (read("config.json"), read("tokenizer.json"), read("model.safetensors"));
    let settings = EmbedderSettings { pooling: Pooling::LastToken, normalize: false, max_tokens: 256, dimensions: Some(48), backend: Backend::Fused };
    let files = ModelFiles { config: &config, tokenizer: &tokenizer, weights: &weights, dense: &[] };
    let err = Embedder::load_with_template(files, settings, Some(&template(&reference))).unwrap_err();
    assert!(err.to_string().contains("rerank_template"), "{err}");
    let outside = RerankTemplate { yes: 904, ..template(&reference) };
    let err = embedder(&reference, true, Some(&outside)).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
}
