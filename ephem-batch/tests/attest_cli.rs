//! `ephem-batch attest verify` on every attestation fixture, run as a real process.
//!
//! Fixtures are read from `$EPHEM_FIXTURES` (default: `../../shared/fixtures` from this crate).

use std::path::PathBuf;
use std::process::{Command, Output};

use protocol::attestation::{DevIssuer, DocumentRequest};

fn fixtures() -> PathBuf {
    match std::env::var_os("EPHEM_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")),
    }
    .join("nitro-attestation")
}

fn fixture(name: &str) -> String {
    let path = fixtures().join(name);
    assert!(path.exists(), "missing fixture {}", path.display());
    path.to_string_lossy().into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attest_cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ephem-batch"))
        .args(["attest", "verify"])
        .args(args)
        .env_remove("EPHEM_PUBLISHER_KEY")
        .output()
        .expect("running ephem-batch")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// (file, timestamp ms, debug)
const REAL: [(&str, &str, bool); 5] = [
    ("aws-samples_eu-west-1_debug_2023-03-28.cbor", "1680004560937", true),
    ("aws-samples_us-east-2_prod_2023-06-06.cbor", "1686060167435", false),
    ("evervault_us-east-1_prod_nonce_2022-10-13.cbor", "1665651482136", false),
    ("evervault_us-east-1_debug_pubkey-userdata_2022-10-12.cbor", "1665582606081", true),
    ("blocky-nitrite_us-east-1_prod_max-fields_2024-09-07.cbor", "1725719859545", false),
];

const US_EAST_2: &str = "aws-samples_us-east-2_prod_2023-06-06.cbor";
const US_EAST_2_TS: &str = "1686060167435";
const US_EAST_2_PCR0: &str =
    "836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901";

#[test]
fn real_documents_are_valid_at_their_own_time() {
    for (file, ts, debug) in REAL {
        let path = fixture(file);
        let mut args = vec![path.as_str(), "--at", ts];
        if debug {
            args.push("--allow-debug");
        }
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{file}: {}{}", stdout(&o), stderr(&o));
        assert!(stdout(&o).contains("\nvalid\n"), "{file}");
        assert!(!stderr(&o).contains("WARNING"), "{file}: the AWS root needs no warning");
        // `--at doc` pins the same time.
        let mut args = vec![path.as_str(), "--at", "doc"];
        if debug {
            args.push("--allow-debug");
        }
        assert_eq!(run(&args).status.code(), Some(0), "{file} --at doc");
    }
}

#[test]
fn debug_documents_need_allow_debug() {
    for (file, ts, _) in REAL.iter().filter(|r| r.2) {
        let o = run(&[&fixture(file), "--at", ts]);
        assert_eq!(o.status.code(), Some(1), "{file}");
        assert!(stderr(&o).contains("invalid: debug_mode: "), "{file}: {}", stderr(&o));
    }
}

#[test]
fn negatives_fail_naming_the_check() {
    let cases = [
        ("neg_payload_byteflip.cbor", "signature"),
        ("neg_signature_byteflip.cbor", "signature"),
        ("neg_pcr0_modified.cbor", "signature"),
        ("neg_leaf_cert_swapped.cbor", "signature"),
        ("neg_alg_es256_header.cbor", "alg_es384"),
        ("neg_truncated.cbor", "cbor"),
        ("neg_forged_root.cbor", "root_pinned"),
        ("neg_blocky_selfsigned.cbor", "cose_structure"),
    ];
    for (file, check) in cases {
        let o = run(&[&fixture(&format!("negative/{file}")), "--at", US_EAST_2_TS]);
        assert_eq!(o.status.code(), Some(1), "{file}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(&format!("invalid: {check}: ")), "{file}: {err}");
        assert!(stdout(&o).contains(&format!("FAIL  {check} ")), "{file}: {}", stdout(&o));
    }
    let o = run(&[&fixture("negative/neg_signature_byteflip.cbor"), "--at", US_EAST_2_TS]);
    assert!(stderr(&o).contains("invalid: signature: ES384 signature does not verify with the leaf key"));
}

#[test]
fn time_pcr_and_nonce_failures() {
    let doc = fixture(US_EAST_2);
    let o = run(&[&doc, "--at", "2023-06-06T18:02:47.435Z"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: validity: leaf certificate"), "{}", stderr(&o));

    let good = format!("0={US_EAST_2_PCR0}");
    assert_eq!(run(&[&doc, "--at", US_EAST_2_TS, "--expect-pcr", &good]).status.code(), Some(0));
    let bad = format!("0={}", "00".repeat(48));
    let o = run(&[&doc, "--at", US_EAST_2_TS, "--expect-pcr", &bad]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: pcr_policy: PCR0 is 836fa88a"), "{}", stderr(&o));

    // The evervault document's own nonce matches; another one does not.
    let ev = fixture(REAL[2].0);
    let ev_doc = protocol::attestation::AttestationDocument::parse_unverified(&std::fs::read(&ev).unwrap()).unwrap();
    let nonce = hex::encode(ev_doc.nonce.unwrap());
    let o = run(&[&ev, "--at", REAL[2].1, "--nonce", &nonce]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok    nonce "), "{}", stdout(&o));
    let o = run(&[&ev, "--at", REAL[2].1, "--nonce", &nonce[2..]]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: nonce: document nonce is "), "{}", stderr(&o));

    let o = run(&[&doc, "--at", US_EAST_2_TS, "--nonce", "00112233"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: nonce: "), "{}", stderr(&o));

    // Without --at the real clock is years past the leaf's life.
    let o = run(&[&doc]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: validity: "), "{}", stderr(&o));
}

#[test]
fn json_output_lists_checks_and_fields() {
    let o = run(&[&fixture(REAL[4].0), "--at", REAL[4].1, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["error"], serde_json::Value::Null);
    let names: Vec<&str> = v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["cbor", "cose_structure", "alg_es384", "signature", "chain", "root_pinned", "validity", "debug_mode", "freshness"]
    );
    assert!(v["checks"].as_array().unwrap().iter().all(|c| c["passed"] == true && c["detail"].is_string()));
    assert_eq!(v["not_evaluated"], serde_json::json!(["pcr_policy", "nonce", "user_data_binding", "fleet_kms_key"]));
    let d = &v["document"];
    assert_eq!(d["module_id"], "i-0a22e5c5f24d22174-enc0191cceb4289903f");
    assert_eq!(d["timestamp_ms"], 1725719859545u64);
    assert_eq!(d["digest"], "SHA384");
    assert_eq!(d["pcrs"]["0"], "e72a46ca80a260fb044a125442f0c7e331813bcbaf9724d9f3857758992766f2d65710a27aa94ae3949dd54e7c9fe86a");
    assert_eq!(d["pcrs"].as_object().unwrap().len(), 16);
    assert_eq!((d["public_key_len"].as_u64(), d["user_data_len"].as_u64(), d["nonce_len"].as_u64()), (Some(1024), Some(1024), Some(1024)));
    assert_eq!(v["root"]["kind"], "aws-nitro-g1");
    assert_eq!(v["root"]["aws_nitro_g1"], true);
    assert_eq!(v["root"]["development"], false);
    assert_eq!(v["root"]["sha256"], "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b");

    let o = run(&[&fixture("negative/neg_forged_root.cbor"), "--at", US_EAST_2_TS, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["error"]["check"], "root_pinned");
    let last = v["checks"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["name"].as_str(), last["passed"].as_bool()), (Some("root_pinned"), Some(false)));
}

#[test]
fn development_root_is_announced_loudly() {
    let t0 = 1_735_689_600_000u64;
    let dev = DevIssuer::from_seed(&[5; 32], t0).unwrap();
    let req = DocumentRequest::new("i-dev-enc0").with_pcr(0, [0xab; 48]).with_pcr(1, [1; 48]).with_pcr(2, [2; 48]);
    let doc = dev.attest(&req, t0 + 10_000).unwrap();
    let doc_path = scratch("dev_doc.cbor");
    std::fs::write(&doc_path, &doc).unwrap();
    let root_path = scratch("dev_root.pem");
    std::fs::write(&root_path, dev.trust_anchor().unwrap().to_pem()).unwrap();
    let (doc_s, root_s) = (doc_path.to_string_lossy().into_owned(), root_path.to_string_lossy().into_owned());

    let o = run(&[&doc_s, "--root", &root_s, "--at", "doc", "--expect-pcr", &format!("0={}", "ab".repeat(48)), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("WARNING: trusting a DEVELOPMENT root"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["root"]["development"], true);
    assert_eq!(v["root"]["aws_nitro_g1"], false);
    assert_eq!(v["document"]["cabundle_len"], 2);

    // With the default (AWS) root the development document is refused.
    let o = run(&[&doc_s, "--at", "doc"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: root_pinned: "));
    // And a development root does not make real documents valid.
    let o = run(&[&fixture(US_EAST_2), "--root", &root_s, "--at", US_EAST_2_TS]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: root_pinned: "));
}

#[test]
fn signed_policy_file() {
    let (policy, key) = protocol::attestation::vectors::policy_sample();
    let path = scratch("policy.json");
    std::fs::write(&path, policy.sign(&key).unwrap().to_json()).unwrap();
    let path = path.to_string_lossy().into_owned();
    let publisher = hex::encode(key.verifying_key().as_bytes());
    let doc = fixture(US_EAST_2);

    let o = run(&[&doc, "--at", US_EAST_2_TS, "--policy", &path, "--publisher-key", &publisher, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["policy"]["signature_verified"], true);
    assert!(v["checks"].as_array().unwrap().iter().any(|c| c["name"] == "pcr_policy" && c["passed"] == true));

    // Policy max age is 600 s.
    let o = run(&[&doc, "--at", "1686060867435", "--policy", &path, "--publisher-key", &publisher]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: freshness: "), "{}", stderr(&o));

    // Another document does not match the policy's PCRs.
    let o = run(&[&fixture(REAL[2].0), "--at", REAL[2].1, "--policy", &path, "--publisher-key", &publisher]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("invalid: pcr_policy: PCR0"), "{}", stderr(&o));

    // Unverified policy: works, with a warning.
    let o = run(&[&doc, "--at", US_EAST_2_TS, "--policy", &path]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("WITHOUT checking its publisher signature"));

    // Wrong publisher key: a usage error, exit 2.
    let o = run(&[&doc, "--at", US_EAST_2_TS, "--policy", &path, "--publisher-key", &"11".repeat(32)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not the pinned publisher key"), "{}", stderr(&o));
}

#[test]
fn usage_and_io_errors_exit_2() {
    let doc = fixture(US_EAST_2);
    assert_eq!(run(&["/nonexistent/doc.cbor"]).status.code(), Some(2));
    assert_eq!(run(&[&doc, "--at", "next tuesday"]).status.code(), Some(2));
    assert_eq!(run(&[&doc, "--expect-pcr", "0=zz"]).status.code(), Some(2));
    assert_eq!(run(&[&doc, "--root", "/nonexistent/root.pem"]).status.code(), Some(2));
    assert_eq!(run(&[&doc, "--policy", &doc]).status.code(), Some(2));
    assert_eq!(run(&[]).status.code(), Some(2));
}
