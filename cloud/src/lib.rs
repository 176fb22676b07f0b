#![forbid(unsafe_code)]
//! The only code that talks to AWS: S3, SQS, KMS and Step Functions adapters behind small traits, plus the local stand-ins of the embedded default.
