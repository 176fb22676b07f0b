//! The AWS flow on one machine, against an emulator (moto: `scripts/moto.sh start`, then
//! `AWS_ENDPOINT_URL=http://127.0.0.1:PORT`), on the resources the CDK app's own template creates:
//!
//! ```text
//! scripts/emulator-stack.sh deploy .ephem/aws-outputs.json   # the synthesized template, created by moto's CloudFormation
//! export EPHEM_STACK_OUTPUTS=.ephem/aws-outputs.json EPHEM_KMS=local
//! ephem-batch --backend aws dev up                   # keys, epoch, model; host-poller (aws mode) + aws-pump
//! ephem-batch --backend aws submit corpus.jsonl --wait
//! ephem-batch --backend aws verify <JOB>
//! ```
//!
//! What stands in for what AWS runs: the jobs bucket notifies an SQS queue (`UploadEventsQueueUrl`,
//! which the emulator template adds) instead of the `on-upload` Lambda, and [`pump`] calls the
//! real handlers — `on-upload` with the S3 event the emulator delivered (an event it gives up on
//! goes, as Lambda's failure record, to `job-dead-letter`, which also consumes the jobs DLQ), and
//! the `ledger-append` function the Lambda binary serves ([`LedgerFunction`]: the ledger on S3 in
//! the tlog-tiles layout, its SQLite index a cache) with the SQS event Lambda's event source would
//! build from the ledger queue. KMS is the local one: the emulator's KMS ignores `Recipient` and
//! has no `GenerateDataKeyPair*`; for the same reason (no Ed25519 KMS keys) the ledger's
//! checkpoints are signed by a development key that [`start_pump`] writes and pins when the
//! outputs name no `LedgerSigningKeyArn`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use cloud_aws::{AwsCloud, KmsBackend, SqsQueue};
use cloud_local::LocalKms;
use cloud::{Queue, Services};
use lambdas::ledger_append::{FunctionConfig, LedgerFunction};
use protocol::attestation::TrustAnchor;
use receipts_ledger::{NoteSigner, SignerKey, VerifierKey};
use serde_json::Value;

use ephem_batch_client::backend::BackendArgs;
use ephem_batch_client::home::{write_private, Home};

/// The pump's process name (`run/aws-pump.pid`, `logs/aws-pump.log`).
pub const PUMP: &str = "aws-pump";
/// How long a message the handler could not take stays hidden before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Lambda's batch size for a FIFO event source is at most 10.
const BATCH: usize = 10;
/// Lambda tries an asynchronous invocation (an S3 notification) three times in all.
const UPLOAD_EVENT_TRIES: u32 = 3;

#[derive(Args, Debug)]
pub struct PumpArgs {
    /// Handle what is there and stop (default: until SIGTERM).
    #[arg(long)]
    pub once: bool,
    /// Long-poll wait of each receive, seconds.
    #[arg(long, default_value_t = 1)]
    pub wait_s: u64,
}

/// The local KMS `dev up --backend aws` administers (keys bound to the worker's measurement).
pub fn local_kms_of(cloud: &AwsCloud) -> anyhow::Result<LocalKms> {
    match &cloud.settings().kms {
        KmsBackend::Local(dir) => Ok(cloud_local::open_kms(dir)?),
        KmsBackend::Aws => bail!(
            "`dev up --backend aws` runs the development enclave worker, whose attestation only the local KMS \
             can check (AWS KMS trusts Nitro hardware only, and emulators ignore Recipient): add --kms local"
        ),
    }
}

/// The job queue's redrive limit, which the host-poller must know to record dead letters.
pub fn max_receives(cloud: &AwsCloud) -> anyhow::Result<u32> {
    Ok(cloud.job_queue().max_receives()?.unwrap_or(cloud_local::MAX_RECEIVES))
}

/// The settings a child process (host-poller, pump) needs, as absolute values.
pub fn child_env(home: &Home, backend: &BackendArgs) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut env = Vec::new();
    if let Some(path) = backend.stack_outputs_absolute()? {
        env.push((cloud_aws::settings::ENV_STACK_OUTPUTS, path.display().to_string()));
    }
    if let Some(kms) = backend.kms_setting(home)? {
        env.push((cloud_aws::settings::ENV_KMS, kms));
    }
    Ok(env)
}

/// Starts [`pump`] in the background unless it runs. Without a `LedgerSigningKeyArn` (an
/// emulator has no Ed25519 KMS keys) the ledger's checkpoints are signed by a development key,
/// written and pinned for this home first, so `verify` checks against it.
pub fn start_pump(home: &Home, backend: &BackendArgs) -> anyhow::Result<()> {
    if home.running(PUMP).is_some() {
        return Ok(());
    }
    let cloud = ephem_batch_client::backend::open(home, backend)?.aws.ok_or_else(|| anyhow!("the pump needs --backend aws"))?;
    if cloud.settings().ledger_signing_key_arn.is_none() {
        let bucket = cloud.settings().ledger_bucket.clone().ok_or_else(|| {
            anyhow!("no ledger bucket (EPHEM_LEDGER_BUCKET / LedgerBucketName): ledger-append writes the ledger to S3")
        })?;
        announce_dev_ledger_key(home, &bucket, ensure_dev_ledger_key(home, &bucket, cloud.clients().region())?);
    }
    let me = std::env::current_exe()?;
    let args: Vec<String> =
        vec!["--home".into(), home.root().display().to_string(), "--backend".into(), "aws".into(), "dev".into(), PUMP.into()];
    let pid = super::spawn(home, PUMP, &me, &args, &child_env(home, backend)?)?;
    eprintln!("started the upload-event and ledger pump (pid {pid}), standing in for the Lambdas");
    Ok(())
}

/// `dev aws-pump`: until SIGTERM (or once), S3 upload events → `on-upload`, ledger queue →
/// `ledger-append`, jobs DLQ → `job-dead-letter`.
pub fn pump(home: &Home, backend: &BackendArgs, args: &PumpArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let cloud = ephem_batch_client::backend::open(home, backend)?.aws.ok_or_else(|| anyhow!("dev aws-pump needs --backend aws"))?;
    let events = cloud.upload_events().ok_or_else(|| {
        anyhow!(
            "no upload-event queue ({} in the outputs of `scripts/emulator-stack.sh deploy`, or EPHEM_UPLOAD_EVENTS_QUEUE_URL); \
             in AWS the bucket notifies the on-upload Lambda and nothing needs pumping",
            cloud_aws::settings::UPLOAD_EVENTS_OUTPUT
        )
    })?;
    let services = cloud.services();
    let (anchor, policies) = super::home_policies(home)?;
    let ledger = ledger_function(home, &cloud, anchor, policies)?;
    // As the function's environment: the stack's store prefixes, both checks on.
    let config = lambdas::on_upload::Config::from_list(cloud.settings().store_prefixes.as_deref().unwrap_or_default());
    tracing::info!(ledger_key = %ledger.verifier(), "pump started");
    let wait = Duration::from_secs(args.wait_s.min(20));
    loop {
        let round = Instant::now();
        let uploads = pump_uploads(&events, &services, &config, wait).unwrap_or_else(|error| {
            tracing::warn!(error = format!("{error:#}"), "upload events");
            0
        });
        let appended = match pump_ledger(cloud.ledger_queue(), &ledger, wait) {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "ledger queue");
                0
            }
        };
        let dead = match cloud.job_dlq() {
            Some(dlq) => pump_dead_letters(&dlq, &services, &config, Duration::ZERO).unwrap_or_else(|error| {
                tracing::warn!(error = format!("{error:#}"), "jobs DLQ");
                0
            }),
            None => 0,
        };
        if stop.load(Ordering::Relaxed) || (args.once && uploads == 0 && appended == 0 && dead == 0) {
            break;
        }
        if round.elapsed() < Duration::from_millis(100) {
            std::thread::sleep(Duration::from_millis(100)); // errors without waiting: do not spin
        }
    }
    tracing::info!("pump stopped");
    Ok(())
}

/// One receive from the upload-event queue: each S3 event (a job input, or a sealed shard under
/// a store prefix) goes to `on-upload` as delivered (moto sends an `s3:TestEvent` first, and
/// URL-encodes keys, as S3 does). Returns the number
/// of events handled.
pub fn pump_uploads(
    events: &SqsQueue,
    services: &Services,
    config: &lambdas::on_upload::Config,
    wait: Duration,
) -> anyhow::Result<usize> {
    let mut handled = 0;
    for message in events.receive(BATCH, wait, Duration::from_secs(60))? {
        let body: Value = match serde_json::from_str(&message.body) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(message = message.message_id, %error, "not an S3 event; dropped");
                events.delete(&message.receipt_handle)?;
                continue;
            }
        };
        if body.get("Event").and_then(Value::as_str) == Some("s3:TestEvent") {
            events.delete(&message.receipt_handle)?;
            continue;
        }
        let event = match serde_json::from_value(with_s3_record_fields(body)) {
            Ok(event) => event,
            Err(error) => {
                tracing::error!(message = message.message_id, %error, "not an S3 event; dropped");
                events.delete(&message.receipt_handle)?;
                continue;
            }
        };
        match lambdas::on_upload::handle_with(&event, services, config) {
            Ok(outcomes) => {
                for outcome in outcomes {
                    tracing::info!(?outcome, "on-upload");
                }
                events.delete(&message.receipt_handle)?;
                handled += 1;
            }
            // An infrastructure failure: tried again, as Lambda retries an asynchronous
            // invocation twice and then sends the failure record to the function's on-failure
            // destination, whose consumer (`job-dead-letter`) ends the job.
            Err(error) if message.receive_count >= UPLOAD_EVENT_TRIES => {
                tracing::error!(%error, tries = UPLOAD_EVENT_TRIES, "on-upload gave up; the failure record goes to job-dead-letter");
                let record = lambdas::dead_letter::failure_record(&event, "RetriesExhausted", UPLOAD_EVENT_TRIES, &error.to_string());
                for outcome in lambdas::dead_letter::handle_body(&record, services, config)? {
                    tracing::warn!(?outcome, "job-dead-letter");
                }
                events.delete(&message.receipt_handle)?;
            }
            Err(error) => {
                tracing::warn!(%error, "on-upload failed; retrying");
                events.change_visibility(&message.receipt_handle, RETRY_AFTER)?;
            }
        }
    }
    Ok(handled)
}

/// S3 always sends `userIdentity` and `requestParameters` in an event record; moto leaves
/// them out. They are added empty (nothing reads them) so the event has S3's shape.
fn with_s3_record_fields(mut event: Value) -> Value {
    if let Some(records) = event.get_mut("Records").and_then(Value::as_array_mut) {
        for record in records.iter_mut().filter_map(Value::as_object_mut) {
            record.entry("userIdentity").or_insert_with(|| serde_json::json!({}));
            record.entry("requestParameters").or_insert_with(|| serde_json::json!({}));
        }
    }
    event
}

/// The `ledger-append` function the Lambda binary runs ([`LedgerFunction`]), on the ledger
/// bucket of the settings: its cache under `<home>/aws-pump/`, checkpoints signed by the
/// deployment's KMS key (`LedgerSigningKeyArn`) or, in an emulator without Ed25519 KMS keys, by
/// the development key [`start_pump`] wrote.
pub fn ledger_function(
    home: &Home,
    cloud: &AwsCloud,
    root: TrustAnchor,
    policies: protocol::attestation::PolicySet,
) -> anyhow::Result<LedgerFunction> {
    let bucket = cloud.settings().ledger_bucket.clone().ok_or_else(|| {
        anyhow!("no ledger bucket (EPHEM_LEDGER_BUCKET / LedgerBucketName): ledger-append writes the ledger to S3")
    })?;
    let clients = cloud.clients();
    let signer: Box<dyn NoteSigner> = match &cloud.settings().ledger_signing_key_arn {
        Some(arn) => {
            let name = lambdas::ledger_signer::origin(&bucket, clients.region());
            Box::new(lambdas::ledger_signer::kms_signer(Arc::new(clients.kms()), arn, &name)?)
        }
        None => {
            let path = dev_ledger_key_path(home);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!("no LedgerSigningKeyArn and no development ledger key {} (`ephem-batch --backend aws dev up` writes it)", path.display())
            })?;
            tracing::warn!(key = %path.display(), "checkpoints are signed with a development key outside KMS");
            Box::new(SignerKey::parse(text.trim()).with_context(|| format!("ledger key {}", path.display()))?)
        }
    };
    let config = FunctionConfig {
        ledger: Arc::new(clients.object_store(&bucket, "")),
        jobs: cloud.services().jobs,
        signer,
        cache_dir: home.root().join("aws-pump"),
        root,
        policies,
        witnesses: receipts_ledger::WitnessClient::from_env()?,
    };
    // As the Lambda: it settles its messages on the ledger queue and its DLQ itself.
    let dlq_url = cloud.settings().ledger_dlq_url.clone();
    let queues = lambdas::ledger_append::queues_of(clients, cloud.ledger_queue().url(), dlq_url.as_deref())?;
    Ok(LedgerFunction::open(config, &bucket)?.with_queues(queues))
}

/// One batch of the ledger queue through the `ledger-append` function, as Lambda's event source
/// runs it: the real SQS event payload in, partial batch failures out; what succeeded is
/// deleted, what failed is left as the function settled it (its backoff, and after the redrive
/// limit the dead-letter queue).
pub fn pump_ledger(queue: &SqsQueue, function: &LedgerFunction, wait: Duration) -> anyhow::Result<usize> {
    let batch = queue.receive_lambda_batch(BATCH, wait, Duration::from_secs(60))?;
    if batch.messages.is_empty() {
        return Ok(0);
    }
    let event = serde_json::from_value(batch.event).context("the SQS event shape")?;
    let response = function.invoke(&event, cloud::now_ms());
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    let mut done = Vec::new();
    for message in batch.messages.iter().filter(|m| !failed.contains(&m.message_id.as_str())) {
        done.push(message.receipt_handle.clone());
    }
    for (_, why) in queue.delete_batch(&done)? {
        // Appended already; the redelivery is a no-op for the ledger (one entry per job).
        tracing::warn!(why, "ledger message not deleted");
    }
    Ok(done.len())
}

/// One batch of the jobs DLQ through `job-dead-letter`, as its event source runs it: what
/// succeeded is deleted, what failed returns after a short delay.
pub fn pump_dead_letters(
    queue: &SqsQueue,
    services: &Services,
    config: &lambdas::on_upload::Config,
    wait: Duration,
) -> anyhow::Result<usize> {
    let batch = queue.receive_lambda_batch(BATCH, wait, Duration::from_secs(60))?;
    if batch.messages.is_empty() {
        return Ok(0);
    }
    let event = serde_json::from_value(batch.event).context("the SQS event shape")?;
    let response = lambdas::dead_letter::handle(&event, services, config);
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    let mut done = Vec::new();
    for message in &batch.messages {
        if failed.contains(&message.message_id.as_str()) {
            queue.change_visibility(&message.receipt_handle, RETRY_AFTER)?;
        } else {
            done.push(message.receipt_handle.clone());
        }
    }
    for (_, why) in queue.delete_batch(&done)? {
        tracing::warn!(why, "dead letter not deleted; handling it again is harmless");
    }
    Ok(done.len())
}

/// The development key that signs the emulator ledger's checkpoints (moto has no Ed25519 KMS
/// keys); private, like the local ledger's.
fn dev_ledger_key_path(home: &Home) -> PathBuf {
    home.root().join("aws-ledger-signing.key")
}

fn announce_dev_ledger_key(home: &Home, bucket: &str, verifier: VerifierKey) {
    eprintln!(
        "ledger checkpoints in s3://{bucket} are signed by a DEVELOPMENT key ({}), pinned for this home: {verifier}",
        dev_ledger_key_path(home).display()
    );
}

/// A development ledger key named after the ledger bucket (the origin `ledger-append` would
/// use), kept while the bucket stays the same; its verifier key is pinned for the home's copy of
/// that ledger, which a new key starts afresh. Returns the verifier key.
fn ensure_dev_ledger_key(home: &Home, bucket: &str, region: &str) -> anyhow::Result<VerifierKey> {
    let name = lambdas::ledger_signer::origin(bucket, region);
    let path = dev_ledger_key_path(home);
    if let Ok(text) = std::fs::read_to_string(&path)
        && let Ok(key) = SignerKey::parse(text.trim())
        && key.verifier().name() == name
    {
        return Ok(key.verifier());
    }
    let key = SignerKey::generate(&name).map_err(|e| anyhow!("ledger key {name:?}: {e}"))?;
    write_private(&path, key.to_secret_string().as_bytes())?;
    // Another ledger: the old copy and the pump's cache belong to it.
    let copy = ephem_batch_client::backend::aws_ledger_copy(home);
    let _ = std::fs::remove_dir_all(&copy);
    let _ = std::fs::remove_dir_all(home.root().join("aws-pump"));
    std::fs::create_dir_all(&copy)?;
    std::fs::write(copy.join(receipts_ledger::local::LEDGER_PUB), format!("{}\n", key.verifier()))?;
    Ok(key.verifier())
}
