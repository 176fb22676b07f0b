use super::*;
use crate::bundle::prove;
use crate::entry::{sample_fields, AppendRequest};
use crate::note::SignerKey;
use crate::store::{CheckpointPolicy, LedgerStore, SqliteStore};
use crate::testing::test_job;
use ed25519_dalek::SigningKey;

const ORIGIN: &str = "ledger.ephem-batch.example/test";

/// The known-answer signed statement: a COSE_Sign1 by an Ed25519 key of seed 7 × 32 over
/// `scitt-statement` (Ed25519 is deterministic, so these bytes are fixed).
fn statement() -> Vec<u8> {
    protocol::cose::sign(b"scitt-statement".to_vec(), "application/test", &SigningKey::from_bytes(&[7; 32]))
}

/// Three entries (`receipt-0`, the statement, `receipt-2`) under a checkpoint of size 3,
/// signed by the known-answer ledger key (seed 42 × 32, §8.5).
fn ledger() -> (SqliteStore, SignerKey) {
    let key = SignerKey::from_seed(ORIGIN, &[0x42; 32]).unwrap();
    let mut s = SqliteStore::open_in_memory().unwrap();
    let reqs: Vec<_> = (0..3)
        .map(|i| AppendRequest {
            leaf: if i == 1 { statement() } else { format!("receipt-{i}").into_bytes() },
            fields: sample_fields(i),
            attestation_document: b"attestation-document".to_vec(),
        })
        .collect();
    s.append(&reqs, &key, &CheckpointPolicy { every_appends: 3, every_ms: u64::MAX }, 1).unwrap();
    (s, key)
}

fn exported() -> (Vec<u8>, SignerKey) {
    let (s, key) = ledger();
    let job = test_job(1);
    let bundle = prove(&s, &job).unwrap();
    (export(&bundle, &hex::encode(job.0), &key).unwrap(), key)
}

/// The (receipt, path) of a statement, for tampering.
fn parts(statement: &[u8]) -> (CoseSign1, Vec<u8>) {
    let message = CoseSign1::from_tagged_slice(statement).unwrap();
    let Value::Array(list) = &message.unprotected.rest[0].1 else { panic!() };
    let Value::Bytes(receipt) = &list[0] else { panic!() };
    (message.clone(), receipt.clone())
}

fn with_receipt(statement: &[u8], receipt: Vec<u8>) -> Vec<u8> {
    let (mut message, _) = parts(statement);
    message.unprotected.rest[0].1 = Value::Array(vec![Value::Bytes(receipt)]);
    message.to_tagged_vec().unwrap()
}

/// Replaces the receipt's inclusion proof by `f(tree_size, leaf_index, path)`.
fn with_proof(statement: &[u8], f: impl FnOnce(&mut u64, &mut u64, &mut Vec<Hash>)) -> Vec<u8> {
    let (_, receipt) = parts(statement);
    let mut r = CoseSign1::from_tagged_slice(&receipt).unwrap();
    let (mut size, mut index, mut path) = inclusion_proof(&r.unprotected).unwrap();
    f(&mut size, &mut index, &mut path);
    r.unprotected = proofs_header(index, size, &path).unwrap();
    with_receipt(statement, r.to_tagged_vec().unwrap())
}

fn check_of(bytes: &[u8], key: &VerifierKey) -> &'static str {
    verify_transparent_statement(bytes, key).unwrap_err().check()
}

#[test]
fn scitt_round_trip() {
    let (ts, key) = exported();
    let v = verify_transparent_statement(&ts, &key.verifier()).unwrap();
    assert_eq!(v.statement, statement());
    assert_eq!((v.leaf_index, v.tree_size), (1, 3));
    assert_eq!(v.issuer, ORIGIN);
    assert_eq!(v.subject, hex::encode(test_job(1).0));
    let (s, _) = ledger();
    assert_eq!(v.root, s.latest_checkpoint().unwrap().unwrap().root);
    // The leaf the tree holds is the statement without 394: its own decoder accepts it again.
    protocol::cose::Sign1::decode(&v.statement, "application/test").unwrap();
}

/// Known answer (docs/protocol.md §8.13), also verified by the independent Python verifier
/// (scripts/tests/scitt_verify.py) from scripts/tests/scitt_vector.json.
#[test]
fn scitt_known_answer() {
    let (ts, key) = exported();
    let (_, receipt) = parts(&ts);
    let want_receipt = "d2845854a40127044470925f2d0fa201781f6c65646765722e657068656d2d62617463682e6578616d706c652f\
        74657374027820303030303030303030303030303030303030303030303030303030303030303119018b01a119018ca1\
        2081584883030182582030ffcce68ded5ce2353dcb4cac3e9b97e8bfac59c144302ea341014fd0560f0658205462ffea\
        863274d28ac2a8ae7a6835c7f6c500848e31ae7d44c8d8d399c63789f65840f5a7960c313ffafea21eeee05a2307bfcd\
        be667d720718cdc450ae582789a392531e05362c8d8766006aa43ca7ca422bff9cb6a5fe49eb2973b5edcb7edb2406";
    let hex_receipt = hex::encode(&receipt);
    let vector = serde_json::json!({
        "ledger_key": key.verifier().to_string(),
        "ledger_public_key": hex::encode(key.verifier().public_key().as_bytes()),
        "statement": hex::encode(statement()),
        "cose_receipt": hex_receipt,
        "transparent_statement": hex::encode(&ts),
        "leaf_index": 1,
        "tree_size": 3,
        "root": hex::encode(verify_transparent_statement(&ts, &key.verifier()).unwrap().root),
    });
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/tests/scitt_vector.json");
    let text = format!("{}\n", serde_json::to_string_pretty(&vector).unwrap());
    if std::env::var_os("EPHEM_REGENERATE").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(hex_receipt, want_receipt);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "scripts/tests/scitt_vector.json is stale");
}

#[test]
fn scitt_tampered_path_index_statement_or_signature_fails_naming_the_check() {
    let (ts, key) = exported();
    let key = key.verifier();
    // Path: another root, so the signature over the root fails.
    let t = with_proof(&ts, |_, _, p| p[0][0] ^= 1);
    assert_eq!(check_of(&t, &key), "cose_receipt_signature");
    // Path shortened: the RFC 9162 walk itself fails.
    let t = with_proof(&ts, |_, _, p| {
        p.pop();
    });
    assert_eq!(check_of(&t, &key), "inclusion");
    // Leaf index: another position is another root; past the end is no position at all.
    let t = with_proof(&ts, |_, i, _| *i ^= 1);
    assert_eq!(check_of(&t, &key), "cose_receipt_signature");
    let t = with_proof(&ts, |_, i, _| *i = 3);
    assert_eq!(check_of(&t, &key), "inclusion");
    let t = with_proof(&ts, |s, _, _| *s = 2);
    assert_eq!(check_of(&t, &key), "inclusion");
    // The signature covers the root, not the stated size: size 4 walks the same path of leaf 1
    // to the same root as size 3 (§8.13: the size is the checkpoint's to vouch for).
    let t = with_proof(&ts, |s, _, _| *s = 4);
    let v = verify_transparent_statement(&t, &key).unwrap();
    assert_eq!((v.tree_size, v.root), (4, verify_transparent_statement(&ts, &key).unwrap().root));
    // The statement's payload: another leaf.
    let (mut m, _) = parts(&ts);
    m.payload.as_mut().unwrap()[0] ^= 1;
    assert_eq!(check_of(&m.to_tagged_vec().unwrap(), &key), "cose_receipt_signature");
    // The receipt's signature.
    let (_, receipt) = parts(&ts);
    let mut r = CoseSign1::from_tagged_slice(&receipt).unwrap();
    r.signature[10] ^= 1;
    assert_eq!(check_of(&with_receipt(&ts, r.to_tagged_vec().unwrap()), &key), "cose_receipt_signature");
    // Any single bit of the whole statement.
    for byte in 0..ts.len() {
        let mut t = ts.clone();
        t[byte] ^= 0x10;
        assert!(verify_transparent_statement(&t, &key).is_err(), "flip at byte {byte} verified");
    }
}

#[test]
fn scitt_another_ledger_key_fails() {
    let (ts, _) = exported();
    // Same name, another key: the kid differs.
    let other = SignerKey::from_seed(ORIGIN, &[0x43; 32]).unwrap();
    assert_eq!(check_of(&ts, &other.verifier()), "cose_receipt_key");
    // A receipt forged by that key over the same proof, presented against the real key.
    let (s, real) = ledger();
    let bundle = prove(&s, &test_job(1)).unwrap();
    let path: Vec<Hash> = bundle.inclusion_path.iter().map(|h| hex::decode(h).unwrap().try_into().unwrap()).collect();
    let forged = cose_receipt(&statement(), 1, 3, &path, &hex::encode(test_job(1).0), &other).unwrap();
    let t = with_receipt(&ts, forged);
    assert_eq!(check_of(&t, &real.verifier()), "cose_receipt_key");
    assert!(verify_transparent_statement(&t, &other.verifier()).is_ok());
    // The forger's receipt with the real kid and name spliced into its protected header still
    // needs the real key's signature.
    let (_, genuine) = parts(&ts);
    let mut g = CoseSign1::from_tagged_slice(&genuine).unwrap();
    let f = CoseSign1::from_tagged_slice(&parts(&t).1).unwrap();
    g.signature = f.signature;
    assert_eq!(check_of(&with_receipt(&ts, g.to_tagged_vec().unwrap()), &real.verifier()), "cose_receipt_signature");
}

#[test]
fn scitt_statement_shape_is_strict() {
    let (ts, key) = exported();
    let key = key.verifier();
    // Extra unprotected parameters beside 394 would not be the stored leaf.
    let (mut m, receipt) = parts(&ts);
    m.unprotected.rest.push((Label::Int(33), Value::Bytes(vec![1])));
    assert_eq!(check_of(&m.to_tagged_vec().unwrap(), &key), "statement");
    // Two receipts, or none.
    let (mut m, _) = parts(&ts);
    m.unprotected.rest[0].1 = Value::Array(vec![Value::Bytes(receipt.clone()), Value::Bytes(receipt)]);
    assert_eq!(check_of(&m.to_tagged_vec().unwrap(), &key), "statement");
    assert_eq!(check_of(&statement(), &key), "statement");
    // An attached payload in the receipt.
    let (_, receipt) = parts(&ts);
    let mut r = CoseSign1::from_tagged_slice(&receipt).unwrap();
    r.payload = Some(vec![0; 32]);
    assert_eq!(check_of(&with_receipt(&ts, r.to_tagged_vec().unwrap()), &key), "cose_receipt");
    // A statement with an unprotected header already is refused at export.
    assert_eq!(transparent_statement(&ts, &[]).unwrap_err().check(), "statement");
    assert!(check_of(b"not cbor", &key) == "statement");
}
