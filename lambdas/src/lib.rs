#![forbid(unsafe_code)]
//! Lambda handlers as library functions (on-upload, ledger-append, bulk workflow steps), each with a thin lambda_runtime binary.
