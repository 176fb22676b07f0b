//! Per-record proofs through the running local stack: a job's client proves that one record's
//! vector came out of the job (`ledger prove-record`), an auditor checks it offline
//! (`ledger verify-record`), a bundle changed by one bit fails naming the check, and the bundle
//! carries nothing of the other records' texts.

use std::path::Path;

use serde_json::Value;
use tests::{corpus_with_canaries, json, Stack};

#[test]
fn one_record_is_proven_alone_and_a_changed_bit_is_refused_by_name() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let nonce = format!("{:x}", std::process::id());
    let secrets: Vec<String> = (0..3).map(|n| format!("zqxrecord-palimpsest-{nonce}-{n}")).collect();
    let corpus = work.path().join("corpus.jsonl");
    let text = corpus_with_canaries(&corpus, Some(12), &secrets);
    let out = work.path().join("embeddings.jsonl");
    let submitted = stack.ok(&["submit", corpus.to_str().unwrap(), "--wait", "-o", out.to_str().unwrap(), "--json"]);
    let job = json(&submitted)["job_id"].as_str().expect("submit --json names the job").to_owned();

    // The record to prove: one that is not a canary.
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let chosen = lines.iter().find(|l| !secrets.iter().any(|s| l["text"].as_str().unwrap().contains(s.as_str()))).unwrap();
    let id = chosen["id"].as_str().unwrap().to_owned();
    let bundle = work.path().join("record.json");
    stack.ok(&["ledger", "prove-record", &job, &id, "-o", bundle.to_str().unwrap()]);

    let ledger_key = stack.home().join("ledger/ledger.pub");
    let dev_root = stack.home().join("enclave/dev-root.pem");
    let verify = |path: &Path| {
        let out = stack.cli(&[
            "ledger",
            "verify-record",
            path.to_str().unwrap(),
            "--ledger-key",
            ledger_key.to_str().unwrap(),
            "--development-root",
            dev_root.to_str().unwrap(),
            "--json",
        ]);
        json(&String::from_utf8_lossy(&out.stdout))
    };
    let proven = verify(&bundle);
    assert_eq!(proven["valid"], true, "{proven}");
    assert_eq!(proven["proven"]["id"], id.as_str());
    assert_eq!(proven["proven"]["text"], chosen["text"]);
    assert_eq!(proven["proven"]["job_id"], job.as_str());
    // The vector proven is the one `results` wrote for that id.
    let written = std::fs::read_to_string(&out).unwrap();
    let row: Value = written.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["id"] == id.as_str()).unwrap();
    let (a, b) = (row["embedding"].as_array().unwrap(), proven["proven"]["vector"].as_array().unwrap());
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(b).all(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-6));

    // Nothing of the other records' texts is in the bundle.
    let bytes = std::fs::read(&bundle).unwrap();
    for secret in &secrets {
        assert!(tests::canary_forms(secret).iter().all(|form| !bytes.windows(form.len()).any(|w| w == form.as_slice())), "{secret}");
    }

    // One bit changed in the vector, the id, the path or the record key: refused, naming the check.
    let original: Value = json(&String::from_utf8(bytes).unwrap());
    let refused = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut changed = original.clone();
        edit(&mut changed);
        let path = work.path().join(format!("{name}.json"));
        std::fs::write(&path, changed.to_string()).unwrap();
        let verdict = verify(&path);
        assert_eq!(verdict["valid"], false, "{name}: {verdict}");
        verdict["error"]["check"].as_str().unwrap().to_owned()
    };
    let flip_base64 = |v: &mut Value, field: &str, at: usize| {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut raw = b64.decode(v[field].as_str().unwrap()).unwrap();
        let at = at.min(raw.len() - 1);
        raw[at] ^= 0x01;
        v[field] = b64.encode(raw).into();
    };
    let flip_hex = |text: &str| {
        let mut raw = hex::decode(text).unwrap();
        raw[0] ^= 0x01;
        hex::encode(raw)
    };
    // The last bytes of the output record are the vector's.
    assert_eq!(refused("vector", &|v| flip_base64(v, "output_record", usize::MAX)), "record_inclusion");
    assert_eq!(refused("text", &|v| flip_base64(v, "text", 0)), "record_inclusion");
    assert_eq!(refused("id", &|v| v["id"] = format!("{id}x").into()), "record");
    assert_eq!(refused("path", &|v| v["path"][0] = flip_hex(v["path"][0].as_str().unwrap()).into()), "record_inclusion");
    assert_eq!(refused("key", &|v| v["record_key"] = flip_hex(v["record_key"].as_str().unwrap()).into()), "record_inclusion");
    assert_eq!(refused("index", &|v| v["index"] = (v["index"].as_u64().unwrap() ^ 1).into()), "record_inclusion");
    assert_eq!(refused("size", &|v| v["records"] = (v["records"].as_u64().unwrap() + 1).into()), "record_tree_size");
    let receipt_check = refused("receipt", &|v| v["ledger"]["receipt"] = flip_hex(v["ledger"]["receipt"].as_str().unwrap()).into());
    assert!(["inclusion", "receipt"].contains(&receipt_check.as_str()), "{receipt_check}");
}
