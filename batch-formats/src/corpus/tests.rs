use super::*;
use std::io::Cursor;

const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";

fn read_all(input: &[u8]) -> (Vec<CorpusItem>, CorpusSummary) {
    read_with(input, CorpusOptions::new(MODEL))
}

fn read_with(input: &[u8], options: CorpusOptions) -> (Vec<CorpusItem>, CorpusSummary) {
    let mut reader = CorpusReader::new(Cursor::new(input.to_vec()), options);
    let items = reader.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    (items, reader.summary().clone())
}

fn errors(items: &[CorpusItem]) -> Vec<(u64, Option<&str>, &'static str)> {
    items
        .iter()
        .filter_map(|item| match item {
            CorpusItem::Error(e) => Some((e.line, e.id.as_deref(), e.code.as_str())),
            CorpusItem::Records { .. } => None,
        })
        .collect()
}

fn record_ids(items: &[CorpusItem]) -> Vec<String> {
    items
        .iter()
        .flat_map(|item| match item {
            CorpusItem::Records { records, .. } => records.iter().map(|r| r.id.clone()).collect(),
            CorpusItem::Error(_) => vec![],
        })
        .collect()
}

fn code_of(line: &[u8]) -> &'static str {
    let (items, _) = read_all(line);
    match items.as_slice() {
        [CorpusItem::Error(e)] => e.code.as_str(),
        other => panic!("expected one error for {:?}, got {other:?}", String::from_utf8_lossy(line)),
    }
}

fn openai(custom_id: &str, input: &str) -> String {
    format!(
        r#"{{"custom_id":{},"method":"POST","url":"/v1/embeddings","body":{{"model":"all-MiniLM-L6-v2","input":{input}}}}}"#,
        serde_json::to_string(custom_id).unwrap()
    )
}

#[test]
fn plain_lines_yield_records_in_order() {
    let input = b"{\"id\": \"a\", \"text\": \"hello\"}\n\n  \n{\"id\": 17, \"text\": \"\", \"meta\": 1}\r\n{\"id\": -3, \"text\": \"x\"}";
    let (items, summary) = read_all(input);
    assert_eq!(record_ids(&items), ["a", "17", "-3"]);
    let CorpusItem::Records { line, records } = &items[1] else { panic!() };
    assert_eq!((*line, records[0].text.as_slice()), (4, b"".as_slice()));
    assert_eq!(
        summary,
        CorpusSummary { records: 3, lines: 3, accepted_lines: 3, errors: 0, form: Some(CorpusForm::Plain) }
    );
}

#[test]
fn every_plain_error_code() {
    assert_eq!(code_of(b"{\"id\": \"a\", \"text\": "), "invalid_json");
    assert_eq!(code_of(b"[1, 2]"), "invalid_json");
    assert_eq!(code_of(b"{\"id\": \"a\", \"text\": \"caf\xe9\"}"), "invalid_utf8");
    assert_eq!(code_of(b"{\"text\": \"t\"}"), "missing_id");
    assert_eq!(code_of(b"{\"id\": \"\", \"text\": \"t\"}"), "missing_id");
    assert_eq!(code_of(b"{\"id\": 1.5, \"text\": \"t\"}"), "missing_id");
    assert_eq!(code_of(b"{}"), "missing_id");
    assert_eq!(code_of(b"{\"id\": \"a\"}"), "missing_text");
    assert_eq!(code_of(b"{\"id\": \"a\", \"text\": null}"), "missing_text");
    assert_eq!(code_of(b"{\"id\": \"a\", \"text\": 12}"), "invalid_text");
    assert_eq!(code_of(b"{\"id\": \"a\", \"text\": [\"t\"]}"), "invalid_text");
    let long_id = format!("{{\"id\": \"{}\", \"text\": \"t\"}}", "i".repeat(MAX_ID_LEN + 1));
    assert_eq!(code_of(long_id.as_bytes()), "id_too_long");
    let max_id = format!("{{\"id\": \"{}\", \"text\": \"t\"}}", "i".repeat(MAX_ID_LEN));
    assert_eq!(record_ids(&read_all(max_id.as_bytes()).0).len(), 1);
    let big = format!("{{\"id\": \"a\", \"text\": \"{}\"}}", "x".repeat(MAX_TEXT_LEN + 1));
    assert_eq!(code_of(big.as_bytes()), "too_large");
    let max = format!("{{\"id\": \"a\", \"text\": \"{}\"}}", "x".repeat(MAX_TEXT_LEN));
    assert_eq!(record_ids(&read_all(max.as_bytes()).0), ["a"]);
}

#[test]
fn invalid_utf8_names_the_id_when_it_can() {
    let (items, _) =
        read_all(b"{\"id\": \"doc-9\", \"text\": \"\xff\xfe\"}\n{\"id\": \"\xff\", \"text\": \"t\"}\n");
    assert_eq!(errors(&items), [(1, Some("doc-9"), "invalid_utf8"), (2, None, "invalid_utf8")]);
}

#[test]
fn duplicates_keep_the_first_occurrence() {
    let input = b"{\"id\": \"a\", \"text\": \"1\"}\n{\"id\": \"a\", \"text\": \"2\"}\n{\"id\": 5, \"text\": \"3\"}\n{\"id\": \"5\", \"text\": \"4\"}\n{\"id\": \"b\"}\n{\"id\": \"b\", \"text\": \"6\"}\n";
    let (items, summary) = read_all(input);
    assert_eq!(record_ids(&items), ["a", "5", "b"]);
    assert_eq!(
        errors(&items),
        [(2, Some("a"), "duplicate_id"), (4, Some("5"), "duplicate_id"), (5, Some("b"), "missing_text")]
    );
    let CorpusItem::Error(e) = &items[1] else { panic!() };
    assert!(e.message.contains("line 1"), "{}", e.message);
    assert_eq!((summary.records, summary.errors, summary.lines), (3, 3, 6));
}

#[test]
fn a_one_megabyte_line_is_too_large_and_reading_goes_on() {
    let text = "y".repeat(1 << 20);
    let input = format!("{{\"id\": \"big\", \"text\": \"{text}\"}}\n{{\"id\": \"next\", \"text\": \"ok\"}}\n");
    let (items, _) = read_all(input.as_bytes());
    assert_eq!(errors(&items), [(1, Some("big"), "too_large")]);
    assert_eq!(record_ids(&items), ["next"]);
}

#[test]
fn lines_over_the_cap_are_skipped_without_buffering() {
    let mut options = CorpusOptions::new(MODEL);
    options.max_line_len = 1000;
    let input = format!(
        "{{\"id\": \"big\", \"text\": \"{}\"}}\n{{\"id\": \"next\", \"text\": \"ok\"}}",
        "z".repeat(1 << 20)
    );
    let mut reader = CorpusReader::new(io::BufReader::with_capacity(4096, input.as_bytes()), options);
    let first = reader.next().unwrap().unwrap();
    let CorpusItem::Error(e) = first else { panic!("{first:?}") };
    assert_eq!((e.line, e.id, e.code), (1, None, LineErrorCode::TooLarge));
    assert!(reader.buffer.capacity() <= 8192, "buffered {} bytes", reader.buffer.capacity());
    assert_eq!(record_ids(&[reader.next().unwrap().unwrap()]), ["next"]);
    assert!(reader.next().is_none());
}

#[test]
fn openai_lines_one_record_per_string() {
    let input = [
        openai("q1", "\"one\""),
        openai("q2", "[\"a\", \"b\", \"\"]"),
        r#"{"custom_id":"q3","method":"POST","url":"/v1/embeddings","body":{"model":"sentence-transformers/all-MiniLM-L6-v2","input":"x","encoding_format":"float"}}"#.into(),
        r#"{"custom_id":"q4","method":"POST","url":"/v1/embeddings","body":{"input":"no model named"}}"#.into(),
    ]
    .join("\n");
    let (items, summary) = read_all(input.as_bytes());
    assert_eq!(record_ids(&items), ["q1#0", "q2#0", "q2#1", "q2#2", "q3#0", "q4#0"]);
    assert_eq!(summary.form, Some(CorpusForm::OpenAi));
    assert_eq!((summary.records, summary.accepted_lines), (6, 4));
}

#[test]
fn every_openai_error_code() {
    let line = |custom_id: &str, method: &str, url: &str, body: &str| {
        format!(r#"{{"custom_id":{custom_id},"method":{method},"url":{url},"body":{body}}}"#)
    };
    let ok_body = r#"{"model":"all-MiniLM-L6-v2","input":"t"}"#;
    let cases = [
        (line("null", "\"POST\"", "\"/v1/embeddings\"", ok_body), "missing_id"),
        (line("7", "\"POST\"", "\"/v1/embeddings\"", ok_body), "missing_id"),
        (line("\"\"", "\"POST\"", "\"/v1/embeddings\"", ok_body), "missing_id"),
        (line("\"r\"", "\"GET\"", "\"/v1/embeddings\"", ok_body), "unsupported_request"),
        (line("\"r\"", "\"POST\"", "\"/v1/chat/completions\"", ok_body), "unsupported_request"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", "[]"), "unsupported_request"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":[1,2,3]}"#), "unsupported_request"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":[[1,2],[3]]}"#), "unsupported_request"),
        (
            line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":"t","encoding_format":"base64"}"#),
            "unsupported_request",
        ),
        (
            line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":"t","dimensions":64}"#),
            "unsupported_request",
        ),
        (
            line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"model":"text-embedding-3-small","input":"t"}"#),
            "model_mismatch",
        ),
        (
            line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"model":"other/all-MiniLM-L6-v2","input":"t"}"#),
            "model_mismatch",
        ),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"model":"all-MiniLM-L6-v2"}"#), "missing_text"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":[]}"#), "missing_text"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", "null"), "missing_text"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":{"a":1}}"#), "invalid_text"),
        (line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":["ok",null]}"#), "invalid_text"),
    ];
    for (input, code) in cases {
        assert_eq!(code_of(input.as_bytes()), code, "{input}");
    }
    let big = openai("r", &format!("[\"ok\", \"{}\"]", "x".repeat(MAX_TEXT_LEN + 1)));
    assert_eq!(code_of(big.as_bytes()), "too_large");
    // The longest record id, "<custom_id>#<last index>", must fit.
    let fits = "c".repeat(MAX_ID_LEN - 2);
    assert_eq!(record_ids(&read_all(openai(&fits, "\"t\"").as_bytes()).0).len(), 1);
    assert_eq!(
        code_of(openai(&fits, "[\"t\",\"t\",\"t\",\"t\",\"t\",\"t\",\"t\",\"t\",\"t\",\"t\",\"t\"]").as_bytes()),
        "id_too_long"
    );
    let dims = CorpusOptions { dimensions: Some(384), ..CorpusOptions::new(MODEL) };
    let with_dims = line("\"r\"", "\"POST\"", "\"/v1/embeddings\"", r#"{"input":"t","dimensions":384}"#);
    assert_eq!(record_ids(&read_with(with_dims.as_bytes(), dims).0), ["r#0"]);
}

#[test]
fn openai_duplicates_are_by_custom_id() {
    let input = [openai("q", "\"a\""), openai("q", "[\"b\",\"c\"]"), openai("q#0", "\"d\"")].join("\n");
    let (items, _) = read_all(input.as_bytes());
    assert_eq!(errors(&items), [(2, Some("q"), "duplicate_id")]);
    assert_eq!(record_ids(&items), ["q#0", "q#0#0"]);
}

#[test]
fn the_first_accepted_line_sets_the_form() {
    let input = [
        "{\"text\": \"no id\"}".to_owned(),
        openai("q1", "\"a\""),
        "{\"id\": \"p\", \"text\": \"plain\"}".into(),
        "{\"whatever\": 1}".into(),
        openai("q2", "\"b\""),
    ]
    .join("\n");
    let (items, summary) = read_all(input.as_bytes());
    assert_eq!(errors(&items), [(1, None, "missing_id"), (3, Some("p"), "mixed_forms"), (4, None, "missing_id")]);
    assert_eq!(record_ids(&items), ["q1#0", "q2#0"]);
    assert_eq!(summary.form, Some(CorpusForm::OpenAi));
}

#[test]
fn openai_ids_round_trip_for_hostile_custom_ids() {
    let hostile =
        ["q", "#", "##", "#0", "a#1", "a#01", "0", "a b\nc", "\"quoted\"", "ünï©ødé", "x#y#z#", "#-1", "a\u{0}b"];
    for custom_id in hostile {
        for index in [0usize, 1, 9, 10, 2047, usize::MAX] {
            let id = openai_record_id(custom_id, index);
            assert_eq!(parse_openai_record_id(&id), Some((custom_id, index)), "{id:?}");
        }
    }
    for bad in ["", "#", "#0", "a", "a#", "a#01", "a#+1", "a#-1", "a#1x", "a# 1", "a#99999999999999999999999"] {
        assert_eq!(parse_openai_record_id(bad), None, "{bad:?}");
    }
}

#[test]
fn count_records_matches_a_reading_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corpus.jsonl");
    let body = b"\xEF\xBB\xBF{\"id\": 1, \"text\": \"a\"}\n{\"id\": 1, \"text\": \"b\"}\nnot json\n\n{\"id\": 2, \"text\": \"c\"}\n";
    std::fs::write(&path, body).unwrap();
    let summary = count_records(&path, &CorpusOptions::new(MODEL)).unwrap();
    assert_eq!(
        summary,
        CorpusSummary { records: 2, lines: 4, accepted_lines: 2, errors: 2, form: Some(CorpusForm::Plain) }
    );
    assert_eq!(read_all(body).1, summary);
    let missing = count_records(&dir.path().join("absent.jsonl"), &CorpusOptions::new(MODEL)).unwrap_err();
    assert!(missing.to_string().contains("absent.jsonl"), "{missing}");
}

#[test]
fn line_errors_serialise_with_stable_codes() {
    let error = LineError { line: 3, id: Some("x".into()), code: LineErrorCode::IdTooLong, message: "m".into() };
    let json = serde_json::to_string(&error).unwrap();
    assert_eq!(json, r#"{"line":3,"id":"x","code":"id_too_long","message":"m"}"#);
    assert_eq!(serde_json::from_str::<LineError>(&json).unwrap(), error);
    for code in LineErrorCode::ALL {
        assert_eq!(serde_json::to_value(code).unwrap(), Value::String(code.as_str().into()));
    }
}

#[test]
fn rerank_lines_become_one_record_each_and_bad_ones_fail_alone() {
    let input = br#"{"id": "a", "query": "capital?", "documents": ["Paris", "Berlin"]}
{"id": "b", "query": "q", "documents": "Paris"}
{"id": "c", "query": "q", "documents": []}
{"id": "d", "documents": ["x"]}
{"id": "e", "query": "q", "documents": ["x", 3]}
{"id": "a", "query": "q", "documents": ["x"]}
"#;
    let strict = CorpusOptions { rerank: Some(true), ..CorpusOptions::new(MODEL) };
    let (items, summary) = read_with(input, strict);
    assert_eq!(summary.form, Some(CorpusForm::Rerank));
    assert_eq!(record_ids(&items), ["a"]);
    let CorpusItem::Records { records, .. } = &items[0] else { panic!() };
    assert_eq!(RerankInput::parse(&records[0].text).unwrap(), RerankInput { query: "capital?".into(), documents: vec!["Paris".into(), "Berlin".into()] });
    assert_eq!(
        errors(&items),
        [(2, Some("b"), "invalid_text"), (3, Some("c"), "invalid_text"), (4, Some("d"), "missing_text"), (5, Some("e"), "invalid_text"), (6, Some("a"), "duplicate_id")]
    );
    // Before the model is known the first line's shape decides; a dense job reads them as
    // lines without a text, never as texts.
    assert_eq!(record_ids(&read_all(input).0), ["a"]);
    let (items, _) = read_with(input, CorpusOptions { rerank: Some(false), ..CorpusOptions::new(MODEL) });
    assert!(record_ids(&items).is_empty() && errors(&items).iter().all(|e| e.2 == "missing_text" || e.2 == "duplicate_id"), "{:?}", errors(&items));
    // A cross-encoder's job reads a plain line as one without a query.
    let (items, _) = read_with(br#"{"id": "p", "text": "plain"}"#, CorpusOptions { rerank: Some(true), ..CorpusOptions::new(MODEL) });
    assert_eq!(errors(&items), [(1, Some("p"), "missing_text")]);
}
