//! Receipts: arbitrary bytes as a receipt leaf, decoded and run through the full receipt check
//! (`protocol::receipt_check`) against a fixed development enclave (its attestation document binds
//! the receipt key, the fleet key and the epoch; the seeds pass every check). Checks: strict
//! decoding (a decoded payload re-encodes to its bytes), a receipt re-signed by the enclave decodes
//! and verifies to the same content, and the check fails at `receipt` exactly when decoding fails.
#![no_main]

use std::sync::OnceLock;

use ephem_fuzz::fixed;
use libfuzzer_sys::fuzz_target;
use protocol::cose::Sign1;
use protocol::receipt::{CONTENT_TYPE, SignedReceipt};
use protocol::receipt_check::ReceiptVerifier;

fn checker() -> &'static ReceiptVerifier {
    static CHECKER: OnceLock<ReceiptVerifier> = OnceLock::new();
    CHECKER.get_or_init(|| ReceiptVerifier::new(fixed::enclave().root.clone()))
}

fuzz_target!(|data: &[u8]| {
    let enclave = fixed::enclave();
    let decoded = SignedReceipt::decode(data);
    let checked = checker().verify(data, &enclave.document);
    match (&decoded, &checked) {
        (Err(_), Err(e)) => assert_eq!(e.check(), "receipt"),
        (Err(e), Ok(_)) => panic!("the ledger accepted a receipt that does not decode: {e}"),
        (Ok(_), Err(e)) => assert_ne!(e.check(), "receipt"),
        (Ok(signed), Ok(verified)) => {
            assert_eq!(verified.receipt, signed.receipt);
            signed.verify(&enclave.receipt_key.verifying_key()).expect("accepted, so signed by the enclave");
        }
    }
    let Ok(signed) = decoded else { return };
    let payload = Sign1::decode(data, CONTENT_TYPE).expect("decoded once").payload;
    assert_eq!(signed.receipt.to_payload(), payload, "the receipt payload has a second encoding");
    let resigned = signed.receipt.sign(&enclave.receipt_key);
    let again = SignedReceipt::decode(&resigned).expect("a re-signed receipt decodes");
    assert_eq!(again.receipt, signed.receipt);
    again.verify(&enclave.receipt_key.verifying_key()).expect("a re-signed receipt verifies");
});
