//! X.509 pieces of the verifier: parsing a certificate with its exact TBS bytes, P-384 keys,
//! one chain link (issuer → subject), CA constraints, and validity windows.
//!
//! Only ECDSA P-384 with SHA-384 is accepted anywhere in the chain: that is what AWS issues, and
//! what the development issuer issues.

use core::time::Duration;

use der::{Decode, Encode, Reader, SliceReader, asn1::ObjectIdentifier};
use p384::ecdsa::signature::Verifier;
use p384::ecdsa::{DerSignature, VerifyingKey};
use x509_cert::Certificate;
use x509_cert::certificate::Version;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage};

use super::error::{CertParseError, CertRole, ChainError, KeyError};

/// ecdsa-with-SHA384 (RFC 5758).
pub const OID_ECDSA_WITH_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");
/// id-ecPublicKey (RFC 5480).
pub const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
/// secp384r1 (RFC 5480).
pub const OID_SECP384R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const OID_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");

/// A parsed certificate together with the exact bytes it was parsed from.
#[derive(Debug)]
pub(crate) struct Cert<'a> {
    pub der: &'a [u8],
    pub tbs_der: &'a [u8],
    pub cert: Certificate,
}

impl Cert<'_> {
    /// The subject in RFC 4514 form, for messages.
    pub fn subject(&self) -> String {
        self.cert.tbs_certificate().subject().to_string()
    }

    pub fn not_before_ms(&self) -> u64 {
        duration_ms(self.cert.tbs_certificate().validity().not_before.to_unix_duration())
    }

    pub fn not_after_ms(&self) -> u64 {
        duration_ms(self.cert.tbs_certificate().validity().not_after.to_unix_duration())
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Parses one DER certificate (strict DER, no trailing bytes) and locates its TBS bytes.
pub(crate) fn parse(der: &[u8], role: CertRole) -> Result<Cert<'_>, CertParseError> {
    let fail = |e: der::Error| CertParseError { role, reason: e.to_string() };
    let cert = Certificate::from_der(der).map_err(fail)?;
    let mut reader = SliceReader::new(der).map_err(fail)?;
    let _outer = der::Header::decode(&mut reader).map_err(fail)?;
    let tbs_der = reader.tlv_bytes().map_err(fail)?;
    Ok(Cert { der, tbs_der, cert })
}

/// The certificate's subject public key as a P-384 ECDSA verifying key.
pub(crate) fn p384_key(cert: &Certificate) -> Result<VerifyingKey, KeyError> {
    let spki = cert.tbs_certificate().subject_public_key_info();
    if spki.algorithm.oid != OID_EC_PUBLIC_KEY {
        return Err(KeyError::NotEcPublicKey(spki.algorithm.oid.to_string()));
    }
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .ok_or(KeyError::NoCurve)?
        .decode_as::<ObjectIdentifier>()
        .map_err(|_| KeyError::NoCurve)?;
    if curve != OID_SECP384R1 {
        return Err(KeyError::NotP384(curve.to_string()));
    }
    VerifyingKey::from_sec1_bytes(spki.subject_public_key.raw_bytes()).map_err(|_| KeyError::InvalidPoint)
}

/// Checks that `parent` issued `child`: names, algorithm, ECDSA-P384-SHA384 signature over the TBS.
pub(crate) fn verify_link(
    child: &Cert<'_>,
    child_role: CertRole,
    parent: &Cert<'_>,
    parent_role: CertRole,
) -> Result<(), ChainError> {
    let child_tbs = child.cert.tbs_certificate();
    let parent_tbs = parent.cert.tbs_certificate();
    let issuer = child_tbs.issuer().to_der();
    let subject = parent_tbs.subject().to_der();
    match (issuer, subject) {
        (Ok(i), Ok(s)) if i == s => {}
        _ => {
            return Err(ChainError::IssuerMismatch {
                role: child_role,
                issuer: child_tbs.issuer().to_string(),
                issuer_role: parent_role,
                subject: parent_tbs.subject().to_string(),
            });
        }
    }
    let outer = child.cert.signature_algorithm();
    if outer.oid != OID_ECDSA_WITH_SHA384 || outer.parameters.is_some() {
        return Err(ChainError::SignatureAlgorithm { role: child_role, oid: outer.oid.to_string() });
    }
    if child_tbs.signature() != outer {
        return Err(ChainError::AlgorithmMismatch { role: child_role });
    }
    let key = p384_key(&parent.cert).map_err(|reason| ChainError::IssuerKey { role: parent_role, reason })?;
    let bad = || ChainError::BadSignature { role: child_role, issuer_role: parent_role };
    let sig_bytes = child.cert.signature().as_bytes().ok_or_else(bad)?;
    let sig = DerSignature::from_bytes(sig_bytes).map_err(|_| bad())?;
    key.verify(child.tbs_der, &sig).map_err(|_| bad())
}

/// Checks that `cert` may issue certificates, with `below` more CA certificates under it.
pub(crate) fn check_ca(cert: &Cert<'_>, role: CertRole, below: usize) -> Result<(), ChainError> {
    let tbs = cert.cert.tbs_certificate();
    if tbs.version() != Version::V3 {
        return Err(ChainError::NotV3 { role });
    }
    let bc = tbs
        .get_extension::<BasicConstraints>()
        .map_err(|_| ChainError::MalformedExtension { role, extension: "basic constraints" })?;
    match bc {
        None => return Err(ChainError::NotCa { role, reason: "are absent" }),
        Some((_, bc)) if !bc.ca => return Err(ChainError::NotCa { role, reason: "say cA = false" }),
        Some((_, BasicConstraints { path_len_constraint: Some(path_len), .. })) if usize::from(path_len) < below => {
            return Err(ChainError::PathLength { role, path_len, below });
        }
        Some(_) => {}
    }
    if let Some((_, ku)) = key_usage(cert, role)?
        && !ku.key_cert_sign()
    {
        return Err(ChainError::KeyUsage { role, usage: "keyCertSign" });
    }
    critical_extensions(cert, role)
}

/// Checks that the leaf may sign documents.
pub(crate) fn check_leaf(cert: &Cert<'_>) -> Result<(), ChainError> {
    let role = CertRole::Leaf;
    if let Some((_, ku)) = key_usage(cert, role)?
        && !ku.digital_signature()
    {
        return Err(ChainError::KeyUsage { role, usage: "digitalSignature" });
    }
    critical_extensions(cert, role)
}

fn key_usage(cert: &Cert<'_>, role: CertRole) -> Result<Option<(bool, KeyUsage)>, ChainError> {
    cert.cert
        .tbs_certificate()
        .get_extension::<KeyUsage>()
        .map_err(|_| ChainError::MalformedExtension { role, extension: "key usage" })
}

/// RFC 5280 §4.2: a critical extension the verifier does not process makes the certificate invalid.
fn critical_extensions(cert: &Cert<'_>, role: CertRole) -> Result<(), ChainError> {
    let extensions = cert.cert.tbs_certificate().extensions().map(|e| e.as_slice()).unwrap_or_default();
    for ext in extensions {
        if ext.critical && ext.extn_id != OID_BASIC_CONSTRAINTS && ext.extn_id != OID_KEY_USAGE {
            return Err(ChainError::UnknownCriticalExtension { role, oid: ext.extn_id.to_string() });
        }
    }
    Ok(())
}

/// Formats milliseconds since the epoch as RFC 3339 UTC with milliseconds.
pub fn format_ms(ms: u64) -> String {
    let secs = Duration::from_secs(ms / 1000);
    match der::DateTime::from_unix_duration(secs) {
        Ok(dt) => {
            let s = dt.to_string();
            // "YYYY-MM-DDTHH:MM:SSZ" → insert ".mmm" before the Z.
            let base = s.strip_suffix('Z').unwrap_or(&s);
            format!("{base}.{:03}Z", ms % 1000)
        }
        Err(_) => format!("{ms} ms after the epoch"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_ms_rfc3339() {
        assert_eq!(format_ms(1686060167435), "2023-06-06T14:02:47.435Z");
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(u64::MAX), "18446744073709551615 ms after the epoch");
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let err = parse(&[0x30, 0x03, 0x02, 0x01, 0x00], CertRole::Bundle(2)).unwrap_err();
        assert_eq!(err.role, CertRole::Bundle(2));
        assert!(parse(&[], CertRole::Leaf).is_err());
    }
}
