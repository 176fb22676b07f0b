#![forbid(unsafe_code)]
//! The batch formats of `ephem-batch`, with no I/O beyond the files they read and write: the
//! corpus reader ([`corpus`]: `{"id","text"}` JSONL and OpenAI Batch lines, checked line by line
//! into records or named errors), the checks a file passes before it is submitted
//! ([`corpus_file`]) and the result writers ([`output`]: JSONL, OpenAI Batch output, `.npy`, the
//! errors file). Small on purpose: the fuzz targets build it without the client's tree.

pub mod corpus;
pub mod corpus_file;
pub mod output;
