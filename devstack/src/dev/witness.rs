//! The embedded default's witness: `dev up` runs one `ephem-batch witness serve` for the home's
//! ledger (key and state in `<home>/witness/`, a free port on 127.0.0.1) and gives the local
//! Lambda runtime `EPHEM_WITNESSES=KEY@URL`, so every checkpoint it signs is also cosigned and
//! the whole witness path runs in `make demo` and the tests. `dev down` stops it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use ephem_batch_client::home::Home;
use receipts_ledger::LocalLedger;

/// The process's name in `run/` and `logs/`.
pub const PROCESS: &str = "witness";

fn url_file(home: &Home) -> PathBuf {
    home.run_dir().join("witness.url")
}

/// `KEY@URL` of the running witness, as `EPHEM_WITNESSES` takes it.
pub fn endpoint(home: &Home) -> Option<String> {
    home.running(PROCESS)?;
    std::fs::read_to_string(url_file(home)).ok().map(|s| s.trim().to_owned()).filter(|s| s.contains("@http://127.0.0.1:"))
}

/// Starts the witness unless it runs; returns its `KEY@URL`.
pub fn start(home: &Home) -> anyhow::Result<String> {
    if let Some(endpoint) = endpoint(home) {
        return Ok(endpoint);
    }
    // The ledger's key must exist for the witness to know the log: opening creates it (nothing
    // is appended through this handle).
    drop(LocalLedger::open(&home.ledger_dir(), Box::new(receipts_ledger::testing::TestReceipts))?);
    let dir = home.root().join("witness");
    std::fs::create_dir_all(&dir)?;
    let log = home.log_file(PROCESS);
    let before = std::fs::read_to_string(&log).map(|s| s.len()).unwrap_or(0);
    let args: Vec<String> = vec![
        "witness".into(),
        "serve".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--key".into(),
        dir.join("witness.key").display().to_string(),
        "--state".into(),
        dir.join("state.json").display().to_string(),
        "--log".into(),
        home.ledger_dir().join(receipts_ledger::local::LEDGER_PUB).display().to_string(),
    ];
    let pid = super::spawn(home, PROCESS, &std::env::current_exe()?, &args, &[])?;
    // It prints "witness KEY listening on http://ADDR" once it listens.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text.get(before..).unwrap_or_default().lines().find(|l| l.starts_with("witness ")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (Some(key), Some(url)) = (words.get(1), words.get(4)) else { return Err(anyhow!("witness said {line:?}")) };
            let endpoint = format!("{key}@{url}");
            std::fs::write(url_file(home), format!("{endpoint}\n")).context("writing the witness's address")?;
            eprintln!("started the local witness (pid {pid}) at {url}");
            return Ok(endpoint);
        }
        if !super::alive(pid) || Instant::now() > deadline {
            return Err(anyhow!("the witness did not start; see {}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
