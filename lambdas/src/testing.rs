//! Test fixtures: a local cloud with a published fleet epoch and model manifest, and sealed
//! job inputs made for them.

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
