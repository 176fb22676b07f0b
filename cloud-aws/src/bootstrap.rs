//! The stack's storage, queues and keys made by hand in an emulator, for the adapters'
//! conformance tests (each needs fresh queues with its own redrive limit): what `cdk deploy`
//! creates that the binaries talk to, with the same names in the same outputs file. The emulator
//! flow itself runs on the synthesized template (`scripts/emulator-stack.sh`). Idempotent: what
//! exists is kept.
//!
//! One difference, on purpose: in AWS the jobs bucket notifies the `on-upload` Lambda; here it
//! notifies an SQS queue (`UploadEventsQueueUrl`), because emulators run no Lambda without
//! Docker. `ephem-batch dev aws-pump` feeds those events to the real handler. For the same
//! reason the bulk workflow's state machine (created from the deployment's one ASL definition)
//! names Lambda functions that do not exist in the emulator: executions start and can be
//! described, but their Lambda task states do not run there.

use std::collections::BTreeMap;

use aws_sdk_s3::types::{
    BucketLocationConstraint, CreateBucketConfiguration, Event, FilterRule, FilterRuleName, NotificationConfiguration,
    NotificationConfigurationFilter, QueueConfiguration, S3KeyFilter,
};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;

use super::error::Failure;
use super::settings::{self, StackOutputs};
use super::AwsClients;
use cloud::layout;

/// The stack's default store prefix (`ephem-batch submit --bulk` writes under it).
pub const DEFAULT_STORE_PREFIX: &str = "stores/";

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// Every bucket and queue name starts with it (`<prefix>-jobs`, …).
    pub name_prefix: String,
    /// The redrive limit of both queues (the stack's is 5).
    pub max_receives: u32,
    /// The job queue's default visibility timeout, seconds (the stack's is 300).
    pub job_visibility_s: u32,
    /// Create the fleet and model keys in this KMS (skip when KMS is the local one).
    pub kms_keys: bool,
    /// The outputs file's stack name.
    pub stack_name: String,
    /// Prefixes whose sealed shards become jobs (`StorePrefixes`; the stack's default `stores/`).
    pub store_prefixes: Vec<String>,
    /// The bulk workflow's ASL definition with its `${…}` placeholders (the one file the CDK
    /// app deploys): created as a state machine whose Lambda ARNs name functions the emulator
    /// does not run. `None`: no state machine.
    pub bulk_definition: Option<String>,
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        BootstrapOptions {
            name_prefix: "ephem".into(),
            max_receives: 5,
            job_visibility_s: 300,
            kms_keys: true,
            stack_name: settings::DEFAULT_STACK_NAME.into(),
            store_prefixes: vec![DEFAULT_STORE_PREFIX.into()],
            bulk_definition: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{step}: {message}")]
pub struct BootstrapError {
    pub step: String,
    pub message: String,
}

fn step_error(step: impl Into<String>, failure: Failure) -> BootstrapError {
    BootstrapError { step: step.into(), message: failure.message }
}

/// Creates (or finds) the buckets, queues, notification and keys; returns the stack outputs.
pub fn bootstrap(clients: &AwsClients, options: &BootstrapOptions) -> Result<StackOutputs, BootstrapError> {
    let prefix = &options.name_prefix;
    let mut out = BTreeMap::new();
    out.insert(settings::REGION.output.to_owned(), clients.region().to_owned());
    for (output, name, object_lock) in [
        (settings::JOBS_BUCKET.output, "jobs", false),
        (settings::MODELS_BUCKET.output, "models", false),
        (settings::ATTESTATIONS_BUCKET.output, "attestations", false),
        (settings::LEDGER_BUCKET.output, "ledger", true),
        ("ArtifactsBucketName", "artifacts", false),
    ] {
        let bucket = format!("{prefix}-{name}");
        create_bucket(clients, &bucket, object_lock)?;
        out.insert(output.to_owned(), bucket);
    }

    let redrive = |dlq_arn: &str| json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": options.max_receives}).to_string();
    let job_dlq = create_queue(clients, &format!("{prefix}-jobs-dlq"), &[(QueueAttributeName::MessageRetentionPeriod, "1209600")])?;
    let job_queue = create_queue(
        clients,
        &format!("{prefix}-jobs"),
        &[
            (QueueAttributeName::VisibilityTimeout, &options.job_visibility_s.to_string()),
            (QueueAttributeName::ReceiveMessageWaitTimeSeconds, "20"),
            (QueueAttributeName::RedrivePolicy, &redrive(&job_dlq.1)),
        ],
    )?;
    let ledger_dlq = create_queue(clients, &format!("{prefix}-ledger-dlq.fifo"), &[(QueueAttributeName::FifoQueue, "true")])?;
    let ledger_queue = create_queue(
        clients,
        &format!("{prefix}-ledger.fifo"),
        &[
            (QueueAttributeName::FifoQueue, "true"),
            (QueueAttributeName::ContentBasedDeduplication, "false"),
            // The stack's: six times ledger-append's 30 s timeout (cdk/lib/queues.ts).
            (QueueAttributeName::VisibilityTimeout, "180"),
            (QueueAttributeName::RedrivePolicy, &redrive(&ledger_dlq.1)),
        ],
    )?;
    let events = create_queue(clients, &format!("{prefix}-upload-events"), &[])?;
    let jobs_bucket = out[settings::JOBS_BUCKET.output].clone();
    allow_bucket_events(clients, &events, &jobs_bucket)?;
    notify_uploads(clients, &jobs_bucket, &events.1, &options.store_prefixes)?;
    out.insert(settings::STORE_PREFIXES.output.to_owned(), options.store_prefixes.join(","));
    out.insert(settings::JOB_QUEUE.output.to_owned(), job_queue.0);
    out.insert(settings::JOB_DLQ.output.to_owned(), job_dlq.0);
    out.insert(settings::LEDGER_QUEUE.output.to_owned(), ledger_queue.0);
    out.insert(settings::LEDGER_DLQ.output.to_owned(), ledger_dlq.0);
    out.insert(settings::UPLOAD_EVENTS_QUEUE.output.to_owned(), events.0);

    if let Some(definition) = &options.bulk_definition {
        // The account the emulator (or the credentials) answers for, from a queue's ARN.
        let account = job_dlq.1.split(':').nth(4).unwrap_or("000000000000").to_owned();
        let arn = bulk_state_machine(clients, &format!("{prefix}-bulk"), definition, &account, &jobs_bucket, prefix)?;
        out.insert(settings::BULK_STATE_MACHINE.output.to_owned(), arn);
    }

    if options.kms_keys {
        for (output, name) in [(settings::FLEET_KEY.output, "fleet"), (settings::MODEL_KEY.output, "model")] {
            out.insert(output.to_owned(), symmetric_key(clients, &format!("alias/{prefix}-{name}"))?);
        }
    }
    Ok(StackOutputs { stack: options.stack_name.clone(), values: out })
}

fn create_bucket(clients: &AwsClients, bucket: &str, object_lock: bool) -> Result<(), BootstrapError> {
    let mut request = clients.s3.create_bucket().bucket(bucket).object_lock_enabled_for_bucket(object_lock);
    // us-east-1 is the one region that takes no location constraint.
    if clients.region() != "us-east-1" {
        let location = BucketLocationConstraint::from(clients.region());
        request = request.create_bucket_configuration(CreateBucketConfiguration::builder().location_constraint(location).build());
    }
    match clients.runtime.block_on(request.send()) {
        Ok(_) => Ok(()),
        Err(error) => {
            let failure = Failure::of(&error);
            if failure.is("BucketAlreadyOwnedByYou") { Ok(()) } else { Err(step_error(format!("S3 CreateBucket {bucket}"), failure)) }
        }
    }
}

/// (url, arn) of a queue created with these attributes, or of the existing one (whose
/// attributes are then set to these).
fn create_queue(clients: &AwsClients, name: &str, attributes: &[(QueueAttributeName, &str)]) -> Result<(String, String), BootstrapError> {
    let map: std::collections::HashMap<QueueAttributeName, String> =
        attributes.iter().map(|(k, v)| (k.clone(), (*v).to_owned())).collect();
    let create = clients.sqs.create_queue().queue_name(name).set_attributes(Some(map.clone()));
    let url = match clients.runtime.block_on(create.send()) {
        Ok(output) => output.queue_url.unwrap_or_default(),
        Err(error) => {
            let failure = Failure::of(&error);
            if !(failure.is("QueueAlreadyExists") || failure.is("QueueNameExists")) {
                return Err(step_error(format!("SQS CreateQueue {name}"), failure));
            }
            let url = clients
                .runtime
                .block_on(clients.sqs.get_queue_url().queue_name(name).send())
                .map_err(|e| step_error(format!("SQS GetQueueUrl {name}"), Failure::of(&e)))?
                .queue_url
                .unwrap_or_default();
            // FifoQueue cannot be set after creation (and does not change).
            let mut settable = map;
            settable.remove(&QueueAttributeName::FifoQueue);
            let set = clients.sqs.set_queue_attributes().queue_url(&url).set_attributes(Some(settable));
            clients.runtime.block_on(set.send()).map_err(|e| step_error(format!("SQS SetQueueAttributes {name}"), Failure::of(&e)))?;
            url
        }
    };
    let arn = clients
        .queue(&url)
        .arn()
        .map_err(|e| BootstrapError { step: format!("SQS GetQueueAttributes {name}"), message: e.to_string() })?;
    Ok((url, arn))
}

/// The queue policy S3 needs to deliver the bucket's events (as in AWS; emulators do not check).
fn allow_bucket_events(clients: &AwsClients, queue: &(String, String), bucket: &str) -> Result<(), BootstrapError> {
    let policy = json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "S3UploadEvents",
            "Effect": "Allow",
            "Principal": {"Service": "s3.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": queue.1,
            "Condition": {"ArnLike": {"aws:SourceArn": format!("arn:aws:s3:::{bucket}")}}
        }]
    });
    let request = clients.sqs.set_queue_attributes().queue_url(&queue.0).attributes(QueueAttributeName::Policy, policy.to_string());
    clients.runtime.block_on(request.send()).map_err(|e| step_error("SQS SetQueueAttributes (policy)", Failure::of(&e)))?;
    Ok(())
}

/// `jobs/…/input.sealed` created, and `<store prefix>….sealed` created → the events queue: the
/// stack's `JOB_INPUT_FILTER` and one filter per store prefix (none of them overlap).
fn notify_uploads(clients: &AwsClients, bucket: &str, queue_arn: &str, store_prefixes: &[String]) -> Result<(), BootstrapError> {
    let rule = |name: FilterRuleName, value: &str| FilterRule::builder().name(name).value(value).build();
    let mut filters = vec![("on-upload".to_owned(), layout::JOBS_PREFIX.to_owned(), layout::INPUT_SUFFIX)];
    for (i, prefix) in store_prefixes.iter().enumerate() {
        filters.push((format!("on-upload-store-{i}"), prefix.clone(), SHARD_SUFFIX));
    }
    let mut configuration = NotificationConfiguration::builder();
    for (id, prefix, suffix) in filters {
        let filter = NotificationConfigurationFilter::builder()
            .key(
                S3KeyFilter::builder()
                    .filter_rules(rule(FilterRuleName::Prefix, &prefix))
                    .filter_rules(rule(FilterRuleName::Suffix, suffix))
                    .build(),
            )
            .build();
        let queue = QueueConfiguration::builder()
            .id(id)
            .queue_arn(queue_arn)
            .events(Event::S3ObjectCreated)
            .filter(filter)
            .build()
            .map_err(|e| BootstrapError { step: "S3 notification".into(), message: e.to_string() })?;
        configuration = configuration.queue_configurations(queue);
    }
    let request =
        clients.s3.put_bucket_notification_configuration().bucket(bucket).notification_configuration(configuration.build());
    clients
        .runtime
        .block_on(request.send())
        .map_err(|e| step_error(format!("S3 PutBucketNotificationConfiguration {bucket}"), Failure::of(&e)))?;
    Ok(())
}

/// Sealed shards under a store prefix end in this (`lambdas::on_upload::SHARD_SUFFIX`).
const SHARD_SUFFIX: &str = ".sealed";

/// The state machine `name` running `definition` with its placeholders filled as the CDK app
/// fills them (`cdk/lib/workflow.ts`), created if absent, its definition updated if present.
fn bulk_state_machine(
    clients: &AwsClients,
    name: &str,
    definition: &str,
    account: &str,
    jobs_bucket: &str,
    prefix: &str,
) -> Result<String, BootstrapError> {
    let region = clients.region();
    let function = |f: &str| format!("arn:aws:lambda:{region}:{account}:function:{prefix}-{f}");
    let filled = definition
        .replace("${BulkListShardsFunctionArn}", &function("bulk-list-shards"))
        .replace("${BulkAwaitShardFunctionArn}", &function("bulk-await-shard"))
        .replace("${BulkAggregateFunctionArn}", &function("bulk-aggregate"))
        .replace("${JobsBucketName}", jobs_bucket);
    // A placeholder is `${Name}` (the file's comment mentions `${...}`, which is none).
    let unfilled = filled.match_indices("${").find(|(at, _)| filled[at + 2..].starts_with(|c: char| c.is_ascii_alphabetic()));
    if let Some((left, _)) = unfilled {
        return Err(BootstrapError { step: "bulk workflow definition".into(), message: format!("unfilled placeholder at byte {left}") });
    }
    let role = format!("arn:aws:iam::{account}:role/{prefix}-bulk-workflow");
    let existing = clients
        .runtime
        .block_on(clients.sfn.list_state_machines().send())
        .map_err(|e| step_error("Step Functions ListStateMachines", Failure::of(&e)))?
        .state_machines
        .into_iter()
        .find(|m| m.name == name)
        .map(|m| m.state_machine_arn);
    if let Some(arn) = existing {
        let update = clients.sfn.update_state_machine().state_machine_arn(&arn).definition(&filled).role_arn(&role);
        clients
            .runtime
            .block_on(update.send())
            .map_err(|e| step_error(format!("Step Functions UpdateStateMachine {name}"), Failure::of(&e)))?;
        return Ok(arn);
    }
    let create = clients.sfn.create_state_machine().name(name).definition(&filled).role_arn(&role);
    let created = clients
        .runtime
        .block_on(create.send())
        .map_err(|e| step_error(format!("Step Functions CreateStateMachine {name}"), Failure::of(&e)))?;
    Ok(created.state_machine_arn)
}

/// The ARN of the symmetric key behind `alias`, created if the alias does not exist.
fn symmetric_key(clients: &AwsClients, alias: &str) -> Result<String, BootstrapError> {
    match clients.runtime.block_on(clients.kms.describe_key().key_id(alias).send()) {
        Ok(output) => {
            if let Some(arn) = output.key_metadata.and_then(|m| m.arn) {
                return Ok(arn);
            }
        }
        Err(error) => {
            let failure = Failure::of(&error);
            if !failure.is("NotFoundException") {
                return Err(step_error(format!("KMS DescribeKey {alias}"), failure));
            }
        }
    }
    let created = clients
        .runtime
        .block_on(clients.kms.create_key().description(format!("ephem-batch {alias} (bootstrap)")).send())
        .map_err(|e| step_error("KMS CreateKey", Failure::of(&e)))?;
    let metadata = created.key_metadata.ok_or_else(|| BootstrapError { step: "KMS CreateKey".into(), message: "no key metadata".into() })?;
    let alias_request = clients.kms.create_alias().alias_name(alias).target_key_id(metadata.key_id.clone());
    clients.runtime.block_on(alias_request.send()).map_err(|e| step_error(format!("KMS CreateAlias {alias}"), Failure::of(&e)))?;
    Ok(metadata.arn.unwrap_or(metadata.key_id))
}
