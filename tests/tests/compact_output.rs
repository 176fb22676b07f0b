//! Compact encodings through the running local stack, on the real model (issue "beyond one dense
//! vector", item 4): an f32 job gives the vectors and, through `ephem-batch ranges`, the
//! per-dimension ranges; jobs at `--dtype int8|uint8 --ranges`, `binary` and `ubinary` then give
//! exactly what sentence-transformers' `quantize_embeddings` makes of those vectors (the encoder is
//! `protocol::quantize`, checked byte for byte against it in `protocol/tests/quantize_reference.rs`),
//! in jsonl and npy; the receipt records the dtype and the ranges, and a client whose record of
//! either differs fails `options`.

use protocol::envelope::OutputDtype;
use protocol::quantize::Ranges;
use protocol::records::Vector;
use serde_json::{Value, json};
use tests::{Stack, json_lines, short_corpus};

fn ints(record: &Value) -> Vec<i64> {
    record["embedding"].as_array().unwrap().iter().map(|x| x.as_i64().expect("integers")).collect()
}


#[test]
fn compact_encodings_equal_quantize_embeddings_of_the_f32_vectors_and_are_receipted() {
    let stack = Stack::up();
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    short_corpus(&corpus, "compact", 12);
    let path = |name: &str| work.path().join(name).to_str().unwrap().to_owned();
    let submit = |extra: &[&str], out: &str| -> Value {
        let mut args = vec!["submit", corpus.to_str().unwrap(), "--wait", "-o", out, "--json"];
        args.extend_from_slice(extra);
        let report = tests::json(&stack.ok(&args));
        assert_eq!((report["errors"].as_u64(), &report["verified"]), (Some(0), &json!(true)), "{report}");
        report
    };

    submit(&[], &path("f32.jsonl"));
    submit(&["--format", "npy"], &path("f32.npy"));
    stack.ok(&["ranges", &path("f32.npy"), "-o", &path("ranges.npy")]);
    let vectors: Vec<Vec<f32>> = json_lines(&work.path().join("f32.jsonl"))
        .iter()
        .map(|r| r["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    let ranges = Ranges::of(vectors.iter().map(Vec::as_slice)).unwrap();

    for dtype in [OutputDtype::Int8, OutputDtype::Uint8, OutputDtype::Binary, OutputDtype::Ubinary] {
        let name = dtype.as_str();
        let mut extra = vec!["--dtype", name];
        let ranges_file = path("ranges.npy");
        if dtype.needs_ranges() {
            extra.extend(["--ranges", ranges_file.as_str()]);
        }
        let out = path(&format!("{name}.jsonl"));
        let report = submit(&extra, &out);
        for (i, (record, vector)) in json_lines(std::path::Path::new(&out)).iter().zip(&vectors).enumerate() {
            let want = Vector::encode(vector.clone(), dtype, Some(&ranges)).unwrap().compact_bytes().unwrap();
            let want: Vec<i64> = match dtype {
                OutputDtype::Int8 | OutputDtype::Binary => want.iter().map(|&b| i64::from(b as i8)).collect(),
                _ => want.iter().map(|&b| i64::from(b)).collect(),
            };
            assert_eq!(ints(record), want, "{name} record {i}");
        }
        let options = stack.verify_check(report["job_id"].as_str().unwrap(), "options");
        assert_eq!(options["passed"], json!(true), "{options}");
        assert!(options.to_string().contains(&format!(" {name} ")), "{options}");
        assert_eq!(options.to_string().contains("ranges="), dtype.needs_ranges(), "{options}");
    }

    // npy: the packed bytes as unsigned bytes, one row per record.
    submit(&["--dtype", "ubinary", "--format", "npy"], &path("ubinary.npy"));
    let npy = std::fs::read(work.path().join("ubinary.npy")).unwrap();
    let header = String::from_utf8_lossy(&npy[..128]);
    assert!(header.contains("'descr': '|u1'") && header.contains("'shape': (12, 48)"), "{header}");

    // A client whose record of the job's encoding differs from the receipt's fails `options`.
    let report = submit(&["--dtype", "int8", "--ranges", &path("ranges.npy")], &path("again.jsonl"));
    let job = report["job_id"].as_str().unwrap();
    let state_file = stack.home().join("client/jobs").join(job).join("job.json");
    let state = std::fs::read_to_string(&state_file).unwrap();
    for (from, to) in [("\"dtype\": \"int8\"", "\"dtype\": \"uint8\""), ("\"ranges_sha256\": \"", "\"ranges_sha256\": \"00")] {
        let changed = state.replacen(from, to, 1);
        assert_ne!(changed, state, "{from} in the job record");
        std::fs::write(&state_file, changed).unwrap();
        assert_eq!(stack.verify_check(job, "options")["passed"], json!(false), "{to}");
        std::fs::write(&state_file, &state).unwrap();
    }
    assert_eq!(stack.verify_check(job, "options")["passed"], json!(true));

    // One compact record proven alone, offline: the bytes proven are the ones written.
    let record = &json_lines(&work.path().join("again.jsonl"))[5];
    let proven = stack.prove_record(job, record["id"].as_str().unwrap(), &work.path().join("record.json"));
    let vector: Vec<i64> = proven["proven"]["vector"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as i64).collect();
    assert_eq!(vector, ints(record), "{proven}");

    // What cannot be sealed is refused before any upload, naming the flag.
    for (extra, named) in [(&["--dtype", "int8"][..], "needs --ranges"), (&["--dtype", "nope"][..], "nope")] {
        let mut args = vec!["submit", corpus.to_str().unwrap()];
        args.extend_from_slice(extra);
        let refused = stack.cli(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && stderr.contains(named), "{named}: {stderr}");
    }
}
