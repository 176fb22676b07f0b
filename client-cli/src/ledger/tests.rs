#[test]
fn sync_copies_a_bucket_ledger_and_audits_it() {
    use cloud::{ObjectStore, PutCondition};
    use protocol::dev_enclave::DevEnclave;
    use receipts_ledger::testing::dev_request;
    use receipts_ledger::{CheckpointPolicy, Ledger, SignerKey};

    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let objects = std::sync::Arc::new(cloud_local::DirObjectStore::open(&bucket).unwrap());
    let signer = SignerKey::from_seed("ledger.example/bucket", &[7; 32]).unwrap();
    let key = signer.verifier();
    let store = tiles::TileStore::open(
        objects.clone(),
        tiles::layout::Layout::new(""),
        tiles::Cache::Memory,
        key.clone(),
        tiles::TileOptions::appender(),
    )
    .unwrap();
    let enclave = DevEnclave::new(3, T);
    let check = Box::new(ReceiptVerifier::new(enclave.anchor()));
    let mut ledger = Ledger::new(store, check, Box::new(signer), CheckpointPolicy::default());
    for j in 0..5 {
        ledger.append(dev_request(&enclave, j), T + j).unwrap();
    }
    let home_ledger = tmp.path().join("audit-home/ledger");
    let from = bucket.to_str().unwrap();
    let code = sync_command(&home_ledger, from, &key.to_string(), true, true).unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    let copy = LocalLedger::open_read_only(&home_ledger).unwrap();
    assert_eq!(copy.size().unwrap(), 5);
    assert_eq!(LocalLedger::verifier_key(&home_ledger).unwrap(), key);
    let cp = copy.latest_checkpoint().unwrap().unwrap();
    assert_eq!(Checkpoint::open(cp.note.as_bytes(), &key).unwrap().size, 5);
    drop(copy);

    // Metadata that names another job: the copy keeps the receipt's, and the exit status says so.
    let meta_key = "ephem/meta/000.p/5";
    let original_meta = objects.get(meta_key).unwrap();
    let edited = String::from_utf8(original_meta.clone()).unwrap().replacen(&format!("{:032x}", 2), &format!("{:032x}", 99), 1);
    objects.put(meta_key, edited.as_bytes(), PutCondition::Overwrite).unwrap();
    let fresh = tmp.path().join("fresh-home/ledger");
    assert_eq!(sync_command(&fresh, from, &key.to_string(), true, true).unwrap(), ExitCode::from(1));
    let copy = LocalLedger::open_read_only(&fresh).unwrap();
    assert_eq!(copy.entry_by_job(&job_id(2)).unwrap().map(|e| e.index), Some(2));
    drop(copy);
    objects.put(meta_key, &original_meta, PutCondition::Overwrite).unwrap();

    // A rewritten tile is reported, and the exit status says so.
    let tile = "tile/0/000.p/5";
    let mut bytes = objects.get(tile).unwrap();
    bytes[0] ^= 0xff;
    objects.put(tile, &bytes, PutCondition::Overwrite).unwrap();
    assert_eq!(sync_command(&home_ledger, from, &key.to_string(), true, true).unwrap(), ExitCode::from(1));
    // Another key is refused before anything is copied.
    let other = SignerKey::from_seed("ledger.example/bucket", &[8; 32]).unwrap().verifier();
    let elsewhere = tmp.path().join("other/ledger");
    assert_eq!(sync_command(&elsewhere, from, &other.to_string(), false, true).unwrap(), ExitCode::from(1));
}

use super::*;
use clap::Parser;
use receipts_ledger::local::{LEDGER_DB, LocalOptions};
use protocol::dev_enclave::DevEnclave;
use receipts_ledger::testing::dev_request;
use receipts_ledger::{CheckpointPolicy, EntryVerdict, SignerKey, SqliteOptions};

/// 2025-11-01T00:00:00Z.
const T: u64 = 1_761_955_200_000;

#[derive(Parser)]
struct Wrapper {
    #[command(subcommand)]
    command: LedgerCommand,
}

fn parse(args: &[&str]) -> LedgerCommand {
    Wrapper::try_parse_from(std::iter::once("ledger").chain(args.iter().copied())).unwrap().command
}

/// An `$EPHEM_HOME` with a development CA and a ledger of `n` real receipts,
/// checkpointed every 4 appends.
struct Home {
    _tmp: tempfile::TempDir,
    ledger: PathBuf,
    enclave: DevEnclave,
}

impl Home {
    fn new(n: u64) -> Home {
        let tmp = tempfile::tempdir().unwrap();
        let enclave = DevEnclave::new(3, T);
        std::fs::create_dir_all(tmp.path().join("enclave")).unwrap();
        std::fs::write(tmp.path().join(HOME_DEV_ROOT), enclave.anchor().to_pem()).unwrap();
        let ledger = tmp.path().join("ledger");
        let options = LocalOptions {
            policy: CheckpointPolicy { every_appends: 4, every_ms: u64::MAX },
            ..LocalOptions::default()
        };
        let check = Box::new(ReceiptVerifier::new(enclave.anchor()));
        let (mut l, _) = LocalLedger::open_with(&ledger, check, &options).unwrap();
        for j in 0..n {
            l.append(dev_request(&enclave, j), T + j).unwrap();
        }
        Home { _tmp: tmp, ledger, enclave }
    }

    fn run(&self, args: &[&str]) -> u8 {
        let code = run(parse(args), &self.ledger).unwrap();
        // ExitCode has no accessor; compare with the three we use.
        [0u8, 1, 2].into_iter().find(|c| ExitCode::from(*c) == code).unwrap()
    }

    fn key(&self) -> VerifierKey {
        LocalLedger::verifier_key(&self.ledger).unwrap()
    }

    fn dev_check(&self) -> ReceiptVerifier {
        ReceiptVerifier::new(self.enclave.anchor())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.ledger.parent().unwrap().join(name)
    }
}

/// Job `j`'s id as it is typed on a command line.
fn job(j: u64) -> String {
    job_id(j).to_hex()
}

fn job_id(j: u64) -> JobId {
    receipts_ledger::testing::test_job(j)
}

#[test]
fn clap_definition_follows_the_issue() {
    use clap::CommandFactory;
    Wrapper::command().debug_assert();
    let LedgerCommand::Query { job, model, pcr0, since, until, json, .. } = parse(&[
        "query",
        "--job",
        "000000000000000000000000000000AB",
        "--model",
        "m",
        "--pcr0",
        "CD",
        "--since",
        "2025-11-01",
        "--until",
        "1761955300000",
        "--json",
    ]) else {
        panic!()
    };
    assert_eq!((job, model.as_deref(), pcr0.as_deref()), (Some(job_id(0xab)), Some("m"), Some("CD")));
    assert_eq!((since, until, json), (Some(T), Some(T + 100_000), true));
    assert!(matches!(parse(&["verify", "--json"]), LedgerCommand::Verify { json: true, .. }));
    assert!(matches!(parse(&["checkpoint"]), LedgerCommand::Checkpoint));
    let LedgerCommand::Prove { job, output } = parse(&["prove", &job_id(7).to_hex(), "-o", "b.json"]) else { panic!() };
    assert_eq!((job, output.as_path()), (job_id(7), Path::new("b.json")));
    // Not a job id: refused by the parser, naming the value.
    let refused = Wrapper::try_parse_from(["ledger", "prove", "J", "-o", "b.json"]).map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("job id \"J\" is not 32 hex digits"), "{refused}");
    let LedgerCommand::VerifyBundle { bundle, ledger_key, root, .. } =
        parse(&["verify-bundle", "b.json", "--ledger-key", "k", "--development-root"])
    else {
        panic!()
    };
    assert_eq!((bundle.as_path(), ledger_key.as_str()), (Path::new("b.json"), "k"));
    assert_eq!(root.development_root, Some(None));
    let LedgerCommand::VerifyBundle { root, .. } =
        parse(&["verify-bundle", "b.json", "--ledger-key", "k", "--development-root", "r.pem"])
    else {
        panic!()
    };
    assert_eq!(root.development_root, Some(Some(PathBuf::from("r.pem"))));
    assert!(matches!(
        parse(&["consistency", "3", "8"]),
        LedgerCommand::Consistency { old_size: 3, new_size: 8, .. }
    ));
    // verify-bundle needs a pinned key; --root and --development-root exclude each other.
    if std::env::var_os("EPHEM_LEDGER_KEY").is_none() {
        assert!(Wrapper::try_parse_from(["ledger", "verify-bundle", "b.json"]).is_err());
    }
    let both = ["ledger", "verify", "--root", "aws-nitro-g1", "--development-root"];
    assert!(Wrapper::try_parse_from(both).is_err());
}

#[test]
fn time_and_pcr_arguments() {
    assert_eq!(parse_time("2025-11-01"), Ok(T));
    assert_eq!(parse_time("2025-11-01T01:00:00+01:00"), Ok(T));
    assert_eq!(parse_time("1761955200000"), Ok(T));
    assert!(parse_time("yesterday").is_err());
    assert!(parse_time("1969-12-31").is_err());
    assert_eq!(parse_pcr(&format!("0={}", "ab".repeat(48))), Ok((0, vec![0xab; 48])));
    assert!(parse_pcr("0=ab").is_err());
    assert!(parse_pcr("40=00").is_err());
}

#[test]
fn query_rows_carry_the_verdict() {
    let home = Home::new(6);
    let store = LocalLedger::open_read_only(&home.ledger).unwrap();
    let rows = query_rows(&store, &Query::default(), &home.key(), &home.dev_check()).unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows[..4].iter().all(|r| r.verdict == EntryVerdict::Verified { checkpoint: 4 }), "{rows:?}");
    assert!(rows[4..].iter().all(|r| r.verdict == EntryVerdict::NotCheckpointed));
    let r = &rows[5];
    let want = home.enclave.receipt(5);
    assert_eq!(
        (r.job_id, r.ok_count, r.failed_count, r.tokens),
        (job_id(5), 1005, 2, Some(want.tokens))
    );
    assert_eq!(r.pcr0, hex::encode(want.pcrs[&0].as_slice()));
    assert_eq!(r.finished, "2025-11-01T00:00:05.500Z");

    let q = |query: Query| query_rows(&store, &query, &home.key(), &home.dev_check()).unwrap();
    assert_eq!(q(Query { job_id: Some(job_id(2)), ..Query::default() }).len(), 1);
    assert_eq!(q(Query { pcr0: Some(rows[0].pcr0.clone()), ..Query::default() }).len(), 6);
    assert_eq!(q(Query { pcr0: Some("00".into()), ..Query::default() }).len(), 0);
    assert_eq!(q(Query { since_ms: Some(T + 3000), until_ms: Some(T + 5000), ..Query::default() }).len(), 2);

    // Under the AWS root these receipts prove nothing: every verdict says why.
    let aws = ReceiptVerifier::new(TrustAnchor::aws_nitro_g1());
    let rows = query_rows(&store, &Query::default(), &home.key(), &aws).unwrap();
    assert!(rows.iter().all(
        |r| matches!(&r.verdict, EntryVerdict::Invalid { reason } if reason.starts_with("attestation: root_pinned"))
    ));
    // Under another ledger key no row is proven.
    let other = SignerKey::from_seed("ephem-batch.local/ledger", &[9; 32]).unwrap().verifier();
    let rows = query_rows(&store, &Query::default(), &other, &home.dev_check()).unwrap();
    assert!(rows.iter().all(
        |r| matches!(&r.verdict, EntryVerdict::Invalid { reason } if reason.starts_with("latest checkpoint"))
    ));
}

#[test]
fn query_verify_checkpoint_and_consistency_commands() {
    let home = Home::new(6);
    assert_eq!(home.run(&["query"]), 0);
    assert_eq!(home.run(&["query", "--json", "--model", "sentence-transformers/all-MiniLM-L6-v2"]), 0);
    assert_eq!(home.run(&["query", "--root", "aws-nitro-g1"]), 1);
    assert_eq!(home.run(&["verify"]), 0);
    assert_eq!(home.run(&["verify", "--json"]), 0);
    assert_eq!(home.run(&["verify", "--root", "aws-nitro-g1"]), 1);
    let dev_root = home.path(HOME_DEV_ROOT);
    assert_eq!(home.run(&["verify", "--development-root", dev_root.to_str().unwrap()]), 0);
    assert_eq!(home.run(&["verify", "--ledger-key", &home.key().to_string()]), 0);
    assert_eq!(home.run(&["checkpoint"]), 0);
    assert_eq!(home.run(&["consistency", "4", "6"]), 0);
    assert_eq!(home.run(&["consistency", "4", "6", "--json"]), 0);
    assert!(run(parse(&["consistency", "4", "7"]), &home.ledger).is_err());
    assert!(run(parse(&["consistency", "0", "4"]), &home.ledger).is_err());

    // An edited row makes verify fail (the replay names the index).
    {
        let store = SqliteStore::open(&home.ledger.join(LEDGER_DB), &SqliteOptions::default()).unwrap();
        store.connection().execute("UPDATE entries SET ok_count = 7 WHERE idx = 2", []).unwrap();
    }
    assert_eq!(home.run(&["verify"]), 1);
    assert_eq!(home.run(&["query", "--job", &job(2)]), 1);
    assert_eq!(home.run(&["query", "--job", &job(3)]), 0);
}

#[test]
fn missing_ledgers_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ledger");
    assert!(run(parse(&["verify"]), &dir).is_err());
    assert!(run(parse(&["checkpoint"]), &dir).is_err());
}

#[test]
fn prove_then_verify_bundle() {
    let home = Home::new(6);
    let out = home.path("b.json");
    let out_s = out.to_str().unwrap();
    let key_file = home.ledger.join("ledger.pub");
    let key_file = key_file.to_str().unwrap();

    // Entry 5 is not covered by a checkpoint yet: prove signs one on demand.
    assert_eq!(home.run(&["prove", &job(5).to_uppercase(), "-o", out_s]), 0);
    let store = LocalLedger::open_read_only(&home.ledger).unwrap();
    assert_eq!(store.latest_checkpoint().unwrap().unwrap().size, 6);
    assert_eq!(home.run(&["prove", &job(99), "-o", out_s]), 1);
    assert!(Wrapper::try_parse_from(["ledger", "prove", "xyz", "-o", out_s]).is_err(), "not a job id");

    assert_eq!(home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root"]), 0);
    assert_eq!(
        home.run(&[
            "verify-bundle",
            out_s,
            "--ledger-key",
            &home.key().to_string(),
            "--development-root",
            "--json"
        ]),
        0
    );
    assert_eq!(
        home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root", "--job", &job(5)]),
        0
    );
    assert_eq!(
        home.run(&["verify-bundle", out_s, "--ledger-key", key_file, "--development-root", "--job", &job(4)]),
        1
    );
    // The auditor's default root is AWS: a development bundle is refused, by name.
    assert_eq!(home.run(&["verify-bundle", out_s, "--ledger-key", key_file]), 1);
    assert!(run(parse(&["verify-bundle", out_s, "--ledger-key", "nonsense"]), &home.ledger).is_err());

    let bytes = std::fs::read(&out).unwrap();
    let v = check_bundle(&bytes, &home.key(), &home.dev_check(), None).unwrap();
    assert_eq!((v.leaf_index, v.tree_size, v.fields.job_id), (5, 6, job_id(5)));
    assert_eq!(v.fields, receipts_ledger::receipt_check::indexed_fields(&home.enclave.receipt(5)));
    assert!(v.bundle_key_matches_pinned);
    let aws = ReceiptVerifier::new(TrustAnchor::aws_nitro_g1());
    assert_eq!(check_bundle(&bytes, &home.key(), &aws, None).unwrap_err().check, "attestation");
}

fn flip_digit(s: &str, at: usize) -> String {
    let mut b = s.as_bytes().to_vec();
    b[at] = if b[at] == b'0' { b'1' } else { b'0' };
    String::from_utf8(b).unwrap()
}

#[test]
fn changed_or_re_signed_bundles_fail() {
    let home = Home::new(4);
    let out = home.path("b.json");
    assert_eq!(home.run(&["prove", &job(1), "-o", out.to_str().unwrap()]), 0);
    let good: ProofBundle = ProofBundle::from_json(&std::fs::read(&out).unwrap()).unwrap();
    let (key, check) = (home.key(), home.dev_check());
    let verdict =
        |b: &ProofBundle| check_bundle(b.to_json().as_bytes(), &key, &check, None).map(|_| ()).map_err(|r| r.check);
    assert_eq!(verdict(&good), Ok(()));

    // One hex digit changed anywhere in the receipt, the document or the path.
    for at in (0..good.receipt.len()).step_by(7) {
        let b = ProofBundle { receipt: flip_digit(&good.receipt, at), ..good.clone() };
        assert_eq!(verdict(&b), Err("inclusion"), "receipt digit {at}");
    }
    for at in (0..good.attestation_document.len()).step_by(97) {
        let b = ProofBundle { attestation_document: flip_digit(&good.attestation_document, at), ..good.clone() };
        let e = verdict(&b).unwrap_err();
        assert!(e == "attestation" || e == "receipt_key_id" || e == "attestation_hash", "document digit {at}: {e}");
    }
    for at in 0..64 {
        let mut b = good.clone();
        b.inclusion_path[0] = flip_digit(&b.inclusion_path[0], at);
        assert_eq!(verdict(&b), Err("inclusion"), "path digit {at}");
    }

    // Re-signed with another key under the same origin, naming that key.
    let cp = Checkpoint::open(good.checkpoint.as_bytes(), &key).unwrap();
    let evil = SignerKey::from_seed(key.name(), &[0x66; 32]).unwrap();
    let resigned = ProofBundle {
        checkpoint: cp.sign(&evil).unwrap(),
        ledger_key: evil.verifier().to_string(),
        ..good.clone()
    };
    assert_eq!(verdict(&resigned), Err("checkpoint"));
    std::fs::write(&out, resigned.to_json()).unwrap();
    let key_file = home.ledger.join("ledger.pub");
    assert_eq!(
        home.run(&[
            "verify-bundle",
            out.to_str().unwrap(),
            "--ledger-key",
            key_file.to_str().unwrap(),
            "--development-root"
        ]),
        1
    );
    // ... and verified under the key it names, it is still only as good as that key.
    assert_eq!(check_bundle(resigned.to_json().as_bytes(), &evil.verifier(), &check, None).map(|_| ()), Ok(()));

    assert_eq!(check_bundle(b"{}", &key, &check, None).unwrap_err().check, "bundle");
}
