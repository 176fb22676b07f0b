#![forbid(unsafe_code)]
//! The library half of `ephem-batch`: reading corpora, writing results, onboarding models.

pub mod corpus;
pub mod model;
pub mod output;
