//! `add-checkpoint` (c2sp.org/tlog-witness): the checks, in the spec's order, each refusal a
//! variant naming the check and carrying the HTTP status the spec gives it.

use std::sync::Mutex;

use base64::{engine::general_purpose::STANDARD, Engine};
use receipts_ledger::cosignature::{add_signature_lines, CosignerSigner};
use receipts_ledger::merkle::{verify_consistency, Hash};
use receipts_ledger::note::{Note, NoteError};
use receipts_ledger::{Checkpoint, VerifierKey};
use sha2::{Digest, Sha256};

use crate::state::{LogState, State, StateError};

/// Most consistency proof lines a request may carry.
pub const MAX_PROOF_LINES: usize = 63;

/// Why the witness did not cosign.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("unknown log origin {0:?}")]
    UnknownLog(String),
    #[error("checkpoint signature: {0}")]
    Signature(NoteError),
    #[error("old size {old} is beyond the checkpoint size {size}")]
    OldBeyondSize { old: u64, size: u64 },
    #[error("old size {old} is not the size {known} last cosigned")]
    Conflict { old: u64, known: u64 },
    #[error("a checkpoint of size 0 must have the empty tree's root")]
    EmptyTreeRoot,
    #[error("a proof from old size 0 must be empty")]
    ProofFromEmpty,
    #[error("size {size} was already cosigned with another root")]
    Fork { size: u64 },
    #[error("consistency proof from {old} to {size} does not verify: {why}")]
    Inconsistent { old: u64, size: u64, why: String },
    #[error("state: {0}")]
    State(#[from] StateError),
}

impl Refusal {
    /// The HTTP status c2sp.org/tlog-witness gives this refusal.
    pub fn status(&self) -> u16 {
        match self {
            Self::Malformed(_) | Self::OldBeyondSize { .. } => 400,
            Self::Signature(_) => 403,
            Self::UnknownLog(_) => 404,
            Self::Conflict { .. } => 409,
            Self::EmptyTreeRoot | Self::ProofFromEmpty | Self::Fork { .. } | Self::Inconsistent { .. } => 422,
            Self::State(_) => 500,
        }
    }

    /// The check's name, as logs and tests use it.
    pub fn check(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "request",
            Self::UnknownLog(_) => "origin",
            Self::Signature(_) => "signature",
            Self::OldBeyondSize { .. } => "old_size",
            Self::Conflict { .. } => "conflict",
            Self::EmptyTreeRoot => "empty_root",
            Self::ProofFromEmpty => "proof_from_empty",
            Self::Fork { .. } => "fork",
            Self::Inconsistent { .. } => "consistency",
            Self::State(_) => "state",
        }
    }
}

/// A parsed `add-checkpoint` body.
#[derive(Debug)]
pub struct AddCheckpoint {
    pub old: u64,
    pub proof: Vec<Hash>,
    pub note: String,
}

fn decimal(s: &str) -> Option<u64> {
    let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok { s.parse().ok() } else { None }
}

impl AddCheckpoint {
    pub fn parse(body: &[u8]) -> Result<Self, Refusal> {
        let bad = |why: &str| Refusal::Malformed(why.to_owned());
        let text = std::str::from_utf8(body).map_err(|_| bad("not UTF-8"))?;
        let (first, mut rest) = text.split_once('\n').ok_or_else(|| bad("no old size line"))?;
        let old = first.strip_prefix("old ").and_then(decimal).ok_or_else(|| bad("old size line is not `old <decimal>`"))?;
        let mut proof = Vec::new();
        loop {
            let (line, after) = rest.split_once('\n').ok_or_else(|| bad("no blank line before the checkpoint"))?;
            rest = after;
            if line.is_empty() {
                break;
            }
            if proof.len() == MAX_PROOF_LINES {
                return Err(bad("more than 63 proof lines"));
            }
            let hash: Hash = STANDARD
                .decode(line)
                .ok()
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| bad("a proof line is not base64 of 32 bytes"))?;
            proof.push(hash);
        }
        Ok(Self { old, proof, note: rest.to_owned() })
    }
}

/// A witness: its key, the logs it knows, its state.
pub struct Witness {
    signer: CosignerSigner,
    logs: Vec<VerifierKey>,
    state: Mutex<State>,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl Witness {
    pub fn new(signer: CosignerSigner, logs: Vec<VerifierKey>, state: State) -> Self {
        let clock = Box::new(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(1)
        });
        Self { signer, logs, state: Mutex::new(state), clock }
    }

    /// Replaces the clock (seconds since the epoch), for tests.
    pub fn with_clock(mut self, clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    pub fn signer(&self) -> &CosignerSigner {
        &self.signer
    }

    /// Checks a request and, if everything holds, records the checkpoint and returns the
    /// cosignature line. The check of the old size and the write of the new state happen under
    /// one lock, so two requests cannot both pass against the same old state.
    pub fn add_checkpoint(&self, body: &[u8]) -> Result<String, Refusal> {
        let req = AddCheckpoint::parse(body)?;
        let note = Note::parse(req.note.as_bytes()).map_err(|e| Refusal::Malformed(format!("checkpoint note: {e}")))?;
        let cp = Checkpoint::parse(&note.text).map_err(|e| Refusal::Malformed(format!("checkpoint: {e}")))?;
        let logs: Vec<VerifierKey> = self.logs.iter().filter(|k| k.name() == cp.origin).cloned().collect();
        if logs.is_empty() {
            return Err(Refusal::UnknownLog(cp.origin));
        }
        note.verify(&logs).map_err(Refusal::Signature)?;
        if req.old > cp.size {
            return Err(Refusal::OldBeyondSize { old: req.old, size: cp.size });
        }
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = state.get(&cp.origin).cloned();
        let known_size = known.as_ref().map_or(0, |k| k.size);
        if req.old != known_size {
            return Err(Refusal::Conflict { old: req.old, known: known_size });
        }
        if cp.size == 0 && cp.root != <[u8; 32]>::from(Sha256::digest(b"")) {
            return Err(Refusal::EmptyTreeRoot);
        }
        // A cosigned empty tree is consistent with anything: as if none.
        match known.as_ref().filter(|k| k.size > 0) {
            None if !req.proof.is_empty() => return Err(Refusal::ProofFromEmpty),
            None => {}
            Some(k) => {
                let known_root = k.root_hash().ok_or_else(|| Refusal::Malformed("stored root".into()))?;
                if k.size == cp.size {
                    if known_root != cp.root || !req.proof.is_empty() {
                        return Err(Refusal::Fork { size: cp.size });
                    }
                } else {
                    verify_consistency(k.size, cp.size, &known_root, &cp.root, &req.proof).map_err(|e| {
                        Refusal::Inconsistent { old: k.size, size: cp.size, why: e.to_string() }
                    })?;
                }
            }
        }
        let line = self.signer.cosign(&note.text, (self.clock)().max(1));
        let cosigned = add_signature_lines(&req.note, &line).map_err(|e| Refusal::Malformed(e.to_string()))?;
        state.put(&cp.origin, LogState { size: cp.size, root: STANDARD.encode(cp.root), checkpoint: cosigned })?;
        Ok(line)
    }

    /// The latest checkpoint cosigned for the log whose origin hashes (SHA-256, lowercase
    /// hex) to `origin_hash`: the monitoring endpoint's answer.
    pub fn latest(&self, origin_hash: &str) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.logs
            .iter()
            .find(|k| hex::encode(Sha256::digest(k.name().as_bytes())) == origin_hash)
            .and_then(|k| state.get(k.name()))
            .map(|l| l.checkpoint.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use receipts_ledger::merkle::MemoryTree;
    use receipts_ledger::note::SignerKey;
    use receipts_ledger::witness_client::add_checkpoint_body;

    fn setup() -> (tempfile::TempDir, SignerKey, Witness) {
        let dir = tempfile::tempdir().unwrap();
        let log = SignerKey::from_seed("log.example", &[1; 32]).unwrap();
        let state = State::open(&dir.path().join("s.json")).unwrap();
        let w = Witness::new(CosignerSigner::from_seed("w.example", &[2; 32]).unwrap(), vec![log.verifier()], state);
        (dir, log, w.with_clock(|| 1_700_000_000))
    }

    fn signed(log: &SignerKey, size: u64, root: Hash) -> String {
        Checkpoint::new("log.example", size, root).sign(log).unwrap()
    }

    fn tree(n: u64, salt: &str) -> MemoryTree {
        let mut t = MemoryTree::new();
        for i in 0..n {
            t.push(format!("{salt}{i}").as_bytes());
        }
        t
    }

    fn root(t: &MemoryTree, size: u64) -> Hash {
        receipts_ledger::merkle::root_at(t, size).unwrap()
    }

    fn check(w: &Witness, old: u64, proof: &[Hash], note: &str) -> Result<String, &'static str> {
        w.add_checkpoint(add_checkpoint_body(old, proof, note).as_bytes()).map_err(|r| r.check())
    }

    #[test]
    fn each_check_refuses_by_name() {
        let (_d, log, w) = setup();
        let t = tree(5, "e");
        let five = signed(&log, 5, root(&t, 5));
        // A proof from old size 0, and a size-0 tree with another root than the empty one.
        assert_eq!(check(&w, 0, &[[0; 32]], &five), Err("proof_from_empty"));
        assert_eq!(check(&w, 0, &[], &signed(&log, 0, [1; 32])), Err("empty_root"));
        assert_eq!(check(&w, 6, &[], &five), Err("old_size"));
        assert!(check(&w, 0, &[], &five).is_ok());
        // The same checkpoint again from old size 5 is cosigned again; from 0 it is a conflict.
        assert!(check(&w, 5, &[], &five).is_ok());
        assert_eq!(check(&w, 0, &[], &five), Err("conflict"));
        // 5 -> 8: a right proof is cosigned, a wrong one and a rewritten tree are not.
        let t8 = tree(8, "e");
        let proof = receipts_ledger::merkle::consistency_proof(&t8, 5, 8).unwrap();
        let eight = signed(&log, 8, root(&t8, 8));
        let mut bad = proof.clone();
        bad[0][0] ^= 1;
        assert_eq!(check(&w, 5, &bad, &eight), Err("consistency"));
        let other = tree(8, "x");
        let other_proof = receipts_ledger::merkle::consistency_proof(&other, 5, 8).unwrap();
        assert_eq!(check(&w, 5, &other_proof, &signed(&log, 8, root(&other, 8))), Err("consistency"));
        let line = check(&w, 5, &proof, &eight).unwrap();
        assert!(line.starts_with("\u{2014} w.example "));
        assert_eq!(check(&w, 8, &[], &signed(&log, 8, root(&other, 8))), Err("fork"));
        // Malformed bodies.
        for body in ["", "old 01\n\n", "old 1\nAAAA\n\nx", "old 1\n"] {
            assert_eq!(w.add_checkpoint(body.as_bytes()).map_err(|r| r.check()), Err("request"), "{body:?}");
        }
        let lines: String = (0..64).map(|_| "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").collect();
        assert_eq!(w.add_checkpoint(format!("old 8\n{lines}\n{eight}").as_bytes()).map_err(|r| r.check()), Err("request"));
        assert_eq!(Refusal::Conflict { old: 0, known: 5 }.status(), 409);
        assert!(w.latest(&hex::encode(Sha256::digest(b"log.example"))).unwrap().contains(line.trim_end()));
    }
}
