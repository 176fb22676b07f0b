//! The client's witness policy (`--witness KEY... --witness-quorum N`) and the checkpoints it
//! has seen: a checkpoint is taken only with a quorum of the trusted witnesses' cosignatures,
//! and each newer one must be consistent with the last one seen (kept in
//! `<ledger dir>/seen/<sha256(origin) hex>`), so an operator who forks or rewrites the ledger
//! after this client saw it is caught here even if no witness were asked.

use super::*;
use receipts_ledger::{WitnessPolicy, WitnessPolicyError};

pub use crate::witness_args::WitnessArgs;

/// Checks a signed checkpoint against the policy: the names of the witnesses that cosigned.
pub fn check_witnessed(policy: &WitnessPolicy, note: &str) -> Result<Vec<String>, Refusal> {
    match policy.check(note.as_bytes()) {
        Ok(cosigned) => Ok(cosigned.into_iter().map(|(k, _)| k.name().to_owned()).collect()),
        Err(e @ WitnessPolicyError::QuorumNotMet { .. }) => Err(Refusal { check: "witness_quorum", message: e.to_string() }),
        Err(e) => Err(Refusal { check: "witness_cosignature", message: e.to_string() }),
    }
}

fn seen_path(dir: &Path, origin: &str) -> PathBuf {
    use sha2::Digest as _;
    dir.join("seen").join(hex::encode(sha2::Sha256::digest(origin.as_bytes())))
}

/// What the seen-checkpoint check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeenCheck {
    /// The size of the largest checkpoint seen before, if any.
    pub previous: Option<u64>,
    pub size: u64,
}

/// Which checkpoint is checked against the ones seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeenAs {
    /// The ledger's latest checkpoint (`ledger verify`): one smaller than the largest seen is a
    /// `rollback`.
    Latest,
    /// The checkpoint a job's proof rests on (`verify`, `results`): it may be older than the
    /// largest seen (the job was appended before), and must then be a prefix of it.
    JobProof,
}

/// A consistency proof between two sizes `(old, new)` of the ledger being checked, from wherever
/// it is read (a ledger store, a bucket's hash tiles); it is verified against both signed roots,
/// so it is never trusted.
pub type Prover<'a> = &'a dyn Fn(u64, u64) -> Result<Vec<receipts_ledger::merkle::Hash>, String>;

/// One process checks and records one origin's checkpoints at a time (the Python SDK's threads).
static SEEN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The largest checkpoint this client recorded for `origin` in `dir`, if any.
pub fn seen_checkpoint(dir: &Path, origin: &str) -> anyhow::Result<Option<Checkpoint>> {
    let path = seen_path(dir, origin);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let text = receipts_ledger::note::Note::parse(text.as_bytes()).with_context(|| format!("{}", path.display()))?.text;
            Ok(Some(Checkpoint::parse(&text).with_context(|| format!("{}", path.display()))?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Checks the ledger's latest checkpoint (already verified under the pinned key) against the
/// one this client saw last, then records it. Refusals: `rollback` (smaller), `fork` (same
/// size, other root), `consistency` (the ledger cannot prove the newer one extends it).
pub fn check_seen(dir: &Path, store: &dyn LedgerStore, latest: &Checkpoint, note: &str) -> anyhow::Result<Result<SeenCheck, Refusal>> {
    let prove = |old: u64, new: u64| consistency(store, old, new).map_err(|e| e.to_string());
    remember_checkpoint(dir, latest, note, SeenAs::Latest, &prove)
}

/// Checks a checkpoint (already verified under the pinned key, and against the witness policy)
/// against the largest this client saw of its origin (`<dir>/seen/<hex SHA-256(origin)>`), and
/// records it if it is larger. The one place every check of a checkpoint remembers it:
/// `ledger verify` ([`check_seen`]) and each job's ledger check. Refusals: `fork` (same size,
/// other root), `rollback` (smaller, for [`SeenAs::Latest`]), `consistency` (no proof from
/// `prove` that the larger of the two extends the smaller).
pub fn remember_checkpoint(dir: &Path, checkpoint: &Checkpoint, note: &str, seen_as: SeenAs, prove: Prover<'_>) -> anyhow::Result<Result<SeenCheck, Refusal>> {
    let _one_at_a_time = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = seen_path(dir, &checkpoint.origin);
    let previous = seen_checkpoint(dir, &checkpoint.origin)?;
    let refuse = |check: &'static str, message: String| Ok(Err(Refusal { check, message }));
    // Proves that the tree of `small` is a prefix of the tree of `large`.
    let extends = |small: &Checkpoint, large: &Checkpoint| -> Result<(), String> {
        let proof = prove(small.size, large.size).map_err(|e| format!("no consistency proof {} -> {}: {e}", small.size, large.size))?;
        verify_consistency(small.size, large.size, &small.root, &large.root, &proof)
            .map_err(|e| format!("checkpoint {} does not extend checkpoint {}: {e}", large.size, small.size))
    };
    if let Some(seen) = &previous {
        if checkpoint.size == seen.size && checkpoint.root != seen.root {
            return refuse("fork", format!("checkpoint {} has another root than the one this client saw", checkpoint.size));
        }
        if checkpoint.size < seen.size {
            if seen_as == SeenAs::Latest {
                return refuse("rollback", format!("the ledger's checkpoint has {} entries; this client saw {} before", checkpoint.size, seen.size));
            }
            // An older checkpoint (a job appended earlier) must be a prefix of the one seen.
            if let Err(message) = extends(checkpoint, seen) {
                return refuse("consistency", format!("{message} (the larger was seen before)"));
            }
            return Ok(Ok(SeenCheck { previous: Some(seen.size), size: checkpoint.size }));
        }
        if checkpoint.size > seen.size
            && seen.size > 0
            && let Err(message) = extends(seen, checkpoint)
        {
            return refuse("consistency", format!("{message} (the smaller was seen before)"));
        }
    }
    std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, note).and_then(|()| std::fs::rename(&tmp, &path)).with_context(|| format!("writing {}", path.display()))?;
    Ok(Ok(SeenCheck { previous: previous.map(|p| p.size), size: checkpoint.size }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use receipts_ledger::cosignature::{add_signature_lines, CosignerSigner};
    use receipts_ledger::testing::{test_request, TestReceipts};
    use receipts_ledger::{Ledger, SignerKey};
    use receipts_ledger::store::CheckpointPolicy;

    fn ledger(jobs: std::ops::Range<u64>) -> Ledger<SqliteStore> {
        let mut l = Ledger::new(
            SqliteStore::open_in_memory().unwrap(),
            Box::new(TestReceipts),
            Box::new(SignerKey::from_seed("ledger.client.test", &[5; 32]).unwrap()),
            CheckpointPolicy { every_appends: u64::MAX, every_ms: u64::MAX },
        );
        for j in jobs {
            l.append(test_request(j, 64), j).unwrap();
        }
        l.checkpoint_now(1).unwrap();
        l
    }

    fn latest(l: &Ledger<SqliteStore>) -> (Checkpoint, String) {
        let note = l.store().latest_checkpoint().unwrap().unwrap().note;
        (Checkpoint::open(note.as_bytes(), &l.verifier()).unwrap(), note)
    }

    #[test]
    fn quorum_is_required_by_name() {
        let l = ledger(0..3);
        let (cp, note) = latest(&l);
        let (w1, w2) = (CosignerSigner::from_seed("w1.test", &[1; 32]).unwrap(), CosignerSigner::from_seed("w2.test", &[2; 32]).unwrap());
        let args = WitnessArgs { witnesses: vec![w1.verifier().to_string(), w2.verifier().to_string()], quorum: None };
        let policy = args.policy().unwrap().unwrap();
        assert_eq!(policy.quorum, 2);
        let one = add_signature_lines(&note, &w1.cosign(&cp.to_text(), 7)).unwrap();
        assert_eq!(check_witnessed(&policy, &one).unwrap_err().check, "witness_quorum");
        let both = add_signature_lines(&one, &w2.cosign(&cp.to_text(), 8)).unwrap();
        assert_eq!(check_witnessed(&policy, &both).unwrap(), vec!["w1.test", "w2.test"]);
        // A cosignature that does not verify is named as such.
        let bad = both.replace(&w2.cosign(&cp.to_text(), 8), &w2.cosign(&cp.to_text(), 9).replace('A', "B"));
        assert!(check_witnessed(&policy, &bad).is_err());
        let one_of_two = WitnessArgs { quorum: Some(1), ..args.clone() }.policy().unwrap().unwrap();
        assert!(check_witnessed(&one_of_two, &one).is_ok());
        assert!(WitnessArgs { quorum: Some(3), ..args }.policy().is_err());
        assert!(WitnessArgs { witnesses: vec![], quorum: Some(1) }.policy_with(None).is_err());
    }

    /// `EPHEM_WITNESSES`: keys, files of keys and an appender's `KEY@URL` entries, separated by
    /// commas or newlines; `--witness` replaces it.
    #[test]
    fn witnesses_from_the_environment() {
        let keys: Vec<String> = (1..=3u8).map(|i| CosignerSigner::from_seed(&format!("w{i}.test"), &[i; 32]).unwrap().verifier().to_string()).collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w3.keys");
        std::fs::write(&file, format!("{}\n\n", keys[2])).unwrap();
        let env = format!("{}@http://127.0.0.1:9/w, {}\n{}", keys[0], keys[1], file.display());
        let none = WitnessArgs::default();
        let policy = none.policy_with(Some(&env)).unwrap().unwrap();
        assert_eq!((policy.keys.len(), policy.quorum), (3, 3));
        let two = WitnessArgs { quorum: Some(2), ..Default::default() }.policy_with(Some(&env)).unwrap().unwrap();
        assert_eq!((two.keys.len(), two.quorum), (3, 2));
        let given = WitnessArgs { witnesses: vec![keys[1].clone()], quorum: None }.policy_with(Some(&env)).unwrap().unwrap();
        assert_eq!(given.keys.len(), 1, "--witness replaces EPHEM_WITNESSES");
        assert!(none.policy_with(Some(" , \n")).unwrap().is_none());
        assert!(none.policy_with(Some("not-a-key")).is_err());
    }

    #[test]
    fn seen_checkpoints_catch_forks_rollbacks_and_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let check = |l: &Ledger<SqliteStore>| {
            let (cp, note) = latest(l);
            check_seen(dir.path(), l.store(), &cp, &note).unwrap().map_err(|r| r.check)
        };
        assert_eq!(check(&ledger(0..4)), Ok(SeenCheck { previous: None, size: 4 }));
        assert_eq!(check(&ledger(0..4)), Ok(SeenCheck { previous: Some(4), size: 4 }));
        assert_eq!(check(&ledger(0..9)), Ok(SeenCheck { previous: Some(4), size: 9 }));
        // The operator shows another tree of the size seen: a fork.
        assert_eq!(check(&ledger(100..109)), Err("fork"));
        // An older, smaller tree: a rollback.
        assert_eq!(check(&ledger(0..5)), Err("rollback"));
        // A bigger tree whose history was rewritten: no consistency with the one seen.
        assert_eq!(check(&ledger(100..120)), Err("consistency"));
        // None of the refused ones replaced the one seen.
        assert_eq!(check(&ledger(0..12)), Ok(SeenCheck { previous: Some(9), size: 12 }));
    }
}
