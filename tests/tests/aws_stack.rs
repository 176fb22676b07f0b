//! The emulator flow's stack is the CDK app's own: `scripts/emulator-stack.sh deploy` synthesizes
//! the app, derives the emulator template (scripts/emulator_stack.py: what moto's CloudFormation
//! cannot create is stripped by an explicit list, and the jobs bucket notifies an upload-events
//! queue in place of on-upload) and creates it with the emulator's CloudFormation. These tests
//! fail when the template and what the binaries expect drift apart: an output the AWS backend
//! reads renamed or gone, a queue whose dead-letter queue is not the one the outputs name, a FIFO
//! queue that is not one, a notification filter that no longer matches the object layout, a
//! state machine whose definition is not the one ASL file filled in.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cloud::{layout, Executions, ObjectStore, PutCondition, Queue};
use cloud_aws::settings::{self, Name};
use cloud_aws::{AwsClients, AwsSettings, StackOutputs};
use protocol::envelope::JobId;
use serde_json::Value;
use tests::aws::{clients, deploy_template, endpoint, unique_prefix};

/// The template's stack in the emulator: (outputs file, its values, its directory).
fn deployed(endpoint: &str, tag: &str) -> (PathBuf, StackOutputs, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aws-outputs.json");
    let out = deploy_template(endpoint, &unique_prefix(tag), &path);
    assert!(
        out.status.success(),
        "scripts/emulator-stack.sh deploy failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let outputs = StackOutputs::load(&path, None).expect("the outputs file, in cdk deploy --outputs-file form");
    (path, outputs, dir)
}

/// `GetQueueAttributes All` of a queue, by name.
fn queue_attributes(clients: &AwsClients, url: &str) -> std::collections::HashMap<String, String> {
    let call = clients.sqs.get_queue_attributes().queue_url(url).attribute_names("All".into()).send();
    let answer = clients.runtime.block_on(call).unwrap_or_else(|e| panic!("GetQueueAttributes {url}: {e:?}"));
    answer.attributes().cloned().unwrap_or_default().into_iter().map(|(k, v)| (k.as_str().to_owned(), v)).collect()
}

/// The names the AWS backend reads from the outputs file (cloud_aws::settings), each with
/// whether the emulator stack must give it.
const NAMES: [(Name, bool); 15] = [
    (settings::REGION, true),
    (settings::JOBS_BUCKET, true),
    (settings::MODELS_BUCKET, true),
    (settings::ATTESTATIONS_BUCKET, true),
    (settings::LEDGER_BUCKET, true),
    (settings::JOB_QUEUE, true),
    (settings::JOB_DLQ, true),
    (settings::LEDGER_QUEUE, true),
    (settings::LEDGER_DLQ, true),
    (settings::UPLOAD_EVENTS_QUEUE, true),
    (settings::BULK_STATE_MACHINE, true),
    (settings::STORE_PREFIXES, true),
    // The KMS keys are stripped from the emulator template: the flow's KMS is the local KMS,
    // and its ledger checkpoints are signed by a development key (no Ed25519 keys in moto).
    (settings::FLEET_KEY, false),
    (settings::MODEL_KEY, false),
    (settings::LEDGER_SIGNING_KEY, false),
];

#[test]
fn aws_stack_outputs_are_the_names_the_binaries_read() {
    let Some(endpoint) = endpoint() else { return };
    let (path, outputs, _dir) = deployed(&endpoint, "so");
    for (name, given) in NAMES {
        let value = outputs.values.get(name.output);
        if given {
            assert!(value.is_some_and(|v| !v.is_empty()), "the stack has no output {} (read as {}): {:?}", name.output, name.env, outputs.values);
        } else {
            assert_eq!(value, None, "{} is stripped from the emulator template (its resource is a KMS key)", name.output);
        }
    }
    assert_eq!(outputs.values[settings::REGION.output], tests::aws::REGION);
    // The client writes bulk shards under `stores/<store>/incoming/<bulk_id>/`: the stack's default
    // store prefix must be the one `submit --bulk` writes under.
    assert_eq!(outputs.values[settings::STORE_PREFIXES.output], cloud_aws::bootstrap::DEFAULT_STORE_PREFIX);
    let settings = AwsSettings::resolve_with(Some(&path), Some("local:/nowhere"), |_| None).expect("the AWS backend's settings");
    // Every bucket the settings name exists (an empty list, not NoSuchBucket).
    let clients = clients(&endpoint);
    for bucket in [&settings.jobs_bucket, &settings.models_bucket, &settings.attestations_bucket, settings.ledger_bucket.as_ref().unwrap()] {
        clients.object_store(bucket, "").list("").unwrap_or_else(|e| panic!("bucket {bucket}: {e}"));
    }
}

#[test]
fn aws_stack_queues_redrive_to_the_dead_letter_queues_the_outputs_name() {
    let Some(endpoint) = endpoint() else { return };
    let (_, outputs, _dir) = deployed(&endpoint, "sq");
    let clients = clients(&endpoint);
    let url = |name: Name| outputs.values.get(name.output).cloned().unwrap_or_else(|| panic!("the stack has no output {}", name.output));
    let arn = |name: Name| queue_attributes(&clients, &url(name))["QueueArn"].clone();

    for (queue, dlq, fifo) in [(settings::JOB_QUEUE, settings::JOB_DLQ, false), (settings::LEDGER_QUEUE, settings::LEDGER_DLQ, true)] {
        let attributes = queue_attributes(&clients, &url(queue));
        let redrive: Value = serde_json::from_str(attributes.get("RedrivePolicy").unwrap_or_else(|| panic!("{} has no redrive policy", queue.output))).unwrap();
        assert_eq!(redrive["deadLetterTargetArn"], arn(dlq).as_str(), "{} redrives to the queue {} names", queue.output, dlq.output);
        let max = redrive["maxReceiveCount"].as_u64().or_else(|| redrive["maxReceiveCount"].as_str()?.parse().ok());
        assert!(max.is_some_and(|n| n >= 2), "{}: maxReceiveCount {redrive}", queue.output);
        for url in [url(queue), url(dlq)] {
            let attributes = queue_attributes(&clients, &url);
            assert_eq!(attributes.get("FifoQueue").map(String::as_str) == Some("true"), fifo, "{url}: {attributes:?}");
        }
    }
    // The host sends receipts with the job id as deduplication id: no content-based deduplication.
    assert_eq!(queue_attributes(&clients, &url(settings::LEDGER_QUEUE))["ContentBasedDeduplication"], "false");
    // The host reads the redrive limit from the job queue to record dead letters.
    assert!(clients.queue(&url(settings::JOB_QUEUE)).max_receives().unwrap().is_some());
}

/// An S3 event's object key as S3 (and moto) writes it: URL-encoded, spaces as `+`.
fn event_key(encoded: &str) -> String {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%').then(|| encoded.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())).flatten();
        match bytes[i] {
            b'%' if escaped.is_some() => {
                out.extend(escaped);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("a UTF-8 key")
}

/// The upload events the emulator delivered, by key, until `keys` arrived (or 20 s passed);
/// moto's `s3:TestEvent` is skipped.
fn events_for(queue: &cloud_aws::SqsQueue, keys: &[&str]) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !keys.iter().all(|k| seen.iter().any(|s| s == k)) {
        for message in queue.receive(10, Duration::from_secs(1), Duration::from_secs(30)).unwrap() {
            let body: Value = serde_json::from_str(&message.body).unwrap();
            for record in body["Records"].as_array().into_iter().flatten() {
                seen.push(event_key(record["s3"]["object"]["key"].as_str().unwrap()));
            }
            queue.delete(&message.receipt_handle).unwrap();
        }
    }
    seen
}

#[test]
fn aws_stack_notifies_job_inputs_and_store_shards_and_nothing_else() {
    let Some(endpoint) = endpoint() else { return };
    let (_, outputs, _dir) = deployed(&endpoint, "sn");
    let clients = clients(&endpoint);
    let jobs = clients.object_store(&outputs.values[settings::JOBS_BUCKET.output], "");
    let events = clients.queue(&outputs.values[settings::UPLOAD_EVENTS_QUEUE.output]);
    let job = JobId([0x5a; 16]);
    let input = layout::job_input(&job);
    let prefix = &outputs.values[settings::STORE_PREFIXES.output];
    let shard = format!("{prefix}acme/incoming/b1/shard-0001{}", lambdas::on_upload::SHARD_SUFFIX);
    // Written beside them, and never a job: a status, a result, a shard listing, a store object
    // that is not sealed.
    let others = [
        format!("{}{}/status.json", layout::JOBS_PREFIX, job.to_hex()),
        layout::job_output(&job, 1),
        format!("{prefix}acme/incoming/b1/notes.txt"),
        "bulk/b1/shards.json".to_owned(),
    ];
    for key in others.iter().chain([&input, &shard]) {
        jobs.put(key, b"x", PutCondition::Overwrite).unwrap();
    }
    let seen = events_for(&events, &[&input, &shard]);
    assert!(seen.contains(&input), "no upload event for {input}: the template's notification filter and cloud::layout disagree ({seen:?})");
    assert!(seen.contains(&shard), "no upload event for {shard}: the template's store-prefix filter and on-upload's disagree ({seen:?})");
    let stray: Vec<&String> = seen.iter().filter(|k| others.contains(k)).collect();
    assert!(stray.is_empty(), "upload events for objects that are not jobs: {stray:?}");
}

#[test]
fn aws_stack_state_machine_is_the_one_definition_filled_in() {
    let Some(endpoint) = endpoint() else { return };
    let (_, outputs, _dir) = deployed(&endpoint, "sm");
    let clients = clients(&endpoint);
    let arn = &outputs.values[settings::BULK_STATE_MACHINE.output];
    let described = clients.runtime.block_on(clients.sfn.describe_state_machine().state_machine_arn(arn).send()).unwrap();
    let definition = described.definition();
    let placeholder = definition.match_indices("${").find(|(at, _)| definition[at + 2..].starts_with(|c: char| c.is_ascii_alphabetic()));
    assert!(placeholder.is_none(), "an unfilled placeholder in the deployed definition: {definition}");
    let deployed: Value = serde_json::from_str(definition).unwrap();
    let jobs = &outputs.values[settings::JOBS_BUCKET.output];
    let await_step = &deployed["States"]["AwaitShards"]["ItemProcessor"]["States"]["AwaitShard"];
    assert_eq!(await_step["Resource"], "arn:aws:states:::lambda:invoke.waitForTaskToken");
    assert_eq!(await_step["Parameters"]["Payload"]["bucket"], jobs.as_str());
    // The functions are the stack's own (one ARN each); named as the local runtime names them,
    // the definition is the one the local runtime walks.
    let functions = [
        (deployed["States"]["ListShards"]["Parameters"]["FunctionName"].clone(), devstack::local_workflow::LIST_SHARDS),
        (await_step["Parameters"]["FunctionName"].clone(), devstack::local_workflow::AWAIT_SHARD),
        (deployed["States"]["Aggregate"]["Parameters"]["FunctionName"].clone(), devstack::local_workflow::AGGREGATE),
    ];
    let mut renamed = definition.to_owned();
    for (arn, local) in &functions {
        let arn = arn.as_str().unwrap_or_else(|| panic!("no function ARN for {local}: {deployed}"));
        assert!(arn.starts_with("arn:aws:lambda:us-east-1:") && arn.contains(":function:"), "{arn}");
        renamed = renamed.replace(arn, local);
    }
    assert_eq!(serde_json::from_str::<Value>(&renamed).unwrap(), devstack::local_workflow::definition(jobs));
    // `submit --bulk` starts executions through the adapter (without moto's execute switch they
    // stay RUNNING; with it, the first Lambda task fails: moto runs Lambda only in Docker).
    let workflow = clients.step_functions(Some(arn));
    let execution = workflow.start(&unique_prefix("bulk"), r#"{"bulk_id":"b1","prefix":"stores/default/incoming/b1/"}"#).unwrap();
    assert!(execution.contains(":execution:"), "{execution}");
    workflow.describe(&execution).unwrap();
}
