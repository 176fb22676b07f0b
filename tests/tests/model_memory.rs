//! The worker's model memory budget in the running stack: a budget that holds one of the two
//! tiny models published (the model matrix's BERT, two folders sharing its weights), and
//! jobs for each in turn. Each job's model is loaded when the job needs it, evicting the other,
//! and every job succeeds with sentence-transformers' vectors; the default model, larger than
//! the whole budget, is refused by name (and a job for it fails for good, naming the budget);
//! `dev status --json` shows the one model held, its
//! measured bytes and the budget. Needs the installed tokenizer (scripts/setup-model.sh).

mod matrix;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Holds one tiny BERT model (about 6 MiB measured: 3 MiB of weights, the tokenizer's
/// vocabulary), not two, and not all-MiniLM-L6-v2 (about 90 MiB).
const BUDGET_MIB: u64 = 10;

/// Onboards the BERT folder `name` of the model matrix as `model_id` with the CLI: encrypt,
/// sign, upload.
fn publish(stack: &tests::Stack, reference: &Value, name: &str, model_id: &str, work: &Path) {
    let (dir, sealed) = (work.join(name), work.join(format!("{name}.sealed")));
    matrix::assemble("bert", name, &matrix::tokenizer(reference, "bert"), &dir);
    stack.onboard(&dir, model_id, &sealed, &[]);
}

fn worker_models(stack: &tests::Stack) -> Value {
    tests::json(&stack.ok(&["dev", "status", "--json"]))["worker_models"].clone()
}

fn host_log(stack: &tests::Stack) -> String {
    std::fs::read_to_string(stack.home().join("logs").join("host-poller.log")).unwrap_or_default()
}

#[test]
fn a_budget_for_one_model_serves_jobs_for_two_in_turn() {
    let reference = matrix::reference();
    let texts: Vec<(String, String)> = matrix::texts(&reference).into_iter().take(6).collect();
    let budget = BUDGET_MIB.to_string();
    let stack = tests::Stack::up_with(&[
        ("EPHEM_MODEL_MEMORY_MIB", budget.as_ref()),
        // Control looks at the models store every 2 s instead of every minute.
        ("EPHEM_RESCAN_S", "2".as_ref()),
    ]);
    let work = tempfile::tempdir().unwrap();
    // Neither has prompts: the jobs embed the texts as they are.
    let models = [("classic-mean", "test/memory-mean"), ("classic-cls", "test/memory-cls")];
    for (name, model_id) in models {
        publish(&stack, &reference, name, model_id, work.path());
    }
    // The periodic pass loads the first that fits and leaves the other: it never evicts.
    tests::wait_until("a model held", Duration::from_secs(120), || worker_models(&stack)["models"].as_array().is_some_and(|m| m.len() == 1));
    tests::wait_until("the second model left to the jobs", Duration::from_secs(60), || host_log(&stack).contains("fits only by evicting"));

    // Jobs start with the model not held: every one then needs an eviction.
    let first_held = worker_models(&stack)["models"][0]["model_id"].as_str().unwrap().to_owned();
    let order: Vec<(&str, &str)> = if first_held == models[0].1 { vec![models[1], models[0]] } else { models.to_vec() };
    let mut evictions = vec![host_log(&stack).matches("worker evicted a model").count()];
    for round in 0..4 {
        let (name, model_id) = order[round % 2];
        let expected = matrix::run(&reference, "bert", name, "");
        let corpus = work.path().join(format!("corpus-{round}.jsonl"));
        let lines: Vec<String> = texts.iter().map(|(id, text)| serde_json::json!({"id": id, "text": text}).to_string()).collect();
        std::fs::write(&corpus, lines.join("\n") + "\n").unwrap();
        let out = work.path().join(format!("out-{round}.jsonl"));
        let report = stack.ok(&["submit", corpus.to_str().unwrap(), "--model", model_id, "--wait", "-o", out.to_str().unwrap(), "--json"]);
        let report = tests::json(&report);
        assert_eq!((report["embedded"].as_u64(), report["errors"].as_u64()), (Some(texts.len() as u64), Some(0)), "round {round}: {report}");
        for (index, result) in tests::json_lines(&out).iter().enumerate() {
            assert_eq!(result["id"].as_str(), Some(texts[index].0.as_str()));
            let similarity = matrix::cosine(&matrix::floats(&result["embedding"]), &expected.vectors[index]);
            assert!(similarity >= 0.9999, "round {round} {}: cosine {similarity}", texts[index].0);
        }
        let held = worker_models(&stack);
        let loaded = held["models"].as_array().unwrap();
        assert_eq!(loaded.len(), 1, "round {round}: one model fits the budget: {held}");
        assert_eq!(loaded[0]["model_id"], model_id, "round {round}: the job's model is the one held: {held}");
        evictions.push(host_log(&stack).matches("worker evicted a model").count());
    }
    assert!(evictions.windows(2).all(|w| w[1] > w[0]), "each job's model evicted the other: {evictions:?}");
    // No thrashing: the periodic passes (every 2 s) loaded the first model only, never one back
    // after a job's load evicted it; each job's load was the job's own.
    let log = host_log(&stack);
    assert_eq!(log.matches("worker loaded model").count(), 1, "{}", tests::log_tails(stack.home(), &["host-poller"], 60));
    assert_eq!(log.matches("worker loaded a model a job needs").count(), 4);

    let held = worker_models(&stack);
    assert_eq!(held["budget_bytes"].as_u64(), Some(BUDGET_MIB << 20), "{held}");
    let bytes = held["models"][0]["bytes"].as_u64().unwrap();
    eprintln!("measured {bytes} bytes per model under a {} byte budget", BUDGET_MIB << 20);
    let weights = std::fs::metadata(matrix::data().join("bert/model.safetensors")).unwrap().len();
    assert!(bytes >= weights && bytes <= BUDGET_MIB << 20, "measured {bytes} bytes for {weights} bytes of weights: {held}");
    assert!(2 * bytes > BUDGET_MIB << 20, "the budget holds one model, not two: {bytes} bytes each");
    assert_eq!(held["used_bytes"].as_u64(), Some(bytes));
    assert!(held["models"][0]["last_use_ms"].as_u64().unwrap() > 0);
    let text = stack.ok(&["dev", "status"]);
    assert!(text.contains(&format!("of a {BUDGET_MIB}.0 MiB budget")) && text.contains(&format!("loaded {} v1", order[1].1)), "{text}");
    // The stack's default model needs more than the whole budget: refused by name, never loaded.
    let log = host_log(&stack);
    assert!(
        log.contains("model_over_budget") && log.contains("all-MiniLM-L6-v2 needs"),
        "{}",
        tests::log_tails(stack.home(), &["host-poller"], 40)
    );
    // A job for it ends failed for good, naming the budget, instead of being retried until the
    // dead-letter queue.
    let corpus = work.path().join("corpus-default.jsonl");
    tests::short_corpus(&corpus, "over-budget", 2);
    let job = tests::json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--json"]))["job_id"].as_str().unwrap().to_owned();
    let mut status = Value::Null;
    tests::wait_until("the over-budget job to end", Duration::from_secs(60), || {
        status = stack.status(&job);
        status["state"] == "failed"
    });
    let failure = &status["status"]["failure"];
    assert_eq!(failure["check"], "model_over_budget", "{status}");
    assert!(failure["message"].as_str().unwrap().contains("budget"), "{status}");
}
