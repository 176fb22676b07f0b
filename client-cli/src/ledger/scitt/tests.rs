use super::*;
use clap::Parser;
use protocol::dev_enclave::DevEnclave;
use receipts_ledger::local::LocalOptions;
use receipts_ledger::testing::{dev_request, test_job};
use receipts_ledger::CheckpointPolicy;

/// 2025-11-01T00:00:00Z.
const T: u64 = 1_761_955_200_000;

#[derive(Parser)]
struct Wrapper {
    #[command(subcommand)]
    command: LedgerCommand,
}

/// A home with a development CA and a ledger of 5 real receipts (checkpoint every 4 appends).
fn home() -> (tempfile::TempDir, PathBuf, DevEnclave) {
    let tmp = tempfile::tempdir().unwrap();
    let enclave = DevEnclave::new(3, T);
    std::fs::create_dir_all(tmp.path().join("enclave")).unwrap();
    std::fs::write(tmp.path().join(HOME_DEV_ROOT), enclave.anchor().to_pem()).unwrap();
    let ledger = tmp.path().join("ledger");
    let options =
        LocalOptions { policy: CheckpointPolicy { every_appends: 4, every_ms: u64::MAX }, ..LocalOptions::default() };
    let (mut l, _) = LocalLedger::open_with(&ledger, Box::new(ReceiptVerifier::new(enclave.anchor())), &options).unwrap();
    for j in 0..5 {
        l.append(dev_request(&enclave, j), T + j).unwrap();
    }
    (tmp, ledger, enclave)
}

fn run_args(ledger: &Path, args: &[&str]) -> u8 {
    let command = Wrapper::try_parse_from(std::iter::once("ledger").chain(args.iter().copied())).unwrap().command;
    let code = run(command, ledger).unwrap();
    [0u8, 1, 2].into_iter().find(|c| ExitCode::from(*c) == code).unwrap()
}

#[test]
fn export_then_verify_scitt() {
    let (tmp, ledger, enclave) = home();
    let out = tmp.path().join("st.cbor");
    let doc = tmp.path().join("doc.bin");
    let (out_s, doc_s) = (out.to_str().unwrap(), doc.to_str().unwrap());
    let key_file = ledger.join("ledger.pub");
    let key_file = key_file.to_str().unwrap();
    let job = test_job(4).to_hex();

    // Entry 4 is past the checkpoint of size 4: the export signs one first.
    assert_eq!(run_args(&ledger, &["export-scitt", "--job", &job, "-o", out_s, "--attestation-output", doc_s]), 0);
    assert_eq!(run_args(&ledger, &["export-scitt", "--job", &test_job(99).to_hex(), "-o", out_s]), 1);
    let dev = ["--attestation", doc_s, "--development-root"];
    assert_eq!(run_args(&ledger, &["verify-scitt", out_s, "--ledger-key", key_file]), 0);
    assert_eq!(run_args(&ledger, &[&["verify-scitt", out_s, "--ledger-key", key_file, "--json"][..], &dev].concat()), 0);
    assert_eq!(run_args(&ledger, &["verify-scitt", out_s, "--ledger-key", key_file, "--job", &test_job(3).to_hex()]), 1);
    // The auditor's default root is AWS: the development receipt is refused.
    assert_eq!(run_args(&ledger, &["verify-scitt", out_s, "--ledger-key", key_file, "--attestation", doc_s]), 1);

    let bytes = std::fs::read(&out).unwrap();
    let key = LocalLedger::verifier_key(&ledger).unwrap();
    let check = ReceiptVerifier::new(enclave.anchor());
    let document = std::fs::read(&doc).unwrap();
    let p = check_statement(&bytes, &key, Some((&check, &document)), Some(&test_job(4))).unwrap();
    assert_eq!((p.leaf_index, p.tree_size, p.subject.as_str()), (4, 5, job.as_str()));
    assert_eq!(p.fields, receipts_ledger::receipt_check::indexed_fields(&enclave.receipt(4)));
    assert!(p.receipt_checked);
    // A receipt checked against another document fails by the receipt's own check.
    let e = check_statement(&bytes, &key, Some((&check, &enclave.attest(None, T))), None).unwrap_err();
    assert!(e.check.starts_with("attestation"), "{}: {}", e.check, e.message);

    // Another ledger key.
    let other_key = receipts_ledger::SignerKey::from_seed(key.name(), &[9; 32]).unwrap().verifier();
    assert_eq!(check_statement(&bytes, &other_key, None, None).unwrap_err().check, "cose_receipt_key");
    assert_eq!(run_args(&ledger, &["verify-scitt", out_s, "--ledger-key", &other_key.to_string()]), 1);
    // A flipped bit anywhere fails, by a named check.
    for at in (0..bytes.len()).step_by(7) {
        let mut t = bytes.clone();
        t[at] ^= 0x04;
        let e = check_statement(&t, &key, Some((&check, &document)), None).unwrap_err();
        assert!(!e.check.is_empty(), "{}", e.message);
    }
}
