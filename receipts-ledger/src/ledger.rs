//! The appender: checks each receipt with the pluggable [`ReceiptCheck`],
//! refuses claimed fields that differ from the receipt's, and appends through
//! a [`LedgerStore`], signing checkpoints by the [`CheckpointPolicy`].

use crate::entry::{AppendRequest, FieldError, IndexedFields, ReceiptCheck, ReceiptRefusal};
use crate::merkle::{consistency_proof, Hash, ProofError};
use crate::note::{NoteSigner, VerifierKey};
use crate::store::{AppendOutcome, CheckpointPolicy, LedgerStore, StoreError, StoredCheckpoint};
use crate::witness_client::{CosignReport, WitnessClient, WitnessClientError};

/// Why an append or a proof failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("request {position}: receipt check failed: {reason}")]
    ReceiptRejected { position: usize, reason: ReceiptRefusal },
    #[error("request {position}: claimed field {field} differs from the receipt")]
    FieldMismatch { position: usize, field: &'static str },
    #[error("request {position}: {error}")]
    InvalidField { position: usize, error: FieldError },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Proof(#[from] ProofError),
    #[error("tree size {size} is beyond the ledger's {ledger_size} entries")]
    BeyondEnd { size: u64, ledger_size: u64 },
}

/// A receipt a ledger's check accepted, with the fields it really carries (the policy the
/// check enforced among them). Only [`Ledger::check`] makes one.
#[derive(Debug, Clone)]
pub struct CheckedReceipt(AppendRequest);

impl CheckedReceipt {
    pub fn fields(&self) -> &IndexedFields {
        &self.0.fields
    }
}

/// A ledger that appends: storage, receipt check, signing key, policy.
pub struct Ledger<S: LedgerStore> {
    store: S,
    check: Box<dyn ReceiptCheck>,
    signer: Box<dyn NoteSigner>,
    policy: CheckpointPolicy,
    witnesses: Option<WitnessClient>,
}

impl<S: LedgerStore> Ledger<S> {
    pub fn new(store: S, check: Box<dyn ReceiptCheck>, signer: Box<dyn NoteSigner>, policy: CheckpointPolicy) -> Self {
        Self { store, check, signer, policy, witnesses: None }
    }

    /// Submits checkpoints to `witnesses` when [`Ledger::cosign_latest`] is called.
    pub fn with_witnesses(mut self, witnesses: Option<WitnessClient>) -> Self {
        self.witnesses = witnesses;
        self
    }

    /// The latest checkpoint submitted to the configured witnesses and their cosignatures
    /// stored on it; `None` without witnesses.
    pub fn cosign_latest(&self) -> Option<Result<CosignReport, WitnessClientError>> {
        self.witnesses.as_ref().map(|w| w.cosign_latest(&self.store))
    }

    /// Appends one receipt; `now_ms` is the caller's clock (Unix ms).
    pub fn append(&mut self, request: AppendRequest, now_ms: u64) -> Result<AppendOutcome, LedgerError> {
        let mut out = self.append_batch(std::slice::from_ref(&request), now_ms)?;
        Ok(out.remove(0))
    }

    /// Appends several receipts in one transaction (all or none).
    ///
    /// The policy recorded with each entry is the one this ledger's check found, whatever the
    /// request claims: the index says which policy the appender itself enforced.
    pub fn append_batch(&mut self, batch: &[AppendRequest], now_ms: u64) -> Result<Vec<AppendOutcome>, LedgerError> {
        let mut batch = std::borrow::Cow::Borrowed(batch);
        for position in 0..batch.len() {
            let req = &batch[position];
            req.fields.validate().map_err(|error| LedgerError::InvalidField { position, error })?;
            let actual = self
                .check
                .check(&req.leaf, &req.attestation_document)
                .map_err(|reason| LedgerError::ReceiptRejected { position, reason })?;
            if let Some(field) = req.fields.first_difference(&actual) {
                return Err(LedgerError::FieldMismatch { position, field });
            }
            if req.fields.policy != actual.policy {
                batch.to_mut()[position].fields.policy = actual.policy;
            }
        }
        Ok(self.store.append(&batch, self.signer.as_ref(), &self.policy, now_ms)?)
    }

    /// Checks `leaf` and its attestation document with this ledger's check, once: the caller
    /// may look at the fields the receipt really carries (a queue message's job id, say)
    /// before [`append_checked`](Self::append_checked) appends it without checking again.
    pub fn check(&self, leaf: Vec<u8>, attestation_document: Vec<u8>) -> Result<CheckedReceipt, LedgerError> {
        let fields = self
            .check
            .check(&leaf, &attestation_document)
            .map_err(|reason| LedgerError::ReceiptRejected { position: 0, reason })?;
        fields.validate().map_err(|error| LedgerError::InvalidField { position: 0, error })?;
        Ok(CheckedReceipt(AppendRequest { leaf, fields, attestation_document }))
    }

    /// Appends a receipt [`check`](Self::check) accepted.
    pub fn append_checked(&mut self, receipt: CheckedReceipt, now_ms: u64) -> Result<AppendOutcome, LedgerError> {
        let mut out = self.store.append(std::slice::from_ref(&receipt.0), self.signer.as_ref(), &self.policy, now_ms)?;
        Ok(out.remove(0))
    }

    /// Signs a checkpoint if the policy's time or count says so (call it
    /// periodically).
    pub fn tick(&mut self, now_ms: u64) -> Result<Option<StoredCheckpoint>, LedgerError> {
        Ok(self.store.checkpoint(self.signer.as_ref(), &self.policy, now_ms, false)?)
    }

    /// Signs a checkpoint of the current tree unless the latest one already covers it.
    pub fn checkpoint_now(&mut self, now_ms: u64) -> Result<Option<StoredCheckpoint>, LedgerError> {
        Ok(self.store.checkpoint(self.signer.as_ref(), &self.policy, now_ms, true)?)
    }

    pub fn verifier(&self) -> VerifierKey {
        self.signer.verifier()
    }

    /// The ledger's signer: what signs its checkpoints, and the COSE Receipts of its entries.
    pub fn signer(&self) -> &dyn NoteSigner {
        self.signer.as_ref()
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn into_store(self) -> S {
        self.store
    }
}

/// The consistency proof between two tree sizes of a stored ledger.
pub fn consistency(store: &dyn LedgerStore, first: u64, second: u64) -> Result<Vec<Hash>, LedgerError> {
    let ledger_size = store.size()?;
    if second > ledger_size {
        return Err(LedgerError::BeyondEnd { size: second, ledger_size });
    }
    Ok(consistency_proof(store, first, second)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::merkle::verify_consistency;
    use crate::note::SignerKey;
    use crate::store::SqliteStore;
    use crate::testing::{test_request, TestReceipts};

    fn ledger(every: u64) -> Ledger<SqliteStore> {
        Ledger::new(
            SqliteStore::open_in_memory().unwrap(),
            Box::new(TestReceipts),
            Box::new(SignerKey::from_seed("ledger.test", &[1; 32]).unwrap()),
            CheckpointPolicy { every_appends: every, every_ms: u64::MAX },
        )
    }

    #[test]
    fn check_hook_guards_the_claimed_fields() {
        let mut l = ledger(2);
        let mut r = test_request(1, 100);
        l.append(r.clone(), 1).unwrap();
        r.fields.ok_count += 1;
        r.fields.job_id = crate::testing::test_job(2);
        assert!(matches!(l.append(r, 2), Err(LedgerError::FieldMismatch { field: "job_id", position: 0 })));
        let mut r = test_request(3, 100);
        r.attestation_document.push(0);
        assert!(matches!(l.append(r, 3), Err(LedgerError::ReceiptRejected { .. })));
        let mut r = test_request(4, 100);
        r.leaf[0] ^= 1;
        assert!(matches!(l.append(r, 4), Err(LedgerError::ReceiptRejected { .. })));
        assert_eq!(l.store().size().unwrap(), 1);
    }

    #[test]
    fn any_two_checkpoints_are_consistent() {
        let mut l = ledger(3);
        for j in 0..20 {
            l.append(test_request(j, 64), j).unwrap();
        }
        l.checkpoint_now(100).unwrap();
        let key = l.verifier();
        let cps: Vec<Checkpoint> = l
            .store()
            .checkpoints()
            .unwrap()
            .iter()
            .map(|c| Checkpoint::open(c.note.as_bytes(), &key).unwrap())
            .collect();
        assert_eq!(cps.iter().map(|c| c.size).collect::<Vec<_>>(), vec![3, 6, 9, 12, 15, 18, 20]);
        for a in &cps {
            for b in cps.iter().filter(|b| b.size >= a.size) {
                let p = consistency(l.store(), a.size, b.size).unwrap();
                verify_consistency(a.size, b.size, &a.root, &b.root, &p).unwrap();
            }
        }
        assert!(matches!(consistency(l.store(), 3, 21), Err(LedgerError::BeyondEnd { .. })));
    }
}
