//! The attestation document's shape: COSE_Sign1 envelope and Nitro payload, parsed without any
//! cryptography. Three of the verifier's checks live here: `cbor`, `cose_structure`, `alg_es384`.
//!
//! ```text
//! COSE_Sign1 = [ protected: bstr .cbor {1: -35},   ; ES384, nothing else
//!                unprotected: {},                    ; empty map (null is refused)
//!                payload: bstr .cbor AttestationDoc,
//!                signature: bstr ]                   ; 96 bytes r‖s, checked by `signature`
//! optionally wrapped in tag 18; real documents are untagged.
//! ```

use std::collections::BTreeMap;

use super::cbor::{self, CborError, Value};
use super::error::{AlgorithmError, CborStageError, CborPart, PayloadError, StructureError};

/// COSE algorithm identifier of ES384 (ECDSA P-384 with SHA-384).
pub const COSE_ALG_ES384: i64 = -35;
/// COSE tag of COSE_Sign1.
pub const COSE_SIGN1_TAG: u64 = 18;
/// The protected header bytes every conforming document carries: `{1: -35}`.
pub const PROTECTED_ES384: [u8; 4] = [0xa1, 0x01, 0x38, 0x22];

/// Largest `certificate` / `cabundle` entry (spec: `cert = bytes .size (1..1024)`).
pub const MAX_CERT_LEN: usize = 1024;
/// Largest `public_key` / `user_data` / `nonce` (spec: `bytes .size (0..1024)`; real hardware
/// emits exactly 1024).
pub const MAX_AUX_LEN: usize = 1024;
/// Largest document accepted. A document at every spec limit (1024-byte certificate, 16 bundle
/// certificates, 32 PCRs of 64 bytes, three 1024-byte fields) stays well below it.
pub const MAX_DOCUMENT_LEN: usize = 64 * 1024;
/// Highest PCR index (spec: `index = 0..31`).
pub const MAX_PCR_INDEX: u8 = 31;
/// Upper bound on `cabundle` entries we accept (real documents carry 4).
pub const MAX_CABUNDLE_LEN: usize = 16;
/// Upper bound on the `module_id` length.
pub const MAX_MODULE_ID_LEN: usize = 256;

/// A decoded Nitro attestation document payload. Nothing in it is trusted until the verifier
/// has accepted the document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationDocument {
    /// Issuing enclave's module id, e.g. `i-0c3e1240d05814245-enc018891041dab64e4`.
    pub module_id: String,
    /// Always `"SHA384"` once parsed.
    pub digest: String,
    /// Milliseconds since the UNIX epoch, from the NSM's clock.
    pub timestamp_ms: u64,
    /// PCR index (0..=31) → value (32, 48 or 64 bytes).
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    /// The leaf (signing) certificate, DER.
    pub certificate: Vec<u8>,
    /// Issuing chain, root first, DER.
    pub cabundle: Vec<Vec<u8>>,
    /// `None` when absent or CBOR null; `Some(vec![])` for an empty byte string.
    pub public_key: Option<Vec<u8>>,
    pub user_data: Option<Vec<u8>>,
    pub nonce: Option<Vec<u8>>,
}

impl AttestationDocument {
    /// Parses a document through the `cbor`, `cose_structure` and `alg_es384` checks only —
    /// **no signature, chain or policy check**: for inspection (e.g. reading the timestamp an
    /// auditor pins), never for trust.
    pub fn parse_unverified(bytes: &[u8]) -> Result<AttestationDocument, super::AttestationError> {
        let layers = decode_layers(bytes)?;
        let parsed = check_structure(&layers)?;
        check_alg(&parsed)?;
        Ok(parsed.document)
    }

    /// PCR value at `index`, if present.
    pub fn pcr(&self, index: u8) -> Option<&[u8]> {
        self.pcrs.get(&index).map(Vec::as_slice)
    }

    /// The payload encoded as the NSM encodes it (nine text keys in NSM order, absent optional
    /// fields as null): what the development issuer signs, and what a parse of such a payload
    /// gives back field for field.
    pub fn to_payload(&self) -> Vec<u8> {
        encode_payload(self)
    }
}

/// The three CBOR layers of a document, each decoded (the `cbor` check).
#[derive(Debug)]
pub(crate) struct Layers<'a> {
    pub outer: Value<'a>,
    pub protected: Option<Value<'a>>,
    pub payload: Option<Value<'a>>,
}

/// The COSE_Sign1 pieces the signature check needs.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    pub protected: &'a [u8],
    pub payload: &'a [u8],
    pub signature: &'a [u8],
    pub alg: i128,
    pub tagged: bool,
    pub document: AttestationDocument,
}

fn sign1_array<'v, 'a>(outer: &'v Value<'a>) -> (Option<&'v [Value<'a>]>, bool) {
    match outer {
        Value::Array(items) => (Some(items.as_slice()), false),
        Value::Tag(COSE_SIGN1_TAG, inner) => match inner.as_ref() {
            Value::Array(items) => (Some(items.as_slice()), true),
            _ => (None, true),
        },
        _ => (None, false),
    }
}

/// `cbor`: the document, its protected header and its payload are well-formed CBOR.
pub(crate) fn decode_layers(bytes: &[u8]) -> Result<Layers<'_>, CborStageError> {
    if bytes.len() > MAX_DOCUMENT_LEN {
        return Err(CborStageError {
            part: CborPart::Document,
            error: CborError::TooLarge { len: bytes.len(), max: MAX_DOCUMENT_LEN },
        });
    }
    let outer = cbor::decode(bytes).map_err(|error| CborStageError { part: CborPart::Document, error })?;
    let mut protected = None;
    let mut payload = None;
    if let (Some(items), _) = sign1_array(&outer) {
        if let Some(Value::Bytes(p)) = items.first() {
            // An empty protected bstr stands for an empty map (RFC 9052 §3); leave it to the
            // structure check.
            if !p.is_empty() {
                protected = Some(
                    cbor::decode(p).map_err(|error| CborStageError { part: CborPart::ProtectedHeader, error })?,
                );
            }
        }
        if let Some(Value::Bytes(p)) = items.get(2) {
            payload = Some(cbor::decode(p).map_err(|error| CborStageError { part: CborPart::Payload, error })?);
        }
    }
    Ok(Layers { outer, protected, payload })
}

/// `cose_structure`: COSE_Sign1 shape and the Nitro payload schema.
pub(crate) fn check_structure<'a>(layers: &Layers<'a>) -> Result<Parsed<'a>, StructureError> {
    let (items, tagged) = match sign1_array(&layers.outer) {
        (Some(items), tagged) => (items, tagged),
        (None, _) => {
            return Err(match &layers.outer {
                Value::Tag(tag, _) if *tag != COSE_SIGN1_TAG => StructureError::UnexpectedTag(*tag),
                Value::Tag(_, inner) => StructureError::NotArray(inner.kind()),
                other => StructureError::NotArray(other.kind()),
            });
        }
    };
    let [protected, unprotected, payload, signature] = items else {
        return Err(StructureError::ArrayLength(items.len()));
    };
    let Value::Bytes(protected_bytes) = protected else {
        return Err(StructureError::ProtectedNotBytes(protected.kind()));
    };
    let alg = match &layers.protected {
        None => return Err(StructureError::ProtectedHeader("empty; it must be {1: -35}".into())),
        Some(Value::Map(entries)) => match entries.as_slice() {
            [(Value::Unsigned(1), alg)] => alg
                .as_integer()
                .ok_or_else(|| StructureError::ProtectedHeader(format!("alg (label 1) is a {}, not an integer", alg.kind())))?,
            [] => return Err(StructureError::ProtectedHeader("an empty map; it must be {1: -35}".into())),
            _ => {
                return Err(StructureError::ProtectedHeader(format!(
                    "a map of {} entries; it must be exactly {{1: -35}}",
                    entries.len()
                )));
            }
        },
        Some(other) => return Err(StructureError::ProtectedHeader(format!("a {}, not a map", other.kind()))),
    };
    match unprotected {
        Value::Map(entries) if entries.is_empty() => {}
        Value::Map(entries) => return Err(StructureError::UnprotectedNotEmpty(entries.len())),
        other => return Err(StructureError::UnprotectedNotMap(other.kind())),
    }
    let Value::Bytes(payload_bytes) = payload else {
        return Err(StructureError::PayloadNotBytes(payload.kind()));
    };
    let Value::Bytes(signature_bytes) = signature else {
        return Err(StructureError::SignatureNotBytes(signature.kind()));
    };
    let payload_value = layers.payload.as_ref().ok_or(StructureError::PayloadNotBytes("missing"))?;
    let document = parse_payload(payload_value).map_err(StructureError::Payload)?;
    Ok(Parsed {
        protected: protected_bytes,
        payload: payload_bytes,
        signature: signature_bytes,
        alg,
        tagged,
        document,
    })
}

/// `alg_es384`: the protected header names ES384.
pub(crate) fn check_alg(parsed: &Parsed<'_>) -> Result<(), AlgorithmError> {
    if parsed.alg != i128::from(COSE_ALG_ES384) {
        return Err(AlgorithmError::NotEs384(parsed.alg));
    }
    // The only minimal encoding of {1: -35}; anything else would already have failed above,
    // but keep the Sig_structure input exactly what real documents carry.
    if parsed.protected != PROTECTED_ES384 {
        return Err(AlgorithmError::NonCanonicalHeader);
    }
    Ok(())
}

const FIELDS: [&str; 9] =
    ["module_id", "digest", "timestamp", "pcrs", "certificate", "cabundle", "public_key", "user_data", "nonce"];

fn field_name(key: &str) -> Option<&'static str> {
    FIELDS.iter().copied().find(|f| *f == key)
}

fn parse_payload(value: &Value<'_>) -> Result<AttestationDocument, PayloadError> {
    let Value::Map(entries) = value else {
        return Err(PayloadError::NotMap(value.kind()));
    };
    let mut fields: BTreeMap<&'static str, &Value<'_>> = BTreeMap::new();
    for (key, value) in entries {
        let Value::Text(key) = key else {
            return Err(PayloadError::NonTextKey(key.kind()));
        };
        let name = field_name(key).ok_or_else(|| PayloadError::UnknownField(truncate(key)))?;
        // Duplicate keys were refused by the CBOR reader.
        fields.insert(name, value);
    }
    let get = |name: &'static str| fields.get(name).copied().ok_or(PayloadError::Missing(name));

    let module_id = match get("module_id")? {
        Value::Text("") => return Err(PayloadError::EmptyModuleId),
        Value::Text(t) if t.len() > MAX_MODULE_ID_LEN => return Err(PayloadError::ModuleIdTooLong(t.len())),
        Value::Text(t) => (*t).to_owned(),
        other => return Err(wrong("module_id", "text string", other)),
    };
    let digest = match get("digest")? {
        Value::Text("SHA384") => "SHA384".to_owned(),
        Value::Text(t) => return Err(PayloadError::Digest(truncate(t))),
        other => return Err(wrong("digest", "text string", other)),
    };
    let timestamp_ms = match get("timestamp")? {
        Value::Unsigned(0) => return Err(PayloadError::ZeroTimestamp),
        Value::Unsigned(t) => *t,
        other => return Err(wrong("timestamp", "unsigned integer", other)),
    };
    let pcrs = match get("pcrs")? {
        Value::Map(entries) => {
            if entries.is_empty() {
                return Err(PayloadError::NoPcrs);
            }
            let mut pcrs = BTreeMap::new();
            for (index, value) in entries {
                let index = match index {
                    Value::Unsigned(i) => u8::try_from(*i)
                        .ok()
                        .filter(|i| *i <= MAX_PCR_INDEX)
                        .ok_or(PayloadError::PcrIndex(i128::from(*i)))?,
                    Value::Negative(n) => return Err(PayloadError::PcrIndex(-1 - i128::from(*n))),
                    other => return Err(wrong("pcrs key", "unsigned integer", other)),
                };
                let Value::Bytes(v) = value else {
                    return Err(wrong("pcrs value", "byte string", value));
                };
                if ![32, 48, 64].contains(&v.len()) {
                    return Err(PayloadError::PcrLength { index, len: v.len() });
                }
                pcrs.insert(index, v.to_vec());
            }
            pcrs
        }
        other => return Err(wrong("pcrs", "map", other)),
    };
    let certificate = match get("certificate")? {
        Value::Bytes(b) if b.is_empty() || b.len() > MAX_CERT_LEN => {
            return Err(PayloadError::CertificateLength(b.len()));
        }
        Value::Bytes(b) => b.to_vec(),
        other => return Err(wrong("certificate", "byte string", other)),
    };
    let cabundle = match get("cabundle")? {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(PayloadError::EmptyCabundle);
            }
            if items.len() > MAX_CABUNDLE_LEN {
                return Err(PayloadError::CabundleTooLong(items.len()));
            }
            let mut out = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                match item {
                    Value::Bytes(b) if b.is_empty() || b.len() > MAX_CERT_LEN => {
                        return Err(PayloadError::CabundleEntryLength { index, len: b.len() });
                    }
                    Value::Bytes(b) => out.push(b.to_vec()),
                    other => return Err(wrong("cabundle entry", "byte string", other)),
                }
            }
            out
        }
        other => return Err(wrong("cabundle", "array", other)),
    };
    let optional = |name: &'static str| -> Result<Option<Vec<u8>>, PayloadError> {
        match fields.get(name).copied() {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bytes(b)) if b.len() > MAX_AUX_LEN => Err(PayloadError::AuxTooLong { field: name, len: b.len() }),
            Some(Value::Bytes(b)) => Ok(Some(b.to_vec())),
            Some(other) => Err(wrong(name, "byte string or null", other)),
        }
    };
    Ok(AttestationDocument {
        module_id,
        digest,
        timestamp_ms,
        pcrs,
        certificate,
        cabundle,
        public_key: optional("public_key")?,
        user_data: optional("user_data")?,
        nonce: optional("nonce")?,
    })
}

fn wrong(field: &'static str, expected: &'static str, found: &Value<'_>) -> PayloadError {
    PayloadError::WrongType { field, expected, found: found.kind() }
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Encodes a payload exactly as the NSM does: a map of nine text keys in NSM order, absent
/// optional fields as null. Used by the development issuer.
pub(crate) fn encode_payload(doc: &AttestationDocument) -> Vec<u8> {
    let mut w = cbor::Writer::new();
    w.map(9);
    w.text("module_id").text(&doc.module_id);
    w.text("digest").text(&doc.digest);
    w.text("timestamp").unsigned(doc.timestamp_ms);
    w.text("pcrs").map(doc.pcrs.len());
    for (index, value) in &doc.pcrs {
        w.unsigned(u64::from(*index)).bytes(value);
    }
    w.text("certificate").bytes(&doc.certificate);
    w.text("cabundle").array(doc.cabundle.len());
    for cert in &doc.cabundle {
        w.bytes(cert);
    }
    w.text("public_key").opt_bytes(doc.public_key.as_deref());
    w.text("user_data").opt_bytes(doc.user_data.as_deref());
    w.text("nonce").opt_bytes(doc.nonce.as_deref());
    w.into_bytes()
}

/// `Sig_structure = ["Signature1", protected, external_aad = h'', payload]` (RFC 9052 §4.4).
pub(crate) fn sig_structure(protected: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut w = cbor::Writer::new();
    w.array(4).text("Signature1").bytes(protected).bytes(&[]).bytes(payload);
    w.into_bytes()
}

/// An untagged COSE_Sign1 with protected `{1: -35}`, unprotected `{}`.
#[cfg(feature = "dev-issuer")]
pub(crate) fn encode_sign1(payload: &[u8], signature: &[u8]) -> Vec<u8> {
    let mut w = cbor::Writer::new();
    w.array(4).bytes(&PROTECTED_ES384).map(0).bytes(payload).bytes(signature);
    w.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::error::AttestationError;

    fn sample() -> AttestationDocument {
        AttestationDocument {
            module_id: "i-0123-enc0456".into(),
            digest: "SHA384".into(),
            timestamp_ms: 1_700_000_000_000,
            pcrs: (0u8..16).map(|i| (i, vec![i; 48])).collect(),
            certificate: vec![0x30; 10],
            cabundle: vec![vec![0x30; 5], vec![0x30; 6]],
            public_key: None,
            user_data: Some(vec![]),
            nonce: Some(vec![7; 1024]),
        }
    }

    fn doc_bytes(payload: &[u8]) -> Vec<u8> {
        encode_sign1(payload, &[0u8; 96])
    }

    fn parse(bytes: &[u8]) -> Result<AttestationDocument, AttestationError> {
        AttestationDocument::parse_unverified(bytes)
    }

    #[test]
    fn payload_round_trip() {
        let doc = sample();
        assert_eq!(parse(&doc_bytes(&encode_payload(&doc))).unwrap(), doc);
    }

    #[test]
    fn tagged_is_accepted() {
        let doc = sample();
        let mut bytes = vec![0xd2];
        bytes.extend(doc_bytes(&encode_payload(&doc)));
        assert_eq!(parse(&bytes).unwrap(), doc);
        let mut other_tag = vec![0xd1];
        other_tag.extend(doc_bytes(&encode_payload(&doc)));
        assert!(matches!(
            parse(&other_tag),
            Err(AttestationError::CoseStructure(StructureError::UnexpectedTag(17)))
        ));
    }

    #[test]
    fn spec_limits() {
        type Mutation = Box<dyn Fn(&mut AttestationDocument)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|d| d.digest = "SHA256".into()), "digest"),
            (Box::new(|d| d.module_id.clear()), "module_id"),
            (Box::new(|d| d.timestamp_ms = 0), "timestamp"),
            (Box::new(|d| { d.pcrs.insert(3, vec![0; 47]); }), "PCR3"),
            (Box::new(|d| { d.pcrs.insert(32, vec![0; 48]); }), "PCR index 32"),
            (Box::new(|d| d.pcrs.clear()), "pcrs"),
            (Box::new(|d| d.certificate = vec![0; 1025]), "certificate"),
            (Box::new(|d| d.certificate.clear()), "certificate"),
            (Box::new(|d| d.cabundle.clear()), "cabundle"),
            (Box::new(|d| d.cabundle[1] = vec![]), "cabundle[1]"),
            (Box::new(|d| d.user_data = Some(vec![0; 1025])), "user_data"),
            (Box::new(|d| d.nonce = Some(vec![0; 1025])), "nonce"),
            (Box::new(|d| d.public_key = Some(vec![0; 1025])), "public_key"),
        ];
        for (mutate, needle) in cases {
            let mut doc = sample();
            mutate(&mut doc);
            let err = parse(&doc_bytes(&encode_payload(&doc))).unwrap_err();
            assert_eq!(err.check().as_str(), "cose_structure", "{err}");
            assert!(err.to_string().contains(needle), "{err} should mention {needle}");
        }
        // 64- and 32-byte PCRs are fine, and 1024-byte aux fields are accepted.
        let mut doc = sample();
        doc.pcrs.insert(20, vec![1; 64]);
        doc.pcrs.insert(31, vec![1; 32]);
        doc.public_key = Some(vec![1; 1024]);
        doc.user_data = Some(vec![1; 1024]);
        assert_eq!(parse(&doc_bytes(&encode_payload(&doc))).unwrap(), doc);
    }

    #[test]
    fn absent_optional_fields_and_unknown_fields() {
        // A map without the optional keys.
        let mut w = cbor::Writer::new();
        w.map(6)
            .text("module_id").text("m")
            .text("digest").text("SHA384")
            .text("timestamp").unsigned(1)
            .text("pcrs").map(1).unsigned(0).bytes(&[0; 48])
            .text("certificate").bytes(&[1])
            .text("cabundle").array(1).bytes(&[1]);
        let doc = parse(&doc_bytes(&w.into_bytes())).unwrap();
        assert_eq!((doc.public_key, doc.user_data, doc.nonce), (None, None, None));

        let mut w = cbor::Writer::new();
        w.map(7)
            .text("module_id").text("m")
            .text("digest").text("SHA384")
            .text("timestamp").unsigned(1)
            .text("pcrs").map(1).unsigned(0).bytes(&[0; 48])
            .text("certificate").bytes(&[1])
            .text("cabundle").array(1).bytes(&[1])
            .text("extra").null();
        let err = parse(&doc_bytes(&w.into_bytes())).unwrap_err();
        assert!(err.to_string().contains("unknown field \"extra\""), "{err}");
    }

    #[test]
    fn envelope_shapes() {
        let payload = encode_payload(&sample());
        let build = |protected: &[u8], unprotected: &[u8], sig: &[u8]| {
            let mut w = cbor::Writer::new();
            w.array(4).bytes(protected).raw(unprotected).bytes(&payload).bytes(sig);
            w.into_bytes()
        };
        let check_of = |bytes: &[u8]| parse(bytes).unwrap_err().check().as_str();
        // Unprotected header null (blocky's self-signed attester) is a structure failure.
        assert_eq!(check_of(&build(&PROTECTED_ES384, &[0xf6], &[0; 96])), "cose_structure");
        assert_eq!(check_of(&build(&PROTECTED_ES384, &[0xa1, 0x04, 0x40], &[0; 96])), "cose_structure");
        // ES256 header: alg check.
        assert_eq!(check_of(&build(&[0xa1, 0x01, 0x26], &[0xa0], &[0; 96])), "alg_es384");
        // Extra protected entries and empty protected headers: structure.
        assert_eq!(check_of(&build(&[0xa2, 0x01, 0x38, 0x22, 0x04, 0x40], &[0xa0], &[0; 96])), "cose_structure");
        assert_eq!(check_of(&build(&[], &[0xa0], &[0; 96])), "cose_structure");
        // Non-minimal encoding of {1: -35}.
        assert_eq!(check_of(&build(&[0xa1, 0x18, 0x01, 0x38, 0x22], &[0xa0], &[0; 96])), "alg_es384");
        // Protected bytes that are not CBOR: cbor.
        assert_eq!(check_of(&build(&[0xa1, 0x01], &[0xa0], &[0; 96])), "cbor");
        // Not an array, wrong length.
        assert_eq!(check_of(&[0xa0]), "cose_structure");
        assert_eq!(check_of(&[0x83, 0x40, 0xa0, 0x41, 0xa0]), "cose_structure");
        assert_eq!(check_of(&[]), "cbor");
        let mut huge = vec![0x84, 0x44, 0xa1, 0x01, 0x38, 0x22, 0xa0, 0x5a, 0x00, 0x01, 0x00, 0x00];
        huge.resize(huge.len() + 65536, 0);
        huge.extend([0x40]);
        let err = parse(&huge).unwrap_err();
        assert_eq!(err.check().as_str(), "cbor");
        assert!(err.to_string().contains("at most 65536"), "{err}");
    }
}
