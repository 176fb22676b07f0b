//! The ledger's known answers quoted in `docs/protocol.md` §8, recomputed here so the document
//! cannot drift from the code.

use receipts_ledger::entry::{attestation_sha256, entry_hash, GENESIS_PREV_HASH};
use receipts_ledger::merkle::leaf_hash;
use receipts_ledger::{Checkpoint, SignerKey};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
const ORIGIN: &str = "ledger.ephem-batch.example/test";

fn document() -> String {
    std::fs::read_to_string(DOC).expect("docs/protocol.md")
}

#[test]
fn entry_hashes_in_the_document_match() {
    let doc = document();
    let att = attestation_sha256(b"attestation-document");
    let h0 = entry_hash(0, &GENESIS_PREV_HASH, &leaf_hash(b"receipt-0"), &att);
    let h1 = entry_hash(1, &h0, &leaf_hash(b"receipt-1"), &att);
    for (i, h) in [h0, h1].iter().enumerate() {
        let row = format!("| {i} | `receipt-{i}` | `{}` |", hex::encode(h));
        assert!(doc.contains(&row), "docs/protocol.md lacks the entry-hash row {row}");
    }
}

#[test]
fn checkpoint_and_key_in_the_document_match() {
    let doc = document();
    let key = SignerKey::from_seed(ORIGIN, &[0x42; 32]).unwrap();
    let verifier = format!("verifier key: {}", key.verifier());
    assert!(doc.contains(&verifier), "docs/protocol.md lacks {verifier}");
    let signed = Checkpoint::new(ORIGIN, 1, leaf_hash(b"")).sign(&key).unwrap();
    assert!(doc.contains(&signed), "docs/protocol.md lacks the signed checkpoint:\n{signed}");
}
