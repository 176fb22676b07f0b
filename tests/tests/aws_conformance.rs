//! The cloud traits' semantics, the same functions (`tests::conformance`) against the AWS
//! adapters on an AWS emulator (moto: S3, SQS, KMS) and against the local stand-ins.
//!
//! KMS against the emulator covers only what moto implements faithfully (Encrypt, Decrypt,
//! GenerateDataKey, encryption context). moto ignores `Recipient` — it answers with plaintext —
//! and has no `GenerateDataKeyPair*`: [`aws_kms_refuses_a_recipient_answer_without_cms`] shows
//! that the adapter refuses such an answer rather than pass plaintext on, and the pipeline
//! tests route KMS through the local KMS (`tests/tests/aws_pipeline.rs`).

use std::sync::Arc;
use std::time::Duration;

use cloud_aws::{AwsClients, StackOutputs, MIN_PART_SIZE};
use cloud_local::{DirObjectStore, LocalKeyPolicy, LocalKms, QueueConfig, SqliteQueue};
use cloud::{Kms, KmsError, ObjectError, ObjectStore, Queue, Recipient};
use tests::aws::{clients, endpoint, fresh_stack};
use tests::conformance as c;

/// Three parts of S3's smallest size and a bit: the multipart path, parts in flight, a short
/// last part.
const STREAMED: usize = 2 * MIN_PART_SIZE + MIN_PART_SIZE / 3;

struct Aws {
    clients: AwsClients,
    outputs: StackOutputs,
}

impl Aws {
    /// Fresh resources in the emulator, or `None` (skipped, loudly) without one.
    fn new(tag: &str, max_receives: u32) -> Option<Aws> {
        let endpoint = endpoint()?;
        let clients = clients(&endpoint);
        let outputs = fresh_stack(&clients, tag, max_receives);
        Some(Aws { clients, outputs })
    }

    fn output(&self, name: &str) -> &str {
        &self.outputs.values[name]
    }

    fn objects(&self) -> cloud_aws::S3ObjectStore {
        self.clients.object_store(self.output("JobsBucketName"), "").with_part_size(MIN_PART_SIZE)
    }
}

fn local_store() -> (tempfile::TempDir, DirObjectStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = DirObjectStore::open(dir.path().join("jobs")).unwrap();
    (dir, store)
}

fn local_queues(max_receives: u32) -> (tempfile::TempDir, SqliteQueue, SqliteQueue, SqliteQueue) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("queues.sqlite");
    let config = QueueConfig { fifo: false, max_receives: Some(max_receives), dead_letter: Some("jobs-dlq".into()) };
    let jobs = SqliteQueue::open(&db, "jobs", config).unwrap();
    let dlq = SqliteQueue::open_existing(&db, "jobs-dlq").unwrap();
    let fifo = SqliteQueue::open(&db, "ledger", QueueConfig { fifo: true, ..QueueConfig::default() }).unwrap();
    (dir, jobs, dlq, fifo)
}

// --- object stores ----------------------------------------------------------------------------

#[test]
fn aws_s3_put_get_head_list_delete() {
    let Some(aws) = Aws::new("s3a", 5) else { return };
    c::objects_put_get_head_list_delete(&aws.objects());
    c::objects_read_range(&aws.objects());
}

#[test]
fn local_objects_put_get_head_list_delete() {
    let (_dir, s) = local_store();
    c::objects_put_get_head_list_delete(&s);
    c::objects_read_range(&s);
}

#[test]
fn aws_s3_lists_across_pages() {
    let Some(aws) = Aws::new("s3p", 5) else { return };
    c::objects_list_pages(&aws.objects(), 1100);
    c::objects_list_page_across_pages(&aws.objects(), 1100);
}

#[test]
fn aws_s3_list_page() {
    let Some(aws) = Aws::new("s3l", 5) else { return };
    c::objects_list_page(&aws.objects());
}

#[test]
fn local_objects_list_page() {
    let (_dir, s) = local_store();
    c::objects_list_page(&s);
    c::objects_list_pages(&s, 1100);
    c::objects_list_page_across_pages(&s, 1100);
}

/// One `CopyObject` (a small object) and a multipart `UploadPartCopy` of three parts (the store
/// set to copy anything above S3's smallest part in parts), no upload left behind.
#[test]
fn aws_s3_server_side_copy() {
    let Some(aws) = Aws::new("s3y", 5) else { return };
    c::objects_copy(&aws.objects(), 1000);
    let Some(aws) = Aws::new("s3z", 5) else { return };
    c::objects_copy(&aws.objects().with_copy_parts(MIN_PART_SIZE as u64, MIN_PART_SIZE as u64), STREAMED);
    // A multipart object's etag counts its parts.
    let input = aws.objects().head("jobs/j/input.sealed").unwrap().unwrap();
    assert!(input.etag.trim_matches('"').ends_with("-3"), "not copied in three parts: {}", input.etag);
    let bucket = aws.output("JobsBucketName");
    let uploads = aws.clients.runtime.block_on(aws.clients.s3.list_multipart_uploads().bucket(bucket).send()).unwrap();
    assert!(uploads.uploads().is_empty(), "multipart uploads left: {:?}", uploads.uploads());
}

#[test]
fn local_objects_copy() {
    let (_dir, s) = local_store();
    c::objects_copy(&s, 1000);
    let (_dir, s) = local_store();
    c::objects_copy(&s, STREAMED);
}

#[test]
fn aws_s3_conditional_writes() {
    let Some(aws) = Aws::new("s3c", 5) else { return };
    c::objects_conditional_writes(&aws.objects());
    let store = aws.objects();
    c::objects_one_create_only_winner(&|| Arc::new(store.clone()) as Arc<dyn ObjectStore>, 5, 4);
}

#[test]
fn local_objects_conditional_writes() {
    let (_dir, s) = local_store();
    c::objects_conditional_writes(&s);
    c::objects_one_create_only_winner(&|| Arc::new(DirObjectStore::open(s.root()).unwrap()) as Arc<dyn ObjectStore>, 5, 4);
}

#[test]
fn aws_s3_multipart_streaming() {
    let Some(aws) = Aws::new("s3m", 5) else { return };
    c::objects_streamed_write(&aws.objects(), STREAMED);
    c::objects_abandoned_writer(&aws.objects(), STREAMED);
    // The abandoned upload was aborted, not left behind.
    let bucket = aws.output("JobsBucketName");
    let uploads = aws.clients.runtime.block_on(aws.clients.s3.list_multipart_uploads().bucket(bucket).send()).unwrap();
    assert!(uploads.uploads().is_empty(), "multipart uploads left: {:?}", uploads.uploads());
}

#[test]
fn local_objects_streaming() {
    let (_dir, s) = local_store();
    c::objects_streamed_write(&s, STREAMED);
    c::objects_abandoned_writer(&s, STREAMED);
}

#[test]
fn aws_s3_names_a_missing_bucket() {
    let Some(aws) = Aws::new("s3e", 5) else { return };
    let store = aws.clients.object_store("ephem-no-such-bucket-anywhere", "");
    let error = store.put("jobs/x", b"x", cloud::PutCondition::Overwrite).unwrap_err();
    assert!(matches!(&error, ObjectError::NoSuchBucket { bucket, .. } if bucket == "ephem-no-such-bucket-anywhere"), "{error}");
    assert!(!error.is_transient());
    assert!(matches!(store.list(""), Err(ObjectError::NoSuchBucket { .. })));
    // A key prefix is invisible to callers.
    let scoped = aws.clients.object_store(aws.output("JobsBucketName"), "tenant/");
    scoped.put("jobs/a", b"1", cloud::PutCondition::CreateOnly).unwrap();
    assert_eq!(scoped.list("").unwrap()[0].key, "jobs/a");
    assert_eq!(aws.objects().list("").unwrap()[0].key, "tenant/jobs/a");
}

// --- queues -----------------------------------------------------------------------------------

#[test]
fn aws_sqs_visibility_redelivery_and_redrive() {
    let Some(aws) = Aws::new("sqs", 2) else { return };
    let jobs = aws.clients.queue(aws.output("JobQueueUrl"));
    let dlq = aws.clients.queue(aws.output("JobDlqUrl"));
    assert_eq!(jobs.max_receives().unwrap(), Some(2));
    c::queue_visibility_and_delete(&jobs);
    c::queue_redelivery_after_visibility_timeout(&jobs);
    c::queue_redrive(&jobs, &dlq, 2);
}

#[test]
fn local_queue_visibility_redelivery_and_redrive() {
    let (_dir, jobs, dlq, _) = local_queues(2);
    c::queue_visibility_and_delete(&jobs);
    c::queue_redelivery_after_visibility_timeout(&jobs);
    c::queue_redrive(&jobs, &dlq, 2);
}

#[test]
fn aws_sqs_fifo() {
    let Some(aws) = Aws::new("fifo", 5) else { return };
    c::fifo_groups_and_deduplication(&aws.clients.queue(aws.output("LedgerQueueUrl")));
}

#[test]
fn local_queue_fifo() {
    let (_dir, _, _, fifo) = local_queues(5);
    c::fifo_groups_and_deduplication(&fifo);
}

/// What `ledger-append` gets in AWS: Lambda's SQS event, built from a real receive.
#[test]
fn aws_sqs_lambda_event_shape() {
    let Some(aws) = Aws::new("evt", 5) else { return };
    let ledger = aws.clients.queue(aws.output("LedgerQueueUrl"));
    let options = cloud::SendOptions { group_id: Some("ledger".into()), deduplication_id: Some("job-1".into()), delay: Duration::ZERO };
    let id = ledger.send(r#"{"job_id":"x"}"#, &options).unwrap();
    let batch = ledger.receive_lambda_batch(10, Duration::from_secs(2), Duration::from_secs(30)).unwrap();
    let record = &batch.event["Records"][0];
    assert_eq!(record["messageId"], id.as_str());
    assert_eq!(record["body"], r#"{"job_id":"x"}"#);
    assert_eq!(record["eventSource"], "aws:sqs");
    assert_eq!(record["eventSourceARN"], ledger.arn().unwrap().as_str());
    assert_eq!(record["awsRegion"], "us-east-1");
    assert_eq!(record["attributes"]["ApproximateReceiveCount"], "1");
    assert_eq!(record["attributes"]["MessageGroupId"], "ledger");
    assert_eq!(record["attributes"]["MessageDeduplicationId"], "job-1");
    assert!(record["attributes"]["SentTimestamp"].is_string());
    assert_eq!(record["md5OfBody"].as_str().map(str::len), Some(32));
    assert_eq!(batch.messages[0].receipt_handle, record["receiptHandle"].as_str().unwrap());
    let handles = vec![batch.messages[0].receipt_handle.clone()];
    assert_eq!(ledger.delete_batch(&handles).unwrap(), []);
    let stats = ledger.stats().unwrap();
    assert_eq!((stats.visible, stats.in_flight), (0, 0), "deleted");
}

// --- KMS --------------------------------------------------------------------------------------

#[test]
fn aws_kms_symmetric() {
    let Some(aws) = Aws::new("kms", 5) else { return };
    c::kms_symmetric(&aws.clients.kms(), aws.output("ModelKeyArn"));
}

#[test]
fn local_kms_symmetric() {
    let dir = tempfile::tempdir().unwrap();
    let kms = cloud_local::open_kms(dir.path()).unwrap();
    let key = kms.create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
    c::kms_symmetric(&kms, &key);
}

/// moto answers a `Recipient` request with plaintext; the adapter refuses to pass it on.
#[test]
fn aws_kms_refuses_a_recipient_answer_without_cms() {
    let Some(aws) = Aws::new("rcp", 5) else { return };
    let kms = aws.clients.kms();
    let key = aws.output("ModelKeyArn");
    let recipient = Recipient { attestation_document: b"not checked by the emulator".to_vec() };
    let error = kms.generate_data_key(key, &Default::default(), Some(&recipient)).unwrap_err();
    assert!(matches!(&error, KmsError::Validation(m) if m.contains("CiphertextForRecipient")), "{error}");
    let blob = kms.encrypt(key, b"secret", &Default::default()).unwrap();
    let error = kms.decrypt(None, &blob, &Default::default(), Some(&recipient)).unwrap_err();
    assert!(matches!(&error, KmsError::Validation(m) if m.contains("CiphertextForRecipient")), "{error}");
    // The local KMS does what AWS KMS does: no plaintext, a CMS envelope, and only for a
    // verified document (this one is not).
    let dir = tempfile::tempdir().unwrap();
    let local: LocalKms = cloud_local::open_kms(dir.path()).unwrap();
    let key = local.create_key(LocalKeyPolicy::unrestricted(), "test").unwrap();
    assert!(local.generate_data_key(&key, &Default::default(), Some(&recipient)).is_err());
}
