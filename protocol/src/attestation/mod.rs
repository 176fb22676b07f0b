//! Nitro attestation documents: parsing, verification, policy, key binding, development issuer.
//!
//! One module per job:
//! - [`cbor`]: a strict CBOR reader/writer (definite lengths, no duplicate keys, depth limit);
//! - [`document`]: the COSE_Sign1 envelope and the Nitro payload schema (checks `cbor`,
//!   `cose_structure`, `alg_es384`);
//! - `x509` (private): certificate parsing, chain links, CA constraints, validity;
//! - [`roots`]: the compiled-in AWS Nitro Enclaves root G1 and other trust anchors;
//! - [`verify`](mod@verify): the verifier that runs every check in order and reports each by name;
//! - [`check`]: check names, the report, the verified document;
//! - [`error`]: one error enum per check;
//! - [`binding`]: the `user_data` key binding;
//! - [`policy`]: the publisher-signed policy file;
//! - [`policy_set`]: the verified allow-list of policies a receipt check admits;
//! - `dev_issuer` (feature `dev-issuer`): the development CA that signs documents of the real shape;
//! - `vectors` (feature `dev-issuer`): known-answer vectors quoted by the protocol documentation.
//!
//! Pure code: no I/O, no clock (callers pass "now"), no panics on any input.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic))]

pub mod binding;
pub mod cbor;
pub mod check;
#[cfg(feature = "dev-issuer")]
pub mod dev_issuer;
pub mod document;
pub mod genesis;
pub mod error;
pub mod policy;
pub mod policy_set;
pub mod roots;
#[cfg(feature = "dev-issuer")]
pub mod vectors;
pub mod verify;
mod x509;

pub use binding::{BindingError, UserDataBinding};
pub use check::{Check, CheckName, Report, RootInfo, VerifiedDocument};
#[cfg(feature = "dev-issuer")]
pub use dev_issuer::{DevIssuer, DevIssuerError, DevIssuerKeys, DevTlsIdentity, DocumentRequest};
pub use document::AttestationDocument;
pub use genesis::{GenesisBinding, GenesisError, check_epoch_lifetime, check_genesis};
pub use error::AttestationError;
pub use policy::{Policy, PolicyError, SignedPolicy};
pub use policy_set::{AllowedPolicy, PolicyId, PolicySet, PolicySetError, policy_id};
pub use roots::{RootKind, TrustAnchor, TrustAnchorError};
pub use verify::{VerifyOptions, verify, verify_report};
pub use x509::format_ms;
