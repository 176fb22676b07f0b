//! The development issuer (DESIGN.md §4, "Locally there is no NSM"): a P-384 development CA,
//! root → intermediate → per-document leaf, that signs attestation documents of exactly the
//! real shape, so the one verifier checks both; only the pinned root differs.
//!
//! Certificate profile (all X.509 v3, ECDSA P-384 keys, ecdsa-with-SHA384 signatures,
//! serial = first 16 bytes of SHA-256(SPKI DER ‖ notBefore seconds u64 BE), top bit cleared and
//! the next one set):
//!
//! | certificate  | subject (DER order)                                                                  | validity         | extensions |
//! |--------------|--------------------------------------------------------------------------------------|------------------|------------|
//! | root         | `O=ephem-batch,OU=ephem-batch development,CN=ephem-batch development root`           | t … t + 3650 d   | basicConstraints critical cA; keyUsage critical keyCertSign, cRLSign; subjectKeyIdentifier |
//! | intermediate | `O=ephem-batch,OU=ephem-batch development,CN=ephem-batch development intermediate`   | t … t + 3650 d   | basicConstraints critical cA, pathLen 0; keyUsage critical keyCertSign, cRLSign; subjectKeyIdentifier; authorityKeyIdentifier |
//! | leaf         | `O=ephem-batch,OU=ephem-batch development,CN=<module_id>.development.ephem-batch`    | d … d + 3 h      | basicConstraints critical not cA; keyUsage critical digitalSignature; authorityKeyIdentifier |
//!
//! `t` is the creation time given to [`DevIssuer::generate`] / [`DevIssuer::from_seed`], `d` the
//! document time given to [`DevIssuer::attest`], both truncated to the second. Each document gets
//! a fresh leaf key, as the NSM does.
//!
//! Documents: untagged COSE_Sign1, protected `{1: -35}`, unprotected `{}`, payload map in NSM
//! key order (module_id, digest "SHA384", timestamp ms, pcrs 0..=15 of 48 bytes, certificate =
//! leaf, cabundle = [root, intermediate], public_key, user_data, nonce — null when absent),
//! signature 96 bytes r‖s.
//!
//! Keys: [`DevIssuer::generate`] draws them from the OS RNG; [`DevIssuer::from_seed`] derives
//! every key (leaf keys included, from the document time) from a 32-byte seed, so together with
//! RFC 6979 deterministic ECDSA its output is reproducible (known-answer vectors). The CA keys
//! export and import as PKCS#8 DER ([`DevIssuerKeys`]); storing them is the caller's job.

use core::time::Duration;
use std::str::FromStr;

use der::Encode;
use der::asn1::GeneralizedTime;
use p384::ecdsa::signature::Signer;
use p384::ecdsa::{DerSignature, Signature, SigningKey};
use p384::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use sha2::{Digest, Sha256, Sha384};
use spki::{EncodePublicKey, SubjectPublicKeyInfoOwned, SubjectPublicKeyInfoRef};
use x509_cert::builder::profile::BuilderProfile;
use x509_cert::builder::{Builder, CertificateBuilder};
use x509_cert::certificate::TbsCertificate;
use der::asn1::{Ia5String, ObjectIdentifier};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages, SubjectAltName, SubjectKeyIdentifier,
};
use x509_cert::ext::{Extension, ToExtension};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::time::{Time, Validity};
use zeroize::Zeroizing;

use super::cbor::{self, Value};
use super::document::{self, AttestationDocument, MAX_AUX_LEN};
use super::error::CertRole;
use super::roots::{DEVELOPMENT_ROOT_MARKER, TrustAnchor};
use super::x509;

/// Lifetime of the development root and intermediate.
pub const CA_LIFETIME: Duration = Duration::from_secs(3650 * 24 * 3600);
/// Lifetime of a leaf (as AWS: about three hours).
pub const LEAF_LIFETIME: Duration = Duration::from_secs(3 * 3600);
/// Number of PCRs in a development document (as the NSM).
pub const PCR_COUNT: usize = 16;
/// Length of each PCR (SHA-384).
pub const PCR_LEN: usize = 48;

/// PCR1 of the development NSM is SHA-384 of this label (there is no kernel to measure).
pub const DEV_KERNEL_LABEL: &str = "ephem-batch development kernel v1";
/// PCR2 of the development NSM is SHA-384 of this label.
pub const DEV_APPLICATION_LABEL: &str = "ephem-batch development application v1";

/// The PCRs a development enclave reports for a worker binary measuring `pcr0`: PCR0 = SHA-384
/// of the binary, PCR1/PCR2 = SHA-384 of the labels above, PCR3..=15 zero. A client builds its
/// development policy from this; the development NSM reports exactly these.
pub fn development_pcrs(pcr0: [u8; PCR_LEN]) -> [[u8; PCR_LEN]; PCR_COUNT] {
    let mut pcrs = [[0u8; PCR_LEN]; PCR_COUNT];
    pcrs[0] = pcr0;
    pcrs[1] = Sha384::digest(DEV_KERNEL_LABEL.as_bytes()).into();
    pcrs[2] = Sha384::digest(DEV_APPLICATION_LABEL.as_bytes()).into();
    pcrs
}

const ORG: &str = "O=ephem-batch";
const KDF_LABEL: &[u8] = b"ephem-batch dev issuer v1";

/// What the development NSM is asked to attest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentRequest {
    /// Enclave module id: 1..=64 characters of `[A-Za-z0-9._-]`.
    pub module_id: String,
    /// PCR0..=PCR15.
    pub pcrs: [[u8; PCR_LEN]; PCR_COUNT],
    pub public_key: Option<Vec<u8>>,
    pub user_data: Option<Vec<u8>>,
    pub nonce: Option<Vec<u8>>,
}

impl DocumentRequest {
    /// A request with all PCRs zero (which verifiers treat as debug mode until PCR0..2 are set).
    pub fn new(module_id: impl Into<String>) -> Self {
        DocumentRequest {
            module_id: module_id.into(),
            pcrs: [[0; PCR_LEN]; PCR_COUNT],
            public_key: None,
            user_data: None,
            nonce: None,
        }
    }

    /// Sets PCR `index` (ignored when `index >= 16`).
    pub fn with_pcr(mut self, index: usize, value: [u8; PCR_LEN]) -> Self {
        if let Some(slot) = self.pcrs.get_mut(index) {
            *slot = value;
        }
        self
    }
}

/// The CA's private keys (PKCS#8 DER, zeroized on drop) and certificates (DER).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevIssuerKeys {
    pub root_key_pkcs8: Zeroizing<Vec<u8>>,
    pub root_cert_der: Vec<u8>,
    pub intermediate_key_pkcs8: Zeroizing<Vec<u8>>,
    pub intermediate_cert_der: Vec<u8>,
}

/// Why the development issuer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DevIssuerError {
    #[error("OS random number generator failed: {0}")]
    Rng(String),
    #[error("building a certificate failed: {0}")]
    Certificate(String),
    #[error("PKCS#8 key: {0}")]
    Key(String),
    #[error("stored CA is inconsistent: {0}")]
    Inconsistent(String),
    #[error("module_id must be 1..=64 characters of [A-Za-z0-9._-]")]
    ModuleId,
    #[error("{field} is {len} bytes; at most 1024")]
    FieldTooLong { field: &'static str, len: usize },
    #[error("time is outside the range X.509 can express")]
    Time,
    #[error("stored key bundle: {0}")]
    Bundle(String),
}

enum LeafKeys {
    Os,
    Seeded(Zeroizing<[u8; 32]>),
}

/// A development CA that issues attestation documents.
pub struct DevIssuer {
    root_key: SigningKey,
    root_der: Vec<u8>,
    intermediate_key: SigningKey,
    intermediate_der: Vec<u8>,
    leaf_keys: LeafKeys,
}

impl core::fmt::Debug for DevIssuer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DevIssuer").field("root_sha256", &hex::encode(Sha256::digest(&self.root_der))).finish()
    }
}

impl DevIssuer {
    /// A new CA with keys from the OS RNG; certificates valid from `now_ms` for ten years.
    pub fn generate(now_ms: u64) -> Result<DevIssuer, DevIssuerError> {
        let root_key = os_key()?;
        let intermediate_key = os_key()?;
        DevIssuer::with_keys(root_key, intermediate_key, LeafKeys::Os, now_ms)
    }

    /// A CA whose every key derives from `seed` (deterministic: for tests and known-answer
    /// vectors only — anyone who knows the seed can sign documents).
    pub fn from_seed(seed: &[u8; 32], now_ms: u64) -> Result<DevIssuer, DevIssuerError> {
        let root_key = seeded_key(seed, b"root")?;
        let intermediate_key = seeded_key(seed, b"intermediate")?;
        DevIssuer::with_keys(root_key, intermediate_key, LeafKeys::Seeded(Zeroizing::new(*seed)), now_ms)
    }

    fn with_keys(
        root_key: SigningKey,
        intermediate_key: SigningKey,
        leaf_keys: LeafKeys,
        now_ms: u64,
    ) -> Result<DevIssuer, DevIssuerError> {
        let root_name = dev_name("ephem-batch development root")?;
        let intermediate_name = dev_name("ephem-batch development intermediate")?;
        let validity = validity(now_ms, CA_LIFETIME)?;
        let root_der = issue_root(&root_name, &root_key, validity)?;
        let intermediate_der = issue(
            Profile { subject: intermediate_name, issuer: Some(root_name), kind: Kind::Intermediate, dns_name: None },
            &intermediate_key,
            &root_key,
            validity,
        )?;
        Ok(DevIssuer { root_key, root_der, intermediate_key, intermediate_der, leaf_keys })
    }

    /// The root certificate (DER), to pin.
    pub fn root_der(&self) -> &[u8] {
        &self.root_der
    }

    pub fn intermediate_der(&self) -> &[u8] {
        &self.intermediate_der
    }

    /// The root as a trust anchor (kind `Development`).
    pub fn trust_anchor(&self) -> Result<TrustAnchor, DevIssuerError> {
        TrustAnchor::from_der(&self.root_der).map_err(|e| DevIssuerError::Inconsistent(e.to_string()))
    }

    /// Until when the CA certificates are valid (ms): documents after that will not verify.
    pub fn valid_until_ms(&self) -> u64 {
        let root = x509::parse(&self.root_der, CertRole::Bundle(0)).map(|c| c.not_after_ms());
        let int = x509::parse(&self.intermediate_der, CertRole::Bundle(1)).map(|c| c.not_after_ms());
        root.unwrap_or(0).min(int.unwrap_or(0))
    }

    /// Exports the CA keys (PKCS#8 DER) and certificates.
    pub fn export(&self) -> Result<DevIssuerKeys, DevIssuerError> {
        let pkcs8 = |k: &SigningKey| {
            k.to_pkcs8_der()
                .map(|doc| Zeroizing::new(doc.as_bytes().to_vec()))
                .map_err(|e| DevIssuerError::Key(e.to_string()))
        };
        Ok(DevIssuerKeys {
            root_key_pkcs8: pkcs8(&self.root_key)?,
            root_cert_der: self.root_der.clone(),
            intermediate_key_pkcs8: pkcs8(&self.intermediate_key)?,
            intermediate_cert_der: self.intermediate_der.clone(),
        })
    }

    /// Re-creates an issuer from exported keys, checking that keys and certificates belong
    /// together and that the root issued the intermediate. Leaf keys come from the OS RNG.
    pub fn import(keys: &DevIssuerKeys) -> Result<DevIssuer, DevIssuerError> {
        let key = |der: &[u8]| SigningKey::from_pkcs8_der(der).map_err(|e| DevIssuerError::Key(e.to_string()));
        let root_key = key(&keys.root_key_pkcs8)?;
        let intermediate_key = key(&keys.intermediate_key_pkcs8)?;
        let inconsistent = |e: &dyn core::fmt::Display| DevIssuerError::Inconsistent(e.to_string());
        let root = x509::parse(&keys.root_cert_der, CertRole::Bundle(0)).map_err(|e| inconsistent(&e))?;
        let int = x509::parse(&keys.intermediate_cert_der, CertRole::Bundle(1)).map_err(|e| inconsistent(&e))?;
        for (cert, key, what) in [(&root, &root_key, "root"), (&int, &intermediate_key, "intermediate")] {
            let cert_key = x509::p384_key(&cert.cert).map_err(|e| inconsistent(&e))?;
            if &cert_key != key.verifying_key() {
                return Err(DevIssuerError::Inconsistent(format!("the {what} key does not match the {what} certificate")));
            }
        }
        x509::verify_link(&root, CertRole::Bundle(0), &root, CertRole::Bundle(0)).map_err(|e| inconsistent(&e))?;
        x509::check_ca(&root, CertRole::Bundle(0), 1).map_err(|e| inconsistent(&e))?;
        x509::verify_link(&int, CertRole::Bundle(1), &root, CertRole::Bundle(0)).map_err(|e| inconsistent(&e))?;
        x509::check_ca(&int, CertRole::Bundle(1), 0).map_err(|e| inconsistent(&e))?;
        Ok(DevIssuer {
            root_key,
            root_der: keys.root_cert_der.clone(),
            intermediate_key,
            intermediate_der: keys.intermediate_cert_der.clone(),
            leaf_keys: LeafKeys::Os,
        })
    }

    /// Issues a leaf valid from `now_ms` for three hours and signs a document with timestamp
    /// `now_ms`.
    pub fn attest(&self, request: &DocumentRequest, now_ms: u64) -> Result<Vec<u8>, DevIssuerError> {
        let id = &request.module_id;
        let id_ok = !id.is_empty()
            && id.len() <= 64
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
        if !id_ok {
            return Err(DevIssuerError::ModuleId);
        }
        for (field, value) in
            [("public_key", &request.public_key), ("user_data", &request.user_data), ("nonce", &request.nonce)]
        {
            if let Some(v) = value
                && v.len() > MAX_AUX_LEN
            {
                return Err(DevIssuerError::FieldTooLong { field, len: v.len() });
            }
        }
        let leaf_key = match &self.leaf_keys {
            LeafKeys::Os => os_key()?,
            LeafKeys::Seeded(seed) => {
                let mut label = b"leaf".to_vec();
                label.extend_from_slice(&now_ms.to_be_bytes());
                seeded_key(seed, &label)?
            }
        };
        let leaf_der = issue_leaf(id, &leaf_key, &self.intermediate_key, now_ms)?;
        let doc = AttestationDocument {
            module_id: id.clone(),
            digest: "SHA384".to_owned(),
            timestamp_ms: now_ms,
            pcrs: (0u8..).zip(request.pcrs.iter()).map(|(i, v)| (i, v.to_vec())).collect(),
            certificate: leaf_der,
            cabundle: vec![self.root_der.clone(), self.intermediate_der.clone()],
            public_key: request.public_key.clone(),
            user_data: request.user_data.clone(),
            nonce: request.nonce.clone(),
        };
        Ok(sign_document(&doc, &leaf_key))
    }
}

/// id-kp-serverAuth (RFC 5280 §4.2.1.12).
const ID_KP_SERVER_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1");

/// A development TLS identity: a self-signed root and, under it, a server certificate for one
/// DNS name, both ECDSA P-384. The embedded default's local KMS endpoint serves with it and a
/// development enclave pins its root, as a production enclave pins the Amazon roots.
pub struct DevTlsIdentity {
    pub root_der: Vec<u8>,
    pub cert_der: Vec<u8>,
    /// The server's private key, PKCS#8 DER.
    pub key_pkcs8_der: Zeroizing<Vec<u8>>,
}

impl DevTlsIdentity {
    pub fn generate(dns_name: &str, now_ms: u64) -> Result<DevTlsIdentity, DevIssuerError> {
        let root_key = os_key()?;
        let server_key = os_key()?;
        let root_name = dev_name("ephem-batch development TLS root")?;
        let validity = validity(now_ms, CA_LIFETIME)?;
        let root_der = issue_root(&root_name, &root_key, validity)?;
        let cert_der = issue(
            Profile {
                subject: dev_name(dns_name)?,
                issuer: Some(root_name),
                kind: Kind::TlsServer,
                dns_name: Some(dns_name.to_owned()),
            },
            &server_key,
            &root_key,
            validity,
        )?;
        let key_pkcs8_der = server_key
            .to_pkcs8_der()
            .map_err(|e| DevIssuerError::Key(e.to_string()))?
            .as_bytes()
            .to_vec();
        Ok(DevTlsIdentity { root_der, cert_der, key_pkcs8_der: Zeroizing::new(key_pkcs8_der) })
    }
}

fn issue_leaf(module_id: &str, leaf_key: &SigningKey, intermediate_key: &SigningKey, now_ms: u64) -> Result<Vec<u8>, DevIssuerError> {
    issue(
        Profile {
            subject: dev_name(&format!("{module_id}.development.ephem-batch"))?,
            issuer: Some(dev_name("ephem-batch development intermediate")?),
            kind: Kind::Leaf,
            dns_name: None,
        },
        leaf_key,
        intermediate_key,
        validity(now_ms, LEAF_LIFETIME)?,
    )
}

/// Encodes the payload as the NSM does and signs it (ES384) into an untagged COSE_Sign1.
fn sign_document(doc: &AttestationDocument, leaf_key: &SigningKey) -> Vec<u8> {
    let payload = document::encode_payload(doc);
    let signature: Signature = leaf_key.sign(&document::sig_structure(&document::PROTECTED_ES384, &payload));
    document::encode_sign1(&payload, &signature.to_bytes())
}

impl DevIssuerKeys {
    /// One byte string holding all four items: deterministic CBOR
    /// `{0: 1, 1: root key, 2: root cert, 3: intermediate key, 4: intermediate cert}`.
    pub fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut w = cbor::Writer::new();
        w.map(5).unsigned(0).unsigned(1);
        w.unsigned(1).bytes(&self.root_key_pkcs8).unsigned(2).bytes(&self.root_cert_der);
        w.unsigned(3).bytes(&self.intermediate_key_pkcs8).unsigned(4).bytes(&self.intermediate_cert_der);
        Zeroizing::new(w.into_bytes())
    }

    /// Inverse of [`encode`](Self::encode).
    pub fn decode(bytes: &[u8]) -> Result<DevIssuerKeys, DevIssuerError> {
        let bad = |what: &str| DevIssuerError::Bundle(what.to_owned());
        let value = cbor::decode(bytes).map_err(|e| DevIssuerError::Bundle(e.to_string()))?;
        let Value::Map(entries) = value else {
            return Err(bad("not a map"));
        };
        if entries.len() != 5 {
            return Err(bad("expected 5 entries"));
        }
        let get = |k: u64| entries.iter().find(|(key, _)| *key == Value::Unsigned(k)).map(|(_, v)| v);
        if get(0) != Some(&Value::Unsigned(1)) {
            return Err(bad("unknown version"));
        }
        let bytes_at = |k: u64| match get(k) {
            Some(Value::Bytes(b)) => Ok(b.to_vec()),
            _ => Err(bad("missing or non-bytes entry")),
        };
        Ok(DevIssuerKeys {
            root_key_pkcs8: Zeroizing::new(bytes_at(1)?),
            root_cert_der: bytes_at(2)?,
            intermediate_key_pkcs8: Zeroizing::new(bytes_at(3)?),
            intermediate_cert_der: bytes_at(4)?,
        })
    }
}

fn os_key() -> Result<SigningKey, DevIssuerError> {
    for _ in 0..16 {
        let mut bytes = Zeroizing::new([0u8; 48]);
        getrandom::fill(bytes.as_mut_slice()).map_err(|e| DevIssuerError::Rng(e.to_string()))?;
        if let Ok(key) = SigningKey::from_slice(bytes.as_slice()) {
            return Ok(key);
        }
    }
    Err(DevIssuerError::Rng("no valid P-384 scalar in 16 draws".into()))
}

/// SHA-384(label ‖ 0x00 ‖ name ‖ 0x00 ‖ counter ‖ seed) for counter 0, 1, … until it is a valid
/// P-384 scalar (the first one is, except with probability about 2^-190).
fn seeded_key(seed: &[u8; 32], name: &[u8]) -> Result<SigningKey, DevIssuerError> {
    for counter in 0u8..=255 {
        let mut h = Sha384::new();
        h.update(KDF_LABEL);
        h.update([0]);
        h.update(name);
        h.update([0, counter]);
        h.update(seed);
        let bytes = Zeroizing::new(h.finalize());
        if let Ok(key) = SigningKey::from_slice(bytes.as_slice()) {
            return Ok(key);
        }
    }
    Err(DevIssuerError::Key("no valid P-384 scalar derived from the seed".into()))
}

fn dev_name(cn: &str) -> Result<Name, DevIssuerError> {
    // RFC 4514 order is most-specific first; the DER order is O, OU, CN.
    Name::from_str(&format!("CN={cn},OU={DEVELOPMENT_ROOT_MARKER},{ORG}"))
        .map_err(|e| DevIssuerError::Certificate(e.to_string()))
}

fn validity(now_ms: u64, lifetime: Duration) -> Result<Validity, DevIssuerError> {
    let start = Duration::from_secs(now_ms / 1000);
    let end = start.checked_add(lifetime).ok_or(DevIssuerError::Time)?;
    let time = |d: Duration| GeneralizedTime::from_unix_duration(d).map(Time::GeneralTime).map_err(|_| DevIssuerError::Time);
    Ok(Validity::new(time(start)?, time(end)?))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Root,
    Intermediate,
    Leaf,
    /// A TLS server certificate (subjectAltName dNSName, extendedKeyUsage serverAuth).
    TlsServer,
}

struct Profile {
    subject: Name,
    issuer: Option<Name>,
    kind: Kind,
    dns_name: Option<String>,
}

impl BuilderProfile for Profile {
    fn get_issuer(&self, subject: &Name) -> Name {
        self.issuer.clone().unwrap_or_else(|| subject.clone())
    }

    fn get_subject(&self) -> Name {
        self.subject.clone()
    }

    fn build_extensions(
        &self,
        spk: SubjectPublicKeyInfoRef<'_>,
        issuer_spk: SubjectPublicKeyInfoRef<'_>,
        tbs: &TbsCertificate,
    ) -> x509_cert::builder::Result<Vec<Extension>> {
        let subject = tbs.subject();
        let mut out: Vec<Extension> = Vec::new();
        let bc = match self.kind {
            Kind::Root => BasicConstraints { ca: true, path_len_constraint: None },
            Kind::Intermediate => BasicConstraints { ca: true, path_len_constraint: Some(0) },
            Kind::Leaf | Kind::TlsServer => BasicConstraints { ca: false, path_len_constraint: None },
        };
        out.push((&bc).to_extension(subject, &out)?);
        let ku = match self.kind {
            Kind::Root | Kind::Intermediate => KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign),
            Kind::Leaf | Kind::TlsServer => KeyUsage(KeyUsages::DigitalSignature.into()),
        };
        out.push((&ku).to_extension(subject, &out)?);
        if let Some(dns_name) = &self.dns_name {
            let name = Ia5String::new(dns_name).map_err(x509_cert::builder::Error::from)?;
            let san = SubjectAltName(vec![GeneralName::DnsName(name)]);
            out.push((&san).to_extension(subject, &out)?);
            let eku = ExtendedKeyUsage(vec![ID_KP_SERVER_AUTH]);
            out.push((&eku).to_extension(subject, &out)?);
        }
        if matches!(self.kind, Kind::Root | Kind::Intermediate) {
            let ski = SubjectKeyIdentifier::try_from(spk)?;
            out.push((&ski).to_extension(subject, &out)?);
        }
        if self.kind != Kind::Root {
            let aki = AuthorityKeyIdentifier::try_from(issuer_spk)?;
            out.push((&aki).to_extension(subject, &out)?);
        }
        Ok(out)
    }
}

/// A self-signed CA root.
fn issue_root(name: &Name, key: &SigningKey, validity: Validity) -> Result<Vec<u8>, DevIssuerError> {
    issue(Profile { subject: name.clone(), issuer: None, kind: Kind::Root, dns_name: None }, key, key, validity)
}

fn issue(profile: Profile, subject_key: &SigningKey, issuer_key: &SigningKey, validity: Validity) -> Result<Vec<u8>, DevIssuerError> {
    let fail = |e: &dyn core::fmt::Display| DevIssuerError::Certificate(e.to_string());
    let spki_der = subject_key.verifying_key().to_public_key_der().map_err(|e| fail(&e))?;
    let spki = SubjectPublicKeyInfoOwned::try_from(spki_der.as_bytes()).map_err(|e| fail(&e))?;
    let not_before = validity.not_before.to_unix_duration().as_secs();
    let mut h = Sha256::new();
    h.update(spki_der.as_bytes());
    h.update(not_before.to_be_bytes());
    let digest = h.finalize();
    let mut serial = [0u8; 16];
    serial.copy_from_slice(digest.get(..16).unwrap_or(&[0; 16]));
    // Positive, and exactly 16 bytes long.
    serial[0] = (serial[0] & 0x7f) | 0x40;
    let serial = SerialNumber::new(&serial).map_err(|e| fail(&e))?;
    let builder = CertificateBuilder::new(profile, serial, validity, spki).map_err(|e| fail(&e))?;
    let cert = builder.build::<_, DerSignature>(issuer_key).map_err(|e| fail(&e))?;
    cert.to_der().map_err(|e| fail(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::check::CheckName;
    use crate::attestation::roots::RootKind;
    use crate::attestation::verify::{VerifyOptions, verify, verify_report};
    use crate::attestation::vectors;

    const T0: u64 = vectors::DEV_CA_TIME_MS;

    fn issuer() -> DevIssuer {
        DevIssuer::from_seed(&vectors::DEV_SEED, T0).unwrap()
    }

    fn prod_request() -> DocumentRequest {
        DocumentRequest::new("i-0123456789abcdef0-enc0123456789abcdef")
            .with_pcr(0, [0xa0; 48])
            .with_pcr(1, [0xa1; 48])
            .with_pcr(2, [0xa2; 48])
    }

    fn options(issuer: &DevIssuer, now: u64) -> VerifyOptions {
        VerifyOptions::new(issuer.trust_anchor().unwrap(), now)
    }

    #[test]
    fn round_trip_verifies_with_the_dev_root() {
        let issuer = issuer();
        let now = T0 + 60_000;
        let doc = issuer.attest(&prod_request().with_pcr(8, [7; 48]), now).unwrap();
        let v = verify(&doc, &options(&issuer, now).expect_pcr(0, [0xa0; 48]).expect_pcr(8, [7; 48])).unwrap();
        assert_eq!(v.root.kind, RootKind::Development);
        assert!(v.root.is_development());
        assert_eq!(v.document.timestamp_ms, now);
        assert_eq!(v.document.pcrs.len(), 16);
        assert!(v.document.pcrs.values().all(|p| p.len() == 48));
        assert_eq!(v.document.cabundle.len(), 2);
        assert_eq!((v.document.public_key.as_ref(), v.document.user_data.as_ref()), (None, None));
        // Leaf lives three hours.
        assert_eq!(v.chain_not_after_ms, (now / 1000) * 1000 + 3 * 3600 * 1000);
        // Not with the AWS root.
        let err = verify(&doc, &VerifyOptions::aws(now)).unwrap_err();
        assert_eq!(err.check(), CheckName::RootPinned);
    }

    #[test]
    fn exact_real_shape() {
        let issuer = issuer();
        let doc = issuer.attest(&prod_request(), T0).unwrap();
        // Untagged array, protected a1 01 38 22 as a 4-byte bstr, empty unprotected map.
        assert_eq!(&doc[..7], &[0x84, 0x44, 0xa1, 0x01, 0x38, 0x22, 0xa0]);
        let value = cbor::decode(&doc).unwrap();
        let Value::Array(items) = value else { panic!() };
        let Value::Bytes(payload) = &items[2] else { panic!() };
        let Value::Bytes(sig) = &items[3] else { panic!() };
        assert_eq!(sig.len(), 96);
        let Value::Map(entries) = cbor::decode(payload).unwrap() else { panic!() };
        let keys: Vec<_> = entries.iter().map(|(k, _)| k.clone()).collect();
        let expect: Vec<Value<'_>> =
            ["module_id", "digest", "timestamp", "pcrs", "certificate", "cabundle", "public_key", "user_data", "nonce"]
                .into_iter()
                .map(Value::Text)
                .collect();
        assert_eq!(keys, expect);
        assert_eq!(entries[6].1, Value::Null);
        assert_eq!(entries[8].1, Value::Null);
    }

    #[test]
    fn tampering_is_caught() {
        let issuer = issuer();
        let now = T0 + 1000;
        let doc = issuer.attest(&prod_request(), now).unwrap();
        let opts = options(&issuer, now);
        assert!(verify(&doc, &opts).is_ok());
        // Flip a byte inside the module id (payload): signature.
        let pos = doc.windows(5).position(|w| w == b"i-012").unwrap() + 3;
        let mut flipped = doc.clone();
        flipped[pos] ^= 0x01;
        assert_eq!(verify(&flipped, &opts).unwrap_err().check(), CheckName::Signature);
        // Signature byte.
        let mut sig = doc.clone();
        let n = sig.len();
        sig[n - 10] ^= 0xff;
        assert_eq!(verify(&sig, &opts).unwrap_err().check(), CheckName::Signature);
        // Another issuer's root pinned.
        let other = DevIssuer::from_seed(&[1; 32], T0).unwrap();
        assert_eq!(verify(&doc, &options(&other, now)).unwrap_err().check(), CheckName::RootPinned);
        // A leaf issued by another CA's (same-named) intermediate, presented with this issuer's
        // bundle: the signature verifies, the link intermediate → leaf does not.
        let forged = forge(&issuer.root_der, &issuer.intermediate_der, &other.intermediate_key, now);
        let err = verify(&forged, &opts).unwrap_err();
        assert_eq!(err.check(), CheckName::Chain, "{err}");
        assert!(err.to_string().contains("leaf certificate's signature does not verify with the key of cabundle[1]"), "{err}");
        // And this issuer's intermediate presented under another root: root → intermediate breaks.
        let forged = forge(&other.root_der, &issuer.intermediate_der, &issuer.intermediate_key, now);
        let err = verify(&forged, &options(&other, now)).unwrap_err();
        assert_eq!(err.check(), CheckName::Chain, "{err}");
        // A leaf certificate in an intermediate's position: names do not chain.
        let leaf_key = seeded_key(&[9; 32], b"x").unwrap();
        let leaf_as_int = issue_leaf("fake", &leaf_key, &issuer.intermediate_key, now).unwrap();
        let forged = forge(&issuer.root_der, &leaf_as_int, &leaf_key, now);
        let err = verify(&forged, &opts).unwrap_err();
        assert_eq!(err.check(), CheckName::Chain, "{err}");
        // Expired leaf.
        let late = options(&issuer, now + 3 * 3600 * 1000 + 1000);
        let report = verify_report(&doc, &late);
        assert_eq!(report.failed_check(), Some(CheckName::Validity));
        assert!(report.error().unwrap().to_string().contains("leaf certificate"));
        // Nonce and PCR policy.
        let mut with_nonce = opts.clone();
        with_nonce.expected_nonce = Some(vec![1, 2, 3]);
        assert_eq!(verify(&doc, &with_nonce).unwrap_err().check(), CheckName::Nonce);
        let wrong_pcr = opts.clone().expect_pcr(0, [0xa1; 48]);
        assert_eq!(verify(&doc, &wrong_pcr).unwrap_err().check(), CheckName::PcrPolicy);
        // Debug mode (all-zero PCR0..2).
        let debug = issuer.attest(&DocumentRequest::new("m"), now).unwrap();
        assert_eq!(verify(&debug, &opts).unwrap_err().check(), CheckName::DebugMode);
        let mut allow = opts.clone();
        allow.allow_debug = true;
        assert!(verify(&debug, &allow).unwrap().debug_mode);
    }

    /// A document whose leaf is issued by `signing_intermediate`, presented with the bundle
    /// [root, intermediate].
    fn forge(root: &[u8], intermediate: &[u8], signing_intermediate: &SigningKey, now: u64) -> Vec<u8> {
        forge_bundle(vec![root.to_vec(), intermediate.to_vec()], signing_intermediate, now)
    }

    fn forge_bundle(cabundle: Vec<Vec<u8>>, signing_intermediate: &SigningKey, now: u64) -> Vec<u8> {
        let leaf_key = seeded_key(&[7; 32], b"forged leaf").unwrap();
        let leaf = issue_leaf("forged", &leaf_key, signing_intermediate, now).unwrap();
        let doc = AttestationDocument {
            module_id: "forged".into(),
            digest: "SHA384".into(),
            timestamp_ms: now,
            pcrs: (0u8..16).map(|i| (i, vec![0xa0 + i; 48])).collect(),
            certificate: leaf,
            cabundle,
            public_key: None,
            user_data: None,
            nonce: None,
        };
        sign_document(&doc, &leaf_key)
    }

    /// Correctly signed documents whose bundle certificates are damaged: every variant fails
    /// `chain` (or `root_pinned`), none panics.
    #[test]
    fn damaged_bundle_certificates_fail_the_chain() {
        let issuer = issuer();
        let now = T0 + 1000;
        let opts = options(&issuer, now);
        let int = issuer.intermediate_der.clone();
        let mut variants: Vec<Vec<u8>> = Vec::new();
        for i in (0..int.len()).step_by(3) {
            let mut v = int.clone();
            v[i] ^= 0x5a;
            variants.push(v);
        }
        for len in [1, 2, 10, 100, int.len() - 1] {
            variants.push(int[..len].to_vec());
        }
        let mut longer = int.clone();
        longer.push(0);
        variants.push(longer);
        for bad in variants {
            let doc = forge_bundle(vec![issuer.root_der.clone(), bad], &issuer.intermediate_key, now);
            let check = verify(&doc, &opts).unwrap_err().check();
            assert!(matches!(check, CheckName::Chain | CheckName::Validity), "{check}");
        }
        // A bundle of the root alone, the leaf signed by the root key but naming the
        // intermediate as its issuer: the root → leaf link fails on names.
        let doc = forge_bundle(vec![issuer.root_der.clone()], &issuer.root_key, now);
        let err = verify(&doc, &opts).unwrap_err();
        assert_eq!(err.check(), CheckName::Chain);
        assert!(err.to_string().contains("is not the subject of cabundle[0]"), "{err}");
    }

    #[test]
    fn binding_and_nonce_round_trip() {
        let issuer = issuer();
        let binding = vectors::binding_sample();
        let mut req = prod_request();
        req.user_data = Some(binding.encode());
        req.nonce = Some(vec![0x55; 1024]);
        req.public_key = Some(vec![]);
        let doc = issuer.attest(&req, T0).unwrap();
        let mut opts = options(&issuer, T0);
        opts.require_binding = true;
        opts.expected_nonce = Some(vec![0x55; 1024]);
        let v = verify(&doc, &opts).unwrap();
        assert_eq!(v.binding, Some(binding));
        assert_eq!(v.document.public_key, Some(vec![]));
        // user_data that is not a binding.
        req.user_data = Some(b"hello".to_vec());
        let doc = issuer.attest(&req, T0).unwrap();
        assert_eq!(verify(&doc, &opts).unwrap_err().check(), CheckName::UserDataBinding);
    }

    #[test]
    fn export_import() {
        let issuer = DevIssuer::generate(T0).unwrap();
        let keys = issuer.export().unwrap();
        assert_eq!(DevIssuerKeys::decode(&keys.encode()).unwrap(), keys);
        let again = DevIssuer::import(&keys).unwrap();
        assert_eq!(again.root_der(), issuer.root_der());
        let doc = again.attest(&prod_request(), T0 + 5).unwrap();
        assert!(verify(&doc, &options(&issuer, T0 + 5)).is_ok());
        // Two OS-generated issuers differ.
        assert_ne!(DevIssuer::generate(T0).unwrap().root_der(), issuer.root_der());
        // Mismatched key and certificate.
        let other = DevIssuer::generate(T0).unwrap().export().unwrap();
        let mixed = DevIssuerKeys { root_key_pkcs8: other.root_key_pkcs8.clone(), ..keys.clone() };
        assert!(matches!(DevIssuer::import(&mixed), Err(DevIssuerError::Inconsistent(_))));
        let mixed = DevIssuerKeys { intermediate_cert_der: other.intermediate_cert_der.clone(), ..keys.clone() };
        assert!(matches!(DevIssuer::import(&mixed), Err(DevIssuerError::Inconsistent(_))));
        let broken = DevIssuerKeys { root_key_pkcs8: Zeroizing::new(vec![1, 2, 3]), ..keys };
        assert!(matches!(DevIssuer::import(&broken), Err(DevIssuerError::Key(_))));
        assert!(DevIssuerKeys::decode(&[0xa0]).is_err());
    }

    #[test]
    fn request_limits() {
        let issuer = issuer();
        assert_eq!(issuer.attest(&DocumentRequest::new(""), T0), Err(DevIssuerError::ModuleId));
        assert_eq!(issuer.attest(&DocumentRequest::new("a,b=c"), T0), Err(DevIssuerError::ModuleId));
        let mut req = prod_request();
        req.user_data = Some(vec![0; 1025]);
        assert!(matches!(issuer.attest(&req, T0), Err(DevIssuerError::FieldTooLong { field: "user_data", .. })));
        req.user_data = Some(vec![0; 1024]);
        assert!(issuer.attest(&req, T0).is_ok());
    }

    #[test]
    fn certificate_profile() {
        let issuer = issuer();
        let anchor = issuer.trust_anchor().unwrap();
        assert_eq!(anchor.kind(), RootKind::Development);
        assert_eq!(
            anchor.subject(),
            "CN=ephem-batch development root,OU=ephem-batch development,O=ephem-batch"
        );
        assert_eq!(issuer.valid_until_ms(), (T0 / 1000) * 1000 + 3650 * 24 * 3600 * 1000);
        let int = x509::parse(issuer.intermediate_der(), CertRole::Bundle(1)).unwrap();
        let root = x509::parse(issuer.root_der(), CertRole::Bundle(0)).unwrap();
        x509::check_ca(&root, CertRole::Bundle(0), 1).unwrap();
        x509::check_ca(&int, CertRole::Bundle(1), 0).unwrap();
        // pathLen 0 on the intermediate: it may not issue another CA.
        assert!(matches!(
            x509::check_ca(&int, CertRole::Bundle(1), 1),
            Err(crate::attestation::error::ChainError::PathLength { path_len: 0, below: 1, .. })
        ));
        assert_eq!(int.cert.tbs_certificate().serial_number().as_bytes().len(), 16);
        // A leaf may not act as a CA.
        let leaf_key = seeded_key(&[9; 32], b"x").unwrap();
        let leaf_der = issue_leaf("m", &leaf_key, &issuer.intermediate_key, T0).unwrap();
        let leaf = x509::parse(&leaf_der, CertRole::Leaf).unwrap();
        assert!(matches!(
            x509::check_ca(&leaf, CertRole::Bundle(2), 0),
            Err(crate::attestation::error::ChainError::NotCa { reason: "say cA = false", .. })
        ));
        x509::check_leaf(&leaf).unwrap();
    }

    #[test]
    fn known_answer_vectors() {
        let issuer = issuer();
        assert_eq!(hex::encode(Sha256::digest(issuer.root_der())), vectors::DEV_ROOT_SHA256_HEX);
        assert_eq!(hex::encode(Sha256::digest(issuer.intermediate_der())), vectors::DEV_INTERMEDIATE_SHA256_HEX);
        let doc = issuer.attest(&vectors::dev_request(), vectors::DEV_DOC_TIME_MS).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&doc)), vectors::DEV_DOC_SHA256_HEX);
        assert_eq!(hex::encode(issuer.root_der()), vectors::DEV_ROOT_DER_HEX);
        let parsed = AttestationDocument::parse_unverified(&doc).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&parsed.certificate)), vectors::DEV_LEAF_SHA256_HEX);
        let opts = VerifyOptions::new(issuer.trust_anchor().unwrap(), vectors::DEV_DOC_TIME_MS)
            .expect_pcr(0, vectors::dev_request().pcrs[0]);
        assert!(verify(&doc, &opts).is_ok());
    }
}
