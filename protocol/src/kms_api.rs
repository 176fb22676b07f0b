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

/// `X-Amz-Target` of `Decrypt`.
pub const DECRYPT_TARGET: &str = "TrentService.Decrypt";
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
