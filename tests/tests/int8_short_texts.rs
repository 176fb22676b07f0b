//! int8's accuracy bound on every text, the shortest included (issue 41), through batch jobs on
//! the running local stack: the committed accuracy set (tests/testdata/short_texts: 156 texts of
//! 3–8 tokens — words, phrases, numbers, symbols, other scripts, emoji — and the reference texts
//! of every length) goes through `submit --precision int8` and `submit` (fp32), and every int8
//! vector must be within cosine 0.999 of sentence-transformers' vector
//! (scripts/short_text_references.py) and of our fp32 vector. The receipt says how the job
//! computed: int8's unit, and how many records were short enough to run wider.

use base64::Engine as _;
use protocol::envelope::Precision;
use protocol::receipt::{ComputeUnit, SignedReceipt};
use serde_json::Value;
use tests::{json, json_lines, Stack};

/// int8's bound (`submit --precision int8`, docs/protocol.md): cosine to full precision.
const INT8_MIN_COSINE: f64 = 0.999;

struct Case {
    kind: String,
    text: String,
    tokens: u64,
    vector: Vec<f64>,
}

fn cases() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/short_texts/reference.json");
    let doc = json(&std::fs::read_to_string(path).unwrap());
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let bytes = base64::engine::general_purpose::STANDARD.decode(c["vector_f32le"].as_str().unwrap()).unwrap();
            Case {
                kind: c["kind"].as_str().unwrap().to_owned(),
                text: c["text"].as_str().unwrap().to_owned(),
                tokens: c["tokens"].as_u64().unwrap(),
                vector: bytes.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap()))).collect(),
            }
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn vector(record: &Value) -> Vec<f64> {
    record["embedding"].as_array().expect("an embedding").iter().map(|v| v.as_f64().unwrap()).collect()
}

#[test]
fn int8_keeps_its_bound_on_short_texts_through_the_stack() {
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
    if !vnni && !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2, so int8 jobs are refused");
        return;
    }
    let cases = cases();
    let short = cases.iter().filter(|c| c.kind == "short").count();
    assert!(short >= 100, "the accuracy set has {short} short texts");
    assert!(cases.iter().filter(|c| c.kind == "short").all(|c| (1..=8).contains(&c.tokens)));

    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("texts.jsonl");
    let lines: String = cases
        .iter()
        .enumerate()
        .map(|(i, c)| serde_json::json!({"id": format!("case-{i}"), "text": c.text}).to_string() + "\n")
        .collect();
    std::fs::write(&corpus, lines).unwrap();
    let submit = |precision: &str| {
        let out = work.path().join(format!("{precision}.jsonl"));
        let report = json(&stack.ok(&[
            "submit", corpus.to_str().unwrap(), "--precision", precision, "--wait", "-o", out.to_str().unwrap(), "--json",
        ]));
        assert_eq!(report["errors"], 0, "{report}");
        assert_eq!(report["verified"], true, "{report}");
        let records = json_lines(&out);
        assert_eq!(records.len(), cases.len());
        (report["job_id"].as_str().unwrap().to_owned(), records)
    };
    let (job, int8) = submit("int8");
    let (_, fp32) = submit("fp32");

    let mut worst: Vec<(f64, &str, &str, u64)> = Vec::new();
    let mut failures = Vec::new();
    for ((case, int8), fp32) in cases.iter().zip(&int8).zip(&fp32) {
        assert_eq!(int8["tokens"].as_u64(), Some(case.tokens), "{:?}", case.text);
        let (int8, fp32) = (vector(int8), vector(fp32));
        for (to, cosine) in [("sentence-transformers", cosine(&int8, &case.vector)), ("our fp32", cosine(&int8, &fp32))] {
            worst.push((cosine, to, &case.text, case.tokens));
            if cosine < INT8_MIN_COSINE {
                failures.push(format!("{:?} ({} tokens): {cosine:.6} to {to}", case.text, case.tokens));
            }
        }
    }
    worst.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (cosine, to, text, tokens) in worst.iter().take(3) {
        eprintln!("int8 to {to}: {cosine:.6} on {text:?} ({tokens} tokens)");
    }
    assert!(failures.is_empty(), "{} of {} cosines below {INT8_MIN_COSINE}:\n{}", failures.len(), 2 * cases.len(), failures.join("\n"));

    // The receipt states how it computed: int8's unit, and the records short enough to run wider.
    let bundle = work.path().join("bundle.json");
    stack.ok(&["ledger", "prove", &job, "-o", bundle.to_str().unwrap()]);
    let bundle = json(&std::fs::read_to_string(&bundle).unwrap());
    let receipt = SignedReceipt::decode(&hex::decode(bundle["receipt"].as_str().unwrap()).unwrap()).unwrap().receipt;
    assert_eq!(receipt.options.precision, Precision::Int8);
    let compute = receipt.compute.expect("an int8 receipt states how it computed");
    // VNNI's unit (or AMX's) where the CPU has it, AVX2's where not.
    assert_eq!(compute.int8 == Some(ComputeUnit::Avx2), !vnni, "{compute:?}");
    let short = compute.short.expect("an int8 receipt states its short records");
    // Short records run at bf16 where bf16 outruns f32 (AMX tiles, AVX-512 BF16 on AMD's cores),
    // fp32 elsewhere; bf16's unit is named exactly when they did.
    let bf16 = enclave_worker::inference::dense_bf16_pays();
    assert_eq!(short.precision, if bf16 { Precision::Bf16 } else { Precision::Fp32 });
    assert_eq!(compute.bf16.is_some(), bf16, "{compute:?}");
    let expected = cases.iter().filter(|c| c.tokens <= u64::from(short.max_tokens)).count() as u64;
    assert_eq!((short.max_tokens, short.records), (8, expected), "{compute:?}");
    // And the client shows it.
    let verification = json(&stack.ok(&["verify", &job, "--json"]));
    let options = verification["checks"].as_array().unwrap().iter().find(|c| c["name"] == "options").cloned().unwrap();
    assert_eq!(options["passed"], true, "{options}");
    assert!(options.to_string().contains(&format!("{expected} records of at most 8 tokens")), "{options}");
}
