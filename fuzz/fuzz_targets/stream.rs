//! The STREAM layer alone: arbitrary bytes as a sealed stream under a fixed key and stream id
//! (the seeds are valid streams, so mutations reach truncation, reordering, splicing and the
//! failure diagnosis). Checks: the verdict and plaintext do not depend on how the bytes were
//! pushed, and an accepted stream is exactly what sealing its plaintext produces.
#![no_main]

use ephem_fuzz::{fixed, pieces};
use libfuzzer_sys::fuzz_target;
use protocol::stream::{StreamError, StreamOpener, StreamSealer};

fn open(parts: &[&[u8]]) -> Result<Vec<u8>, StreamError> {
    let mut opener = StreamOpener::new(&fixed::stream_key(), fixed::stream_id());
    let mut out = Vec::new();
    for part in parts {
        opener.push(part, &mut out)?;
    }
    opener.finish(&mut out)?;
    // A finished opener takes nothing more.
    assert_eq!(opener.push(b"x", &mut Vec::new()), Err(StreamError::Poisoned));
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let whole = open(&[data]);
    assert_eq!(whole, open(&pieces(data)), "the verdict depends on how the bytes were pushed");
    if let Ok(plaintext) = whole {
        let mut sealer = StreamSealer::new(&fixed::stream_key(), fixed::stream_id());
        let mut again = Vec::new();
        sealer.push(&plaintext, &mut again).expect("seal");
        sealer.finish(&mut again).expect("seal");
        assert_eq!(again, data, "an accepted stream is not the canonical sealing of its plaintext");
    }
});
