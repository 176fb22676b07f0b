//! Vectors for the Go interoperability test (tests/go-interop, scripts/test-go-interop.sh).
//!
//! `interop write DIR`: a ledger of 10 test entries with checkpoints at sizes 4 and 10, each
//! cosigned by this crate's witness (through `add-checkpoint`, the second with its consistency
//! proof), and the proofs Go must accept.
//!
//! `interop check DIR`: what Go wrote to `DIR/go/` (a checkpoint signed by x/mod's note and
//! cosigned by transparency-dev/formats, consistency and inclusion proofs made by
//! transparency-dev/merkle) must verify here. Exits 1 naming what did not.

use std::fs;
use std::path::Path;

use base64::{engine::general_purpose::STANDARD, Engine};
use receipts_ledger::cosignature::{CosignerKey, CosignerSigner, WitnessPolicy};
use receipts_ledger::merkle::{leaf_hash, verify_consistency, verify_inclusion, Hash};
use receipts_ledger::store::{CheckpointPolicy, LedgerStore, SqliteStore};
use receipts_ledger::testing::{test_request, TestReceipts};
use receipts_ledger::witness_client::add_checkpoint_body;
use receipts_ledger::{consistency, Checkpoint, Ledger, SignerKey, VerifierKey};
use witness::{State, Witness};

fn lines(hashes: &[Hash]) -> String {
    hashes.iter().map(|h| format!("{}\n", STANDARD.encode(h))).collect()
}

fn write(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir)?;
    let log = SignerKey::from_seed("ledger.interop.example", &[0x11; 32])?;
    let mut ledger = Ledger::new(
        SqliteStore::open_in_memory()?,
        Box::new(TestReceipts),
        Box::new(SignerKey::from_seed("ledger.interop.example", &[0x11; 32])?),
        CheckpointPolicy { every_appends: u64::MAX, every_ms: u64::MAX },
    );
    let signer = CosignerSigner::from_seed("witness.interop.example", &[0x22; 32])?;
    fs::write(dir.join("log.vkey"), format!("{}\n", log.verifier()))?;
    fs::write(dir.join("witness.vkey"), format!("{}\n", signer.verifier()))?;
    let state = State::open(&dir.join("witness-state.json"))?;
    let witness = Witness::new(signer, vec![log.verifier()], state).with_clock(|| 1_750_000_000);
    let mut old = 0;
    for (from, to) in [(0, 4), (4, 10)] {
        for j in from..to {
            ledger.append(test_request(j, 64), j)?;
        }
        ledger.checkpoint_now(to)?;
        let note = ledger.store().latest_checkpoint()?.ok_or_else(|| anyhow::anyhow!("no checkpoint"))?.note;
        let proof = if old == 0 { Vec::new() } else { consistency(ledger.store(), old, to)? };
        let line = witness.add_checkpoint(add_checkpoint_body(old, &proof, &note).as_bytes())?;
        fs::write(dir.join(format!("checkpoint.{to}")), format!("{note}{line}"))?;
        old = to;
    }
    fs::write(dir.join("consistency.4.10"), lines(&consistency(ledger.store(), 4, 10)?))?;
    for index in [0, 3, 9] {
        let leaf = ledger.store().entry(index)?.ok_or_else(|| anyhow::anyhow!("no entry {index}"))?.leaf;
        fs::write(dir.join(format!("leaf.{index}")), STANDARD.encode(&leaf))?;
        let proof = receipts_ledger::merkle::inclusion_proof(ledger.store(), index, 10)?;
        fs::write(dir.join(format!("inclusion.{index}.10")), lines(&proof))?;
    }
    println!("wrote {}", dir.display());
    Ok(())
}

fn read_hashes(path: &Path) -> anyhow::Result<Vec<Hash>> {
    fs::read_to_string(path)?
        .lines()
        .map(|l| STANDARD.decode(l)?.try_into().map_err(|_| anyhow::anyhow!("{}: not 32 bytes", path.display())))
        .collect()
}

fn check(dir: &Path) -> anyhow::Result<()> {
    let go = dir.join("go");
    let log = VerifierKey::parse(fs::read_to_string(go.join("log.vkey"))?.trim())?;
    let witness = CosignerKey::parse(fs::read_to_string(go.join("witness.vkey"))?.trim())?;
    let policy = WitnessPolicy::new(vec![witness], 1)?;
    let mut roots = Vec::new();
    for size in [4u64, 10] {
        let note = fs::read(go.join(format!("checkpoint.{size}")))?;
        let cp = Checkpoint::open(&note, &log).map_err(|e| anyhow::anyhow!("Go checkpoint {size}: {e}"))?;
        anyhow::ensure!(cp.size == size, "Go checkpoint {size} has size {}", cp.size);
        policy.check(&note).map_err(|e| anyhow::anyhow!("Go cosignature on checkpoint {size}: {e}"))?;
        roots.push(cp.root);
    }
    let proof = read_hashes(&go.join("consistency.4.10"))?;
    verify_consistency(4, 10, &roots[0], &roots[1], &proof).map_err(|e| anyhow::anyhow!("Go consistency proof: {e}"))?;
    for index in [0u64, 3, 9] {
        let proof = read_hashes(&go.join(format!("inclusion.{index}.10")))?;
        let leaf = leaf_hash(format!("leaf-{index}").as_bytes());
        verify_inclusion(index, 10, &leaf, &proof, &roots[1]).map_err(|e| anyhow::anyhow!("Go inclusion proof {index}: {e}"))?;
    }
    println!("ok: Go's checkpoints, cosignatures, consistency and inclusion proofs verify here");
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("write"), Some(dir)) => write(Path::new(dir)),
        (Some("check"), Some(dir)) => check(Path::new(dir)),
        _ => Err(anyhow::anyhow!("usage: interop write|check DIR")),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interop: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
