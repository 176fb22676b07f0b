//! [`AwsKms`]: the pipeline's KMS operations on AWS KMS.
//!
//! `Recipient` is passed through exactly as the enclave built it (`RSAES_OAEP_SHA_256` and the
//! attestation document); KMS checks the document and the key policy's
//! `kms:RecipientAttestation:*` conditions and answers with `CiphertextForRecipient`. An answer
//! to a `Recipient` request that carries plaintext instead is refused here, never passed on: a
//! host must not see plaintext, and only an emulator that ignores `Recipient` answers that way.

use aws_sdk_kms::config::http::HttpResponse;
use aws_sdk_kms::config::SharedCredentialsProvider;
use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{DataKeyPairSpec, DataKeySpec, KeyEncryptionMechanism, MessageType, RecipientInfo, SigningAlgorithmSpec};
use zeroize::Zeroizing;

use super::error::Failure;
use super::runtime::AwsRuntime;
use cloud::kms::{
    ed25519_from_spki, AwsCredentials, DataKey, DataKeyPair, Decrypted, EncryptionContext, GrantSummary, KeyDescription, KeyEvidence,
    KeyMetadata, Kms, KmsError, Recipient,
};

/// AWS KMS. Cheap to clone.
#[derive(Clone)]
pub struct AwsKms {
    client: aws_sdk_kms::Client,
    /// The SDK chain's credentials, handed to enclaves for their own calls.
    credentials: Option<SharedCredentialsProvider>,
    runtime: AwsRuntime,
}

impl std::fmt::Debug for AwsKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AwsKms")
    }
}

fn context_map(context: &EncryptionContext) -> Option<std::collections::HashMap<String, String>> {
    (!context.is_empty()).then(|| context.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn recipient_info(recipient: Option<&Recipient>) -> Option<RecipientInfo> {
    recipient.map(|r| {
        RecipientInfo::builder()
            .key_encryption_algorithm(KeyEncryptionMechanism::RsaesOaepSha256)
            .attestation_document(Blob::new(r.attestation_document.clone()))
            .build()
    })
}

/// What an answer releases: the plaintext, or the ciphertext for the recipient.
type Released = (Option<Zeroizing<Vec<u8>>>, Option<Vec<u8>>);

/// The plaintext and the recipient ciphertext of an answer, checked against the request.
fn release(
    op: &str,
    recipient: Option<&Recipient>,
    plaintext: Option<Blob>,
    for_recipient: Option<Blob>,
) -> Result<Released, KmsError> {
    let plaintext = plaintext.map(|b| Zeroizing::new(b.into_inner()));
    match (recipient, for_recipient) {
        (Some(_), Some(ciphertext)) => Ok((None, Some(ciphertext.into_inner()))),
        (Some(_), None) => Err(KmsError::Validation(format!(
            "KMS {op}: the answer to a Recipient request has no CiphertextForRecipient{} — refused, \
             so that no plaintext reaches the host (an emulator that ignores Recipient answers this way)",
            if plaintext.is_some() { " but plaintext" } else { "" }
        ))),
        (None, _) => Ok((plaintext, None)),
    }
}

impl AwsKms {
    pub fn new(client: aws_sdk_kms::Client, credentials: Option<SharedCredentialsProvider>, runtime: AwsRuntime) -> AwsKms {
        AwsKms { client, credentials, runtime }
    }

    /// One `DescribeKey` and the `GetKeyPolicy` of the key it resolved, named by its ARN (an
    /// alias could move between the two calls).
    fn metadata_and_policy(&self, key_id: &str) -> Result<(KeyMetadata, String), KmsError> {
        Self::check_key_id("DescribeKey", key_id)?;
        let described = self
            .runtime
            .block_on(self.client.describe_key().key_id(key_id).send())
            .map_err(|e| self.error("DescribeKey", Some(key_id), e))?;
        let metadata = described
            .key_metadata
            .ok_or_else(|| KmsError::Unavailable(format!("KMS DescribeKey {key_id}: no KeyMetadata in the answer")))?;
        let arn = metadata.arn.clone().ok_or_else(|| KmsError::Unavailable(format!("KMS DescribeKey {key_id}: no Arn")))?;
        let policy = self
            .runtime
            .block_on(self.client.get_key_policy().key_id(&arn).policy_name("default").send())
            .map_err(|e| self.error("GetKeyPolicy", Some(&arn), e))?
            .policy
            .ok_or_else(|| KmsError::Unavailable(format!("KMS GetKeyPolicy {arn}: no Policy in the answer")))?;
        let text = |value: Option<&str>| value.unwrap_or_default().to_owned();
        let metadata = KeyMetadata {
            arn,
            key_state: text(metadata.key_state.as_ref().map(|s| s.as_str())),
            enabled: metadata.enabled,
            origin: text(metadata.origin.as_ref().map(|o| o.as_str())),
            key_spec: text(metadata.key_spec.as_ref().map(|k| k.as_str())),
            key_usage: text(metadata.key_usage.as_ref().map(|k| k.as_str())),
            multi_region: metadata.multi_region.unwrap_or(false),
        };
        Ok((metadata, policy))
    }

    fn check_key_id(op: &str, key_id: &str) -> Result<(), KmsError> {
        if key_id.is_empty() {
            return Err(KmsError::Validation(format!(
                "KMS {op}: no key id — the deployment's key is not configured \
                 (FleetKeyArn / ModelKeyArn in the stack outputs, or EPHEM_FLEET_KEY_ARN / EPHEM_MODEL_KEY_ARN)"
            )));
        }
        Ok(())
    }

    fn error<E>(&self, op: &str, key_id: Option<&str>, error: SdkError<E, HttpResponse>) -> KmsError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let failure = Failure::of(&error);
        let key = key_id.unwrap_or("(named by the ciphertext)");
        let message = format!("KMS {op} {key}: {}", failure.message);
        match failure.code.as_str() {
            "NotFoundException" => KmsError::NotFound { key_id: key.to_owned() },
            "AccessDeniedException" => KmsError::AccessDenied(message),
            "InvalidCiphertextException" | "IncorrectKeyException" => KmsError::InvalidCiphertext(message),
            "DisabledException" | "KMSInvalidStateException" => KmsError::Disabled { key_id: key.to_owned() },
            _ if failure.status_is(403) => KmsError::AccessDenied(message),
            _ if failure.transient => KmsError::Unavailable(message),
            _ => KmsError::Validation(message),
        }
    }
}

impl Kms for AwsKms {
    /// The credentials of the SDK's chain (on a host, the instance role's, from IMDS) and the
    /// client's region: the enclave calls `kms.<region>.amazonaws.com` itself through the
    /// host's `vsock-proxy`.
    fn enclave_access(&self) -> Result<AwsCredentials, KmsError> {
        use aws_sdk_kms::config::ProvideCredentials;
        let config = self.client.config();
        let region = config.region().ok_or_else(|| KmsError::Validation("no AWS region for KMS".into()))?.to_string();
        let provider = self
            .credentials
            .as_ref()
            .ok_or_else(|| KmsError::AccessDenied("no AWS credentials to give the enclave".into()))?;
        let credentials = self
            .runtime
            .block_on(provider.provide_credentials())
            .map_err(|e| KmsError::AccessDenied(format!("AWS credentials for the enclave: {e}")))?;
        Ok(AwsCredentials {
            region,
            access_key_id: credentials.access_key_id().to_owned(),
            secret_access_key: Zeroizing::new(credentials.secret_access_key().to_owned()),
            session_token: credentials.session_token().map(str::to_owned),
        })
    }

    fn encrypt(&self, key_id: &str, plaintext: &[u8], context: &EncryptionContext) -> Result<Vec<u8>, KmsError> {
        Self::check_key_id("Encrypt", key_id)?;
        let request = self
            .client
            .encrypt()
            .key_id(key_id)
            .plaintext(Blob::new(plaintext.to_vec()))
            .set_encryption_context(context_map(context));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("Encrypt", Some(key_id), e))?;
        output.ciphertext_blob.map(Blob::into_inner).ok_or_else(|| KmsError::Unavailable(format!("KMS Encrypt {key_id}: no ciphertext in the answer")))
    }

    fn generate_data_key(&self, key_id: &str, context: &EncryptionContext, recipient: Option<&Recipient>) -> Result<DataKey, KmsError> {
        Self::check_key_id("GenerateDataKey", key_id)?;
        let request = self
            .client
            .generate_data_key()
            .key_id(key_id)
            .key_spec(DataKeySpec::Aes256)
            .set_encryption_context(context_map(context))
            .set_recipient(recipient_info(recipient));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("GenerateDataKey", Some(key_id), e))?;
        let (plaintext, ciphertext_for_recipient) =
            release("GenerateDataKey", recipient, output.plaintext, output.ciphertext_for_recipient)?;
        Ok(DataKey {
            key_id: output.key_id.unwrap_or_else(|| key_id.to_owned()),
            ciphertext_blob: output.ciphertext_blob.map(Blob::into_inner).unwrap_or_default(),
            plaintext,
            ciphertext_for_recipient,
        })
    }

    fn generate_data_key_pair_without_plaintext(&self, key_id: &str, context: &EncryptionContext) -> Result<DataKeyPair, KmsError> {
        let op = "GenerateDataKeyPairWithoutPlaintext";
        Self::check_key_id(op, key_id)?;
        let request = self
            .client
            .generate_data_key_pair_without_plaintext()
            .key_id(key_id)
            .key_pair_spec(DataKeyPairSpec::EccNistP256)
            .set_encryption_context(context_map(context));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error(op, Some(key_id), e))?;
        let missing = |what: &str| KmsError::Unavailable(format!("KMS {op} {key_id}: no {what} in the answer"));
        Ok(DataKeyPair {
            key_id: output.key_id.unwrap_or_else(|| key_id.to_owned()),
            public_key_der: output.public_key.map(Blob::into_inner).ok_or_else(|| missing("PublicKey"))?,
            private_key_ciphertext_blob: output.private_key_ciphertext_blob.map(Blob::into_inner).ok_or_else(|| missing("PrivateKeyCiphertextBlob"))?,
        })
    }

    fn decrypt(
        &self,
        key_id: Option<&str>,
        ciphertext_blob: &[u8],
        context: &EncryptionContext,
        recipient: Option<&Recipient>,
    ) -> Result<Decrypted, KmsError> {
        let request = self
            .client
            .decrypt()
            .set_key_id(key_id.map(str::to_owned))
            .ciphertext_blob(Blob::new(ciphertext_blob.to_vec()))
            .set_encryption_context(context_map(context))
            .set_recipient(recipient_info(recipient));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("Decrypt", key_id, e))?;
        let (plaintext, ciphertext_for_recipient) = release("Decrypt", recipient, output.plaintext, output.ciphertext_for_recipient)?;
        Ok(Decrypted { key_id: output.key_id.unwrap_or_default(), plaintext, ciphertext_for_recipient })
    }

    fn describe_key(&self, key_id: &str) -> Result<KeyDescription, KmsError> {
        let (m, policy) = self.metadata_and_policy(key_id)?;
        Ok(KeyDescription {
            arn: m.arn,
            origin: m.origin,
            key_spec: m.key_spec,
            key_usage: m.key_usage,
            enabled: m.enabled,
            multi_region: m.multi_region,
            policy,
        })
    }

    fn key_evidence(&self, key_id: &str) -> Result<KeyEvidence, KmsError> {
        let (metadata, policy) = self.metadata_and_policy(key_id)?;
        let listed = self
            .runtime
            .block_on(self.client.list_grants().key_id(&metadata.arn).send())
            .map_err(|e| self.error("ListGrants", Some(&metadata.arn), e))?;
        let grants = listed
            .grants
            .unwrap_or_default()
            .into_iter()
            .map(|g| GrantSummary {
                grant_id: g.grant_id.unwrap_or_default(),
                grantee_principal: g.grantee_principal.unwrap_or_default(),
                operations: g.operations.unwrap_or_default().iter().map(|o| o.as_str().to_owned()).collect(),
            })
            .collect();
        Ok(KeyEvidence { metadata, policy, grants, grants_truncated: listed.truncated })
    }

    fn ed25519_public_key(&self, key_id: &str) -> Result<[u8; 32], KmsError> {
        Self::check_key_id("GetPublicKey", key_id)?;
        let output = self
            .runtime
            .block_on(self.client.get_public_key().key_id(key_id).send())
            .map_err(|e| self.error("GetPublicKey", Some(key_id), e))?;
        let der = output.public_key.map(Blob::into_inner).unwrap_or_default();
        ed25519_from_spki(&der)
            .ok_or_else(|| KmsError::Validation(format!("KMS key {key_id} is not an Ed25519 key (ECC_NIST_EDWARDS25519)")))
    }

    fn sign_ed25519(&self, key_id: &str, message: &[u8]) -> Result<Vec<u8>, KmsError> {
        Self::check_key_id("Sign", key_id)?;
        let request = self
            .client
            .sign()
            .key_id(key_id)
            .message(Blob::new(message.to_vec()))
            .message_type(MessageType::Raw)
            .signing_algorithm(SigningAlgorithmSpec::from("ED25519_SHA_512"));
        let output = self.runtime.block_on(request.send()).map_err(|e| self.error("Sign", Some(key_id), e))?;
        output.signature.map(Blob::into_inner).ok_or_else(|| KmsError::Unavailable(format!("KMS Sign {key_id}: no Signature in the answer")))
    }
}
