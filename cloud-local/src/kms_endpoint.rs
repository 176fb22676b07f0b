//! The local KMS as an HTTPS endpoint that speaks KMS's JSON API, for enclaves.
//!
//! An enclave calls KMS itself, over TLS that ends inside it (`protocol::kms_api`): in AWS
//! through the host's `vsock-proxy` to `kms.<region>.amazonaws.com`; in the embedded default
//! through a Unix socket to this endpoint, which answers as `kms.local.amazonaws.com` with a
//! development certificate. The worker trusts that certificate's root only beside the
//! development NSM, exactly as the local KMS trusts only the development attestation root.
//!
//! ```text
//! <dir>/kms-tls/root.pem      the development root a development worker pins (--kms-tls-root)
//! <dir>/kms-tls/server.pem    the endpoint's certificate (SAN kms.local.amazonaws.com)
//! <dir>/kms-tls/server.key    its PKCS#8 key, mode 0600
//! ```
//!
//! Only `Decrypt` with a `Recipient` is served: that is all an enclave asks. Requests are not
//! checked for SigV4 — the local KMS authorises by the attestation document, as the key policy
//! does in AWS.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::attestation::DevTlsIdentity;
use protocol::kms_api::{
    self, DecryptRequest, DecryptResponse, ErrorResponse, GenerateDataKeyPairRequest, GenerateDataKeyPairResponse, GetKeyPolicyRequest,
    HttpMessage, HttpReadError, KeyIdRequest, RecipientInfo, StartLine,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use cloud::kms::{KeyEvidence, Kms, Recipient};

/// Directory of the TLS identity, under the local KMS's directory.
pub const TLS_DIR: &str = "kms-tls";
/// Largest request read (a `Decrypt` with an attestation document is a few KiB).
const MAX_REQUEST_LEN: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("development TLS identity: {0}")]
    Identity(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// The endpoint: TLS identity plus the KMS it answers for.
pub struct KmsEndpoint {
    tls: Arc<rustls::ServerConfig>,
    kms: Arc<dyn Kms>,
    root_pem: PathBuf,
}

impl KmsEndpoint {
    /// Loads the TLS identity under `dir/kms-tls/`, creating it on first use.
    pub fn open(dir: &Path, kms: Arc<dyn Kms>) -> Result<KmsEndpoint, EndpointError> {
        let tls_dir = dir.join(TLS_DIR);
        let (root_pem, cert_pem, key_pem) = (tls_dir.join("root.pem"), tls_dir.join("server.pem"), tls_dir.join("server.key"));
        if !key_pem.exists() {
            create_identity(&tls_dir)?;
        }
        let pem = |path: &Path| {
            let path = path.display().to_string();
            move |e: rustls::pki_types::pem::Error| EndpointError::Identity(format!("{path}: {e}"))
        };
        let cert = CertificateDer::from_pem_file(&cert_pem).map_err(pem(&cert_pem))?;
        let key = PrivateKeyDer::from_pem_file(&key_pem).map_err(pem(&key_pem))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EndpointError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| EndpointError::Tls(e.to_string()))?;
        Ok(KmsEndpoint { tls: Arc::new(config), kms, root_pem })
    }

    /// The root a development worker pins (`--kms-tls-root`).
    pub fn root_pem(&self) -> &Path {
        &self.root_pem
    }

    /// Serves connections on `socket` (replacing a stale socket file) on a background thread,
    /// one thread per connection.
    pub fn serve_unix(self, socket: &Path) -> Result<std::thread::JoinHandle<()>, EndpointError> {
        let io = |source| EndpointError::Io { path: socket.to_path_buf(), source };
        if socket.exists() {
            std::fs::remove_file(socket).map_err(io)?;
        }
        let listener = UnixListener::bind(socket).map_err(io)?;
        let endpoint = Arc::new(self);
        std::thread::Builder::new()
            .name("kms-endpoint".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    match stream {
                        Ok(stream) => {
                            let endpoint = Arc::clone(&endpoint);
                            std::thread::spawn(move || endpoint.serve_connection(stream));
                        }
                        Err(error) => tracing::warn!(%error, "KMS endpoint: accept failed"),
                    }
                }
            })
            .map_err(io)
    }

    /// One TLS connection, one request.
    pub fn serve_connection(&self, stream: UnixStream) {
        let session = match rustls::ServerConnection::new(Arc::clone(&self.tls)) {
            Ok(session) => session,
            Err(error) => return tracing::warn!(%error, "KMS endpoint: TLS session"),
        };
        let mut tls = rustls::StreamOwned::new(session, stream);
        let (status, body) = match kms_api::read_http_message(&mut tls, true, MAX_REQUEST_LEN) {
            Ok(request) => self.answer(&request),
            // The client may not be an enclave at all (or not trust us): nothing to answer.
            Err(HttpReadError::Io(error)) => return tracing::debug!(%error, "KMS endpoint: connection"),
            Err(HttpReadError::Http(message)) => (400, error_body("SerializationException", &message)),
        };
        let reason = match status {
            200 => "OK",
            500 => "Internal Server Error",
            _ => "Bad Request",
        };
        let head = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            kms_api::CONTENT_TYPE,
            body.len()
        );
        let sent = tls.write_all(head.as_bytes()).and_then(|()| tls.write_all(&body)).and_then(|()| {
            tls.conn.send_close_notify();
            tls.flush()
        });
        if let Err(error) = sent {
            tracing::debug!(%error, "KMS endpoint: answer not delivered");
        }
    }

    fn answer(&self, request: &HttpMessage) -> (u16, Vec<u8>) {
        if request.start != (StartLine::Request { method: "POST".into(), path: "/".into() }) {
            return (400, error_body("UnknownOperationException", "KMS takes POST /"));
        }
        let expected_host = kms_api::endpoint_host(kms_api::LOCAL_REGION).unwrap_or_default();
        if request.header("host") != Some(expected_host.as_str()) {
            return (400, error_body("ValidationException", &format!("this endpoint is {expected_host}")));
        }
        if !request.header("authorization").is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential=")) {
            return (400, error_body("MissingAuthenticationTokenException", "the request is not signed (SigV4)"));
        }
        let answered = match request.header("x-amz-target") {
            Some(kms_api::DECRYPT_TARGET) => self.decrypt(&request.body),
            Some(kms_api::GENERATE_DATA_KEY_PAIR_TARGET) => self.generate_data_key_pair(&request.body),
            Some(kms_api::DESCRIBE_KEY_TARGET) => self.read_key(&request.body, |evidence| {
                let m = &evidence.metadata;
                serde_json::json!({ "KeyMetadata": {
                    "Arn": m.arn, "KeyId": m.arn.rsplit('/').next().unwrap_or_default(), "KeyState": m.key_state,
                    "Enabled": m.enabled, "Origin": m.origin, "KeySpec": m.key_spec, "KeyUsage": m.key_usage,
                    "MultiRegion": m.multi_region,
                }})
            }),
            Some(kms_api::GET_KEY_POLICY_TARGET) => match kms_api::from_json::<GetKeyPolicyRequest>(&request.body) {
                Ok(get) if get.policy_name == "default" => {
                    self.read_key(serde_json::to_vec(&KeyIdRequest { key_id: get.key_id }).unwrap_or_default().as_slice(), |e| {
                        serde_json::json!({ "Policy": e.policy, "PolicyName": "default" })
                    })
                }
                Ok(_) => Err((400, error_body("NotFoundException", "the only key policy is named default"))),
                Err(e) => Err((400, error_body("SerializationException", &e.to_string()))),
            },
            Some(kms_api::LIST_GRANTS_TARGET) => self.read_key(&request.body, |e| {
                let grants: Vec<_> = e
                    .grants
                    .iter()
                    .map(|g| serde_json::json!({
                        "GrantId": g.grant_id, "GranteePrincipal": g.grantee_principal, "Operations": g.operations,
                        "KeyId": e.metadata.arn,
                    }))
                    .collect();
                serde_json::json!({ "Grants": grants, "Truncated": e.grants_truncated })
            }),
            _ => Err((400, error_body("UnknownOperationException", "the local KMS endpoint serves Decrypt, GenerateDataKeyPair, DescribeKey, GetKeyPolicy and ListGrants"))),
        };
        match answered {
            Ok(body) => (200, body),
            Err(failure) => failure,
        }
    }

    fn decrypt(&self, body: &[u8]) -> Result<Vec<u8>, (u16, Vec<u8>)> {
        let decrypt: DecryptRequest = kms_api::from_json(body).map_err(|e| (400, error_body("SerializationException", &e.to_string())))?;
        let recipient = recipient(decrypt.recipient)?;
        let decrypted = self
            .kms
            .decrypt(decrypt.key_id.as_deref(), &decrypt.ciphertext_blob, &decrypt.encryption_context, Some(&recipient))
            .map_err(kms_failure)?;
        let answer = DecryptResponse { key_id: decrypted.key_id, ciphertext_for_recipient: decrypted.ciphertext_for_recipient, plaintext: None };
        Ok(serde_json::to_vec(&answer).unwrap_or_default())
    }

    fn generate_data_key_pair(&self, body: &[u8]) -> Result<Vec<u8>, (u16, Vec<u8>)> {
        let request: GenerateDataKeyPairRequest =
            kms_api::from_json(body).map_err(|e| (400, error_body("SerializationException", &e.to_string())))?;
        if request.key_pair_spec != kms_api::ECC_NIST_P256 {
            return Err((400, error_body("ValidationException", "the local KMS generates ECC_NIST_P256 key pairs only")));
        }
        let recipient = recipient(request.recipient)?;
        let pair = self
            .kms
            .generate_data_key_pair_for_recipient(&request.key_id, &request.encryption_context, &recipient)
            .map_err(kms_failure)?;
        let answer = GenerateDataKeyPairResponse {
            key_id: pair.key_id,
            public_key: pair.public_key_der,
            private_key_ciphertext_blob: pair.private_key_ciphertext_blob,
            ciphertext_for_recipient: Some(pair.ciphertext_for_recipient),
            private_key_plaintext: None,
        };
        Ok(serde_json::to_vec(&answer).unwrap_or_default())
    }

    /// A read of the key's evidence (`DescribeKey`, `GetKeyPolicy`, `ListGrants`), shaped by `shape`.
    fn read_key(&self, body: &[u8], shape: impl FnOnce(&KeyEvidence) -> serde_json::Value) -> Result<Vec<u8>, (u16, Vec<u8>)> {
        let request: KeyIdRequest = kms_api::from_json(body).map_err(|e| (400, error_body("SerializationException", &e.to_string())))?;
        let evidence = self.kms.key_evidence(&request.key_id).map_err(kms_failure)?;
        Ok(shape(&evidence).to_string().into_bytes())
    }
}

/// Only `Recipient` requests are answered: the endpoint never hands plaintext to the caller.
fn recipient(info: Option<RecipientInfo>) -> Result<Recipient, (u16, Vec<u8>)> {
    let info = info.ok_or_else(|| (400, error_body("ValidationException", "the local KMS endpoint answers Recipient requests only")))?;
    if info.key_encryption_algorithm != kms_api::RSAES_OAEP_SHA_256 {
        return Err((400, error_body("ValidationException", "KeyEncryptionAlgorithm must be RSAES_OAEP_SHA_256")));
    }
    Ok(Recipient { attestation_document: info.attestation_document })
}

fn kms_failure(error: cloud::KmsError) -> (u16, Vec<u8>) {
    (if error.is_transient() { 500 } else { 400 }, error_body(error.code(), &error.to_string()))
}

fn error_body(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorResponse { kind: code.to_owned(), message: Some(message.to_owned()) }).unwrap_or_default()
}

fn create_identity(tls_dir: &Path) -> Result<(), EndpointError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EndpointError::Io { path, source }
    };
    std::fs::create_dir_all(tls_dir).map_err(io(tls_dir))?;
    let host = kms_api::endpoint_host(kms_api::LOCAL_REGION).map_err(|e| EndpointError::Identity(e.to_string()))?;
    let identity = DevTlsIdentity::generate(&host, cloud::now_ms()).map_err(|e| EndpointError::Identity(e.to_string()))?;
    let write = |name: &str, text: String, mode: u32| -> Result<(), EndpointError> {
        let path = tls_dir.join(name);
        let partial = tls_dir.join(format!(".{name}.partial"));
        // Created with its final mode: the private key is never readable by others, not even
        // between the write and a chmod. A partial file left by a crash goes first.
        match std::fs::remove_file(&partial) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&partial)(e)),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&partial).map_err(io(&partial))?;
        file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(io(&partial))?;
        std::fs::rename(&partial, &path).map_err(io(&path))
    };
    write("root.pem", to_pem("CERTIFICATE", &identity.root_der)?, 0o644)?;
    write("server.pem", to_pem("CERTIFICATE", &identity.cert_der)?, 0o644)?;
    // Last: its presence means the identity is complete.
    write("server.key", to_pem("PRIVATE KEY", &identity.key_pkcs8_der)?, 0o600)
}

fn to_pem(label: &str, der: &[u8]) -> Result<String, EndpointError> {
    der::pem::encode_string(label, der::pem::LineEnding::LF, der).map_err(|e| EndpointError::Identity(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn identity_is_created_once_and_its_key_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let kms: Arc<dyn Kms> = Arc::new(
            crate::LocalKms::open(
                dir.path().join("kms.sqlite"),
                crate::AttestationTrust {
                    root_pem_path: dir.path().join("root.pem"),
                    max_document_age: std::time::Duration::from_secs(60),
                },
            )
            .unwrap(),
        );
        let first = KmsEndpoint::open(dir.path(), Arc::clone(&kms)).unwrap();
        let root = std::fs::read(first.root_pem()).unwrap();
        let key = dir.path().join(TLS_DIR).join("server.key");
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        KmsEndpoint::open(dir.path(), kms).unwrap();
        assert_eq!(std::fs::read(dir.path().join(TLS_DIR).join("root.pem")).unwrap(), root);
    }
}
