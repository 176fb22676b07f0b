//! Test fixtures of the Lambda handlers, for `lambdas`' own tests and the embedded default's
//! (`devstack`): a local cloud with a published fleet epoch and model manifest, and sealed job
//! inputs made for them. A dev-dependency only: the handlers' library never reaches the local
//! adapters (`scripts/deny.sh`).

use cloud_local::LocalCloud;
use cloud::{PutCondition, Services};
use protocol::envelope::{seal_job, FleetSecretKey, JobHeader, JobId, JobOptions, ResultSecretKey};
use protocol::fleet::{epoch_object_key, EpochRecord};
use sha2::{Digest, Sha256};

pub const MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
pub const EPOCH: u64 = 3;

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub cloud: LocalCloud,
    pub services: Services,
    pub fleet: FleetSecretKey,
    pub manifest_hash: [u8; 32],
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cloud = LocalCloud::open(dir.path()).unwrap();
        let services = cloud.services();
        let fleet = FleetSecretKey::generate();
        let record = EpochRecord {
            epoch: EPOCH,
            not_after_ms: cloud::now_ms() + 86_400_000,
            kms_key_id: "alias/test".into(),
            public_key: hex::encode(fleet.public_key().to_bytes()),
            wrapped_private_key: "00".into(),
        };
        services.attestations.put(&epoch_object_key(EPOCH), record.to_json().as_bytes(), PutCondition::CreateOnly).unwrap();
        let manifest = b"a signed manifest (only its hash matters here)".to_vec();
        services.models.put(&cloud::layout::model_manifest(MODEL, 1), &manifest, PutCondition::CreateOnly).unwrap();
        Self { _dir: dir, cloud, services, fleet, manifest_hash: Sha256::digest(&manifest).into() }
    }

    /// The job's `status.json`.
    pub fn status(&self, job: &JobId) -> cloud::messages::JobStatus {
        serde_json::from_slice(&self.services.jobs.get(&cloud::layout::job_status(job)).unwrap()).unwrap()
    }

    /// A bulk run waits for `job` on a token (bulk-await-shard wrote it before the job ended).
    pub fn waiting_token(&self, job: &JobId, bulk_id: &str) -> String {
        let workflows = self.cloud.workflows();
        let token = workflows.issue_token(&format!("local:execution:{bulk_id}")).unwrap();
        let input = lambdas::bulk::AwaitInput {
            bulk_id: bulk_id.into(),
            bucket: "jobs".into(),
            key: format!("stores/acme/{job}.sealed"),
            job_id: *job,
            task_token: token.clone(),
        };
        lambdas::bulk::await_shard(&input, self.services.jobs.as_ref(), workflows.as_ref(), cloud::now_ms()).unwrap();
        assert_eq!(workflows.outcome(&token).unwrap(), None, "the token waits");
        token
    }

    /// The cause a failed bulk task token was failed with.
    pub fn failed_cause(&self, token: &str) -> String {
        match self.cloud.workflows().outcome(token).unwrap() {
            Some(cloud_local::TokenOutcome::Failed { error, cause }) => {
                assert_eq!(error, cloud::workflow::JOB_FAILED_ERROR);
                cause
            }
            other => panic!("the token is {other:?}, not failed"),
        }
    }

    /// A sealed job input (preamble and some body bytes) and its job id.
    pub fn sealed(&self, records: u64) -> (Vec<u8>, JobId) {
        let header = JobHeader {
            fleet_key_id: self.fleet.public_key().key_id(),
            epoch: EPOCH,
            model_id: MODEL.into(),
            manifest_hash: self.manifest_hash,
            options: JobOptions::default(),
            result_public_key: ResultSecretKey::generate().public_key().to_bytes(),
            record_count: records,
            created_ms: cloud::now_ms(),
        };
        let sealed = seal_job(&header, &self.fleet.public_key()).unwrap();
        let mut bytes = sealed.preamble;
        bytes.extend_from_slice(&[0x5a; 300]);
        (bytes, JobId(sealed.stream_id))
    }
}
