//! `on-upload`: S3 `ObjectCreated` on `jobs/<job_id>/input.sealed` → a job message.
//!
//! The handler reads only the sealed object's clear preamble (the authenticated header, never
//! the body) and refuses, by name, an upload that cannot become a job:
//! - `key`: the key does not name a job id;
//! - `header`: the preamble or the header does not parse;
//! - `job_id`: the id in the key is not the id the envelope derives (nobody can squat on a
//!   victim's job id: the id is a hash of the client's ephemeral key and header);
//! - `fleet_epoch`: the header names an epoch that does not exist, has expired, or whose key id
//!   differs;
//! - `model_manifest`: no published manifest of that model has the hash the header names.
//!
//! A refused upload gets `status.json` = failed with that check; an accepted one gets
//! `status.json` = queued and one message on the job queue. The enclave checks everything again:
//! this step only keeps garbage off the queue.

use aws_lambda_events::s3::S3Event;
use cloud::layout;
use cloud::messages::{Failure, JobMessage, JobState, JobStatus};
use cloud::{ObjectError, ObjectStore, PutCondition, QueueError, SendOptions, Services};
use protocol::envelope::{JobHeader, JobId, Preamble, StreamKind, MAX_HEADER_LEN};
use protocol::fleet::{epoch_object_key, EpochRecord};
use sha2::{Digest, Sha256};

/// The preamble is magic, version, kind, lengths, header, encapsulated key and confirmation:
/// always within this many bytes.
const PREAMBLE_READ: u64 = MAX_HEADER_LEN as u64 + 1024;

#[derive(Debug, thiserror::Error)]
pub enum OnUploadError {
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// What happened to one record of the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not an input object (another key in the bucket).
    Ignored { key: String },
    /// A job message was sent.
    Queued { job_id: String, message_id: String },
    /// The upload cannot become a job; `check` names why.
    Refused { key: String, check: &'static str, message: String },
}

/// Handles every record of an S3 event. Errors are infrastructure failures (the invocation is
/// retried); a bad upload is an [`Outcome::Refused`], not an error.
pub fn handle(event: &S3Event, services: &Services) -> Result<Vec<Outcome>, OnUploadError> {
    let mut outcomes = Vec::new();
    for record in &event.records {
        let Some(raw) = record.s3.object.key.as_deref() else { continue };
        outcomes.push(handle_key(&url_decode(raw), services)?);
    }
    Ok(outcomes)
}

fn handle_key(key: &str, services: &Services) -> Result<Outcome, OnUploadError> {
    if !(key.starts_with(layout::JOBS_PREFIX) && key.ends_with(layout::INPUT_SUFFIX)) {
        return Ok(Outcome::Ignored { key: key.to_owned() });
    }
    let Some(job) = layout::job_of_input_key(key) else {
        return Ok(Outcome::Refused { key: key.to_owned(), check: "key", message: "the key does not name a job id".into() });
    };
    match check_upload(key, &job, services)? {
        Ok((header, size)) => {
            let message = JobMessage {
                job_id: job.to_hex(),
                input_key: key.to_owned(),
                input_size: size,
                model_id: header.model_id.clone(),
                manifest_hash: hex::encode(header.manifest_hash),
                epoch: header.epoch,
                record_count: header.record_count,
                created_ms: header.created_ms,
            };
            // A re-delivered event must not reset the status of a job that already moved on.
            let status = JobStatus::new(&job.to_hex(), JobState::Queued, header.record_count);
            match services.jobs.put(&layout::job_status(&job), &status_json(&status), PutCondition::CreateOnly) {
                Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            let body = serde_json::to_string(&message).expect("a job message serialises");
            let message_id = services.job_queue.send(&body, &SendOptions::default())?;
            tracing::info!(job = %job, records = header.record_count, "job queued");
            Ok(Outcome::Queued { job_id: job.to_hex(), message_id })
        }
        Err((check, message)) => {
            tracing::warn!(job = %job, check, %message, "upload refused");
            let mut status = JobStatus::new(&job.to_hex(), JobState::Failed, 0);
            status.failure = Some(Failure { check: check.to_owned(), message: message.clone() });
            services.jobs.put(&layout::job_status(&job), &status_json(&status), PutCondition::Overwrite)?;
            Ok(Outcome::Refused { key: key.to_owned(), check, message })
        }
    }
}

type Verdict = Result<(JobHeader, u64), (&'static str, String)>;

fn check_upload(key: &str, job: &JobId, services: &Services) -> Result<Verdict, OnUploadError> {
    let Some(meta) = services.jobs.head(key)? else {
        return Ok(Err(("key", "the object is gone".into())));
    };
    let head = services.jobs.read_range(key, 0, PREAMBLE_READ)?;
    let preamble = match Preamble::parse(&head, StreamKind::JobInput) {
        Ok(Some((preamble, _))) => preamble,
        Ok(None) => return Ok(Err(("header", "the object ends inside the envelope preamble".into()))),
        Err(error) => return Ok(Err(("header", error.to_string()))),
    };
    let derived = JobId(preamble.stream_id());
    if derived != *job {
        return Ok(Err(("job_id", format!("the key names job {job}, the envelope derives {derived}"))));
    }
    let header = match JobHeader::from_bytes(&preamble.header) {
        Ok(header) => header,
        Err(error) => return Ok(Err(("header", error.to_string()))),
    };
    if let Err(message) = check_epoch(&header, services)? {
        return Ok(Err(("fleet_epoch", message)));
    }
    if !manifest_published(&header, services.models.as_ref())? {
        return Ok(Err((
            "model_manifest",
            format!("no published manifest of {} has hash {}", header.model_id, hex::encode(header.manifest_hash)),
        )));
    }
    Ok(Ok((header, meta.size)))
}

fn check_epoch(header: &JobHeader, services: &Services) -> Result<Result<(), String>, OnUploadError> {
    let key = epoch_object_key(header.epoch);
    let bytes = match services.attestations.get(&key) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(Err(format!("epoch {} does not exist", header.epoch))),
        Err(error) => return Err(error.into()),
    };
    let record = match EpochRecord::from_json(&bytes) {
        Ok(record) => record,
        Err(error) => return Ok(Err(format!("epoch {}: {error}", header.epoch))),
    };
    if record.not_after_ms <= cloud::now_ms() {
        return Ok(Err(format!("epoch {} expired", header.epoch)));
    }
    match record.public_key() {
        Ok(key) if key.key_id() == header.fleet_key_id => Ok(Ok(())),
        _ => Ok(Err(format!("the job is sealed to a key that is not epoch {}'s", header.epoch))),
    }
}

fn manifest_published(header: &JobHeader, models: &dyn ObjectStore) -> Result<bool, OnUploadError> {
    let name = header.model_id.rsplit('/').next().unwrap_or(&header.model_id);
    for meta in models.list(&format!("{}{name}/", layout::MODELS_PREFIX))? {
        if layout::manifest_version(&meta.key).is_none() {
            continue;
        }
        let bytes = match models.get(&meta.key) {
            Ok(bytes) => bytes,
            Err(ObjectError::NotFound { .. }) => continue,
            Err(error) => return Err(error.into()),
        };
        if <[u8; 32]>::from(Sha256::digest(&bytes)) == header.manifest_hash {
            return Ok(true);
        }
    }
    Ok(false)
}

fn status_json(status: &JobStatus) -> Vec<u8> {
    serde_json::to_vec_pretty(status).expect("a status serialises")
}

/// S3 event keys are URL-encoded, with `+` for a space.
fn url_decode(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|v| v as u8)
}

/// The S3 event a bucket notification would deliver for one created object (the embedded
/// default's object store calls [`handle`] with it).
pub fn object_created_event(bucket: &str, key: &str, size: u64, etag: &str) -> S3Event {
    let json = serde_json::json!({
        "Records": [{
            "eventVersion": "2.1",
            "eventSource": "aws:s3",
            "awsRegion": "local",
            "eventTime": "1970-01-01T00:00:00.000Z",
            "eventName": "ObjectCreated:Put",
            "userIdentity": {"principalId": "local"},
            "requestParameters": {"sourceIPAddress": "127.0.0.1"},
            "responseElements": {},
            "s3": {
                "s3SchemaVersion": "1.0",
                "configurationId": "on-upload",
                "bucket": {"name": bucket, "ownerIdentity": {"principalId": "local"}, "arn": format!("arn:aws:s3:::{bucket}")},
                "object": {"key": url_encode(key), "size": size, "eTag": etag, "sequencer": "0"}
            }
        }]
    });
    serde_json::from_value(json).expect("the S3 event shape")
}

fn url_encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(byte as char),
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_the_event_encoding() {
        for key in ["jobs/ab/input.sealed", "stores/a b/incoming/x+y%.sealed", "jobs/ü/input.sealed"] {
            let event = object_created_event("jobs", key, 1, "e");
            assert_eq!(url_decode(event.records[0].s3.object.key.as_deref().unwrap()), key);
        }
        assert_eq!(url_decode("in%2Fx.json"), "in/x.json");
        assert_eq!(url_decode("bad%zzend%4"), "bad%zzend%4");
    }
}
