//! The client's corpus reader (`ephem-batch submit`): arbitrary bytes as a JSONL corpus, every
//! line checked before anything is sealed. Checks: the same items whatever the read buffer's
//! size, consistent counts, line numbers increasing, every accepted record id unique in the file
//! and every record encodable into the sealed stream (the client's checks cover the record
//! format's limits), and OpenAI records grouped under their line's custom_id in index order.
#![no_main]

use std::collections::HashSet;
use std::io::BufReader;

use ephem_fuzz::corpus::{CorpusForm, CorpusItem, CorpusOptions, CorpusReader, CorpusSummary, parse_openai_record_id};
use ephem_fuzz::fixed;
use libfuzzer_sys::fuzz_target;

fn read(data: &[u8], buffer: usize) -> (Vec<CorpusItem>, CorpusSummary) {
    let mut options = CorpusOptions::new(fixed::MODEL_ID);
    options.dimensions = Some(384);
    options.max_line_len = 2048;
    let mut reader = CorpusReader::new(BufReader::with_capacity(buffer, data), options);
    let mut items = Vec::new();
    while let Some(item) = reader.next_item().expect("reading memory does not fail") {
        items.push(item);
    }
    (items, reader.summary().clone())
}

fuzz_target!(|data: &[u8]| {
    let small = [1usize, 3, 16, 100][usize::from(data.last().copied().unwrap_or(0) & 3)];
    let (items, summary) = read(data, data.len().max(1));
    assert_eq!((items.clone(), summary.clone()), read(data, small), "items depend on the read buffer");

    assert_eq!(summary.lines, items.len() as u64);
    assert_eq!(summary.accepted_lines + summary.errors, summary.lines);
    let mut ids = HashSet::new();
    let mut last_line = 0;
    let mut records = 0u64;
    for item in &items {
        let line = match item {
            CorpusItem::Records { line, records: rs } => {
                assert!(!rs.is_empty());
                records += rs.len() as u64;
                for (index, record) in rs.iter().enumerate() {
                    assert!(ids.insert(record.id.clone()), "duplicate record id {:?}", record.id);
                    protocol::records::encode_input(record, &mut Vec::new()).expect("an accepted record is sealable");
                    if summary.form == Some(CorpusForm::OpenAi) {
                        let (custom_id, i) = parse_openai_record_id(&record.id).expect("an OpenAI record id");
                        assert_eq!(i, index);
                        assert_eq!(Some(custom_id), parse_openai_record_id(&rs[0].id).map(|p| p.0));
                    }
                }
                *line
            }
            CorpusItem::Error(error) => error.line,
        };
        assert!(line > last_line, "line numbers do not increase");
        last_line = line;
    }
    assert_eq!(summary.records, records);
    assert_eq!(summary.form.is_some(), summary.accepted_lines > 0);
});
