//! Decoding a record stream (the plaintext of a sealed input or result) the way the enclave and
//! the client do, with the checks every target that reaches records applies: pushing the bytes in
//! pieces gives the same records and the same verdict as one push, and re-encoding the decoded
//! records gives back exactly the bytes they were decoded from (one encoding per record).

use protocol::records::{
    encode_input, encode_output, InputDecoder, InputRecord, OutputDecoder, OutputRecord, RecordError, MAX_TEXT_LEN,
};

/// What decoding a whole stream gave: the records read before the verdict, and the verdict.
pub type Outcome<R> = (Vec<R>, Result<u64, RecordError>);

// Decoder<R> is generic over a private trait: one function per record kind.
macro_rules! run {
    ($name:ident, $decoder:ty, $record:ty) => {
        fn $name(parts: &[&[u8]], expected: Option<u64>) -> Outcome<$record> {
            let mut decoder = <$decoder>::new();
            let mut records = Vec::new();
            for part in parts {
                decoder.push(part);
                loop {
                    match decoder.next_record() {
                        Ok(Some(record)) => records.push(record),
                        Ok(None) => break,
                        Err(e) => return (records, Err(e)),
                    }
                }
            }
            let verdict = decoder.finish(expected);
            (records, verdict)
        }
    };
}

run!(run_inputs, InputDecoder, InputRecord);
run!(run_outputs, OutputDecoder, OutputRecord);

/// Decodes job input records; asserts the properties above. `expected`: the header's count.
pub fn check_inputs(plaintext: &[u8], expected: Option<u64>) -> Outcome<InputRecord> {
    let whole = run_inputs(&[plaintext], expected);
    let split = run_inputs(&crate::pieces(plaintext), expected);
    assert_eq!(whole, split, "input records depend on how the bytes were pushed");
    // encode_input refuses texts the enclave reports per record (between MAX_TEXT_LEN and the
    // wire limit); those cannot be re-encoded.
    if whole.0.iter().all(|r| r.text.len() <= MAX_TEXT_LEN) {
        let mut again = Vec::new();
        for record in &whole.0 {
            encode_input(record, &mut again).expect("a decoded input record re-encodes");
        }
        assert_eq!(&plaintext[..again.len()], again.as_slice(), "input records have a second encoding");
        if whole.1.is_ok() {
            assert_eq!(again.len(), plaintext.len());
        }
    }
    whole
}

/// Decodes job result records; asserts the properties above.
pub fn check_outputs(plaintext: &[u8], expected: Option<u64>) -> Outcome<OutputRecord> {
    let whole = run_outputs(&[plaintext], expected);
    let split = run_outputs(&crate::pieces(plaintext), expected);
    // Vectors may hold NaNs (never equal to themselves): compare the encodings instead.
    assert_eq!(whole.1, split.1, "output verdict depends on how the bytes were pushed");
    let encode = |records: &[OutputRecord]| {
        let mut out = Vec::new();
        for record in records {
            encode_output(record, &mut out).expect("a decoded output record re-encodes");
        }
        out
    };
    let again = encode(&whole.0);
    assert_eq!(again, encode(&split.0), "output records depend on how the bytes were pushed");
    assert_eq!(&plaintext[..again.len()], again.as_slice(), "output records have a second encoding");
    if whole.1.is_ok() {
        assert_eq!(again.len(), plaintext.len());
    }
    whole
}
