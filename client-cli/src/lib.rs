#![forbid(unsafe_code)]
//! The library half of `ephem-batch` (the binary, in the `ephem-batch` crate, is a thin shell
//! over it and the embedded default's `devstack`).

pub mod attest;
pub mod backend;
pub mod bulk;
pub mod fleet_key;
pub mod flows;
pub mod home;
pub mod jobstate;
pub mod keys;
pub mod ledger;
pub mod model;
pub mod model_choice;
pub mod model_cli;
pub mod opening;
pub mod policy;
pub mod progress;
pub mod ranges;
pub mod record_proof;
pub mod results;
pub mod serve;
pub mod status;
pub mod submit;
pub mod trust;
pub mod usage_log;
pub mod verify;
pub mod wait;
pub mod witness_args;

// The batch formats are their own crate (the fuzz targets build it alone); the client's modules
// name them as before.
pub use batch_formats::{corpus, output};
