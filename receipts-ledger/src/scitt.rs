//! Ledger entries as IETF SCITT transparent statements carrying COSE Receipts
//! (draft-ietf-cose-merkle-tree-proofs-18, draft-ietf-scitt-architecture-22; docs/protocol.md §8.13),
//! so that a verifier that knows nothing of this project can check inclusion.
//!
//! A **COSE Receipt** is a COSE_Sign1 by the ledger key: protected header
//! `{1: -8 (EdDSA), 4: kid, 15: {1: iss, 2: sub}, 395: 1 (RFC9162_SHA256)}`, unprotected header
//! `{396: {-1: [bstr .cbor [tree_size, leaf_index, [+ path bstr]]]}}`, payload detached (nil);
//! the signature is over the Sig_structure whose payload is the RFC 9162 root recomputed from the
//! leaf and the path. `kid` is the ledger's C2SP note key id (4 bytes, big endian), `iss` the
//! ledger key's name (the checkpoint origin), `sub` the entry's job (or usage) id in hex.
//!
//! The **transparent statement** is the entry's leaf — the receipt COSE_Sign1 exactly as stored —
//! with `394: [receipt]` added to its (otherwise empty) unprotected header. The tree's leaf is the
//! stored bytes, so the verifier removes 394 and hashes what is left, which must be exactly those
//! bytes (our receipt decoder also requires the empty unprotected header).

use coset::cbor::value::Value;
use coset::cwt::ClaimsSetBuilder;
use coset::{iana, AsCborValue, CborSerializable, CoseSign1, CoseSign1Builder, Header, HeaderBuilder, Label};
use coset::TaggedCborSerializable;

use crate::bundle::{verify_bundle, BundleError, ProofBundle, MAX_PATH_LEN};
use crate::merkle::{inclusion_root, leaf_hash, Hash, VerifyError};
use crate::note::{NoteError, NoteSigner, VerifierKey};

/// COSE header parameter `receipts` (draft-ietf-cose-merkle-tree-proofs-18 §2, IANA early allocation).
pub const RECEIPTS: i64 = 394;
/// COSE header parameter `vds`: the verifiable data structure of a receipt.
pub const VDS: i64 = 395;
/// COSE header parameter `vdp`: the verifiable data structure proofs of a receipt.
pub const VDP: i64 = 396;
/// The COSE Verifiable Data Structure `RFC9162_SHA256`.
pub const RFC9162_SHA256: i64 = 1;
/// Label of the inclusion proofs inside `vdp`.
pub const INCLUSION_PROOFS: i64 = -1;
/// COSE header parameter `CWT Claims` (RFC 9597).
pub const CWT_CLAIMS: i64 = 15;
/// Largest transparent statement accepted (a receipt is ≤ 1 MiB, §8.1).
pub const MAX_STATEMENT_SIZE: usize = 2 << 20;

/// Why an export could not be made or a statement did not verify; [`ScittError::check`] names the check.
#[derive(Debug, thiserror::Error)]
pub enum ScittError {
    #[error("statement: {0}")]
    Statement(String),
    #[error("cose_receipt: {0}")]
    Receipt(String),
    #[error("cose_receipt_key: {0}")]
    ReceiptKey(String),
    #[error("inclusion_proof: {0}")]
    InclusionProof(String),
    #[error("inclusion: {0}")]
    Inclusion(#[from] VerifyError),
    #[error("cose_receipt_signature: the ledger key's signature does not verify over the root recomputed from the statement and the path")]
    Signature,
    #[error("bundle: {0}")]
    Bundle(#[from] BundleError),
    #[error("sign: {0}")]
    Sign(#[from] NoteError),
}

impl ScittError {
    /// The name of the failed check.
    pub fn check(&self) -> &'static str {
        match self {
            ScittError::Statement(_) => "statement",
            ScittError::Receipt(_) => "cose_receipt",
            ScittError::ReceiptKey(_) => "cose_receipt_key",
            ScittError::InclusionProof(_) => "inclusion_proof",
            ScittError::Inclusion(_) => "inclusion",
            ScittError::Signature => "cose_receipt_signature",
            ScittError::Bundle(_) => "bundle",
            ScittError::Sign(_) => "sign",
        }
    }
}

/// What a verified transparent statement proves: `statement` is leaf `leaf_index` of the
/// ledger's tree of `tree_size` leaves whose root is `root`, signed by the pinned key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedStatement {
    /// The signed statement as stored in the ledger (394 removed): the Merkle leaf.
    pub statement: Vec<u8>,
    pub leaf_index: u64,
    pub tree_size: u64,
    pub root: Hash,
    pub issuer: String,
    pub subject: String,
}

fn protected_header(key: &VerifierKey, subject: &str) -> Result<Header, ScittError> {
    let claims = ClaimsSetBuilder::new().issuer(key.name().to_owned()).subject(subject.to_owned()).build();
    let claims = claims.to_cbor_value().map_err(|e| ScittError::Receipt(e.to_string()))?;
    Ok(HeaderBuilder::new()
        .algorithm(iana::Algorithm::EdDSA)
        .key_id(key.id().to_be_bytes().to_vec())
        .value(CWT_CLAIMS, claims)
        .value(VDS, Value::Integer(RFC9162_SHA256.into()))
        .build())
}

fn proofs_header(leaf_index: u64, tree_size: u64, path: &[Hash]) -> Result<Header, ScittError> {
    let proof = Value::Array(vec![
        Value::Integer(tree_size.into()),
        Value::Integer(leaf_index.into()),
        Value::Array(path.iter().map(|h| Value::Bytes(h.to_vec())).collect()),
    ]);
    let proof = proof.to_vec().map_err(|e| ScittError::Receipt(e.to_string()))?;
    let vdp = Value::Map(vec![(
        Value::Integer(INCLUSION_PROOFS.into()),
        Value::Array(vec![Value::Bytes(proof)]),
    )]);
    Ok(HeaderBuilder::new().value(VDP, vdp).build())
}

/// The COSE Receipt of `leaf` at `leaf_index` in the tree of `tree_size` leaves (its inclusion
/// path `path`, leaf end first), signed by `signer` over the recomputed root.
pub fn cose_receipt(
    leaf: &[u8],
    leaf_index: u64,
    tree_size: u64,
    path: &[Hash],
    subject: &str,
    signer: &dyn NoteSigner,
) -> Result<Vec<u8>, ScittError> {
    let root = inclusion_root(leaf_index, tree_size, &leaf_hash(leaf), path)?;
    let message = CoseSign1Builder::new()
        .protected(protected_header(&signer.verifier(), subject)?)
        .unprotected(proofs_header(leaf_index, tree_size, path)?)
        .try_create_detached_signature(&root, b"", |tbs| signer.sign(tbs))?
        .build();
    message.to_tagged_vec().map_err(|e| ScittError::Receipt(e.to_string()))
}

/// The transparent statement: `statement` (a COSE_Sign1 with an empty unprotected header) with
/// `receipts` in its unprotected header under 394.
pub fn transparent_statement(statement: &[u8], receipts: &[Vec<u8>]) -> Result<Vec<u8>, ScittError> {
    let mut message = decode_canonical(statement).map_err(ScittError::Statement)?;
    if !message.unprotected.is_empty() {
        return Err(ScittError::Statement("the signed statement's unprotected header is not empty".into()));
    }
    let receipts = receipts.iter().map(|r| Value::Bytes(r.clone())).collect();
    message.unprotected = HeaderBuilder::new().value(RECEIPTS, Value::Array(receipts)).build();
    message.to_tagged_vec().map_err(|e| ScittError::Statement(e.to_string()))
}

/// Exports a proof bundle's entry (after verifying the bundle under the signer's own key) as a
/// transparent statement with one COSE Receipt whose subject is `subject`.
pub fn export(bundle: &ProofBundle, subject: &str, signer: &dyn NoteSigner) -> Result<Vec<u8>, ScittError> {
    let verified = verify_bundle(bundle, &signer.verifier())?;
    let path = bundle
        .inclusion_path
        .iter()
        .map(|h| hex::decode(h).ok().and_then(|b| Hash::try_from(b).ok()))
        .collect::<Option<Vec<Hash>>>()
        .ok_or_else(|| ScittError::InclusionProof("bundle path element is not a 32-byte hash".into()))?;
    let receipt = cose_receipt(&verified.receipt, verified.leaf_index, bundle.tree_size, &path, subject, signer)?;
    transparent_statement(&verified.receipt, &[receipt])
}

/// Decodes a tagged COSE_Sign1 that must be in the one encoding this module writes.
fn decode_canonical(bytes: &[u8]) -> Result<CoseSign1, String> {
    let message = CoseSign1::from_tagged_slice(bytes).map_err(|e| format!("not a tagged COSE_Sign1: {e}"))?;
    if message.clone().to_tagged_vec().ok().as_deref() != Some(bytes) {
        return Err("not in canonical encoding".into());
    }
    Ok(message)
}

/// Verifies a transparent statement offline against the pinned ledger key: it must carry exactly
/// one COSE Receipt (394) and nothing else unprotected; the receipt's protected header must name
/// the pinned key and RFC9162_SHA256; the root recomputed from the statement without 394 and the
/// receipt's path must verify the receipt's signature.
pub fn verify_transparent_statement(bytes: &[u8], pinned: &VerifierKey) -> Result<VerifiedStatement, ScittError> {
    if bytes.len() > MAX_STATEMENT_SIZE {
        return Err(ScittError::Statement(format!("{} bytes, more than {MAX_STATEMENT_SIZE}", bytes.len())));
    }
    let mut message = decode_canonical(bytes).map_err(ScittError::Statement)?;
    let header = std::mem::take(&mut message.unprotected);
    let only_receipts = header.is_empty_except_rest() && header.rest.len() == 1;
    let receipt = match header.rest.first() {
        Some((Label::Int(RECEIPTS), Value::Array(list))) if only_receipts && list.len() == 1 => match &list[0] {
            Value::Bytes(r) => r.clone(),
            _ => return Err(ScittError::Statement("the receipt under 394 is not a byte string".into())),
        },
        _ => return Err(ScittError::Statement("the unprotected header must be exactly {394: [one receipt]}".into())),
    };
    // The leaf is the statement as stored: the same message with an empty unprotected header.
    let statement = message.to_tagged_vec().map_err(|e| ScittError::Statement(e.to_string()))?;
    verify_cose_receipt(&receipt, &statement, pinned)
}

/// Verifies one COSE Receipt for `leaf` (the exact leaf bytes) against the pinned ledger key.
pub fn verify_cose_receipt(receipt: &[u8], leaf: &[u8], pinned: &VerifierKey) -> Result<VerifiedStatement, ScittError> {
    let message = decode_canonical(receipt).map_err(ScittError::Receipt)?;
    let header = &message.protected.header;
    if header.key_id != pinned.id().to_be_bytes() {
        return Err(ScittError::ReceiptKey(format!(
            "kid {} is not the pinned key's {:08x}",
            hex::encode(&header.key_id),
            pinned.id()
        )));
    }
    let (issuer, subject) = claims(header)?;
    if issuer != pinned.name() {
        return Err(ScittError::ReceiptKey(format!("issuer {issuer:?} is not the pinned key's name {:?}", pinned.name())));
    }
    // One encoding: the protected header must be the one this module writes for these claims.
    if *header != protected_header(pinned, &subject)? {
        return Err(ScittError::Receipt("protected header must be {alg: EdDSA, kid, CWT claims {iss, sub}, vds: RFC9162_SHA256}".into()));
    }
    if message.payload.is_some() {
        return Err(ScittError::Receipt("the payload must be detached (nil)".into()));
    }
    let (tree_size, leaf_index, path) = inclusion_proof(&message.unprotected)?;
    let root = inclusion_root(leaf_index, tree_size, &leaf_hash(leaf), &path)?;
    message
        .verify_detached_signature(&root, b"", |sig, tbs| if pinned.verify(tbs, sig) { Ok(()) } else { Err(()) })
        .map_err(|()| ScittError::Signature)?;
    Ok(VerifiedStatement { statement: leaf.to_vec(), leaf_index, tree_size, root, issuer, subject })
}

fn claims(header: &Header) -> Result<(String, String), ScittError> {
    let bad = || ScittError::Receipt("CWT claims (15) with text iss and sub are required".into());
    let value = header.rest.iter().find(|(l, _)| *l == Label::Int(CWT_CLAIMS)).map(|(_, v)| v.clone()).ok_or_else(bad)?;
    let claims = coset::cwt::ClaimsSet::from_cbor_value(value).map_err(|_| bad())?;
    Ok((claims.issuer.ok_or_else(bad)?, claims.subject.ok_or_else(bad)?))
}

fn inclusion_proof(unprotected: &Header) -> Result<(u64, u64, Vec<Hash>), ScittError> {
    let bad = |what: &str| ScittError::InclusionProof(what.to_owned());
    let shape = "the unprotected header must be exactly {396: {-1: [one bstr .cbor [tree_size, leaf_index, path]]}}";
    if !unprotected.is_empty_except_rest() || unprotected.rest.len() != 1 {
        return Err(bad(shape));
    }
    let proof = match &unprotected.rest[0] {
        (Label::Int(VDP), Value::Map(m)) if m.len() == 1 => match &m[0] {
            (Value::Integer(l), Value::Array(proofs)) if i128::from(*l) == i128::from(INCLUSION_PROOFS) && proofs.len() == 1 => {
                match &proofs[0] {
                    Value::Bytes(b) => b.clone(),
                    _ => return Err(bad(shape)),
                }
            }
            _ => return Err(bad(shape)),
        },
        _ => return Err(bad(shape)),
    };
    let decoded = Value::from_slice(&proof).map_err(|_| bad("the inclusion proof is not CBOR"))?;
    if decoded.clone().to_vec().ok().as_deref() != Some(&proof[..]) {
        return Err(bad("the inclusion proof is not in canonical encoding"));
    }
    let Value::Array(items) = decoded else { return Err(bad("the inclusion proof is not an array")) };
    let [Value::Integer(size), Value::Integer(index), Value::Array(path)] = &items[..] else {
        return Err(bad("the inclusion proof must be [tree_size, leaf_index, path]"));
    };
    let (Ok(size), Ok(index)) = (u64::try_from(*size), u64::try_from(*index)) else {
        return Err(bad("tree_size and leaf_index must be unsigned 64-bit integers"));
    };
    if path.len() > MAX_PATH_LEN {
        return Err(bad("the inclusion path is longer than 64"));
    }
    let path = path
        .iter()
        .map(|h| match h {
            Value::Bytes(b) => Hash::try_from(b.as_slice()).ok(),
            _ => None,
        })
        .collect::<Option<Vec<Hash>>>()
        .ok_or_else(|| bad("an inclusion path element is not a 32-byte hash"))?;
    Ok((size, index, path))
}

trait HeaderExt {
    fn is_empty_except_rest(&self) -> bool;
}

impl HeaderExt for Header {
    fn is_empty_except_rest(&self) -> bool {
        Header { rest: Vec::new(), ..self.clone() }.is_empty()
    }
}

#[cfg(test)]
mod tests;
