//! A job's ledger check (`verify`, `results`, `submit --wait`, `bulk results|verify`, the
//! Python SDK): the job's receipt is proven under the pinned ledger key, the checkpoint it is
//! proven under carries the configured witnesses' quorum, and that checkpoint is consistent
//! with the largest this client saw of the ledger (docs/protocol.md §8.12, "Each job's check").
//!
//! The checkpoint comes from the job's own proof object (`jobs/<id>/ledger-proof.json`, with
//! consistency proofs from the ledger bucket's hash tiles) or from a local ledger (the home's
//! own, or the synced copy of a deployment's, with consistency proofs from it). Refusals name
//! their check: those of the proof object (`bundle`, `checkpoint`, `tree_size`, `inclusion`,
//! `receipt`), `witness_quorum`, `witness_cosignature`, `fork`, `rollback`, `consistency`.

use super::*;
use super::hash_tiles::tiles_consistency;
use super::witness_policy::{Prover, SeenAs, remember_checkpoint, seen_checkpoint};
use cloud::ObjectStore;
use receipts_ledger::WitnessPolicy;
use receipts_ledger::merkle::{inclusion_proof, leaf_hash, verify_inclusion};

/// A job's entry, accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobEntry {
    pub leaf_index: u64,
    pub tree_size: u64,
    /// The checkpoint's origin: the ledger key's name.
    pub origin: String,
    /// The witnesses whose cosignature on the checkpoint verified.
    pub witnesses: Vec<String>,
    /// Witness keys configured, and how many must have cosigned (0, 0: none configured).
    pub witness_keys: usize,
    pub quorum: usize,
    /// The checkpoint against the largest one this client saw before.
    pub seen: SeenCheck,
}

impl JobEntry {
    /// The `ledger` check's detail; `source` says where the proof came from.
    pub fn describe(&self, source: &str) -> String {
        let signed = match (self.witness_keys, self.quorum) {
            (0, _) => format!(
                "checkpoint signed by the operator's key only ({}): no witness is configured (--witness, EPHEM_WITNESSES)",
                self.origin
            ),
            (_, 0) => format!(
                "checkpoint signed by the operator's key only ({}): no witness quorum is required (--witness-quorum 0){}",
                self.origin,
                if self.witnesses.is_empty() { String::new() } else { format!("; cosigned by {}", self.witnesses.join(", ")) }
            ),
            (keys, quorum) => format!(
                "checkpoint signed by {} and cosigned by {} (quorum {quorum} of {keys} witnesses)",
                self.origin,
                self.witnesses.join(", ")
            ),
        };
        let (size, seen) = (self.tree_size, &self.seen);
        let memory = match seen.previous {
            None => "the first checkpoint of this ledger this client records".to_owned(),
            Some(p) if p == size => "the checkpoint this client saw before".to_owned(),
            Some(p) if p < size => format!("extends checkpoint {p} this client saw before"),
            Some(p) => format!("a prefix of checkpoint {p} this client saw before"),
        };
        format!("entry {} of {size} ({source}), {signed}; {memory}", self.leaf_index)
    }
}

/// Accepts the checkpoint (verified under the pinned key) a job's entry is proven under: the
/// witness quorum first (a checkpoint without it is never remembered), then the memory of
/// checkpoints seen in `seen_dir` (§8.12: `fork`, `consistency`), recording it if it is the
/// largest.
pub fn accept_checkpoint(
    seen_dir: &Path,
    policy: Option<&WitnessPolicy>,
    checkpoint: &Checkpoint,
    note: &str,
    leaf_index: u64,
    prove: Prover<'_>,
) -> anyhow::Result<Result<JobEntry, Refusal>> {
    let witnesses = match policy.map(|p| check_witnessed(p, note)) {
        Some(Err(refusal)) => return Ok(Err(refusal)),
        Some(Ok(names)) => names,
        None => Vec::new(),
    };
    Ok(remember_checkpoint(seen_dir, checkpoint, note, SeenAs::JobProof, prove)?.map(|seen| JobEntry {
        leaf_index,
        tree_size: checkpoint.size,
        origin: checkpoint.origin.clone(),
        witnesses,
        witness_keys: policy.map_or(0, |p| p.keys.len()),
        quorum: policy.map_or(0, |p| p.quorum),
        seen,
    }))
}

/// A deployment's job checked with its own proof object in `jobs`, under the `pinned` ledger
/// key; consistency proofs come from the hash tiles of the ledger in `ledger` (under `prefix`).
/// `Ok(None)`: the job has no proof object.
#[allow(clippy::too_many_arguments)]
pub fn check_job_proof_object(
    jobs: &dyn ObjectStore,
    ledger: &dyn ObjectStore,
    prefix: &str,
    seen_dir: &Path,
    job: &JobId,
    receipt: &[u8],
    pinned: &VerifierKey,
    policy: Option<&WitnessPolicy>,
) -> anyhow::Result<Option<Result<JobEntry, Refusal>>> {
    Ok(match check_job_proof(jobs, job, receipt, pinned)? {
        JobProof::Absent => None,
        JobProof::Refused(refusal) => Some(Err(refusal)),
        JobProof::Proven { proven, note } => {
            let prove = |old: u64, new: u64| tiles_consistency(ledger, prefix, old, new);
            Some(accept_checkpoint(seen_dir, policy, &proven.checkpoint, &note, proven.leaf_index, &prove)?)
        }
    })
}

/// A job's entry in the local ledger in `dir` (the home's own, or the synced copy of a
/// deployment's), whose checkpoints verify under `pinned`: proven under the newest checkpoint
/// that covers it and carries the witness quorum (the latest when no witness is asked for),
/// then remembered in `dir`. A ledger whose latest checkpoint is smaller than one seen before is
/// refused (`rollback`). `Err`: the job is not in the ledger, or not under a checkpoint, yet.
pub fn check_job_in_ledger(
    dir: &Path,
    job: &JobId,
    receipt: &[u8],
    pinned: &VerifierKey,
    policy: Option<&WitnessPolicy>,
) -> anyhow::Result<Result<JobEntry, Refusal>> {
    let refuse = |check: &'static str, message: String| Ok(Err(Refusal { check, message }));
    let store = LocalLedger::open_read_only(dir)?;
    // The entry, the checkpoints and the proofs are of one moment of the ledger.
    let _snapshot = store.read_snapshot()?;
    let entry = store.entry_by_job(job)?.ok_or_else(|| anyhow!("job {job} is not in the ledger (yet)"))?;
    if entry.leaf != receipt {
        return refuse("receipt", format!("the ledger holds another receipt for this job (entry {})", entry.index));
    }
    let latest = store
        .latest_checkpoint()?
        .filter(|c| c.size > entry.index)
        .ok_or_else(|| anyhow!("entry {} is not covered by a signed checkpoint yet", entry.index))?;
    let latest_cp = match Checkpoint::open(latest.note.as_bytes(), pinned) {
        Ok(cp) => cp,
        Err(e) => return refuse("checkpoint", format!("the ledger's latest checkpoint: {e}")),
    };
    if let Some(seen) = seen_checkpoint(dir, &latest_cp.origin)?
        && latest_cp.size < seen.size
    {
        return refuse("rollback", format!("the ledger's checkpoint has {} entries; this client saw {} before", latest_cp.size, seen.size));
    }
    // The latest, unless the witnesses have not cosigned it yet and an older one carries them.
    let chosen = match policy {
        Some(p) if check_witnessed(p, &latest.note).is_err() => {
            let mut older = store.checkpoints()?;
            older.retain(|c| c.size > entry.index && c.size < latest.size);
            older.sort_by_key(|c| std::cmp::Reverse(c.size));
            older.into_iter().find(|c| check_witnessed(p, &c.note).is_ok()).unwrap_or(latest)
        }
        _ => latest,
    };
    let checkpoint = match Checkpoint::open(chosen.note.as_bytes(), pinned) {
        Ok(cp) => cp,
        Err(e) => return refuse("checkpoint", format!("checkpoint {}: {e}", chosen.size)),
    };
    let path = inclusion_proof(&store, entry.index, checkpoint.size)?;
    if let Err(e) = verify_inclusion(entry.index, checkpoint.size, &leaf_hash(&entry.leaf), &path, &checkpoint.root) {
        return refuse("inclusion", format!("entry {} under checkpoint {}: {e}", entry.index, checkpoint.size));
    }
    let prove = |old: u64, new: u64| consistency(&store, old, new).map_err(|e| e.to_string());
    accept_checkpoint(dir, policy, &checkpoint, &chosen.note, entry.index, &prove)
}

#[cfg(test)]
mod tests;
