//! The verifier against real AWS Nitro attestation documents and crafted negatives
//! (shared/fixtures/nitro-attestation, see its README), plus the development issuer and a
//! never-panic property test.
//!
//! Fixtures are read from `$EPHEM_FIXTURES` (default: `../../shared/fixtures` from this crate).

// Wrapped in `mod attestation` so `cargo test -p protocol attestation` selects these tests.
mod attestation {
    use std::path::PathBuf;

    use proptest::prelude::*;
    use protocol::attestation::roots::AWS_NITRO_ROOT_G1_PEM;
    use protocol::attestation::{
        AttestationDocument, CheckName, DevIssuer, DocumentRequest, RootKind, TrustAnchor, VerifyOptions, verify,
        verify_report,
    };
    use sha2::{Digest, Sha256};

    fn fixtures() -> PathBuf {
        match std::env::var_os("EPHEM_FIXTURES") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")),
        }
        .join("nitro-attestation")
    }

    fn read(name: &str) -> Vec<u8> {
        let path = fixtures().join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
    }

    struct Real {
        file: &'static str,
        sha256: &'static str,
        timestamp_ms: u64,
        debug: bool,
        pcr0: &'static str,
        /// (public_key, user_data, nonce) lengths; None = null.
        aux: (Option<usize>, Option<usize>, Option<usize>),
    }

    const ZERO48: &str = "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";

    const REAL: [Real; 5] = [
        Real {
            file: "aws-samples_eu-west-1_debug_2023-03-28.cbor",
            sha256: "c9f773ce17c720028abc33639bb4ba3e61077164bbfa410510e4b545d7d1ebfe",
            timestamp_ms: 1680004560937,
            debug: true,
            pcr0: ZERO48,
            aux: (None, None, None),
        },
        Real {
            file: "aws-samples_us-east-2_prod_2023-06-06.cbor",
            sha256: "ad3e38b5f9617755c1d15912d16d784c4fb18eb35032997e87e2edcf74f77978",
            timestamp_ms: 1686060167435,
            debug: false,
            pcr0: "836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901",
            aux: (None, None, None),
        },
        Real {
            file: "evervault_us-east-1_prod_nonce_2022-10-13.cbor",
            sha256: "a72552688ab6de06b9039ebda2bd5ae9285860ec886f841da94351681dfb3eb6",
            timestamp_ms: 1665651482136,
            debug: false,
            pcr0: "f4d48b81a460c9916d1e685119074bf24660afd3e34fae9fca0a0d28d9d5599936332687e6f66fc890ac8cf150142d8b",
            aux: (None, None, Some(256)),
        },
        Real {
            file: "evervault_us-east-1_debug_pubkey-userdata_2022-10-12.cbor",
            sha256: "46591b92f9abefaace22a6d7ea4ca9c7007dfdbe788fbe8634b230ec2043a789",
            timestamp_ms: 1665582606081,
            debug: true,
            pcr0: ZERO48,
            aux: (Some(19), Some(13), None),
        },
        Real {
            file: "blocky-nitrite_us-east-1_prod_max-fields_2024-09-07.cbor",
            sha256: "72ffd835a669cad29f11314fb4185bd89eaed2762e30dc25282c663606ee30ee",
            timestamp_ms: 1725719859545,
            debug: false,
            pcr0: "e72a46ca80a260fb044a125442f0c7e331813bcbaf9724d9f3857758992766f2d65710a27aa94ae3949dd54e7c9fe86a",
            aux: (Some(1024), Some(1024), Some(1024)),
        },
    ];

    const US_EAST_2: &str = "aws-samples_us-east-2_prod_2023-06-06.cbor";
    const US_EAST_2_TS: u64 = 1686060167435;
    const US_EAST_2_PCR1: &str =
        "bcdf05fefccaa8e55bf2c8d6dee9e79bbff31e34bf28a99aa19e6b29c37ee80b214a414b7607236edf26fcb78654e63f";
    const US_EAST_2_PCR2: &str =
        "4314515615d0365648a8763292907c99353a10477d51934333c69b27612ea6db73522675324fe069f6e8cd3eb910d0d6";

    fn aws_at(ts: u64) -> VerifyOptions {
        VerifyOptions::aws(ts)
    }

    #[test]
    fn root_matches_the_fixture_byte_for_byte() {
        let pem = read("aws_nitro_root_g1.pem");
        assert_eq!(pem, AWS_NITRO_ROOT_G1_PEM.as_bytes());
        let root = TrustAnchor::aws_nitro_g1();
        assert_eq!(
            hex::encode_upper(root.sha256()),
            "641A0321A3E244EFE456463195D606317ED7CDCC3C1756E09893F3C68F79BB5B"
        );
        assert_eq!(hex::encode(Sha256::digest(root.der())), hex::encode(root.sha256()));
    }

    #[test]
    fn real_documents_verify_at_their_own_time() {
        for real in &REAL {
            let bytes = read(real.file);
            assert_eq!(hex::encode(Sha256::digest(&bytes)), real.sha256, "{}", real.file);
            let mut opts = aws_at(real.timestamp_ms);
            opts.allow_debug = real.debug;
            opts = opts.expect_pcr(0, hex::decode(real.pcr0).unwrap());
            let report = verify_report(&bytes, &opts);
            assert!(report.is_valid(), "{}: {:?}", real.file, report.error());
            // Every mandatory check ran and passed, in order; nonce/binding were not requested.
            let ran: Vec<CheckName> = report.checks.iter().map(|c| c.name).collect();
            assert_eq!(ran, &CheckName::ALL[..10], "{}", real.file);
            assert!(report.checks.iter().all(|c| c.passed));
            assert_eq!(report.not_evaluated(), [CheckName::Nonce, CheckName::UserDataBinding, CheckName::FleetKmsKey]);
            let v = report.into_result().unwrap();
            assert_eq!(v.root.kind, RootKind::AwsNitroG1);
            assert_eq!(v.debug_mode, real.debug);
            let d = &v.document;
            assert_eq!(d.timestamp_ms, real.timestamp_ms);
            assert_eq!(d.digest, "SHA384");
            assert_eq!(d.pcrs.len(), 16);
            assert!(d.pcrs.values().all(|p| p.len() == 48));
            assert_eq!(hex::encode(d.pcr(0).unwrap()), real.pcr0);
            assert_eq!(d.cabundle.len(), 4);
            let lens = (
                d.public_key.as_ref().map(Vec::len),
                d.user_data.as_ref().map(Vec::len),
                d.nonce.as_ref().map(Vec::len),
            );
            assert_eq!(lens, real.aux, "{}", real.file);
            // The leaf lives about three hours.
            let hours = (v.chain_not_after_ms - real.timestamp_ms) as f64 / 3_600_000.0;
            assert!((2.9..=3.01).contains(&hours), "{}: {hours}", real.file);
            // With the nonce the document carries, the nonce check passes too.
            if let Some(nonce) = &d.nonce {
                let mut with_nonce = opts.clone();
                with_nonce.expected_nonce = Some(nonce.clone());
                assert!(verify(&bytes, &with_nonce).is_ok());
            }
        }
    }

    #[test]
    fn debug_documents_are_refused_without_allow_debug() {
        for real in REAL.iter().filter(|r| r.debug) {
            let err = verify(&read(real.file), &aws_at(real.timestamp_ms)).unwrap_err();
            assert_eq!(err.check(), CheckName::DebugMode, "{}", real.file);
            assert!(err.to_string().starts_with("debug_mode: PCR0, PCR1 and PCR2 are all zero"), "{err}");
        }
        for real in REAL.iter().filter(|r| !r.debug) {
            assert!(verify(&read(real.file), &aws_at(real.timestamp_ms)).is_ok(), "{}", real.file);
        }
    }

    #[test]
    fn full_pcr_policy_for_the_us_east_2_document() {
        let bytes = read(US_EAST_2);
        let opts = aws_at(US_EAST_2_TS)
            .expect_pcr(0, hex::decode(REAL[1].pcr0).unwrap())
            .expect_pcr(1, hex::decode(US_EAST_2_PCR1).unwrap())
            .expect_pcr(2, hex::decode(US_EAST_2_PCR2).unwrap())
            .expect_pcr(8, vec![0; 48]);
        assert!(verify(&bytes, &opts).is_ok());
        // The policy known-answer vector pins exactly this document's PCR0/1/2.
        let (policy, key) = protocol::attestation::vectors::policy_sample();
        let signed = policy.sign(&key).unwrap();
        let policy = signed.verify(&key.verifying_key()).unwrap();
        assert!(verify(&bytes, &policy.verify_options(US_EAST_2_TS)).is_ok());
    }

    fn expect_failure(bytes: &[u8], opts: &VerifyOptions, check: CheckName) -> String {
        let report = verify_report(bytes, opts);
        let err = report.error().unwrap_or_else(|| panic!("expected {check} to fail, but the document verified"));
        assert_eq!(err.check(), check, "{err}");
        // The report stops at the failed check, which is the last one listed.
        let last = report.checks.last().unwrap();
        assert_eq!((last.name, last.passed), (check, false));
        assert!(report.checks[..report.checks.len() - 1].iter().all(|c| c.passed));
        err.to_string()
    }

    #[test]
    fn negative_fixtures_fail_the_expected_check() {
        let opts = aws_at(US_EAST_2_TS);
        let cases = [
            ("neg_payload_byteflip.cbor", CheckName::Signature, "signature: ES384 signature does not verify with the leaf key"),
            ("neg_signature_byteflip.cbor", CheckName::Signature, "signature: ES384 signature does not verify with the leaf key"),
            ("neg_pcr0_modified.cbor", CheckName::Signature, "signature: ES384 signature does not verify with the leaf key"),
            ("neg_leaf_cert_swapped.cbor", CheckName::Signature, "signature: ES384 signature does not verify with the leaf key"),
            ("neg_alg_es256_header.cbor", CheckName::AlgEs384, "alg_es384: protected header alg is -7 (ES256)"),
            ("neg_truncated.cbor", CheckName::Cbor, "cbor: document is not well-formed CBOR"),
            ("neg_forged_root.cbor", CheckName::RootPinned, "root_pinned: cabundle[0] (CN=aws.nitro-enclaves"),
            ("neg_blocky_selfsigned.cbor", CheckName::CoseStructure, "cose_structure: unprotected header is null"),
        ];
        for (file, check, message) in cases {
            let bytes = read(&format!("negative/{file}"));
            let text = expect_failure(&bytes, &opts, check);
            assert!(text.starts_with(message), "{file}: {text}");
        }
    }

    #[test]
    fn pcr_policy_is_never_evaluated_before_the_signature() {
        // neg_pcr0_modified carries a PCR0 that would *match* a policy expecting the modified value;
        // the verifier must still fail on the signature and must not have looked at PCRs.
        let bytes = read("negative/neg_pcr0_modified.cbor");
        let doc = AttestationDocument::parse_unverified(&bytes).unwrap();
        let opts = aws_at(US_EAST_2_TS).expect_pcr(0, doc.pcr(0).unwrap().to_vec());
        let report = verify_report(&bytes, &opts);
        assert_eq!(report.failed_check(), Some(CheckName::Signature));
        assert!(report.check(CheckName::PcrPolicy).is_none());
        assert!(report.not_evaluated().contains(&CheckName::PcrPolicy));
    }

    #[test]
    fn time_pinning() {
        let bytes = read(US_EAST_2);
        assert!(verify(&bytes, &aws_at(US_EAST_2_TS)).is_ok());
        // Four hours later the leaf has expired (and the document is too old, but validity comes first).
        let text = expect_failure(&bytes, &aws_at(US_EAST_2_TS + 4 * 3600 * 1000), CheckName::Validity);
        assert!(text.contains("leaf certificate") && text.contains("expired at 2023-06-06T17:02:42.000Z"), "{text}");
        // One hour earlier the instance-level CA (cabundle[3], issued 13:59:02) is not yet valid.
        let text = expect_failure(&bytes, &aws_at(US_EAST_2_TS - 3600 * 1000), CheckName::Validity);
        assert!(text.contains("cabundle[3]") && text.contains("is not valid before 2023-06-06T13:59:02.000Z"), "{text}");
        // Within the leaf's life but past max age: freshness.
        let mut opts = aws_at(US_EAST_2_TS + 2 * 3600 * 1000);
        expect_failure(&bytes, &opts, CheckName::Freshness);
        opts.max_age_s = 3 * 3600;
        assert!(verify(&bytes, &opts).is_ok());
        // A verifier clock 10 minutes behind the NSM's: the leaf is not yet valid.
        expect_failure(&bytes, &aws_at(US_EAST_2_TS - 600_000), CheckName::Validity);
    }

    #[test]
    fn wrong_expectations_name_their_check() {
        let bytes = read(US_EAST_2);
        let mut pcr0 = hex::decode(REAL[1].pcr0).unwrap();
        pcr0[0] ^= 1;
        let text = expect_failure(&bytes, &aws_at(US_EAST_2_TS).expect_pcr(0, pcr0), CheckName::PcrPolicy);
        assert!(text.starts_with("pcr_policy: PCR0 is 836fa88a"), "{text}");
        expect_failure(&bytes, &aws_at(US_EAST_2_TS).expect_pcr(20, vec![0; 48]), CheckName::PcrPolicy);

        let mut opts = aws_at(US_EAST_2_TS);
        opts.expected_nonce = Some(vec![1, 2, 3]);
        let text = expect_failure(&bytes, &opts, CheckName::Nonce);
        assert!(text.contains("no nonce"), "{text}");

        let nonce_doc = read(REAL[2].file);
        let mut opts = aws_at(REAL[2].timestamp_ms);
        let mut nonce = AttestationDocument::parse_unverified(&nonce_doc).unwrap().nonce.unwrap();
        nonce[255] ^= 1;
        opts.expected_nonce = Some(nonce);
        expect_failure(&nonce_doc, &opts, CheckName::Nonce);

        // user_data "hello, world!" is not a key binding.
        let ev_debug = read(REAL[3].file);
        let mut opts = aws_at(REAL[3].timestamp_ms);
        opts.allow_debug = true;
        opts.require_binding = true;
        let text = expect_failure(&ev_debug, &opts, CheckName::UserDataBinding);
        assert!(text.starts_with("user_data_binding: user_data is not a key binding"), "{text}");
        // user_data absent.
        let mut opts = aws_at(US_EAST_2_TS);
        opts.require_binding = true;
        let text = expect_failure(&bytes, &opts, CheckName::UserDataBinding);
        assert!(text.contains("no user_data"), "{text}");
    }

    #[test]
    fn a_trust_store_without_the_aws_root_refuses_real_documents() {
        let dev = DevIssuer::from_seed(&[3; 32], US_EAST_2_TS).unwrap();
        let opts = VerifyOptions::new(dev.trust_anchor().unwrap(), US_EAST_2_TS);
        expect_failure(&read(US_EAST_2), &opts, CheckName::RootPinned);
        // …and the AWS root refuses development documents.
        let doc = dev.attest(&DocumentRequest::new("m").with_pcr(0, [1; 48]), US_EAST_2_TS).unwrap();
        expect_failure(&doc, &aws_at(US_EAST_2_TS), CheckName::RootPinned);
    }

    #[test]
    fn tagged_form_of_a_real_document_verifies() {
        let mut bytes = vec![0xd2];
        bytes.extend(read(US_EAST_2));
        assert!(verify(&bytes, &aws_at(US_EAST_2_TS)).is_ok());
    }

    #[test]
    fn dev_issuer_round_trip_and_tamper() {
        let t0 = 1_750_000_000_000;
        let dev = DevIssuer::generate(t0).unwrap();
        let anchor = TrustAnchor::from_der(dev.root_der()).unwrap();
        assert_eq!(anchor.kind(), RootKind::Development);
        let binding = protocol::attestation::vectors::binding_sample();
        let mut req = DocumentRequest::new("i-dev-enc1").with_pcr(0, [0x11; 48]).with_pcr(1, [0x22; 48]);
        req.user_data = Some(binding.encode());
        req.nonce = Some(vec![9; 32]);
        let now = t0 + 3_000;
        let doc = dev.attest(&req, now).unwrap();
        let mut opts = VerifyOptions::new(anchor, now + 1_000).expect_pcr(0, [0x11; 48]);
        opts.require_binding = true;
        opts.expected_nonce = Some(vec![9; 32]);
        let v = verify(&doc, &opts).unwrap();
        assert!(v.root.is_development());
        assert_eq!(v.binding.unwrap(), binding);
        // Every single-byte flip of the signed region is caught (sampled every 7 bytes).
        for i in (0..doc.len()).step_by(7) {
            let mut t = doc.clone();
            t[i] ^= 0x20;
            assert!(verify(&t, &opts).is_err(), "flip at {i} verified");
        }
    }

    /// Every byte of the leaf certificate flipped: the leaf is parsed before the signature is
    /// checked, so this exercises the X.509 parser on hostile input. Never a panic, never valid.
    #[test]
    fn leaf_certificate_mutations() {
        let bytes = read(US_EAST_2);
        let doc = AttestationDocument::parse_unverified(&bytes).unwrap();
        let start = bytes.windows(doc.certificate.len()).position(|w| w == doc.certificate.as_slice()).unwrap();
        for i in start..start + doc.certificate.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut t = bytes.clone();
                t[i] ^= mask;
                let report = verify_report(&t, &aws_at(US_EAST_2_TS));
                assert_eq!(report.failed_check(), Some(CheckName::Signature), "flip {mask:#x} at {i}");
            }
        }
    }

    fn no_panic(bytes: &[u8]) {
        let opts = aws_at(US_EAST_2_TS);
        let report = verify_report(bytes, &opts);
        let _ = report.not_evaluated();
        let _ = AttestationDocument::parse_unverified(bytes);
        let _ = protocol::attestation::UserDataBinding::decode(bytes);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            no_panic(&bytes);
        }

        #[test]
        fn single_byte_mutations_never_panic_and_never_verify(pos in any::<proptest::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = read(US_EAST_2);
            let i = pos.index(bytes.len());
            prop_assume!(bytes[i] != byte);
            bytes[i] = byte;
            let report = verify_report(&bytes, &aws_at(US_EAST_2_TS));
            prop_assert!(!report.is_valid(), "mutation at {} to {:#04x} verified", i, byte);
        }

        #[test]
        fn truncations_never_panic(len in 0usize..4395) {
            let bytes = read(US_EAST_2);
            no_panic(&bytes[..len.min(bytes.len())]);
        }
    }
}
