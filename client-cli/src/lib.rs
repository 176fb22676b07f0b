#![forbid(unsafe_code)]
//! The library half of `ephem-batch`: reading corpora, writing results, onboarding models.

pub mod corpus;
pub mod ledger;
pub mod model;
pub mod output;
