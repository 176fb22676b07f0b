//! The verifier: runs every check in order, stops at the first failure, and reports each by name.
//!
//! Order: `cbor`, `cose_structure`, `alg_es384`, `signature`, `chain`, `root_pinned`, `validity`,
//! `pcr_policy`, `debug_mode`, `freshness`, `nonce`, `user_data_binding`, `fleet_kms_key`. Nothing in the payload
//! is believed (PCRs, nonce, user_data, timestamp) before the signature, the chain and the root
//! pin have passed.

use std::collections::BTreeMap;

use p384::ecdsa::Signature;
use p384::ecdsa::signature::Verifier;

use super::binding::UserDataBinding;
use super::cbor::ShortHex;
use super::check::{Check, CheckName, Report, RootInfo, VerifiedDocument};
use super::document::{self, AttestationDocument, Parsed};
use super::error::{
    AttestationError, CertRole, ChainError, DebugModeError, FleetKmsKeyError, FreshnessError, NonceError, PcrPolicyError,
    RootPinError, SignatureError, UserDataBindingError, ValidityError,
};
use super::roots::TrustAnchor;
use super::x509::{self, Cert, format_ms};
use crate::kms_arn::KmsKeyArn;

/// Default maximum document age (DESIGN.md §4, policy `max_age_s`).
pub const DEFAULT_MAX_AGE_S: u64 = 3600;
/// Default tolerance for a document timestamp ahead of the verifier's clock.
pub const DEFAULT_MAX_FUTURE_SKEW_S: u64 = 300;

/// What a verification expects. `now_ms` is always the caller's: the library never reads a clock.
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// The root `cabundle[0]` must equal.
    pub root: TrustAnchor,
    /// Verification time, ms since the UNIX epoch (a client: its clock; an auditor: the
    /// document's own timestamp).
    pub now_ms: u64,
    /// PCR index → exact expected value. Empty: `pcr_policy` is not evaluated.
    pub expected_pcrs: BTreeMap<u8, Vec<u8>>,
    /// Accept PCR0/1/2 all zero (an enclave started with `--debug-mode`).
    pub allow_debug: bool,
    pub max_age_s: u64,
    pub max_future_skew_s: u64,
    /// `Some`: the document's nonce must equal it.
    pub expected_nonce: Option<Vec<u8>>,
    /// `user_data` must decode as a [`UserDataBinding`].
    pub require_binding: bool,
    /// `Some`: the binding must name this KMS key (implies `require_binding`).
    pub expected_fleet_kms_key: Option<KmsKeyArn>,
}

impl VerifyOptions {
    /// Defaults: no PCR expectations, debug refused, max age 3600 s, skew 300 s, no nonce,
    /// binding not required.
    pub fn new(root: TrustAnchor, now_ms: u64) -> Self {
        VerifyOptions {
            root,
            now_ms,
            expected_pcrs: BTreeMap::new(),
            allow_debug: false,
            max_age_s: DEFAULT_MAX_AGE_S,
            max_future_skew_s: DEFAULT_MAX_FUTURE_SKEW_S,
            expected_nonce: None,
            require_binding: false,
            expected_fleet_kms_key: None,
        }
    }

    /// [`VerifyOptions::new`] with the AWS Nitro Enclaves root G1.
    pub fn aws(now_ms: u64) -> Self {
        VerifyOptions::new(TrustAnchor::aws_nitro_g1(), now_ms)
    }

    pub fn expect_pcr(mut self, index: u8, value: impl Into<Vec<u8>>) -> Self {
        self.expected_pcrs.insert(index, value.into());
        self
    }
}

/// Verifies a document, returning the first failed check as an error.
pub fn verify(bytes: &[u8], options: &VerifyOptions) -> Result<VerifiedDocument, AttestationError> {
    verify_report(bytes, options).into_result()
}

/// Verifies a document and reports every evaluated check.
pub fn verify_report(bytes: &[u8], options: &VerifyOptions) -> Report {
    let mut run = Run { checks: Vec::new(), document: None };
    let outcome = run.all(bytes, options);
    Report {
        checks: run.checks,
        document: run.document,
        root: root_info(&options.root),
        verified_at_ms: options.now_ms,
        outcome,
    }
}

pub(crate) fn root_info(root: &TrustAnchor) -> RootInfo {
    RootInfo { kind: root.kind(), label: root.label(), subject: root.subject().to_owned(), sha256: root.sha256() }
}

struct Run {
    checks: Vec<Check>,
    document: Option<AttestationDocument>,
}

impl Run {
    fn step<T, E: Into<AttestationError>>(
        &mut self,
        name: CheckName,
        result: Result<T, E>,
        detail: impl FnOnce(&T) -> String,
    ) -> Result<T, AttestationError> {
        match result {
            Ok(value) => {
                self.checks.push(Check { name, passed: true, detail: detail(&value) });
                Ok(value)
            }
            Err(error) => {
                let error = error.into();
                debug_assert_eq!(error.check(), name);
                self.checks.push(Check { name, passed: false, detail: error.reason() });
                Err(error)
            }
        }
    }

    fn all(&mut self, bytes: &[u8], opts: &VerifyOptions) -> Result<VerifiedDocument, AttestationError> {
        let layers = self.step(CheckName::Cbor, document::decode_layers(bytes), |_| {
            format!("document ({} bytes), protected header and payload are well-formed CBOR", bytes.len())
        })?;
        let parsed = self.step(CheckName::CoseStructure, document::check_structure(&layers), |p| {
            format!(
                "{} COSE_Sign1, unprotected header empty; payload: module_id {}, digest {}, {} PCRs, {} cabundle certificate(s)",
                if p.tagged { "tagged (18)" } else { "untagged" },
                p.document.module_id,
                p.document.digest,
                p.document.pcrs.len(),
                p.document.cabundle.len()
            )
        })?;
        self.document = Some(parsed.document.clone());
        self.step(CheckName::AlgEs384, document::check_alg(&parsed), |_| {
            "protected header is {1: -35} (ES384)".to_owned()
        })?;
        let doc = &parsed.document;
        let leaf = self.step(CheckName::Signature, check_signature(&parsed, &doc.certificate), |leaf| {
            format!("ES384 signature verifies with the leaf key ({})", leaf.subject())
        })?;
        let bundle = self.step(CheckName::Chain, check_chain(doc, &leaf), |bundle| {
            let path: Vec<String> = (0..bundle.len()).map(|i| format!("cabundle[{i}]")).collect();
            format!(
                "{} → leaf: {} link(s) verify (ECDSA P-384/SHA-384), names, CA constraints and key usage hold",
                path.join(" → "),
                bundle.len()
            )
        })?;
        self.step(CheckName::RootPinned, check_root(&bundle, &opts.root), |_| {
            format!("cabundle[0] is the pinned root {}", opts.root.label())
        })?;
        let (not_after, _) =
            self.step(CheckName::Validity, check_validity(&bundle, &leaf, opts.now_ms), |(na, role)| {
                format!(
                    "all {} certificates valid at {}; earliest expiry {} ({role})",
                    bundle.len().saturating_add(1),
                    format_ms(opts.now_ms),
                    format_ms(*na)
                )
            })?;
        if !opts.expected_pcrs.is_empty() {
            self.step(CheckName::PcrPolicy, check_pcrs(doc, &opts.expected_pcrs), |_| {
                let list: Vec<String> = opts.expected_pcrs.keys().map(|i| format!("PCR{i}")).collect();
                format!("{} match the expected values", list.join(", "))
            })?;
        }
        let debug = self.step(CheckName::DebugMode, check_debug(doc, opts.allow_debug), |debug| {
            if *debug {
                "debug mode (PCR0/1/2 all zero), allowed by allow_debug".to_owned()
            } else {
                "PCR0/1/2 are not all zero: not a debug-mode enclave".to_owned()
            }
        })?;
        self.step(CheckName::Freshness, check_freshness(doc.timestamp_ms, opts), |age_ms| {
            format!(
                "timestamp {} is {} s old (at most {} s allowed)",
                format_ms(doc.timestamp_ms),
                age_ms / 1000,
                opts.max_age_s
            )
        })?;
        if let Some(expected) = &opts.expected_nonce {
            self.step(CheckName::Nonce, check_nonce(doc, expected), |_| {
                format!("nonce matches ({} bytes)", expected.len())
            })?;
        }
        let binding = if opts.require_binding || opts.expected_fleet_kms_key.is_some() {
            Some(self.step(CheckName::UserDataBinding, check_binding(doc), |b| {
                format!(
                    "binding v2: fleet key {}, receipt key {}, epoch {} until {}, KMS key {}",
                    hex::encode(b.fleet_key_id()),
                    hex::encode(b.receipt_key_id()),
                    b.epoch,
                    format_ms(b.not_after_ms),
                    b.kms_key
                )
            })?)
        } else {
            None
        };
        if let (Some(expected), Some(bound)) = (&opts.expected_fleet_kms_key, &binding) {
            self.step(CheckName::FleetKmsKey, check_fleet_kms_key(bound, expected), |_| {
                format!("the fleet key was released by the deployment's KMS key {expected}")
            })?;
        }
        Ok(VerifiedDocument {
            document: parsed.document.clone(),
            root: root_info(&opts.root),
            binding,
            chain_not_after_ms: not_after,
            debug_mode: debug,
            verified_at_ms: opts.now_ms,
        })
    }
}

/// `signature`: ES384 over `["Signature1", protected, h'', payload]` with the leaf's P-384 key.
fn check_signature<'c>(parsed: &Parsed<'_>, certificate: &'c [u8]) -> Result<Cert<'c>, SignatureError> {
    if parsed.signature.len() != 96 {
        return Err(SignatureError::Length(parsed.signature.len()));
    }
    let leaf = x509::parse(certificate, CertRole::Leaf).map_err(SignatureError::LeafCertificate)?;
    let key = x509::p384_key(&leaf.cert).map_err(SignatureError::LeafKey)?;
    let signature = Signature::from_slice(parsed.signature).map_err(|_| SignatureError::Scalars)?;
    let tbs = document::sig_structure(parsed.protected, parsed.payload);
    key.verify(&tbs, &signature).map_err(|_| SignatureError::Mismatch)?;
    Ok(leaf)
}

/// `chain`: `cabundle[0]` → `cabundle[1]` → … → leaf.
fn check_chain<'d>(doc: &'d AttestationDocument, leaf: &Cert<'_>) -> Result<Vec<Cert<'d>>, ChainError> {
    let mut bundle = Vec::with_capacity(doc.cabundle.len());
    for (i, der) in doc.cabundle.iter().enumerate() {
        bundle.push(x509::parse(der, CertRole::Bundle(i)).map_err(ChainError::Parse)?);
    }
    let count = bundle.len();
    for (i, parent) in bundle.iter().enumerate() {
        let parent_role = CertRole::Bundle(i);
        // CA certificates after this one, not counting the leaf.
        let below = count.saturating_sub(i).saturating_sub(1);
        x509::check_ca(parent, parent_role, below)?;
        match bundle.get(i.saturating_add(1)) {
            Some(child) => x509::verify_link(child, CertRole::Bundle(i.saturating_add(1)), parent, parent_role)?,
            None => x509::verify_link(leaf, CertRole::Leaf, parent, parent_role)?,
        }
    }
    x509::check_leaf(leaf)?;
    Ok(bundle)
}

/// `root_pinned`: `cabundle[0]` is byte-identical to the pinned root.
fn check_root(bundle: &[Cert<'_>], root: &TrustAnchor) -> Result<(), RootPinError> {
    let first = bundle.first();
    if first.map(|c| c.der) == Some(root.der()) {
        return Ok(());
    }
    use sha2::Digest;
    Err(RootPinError {
        subject: first.map(Cert::subject).unwrap_or_default(),
        sha256: hex::encode(sha2::Sha256::digest(first.map(|c| c.der).unwrap_or_default())),
        expected_label: root.label(),
        expected_sha256: hex::encode(root.sha256()),
    })
}

/// `validity`: notBefore ≤ now ≤ notAfter for every certificate. Returns the earliest notAfter.
fn check_validity(bundle: &[Cert<'_>], leaf: &Cert<'_>, now_ms: u64) -> Result<(u64, CertRole), ValidityError> {
    let mut earliest = (u64::MAX, CertRole::Leaf);
    let all = bundle.iter().enumerate().map(|(i, c)| (CertRole::Bundle(i), c)).chain([(CertRole::Leaf, leaf)]);
    for (role, cert) in all {
        let (nb, na) = (cert.not_before_ms(), cert.not_after_ms());
        if now_ms < nb {
            return Err(ValidityError::NotYetValid {
                role,
                subject: cert.subject(),
                not_before: format_ms(nb),
                now: format_ms(now_ms),
            });
        }
        if now_ms > na {
            return Err(ValidityError::Expired {
                role,
                subject: cert.subject(),
                not_after: format_ms(na),
                now: format_ms(now_ms),
            });
        }
        if na < earliest.0 {
            earliest = (na, role);
        }
    }
    Ok(earliest)
}

/// `pcr_policy`: every expected PCR is present and equal.
fn check_pcrs(doc: &AttestationDocument, expected: &BTreeMap<u8, Vec<u8>>) -> Result<(), PcrPolicyError> {
    for (index, want) in expected {
        match doc.pcrs.get(index) {
            None => return Err(PcrPolicyError::Missing { index: *index, expected: hex::encode(want) }),
            Some(got) if got != want => {
                return Err(PcrPolicyError::Mismatch {
                    index: *index,
                    expected: hex::encode(want),
                    actual: hex::encode(got),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// `debug_mode`: returns whether the document is a debug-mode one (allowed).
fn check_debug(doc: &AttestationDocument, allow_debug: bool) -> Result<bool, DebugModeError> {
    let mut all_zero = true;
    for index in 0u8..3 {
        match doc.pcrs.get(&index) {
            None if !allow_debug => return Err(DebugModeError::PcrAbsent(index)),
            None => {}
            Some(v) => all_zero &= v.iter().all(|b| *b == 0),
        }
    }
    if all_zero && !allow_debug {
        return Err(DebugModeError::Debug);
    }
    Ok(all_zero)
}

/// `freshness`: returns the document's age in ms (0 when slightly in the future).
fn check_freshness(timestamp_ms: u64, opts: &VerifyOptions) -> Result<u64, FreshnessError> {
    let now = opts.now_ms;
    if timestamp_ms > now {
        let ahead_ms = timestamp_ms.saturating_sub(now);
        if ahead_ms > opts.max_future_skew_s.saturating_mul(1000) {
            return Err(FreshnessError::InFuture {
                ahead_ms,
                max_skew_s: opts.max_future_skew_s,
                timestamp: format_ms(timestamp_ms),
                now: format_ms(now),
            });
        }
        return Ok(0);
    }
    let age_ms = now.saturating_sub(timestamp_ms);
    if age_ms > opts.max_age_s.saturating_mul(1000) {
        return Err(FreshnessError::TooOld {
            age_s: age_ms / 1000,
            max_age_s: opts.max_age_s,
            timestamp: format_ms(timestamp_ms),
            now: format_ms(now),
        });
    }
    Ok(age_ms)
}

/// `nonce`: byte-for-byte equality.
fn check_nonce(doc: &AttestationDocument, expected: &[u8]) -> Result<(), NonceError> {
    match &doc.nonce {
        None => Err(NonceError::Missing { expected: ShortHex(expected).to_string() }),
        Some(n) if n.as_slice() != expected => Err(NonceError::Mismatch {
            expected: ShortHex(expected).to_string(),
            actual: ShortHex(n).to_string(),
        }),
        Some(_) => Ok(()),
    }
}

/// `fleet_kms_key`: the binding names exactly the expected KMS key ARN.
fn check_fleet_kms_key(binding: &UserDataBinding, expected: &KmsKeyArn) -> Result<(), FleetKmsKeyError> {
    if &binding.kms_key == expected {
        return Ok(());
    }
    Err(FleetKmsKeyError { expected: expected.to_string(), bound: binding.kms_key.to_string() })
}

/// `user_data_binding`: `user_data` decodes as a key binding.
fn check_binding(doc: &AttestationDocument) -> Result<UserDataBinding, UserDataBindingError> {
    let data = doc.user_data.as_deref().ok_or(UserDataBindingError::Absent)?;
    Ok(UserDataBinding::decode(data)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc_with_pcrs(pcrs: &[(u8, u8)]) -> AttestationDocument {
        AttestationDocument {
            module_id: "m".into(),
            digest: "SHA384".into(),
            timestamp_ms: 1_000_000,
            pcrs: pcrs.iter().map(|(i, b)| (*i, vec![*b; 48])).collect(),
            certificate: vec![],
            cabundle: vec![],
            public_key: None,
            user_data: None,
            nonce: Some(vec![1, 2, 3]),
        }
    }

    #[test]
    fn debug_detection() {
        let debug = doc_with_pcrs(&[(0, 0), (1, 0), (2, 0)]);
        assert_eq!(check_debug(&debug, false), Err(DebugModeError::Debug));
        assert_eq!(check_debug(&debug, true), Ok(true));
        let prod = doc_with_pcrs(&[(0, 1), (1, 0), (2, 0)]);
        assert_eq!(check_debug(&prod, false), Ok(false));
        let missing = doc_with_pcrs(&[(0, 1), (2, 1)]);
        assert_eq!(check_debug(&missing, false), Err(DebugModeError::PcrAbsent(1)));
    }

    #[test]
    fn pcr_policy() {
        let doc = doc_with_pcrs(&[(0, 1), (1, 2)]);
        let want: BTreeMap<u8, Vec<u8>> = [(0, vec![1; 48])].into();
        assert_eq!(check_pcrs(&doc, &want), Ok(()));
        let want: BTreeMap<u8, Vec<u8>> = [(1, vec![3; 48])].into();
        assert!(matches!(check_pcrs(&doc, &want), Err(PcrPolicyError::Mismatch { index: 1, .. })));
        let want: BTreeMap<u8, Vec<u8>> = [(8, vec![0; 48])].into();
        assert!(matches!(check_pcrs(&doc, &want), Err(PcrPolicyError::Missing { index: 8, .. })));
    }

    #[test]
    fn freshness_bounds() {
        let mut opts = VerifyOptions::aws(1_000_000 + 3_600_000);
        assert_eq!(check_freshness(1_000_000, &opts), Ok(3_600_000));
        opts.now_ms += 1;
        assert!(matches!(check_freshness(1_000_000, &opts), Err(FreshnessError::TooOld { age_s: 3600, .. })));
        opts.now_ms = 1_000_000 - 300_000;
        assert_eq!(check_freshness(1_000_000, &opts), Ok(0));
        opts.now_ms -= 1;
        assert!(matches!(check_freshness(1_000_000, &opts), Err(FreshnessError::InFuture { .. })));
        opts.max_age_s = u64::MAX;
        opts.now_ms = u64::MAX;
        assert!(check_freshness(0, &opts).is_ok());
    }

    #[test]
    fn nonce_check() {
        let doc = doc_with_pcrs(&[]);
        assert_eq!(check_nonce(&doc, &[1, 2, 3]), Ok(()));
        assert!(matches!(check_nonce(&doc, &[1, 2]), Err(NonceError::Mismatch { .. })));
        let mut no_nonce = doc.clone();
        no_nonce.nonce = None;
        assert!(matches!(check_nonce(&no_nonce, &[1]), Err(NonceError::Missing { .. })));
    }
}
