//! KMS `Decrypt` with `Recipient`, called by the enclave itself over TLS that ends inside it.
//!
//! The host supplies two things it cannot abuse: a byte relay to KMS (`vsock-proxy` in AWS, a
//! socket in the embedded default) and its role's credentials, which authorise the call but
//! prove nothing. The enclave names the server itself (`kms.<region>.amazonaws.com`), checks
//! its certificate against roots compiled into the image (the Amazon roots; the development
//! root only next to the development NSM) and signs the request with SigV4. A host that wants
//! to hand the enclave a key of its own choosing would have to answer as KMS inside that TLS
//! session; it can only drop or delay the call.
//!
//! A call that fails in a way KMS documents as transient (throttling, an internal error, a
//! dependency timeout, any 5xx, or the relay not carrying the bytes) is sent again, a bounded
//! number of times with exponential backoff and jitter (`RetryPolicy`); the last failure is
//! returned with the number of attempts. Sending the same request again is safe: the answer is
//! sealed to the same one-shot key, which opens one envelope at most. TLS and HTTP failures are
//! never retried — they say the other end is not KMS, not that KMS is busy.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use protocol::key_checks::KeyEvidence;
use protocol::kms_api::{
    self, AwsCredentials, DecryptRequest, DecryptResponse, ErrorResponse, GenerateDataKeyPairRequest, GenerateDataKeyPairResponse,
    GetKeyPolicyRequest, HttpReadError, KeyIdRequest, StartLine,
};
use protocol::kms_arn::KmsKeyArn;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::KmsTransportError;
use crate::transport::Endpoint;

/// The roots KMS's certificate may chain to in production: Amazon Root CA 1–4 and the Starfield
/// Services root G2 that cross-signs them (the roots of Amazon Trust Services).
const AMAZON_ROOTS_PEM: [&str; 5] = [
    include_str!("../../roots/amazon-root-ca-1.pem"),
    include_str!("../../roots/amazon-root-ca-2.pem"),
    include_str!("../../roots/amazon-root-ca-3.pem"),
    include_str!("../../roots/amazon-root-ca-4.pem"),
    include_str!("../../roots/starfield-services-root-ca-g2.pem"),
];

/// Largest KMS answer read (a `Decrypt` answer for a recipient is a few KiB).
const MAX_RESPONSE_LEN: usize = 256 * 1024;

/// The error code of a failed TLS session: the server is not KMS as the roots know it.
pub const TLS_CHECK: &str = "kms_tls";
/// The error code of an answer that is not KMS's HTTP/JSON.
pub const HTTP_CHECK: &str = "kms_http";
/// The error code of a call refused before connecting: the credentials' region is not the key's,
/// or the key's partition or region names no KMS endpoint.
pub const REGION_CHECK: &str = "kms_region";

/// Which roots KMS's certificate must chain to.
#[derive(Clone, Debug)]
pub enum KmsRoots {
    /// The Amazon Trust Services roots compiled into this image.
    Amazon,
    /// A development root (DER): the embedded default's local KMS endpoint. Only for a worker
    /// running the development NSM, whose documents no production policy accepts.
    Development(Vec<u8>),
}

/// KMS error codes that mean "try again later" (KMS API reference, Decrypt errors).
const TRANSIENT_CODES: [&str; 3] = ["ThrottlingException", "KMSInternalException", "DependencyTimeoutException"];

/// How often, and how far apart, a transient failure is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RetryPolicy {
    /// Calls in all, the first included.
    attempts: u32,
    /// Delay before the second call; doubled for each later one, up to `max_delay`. Each delay
    /// is drawn uniformly from its upper half (jitter), so that the enclaves of a fleet that
    /// failed together do not retry together.
    first_delay: Duration,
    max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Five calls over about 1.5 s at most: a blip is absorbed here; a longer outage is the
    /// host's to retry (it asks again for the epoch or model with a backoff of its own).
    fn default() -> Self {
        RetryPolicy { attempts: 5, first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(2) }
    }
}

impl RetryPolicy {
    /// The delay after the `failed`-th failed call (1-based), with its jitter drawn from `random`.
    fn delay(&self, failed: u32, random: u32) -> Duration {
        let full = self.first_delay.saturating_mul(1u32 << (failed - 1).min(16)).min(self.max_delay);
        let half = full / 2;
        half + half.mul_f64(f64::from(random) / f64::from(u32::MAX))
    }
}

/// Whether a failed call may succeed if sent again.
fn is_transient(status: Option<u16>, error: &KmsTransportError) -> bool {
    error.code == KmsTransportError::TRANSPORT
        || TRANSIENT_CODES.contains(&error.code.as_str())
        || status.is_some_and(|status| status >= 500) && error.code != TLS_CHECK
}

/// The enclave's KMS client: where the relay is and which roots to trust.
pub struct KmsHttps {
    relay: Endpoint,
    tls: Arc<rustls::ClientConfig>,
    retry: RetryPolicy,
}

impl KmsHttps {
    pub fn new(relay: Endpoint, roots: &KmsRoots) -> Result<KmsHttps, String> {
        let mut store = rustls::RootCertStore::empty();
        match roots {
            KmsRoots::Amazon => {
                for pem in AMAZON_ROOTS_PEM {
                    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("compiled-in Amazon root: {e}"))?;
                    store.add(der).map_err(|e| format!("compiled-in Amazon root: {e}"))?;
                }
            }
            KmsRoots::Development(der) => {
                store.add(CertificateDer::from(der.clone())).map_err(|e| format!("development KMS root: {e}"))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(store)
            .with_no_client_auth();
        Ok(KmsHttps { relay, tls: Arc::new(config), retry: RetryPolicy::default() })
    }

    /// Sends `Decrypt` and returns KMS's key id and `CiphertextForRecipient`; transient failures
    /// are retried as the `RetryPolicy` says.
    pub fn decrypt(
        &self,
        credentials: &AwsCredentials,
        request: &DecryptRequest,
    ) -> Result<(String, Vec<u8>), KmsTransportError> {
        let key = request.key_id.as_deref().and_then(|id| id.parse::<KmsKeyArn>().ok());
        let host = host_for(credentials, key.as_ref())?;
        let answer = self.call(credentials, &host, kms_api::DECRYPT_TARGET, &encode(request)?)?;
        decode::<DecryptResponse>(&answer)?.into_recipient_answer().map_err(|e| KmsTransportError::new(HTTP_CHECK, e.to_string()))
    }

    /// Sends `GenerateDataKeyPair` with a `Recipient` for the key `key` (its ARN names the host).
    pub fn generate_data_key_pair(
        &self,
        credentials: &AwsCredentials,
        key: &KmsKeyArn,
        request: &GenerateDataKeyPairRequest,
    ) -> Result<GenerateDataKeyPairResponse, KmsTransportError> {
        let host = host_for(credentials, Some(key))?;
        let answer = self.call(credentials, &host, kms_api::GENERATE_DATA_KEY_PAIR_TARGET, &encode(request)?)?;
        let answer: GenerateDataKeyPairResponse = decode(&answer)?;
        answer.check_recipient_answer().map_err(|e| KmsTransportError::new(HTTP_CHECK, e.to_string()))?;
        Ok(answer)
    }

    /// `DescribeKey`, `GetKeyPolicy` and `ListGrants` of `key`, each answer read through TLS that
    /// ends here: the evidence the key checks read.
    pub fn key_evidence(&self, credentials: &AwsCredentials, key: &KmsKeyArn) -> Result<KeyEvidence, KmsTransportError> {
        let host = host_for(credentials, Some(key))?;
        let key_id = encode(&KeyIdRequest { key_id: key.to_string() })?;
        let described = self.call(credentials, &host, kms_api::DESCRIBE_KEY_TARGET, &key_id)?;
        let policy_request = encode(&GetKeyPolicyRequest { key_id: key.to_string(), policy_name: "default".into() })?;
        let policy = self.call(credentials, &host, kms_api::GET_KEY_POLICY_TARGET, &policy_request)?;
        let grants = self.call(credentials, &host, kms_api::LIST_GRANTS_TARGET, &key_id)?;
        Ok(kms_api::key_evidence(decode(&described)?, decode(&policy)?, decode(&grants)?))
    }

    /// One operation, retried as the `RetryPolicy` says; the body of KMS's 200 answer.
    fn call(&self, credentials: &AwsCredentials, host: &str, target: &str, body: &[u8]) -> Result<Vec<u8>, KmsTransportError> {
        let mut failed = 0;
        loop {
            let (status, error) = match self.call_once(credentials, host, target, body) {
                Ok(answer) => return Ok(answer),
                Err(failure) => failure,
            };
            failed += 1;
            if !is_transient(status, &error) {
                return Err(error);
            }
            if failed >= self.retry.attempts {
                let message = format!("{} (gave up after {failed} attempts)", error.message);
                return Err(KmsTransportError::new(error.code, message));
            }
            let delay = self.retry.delay(failed, getrandom::u32().unwrap_or(u32::MAX / 2));
            tracing::warn!(code = error.code, message = error.message, attempt = failed, retry_in = ?delay, "KMS call failed; retrying");
            std::thread::sleep(delay);
        }
    }

    /// One call; the body of a 200 answer, or the failure with the HTTP status if an answer arrived.
    fn call_once(
        &self,
        credentials: &AwsCredentials,
        host: &str,
        target: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, (Option<u16>, KmsTransportError)> {
        let no_status = |error| (None, error);
        let headers = [
            ("content-type", kms_api::CONTENT_TYPE.to_owned()),
            ("host", host.to_owned()),
            ("x-amz-target", target.to_owned()),
        ];
        let signed = sign_v4(credentials, kms_api::SERVICE, "POST", "/", &headers, body, SystemTime::now());
        let mut http = format!("POST / HTTP/1.1\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
        for (name, value) in headers.iter().chain(signed.iter()) {
            http.push_str(&format!("{name}: {value}\r\n"));
        }
        http.push_str("\r\n");

        let socket = self.relay.connect().map_err(|e| {
            no_status(KmsTransportError::new(KmsTransportError::TRANSPORT, format!("KMS relay {:?}: {e}", self.relay)))
        })?;
        let name = ServerName::try_from(host.to_owned()).map_err(|e| no_status(KmsTransportError::new(TLS_CHECK, e.to_string())))?;
        let session = rustls::ClientConnection::new(Arc::clone(&self.tls), name)
            .map_err(|e| no_status(KmsTransportError::new(TLS_CHECK, e.to_string())))?;
        let mut tls = rustls::StreamOwned::new(session, socket);
        let io = |e: std::io::Error| no_status(tls_or_transport(host, e));
        tls.write_all(http.as_bytes()).map_err(io)?;
        tls.write_all(body).map_err(io)?;
        tls.flush().map_err(io)?;
        let answer = kms_api::read_http_message(&mut tls, false, MAX_RESPONSE_LEN).map_err(|e| match e {
            HttpReadError::Io(e) => no_status(tls_or_transport(host, e)),
            HttpReadError::Http(message) => no_status(KmsTransportError::new(HTTP_CHECK, format!("answer: {message}"))),
        })?;
        let (status, body) = match answer.start {
            StartLine::Response { status } => (status, answer.body),
            StartLine::Request { .. } => return Err(no_status(KmsTransportError::new(HTTP_CHECK, "answer is a request"))),
        };
        if status == 200 {
            return Ok(body);
        }
        let failed = |error| (Some(status), error);
        match kms_api::from_json::<ErrorResponse>(&body) {
            Ok(error) => Err(failed(KmsTransportError::new(error.code(), error.message.clone().unwrap_or_default()))),
            Err(_) => Err(failed(KmsTransportError::new(HTTP_CHECK, format!("HTTP {status} without a KMS error body")))),
        }
    }
}

fn encode<T: ?Sized + serde::Serialize>(request: &T) -> Result<Vec<u8>, KmsTransportError> {
    serde_json::to_vec(request).map_err(|e| KmsTransportError::new(HTTP_CHECK, e.to_string()))
}

fn decode<T: serde::de::DeserializeOwned>(answer: &[u8]) -> Result<T, KmsTransportError> {
    kms_api::from_json(answer).map_err(|e| KmsTransportError::new(HTTP_CHECK, e.to_string()))
}

/// The KMS host to call: the key's own partition and region when the key is named by its ARN
/// (credentials for another region are refused before connecting), else the credentials' region.
fn host_for(credentials: &AwsCredentials, key: Option<&KmsKeyArn>) -> Result<String, KmsTransportError> {
    let host = match key {
        Some(key) => kms_api::endpoint_host_for_key(key, &credentials.region),
        None => kms_api::endpoint_host(&credentials.region),
    };
    host.map_err(|e| KmsTransportError::new(REGION_CHECK, e.to_string()))
}

/// A TLS failure (certificate, handshake, alert) names the `kms_tls` check; anything else is
/// the relay failing to carry bytes.
fn tls_or_transport(host: &str, error: std::io::Error) -> KmsTransportError {
    let is_tls = error.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
    if is_tls {
        KmsTransportError::new(TLS_CHECK, format!("{host}: {error}"))
    } else {
        KmsTransportError::new(KmsTransportError::TRANSPORT, format!("{host}: {error}"))
    }
}

/// AWS Signature Version 4 for a request without a query string: the headers to add
/// (`x-amz-date`, `x-amz-security-token` when there is a session token, `authorization`).
/// `headers` are lowercase names with trimmed values, sorted by name.
pub fn sign_v4(
    credentials: &AwsCredentials,
    service: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    now: SystemTime,
) -> Vec<(&'static str, String)> {
    let amz_date = amz_date(now);
    let date = &amz_date[..8];
    let mut signed_headers: Vec<(&str, String)> = headers.to_vec();
    signed_headers.push(("x-amz-date", amz_date.clone()));
    if let Some(token) = &credentials.session_token {
        signed_headers.push(("x-amz-security-token", token.clone()));
    }
    signed_headers.sort_by(|a, b| a.0.cmp(b.0));
    let canonical_headers: String = signed_headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let names = signed_headers.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(";");
    let canonical_request =
        format!("{method}\n{path}\n\n{canonical_headers}\n{names}\n{}", hex::encode(Sha256::digest(body)));
    let scope = format!("{date}/{}/{service}/aws4_request", credentials.region);
    let string_to_sign =
        format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
    let secret = Zeroizing::new(format!("AWS4{}", credentials.secret_access_key.as_str()));
    let mut key = hmac_sha256(secret.as_bytes(), date.as_bytes());
    for part in [credentials.region.as_str(), service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac_sha256(&key, string_to_sign.as_bytes()));
    let mut out = vec![("x-amz-date", amz_date)];
    if let Some(token) = &credentials.session_token {
        out.push(("x-amz-security-token", token.clone()));
    }
    out.push((
        "authorization",
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={names}, Signature={signature}",
            credentials.access_key_id
        ),
    ));
    out
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    Zeroizing::new(mac.finalize().into_bytes().to_vec())
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn retry_delays_double_within_their_jitter_up_to_the_cap() {
        let policy = RetryPolicy::default();
        for (failed, full_ms) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1600), (6, 2000), (40, 2000)] {
            let full = Duration::from_millis(full_ms);
            assert_eq!(policy.delay(failed, 0), full / 2, "after failure {failed}");
            assert_eq!(policy.delay(failed, u32::MAX), full, "after failure {failed}");
            let middle = policy.delay(failed, u32::MAX / 2);
            assert!(middle > full / 2 && middle < full, "after failure {failed}: {middle:?}");
        }
    }

    #[test]
    fn only_failures_that_say_kms_is_busy_are_retried() {
        let error = |code: &str| KmsTransportError::new(code, "m");
        for code in TRANSIENT_CODES {
            assert!(is_transient(Some(400), &error(code)), "{code}");
        }
        assert!(is_transient(None, &error(KmsTransportError::TRANSPORT)));
        assert!(is_transient(Some(503), &error(HTTP_CHECK)), "a 5xx without a KMS body");
        assert!(is_transient(Some(500), &error("SomethingNew")));
        for code in ["AccessDeniedException", "InvalidCiphertextException", "ValidationException", HTTP_CHECK, TLS_CHECK] {
            assert!(!is_transient(Some(400), &error(code)), "{code}");
            assert!(!is_transient(None, &error(code)), "{code}");
        }
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(amz_date(at(0)), "19700101T000000Z");
        assert_eq!(amz_date(at(1_369_353_600)), "20130524T000000Z");
        assert_eq!(amz_date(at(951_782_400 + 3661)), "20000229T010101Z");
        assert_eq!(amz_date(at(1_798_761_599)), "20261231T235959Z");
    }

    /// The GET Object example of AWS's Signature Version 4 documentation for S3 ("Authenticating
    /// Requests: Using the Authorization Header"), with its published signature.
    #[test]
    fn signature_v4_known_answer() {
        let credentials = AwsCredentials {
            region: "us-east-1".into(),
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: Zeroizing::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into()),
            session_token: None,
        };
        let empty_hash = hex::encode(Sha256::digest(b""));
        let headers = [
            ("host", "examplebucket.s3.amazonaws.com".to_owned()),
            ("range", "bytes=0-9".to_owned()),
            ("x-amz-content-sha256", empty_hash),
        ];
        let signed = sign_v4(&credentials, "s3", "GET", "/test.txt", &headers, b"", at(1_369_353_600));
        let authorization = &signed.iter().find(|(n, _)| *n == "authorization").unwrap().1;
        assert_eq!(
            authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn a_session_token_is_sent_and_signed() {
        let credentials = AwsCredentials {
            region: "eu-west-1".into(),
            access_key_id: "AKID".into(),
            secret_access_key: Zeroizing::new("secret".into()),
            session_token: Some("token".into()),
        };
        let signed = sign_v4(&credentials, "kms", "POST", "/", &[("host", "kms.eu-west-1.amazonaws.com".into())], b"{}", at(0));
        assert!(signed.contains(&("x-amz-security-token", "token".to_owned())));
        let authorization = &signed.iter().find(|(n, _)| *n == "authorization").unwrap().1;
        assert!(authorization.contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"), "{authorization}");
    }

    #[test]
    fn every_compiled_in_root_parses() {
        KmsHttps::new(Endpoint::Tcp("127.0.0.1:9".into()), &KmsRoots::Amazon).unwrap();
        assert!(KmsHttps::new(Endpoint::Tcp("127.0.0.1:9".into()), &KmsRoots::Development(vec![1, 2, 3])).is_err());
    }
}
