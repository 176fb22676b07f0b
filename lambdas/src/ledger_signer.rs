//! The key that signs the ledger's checkpoints in a deployment: the KMS Ed25519 key
//! (`EPHEM_LEDGER_KEY_ARN`, `Sign` with `ED25519_SHA_512` over the raw note text), or, for an
//! emulator without Ed25519 KMS keys (moto), a note key string in `EPHEM_LEDGER_SIGNING_KEY`.
//!
//! The key's name is the checkpoints' origin: `EPHEM_LEDGER_ORIGIN`, by default
//! `<ledger bucket>.s3.<region>.amazonaws.com` (tlog-tiles: the log's URL without scheme). It
//! is part of the key id auditors pin, so it never changes for a ledger.

use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{MessageType, SigningAlgorithmSpec};
use cloud::aws::AwsClients;
use receipts_ledger::{NoteSigner, RemoteSigner, SignerKey};

use crate::shell::{self, ShellError};

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the key's 32 bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// The checkpoint origin of the ledger in `bucket`.
pub fn origin(bucket: &str, region: &str) -> String {
    shell::optional("EPHEM_LEDGER_ORIGIN").unwrap_or_else(|| format!("{bucket}.s3.{region}.amazonaws.com"))
}

/// The signer the environment names.
pub fn from_env(clients: &AwsClients, bucket: &str) -> Result<Box<dyn NoteSigner>, ShellError> {
    if let Some(text) = shell::optional("EPHEM_LEDGER_SIGNING_KEY") {
        tracing::warn!("checkpoints are signed with EPHEM_LEDGER_SIGNING_KEY, a key outside KMS: development only");
        let key = SignerKey::parse(text.trim())
            .map_err(|e| ShellError::Invalid { name: "EPHEM_LEDGER_SIGNING_KEY", message: e.to_string() })?;
        return Ok(Box::new(key));
    }
    let arn = shell::var("EPHEM_LEDGER_KEY_ARN")?;
    Ok(Box::new(kms_signer(clients, &arn, &origin(bucket, clients.region()))?))
}

/// A signer over the KMS key `arn`.
pub fn kms_signer(clients: &AwsClients, arn: &str, name: &str) -> Result<RemoteSigner, ShellError> {
    let kms = clients.kms.clone();
    let answer = clients
        .runtime
        .block_on(kms.get_public_key().key_id(arn).send())
        .map_err(|e| ShellError::Setup(format!("KMS GetPublicKey {arn}: {}", aws_sdk_kms::error::DisplayErrorContext(&e))))?;
    let der = answer.public_key().map(|b| b.as_ref().to_vec()).unwrap_or_default();
    let public: [u8; 32] = der
        .strip_prefix(&ED25519_SPKI_PREFIX[..])
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| ShellError::Setup(format!("KMS key {arn} is not an Ed25519 key (ECC_NIST_EDWARDS25519)")))?;
    let runtime = clients.runtime.clone();
    let arn_owned = arn.to_owned();
    let sign = move |message: &[u8]| -> Result<Vec<u8>, String> {
        let request = kms
            .sign()
            .key_id(&arn_owned)
            .message(Blob::new(message))
            .message_type(MessageType::Raw)
            .signing_algorithm(SigningAlgorithmSpec::from("ED25519_SHA_512"));
        let answer = runtime
            .block_on(request.send())
            .map_err(|e| format!("KMS Sign: {}", aws_sdk_kms::error::DisplayErrorContext(&e)))?;
        Ok(answer.signature().map(|b| b.as_ref().to_vec()).unwrap_or_default())
    };
    RemoteSigner::new(name, &public, Box::new(sign)).map_err(|e| ShellError::Setup(format!("ledger key name {name:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spki_prefix_is_rfc_8410s() {
        use ed25519_dalek::pkcs8::EncodePublicKey;
        let key = ed25519_dalek::SigningKey::from_bytes(&[1; 32]).verifying_key();
        let der = key.to_public_key_der().unwrap();
        assert_eq!(&der.as_bytes()[..12], &ED25519_SPKI_PREFIX);
        assert_eq!(&der.as_bytes()[12..], key.as_bytes());
    }
}
