//! Two witnesses as real processes on real sockets; a ledger's appender submits its
//! checkpoints to them. A consistent append gets both cosignatures; a forked checkpoint (same
//! size, another root) and a rolled-back one (smaller size) get none; a client asking for a
//! quorum of both refuses the forked checkpoint by name; a restarted witness still refuses.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use receipts_ledger::cosignature::{CosignerKey, WitnessPolicy, WitnessPolicyError};
use receipts_ledger::store::{CheckpointPolicy, LedgerStore, SqliteStore};
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::witness_client::{add_checkpoint_body, Submission};
use receipts_ledger::{Checkpoint, Ledger, SignerKey, WitnessClient, WitnessEndpoint};

struct WitnessProcess {
    child: Child,
    key: CosignerKey,
    url: String,
}

impl Drop for WitnessProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, n: u32, log_key: &str) -> WitnessProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ephem-witness"))
        .args(["--listen", "127.0.0.1:0", "--name", &format!("w{n}.witness.test")])
        .arg("--key")
        .arg(dir.join(format!("w{n}.key")))
        .arg("--state")
        .arg(dir.join(format!("w{n}.state.json")))
        .args(["--log", log_key])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    // "witness KEY listening on http://ADDR"
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(2), Some(&"listening"), "{line}");
    WitnessProcess { child, key: CosignerKey::parse(words[1]).unwrap(), url: words[4].to_owned() }
}

fn ledger(seed: u8) -> Ledger<SqliteStore> {
    Ledger::new(
        SqliteStore::open_in_memory().unwrap(),
        Box::new(TestReceipts),
        Box::new(SignerKey::from_seed("ledger.witness.test", &[seed; 32]).unwrap()),
        CheckpointPolicy { every_appends: u64::MAX, every_ms: u64::MAX },
    )
}

fn endpoints(ws: &[&WitnessProcess]) -> Vec<WitnessEndpoint> {
    ws.iter().map(|w| WitnessEndpoint::parse(&format!("{}@{}", w.key, w.url)).unwrap()).collect()
}

#[test]
fn witnesses_cosign_consistent_checkpoints_and_refuse_forks_and_rollbacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut honest = ledger(1);
    let log_key = honest.verifier().to_string();
    let (w1, w2) = (start(dir.path(), 1, &log_key), start(dir.path(), 2, &log_key));
    let client = WitnessClient::new(endpoints(&[&w1, &w2]));
    let policy = WitnessPolicy::new(vec![w1.key.clone(), w2.key.clone()], 2).unwrap();

    // Consistent appends: both witnesses cosign each checkpoint, the second with a proof.
    for (from, to) in [(0, 3), (3, 8)] {
        for j in from..to {
            honest.append(test_request(j, 64), j).unwrap();
        }
        honest.checkpoint_now(to).unwrap();
        let report = client.cosign_latest(honest.store()).unwrap();
        assert_eq!(report.cosigned, vec!["w1.witness.test", "w2.witness.test"], "{report:?}");
        let stored = honest.store().latest_checkpoint().unwrap().unwrap();
        assert_eq!(policy.check(stored.note.as_bytes()).unwrap().len(), 2);
        // The log's own signature still verifies on the cosigned note.
        assert_eq!(Checkpoint::open(stored.note.as_bytes(), &honest.verifier()).unwrap().size, to);
    }

    // A fork: the same key signs another tree of the same size (8).
    let mut forked = ledger(1);
    for j in 0..8 {
        forked.append(test_request(100 + j, 64), j).unwrap();
    }
    forked.checkpoint_now(8).unwrap();
    let fork = forked.store().latest_checkpoint().unwrap().unwrap();
    let fresh = WitnessClient::new(endpoints(&[&w1, &w2]));
    let report = fresh.cosign_latest(forked.store()).unwrap();
    assert!(report.cosigned.is_empty(), "{report:?}");
    assert!(report.refused.iter().all(|(_, why)| why.starts_with("422 fork")), "{report:?}");
    let after = forked.store().latest_checkpoint().unwrap().unwrap();
    assert_eq!(after.note, fork.note, "nothing was added to the forked checkpoint");
    // A client with quorum 2 refuses it, naming the check.
    assert!(matches!(
        policy.check(after.note.as_bytes()),
        Err(WitnessPolicyError::QuorumNotMet { have: 0, need: 2, .. })
    ));

    // A rollback: a smaller tree (size 5) signed after size 8 was cosigned.
    let mut small = ledger(1);
    for j in 0..5 {
        small.append(test_request(j, 64), j).unwrap();
    }
    small.checkpoint_now(5).unwrap();
    let rollback = small.store().latest_checkpoint().unwrap().unwrap();
    let eps = endpoints(&[&w1, &w2]);
    let no_proof = |_: u64, _: u64| -> Result<Vec<[u8; 32]>, String> { Ok(Vec::new()) };
    for ep in &eps {
        // Old size 8 (what the witness knows): 400, the old size is beyond the checkpoint.
        let (status, _) = raw_post(ep, &add_checkpoint_body(8, &[], &rollback.note));
        assert_eq!(status, 400);
        // Old size 5 (pretending the witness is behind): 409 with the size it knows.
        let (status, body) = raw_post(ep, &add_checkpoint_body(5, &[], &rollback.note));
        assert_eq!((status, body.as_str()), (409, "8\n"));
        assert!(matches!(WitnessClient::new(vec![ep.clone()]).submit(ep, &rollback.note, 5, &no_proof), Submission::Refused { .. }));
    }

    // A witness restarted from its state file still knows size 8 and still refuses the fork.
    drop(w1);
    let w1 = start(dir.path(), 1, &log_key);
    let again = WitnessClient::new(endpoints(&[&w1]));
    let report = again.cosign_latest(forked.store()).unwrap();
    assert!(report.cosigned.is_empty() && report.refused[0].1.starts_with("422 fork"), "{report:?}");
    // ... and an unknown log gets 404, a checkpoint signed by another key of the log's name 403.
    let stranger = Ledger::new(
        SqliteStore::open_in_memory().unwrap(),
        Box::new(TestReceipts),
        Box::new(SignerKey::from_seed("other.log", &[9; 32]).unwrap()),
        CheckpointPolicy::default(),
    );
    let mut stranger = stranger;
    stranger.append(test_request(1, 64), 1).unwrap();
    stranger.checkpoint_now(1).unwrap();
    let ep = &endpoints(&[&w1])[0];
    let note = stranger.store().latest_checkpoint().unwrap().unwrap().note;
    assert_eq!(raw_post(ep, &add_checkpoint_body(0, &[], &note)).0, 404);
    let mut impostor = ledger(2);
    impostor.append(test_request(1, 64), 1).unwrap();
    impostor.checkpoint_now(1).unwrap();
    let note = impostor.store().latest_checkpoint().unwrap().unwrap().note;
    assert_eq!(raw_post(ep, &add_checkpoint_body(0, &[], &note)).0, 403);
}

/// One POST the way the client sends it, without its retry.
fn raw_post(ep: &WitnessEndpoint, body: &str) -> (u16, String) {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(&ep.authority).unwrap();
    write!(s, "POST {}/add-checkpoint HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", ep.prefix, body.len()).unwrap();
    let m = protocol::kms_api::read_http_message(&mut s, false, 1 << 16).unwrap();
    let protocol::kms_api::StartLine::Response { status } = m.start else { panic!() };
    (status, String::from_utf8(m.body).unwrap())
}
