//! Where everything lives in the object stores (DESIGN.md §5). One function per kind of object,
//! so no component spells a key by hand.

use protocol::envelope::JobId;

/// The sealed input; creating it is what creates the job (the upload event).
pub fn job_input(job: &JobId) -> String {
    format!("jobs/{job}/input.sealed")
}

/// One attempt's sealed output: two deliveries of a job never write the same object.
pub fn job_output(job: &JobId, attempt: u64) -> String {
    format!("jobs/{job}/attempts/{attempt}/output.sealed")
}

pub fn job_attempts_prefix(job: &JobId) -> String {
    format!("jobs/{job}/attempts/")
}

/// The committed receipt (create-only: the first finished attempt wins).
pub fn job_receipt(job: &JobId) -> String {
    format!("jobs/{job}/receipt.cose")
}

/// Informative status for humans; the receipt is the truth.
pub fn job_status(job: &JobId) -> String {
    format!("jobs/{job}/status.json")
}

/// A client's cancellation of a job that has not started (create-only).
pub fn job_cancel(job: &JobId) -> String {
    format!("jobs/{job}/cancel.json")
}

/// Written after the ledger appended the job's receipt.
pub fn job_ledgered(job: &JobId) -> String {
    format!("jobs/{job}/ledgered.json")
}

/// The job's ledger proof (a proof bundle, docs/protocol.md §8.6): its receipt, the inclusion
/// proof and the signed checkpoint it was proven against, written by the ledger's appender
/// before [`job_ledgered`], so a tenant checks inclusion with access to its own jobs only.
pub fn job_ledger_proof(job: &JobId) -> String {
    format!("jobs/{job}/ledger-proof.json")
}

/// The job's receipt as an IETF SCITT transparent statement with the ledger's COSE Receipt
/// (docs/protocol.md §8.13), written by the appender beside [`job_ledger_proof`].
pub fn job_transparent_statement(job: &JobId) -> String {
    format!("jobs/{job}/transparent-statement.cbor")
}

/// Where the bulk runs waiting for this job leave their task tokens, one object per run.
pub fn job_bulk_tasks_prefix(job: &JobId) -> String {
    format!("jobs/{job}/bulk-tasks/")
}

/// The task token bulk run `bulk_id` waits on for this job (`cloud::workflow::BulkTask`):
/// written by the workflow's `bulk-await-shard` step, read by whoever ends the job. One slot per
/// run, so a second run over the same shard never replaces the first one's token.
pub fn job_bulk_task(job: &JobId, bulk_id: &str) -> String {
    format!("{}{bulk_id}.json", job_bulk_tasks_prefix(job))
}

/// The bulk id a key made by [`job_bulk_task`] for `job` names.
pub fn bulk_id_of_task_key<'k>(job: &JobId, key: &'k str) -> Option<&'k str> {
    key.strip_prefix(&job_bulk_tasks_prefix(job))?.strip_suffix(".json")
}

/// A bulk run's manifest (written by `bulk-aggregate`; it signs nothing).
pub fn bulk_manifest(bulk_id: &str) -> String {
    format!("bulk/{bulk_id}/manifest.json")
}

/// A bulk run's shard listing (written once by `bulk-list-shards`, read by `bulk-aggregate`):
/// the list stays out of the workflow's state, which Step Functions caps at 256 KiB.
pub fn bulk_shards(bulk_id: &str) -> String {
    format!("bulk/{bulk_id}/shards.json")
}

pub const JOBS_PREFIX: &str = "jobs/";
pub const INPUT_SUFFIX: &str = "/input.sealed";

/// The job id named by an input key `jobs/<id>/input.sealed`, if the key has that shape.
pub fn job_of_input_key(key: &str) -> Option<JobId> {
    let id = key.strip_prefix(JOBS_PREFIX)?.strip_suffix(INPUT_SUFFIX)?;
    JobId::from_hex(id)
}

/// A published attestation document, by its SHA-256 (receipts name documents this way).
pub fn attestation_by_hash(sha256: &[u8; 32]) -> String {
    format!("attestations/by-hash/{}.cbor", hex::encode(sha256))
}

/// The document a host currently publishes for its enclave.
pub fn attestation_current(host_id: &str) -> String {
    format!("attestations/current/{host_id}.cbor")
}

pub const ATTESTATIONS_CURRENT_PREFIX: &str = "attestations/current/";

/// A client's request for a fresh document carrying its nonce (hex of the nonce).
pub fn attestation_request(nonce: &[u8]) -> String {
    format!("{ATTESTATION_REQUESTS_PREFIX}{}.json", hex::encode(nonce))
}

pub const ATTESTATION_REQUESTS_PREFIX: &str = "attestations/requests/";

/// S3's longest key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest nonce [`attestation_request`] can name: its hex must fit an S3 key beside the
/// prefix and suffix (498 bytes, below the NSM's 512).
pub const MAX_REQUEST_NONCE_LEN: usize = (MAX_KEY_LEN - ATTESTATION_REQUESTS_PREFIX.len() - ".json".len()) / 2;

/// The answer to [`attestation_request`]: a document whose `nonce` is the client's.
pub fn attestation_fresh(nonce: &[u8]) -> String {
    format!("attestations/fresh/{}.cbor", hex::encode(nonce))
}

/// The nonce of a request key made by [`attestation_request`].
pub fn nonce_of_request(key: &str) -> Option<Vec<u8>> {
    hex::decode(key.strip_prefix(ATTESTATION_REQUESTS_PREFIX)?.strip_suffix(".json")?).ok()
}

pub const MODELS_PREFIX: &str = "models/";
pub const MANIFEST_NAME: &str = "manifest.cose";

/// A model version's signed manifest: `models/<name>/v<version>/manifest.cose`, where `<name>`
/// is the model id's last path segment.
pub fn model_manifest(model_id: &str, version: u64) -> String {
    let name = model_id.rsplit('/').next().unwrap_or(model_id);
    format!("models/{name}/v{version}/{MANIFEST_NAME}")
}

/// The version number in a manifest key made by [`model_manifest`]; `None` for any other
/// spelling of a number (`v03`, `v+3`): one key per version, whoever lists the bucket.
pub fn manifest_version(key: &str) -> Option<u64> {
    let rest = key.strip_prefix(MODELS_PREFIX)?.strip_suffix(MANIFEST_NAME)?.strip_suffix('/')?;
    let segment = rest.rsplit('/').next()?;
    let version: u64 = segment.strip_prefix('v')?.parse().ok()?;
    (segment == format!("v{version}")).then_some(version)
}

pub const FLEET_KEYS_PREFIX: &str = "fleet-keys/";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let job = JobId([0xab; 16]);
        assert_eq!(job_input(&job), format!("jobs/{}/input.sealed", "ab".repeat(16)));
        assert_eq!(job_of_input_key(&job_input(&job)), Some(job));
        assert_eq!(job_of_input_key("jobs/zz/input.sealed"), None);
        assert_eq!(job_of_input_key(&job_output(&job, 1)), None);
        let task = job_bulk_task(&job, "run-1");
        assert_eq!(task, format!("jobs/{}/bulk-tasks/run-1.json", "ab".repeat(16)));
        assert!(task.starts_with(&job_bulk_tasks_prefix(&job)));
        assert_eq!(bulk_id_of_task_key(&job, &task), Some("run-1"));
        assert_eq!(bulk_id_of_task_key(&JobId([0xcd; 16]), &task), None);
        assert_eq!(bulk_manifest("run-1"), "bulk/run-1/manifest.json");
        assert_eq!(bulk_shards("run-1"), "bulk/run-1/shards.json");
        let key = model_manifest("sentence-transformers/all-MiniLM-L6-v2", 3);
        assert_eq!(key, "models/all-MiniLM-L6-v2/v3/manifest.cose");
        assert_eq!(manifest_version(&key), Some(3));
        assert_eq!(manifest_version("models/x/manifest.cose"), None);
        for other_spelling in ["v03", "v+3", "v3 ", "V3", "v"] {
            assert_eq!(manifest_version(&format!("models/x/{other_spelling}/manifest.cose")), None, "{other_spelling}");
        }
        assert_eq!(manifest_version("models/x/v0/manifest.cose"), Some(0));
    }

    #[test]
    fn the_longest_request_nonce_fits_an_s3_key() {
        assert_eq!(attestation_request(&[0xff; MAX_REQUEST_NONCE_LEN]).len(), MAX_KEY_LEN - 1);
        assert!(attestation_request(&[0xff; MAX_REQUEST_NONCE_LEN + 1]).len() > MAX_KEY_LEN);
    }
}
