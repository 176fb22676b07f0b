//! Before a job runs, the worker must hold its model: with a memory budget it may hold only some
//! of the published ones, so a job whose model it does not hold asks control to load it (which
//! may evict the least recently used) and waits for that. The model is the one the job's own
//! header names — the job id commits to the header — not the queue message's claim, so a message
//! cannot make the host load and evict models for a job that does not use them.

use protocol::envelope::{JobHeader, JobId, Preamble, StreamKind};

use std::time::Duration;

use cloud::Services;

use crate::control;
use crate::retry;
use crate::shared::Shared;

/// The header of the job's sealed input, if `input_prefix` is one and its id is `job`'s.
pub(crate) fn job_header(input_prefix: &[u8], job: &JobId) -> Option<JobHeader> {
    let (preamble, _) = Preamble::parse_complete(input_prefix, StreamKind::JobInput).ok()?;
    if JobId(preamble.stream_id()) != *job {
        return None;
    }
    JobHeader::from_bytes(&preamble.header).ok()
}

/// Makes sure the worker holds the model of `job` (as far as control knows), loading its newest
/// manifest if not. Best effort: whatever happens, the attempt runs and the worker decides.
///
/// `claimed` is the queue message's model: when the worker holds it, nothing is read (a false
/// claim only keeps its own job from loading its model); otherwise the header decides.
/// Waits at most `timeout` for the load.
pub(crate) fn ensure_model(services: &Services, shared: &Shared, timeout: Duration, job: &JobId, claimed: &str) {
    if shared.loaded(&control::model_dir_of(claimed)).is_some() {
        return;
    }
    let jobs = &services.jobs;
    let input_key = cloud::layout::job_input(job);
    let Ok(prefix) = retry::transient("read input header", || jobs.read_range(&input_key, 0, protocol::cancel::INPUT_PREFIX_LEN)) else {
        return;
    };
    let Some(header) = job_header(&prefix, job) else { return };
    let dir = control::model_dir_of(&header.model_id);
    if dir.is_empty() || shared.loaded(&dir).is_some() {
        return;
    }
    let Ok(Some(manifest_key)) = control::newest_manifest(&*services.models, &header.model_id) else { return };
    tracing::info!(model = header.model_id, manifest = manifest_key, "the worker does not hold the job's model: loading it");
    if !shared.demand_model(&dir, &manifest_key, timeout) {
        tracing::warn!(model = header.model_id, "the job's model was not loaded; the attempt runs and the worker decides");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::envelope::{seal_job, FleetSecretKey, JobOptions, ResultSecretKey};

    fn sealed(model_id: &str) -> (JobId, Vec<u8>) {
        let fleet = FleetSecretKey::generate().public_key();
        let header = JobHeader {
            fleet_key_id: fleet.key_id(),
            epoch: 1,
            model_id: model_id.into(),
            manifest_hash: [1; 32],
            options: JobOptions::default(),
            result_public_key: ResultSecretKey::generate().public_key().to_bytes(),
            record_count: 1,
            created_ms: 1,
        };
        let sealed = seal_job(&header, &fleet).unwrap();
        (JobId(sealed.stream_id), sealed.preamble)
    }

    #[test]
    fn the_model_is_the_one_the_job_id_commits_to() {
        let (job, input) = sealed("org/model-a");
        assert_eq!(job_header(&input, &job).unwrap().model_id, "org/model-a");
        // Another job's input put under this job's key (to have the host load model b): not read.
        let (_, other) = sealed("org/model-b");
        assert!(job_header(&other, &job).is_none());
        assert!(job_header(&input[..input.len() - 1], &job).is_none(), "a cut header is not read");
    }
}
