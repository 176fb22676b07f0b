//! Records, the plaintext of a sealed stream: arbitrary bytes decoded as job input records (the
//! enclave's side) and as job result records (the client's side). Checks (ephem_fuzz::records):
//! one verdict however the bytes are pushed, and decoded records re-encode to exactly their bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let expected = data.first().map(|b| u64::from(b & 3));
    let _ = ephem_fuzz::records::check_inputs(data, expected);
    let _ = ephem_fuzz::records::check_outputs(data, None);
});
