//! The key that signs the ledger's checkpoints in a deployment: the KMS Ed25519 key
//! (`EPHEM_LEDGER_KEY_ARN`, `Sign` with `ED25519_SHA_512` over the raw note text), or, for an
//! emulator without Ed25519 KMS keys (moto), a note key string in `EPHEM_LEDGER_SIGNING_KEY`.
//!
//! The key's name is the checkpoints' origin: `EPHEM_LEDGER_ORIGIN`, by default
//! `<ledger bucket>.s3.<region>.amazonaws.com` (tlog-tiles: the log's URL without scheme). It
//! is part of the key id auditors pin, so it never changes for a ledger.

use std::sync::Arc;

use cloud::Kms;
use receipts_ledger::{NoteSigner, RemoteSigner, SignerKey};

use crate::shell::{self, ShellError};

/// The checkpoint origin of the ledger in `bucket`.
pub fn origin(bucket: &str, region: &str) -> String {
    shell::optional("EPHEM_LEDGER_ORIGIN").unwrap_or_else(|| format!("{bucket}.s3.{region}.amazonaws.com"))
}

/// The signer the environment names, over the deployment's KMS.
pub fn from_env(kms: Arc<dyn Kms>, bucket: &str, region: &str) -> Result<Box<dyn NoteSigner>, ShellError> {
    if let Some(text) = shell::optional("EPHEM_LEDGER_SIGNING_KEY") {
        tracing::warn!("checkpoints are signed with EPHEM_LEDGER_SIGNING_KEY, a key outside KMS: development only");
        let key = SignerKey::parse(text.trim())
            .map_err(|e| ShellError::Invalid { name: "EPHEM_LEDGER_SIGNING_KEY", message: e.to_string() })?;
        return Ok(Box::new(key));
    }
    let arn = shell::var("EPHEM_LEDGER_KEY_ARN")?;
    Ok(Box::new(kms_signer(kms, &arn, &origin(bucket, region))?))
}

/// A signer over the KMS Ed25519 key `arn` (`GetPublicKey` once, `Sign` per checkpoint).
pub fn kms_signer(kms: Arc<dyn Kms>, arn: &str, name: &str) -> Result<RemoteSigner, ShellError> {
    let public = kms.ed25519_public_key(arn).map_err(|e| ShellError::Setup(format!("ledger key {arn}: {e}")))?;
    let arn_owned = arn.to_owned();
    let sign = move |message: &[u8]| -> Result<Vec<u8>, String> { kms.sign_ed25519(&arn_owned, message).map_err(|e| e.to_string()) };
    RemoteSigner::new(name, &public, Box::new(sign)).map_err(|e| ShellError::Setup(format!("ledger key name {name:?}: {e}")))
}
