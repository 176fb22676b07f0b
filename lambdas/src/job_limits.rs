//! What one upload may ask of the fleet, checked before its job is queued, and whose share of
//! the fleet it is queued under.
//!
//! - [`JobLimits`]: a header's record count and the input's size, against the deployment's
//!   per-job limits and against each other (a record takes at least
//!   [`MIN_RECORD_BYTES`], so a header cannot announce more records than its bytes can hold). The
//!   enclave enforces the announced count again as records arrive.
//! - [`Tenant`]: the principal S3 names as the uploader (the event's `userIdentity`), which becomes
//!   the job message's group on the standard job queue. SQS fair queues then keep one tenant's
//!   backlog from delaying the others' jobs (docs/operations.md §6).

/// The smallest encoded input record: tag (1), id length (2), a 1-byte id, text length (4)
/// (docs/protocol.md §4). Sealing only adds bytes.
pub const MIN_RECORD_BYTES: u64 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// `EPHEM_MAX_JOB_RECORDS`.
    pub max_records: u64,
    /// `EPHEM_MAX_JOB_BYTES`: the sealed input object's size.
    pub max_input_bytes: u64,
}

impl Default for JobLimits {
    /// Ten times the largest job measured (docs/soak.md: 10^6 records), and 64 GiB.
    fn default() -> Self {
        Self { max_records: 10_000_000, max_input_bytes: 64 << 30 }
    }
}

impl JobLimits {
    /// `Err` names what an upload whose header announces `records` asks beyond the limits (the
    /// `job_limits` check).
    pub fn check(&self, records: u64, input_bytes: u64) -> Result<(), String> {
        if records > self.max_records {
            return Err(format!("the header announces {records} records; a job takes at most {}", self.max_records));
        }
        if input_bytes > self.max_input_bytes {
            return Err(format!("the input is {input_bytes} bytes; a job takes at most {}", self.max_input_bytes));
        }
        if records > input_bytes / MIN_RECORD_BYTES {
            return Err(format!(
                "the header announces {records} records in {input_bytes} bytes; a record takes at least {MIN_RECORD_BYTES}"
            ));
        }
        Ok(())
    }
}

/// The group a job message is sent under: the uploading principal's unique id (`AROA…`,
/// `AIDA…`), without the session name an assumed role's caller chooses, so one role cannot claim
/// many shares by naming many sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(String);

impl Tenant {
    /// Uploads S3 names no principal for (and the embedded default, which has one user).
    pub const UNKNOWN: &str = "unknown";

    /// From an S3 event's `userIdentity.principalId` (`AWS:AROAEXAMPLE:session`, `AWS:AIDAEXAMPLE`
    /// or `AIDAEXAMPLE`).
    pub fn from_principal(principal: Option<&str>) -> Self {
        let id = principal.map(|p| p.strip_prefix("AWS:").unwrap_or(p)).and_then(|p| p.split(':').next()).unwrap_or("");
        // An SQS group id: 1 to 128 of A-Z a-z 0-9 and punctuation; a principal id is far less.
        let valid = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        Tenant(if valid { id.to_owned() } else { Self::UNKNOWN.to_owned() })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_announcing_more_than_its_bytes_hold_or_the_limits_allow_is_refused() {
        let limits = JobLimits { max_records: 1000, max_input_bytes: 1 << 20 };
        assert_eq!(limits.check(10, 200), Ok(()));
        assert!(limits.check(1001, 1 << 20).unwrap_err().contains("at most 1000"));
        assert!(limits.check(1, (1 << 20) + 1).unwrap_err().contains("bytes; a job takes at most"));
        assert!(limits.check(26, 200).unwrap_err().contains("a record takes at least 8"));
        assert_eq!(limits.check(25, 200), Ok(()));
        assert!(JobLimits::default().check(u64::MAX, u64::MAX).is_err());
    }

    #[test]
    fn a_tenant_is_its_principal_without_the_session_name() {
        assert_eq!(Tenant::from_principal(Some("AWS:AROAEXAMPLE123:any-session")).as_str(), "AROAEXAMPLE123");
        assert_eq!(Tenant::from_principal(Some("AWS:AIDAEXAMPLE456")).as_str(), "AIDAEXAMPLE456");
        assert_eq!(Tenant::from_principal(Some("AIDAEXAMPLE456")).as_str(), "AIDAEXAMPLE456");
        for odd in [None, Some(""), Some("AWS:"), Some("AWS:AROA X:s"), Some(&*"A".repeat(129))] {
            assert_eq!(Tenant::from_principal(odd).as_str(), Tenant::UNKNOWN, "{odd:?}");
        }
    }
}
