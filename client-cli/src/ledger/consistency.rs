//! `ledger consistency`: a consistency proof between two signed tree sizes.

use super::*;

#[derive(Serialize)]
struct ConsistencyJson {
    old_size: u64,
    new_size: u64,
    old_root: String,
    new_root: String,
    proof: Vec<String>,
    /// The stored signed checkpoints of these sizes, if any.
    old_checkpoint: Option<String>,
    new_checkpoint: Option<String>,
}

pub(super) fn consistency_command(dir: &Path, old_size: u64, new_size: u64, json: bool) -> anyhow::Result<ExitCode> {
    let store: SqliteStore = LocalLedger::open_read_only(dir)?;
    let proof = consistency(&store, old_size, new_size)?;
    let old_root = root_at(&store, old_size)?;
    let new_root = root_at(&store, new_size)?;
    // A proof this ledger cannot verify itself is a storage fault, not an answer.
    verify_consistency(old_size, new_size, &old_root, &new_root, &proof)
        .context("the stored tree does not yield a valid consistency proof")?;
    let hexes: Vec<String> = proof.iter().map(hex::encode).collect();
    if json {
        let out = ConsistencyJson {
            old_size,
            new_size,
            old_root: hex::encode(old_root),
            new_root: hex::encode(new_root),
            proof: hexes,
            old_checkpoint: store.checkpoint_at(old_size)?.map(|c| c.note),
            new_checkpoint: store.checkpoint_at(new_size)?.map(|c| c.note),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for h in &hexes {
            println!("{h}");
        }
        eprintln!(
            "consistency proof from size {old_size} (root {}) to size {new_size} (root {}): {} hash(es)",
            hex::encode(old_root),
            hex::encode(new_root),
            hexes.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
