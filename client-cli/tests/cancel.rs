//! `ephem-batch cancel` against another tenant who can write the jobs bucket.

mod support;

use cloud::{layout, PutCondition};
use ephem_batch_client::status::{self, CancelFailure};
use protocol::cancel::{self, CancelError, CancelRequest};
use protocol::envelope::{JobId, ResultSecretKey};
use support::{ids, Fixture};

fn queued_job(f: &Fixture, tag: &str) -> JobId {
    let job = f.seal(&f.services, &f.corpus(&ids(tag, 2))).unwrap_or_else(|e| panic!("{e:#}"));
    job.job_id
}

fn failure(result: anyhow::Result<()>) -> CancelFailure {
    let error = result.expect_err("refused");
    error.downcast::<CancelFailure>().unwrap_or_else(|e| panic!("not a named cancel failure: {e:#}"))
}

#[test]
fn a_cancel_is_signed_by_the_submitter_and_a_forged_one_is_named() {
    let f = Fixture::new();
    let key = f.result_key();
    let input_prefix = |job: &JobId| f.services.jobs.read_range(&layout::job_input(job), 0, cancel::INPUT_PREFIX_LEN).unwrap();

    // The submitter's cancel: what it writes verifies against the job's own header.
    let mine = queued_job(&f, "mine");
    status::cancel(&f.services, &mine, &key).unwrap();
    let written = f.services.jobs.get(&layout::job_cancel(&mine)).unwrap();
    cancel::check(&input_prefix(&mine), &mine, &written).unwrap();
    status::cancel(&f.services, &mine, &key).expect("cancelling again finds its own cancel");

    // Another tenant's key cannot cancel it, and the client writes nothing the host would ignore.
    let other = queued_job(&f, "other");
    let stranger = ResultSecretKey::generate();
    match failure(status::cancel(&f.services, &other, &stranger)) {
        CancelFailure::NotOurs { check: CancelError::Signature, .. } => {}
        other => panic!("{other}"),
    }
    assert!(f.services.jobs.head(&layout::job_cancel(&other)).unwrap().is_none());

    // A tenant got there first with a cancel of its own: the name is taken (create-only), and
    // the submitter is told so rather than told the job was cancelled.
    let forged = CancelRequest::new(&stranger, &other, 1).to_json();
    f.services.jobs.put(&layout::job_cancel(&other), forged.as_bytes(), PutCondition::CreateOnly).unwrap();
    match failure(status::cancel(&f.services, &other, &key)) {
        CancelFailure::Occupied { key, check: CancelError::Signature } => assert_eq!(key, layout::job_cancel(&other)),
        other => panic!("{other}"),
    }
    assert_eq!(cancel::check(&input_prefix(&other), &other, forged.as_bytes()), Err(CancelError::Signature), "hosts ignore it");
}
