//! `on-upload`: S3 `ObjectCreated` on `jobs/<job_id>/input.sealed` → a job message; on a
//! sealed shard under a store prefix (`<prefix>….sealed`) → that shard copied to
//! `jobs/<job_id>/input.sealed`, whose own event then creates the job (one path creates every
//! job). The job id of a shard is read from its preamble — derived from the client's
//! ephemeral key and header — never from its name, so a shard cannot claim someone else's id.
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
//! A refused upload gets `status.json` = failed with that check, and a bulk run waiting for that
//! job on a task token gets `SendTaskFailure` with the check as its cause; an accepted one gets
//! `status.json` = queued and one message on the job queue. The enclave checks everything again:
//! this step only keeps garbage off the queue.

use aws_lambda_events::s3::S3Event;
use cloud::layout;
use cloud::messages::{Failure, JobMessage, JobState, JobStatus};
use cloud::workflow::{self, BulkTaskError, JobEnd};
use cloud::{ObjectError, ObjectStore, PutCondition, QueueError, SendOptions, Services};
use protocol::envelope::{JobHeader, JobId, Preamble, StreamKind, MAX_HEADER_LEN};
use protocol::fleet::{epoch_object_key, EpochRecord};
use sha2::{Digest, Sha256};

use crate::job_limits::{JobLimits, Tenant};

/// The preamble is magic, version, kind, lengths, header, encapsulated key and confirmation:
/// always within this many bytes.
const PREAMBLE_READ: u64 = MAX_HEADER_LEN as u64 + 1024;

#[derive(Debug, thiserror::Error)]
pub enum OnUploadError {
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("failing the bulk task of a refused upload: {0}")]
    Task(#[from] BulkTaskError),
}

/// Where sealed shards become jobs, and which checks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Store prefixes (`EPHEM_STORE_PREFIXES`), each ending in `/`.
    pub store_prefixes: Vec<String>,
    /// Check the header's fleet epoch (needs the attestations store).
    pub check_epoch: bool,
    /// Check that the header's model manifest is published (needs the models store).
    pub check_manifest: bool,
    /// What one job may ask (the `job_limits` check).
    pub limits: JobLimits,
}

impl Default for Config {
    fn default() -> Self {
        Self { store_prefixes: Vec::new(), check_epoch: true, check_manifest: true, limits: JobLimits::default() }
    }
}

impl Config {
    /// Parses `EPHEM_STORE_PREFIXES`: comma-separated, blanks ignored, `/` appended if missing.
    pub fn from_list(list: &str) -> Self {
        let store_prefixes = list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| if p.ends_with('/') { p.to_owned() } else { format!("{p}/") })
            .collect();
        Self { store_prefixes, ..Self::default() }
    }

    /// The store prefix `key` is a shard under, if any.
    pub fn shard_prefix(&self, key: &str) -> Option<&str> {
        if !key.ends_with(SHARD_SUFFIX) {
            return None;
        }
        self.store_prefixes.iter().map(String::as_str).find(|p| key.starts_with(p) && key.len() > p.len())
    }
}

/// Sealed shards under a store prefix end in this (the S3 notification's suffix filter).
pub const SHARD_SUFFIX: &str = ".sealed";

/// What happened to one record of the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not an input object (another key in the bucket).
    Ignored { key: String },
    /// A shard under a store prefix became (or already was) the input of job `job_id`.
    Copied { key: String, job_id: JobId, input_key: String, already: bool },
    /// A job message was sent.
    Queued { job_id: JobId, message_id: String },
    /// The upload cannot become a job; `check` names why.
    Refused { key: String, check: &'static str, message: String },
}

/// Handles every record of an S3 event on job inputs only (no store prefixes).
pub fn handle(event: &S3Event, services: &Services) -> Result<Vec<Outcome>, OnUploadError> {
    handle_with(event, services, &Config::default())
}

/// Handles every record of an S3 event. Errors are infrastructure failures (the invocation is
/// retried); a bad upload is an [`Outcome::Refused`], not an error.
pub fn handle_with(event: &S3Event, services: &Services, config: &Config) -> Result<Vec<Outcome>, OnUploadError> {
    let mut outcomes = Vec::new();
    for record in &event.records {
        let Some(raw) = record.s3.object.key.as_deref() else { continue };
        let key = url_decode(raw);
        let tenant = Tenant::from_principal(record.principal_id.principal_id.as_deref());
        let outcome = match config.shard_prefix(&key) {
            Some(_) => handle_shard(&key, services)?,
            None => handle_key(&key, &tenant, services, config)?,
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The job id a sealed object's preamble derives, read with one ranged GET.
pub fn derived_job_id(objects: &dyn ObjectStore, key: &str) -> Result<Result<JobId, String>, ObjectError> {
    let head = objects.read_range(key, 0, PREAMBLE_READ)?;
    Ok(match Preamble::parse(&head, StreamKind::JobInput) {
        Ok(Some((preamble, _))) => Ok(JobId(preamble.stream_id())),
        Ok(None) => Err("the object ends inside the envelope preamble".into()),
        Err(error) => Err(error.to_string()),
    })
}

/// A shard under a store prefix → `jobs/<derived id>/input.sealed`, create-only. A second
/// event for the same shard (or a second copy of it) finds the input there and stops.
fn handle_shard(key: &str, services: &Services) -> Result<Outcome, OnUploadError> {
    let jobs = services.jobs.as_ref();
    let gone = || Outcome::Refused { key: key.to_owned(), check: "key", message: "the object is gone".into() };
    // The version whose header is checked is the only one copied (its etag pins the copy).
    let Some(checked) = jobs.head(key)? else { return Ok(gone()) };
    let job = match derived_job_id(jobs, key) {
        Ok(Ok(job)) => job,
        Ok(Err(message)) => {
            tracing::warn!(%key, %message, "sealed shard refused");
            return Ok(Outcome::Refused { key: key.to_owned(), check: "header", message });
        }
        Err(ObjectError::NotFound { .. }) => return Ok(gone()),
        Err(error) => return Err(error.into()),
    };
    let input_key = layout::job_input(&job);
    let copied = |already| Outcome::Copied { key: key.to_owned(), job_id: job, input_key: input_key.clone(), already };
    // Server-side (S3 CopyObject, UploadPartCopy above 5 GiB): a shard of any size, no bytes
    // through this function. Create-only: the commit says whether the input was there.
    match jobs.copy(key, &input_key, Some(&checked.etag), PutCondition::CreateOnly) {
        Ok(meta) => {
            tracing::info!(%key, job = %job, size = meta.size, "shard copied to its job input");
            Ok(copied(false))
        }
        Err(ObjectError::AlreadyExists { .. }) => {
            tracing::info!(%key, job = %job, "shard is already a job");
            Ok(copied(true))
        }
        Err(ObjectError::NotFound { .. }) => Ok(gone()),
        // Replaced after its header was checked: the new version has an event of its own.
        Err(ObjectError::PreconditionFailed { key: changed }) if changed == key => Ok(Outcome::Refused {
            key: key.to_owned(),
            check: "key",
            message: "the shard was replaced after its header was checked; its new version is handled on its own event".into(),
        }),
        Err(error) => Err(error.into()),
    }
}

fn handle_key(key: &str, tenant: &Tenant, services: &Services, config: &Config) -> Result<Outcome, OnUploadError> {
    if !(key.starts_with(layout::JOBS_PREFIX) && key.ends_with(layout::INPUT_SUFFIX)) {
        return Ok(Outcome::Ignored { key: key.to_owned() });
    }
    let Some(job) = layout::job_of_input_key(key) else {
        return Ok(Outcome::Refused { key: key.to_owned(), check: "key", message: "the key does not name a job id".into() });
    };
    match check_upload(key, &job, services, config)? {
        Ok((header, size)) => {
            let message = JobMessage {
                job_id: job,
                input_key: key.to_owned(),
                input_size: size,
                model_id: header.model_id.clone(),
                manifest_hash: hex::encode(header.manifest_hash),
                epoch: header.epoch,
                record_count: header.record_count,
                created_ms: header.created_ms,
                earlier_receives: 0,
            };
            // A re-delivered event must not reset the status of a job that already moved on.
            let status = JobStatus::new(job, JobState::Queued, header.record_count);
            match services.jobs.put(&layout::job_status(&job), &status_json(&status), PutCondition::CreateOnly) {
                Ok(_) | Err(ObjectError::AlreadyExists { .. }) => {}
                Err(error) => status_not_written(&job, error)?,
            }
            let body = serde_json::to_string(&message).expect("a job message serialises");
            let fair_share = SendOptions { group_id: Some(tenant.as_str().to_owned()), ..SendOptions::default() };
            let message_id = services.job_queue.send(&body, &fair_share)?;
            tracing::info!(job = %job, records = header.record_count, tenant = tenant.as_str(), "job queued");
            Ok(Outcome::Queued { job_id: job, message_id })
        }
        Err((check, message)) => {
            tracing::warn!(job = %job, check, %message, "upload refused");
            let mut status = JobStatus::new(job, JobState::Failed, 0);
            status.failure = Some(Failure { check: check.to_owned(), message: message.clone() });
            // Create-only: a re-delivered event refused now (its input deleted after the job
            // completed, its epoch ended since) must not turn an accepted job's status to failed,
            // nor fail the bulk task its host will complete.
            match services.jobs.put(&layout::job_status(&job), &status_json(&status), PutCondition::CreateOnly) {
                Ok(_) => {}
                Err(ObjectError::AlreadyExists { .. }) if !already_failed(services, &job)? => {
                    tracing::warn!(job = %job, check, "a re-delivered upload event is refused now; the job was accepted before and keeps its status");
                    return Ok(Outcome::Refused { key: key.to_owned(), check, message });
                }
                Err(ObjectError::AlreadyExists { .. }) => {}
                Err(error) => status_not_written(&job, error)?,
            }
            fail_waiting_task(&job, check, &message, services)?;
            Ok(Outcome::Refused { key: key.to_owned(), check, message })
        }
    }
}

type Verdict = Result<(JobHeader, u64), (&'static str, String)>;

/// A refused upload is the end of its job, and no host will ever see it: if a bulk run waits
/// for the job on a task token, this step completes it (`SendTaskFailure`
/// `EphemBatch.JobFailed`, cause `<check>: <message>`), as a host does for a job it ends. The
/// failed status is written first and the token read after, the order `bulk-await-shard`
/// mirrors (token first, then the status), so one of the two completes it. A token already
/// closed is fine; an error reading the token or reaching Step Functions fails the invocation
/// (it is retried), except access denied, which only costs the run its prompt answer.
fn fail_waiting_task(job: &JobId, check: &str, message: &str, services: &Services) -> Result<(), OnUploadError> {
    let Some(tokens) = services.task_tokens.as_deref() else { return Ok(()) };
    let end = JobEnd::Failed { reason: format!("{check}: {message}") };
    match workflow::complete_bulk_task(services.jobs.as_ref(), tokens, job, &end) {
        Ok(None) => Ok(()),
        Ok(Some(completion)) => {
            tracing::info!(job = %job, check, ?completion, "bulk task failed with the refusal");
            Ok(())
        }
        Err(error) if error.is_access_denied() => {
            tracing::warn!(job = %job, %error, "bulk task not completed; the run waits for its timeout");
            Ok(())
        }
        Err(error) => Err(OnUploadError::Task(error)),
    }
}

/// Whether the job's existing status is a failure (an earlier refusal of the same upload).
fn already_failed(services: &Services, job: &JobId) -> Result<bool, OnUploadError> {
    let bytes = match services.jobs.get_at_most(&layout::job_status(job), cloud::MAX_SMALL_OBJECT) {
        Ok(bytes) => bytes,
        Err(ObjectError::NotFound { .. }) => return Ok(false),
        Err(error) => return Err(error.into()),
    };
    Ok(serde_json::from_slice::<JobStatus>(&bytes).is_ok_and(|s| s.state == JobState::Failed))
}

/// `status.json` is informative: a deployment that does not let this function write it (access
/// denied) loses nothing but the status; any other failure is retried.
fn status_not_written(job: &JobId, error: ObjectError) -> Result<(), OnUploadError> {
    match error {
        ObjectError::AccessDenied { .. } => {
            tracing::warn!(job = %job, %error, "status.json not written");
            Ok(())
        }
        other => Err(other.into()),
    }
}

fn check_upload(key: &str, job: &JobId, services: &Services, config: &Config) -> Result<Verdict, OnUploadError> {
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
    if let Err(message) = config.limits.check(header.record_count, meta.size) {
        return Ok(Err(("job_limits", message)));
    }
    if config.check_epoch
        && let Err(message) = check_epoch(&header, services)?
    {
        return Ok(Err(("fleet_epoch", message)));
    }
    if config.check_manifest && !manifest_published(&header, services.models.as_ref())? {
        return Ok(Err((
            "model_manifest",
            format!("no published manifest of {} has hash {}", header.model_id, hex::encode(header.manifest_hash)),
        )));
    }
    Ok(Ok((header, meta.size)))
}

fn check_epoch(header: &JobHeader, services: &Services) -> Result<Result<(), String>, OnUploadError> {
    let key = epoch_object_key(header.epoch);
    let bytes = match services.attestations.get_at_most(&key, cloud::MAX_SMALL_OBJECT) {
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
        let bytes = match models.get_at_most(&meta.key, cloud::MAX_SMALL_OBJECT) {
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
pub(crate) fn url_decode(key: &str) -> String {
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

#[cfg(test)]
mod shard_tests {
    use super::*;
    use lambdas_testing::Fixture;
    use cloud::messages::JobMessage;
    use std::time::Duration;

    fn event(key: &str) -> S3Event {
        object_created_event("jobs", key, 1, "e")
    }

    fn config() -> Config {
        Config::from_list("stores/acme/incoming/, tenants/globex")
    }

    #[test]
    fn store_prefixes_parse() {
        let c = config();
        assert_eq!(c.store_prefixes, vec!["stores/acme/incoming/", "tenants/globex/"]);
        assert_eq!(c.shard_prefix("stores/acme/incoming/a/b.sealed"), Some("stores/acme/incoming/"));
        assert_eq!(c.shard_prefix("stores/acme/incoming/b.json"), None);
        assert_eq!(c.shard_prefix("stores/acme/b.sealed"), None);
        assert_eq!(Config::from_list(" ,").store_prefixes, Vec::<String>::new());
    }

    #[test]
    fn a_shard_becomes_the_job_its_preamble_names() {
        let f = Fixture::new();
        let (bytes, job) = f.sealed(12);
        let key = "stores/acme/incoming/2026/part-0001.sealed";
        f.services.jobs.put(key, &bytes, PutCondition::CreateOnly).unwrap();

        let out = handle_with(&event(key), &f.services, &config()).unwrap();
        let input_key = layout::job_input(&job);
        assert_eq!(
            out,
            vec![Outcome::Copied { key: key.into(), job_id: job, input_key: input_key.clone(), already: false }]
        );
        assert_eq!(f.services.jobs.get(&input_key).unwrap(), bytes);

        // The input's own event creates the job, through the same checks as any upload.
        let out = handle_with(&event(&input_key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Queued { job_id, .. } if *job_id == job), "{out:?}");
        let received = f.services.job_queue.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap();
        let message: JobMessage = serde_json::from_str(&received[0].body).unwrap();
        assert_eq!((message.input_key.as_str(), message.record_count), (input_key.as_str(), 12));

        // The same shard dropped again (or the event re-delivered) is the same job.
        f.services.jobs.put("stores/acme/incoming/copy.sealed", &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event("stores/acme/incoming/copy.sealed"), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Copied { already: true, .. }), "{out:?}");
    }

    /// A tenant announces more records than its bytes can hold (or than a job may take): the job
    /// ends `failed` with `job_limits` before any host is asked to work on it.
    #[test]
    fn an_upload_announcing_more_than_it_can_hold_is_refused_before_it_is_queued() {
        let f = Fixture::new();
        let (bytes, job) = f.sealed(1_000_000);
        let input_key = layout::job_input(&job);
        f.services.jobs.put(&input_key, &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&input_key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "job_limits", .. }), "{out:?}");
        let status: JobStatus = serde_json::from_slice(&f.services.jobs.get(&layout::job_status(&job)).unwrap()).unwrap();
        assert_eq!((status.state, status.failure.unwrap().check.as_str()), (JobState::Failed, "job_limits"));
        assert!(f.services.job_queue.receive(10, Duration::ZERO, Duration::from_secs(30)).unwrap().is_empty());

        let tight = Config { limits: JobLimits { max_records: 2, ..JobLimits::default() }, ..config() };
        let (bytes, job) = f.sealed(3);
        f.services.jobs.put(&layout::job_input(&job), &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&layout::job_input(&job)), &f.services, &tight).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "job_limits", message, .. } if message.contains("at most 2")), "{out:?}");
    }

    #[test]
    fn a_redelivered_event_refused_later_leaves_an_accepted_jobs_status_alone() {
        let f = Fixture::new();
        let (bytes, job) = f.sealed(3);
        let input_key = layout::job_input(&job);
        f.services.jobs.put(&input_key, &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&input_key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Queued { .. }), "{out:?}");
        // The job completed and its input was deleted after the ledger took the receipt.
        let done = JobStatus::new(job, JobState::Completed, 3);
        f.services.jobs.put(&layout::job_status(&job), &status_json(&done), PutCondition::Overwrite).unwrap();
        f.services.jobs.delete(&input_key).unwrap();
        let out = handle_with(&event(&input_key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { .. }), "{out:?}");
        let status: JobStatus = serde_json::from_slice(&f.services.jobs.get(&layout::job_status(&job)).unwrap()).unwrap();
        assert_eq!(status.state, JobState::Completed, "a later refusal rewrote an accepted job's status");
    }

    #[test]
    fn shards_that_cannot_be_jobs_are_refused_by_name() {
        let f = Fixture::new();
        f.services.jobs.put("tenants/globex/junk.sealed", b"not an envelope at all", PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event("tenants/globex/junk.sealed"), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "header", .. }), "{out:?}");
        let out = handle_with(&event("tenants/globex/gone.sealed"), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "key", .. }), "{out:?}");
        // Outside every store prefix nothing happens, even with a valid shard.
        let (bytes, _) = f.sealed(1);
        f.services.jobs.put("elsewhere/x.sealed", &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event("elsewhere/x.sealed"), &f.services, &config()).unwrap();
        assert_eq!(out, vec![Outcome::Ignored { key: "elsewhere/x.sealed".into() }]);
        assert!(f.services.jobs.list(layout::JOBS_PREFIX).unwrap().is_empty());
    }

    /// A bulk run waits on a shard's token; the shard's job input is then refused. No host will
    /// ever see the job, so the refusal itself fails the token, naming the check — and in the
    /// other order, `bulk-await-shard` finds the failed status and fails the token itself.
    #[test]
    fn a_refused_upload_fails_the_bulk_task_waiting_for_it() {
        use crate::bulk::{await_shard, AwaitInput, AwaitState};
        use cloud_local::TokenOutcome;
        let f = Fixture::new();
        let workflows = f.cloud.workflows();
        // The manifest the jobs name is withdrawn: every upload is refused as model_manifest.
        f.services.models.delete(&layout::model_manifest(lambdas_testing::MODEL, 1)).unwrap();
        let await_input = |job: &JobId, token: &str| AwaitInput {
            bulk_id: "b-refused".into(),
            bucket: "jobs".into(),
            key: format!("stores/acme/incoming/{job}.sealed"),
            job_id: *job,
            task_token: token.into(),
        };

        // The token is written first, the refusal comes later.
        let (bytes, job) = f.sealed(3);
        let token = workflows.issue_token("local:execution:b-refused").unwrap();
        let awaited = await_shard(&await_input(&job, &token), f.services.jobs.as_ref(), workflows.as_ref(), 1).unwrap();
        assert_eq!(awaited.state, AwaitState::Waiting);
        let key = layout::job_input(&job);
        f.services.jobs.put(&key, &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "model_manifest", .. }), "{out:?}");
        match workflows.outcome(&token).unwrap() {
            Some(TokenOutcome::Failed { error, cause }) => {
                assert_eq!(error, cloud::workflow::JOB_FAILED_ERROR);
                assert!(cause.starts_with("model_manifest: no published manifest"), "{cause}");
            }
            other => panic!("the token is {other:?}, not failed"),
        }
        // The event delivered again: the token is closed already, which is no error.
        handle_with(&event(&key), &f.services, &config()).unwrap();

        // The refusal first, the token later: bulk-await-shard fails it from the status.
        let (bytes, job) = f.sealed(3);
        let key = layout::job_input(&job);
        f.services.jobs.put(&key, &bytes, PutCondition::CreateOnly).unwrap();
        handle_with(&event(&key), &f.services, &config()).unwrap();
        let token = workflows.issue_token("local:execution:b-refused").unwrap();
        let awaited = await_shard(&await_input(&job, &token), f.services.jobs.as_ref(), workflows.as_ref(), 2).unwrap();
        assert_eq!(awaited.state, AwaitState::Completed);
        assert!(
            matches!(workflows.outcome(&token).unwrap(), Some(TokenOutcome::Failed { cause, .. }) if cause.starts_with("model_manifest: ")),
        );

        // An accepted upload completes nothing: its host will.
        f.services.models.put(&layout::model_manifest(lambdas_testing::MODEL, 1), b"a signed manifest (only its hash matters here)", PutCondition::CreateOnly).unwrap();
        let (bytes, job) = f.sealed(3);
        let token = workflows.issue_token("local:execution:b-ok").unwrap();
        await_shard(&await_input(&job, &token), f.services.jobs.as_ref(), workflows.as_ref(), 3).unwrap();
        let key = layout::job_input(&job);
        f.services.jobs.put(&key, &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Queued { .. }), "{out:?}");
        assert_eq!(workflows.outcome(&token).unwrap(), None, "the token stays open");
    }

    #[test]
    fn a_job_input_under_another_jobs_id_is_refused() {
        let f = Fixture::new();
        let (bytes, _) = f.sealed(1);
        let (_, victim) = f.sealed(1);
        let key = layout::job_input(&victim);
        f.services.jobs.put(&key, &bytes, PutCondition::CreateOnly).unwrap();
        let out = handle_with(&event(&key), &f.services, &config()).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "job_id", .. }), "{out:?}");
        assert_eq!(f.services.job_queue.stats().unwrap().visible, 0);
    }
}

#[cfg(test)]
mod copy_tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use cloud::hooked::{Hooked, StoreHooks};

    use super::*;
    use lambdas_testing::Fixture;

    /// A tenant who replaces a shard right after its header was read.
    struct SwapAfterRead {
        key: String,
        replacement: Vec<u8>,
        swapped: AtomicBool,
    }

    impl StoreHooks for SwapAfterRead {
        fn read_range(&self, inner: &dyn ObjectStore, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, ObjectError> {
            let bytes = inner.read_range(key, offset, len)?;
            if key == self.key && !self.swapped.swap(true, Ordering::SeqCst) {
                inner.put(key, &self.replacement, PutCondition::Overwrite)?;
            }
            Ok(bytes)
        }
    }

    /// The shard is swapped for another between the header check and the copy: the copy is
    /// pinned to the checked version's etag, so nothing lands under the checked job's id.
    #[test]
    fn a_shard_swapped_after_its_header_was_checked_is_not_copied() {
        let f = Fixture::new();
        let (checked, job) = f.sealed(4);
        let (other, _) = f.sealed(5);
        let key = "stores/acme/incoming/part-7.sealed";
        f.services.jobs.put(key, &checked, PutCondition::CreateOnly).unwrap();
        let mut services = f.services.clone();
        let swap = SwapAfterRead { key: key.into(), replacement: other.clone(), swapped: AtomicBool::new(false) };
        services.jobs = Arc::new(Hooked::new(f.services.jobs.clone(), swap));
        let event = object_created_event("jobs", key, checked.len() as u64, "e");
        let out = handle_with(&event, &services, &Config::from_list("stores/acme/incoming/")).unwrap();
        assert!(matches!(&out[0], Outcome::Refused { check: "key", message, .. } if message.contains("replaced")), "{out:?}");
        assert_eq!(f.services.jobs.head(&layout::job_input(&job)).unwrap(), None, "another shard's bytes under the checked job's id");
        assert!(f.services.jobs.list(layout::JOBS_PREFIX).unwrap().is_empty());
        assert_eq!(f.services.jobs.get(key).unwrap(), other);
    }
}
