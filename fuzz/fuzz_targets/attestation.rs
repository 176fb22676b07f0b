//! Nitro attestation documents: arbitrary bytes as a COSE_Sign1 document, verified by the
//! client's verifier against the real AWS Nitro Enclaves root G1 at a fixed time (and, like an
//! auditor, at the document's own timestamp). Checks: the report is consistent (checks in the
//! documented order, each passed but a failing last one, whose name is the error's), the
//! structural parse agrees with the verifier's first three checks, and a parsed payload
//! re-encodes to a document that parses to the same fields.
#![no_main]

use ephem_fuzz::fixed::{ATTESTATION_PCR0_HEX, ATTESTATION_TIME_MS};
use libfuzzer_sys::fuzz_target;
use protocol::attestation::cbor::Writer;
use protocol::attestation::document::PROTECTED_ES384;
use protocol::attestation::{AttestationDocument, CheckName, Report, VerifyOptions, verify_report};

fn options(now_ms: u64) -> VerifyOptions {
    VerifyOptions::aws(now_ms).expect_pcr(0, hex::decode(ATTESTATION_PCR0_HEX).expect("hex"))
}

fn check_report(report: &Report) {
    let names: Vec<CheckName> = report.checks.iter().map(|c| c.name).collect();
    assert!(names.windows(2).all(|w| w[0] < w[1]), "checks out of order: {names:?}");
    assert!(!names.is_empty(), "no check evaluated");
    let (last, before) = report.checks.split_last().expect("non-empty");
    assert!(before.iter().all(|c| c.passed), "a check failed before the last one");
    assert_eq!(report.is_valid(), last.passed);
    match report.failed_check() {
        Some(failed) => assert_eq!(failed, last.name),
        None => assert!(last.passed),
    }
    let structure = report.check(CheckName::CoseStructure).is_some_and(|c| c.passed);
    assert_eq!(report.document.is_some(), structure);
    if let Some(verified) = report.verified() {
        assert_eq!(Some(&verified.document), report.document.as_ref());
        // Nothing is believed before the signature, the chain and the root pin passed.
        for name in [CheckName::Signature, CheckName::Chain, CheckName::RootPinned, CheckName::Validity] {
            assert!(report.check(name).is_some_and(|c| c.passed), "valid without {name}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let report = verify_report(data, &options(ATTESTATION_TIME_MS));
    check_report(&report);

    let parsed = AttestationDocument::parse_unverified(data);
    let structural =
        [CheckName::Cbor, CheckName::CoseStructure, CheckName::AlgEs384].iter().all(|n| report.check(*n).is_some_and(|c| c.passed));
    assert_eq!(parsed.is_ok(), structural, "parse_unverified and the verifier disagree");
    let Ok(document) = parsed else { return };
    assert_eq!(report.document.as_ref(), Some(&document));

    // The payload re-encoded as the NSM encodes it, under the same protected header, parses to
    // the same fields.
    let mut w = Writer::new();
    w.array(4).bytes(&PROTECTED_ES384).map(0).bytes(&document.to_payload()).bytes(&[0u8; 96]);
    let again = AttestationDocument::parse_unverified(&w.into_bytes()).expect("a re-encoded payload parses");
    assert_eq!(again, document);

    // The auditor's verification, pinned to the document's own time.
    if document.timestamp_ms != ATTESTATION_TIME_MS {
        check_report(&verify_report(data, &options(document.timestamp_ms)));
    }
});
