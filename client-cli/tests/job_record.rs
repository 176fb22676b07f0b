//! What the client remembers of a job (`client/jobs/<id>/job.json`), against another local user
//! reading it and a step failing after the upload.

mod support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use cloud::hooked::{Hooked, StoreHooks};
use cloud::messages::JobState;
use cloud::{layout, ObjectError, ObjectMeta, ObjectStore, ObjectWriter, PutCondition, Services};
use ephem_batch_client::jobstate::{IdsDigest, JobFiles};
use ephem_batch_client::status;
use protocol::envelope::JobId;
use protocol::records::{encode_input, InputRecord};
use support::{ids, sha256, Fixture};

/// The plaintext record stream a corpus of `ids` seals (what someone guessing the corpus
/// would hash), and the client's digest of its ids.
fn guessed_digests(ids: &[String]) -> (String, String) {
    let mut plain = Vec::new();
    let mut digest = IdsDigest::new();
    for id in ids {
        encode_input(&InputRecord { id: id.clone(), text: format!("text of {id}").into_bytes() }, &mut plain).unwrap();
        digest.push(id);
    }
    (hex::encode(sha256(&plain)), digest.finish())
}

fn job_json(f: &Fixture, job: &str) -> (String, u32) {
    let path = f.home.job_dir(job).join("job.json");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    (std::fs::read_to_string(&path).unwrap(), mode)
}

#[test]
fn job_json_is_private_and_confirms_no_guess_of_the_corpus() {
    let f = Fixture::new();
    let corpus = ids("patient", 5);
    let job = f.seal(&f.services, &f.corpus(&corpus)).unwrap_or_else(|e| panic!("{e:#}"));
    let id = job.job_id.clone();
    let ran = f.complete(&id);
    let (plain_guess, ids_guess) = guessed_digests(&corpus);
    assert_eq!(plain_guess, hex::encode(ran.input_plain_sha256), "the guess is the very plaintext the enclave opened");

    let (text, mode) = job_json(&f, &job.job_id.to_hex());
    assert_eq!(mode, 0o600, "job.json is the user's alone");
    assert!(!text.contains(&plain_guess), "job.json confirms a guessed corpus by its plaintext hash:\n{text}");
    assert!(!text.contains(&ids_guess), "job.json confirms guessed record ids:\n{text}");

    // What the digests are kept for still works: results check the receipt's keyed commitment
    // and the ids against them, and the downloaded output's digests are kept as privately.
    let written = f.results(&id, &f.work.join("out.jsonl")).unwrap_or_else(|e| panic!("{e:#}"));
    for check in ["commitment", "record_ids"] {
        assert!(written.verification.checks.iter().any(|c| c.name == check && c.passed), "{check} passes");
    }
    let (text, mode) = job_json(&f, &job.job_id.to_hex());
    assert_eq!(mode, 0o600);
    assert!(text.contains("\"downloaded\""), "{text}");
    for digest in [&plain_guess, &ids_guess, &hex::encode(ran.output_plain_sha256)] {
        assert!(!text.contains(digest.as_str()), "job.json after results names a plaintext digest:\n{text}");
    }
    let again = JobFiles::new(&f.home, &job.job_id.to_hex()).load().unwrap();
    assert_eq!(again.plaintext_sha256, plain_guess, "the client itself reads its digests back");
}

/// A store whose streamed uploads land but whose acknowledgement is lost (a timeout after
/// S3 completed the upload): the object exists, the client sees an error.
struct AckLost;

struct AckLostWriter(Box<dyn ObjectWriter>);

impl Write for AckLostWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ObjectWriter for AckLostWriter {
    fn commit(self: Box<Self>) -> Result<ObjectMeta, ObjectError> {
        let meta = self.0.commit()?;
        Err(ObjectError::Unavailable { key: meta.key, message: "timed out waiting for CompleteMultipartUpload".into() })
    }
}

impl StoreHooks for AckLost {
    fn writer(&self, inner: &dyn ObjectStore, key: &str, condition: PutCondition) -> Result<Box<dyn ObjectWriter>, ObjectError> {
        Ok(Box::new(AckLostWriter(inner.writer(key, condition)?)))
    }
}

#[test]
fn a_job_uploaded_before_a_later_step_failed_stays_on_record() {
    let f = Fixture::new();
    let services = Services { jobs: Arc::new(Hooked::new(f.services.jobs.clone(), AckLost)), ..f.services.clone() };
    let error = f.seal(&services, &f.corpus(&ids("a", 4))).expect_err("the upload's acknowledgement was lost");
    assert!(format!("{error:#}").contains("timed out"), "{error:#}");

    // The upload landed: the job exists and will run whatever the client saw.
    let inputs: Vec<String> = f.services.jobs.list("jobs/").unwrap().into_iter().map(|m| m.key).filter(|k| k.ends_with("/input.sealed")).collect();
    assert_eq!(inputs.len(), 1, "{inputs:?}");
    let job_hex = inputs[0].trim_start_matches("jobs/").trim_end_matches("/input.sealed");
    let id = JobId::from_hex(job_hex).unwrap();

    // The client still knows it: the record was on disk before the upload could land.
    let record = JobFiles::new(&f.home, job_hex).load().unwrap_or_else(|e| panic!("the client lost the job it uploaded: {e:#}"));
    assert_eq!(record.sealed_sha256, hex::encode(sha256(&f.services.jobs.get(&layout::job_input(&id)).unwrap())));
    assert_eq!(status::view(&f.services, &id).unwrap().state, JobState::Queued);
    f.complete(&id);
    let written = f.results(&id, &f.work.join("out.jsonl")).unwrap_or_else(|e| panic!("results of the job on record: {e:#}"));
    assert_eq!(written.summary.records, 4);
}
