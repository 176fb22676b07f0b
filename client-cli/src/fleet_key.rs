//! `ephem-batch fleet check-key`: is a fleet KMS key one that releases only to the measured
//! image and wraps nothing anyone chose? (docs/protocol.md §7.3.2)
//!
//! The checks are `protocol::key_checks`, the same the enclave runs before it creates an epoch
//! and a client re-runs on every genesis: here on what the caller's own credentials read
//! (`DescribeKey`, `GetKeyPolicy`, `ListGrants`). Nobody needs to run this for a tenant to be
//! safe — every epoch carries its proof — but an auditor with access to the account can.

pub mod memory;

pub use protocol::key_checks::{CheckOutcome, KeyCheck, KeyReport};
use protocol::attestation::Policy;
use protocol::key_checks::{self, KeyEvidence};
use protocol::kms_arn::KmsKeyArn;

/// Runs every check on a key's evidence against the signed policy's PCR0.
pub fn check(evidence: &KeyEvidence, key: &KmsKeyArn, policy: &Policy) -> KeyReport {
    let pcr0 = policy.pcrs.get(&0).cloned().unwrap_or_default();
    key_checks::evaluate(evidence, key, &pcr0)
}

/// The report as lines, one per check.
pub fn print(report: &KeyReport) {
    println!("fleet key {}", report.key);
    for check in &report.checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        println!("{mark}  {:36}  {}", check.name.as_str(), check.detail);
    }
    println!("{}", if report.passed() { "the key releases only to the measured image" } else { "NOT a key clients may seal under" });
}

#[cfg(test)]
mod tests;
