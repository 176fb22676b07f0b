//! The check an enclave names when it fails a job (`JobFailed`): emitted by the worker, carried
//! by the frame as its stable name, matched by the host, which decides from it alone whether the
//! job is condemned, needs something from control, or is worth another attempt.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What failed in a job, as the enclave reports it. The wire form is [`FailedCheck::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailedCheck {
    /// The job connection broke.
    Connection,
    /// A frame was malformed or out of order.
    Protocol,
    /// The envelope's job id is not the one the host claimed.
    JobId,
    /// The input is sealed to a fleet key this worker does not hold (yet).
    FleetKey,
    /// The envelope header's authentication tag does not verify.
    HeaderAuthentication,
    /// The envelope is malformed.
    Envelope,
    /// The sealed stream is damaged or truncated.
    Stream,
    /// The records are malformed or more than the header announced.
    Records,
    /// The model the job names is not loaded here (yet).
    Model,
    /// The job's manifest hash is not the loaded model's.
    ModelManifest,
    /// The job's model, as measured, needs more than this worker's whole model memory budget.
    ModelOverBudget,
    /// The job's options are invalid for its model or this worker.
    Options,
    /// Online: the request does not decapsulate (unknown key id, suite, or ciphertext).
    Encapsulation,
    /// Online: the request was seen before, or its date is outside the window.
    Replay,
}

impl FailedCheck {
    pub const ALL: [FailedCheck; 14] = [
        FailedCheck::Connection,
        FailedCheck::Protocol,
        FailedCheck::JobId,
        FailedCheck::FleetKey,
        FailedCheck::HeaderAuthentication,
        FailedCheck::Envelope,
        FailedCheck::Stream,
        FailedCheck::Records,
        FailedCheck::Model,
        FailedCheck::ModelManifest,
        FailedCheck::ModelOverBudget,
        FailedCheck::Options,
        FailedCheck::Encapsulation,
        FailedCheck::Replay,
    ];

    /// The stable name: on the wire, in logs and in job status files.
    pub fn as_str(self) -> &'static str {
        match self {
            FailedCheck::Connection => "connection",
            FailedCheck::Protocol => "protocol",
            FailedCheck::JobId => "job_id",
            FailedCheck::FleetKey => "fleet_key",
            FailedCheck::HeaderAuthentication => "header_authentication",
            FailedCheck::Envelope => "envelope",
            FailedCheck::Stream => "stream",
            FailedCheck::Records => "records",
            FailedCheck::Model => "model",
            FailedCheck::ModelManifest => "model_manifest",
            FailedCheck::ModelOverBudget => "model_over_budget",
            FailedCheck::Options => "options",
            FailedCheck::Encapsulation => "encapsulation",
            FailedCheck::Replay => "replay",
        }
    }

    /// Every attempt would fail the same way: the sealed input itself is at fault, or its model
    /// can never be held (a fleet runs one image with one budget).
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            FailedCheck::JobId
                | FailedCheck::HeaderAuthentication
                | FailedCheck::Envelope
                | FailedCheck::Stream
                | FailedCheck::Records
                | FailedCheck::Options
                | FailedCheck::ModelManifest
                | FailedCheck::ModelOverBudget
        )
    }

    /// The worker lacks something control can give it (a fleet-key epoch, a model): worth
    /// another attempt once control has looked again.
    pub fn needs_control(self) -> bool {
        matches!(self, FailedCheck::FleetKey | FailedCheck::Model)
    }
}

impl std::fmt::Display for FailedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name no check has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} names no check")]
pub struct UnknownCheck(pub String);

impl std::str::FromStr for FailedCheck {
    type Err = UnknownCheck;

    fn from_str(name: &str) -> Result<Self, UnknownCheck> {
        FailedCheck::ALL.into_iter().find(|c| c.as_str() == name).ok_or_else(|| UnknownCheck(name.to_owned()))
    }
}

impl Serialize for FailedCheck {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FailedCheck {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_names_are_distinct() {
        let mut names: Vec<&str> = FailedCheck::ALL.iter().map(|c| c.as_str()).collect();
        for check in FailedCheck::ALL {
            assert_eq!(check.as_str().parse::<FailedCheck>(), Ok(check));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FailedCheck::ALL.len());
        assert_eq!("stalled".parse::<FailedCheck>(), Err(UnknownCheck("stalled".into())));
    }

    #[test]
    fn a_check_is_permanent_or_needs_control_or_neither_never_both() {
        let permanent: Vec<_> = FailedCheck::ALL.into_iter().filter(|c| c.is_permanent()).map(FailedCheck::as_str).collect();
        let control: Vec<_> = FailedCheck::ALL.into_iter().filter(|c| c.needs_control()).map(FailedCheck::as_str).collect();
        assert_eq!(permanent, ["job_id", "header_authentication", "envelope", "stream", "records", "model_manifest", "model_over_budget", "options"]);
        assert_eq!(control, ["fleet_key", "model"]);
        assert!(!FailedCheck::Connection.is_permanent() && !FailedCheck::Protocol.needs_control());
    }
}
