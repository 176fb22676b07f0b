#![forbid(unsafe_code)]
//! The untrusted relay on each host: polls the job queue, streams sealed objects into and out of the enclave, proxies its KMS and object reads.
