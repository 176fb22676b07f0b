#![forbid(unsafe_code)]
//! ephem-batch formats and cryptography: pure functions, no I/O.
