//! Check names and the verification report.

use core::fmt;

use super::binding::UserDataBinding;
use super::document::AttestationDocument;
use super::error::AttestationError;
use super::roots::RootKind;

/// One verifier check. The names ([`CheckName::as_str`]) are stable: the CLI prints them and
/// tests match on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckName {
    /// The document, its protected header and its payload are well-formed CBOR.
    Cbor,
    /// COSE_Sign1 shape (tag 18 or untagged, protected `{1: alg}`, unprotected `{}`) and the
    /// payload schema with the spec's limits.
    CoseStructure,
    /// The protected header is exactly `{1: -35}` (ES384).
    AlgEs384,
    /// ES384 signature over the Sig_structure with the leaf certificate's P-384 key.
    Signature,
    /// `cabundle[0]` → … → leaf: names, ECDSA-P384-SHA384 signatures, CA constraints, key usage.
    Chain,
    /// `cabundle[0]` is byte-identical to the pinned root.
    RootPinned,
    /// Every certificate is valid at the verification time.
    Validity,
    /// Expected PCRs match exactly (only evaluated when some are expected).
    PcrPolicy,
    /// PCR0/1/2 are not all zero, unless debug is allowed.
    DebugMode,
    /// Timestamp within the maximum age, and not in the future beyond the allowed skew.
    Freshness,
    /// The nonce equals the expected one (only evaluated when one is expected).
    Nonce,
    /// `user_data` decodes as a key binding (only evaluated when requested).
    UserDataBinding,
    /// The binding names the deployment's KMS key (only evaluated when one is expected).
    FleetKmsKey,
}

impl CheckName {
    /// Every check, in the order the verifier runs them.
    pub const ALL: [CheckName; 13] = [
        CheckName::Cbor,
        CheckName::CoseStructure,
        CheckName::AlgEs384,
        CheckName::Signature,
        CheckName::Chain,
        CheckName::RootPinned,
        CheckName::Validity,
        CheckName::PcrPolicy,
        CheckName::DebugMode,
        CheckName::Freshness,
        CheckName::Nonce,
        CheckName::UserDataBinding,
        CheckName::FleetKmsKey,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckName::Cbor => "cbor",
            CheckName::CoseStructure => "cose_structure",
            CheckName::AlgEs384 => "alg_es384",
            CheckName::Signature => "signature",
            CheckName::Chain => "chain",
            CheckName::RootPinned => "root_pinned",
            CheckName::Validity => "validity",
            CheckName::PcrPolicy => "pcr_policy",
            CheckName::DebugMode => "debug_mode",
            CheckName::Freshness => "freshness",
            CheckName::Nonce => "nonce",
            CheckName::UserDataBinding => "user_data_binding",
            CheckName::FleetKmsKey => "fleet_kms_key",
        }
    }

    pub fn from_name(name: &str) -> Option<CheckName> {
        CheckName::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for CheckName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one evaluated check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: CheckName,
    pub passed: bool,
    /// What was checked (when passed) or what failed.
    pub detail: String,
}

/// The root a verification trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootInfo {
    pub kind: RootKind,
    /// `aws-nitro-g1`, or a description with subject and SHA-256.
    pub label: String,
    pub subject: String,
    pub sha256: [u8; 32],
}

impl RootInfo {
    /// True for the development issuer's roots: documents under them prove nothing about
    /// Nitro hardware.
    pub fn is_development(&self) -> bool {
        self.kind == RootKind::Development
    }
}

/// A document that passed every evaluated check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedDocument {
    pub document: AttestationDocument,
    pub root: RootInfo,
    /// The decoded `user_data` binding, when the verification required it.
    pub binding: Option<UserDataBinding>,
    /// Earliest `notAfter` in the chain (ms): the document cannot verify at a later "now".
    pub chain_not_after_ms: u64,
    /// True if the document runs in debug mode (allowed by the options).
    pub debug_mode: bool,
    /// The verification time used.
    pub verified_at_ms: u64,
}

/// Every evaluated check in order, up to and including the first failure.
///
/// Checks after a failure are not evaluated (in particular nothing about PCRs is looked at
/// before the signature and the chain have passed); optional checks that were not requested
/// (`pcr_policy` without expected PCRs, `nonce` without an expected nonce, `user_data_binding`
/// when not required) are not evaluated either. [`Report::not_evaluated`] lists both kinds.
#[derive(Clone, Debug)]
pub struct Report {
    pub checks: Vec<Check>,
    /// The decoded payload, when the structure checks passed (untrusted unless `is_valid()`).
    pub document: Option<AttestationDocument>,
    pub root: RootInfo,
    pub verified_at_ms: u64,
    pub(crate) outcome: Result<VerifiedDocument, AttestationError>,
}

impl Report {
    pub fn is_valid(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The first failed check, if any.
    pub fn error(&self) -> Option<&AttestationError> {
        self.outcome.as_ref().err()
    }

    /// The verified document, when every evaluated check passed.
    pub fn verified(&self) -> Option<&VerifiedDocument> {
        self.outcome.as_ref().ok()
    }

    pub fn failed_check(&self) -> Option<CheckName> {
        self.error().map(AttestationError::check)
    }

    /// Checks that were not evaluated (after a failure, or not requested).
    pub fn not_evaluated(&self) -> Vec<CheckName> {
        CheckName::ALL.into_iter().filter(|n| !self.checks.iter().any(|c| c.name == *n)).collect()
    }

    pub fn check(&self, name: CheckName) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    pub fn into_result(self) -> Result<VerifiedDocument, AttestationError> {
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_round_trip() {
        let names: Vec<&str> = CheckName::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "cbor",
                "cose_structure",
                "alg_es384",
                "signature",
                "chain",
                "root_pinned",
                "validity",
                "pcr_policy",
                "debug_mode",
                "freshness",
                "nonce",
                "user_data_binding",
                "fleet_kms_key"
            ]
        );
        for c in CheckName::ALL {
            assert_eq!(CheckName::from_name(c.as_str()), Some(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        assert_eq!(CheckName::from_name("sig"), None);
        let mut sorted = CheckName::ALL;
        sorted.sort();
        assert_eq!(sorted, CheckName::ALL);
    }
}
