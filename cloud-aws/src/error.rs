//! What an SDK error says, reduced to what the adapters decide on: the service's error code, the
//! HTTP status, a message for people, and whether trying again later may help. The SDK has
//! already retried throttling and 5xx answers by then (see `AwsClients`); a failure that is
//! still transient is reported as such so the caller's own backoff can take over.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

pub(crate) struct Failure {
    /// The service's error code (`NoSuchKey`, `AccessDeniedException`, …); empty when none.
    pub code: String,
    pub status: Option<u16>,
    pub message: String,
    pub transient: bool,
}

/// Error codes that mean "later" rather than "no", across S3, SQS and KMS.
const RETRYABLE_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "KMSInternalException",
    "KeyUnavailableException",
    "DependencyTimeoutException",
    "AWS.SimpleQueueService.ServiceUnavailable",
    "KmsThrottled",
    // S3: another conditional write on the same key is in progress; retrying resolves it.
    "ConditionalRequestConflict",
];

impl Failure {
    pub fn of<E>(error: &SdkError<E, HttpResponse>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let status = error.raw_response().map(|r| r.status().as_u16());
        let code = error.code().unwrap_or_default().to_owned();
        let transient = match error {
            SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
            SdkError::ConstructionFailure(_) => false,
            _ => status.is_some_and(|s| s >= 500 || s == 429) || RETRYABLE_CODES.contains(&code.as_str()),
        };
        let message = match (error, error.message()) {
            (SdkError::ServiceError(_), Some(text)) if !code.is_empty() => format!("{code}: {text}"),
            (SdkError::ServiceError(_), None) if !code.is_empty() => code.clone(),
            _ => DisplayErrorContext(error).to_string(),
        };
        Failure { code, status, message, transient }
    }

    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }

    pub fn status_is(&self, status: u16) -> bool {
        self.status == Some(status)
    }
}
