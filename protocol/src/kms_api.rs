//! The part of the AWS KMS JSON API (`application/x-amz-json-1.1`, `X-Amz-Target:
//! TrentService.<Operation>`) that an enclave speaks itself: `Decrypt` with a `Recipient`.
//!
//! The enclave sends this request over TLS that ends inside the enclave, to a host name it
//! derives itself ([`endpoint_host`]); the host only relays bytes. That is what makes KMS's
//! answer authentic: a `CiphertextForRecipient` is a CMS envelope anyone could seal to the
//! enclave's (public) one-shot key, so one that arrives through a host-controlled channel proves
//! nothing. Shared by the worker's client and the embedded default's local KMS endpoint.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::key_checks::{GrantSummary, KeyEvidence, KeyMetadata};
use crate::kms_arn::KmsKeyArn;

/// `X-Amz-Target` of `Decrypt`.
pub const DECRYPT_TARGET: &str = "TrentService.Decrypt";
/// `X-Amz-Target` of `GenerateDataKeyPair` (an epoch's key pair, created by an enclave).
pub const GENERATE_DATA_KEY_PAIR_TARGET: &str = "TrentService.GenerateDataKeyPair";
/// `X-Amz-Target`s of the reads whose answers are a key's evidence (`key_checks`).
pub const DESCRIBE_KEY_TARGET: &str = "TrentService.DescribeKey";
pub const GET_KEY_POLICY_TARGET: &str = "TrentService.GetKeyPolicy";
pub const LIST_GRANTS_TARGET: &str = "TrentService.ListGrants";
/// The only key pair spec of a fleet key.
pub const ECC_NIST_P256: &str = "ECC_NIST_P256";
/// `Content-Type` of every KMS request.
pub const CONTENT_TYPE: &str = "application/x-amz-json-1.1";
/// The only key encryption algorithm KMS offers for a recipient.
pub const RSAES_OAEP_SHA_256: &str = "RSAES_OAEP_SHA_256";
/// SigV4 service name of KMS.
pub const SERVICE: &str = "kms";
/// The region name of the embedded default's local KMS endpoint.
pub const LOCAL_REGION: &str = "local";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KmsApiError {
    #[error("region {0:?} is not a region name (lowercase letters, digits and '-', at most 32)")]
    Region(String),
    #[error("KMS JSON does not decode: {0}")]
    Json(String),
    #[error("KMS answer has no CiphertextForRecipient")]
    NoCiphertextForRecipient,
    #[error("KMS answer carries a plaintext where only a CiphertextForRecipient may be")]
    PlaintextInAnswer,
    #[error("partition {0:?} has no KMS endpoint this enclave knows")]
    Partition(String),
    #[error("the credentials are for region {credentials:?}, but the key {key} is in {key_region:?}: refused before connecting")]
    RegionMismatch { credentials: String, key: String, key_region: String },
}

/// What an enclave signs its own KMS call with: the region that names the endpoint and the
/// host role's credentials. They authorise the call; the host owns them, so they are no secret
/// from the host and prove nothing to the enclave.
#[derive(Clone)]
pub struct AwsCredentials {
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: Zeroizing<String>,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials").field("region", &self.region).field("access_key_id", &self.access_key_id).finish()
    }
}

/// The host name of KMS in `region`: `kms.<region>.amazonaws.com`. The enclave puts exactly this
/// name into TLS (SNI and certificate check) and `Host`, so a host cannot point it at a server
/// of its own with some other publicly trusted certificate.
pub fn endpoint_host(region: &str) -> Result<String, KmsApiError> {
    let valid = !region.is_empty()
        && region.len() <= 32
        && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !region.starts_with('-')
        && !region.ends_with('-');
    if !valid {
        return Err(KmsApiError::Region(region.to_owned()));
    }
    Ok(format!("kms.{region}.amazonaws.com"))
}

/// The KMS host name of the key's own partition and region, never one the host names: the
/// credentials the host supplies must be for that same region, else the call is refused before
/// any connection (a host cannot steer the enclave to another region's KMS, where a key of the
/// same id could mean something else).
pub fn endpoint_host_for_key(key: &KmsKeyArn, credentials_region: &str) -> Result<String, KmsApiError> {
    if credentials_region != key.region() {
        return Err(KmsApiError::RegionMismatch {
            credentials: credentials_region.chars().take(64).collect(),
            key: key.to_string(),
            key_region: key.region().to_owned(),
        });
    }
    let suffix = match key.partition() {
        "aws" | "aws-us-gov" => "amazonaws.com",
        "aws-cn" => "amazonaws.com.cn",
        other => return Err(KmsApiError::Partition(other.to_owned())),
    };
    endpoint_host(key.region())?;
    Ok(format!("kms.{}.{suffix}", key.region()))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RecipientInfo {
    pub key_encryption_algorithm: String,
    #[serde(with = "b64")]
    pub attestation_document: Vec<u8>,
}

/// `Decrypt` request body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DecryptRequest {
    #[serde(with = "b64")]
    pub ciphertext_blob: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub encryption_context: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<RecipientInfo>,
}

/// `Decrypt` response body (the fields the enclave reads; KMS sends more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DecryptResponse {
    pub key_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    pub ciphertext_for_recipient: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    pub plaintext: Option<Vec<u8>>,
}

impl DecryptResponse {
    /// KMS's key id and the envelope for the recipient. With a recipient KMS returns no
    /// plaintext; an answer that does is refused rather than used.
    pub fn into_recipient_answer(self) -> Result<(String, Vec<u8>), KmsApiError> {
        if self.plaintext.is_some() {
            return Err(KmsApiError::PlaintextInAnswer);
        }
        let envelope = self.ciphertext_for_recipient.ok_or(KmsApiError::NoCiphertextForRecipient)?;
        Ok((self.key_id, envelope))
    }
}

/// `GenerateDataKeyPair` request body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GenerateDataKeyPairRequest {
    pub key_id: String,
    pub key_pair_spec: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub encryption_context: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<RecipientInfo>,
}

/// `GenerateDataKeyPair` response body (the fields the enclave reads).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GenerateDataKeyPairResponse {
    pub key_id: String,
    /// SPKI DER.
    #[serde(with = "b64")]
    pub public_key: Vec<u8>,
    #[serde(with = "b64")]
    pub private_key_ciphertext_blob: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    pub ciphertext_for_recipient: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "b64_option")]
    pub private_key_plaintext: Option<Vec<u8>>,
}

impl GenerateDataKeyPairResponse {
    /// With a recipient KMS returns no plaintext; an answer that does is refused.
    pub fn check_recipient_answer(&self) -> Result<&[u8], KmsApiError> {
        if self.private_key_plaintext.is_some() {
            return Err(KmsApiError::PlaintextInAnswer);
        }
        self.ciphertext_for_recipient.as_deref().ok_or(KmsApiError::NoCiphertextForRecipient)
    }
}

/// The body of `DescribeKey` and `ListGrants`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyIdRequest {
    pub key_id: String,
}

/// `GetKeyPolicy` request body (`PolicyName` is always `default`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetKeyPolicyRequest {
    pub key_id: String,
    pub policy_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DescribeKeyResponse {
    pub key_metadata: KeyMetadataAnswer,
}

/// `KeyMetadata` as KMS writes it (the fields the key checks read; KMS sends more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeyMetadataAnswer {
    pub arn: String,
    pub key_state: String,
    pub enabled: bool,
    pub origin: String,
    #[serde(default)]
    pub key_spec: String,
    pub key_usage: String,
    #[serde(default)]
    pub multi_region: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetKeyPolicyResponse {
    pub policy: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListGrantsResponse {
    #[serde(default)]
    pub grants: Vec<GrantAnswer>,
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GrantAnswer {
    pub grant_id: String,
    #[serde(default)]
    pub grantee_principal: String,
    #[serde(default)]
    pub operations: Vec<String>,
}

/// The three answers as the key checks read them.
pub fn key_evidence(described: DescribeKeyResponse, policy: GetKeyPolicyResponse, grants: ListGrantsResponse) -> KeyEvidence {
    let m = described.key_metadata;
    KeyEvidence {
        metadata: KeyMetadata {
            arn: m.arn,
            key_state: m.key_state,
            enabled: m.enabled,
            origin: m.origin,
            key_spec: m.key_spec,
            key_usage: m.key_usage,
            multi_region: m.multi_region,
        },
        policy: policy.policy,
        grants: grants
            .grants
            .into_iter()
            .map(|g| GrantSummary { grant_id: g.grant_id, grantee_principal: g.grantee_principal, operations: g.operations })
            .collect(),
        grants_truncated: grants.truncated,
    }
}

/// An error answer: `{"__type": "…#AccessDeniedException", "message": "…"}` (KMS writes the
/// message key as `message` or `Message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    #[serde(rename = "__type")]
    pub kind: String,
    #[serde(default, alias = "Message", skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ErrorResponse {
    /// The error code without its namespace (`com.amazonaws.kms#AccessDeniedException` →
    /// `AccessDeniedException`).
    pub fn code(&self) -> &str {
        self.kind.rsplit('#').next().unwrap_or(&self.kind)
    }
}

/// Decodes a JSON body.
pub fn from_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, KmsApiError> {
    serde_json::from_slice(body).map_err(|e| KmsApiError::Json(e.to_string()))
}

/// One HTTP/1.1 message as the two ends of an enclave's KMS call exchange it: one request and
/// one answer per connection, each with a `Content-Length` body (KMS's JSON API uses no other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpMessage {
    /// `POST /` of a request, `200` of a response.
    pub start: StartLine,
    /// Names in lowercase, values trimmed.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartLine {
    Request { method: String, path: String },
    Response { status: u16 },
}

impl HttpMessage {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpReadError {
    /// The connection failed (for a TLS stream: including the TLS checks).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not such a message.
    #[error("{0}")]
    Http(String),
}

/// Reads one request (`request = true`) or response of at most `max_len` bytes.
pub fn read_http_message(stream: &mut impl Read, request: bool, max_len: usize) -> Result<HttpMessage, HttpReadError> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((head_len, start, headers)) = parse_head(&buffer, request)? {
            let length = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .ok_or_else(|| HttpReadError::Http("no Content-Length".into()))?;
            if length > max_len {
                return Err(HttpReadError::Http(format!("a body of {length} bytes is too long")));
            }
            let mut body = buffer.split_off(head_len);
            while body.len() < length {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Err(HttpReadError::Http("the connection closed inside the body".into()));
                }
                body.extend_from_slice(chunk.get(..n).unwrap_or_default());
            }
            body.truncate(length);
            return Ok(HttpMessage { start, headers, body });
        }
        if buffer.len() > max_len {
            return Err(HttpReadError::Http("headers too long".into()));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        buffer.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

type Head = (usize, StartLine, Vec<(String, String)>);

fn parse_head(buffer: &[u8], request: bool) -> Result<Option<Head>, HttpReadError> {
    let mut slots = [httparse::EMPTY_HEADER; 32];
    let not_http = |e: httparse::Error| HttpReadError::Http(format!("not HTTP: {e}"));
    let (head_len, start, headers) = if request {
        let mut parsed = httparse::Request::new(&mut slots);
        let httparse::Status::Complete(len) = parsed.parse(buffer).map_err(not_http)? else { return Ok(None) };
        let start = StartLine::Request {
            method: parsed.method.unwrap_or_default().to_owned(),
            path: parsed.path.unwrap_or_default().to_owned(),
        };
        (len, start, owned(parsed.headers))
    } else {
        let mut parsed = httparse::Response::new(&mut slots);
        let httparse::Status::Complete(len) = parsed.parse(buffer).map_err(not_http)? else { return Ok(None) };
        (len, StartLine::Response { status: parsed.code.unwrap_or(0) }, owned(parsed.headers))
    };
    Ok(Some((head_len, start, headers)))
}

fn owned(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers.iter().map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_owned())).collect()
}

mod b64 {
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

mod b64_option {
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => s.serialize_str(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?.map(|text| STANDARD.decode(text).map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_host_takes_only_region_names() {
        assert_eq!(endpoint_host("eu-west-1").unwrap(), "kms.eu-west-1.amazonaws.com");
        assert_eq!(endpoint_host(LOCAL_REGION).unwrap(), "kms.local.amazonaws.com");
        for bad in ["", "EU", "evil.example.com", "a/b", "-x", "x-", "eu-west-1.amazonaws.com#", &"a".repeat(33)] {
            assert!(endpoint_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_endpoint_is_the_keys_own() {
        let key: KmsKeyArn = "arn:aws:kms:eu-west-1:123456789012:key/k".parse().unwrap();
        assert_eq!(endpoint_host_for_key(&key, "eu-west-1").unwrap(), "kms.eu-west-1.amazonaws.com");
        assert!(matches!(endpoint_host_for_key(&key, "us-east-1"), Err(KmsApiError::RegionMismatch { .. })));
        let china: KmsKeyArn = "arn:aws-cn:kms:cn-north-1:123456789012:key/k".parse().unwrap();
        assert_eq!(endpoint_host_for_key(&china, "cn-north-1").unwrap(), "kms.cn-north-1.amazonaws.com.cn");
        let unknown: KmsKeyArn = "arn:evil:kms:eu-west-1:123456789012:key/k".parse().unwrap();
        assert_eq!(endpoint_host_for_key(&unknown, "eu-west-1"), Err(KmsApiError::Partition("evil".into())));
        let local: KmsKeyArn = "arn:aws:kms:local:000000000000:key/k".parse().unwrap();
        assert_eq!(endpoint_host_for_key(&local, LOCAL_REGION).unwrap(), "kms.local.amazonaws.com");
    }

    #[test]
    fn key_reads_decode_as_kms_writes_them() {
        let described: DescribeKeyResponse = from_json(
            br#"{"KeyMetadata":{"AWSAccountId":"1","Arn":"arn:k","KeyState":"Enabled","Enabled":true,"Origin":"AWS_KMS",
                "KeySpec":"SYMMETRIC_DEFAULT","KeyUsage":"ENCRYPT_DECRYPT","MultiRegion":false,"CreationDate":1.7E9}}"#,
        )
        .unwrap();
        let policy: GetKeyPolicyResponse = from_json(br#"{"Policy":"{}","PolicyName":"default"}"#).unwrap();
        let grants: ListGrantsResponse =
            from_json(br#"{"Grants":[{"GrantId":"g","GranteePrincipal":"p","Operations":["Encrypt"],"KeyId":"arn:k"}],"Truncated":false}"#)
                .unwrap();
        let evidence = key_evidence(described, policy, grants);
        assert_eq!(evidence.metadata.arn, "arn:k");
        assert_eq!(evidence.grants[0].operations, ["Encrypt"]);
        let pair: GenerateDataKeyPairResponse =
            from_json(br#"{"KeyId":"arn:k","PublicKey":"AQ==","PrivateKeyCiphertextBlob":"Ag==","CiphertextForRecipient":"Aw=="}"#).unwrap();
        assert_eq!(pair.check_recipient_answer().unwrap(), [3]);
    }

    #[test]
    fn decrypt_request_is_kms_json() {
        let request = DecryptRequest {
            ciphertext_blob: vec![1, 2, 3],
            key_id: Some("alias/k".into()),
            encryption_context: BTreeMap::from([("epoch".into(), "7".into())]),
            recipient: Some(RecipientInfo {
                key_encryption_algorithm: RSAES_OAEP_SHA_256.into(),
                attestation_document: vec![0xff],
            }),
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "CiphertextBlob": "AQID",
                "KeyId": "alias/k",
                "EncryptionContext": {"epoch": "7"},
                "Recipient": {"KeyEncryptionAlgorithm": "RSAES_OAEP_SHA_256", "AttestationDocument": "/w=="}
            })
        );
        assert_eq!(from_json::<DecryptRequest>(json.to_string().as_bytes()).unwrap(), request);
    }

    #[test]
    fn recipient_answers_carry_an_envelope_and_no_plaintext() {
        let answer: DecryptResponse = from_json(
            br#"{"KeyId":"arn:k","CiphertextForRecipient":"AAE=","EncryptionAlgorithm":"SYMMETRIC_DEFAULT"}"#,
        )
        .unwrap();
        assert_eq!(answer.into_recipient_answer().unwrap(), ("arn:k".to_owned(), vec![0, 1]));
        let plain: DecryptResponse = from_json(br#"{"KeyId":"arn:k","Plaintext":"AAE="}"#).unwrap();
        assert_eq!(plain.into_recipient_answer(), Err(KmsApiError::PlaintextInAnswer));
        let none: DecryptResponse = from_json(br#"{"KeyId":"arn:k"}"#).unwrap();
        assert_eq!(none.into_recipient_answer(), Err(KmsApiError::NoCiphertextForRecipient));
    }

    #[test]
    fn http_messages_need_a_length_and_fit_the_bound() {
        let read = |bytes: &[u8], request| read_http_message(&mut &bytes[..], request, 64);
        let ok = read(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", false).unwrap();
        assert_eq!((ok.start, ok.body), (StartLine::Response { status: 200 }, b"{}".to_vec()));
        let post = read(b"POST / HTTP/1.1\r\nX-Amz-Target: T\r\ncontent-length: 1\r\n\r\nab", true).unwrap();
        assert_eq!(post.start, StartLine::Request { method: "POST".into(), path: "/".into() });
        assert_eq!((post.header("x-amz-target"), post.body.as_slice()), (Some("T"), &b"a"[..]));
        assert!(matches!(read(b"HTTP/1.1 200 OK\r\n\r\n{}", false), Err(HttpReadError::Http(_))));
        assert!(matches!(read(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{}", false), Err(HttpReadError::Http(_))));
        assert!(matches!(read(b"HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n", false), Err(HttpReadError::Http(_))));
        assert!(matches!(read(b"\x16\x03\x01 not http", false), Err(HttpReadError::Http(_))));
        assert!(matches!(read(b"HTTP/1.1 200", false), Err(HttpReadError::Io(_))));
    }

    #[test]
    fn error_codes_lose_their_namespace() {
        let error: ErrorResponse =
            from_json(br#"{"__type":"com.amazonaws.kms#AccessDeniedException","Message":"no"}"#).unwrap();
        assert_eq!((error.code(), error.message.as_deref()), ("AccessDeniedException", Some("no")));
        let plain: ErrorResponse = from_json(br#"{"__type":"NotFoundException","message":"gone"}"#).unwrap();
        assert_eq!((plain.code(), plain.message.as_deref()), ("NotFoundException", Some("gone")));
    }
}
