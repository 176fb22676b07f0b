use super::*;
use crate::corpus::{LineErrorCode, openai_record_id};
use protocol::records::f32_to_f16;
use serde_json::{Value, json};

const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

fn options(format: OutputFormat) -> OutputOptions {
    OutputOptions { format, model_id: MODEL.into(), results_of: ResultsOf::Job(protocol::envelope::JobId([0xab; 16])), dimensions: None, kind: Default::default() }
}

fn embedding(id: &str, tokens: u32, values: &[f32]) -> OutputRecord {
    OutputRecord::Embedding { id: id.into(), tokens, vector: Vector::F32(values.to_vec()) }
}

fn failure(id: &str, code: ErrorCode) -> OutputRecord {
    OutputRecord::Error { id: id.into(), code, message: format!("{} happened", code.as_str()) }
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn local_error() -> LineError {
    LineError { line: 4, id: None, code: LineErrorCode::InvalidJson, message: "not valid JSON".into() }
}

#[test]
fn paths_sit_beside_the_output() {
    let paths = OutputPaths::new(Path::new("out/vectors.npy"), OutputFormat::Npy).unwrap();
    assert_eq!(paths.errors, Path::new("out/vectors.errors.jsonl"));
    assert_eq!(paths.ids.as_deref(), Some(Path::new("out/vectors.ids.jsonl")));
    let paths = OutputPaths::new(Path::new("result"), OutputFormat::Jsonl).unwrap();
    assert_eq!((paths.errors.as_path(), paths.ids), (Path::new("result.errors.jsonl"), None));
    let paths = OutputPaths::new(Path::new("x.errors.jsonl"), OutputFormat::Npy).unwrap();
    assert_eq!(
        (paths.errors.as_path(), paths.ids.as_deref()),
        (Path::new("x.errors.errors.jsonl"), Some(Path::new("x.errors.ids.jsonl")))
    );
    assert!(matches!(OutputPaths::new(Path::new("/"), OutputFormat::Jsonl), Err(OutputError::NoFileName(_))));
}

#[test]
fn jsonl_embeddings_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sub/embeddings.jsonl");
    let mut writer = OutputWriter::create(&out, options(OutputFormat::Jsonl)).unwrap();
    writer.line_error(&local_error()).unwrap();
    writer.record(&embedding("a", 3, &[0.5, -0.25])).unwrap();
    writer.record(&failure("b", ErrorCode::EmptyText)).unwrap();
    let half = OutputRecord::Embedding {
        id: "c".into(),
        tokens: 2,
        vector: Vector::F16(vec![f32_to_f16(1.5), f32_to_f16(-2.0)]),
    };
    writer.record(&half).unwrap();
    assert!(!out.exists(), "nothing under the final name before finish");
    let summary = writer.finish().unwrap();
    assert_eq!(
        summary,
        OutputSummary {
            records: 2,
            errors: 2,
            failed_records: 1,
            local_errors: 1,
            received: 3,
            tokens: 5,
            dimensions: Some(2),
            dtype: Some(OutputDtype::F32),
        }
    );
    assert_eq!(
        json_lines(&out),
        [
            json!({"id": "a", "embedding": [0.5, -0.25], "tokens": 3}),
            json!({"id": "c", "embedding": [1.5, -2.0], "tokens": 2})
        ]
    );
    assert_eq!(
        json_lines(&dir.path().join("sub/embeddings.errors.jsonl")),
        [
            json!({"id": null, "code": "invalid_json", "message": "not valid JSON", "line": 4}),
            json!({"id": "b", "code": "empty_text", "message": "empty_text happened"}),
        ]
    );
    let names: Vec<_> =
        std::fs::read_dir(dir.path().join("sub")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "no partial files left: {names:?}");
}

#[test]
fn dimensions_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("e.jsonl");
    let mut writer =
        OutputWriter::create(&out, OutputOptions { dimensions: Some(2), ..options(OutputFormat::Jsonl) }).unwrap();
    writer.record(&embedding("a", 1, &[1.0, 0.0])).unwrap();
    assert!(matches!(
        writer.record(&embedding("b", 1, &[1.0])),
        Err(OutputError::Dimensions { expected: 2, found: 1, .. })
    ));
    drop(writer);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a dropped writer removes its partial files");
}

/// Parses an npy file (format 1.0, `<f4`) the way NumPy does: magic, version, header
/// length, the dict's fields, then the data.
fn parse_npy(bytes: &[u8]) -> ((usize, usize), Vec<f32>) {
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    assert_eq!(&bytes[6..8], &[1, 0]);
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + header_len) % 64, 0, "data is 64-byte aligned");
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.ends_with('\n'));
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let dims: Vec<usize> = shape.split(',').map(|d| d.trim().parse().unwrap()).collect();
    let data: Vec<f32> =
        bytes[10 + header_len..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(data.len(), dims[0] * dims[1], "{header}");
    ((dims[0], dims[1]), data)
}

#[test]
fn npy_streams_with_a_fixed_up_header_and_an_ids_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("vectors.npy");
    let mut writer = OutputWriter::create(&out, options(OutputFormat::Npy)).unwrap();
    let rows = 1000;
    for i in 0..rows {
        let id = format!("doc \"{i}\"");
        if i % 100 == 7 {
            writer.record(&failure(&id, ErrorCode::TooManyTokens)).unwrap();
        } else {
            writer.record(&embedding(&id, 1, &[i as f32, -(i as f32), 0.5])).unwrap();
        }
    }
    let summary = writer.finish().unwrap();
    assert_eq!((summary.records, summary.errors, summary.dimensions), (990, 10, Some(3)));
    let ((n, d), data) = parse_npy(&std::fs::read(&out).unwrap());
    assert_eq!((n, d), (990, 3));
    let ids: Vec<String> = std::fs::read_to_string(dir.path().join("vectors.ids.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ids.len(), 990);
    for (row, id) in ids.iter().enumerate() {
        let i: f32 = id.trim_start_matches("doc \"").trim_end_matches('"').parse().unwrap();
        assert_eq!(&data[row * 3..row * 3 + 3], &[i, -i, 0.5]);
    }
    assert_eq!(json_lines(&dir.path().join("vectors.errors.jsonl")).len(), 10);
}

#[test]
fn npy_without_rows_is_still_valid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("none.npy");
    let writer =
        OutputWriter::create(&out, OutputOptions { dimensions: Some(384), ..options(OutputFormat::Npy) }).unwrap();
    writer.finish().unwrap();
    assert_eq!(parse_npy(&std::fs::read(&out).unwrap()).0, (0, 384));
    assert_eq!(npy_header(u64::MAX, usize::MAX).len(), NPY_HEADER_LEN);
}

#[test]
fn openai_lines_regroup_strings_and_failed_lines_go_to_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("batch_output.jsonl");
    let mut writer = OutputWriter::create(&out, options(OutputFormat::OpenAi)).unwrap();
    writer
        .line_error(&LineError {
            line: 2,
            id: Some("bad#1".into()),
            code: LineErrorCode::ModelMismatch,
            message: "other model".into(),
        })
        .unwrap();
    writer.record(&embedding(&openai_record_id("q1", 0), 4, &[1.0, 0.0])).unwrap();
    writer.record(&embedding(&openai_record_id("q#2", 0), 2, &[0.0, 1.0])).unwrap();
    writer.record(&embedding(&openai_record_id("q#2", 1), 3, &[0.5, 0.5])).unwrap();
    writer.record(&embedding(&openai_record_id("q3", 0), 1, &[0.1, 0.2])).unwrap();
    writer.record(&failure(&openai_record_id("q3", 1), ErrorCode::EmptyText)).unwrap();
    writer.record(&failure(&openai_record_id("q3", 2), ErrorCode::TooManyTokens)).unwrap();
    writer.record(&embedding(&openai_record_id("q4", 0), 5, &[0.3, 0.4])).unwrap();
    let summary = writer.finish().unwrap();
    assert_eq!((summary.records, summary.errors, summary.failed_records, summary.tokens), (4, 2, 2, 15));

    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    let q2 = &lines[1];
    assert_eq!(q2["custom_id"], "q#2");
    assert_eq!(q2["error"], Value::Null);
    assert!(q2["id"].as_str().unwrap().starts_with("batch_req_"));
    assert!(q2["response"]["request_id"].as_str().unwrap().starts_with("req_"));
    assert_eq!(
        q2["response"]["body"],
        json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": [0.0, 1.0]},
                {"object": "embedding", "index": 1, "embedding": [0.5, 0.5]},
            ],
            "model": MODEL,
            "usage": {"prompt_tokens": 5, "total_tokens": 5},
        })
    );
    assert_eq!(q2["response"]["status_code"], 200);
    assert_eq!(lines.iter().map(|l| l["custom_id"].as_str().unwrap()).collect::<Vec<_>>(), ["q1", "q#2", "q4"]);

    let errors = json_lines(&dir.path().join("batch_output.errors.jsonl"));
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["custom_id"], "bad#1");
    assert_eq!(errors[0]["line"], 2);
    assert_eq!(errors[0]["response"]["body"]["error"]["code"], "model_mismatch");
    let q3 = &errors[1];
    assert_eq!(q3["custom_id"], "q3");
    assert_eq!(q3["error"], Value::Null);
    assert_eq!(q3["response"]["status_code"], 400);
    let error = &q3["response"]["body"]["error"];
    assert_eq!(
        (error["code"].as_str(), error["type"].as_str(), error["param"].as_str()),
        (Some("empty_text"), Some("invalid_request_error"), Some("input"))
    );
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("input[1]: empty_text") && message.contains("input[2]: too_many_tokens"), "{message}");
}

#[test]
fn openai_ids_are_stable_and_per_job() {
    let write = |results_of: ResultsOf| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o.jsonl");
        let mut writer = OutputWriter::create(&out, OutputOptions { results_of, ..options(OutputFormat::OpenAi) }).unwrap();
        writer.record(&embedding("r#0", 1, &[1.0])).unwrap();
        writer.finish().unwrap();
        std::fs::read(&out).unwrap()
    };
    let job = |n: u8| ResultsOf::Job(protocol::envelope::JobId([n; 16]));
    assert_eq!(write(job(1)), write(job(1)));
    assert_ne!(write(job(1)), write(job(2)));
    assert_ne!(write(ResultsOf::Bulk("b1".into())), write(ResultsOf::Bulk("b2".into())));
    // A job's ids are seeded by its id in hex, as before the id was typed: the same results
    // written again by an older or newer client carry the same ids.
    assert_eq!(write(job(0xab)), write(ResultsOf::Bulk("ab".repeat(16))));
}

#[test]
fn openai_format_refuses_foreign_ids_and_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = OutputWriter::create(&dir.path().join("o.jsonl"), options(OutputFormat::OpenAi)).unwrap();
    assert!(matches!(writer.record(&embedding("plain-id", 1, &[1.0])), Err(OutputError::NotOpenAiId { .. })));
    writer.record(&embedding("r#0", 1, &[1.0])).unwrap();
    assert!(matches!(
        writer.record(&embedding("r#2", 1, &[1.0])),
        Err(OutputError::OpenAiOrder { expected: 1, found: 2, .. })
    ));
    assert!(matches!(
        writer.record(&embedding("s#1", 1, &[1.0])),
        Err(OutputError::OpenAiOrder { expected: 0, found: 1, .. })
    ));
}

fn sparse_record(id: &str, indices: &[u32], values: &[f32]) -> OutputRecord {
    let vector = Vector::Sparse(SparseVector { dimensions: 30, indices: indices.to_vec(), values: values.to_vec() });
    OutputRecord::Embedding { id: id.into(), tokens: 7, vector }
}

fn multi_record(id: &str, rows: &[[f32; 2]]) -> OutputRecord {
    let vector = Vector::Multi(MultiVector::new(2, rows.concat()).unwrap());
    OutputRecord::Embedding { id: id.into(), tokens: rows.len() as u32, vector }
}

/// The archive's entries by name: (npy dict, data bytes), read back with the zip crate.
fn npz_entries(path: &Path) -> std::collections::BTreeMap<String, (String, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut entry = archive.by_index(i).unwrap();
            assert_eq!(entry.compression(), zip::CompressionMethod::Stored);
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "{:?}", entry.name());
            let header = 10 + usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
            assert_eq!(header % 64, 0);
            let dict = String::from_utf8(bytes[10..header].to_vec()).unwrap().trim_end().to_owned();
            (entry.name().unwrap().into_owned(), (dict, bytes[header..].to_vec()))
        })
        .collect()
}

fn le<T: Copy, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|c| from(c.try_into().unwrap())).collect()
}

#[test]
fn npz_holds_a_sparse_job_as_scipy_csr_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("weights.npz");
    let mut writer = OutputWriter::create(&out, OutputOptions { kind: OutputKind::Sparse, ..options(OutputFormat::Npz) }).unwrap();
    writer.record(&sparse_record("a", &[1, 5, 29], &[0.5, 1.25, 3.0])).unwrap();
    writer.record(&failure("b", ErrorCode::TooManyTokens)).unwrap();
    writer.record(&sparse_record("c", &[], &[])).unwrap();
    writer.record(&sparse_record("d", &[0], &[2.0])).unwrap();
    let summary = writer.finish().unwrap();
    assert_eq!((summary.records, summary.failed_records, summary.dimensions), (3, 1, Some(30)));

    let entries = npz_entries(&out);
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["data.npy", "format.npy", "indices.npy", "indptr.npy", "shape.npy"]);
    let array = |name: &str, descr: &str, shape: &str| {
        let (dict, data) = &entries[name];
        assert_eq!(dict, &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"), "{name}");
        data.clone()
    };
    assert_eq!(le(&array("data.npy", "<f4", "(4,)"), f32::from_le_bytes), [0.5, 1.25, 3.0, 2.0]);
    assert_eq!(le(&array("indices.npy", "<i4", "(4,)"), i32::from_le_bytes), [1, 5, 29, 0]);
    assert_eq!(le(&array("indptr.npy", "<i8", "(4,)"), i64::from_le_bytes), [0, 3, 3, 4]);
    assert_eq!(le(&array("shape.npy", "<i8", "(2,)"), i64::from_le_bytes), [3, 30]);
    assert_eq!(array("format.npy", "|S3", "()"), b"csr");
    let ids = std::fs::read_to_string(dir.path().join("weights.ids.jsonl")).unwrap();
    assert_eq!(ids, "\"a\"\n\"c\"\n\"d\"\n");
    assert_eq!(json_lines(&dir.path().join("weights.errors.jsonl"))[0]["id"], "b");
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["weights.errors.jsonl", "weights.ids.jsonl", "weights.npz"], "no scratch file is left");
}

#[test]
fn npz_holds_a_multivector_job_as_vectors_and_row_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tokens.npz");
    let mut writer = OutputWriter::create(&out, OutputOptions { kind: OutputKind::MultiVector, ..options(OutputFormat::Npz) }).unwrap();
    writer.record(&multi_record("a", &[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])).unwrap();
    writer.record(&multi_record("b", &[[0.8, -0.6]])).unwrap();
    writer.finish().unwrap();
    let entries = npz_entries(&out);
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["indptr.npy", "vectors.npy"]);
    let (dict, data) = &entries["vectors.npy"];
    assert_eq!(dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }");
    assert_eq!(le(data, f32::from_le_bytes), [1.0, 0.0, 0.0, 1.0, 0.6, 0.8, 0.8, -0.6]);
    let (dict, data) = &entries["indptr.npy"];
    assert_eq!(dict, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }");
    assert_eq!(le(data, i64::from_le_bytes), [0, 3, 4]);
}

#[test]
fn npz_refuses_dense_vectors_and_an_unfinished_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.npz");
    let mut writer = OutputWriter::create(&out, options(OutputFormat::Npz)).unwrap();
    let error = writer.record(&embedding("a", 3, &[1.0, 2.0])).unwrap_err();
    assert!(error.to_string().contains("dense output, which the npz format does not write"), "{error}");
    writer.record(&sparse_record("b", &[2], &[1.0])).unwrap();
    drop(writer);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "partial and scratch files removed");
    for (format, kind, writes) in [
        (OutputFormat::Npz, OutputKind::Sparse, true),
        (OutputFormat::Npz, OutputKind::MultiVector, true),
        (OutputFormat::Npz, OutputKind::Scores, false),
        (OutputFormat::Npy, OutputKind::Sparse, false),
        (OutputFormat::Jsonl, OutputKind::Scores, true),
    ] {
        assert_eq!(format.writes(kind), writes, "{format:?} {kind:?}");
    }
}
