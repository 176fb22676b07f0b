//! Sealed envelopes: arbitrary bytes as a sealed job input (or, when the kind byte says so, a
//! sealed job result), read the way the enclave (the client) reads them — the preamble from bytes
//! arriving in pieces, the header, the HPKE open with a fixed test key, the STREAM body, the
//! records inside. Every failure must be an error, never a panic. Checks: the preamble read in
//! pieces equals one read of the whole, preamble and header re-encode to their bytes, and the
//! body gives the same plaintext and verdict whether pushed whole or in pieces.
#![no_main]

use ephem_fuzz::{fixed, pieces, records};
use libfuzzer_sys::fuzz_target;
use protocol::envelope::{self, JobHeader, JobId, Preamble, ResultHeader, StreamKind};
use protocol::stream::{StreamError, StreamOpener};

fn body(mut opener: StreamOpener, parts: &[&[u8]]) -> (Vec<u8>, Result<(), StreamError>) {
    let mut plaintext = Vec::new();
    for part in parts {
        if let Err(e) = opener.push(part, &mut plaintext) {
            return (plaintext, Err(e));
        }
    }
    let end = opener.finish(&mut plaintext);
    (plaintext, end)
}

fuzz_target!(|data: &[u8]| {
    let kind = if data.get(5) == Some(&(StreamKind::JobResult as u8)) { StreamKind::JobResult } else { StreamKind::JobInput };

    // The preamble as the enclave reads it: retry as Input frames arrive.
    let whole = Preamble::parse(data, kind);
    let mut buffer = Vec::new();
    let mut incremental = Ok(None);
    for piece in pieces(data) {
        buffer.extend_from_slice(piece);
        incremental = Preamble::parse(&buffer, kind);
        if !matches!(incremental, Ok(None)) {
            break;
        }
    }
    assert_eq!(incremental, whole, "the preamble depends on how the bytes arrived");
    let Ok(Some((preamble, used))) = whole else { return };
    assert_eq!(preamble.to_bytes(), &data[..used], "the preamble has a second encoding");
    let rest = &data[used..];

    match kind {
        StreamKind::JobInput => {
            if let Ok(header) = JobHeader::from_bytes(&preamble.header) {
                assert_eq!(header.to_bytes(), preamble.header, "the job header has a second encoding");
            }
            let claimed = Some(JobId(preamble.stream_id()));
            let Ok(opened) = envelope::open_job(&preamble, fixed::fleet_secret(), claimed) else { return };
            assert_eq!(opened.stream_id, preamble.stream_id());
            let count = opened.header.record_count;
            let (plain_whole, end_whole) = body(opened.opener, &[rest]);
            let again = envelope::open_job(&preamble, fixed::fleet_secret(), claimed).expect("opens twice");
            let (plain_split, end_split) = body(again.opener, &pieces(rest));
            assert_eq!(end_whole, end_split, "the STREAM verdict depends on how the bytes arrived");
            if end_whole.is_ok() {
                assert_eq!(plain_whole, plain_split);
                let _ = records::check_inputs(&plain_whole, Some(count));
            }
        }
        StreamKind::JobResult => {
            if let Ok(header) = ResultHeader::from_bytes(&preamble.header) {
                assert_eq!(header.to_bytes(), preamble.header, "the result header has a second encoding");
            }
            let Ok(opened) = envelope::open_result(&preamble, fixed::result_secret(), None) else { return };
            let (plain_whole, end_whole) = body(opened.opener, &[rest]);
            let again = envelope::open_result(&preamble, fixed::result_secret(), None).expect("opens twice");
            let (plain_split, end_split) = body(again.opener, &pieces(rest));
            assert_eq!(end_whole, end_split, "the STREAM verdict depends on how the bytes arrived");
            if end_whole.is_ok() {
                assert_eq!(plain_whole, plain_split);
                let _ = records::check_outputs(&plain_whole, None);
            }
        }
    }
});
