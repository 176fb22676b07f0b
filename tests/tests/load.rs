//! Load on the local stack, through the real binaries: 200 small jobs submitted at once (from
//! several client processes in parallel), each completed exactly once — one receipt, one
//! ledger entry, every record back. The long single-job soak is `scripts/soak.sh` (docs/soak.md).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::{json, json_lines, wait_until, Stack};

const JOBS: usize = 200;
const CLIENTS: usize = 4;

/// Runs `work(i)` for every i in 0..n on `CLIENTS` threads.
fn in_parallel<T: Send>(n: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = Mutex::new(0usize);
    let results = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| loop {
                let i = {
                    let mut next = next.lock().unwrap();
                    let i = *next;
                    *next += 1;
                    i
                };
                if i >= n {
                    return;
                }
                let value = work(i);
                results.lock().unwrap().insert(i, value);
            });
        }
    });
    results.into_inner().unwrap().into_values().collect()
}

#[test]
fn two_hundred_concurrent_small_jobs_each_complete_exactly_once() {
    let started = Instant::now();
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();

    // 1–3 short texts per job, all submitted before any is waited for.
    let jobs: Vec<(String, Vec<String>, PathBuf)> = in_parallel(JOBS, |i| {
        let ids: Vec<String> = (0..1 + i % 3).map(|k| format!("job{i}-text{k}")).collect();
        let corpus = work.path().join(format!("corpus-{i}.jsonl"));
        let text: String = ids
            .iter()
            .map(|id| format!("{}\n", serde_json::json!({"id": id, "text": format!("Short text {id} for the load test.")})))
            .collect();
        std::fs::write(&corpus, text).unwrap();
        let report = json(&stack.ok(&["submit", corpus.to_str().unwrap(), "--json"]));
        (report["job_id"].as_str().unwrap().to_owned(), ids, corpus)
    });
    let submitted = started.elapsed();

    // Done when the ledger holds every job: read from the ledger itself.
    wait_until("every job in the ledger", Duration::from_secs(300), || {
        json(&stack.ok(&["ledger", "query", "--json"])).as_array().unwrap().len() >= JOBS
    });
    let ledgered = started.elapsed();
    let rows = json(&stack.ok(&["ledger", "query", "--json"]));
    let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows.as_array().unwrap() {
        *per_job.entry(row["job_id"].as_str().expect("a job id in each row").to_owned()).or_default() += 1;
    }
    assert_eq!(per_job.len(), JOBS, "one ledger entry per job");
    assert!(per_job.values().all(|n| *n == 1), "a job in the ledger twice: {per_job:?}");
    for (job, _, _) in &jobs {
        assert_eq!(per_job.get(job), Some(&1), "job {job} in the ledger");
    }
    stack.ok(&["ledger", "verify"]);

    // Every record back, each job's results verified against its receipt by `results`.
    let records: Vec<usize> = in_parallel(JOBS, |i| {
        let (job, ids, _) = &jobs[i];
        let out = work.path().join(format!("out-{i}.jsonl"));
        stack.ok(&["results", job, "-o", out.to_str().unwrap()]);
        let got: Vec<String> = json_lines(&out).iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(&got, ids, "job {job}: every record, in order");
        assert!(json_lines(&work.path().join(format!("out-{i}.errors.jsonl"))).is_empty());
        got.len()
    });
    assert_eq!(records.iter().sum::<usize>(), (0..JOBS).map(|i| 1 + i % 3).sum::<usize>());
    eprintln!(
        "{JOBS} jobs: submitted in {:.1}s, all in the ledger at {:.1}s, checked at {:.1}s",
        submitted.as_secs_f64(),
        ledgered.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
