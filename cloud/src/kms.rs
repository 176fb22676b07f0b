//! The KMS operations the pipeline uses, with KMS's semantics. Key release to enclaves goes
//! through `Recipient`: the caller passes an attestation document, KMS checks it (and the key
//! policy's `kms:RecipientAttestation:*` conditions) and returns the plaintext only inside a
//! CMS envelope to the document's RSA key (`CiphertextForRecipient`), never in the clear.

use std::collections::BTreeMap;

pub use protocol::key_checks::{GrantSummary, KeyEvidence, KeyMetadata};
pub use protocol::kms_api::AwsCredentials;
use zeroize::Zeroizing;

/// KMS `Recipient`: the key algorithm is always RSAES_OAEP_SHA_256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    pub attestation_document: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum KmsError {
    #[error("KMS key {key_id} not found")]
    NotFound { key_id: String },
    /// The key policy refused the call (e.g. no or wrong attestation).
    #[error("KMS access denied: {0}")]
    AccessDenied(String),
    /// The ciphertext is damaged, belongs to another key, or the encryption context differs.
    #[error("KMS could not decrypt: {0}")]
    InvalidCiphertext(String),
    #[error("KMS refused the request: {0}")]
    Validation(String),
    #[error("KMS key {key_id} is disabled")]
    Disabled { key_id: String },
    #[error("KMS unavailable: {0}")]
    Unavailable(String),
}

impl KmsError {
    /// The AWS exception name, as the host relays it to the enclave.
    pub fn code(&self) -> &'static str {
        match self {
            KmsError::NotFound { .. } => "NotFoundException",
            KmsError::AccessDenied(_) => "AccessDeniedException",
            KmsError::InvalidCiphertext(_) => "InvalidCiphertextException",
            KmsError::Validation(_) => "ValidationException",
            KmsError::Disabled { .. } => "DisabledException",
            KmsError::Unavailable(_) => "KMSInternalException",
        }
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, KmsError::Unavailable(_))
    }
}

pub type EncryptionContext = BTreeMap<String, String>;

/// `GenerateDataKeyPairWithoutPlaintext` (key pair spec ECC_NIST_P256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataKeyPair {
    pub key_id: String,
    /// DER SubjectPublicKeyInfo.
    pub public_key_der: Vec<u8>,
    /// The wrapped DER PKCS#8 private key.
    pub private_key_ciphertext_blob: Vec<u8>,
}

/// `GenerateDataKey` (AES_256).
#[derive(Debug)]
pub struct DataKey {
    pub key_id: String,
    pub ciphertext_blob: Vec<u8>,
    /// Absent when the call carried a `Recipient`.
    pub plaintext: Option<Zeroizing<Vec<u8>>>,
    /// Present when the call carried a `Recipient`.
    pub ciphertext_for_recipient: Option<Vec<u8>>,
}

/// `DescribeKey` and `GetKeyPolicy` of one key: what a client checks before it trusts the key
/// to release only to attested enclaves (`ephem-batch fleet check-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDescription {
    /// The key's ARN, as KMS names it.
    pub arn: String,
    /// `AWS_KMS` (KMS made the material), `EXTERNAL` (imported), `AWS_CLOUDHSM`, `EXTERNAL_KEY_STORE`.
    pub origin: String,
    /// e.g. `SYMMETRIC_DEFAULT`.
    pub key_spec: String,
    /// e.g. `ENCRYPT_DECRYPT`.
    pub key_usage: String,
    pub enabled: bool,
    /// A multi-Region key can be replicated with the same material under another policy.
    pub multi_region: bool,
    /// The key policy, an IAM policy document (JSON).
    pub policy: String,
}

/// `GenerateDataKeyPair` (ECC_NIST_P256) with a `Recipient`: the private key only in a CMS
/// envelope to the attested enclave's one-shot key, and wrapped under the KMS key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataKeyPairForRecipient {
    pub key_id: String,
    /// DER SubjectPublicKeyInfo.
    pub public_key_der: Vec<u8>,
    /// The wrapped DER PKCS#8 private key.
    pub private_key_ciphertext_blob: Vec<u8>,
    pub ciphertext_for_recipient: Vec<u8>,
}

/// `Decrypt`.
#[derive(Debug)]
pub struct Decrypted {
    pub key_id: String,
    /// Absent when the call carried a `Recipient`.
    pub plaintext: Option<Zeroizing<Vec<u8>>>,
    /// Present when the call carried a `Recipient`.
    pub ciphertext_for_recipient: Option<Vec<u8>>,
}

pub trait Kms: Send + Sync {
    /// The region and credentials an enclave signs its own `Decrypt` calls with.
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError>;
    fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError>;
    fn generate_data_key(
        &self,
        key_id: &str,
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<DataKey, KmsError>;
    fn generate_data_key_pair_without_plaintext(
        &self,
        key_id: &str,
        context: &EncryptionContext,
    ) -> Result<DataKeyPair, KmsError>;
    /// `key_id` may be `None`: symmetric ciphertext names its key.
    fn decrypt(
        &self,
        key_id: Option<&str>,
        ciphertext_blob: &[u8],
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError>;
    /// The key's ARN, metadata and policy (`key_id` may be an alias). Adapters that cannot show
    /// a policy refuse: the caller must not take silence for a good policy.
    fn describe_key(&self, key_id: &str) -> Result<KeyDescription, KmsError> {
        Err(KmsError::Validation(format!("this KMS cannot describe key {key_id}")))
    }
    /// `DescribeKey`, `GetKeyPolicy` and `ListGrants` of one key, as the key checks read them
    /// (`protocol::key_checks`). Adapters that cannot read all three refuse.
    fn key_evidence(&self, key_id: &str) -> Result<KeyEvidence, KmsError> {
        Err(KmsError::Validation(format!("this KMS cannot read the policy and grants of key {key_id}")))
    }
    /// `GenerateDataKeyPair` (ECC_NIST_P256) for an attested enclave; adapters that cannot
    /// release to a recipient refuse.
    fn generate_data_key_pair_for_recipient(
        &self,
        key_id: &str,
        context: &EncryptionContext,
        recipient: &Recipient,
    ) -> Result<DataKeyPairForRecipient, KmsError> {
        let _ = (context, recipient);
        Err(KmsError::Validation(format!("this KMS cannot release a key pair of {key_id} to an enclave")))
    }
    /// `GetPublicKey` of an Ed25519 key (`ECC_NIST_EDWARDS25519`): its 32 raw bytes. The ledger
    /// signs checkpoints with such a key; adapters without one refuse.
    fn ed25519_public_key(&self, key_id: &str) -> Result<[u8; 32], KmsError> {
        Err(KmsError::Validation(format!("this KMS has no Ed25519 key {key_id}")))
    }
    /// `Sign` with `ED25519_SHA_512` over the raw `message`: a 64-byte signature.
    fn sign_ed25519(&self, key_id: &str, message: &[u8]) -> Result<Vec<u8>, KmsError> {
        let _ = message;
        Err(KmsError::Validation(format!("this KMS has no Ed25519 key {key_id}")))
    }
}

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the key's 32 bytes follow.
pub const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// The raw key of an Ed25519 SubjectPublicKeyInfo (what `GetPublicKey` answers), or `None` for
/// any other key.
pub fn ed25519_from_spki(der: &[u8]) -> Option<[u8; 32]> {
    der.strip_prefix(&ED25519_SPKI_PREFIX[..]).and_then(|k| k.try_into().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spki_prefix_is_rfc_8410s() {
        use ed25519_dalek::pkcs8::EncodePublicKey;
        let key = ed25519_dalek::SigningKey::from_bytes(&[1; 32]).verifying_key();
        let der = key.to_public_key_der().unwrap();
        assert_eq!(ed25519_from_spki(der.as_bytes()), Some(*key.as_bytes()));
        assert_eq!(ed25519_from_spki(&der.as_bytes()[..43]), None, "a short key");
        let mut p256 = der.as_bytes().to_vec();
        p256[8] = 0x71;
        assert_eq!(ed25519_from_spki(&p256), None, "another algorithm");
    }
}
