//! The embedded default: the cloud on one machine, under one directory (`$EPHEM_HOME`).
//!
//! ```text
//! $EPHEM_HOME/objects/{jobs,models,attestations}/   object stores (DirObjectStore)
//! $EPHEM_HOME/queues.sqlite                          job + ledger queues and their DLQs (SqliteQueue)
//! $EPHEM_HOME/kms.sqlite                             local KMS keys and policies (LocalKms)
//! ```

pub mod kms;
pub mod objects;
pub mod queue;
