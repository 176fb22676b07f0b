//! `ephem-batch policy keygen | sign | verify` as a release step and an auditor run them.

use std::process::Command;

const PCRS: &str = r#"{"0":"836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901","1":"bcdf05fefccaa8e55bf2c8d6dee9e79bbff31e34bf28a99aa19e6b29c37ee80b214a414b7607236edf26fcb78654e63f","2":"4314515615d0365648a8763292907c99353a10477d51934333c69b27612ea6db73522675324fe069f6e8cd3eb910d0d6"}"#;

fn ephem(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ephem-batch")).args(args).output().unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).into(), String::from_utf8_lossy(&output.stderr).into())
}

#[test]
fn sign_then_verify_with_the_pinned_key_only() {
    let dir = std::env::temp_dir().join(format!("ephem-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let _ = std::fs::remove_file(path("key"));
    let _ = std::fs::remove_file(path("other"));
    let (code, public, _) = ephem(&["policy", "keygen", "--out", &path("key")]);
    assert_eq!(code, 0);
    let public = public.trim().to_owned();
    let (_, other_public, _) = ephem(&["policy", "keygen", "--out", &path("other")]);
    std::fs::write(path("unsigned.json"), format!(r#"{{"version":1,"root":"aws-nitro-g1","pcrs":{PCRS},"allow_debug":false,"max_age_s":600}}"#)).unwrap();
    let (code, _, stderr) = ephem(&["policy", "sign", "--key", &path("key"), "--out", &path("policy.json"), &path("unsigned.json")]);
    assert_eq!(code, 0, "{stderr}");

    let (code, stdout, _) = ephem(&["policy", "verify", &path("policy.json"), "--publisher-key", &public]);
    assert_eq!(code, 0, "{stdout}");
    let (code, _, stderr) = ephem(&["policy", "verify", &path("policy.json"), "--publisher-key", other_public.trim()]);
    assert_eq!(code, 1, "a policy must not verify under another publisher's key: {stderr}");

    // One changed PCR digit breaks the signature.
    let signed = std::fs::read_to_string(path("policy.json")).unwrap();
    std::fs::write(path("tampered.json"), signed.replacen("836fa88a", "836fa88b", 1)).unwrap();
    let (code, _, stderr) = ephem(&["policy", "verify", &path("tampered.json"), "--publisher-key", &public]);
    assert_eq!(code, 1, "{stderr}");

    // The signed policy drives `attest verify` against a real document.
    let fixtures = std::env::var("EPHEM_FIXTURES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures").into());
    let document = format!("{fixtures}/nitro-attestation/aws-samples_us-east-2_prod_2023-06-06.cbor");
    let (code, stdout, stderr) =
        ephem(&["attest", "verify", &document, "--policy", &path("policy.json"), "--publisher-key", &public, "--at", "doc"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    // Refuses to overwrite a key.
    let (code, _, _) = ephem(&["policy", "keygen", "--out", &path("key")]);
    assert_ne!(code, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
