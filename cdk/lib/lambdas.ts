// The Rust Lambdas (crate lambdas/, one binary each, runtime provided.al2023) and what
// triggers them: S3 uploads -> on-upload, the ledger FIFO queue -> ledger-append (one at a
// time); the bulk workflow calls bulk-list-shards, bulk-await-shard (once per shard, as a task
// that waits for its token) and bulk-aggregate; on-upload's failures and the jobs DLQ ->
// job-dead-letter. Each runs under its own role with only the calls it makes. No Lambda makes
// fleet-key epochs: the hosts' enclaves do (keys.ts, fleet.ts).
import { Annotations, Duration } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as destinations from 'aws-cdk-lib/aws-lambda-destinations';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as logs from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';
import { Identities, allow } from './identities';
import { Keys } from './keys';
import { LambdaName, lambdaCode } from './lambda-code';
import { DEAD_LETTER_TIMEOUT, LEDGER_APPEND_TIMEOUT, Queues } from './queues';
import { SHARD_SUFFIX, Storage } from './storage';

/**
 * Where ledger-append and bulk-aggregate read the image publisher's signed attestation policies
 * (every object under it: the allow-list, e.g. the old and the new image's during a rotation).
 */
export const POLICIES_PREFIX = 'artifacts/policies/';
/** The images the allow-list must admit (lambdas/src/policies.rs). */
export const IMAGE_PCR0S_ENV = 'EPHEM_IMAGE_PCR0S';
/** Context key of the image publisher's Ed25519 public key (64 hex), which signs the policies. */
export const PUBLISHER_KEY_CONTEXT = 'imagePublisherKey';
/**
 * How Lambda invokes on-upload for an S3 event: three tries in all, an event queued (throttled)
 * for at most six hours; then the record goes to the on-failure queue and job-dead-letter ends
 * the job, so no accepted upload waits without an end.
 */
export const ON_UPLOAD_RETRY_ATTEMPTS = 2;
export const ON_UPLOAD_MAX_EVENT_AGE = Duration.hours(6);

export interface LambdasProps {
  readonly identities: Identities;
  readonly storage: Storage;
  readonly queues: Queues;
  readonly keys: Keys;
  readonly storePrefixes: string[];
  readonly lambdaAssetsDir: string;
  /** ledger-append's reserved concurrency, if any (a new account's quota may not allow one). */
  readonly ledgerReservedConcurrency?: number;
  /** Witnesses of the ledger's checkpoints (`KEY@URL`), if any. */
  readonly witnesses?: string[];
  /** The image publisher's Ed25519 public key (64 hex); else `-c imagePublisherKey`. */
  readonly imagePublisherKey?: string;
  /**
   * PCR0 of every image the fleet runs or is about to run (the running one, and during an
   * update the incoming one). The functions refuse to start until a policy in the allow-list
   * admits each, and an update changes this value, so Lambda replaces warm instances that read
   * the allow-list before the incoming image's policy was uploaded.
   */
  readonly imagePcr0s: string[];
}

export class Lambdas extends Construct {
  readonly onUpload: lambda.Function;
  readonly ledgerAppend: lambda.Function;
  readonly bulkListShards: lambda.Function;
  readonly bulkAwaitShard: lambda.Function;
  readonly bulkAggregate: lambda.Function;
  readonly jobDeadLetter: lambda.Function;
  readonly all: lambda.Function[];

  private readonly props: LambdasProps;

  constructor(scope: Construct, id: string, props: LambdasProps) {
    super(scope, id);
    this.props = props;
    const { identities: ids, storage, queues, keys } = props;
    const storePrefixes = props.storePrefixes.join(',');

    // Receipts count only if their attestation document satisfies a policy signed by the image
    // publisher: without the key both functions refuse to start (never "any image").
    const publisherKey = (props.imagePublisherKey ?? this.node.tryGetContext(PUBLISHER_KEY_CONTEXT)) as unknown;
    if (publisherKey !== undefined && !/^[0-9a-fA-F]{64}$/.test(String(publisherKey))) {
      throw new Error(`-c ${PUBLISHER_KEY_CONTEXT} must be the image publisher's Ed25519 public key, 64 hex characters`);
    }
    if (publisherKey === undefined) {
      Annotations.of(this).addWarningV2(
        'ephem-batch:noImagePublisherKey',
        `No -c ${PUBLISHER_KEY_CONTEXT}=<64 hex>: ledger-append and bulk-aggregate will refuse to start until it is given.`,
      );
    }
    const policies: Record<string, string> = {
      EPHEM_POLICIES_BUCKET: storage.artifacts.bucketName,
      EPHEM_POLICIES_PREFIX: POLICIES_PREFIX,
      [IMAGE_PCR0S_ENV]: props.imagePcr0s.join(','),
      ...(publisherKey === undefined ? {} : { EPHEM_IMAGE_PUBLISHER_KEY: String(publisherKey).toLowerCase() }),
    };
    const readPolicies = (role: iam.Role) => {
      allow(role, 'ReadAttestationPolicies', ['s3:GetObject'], [storage.artifacts.arnForObjects(`${POLICIES_PREFIX}*`)], {
        why: 'Reads every signed attestation policy of the allow-list; their file names are the operator\'s.',
      });
      allow(role, 'ListAttestationPolicies', ['s3:ListBucket'], [storage.artifacts.bucketArn], {
        conditions: { StringLike: { 's3:prefix': [`${POLICIES_PREFIX}*`] } },
      });
    };

    // on-upload: S3 event -> check the sealed header (no decryption), its fleet epoch and its
    // model manifest -> status.json and a job message. A shard dropped under a store prefix is
    // first copied to jobs/<job_id>/input.sealed, whose own event then creates the job: one
    // path creates every job (DESIGN.md §5 step 3). The copy is server-side (CopyObject, and
    // UploadPartCopy parts above 5 GiB): no shard byte passes through the function, and 15
    // minutes cover the copy of a shard of several hundred GiB.
    this.onUpload = this.rustFunction('on-upload', ids.onUploadRole, {
      timeout: Duration.minutes(15),
      memorySize: 256,
      environment: {
        EPHEM_JOBS_BUCKET: storage.jobs.bucketName,
        EPHEM_JOB_QUEUE_URL: queues.jobs.queueUrl,
        EPHEM_STORE_PREFIXES: storePrefixes,
        // With these two the epoch and the manifest are checked (the enclave checks both again).
        EPHEM_ATTESTATIONS_BUCKET: storage.attestations.bucketName,
        EPHEM_MODELS_BUCKET: storage.models.bucketName,
      },
    });
    const shardObjects = props.storePrefixes.map((p) => storage.jobs.arnForObjects(`${p}*${SHARD_SUFFIX}`));
    allow(ids.onUploadRole, 'ReadSealedHeaders', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/input.sealed'), ...shardObjects], {
      why: 'on-upload reads the header of whichever sealed object an S3 event names: job inputs and shards under the store prefixes only.',
    });
    allow(ids.onUploadRole, 'CopyShardsToJobInputs', ['s3:PutObject', 's3:AbortMultipartUpload'], [storage.jobs.arnForObjects('jobs/*/input.sealed')], {
      why: 'A shard becomes the input of the job whose id its header determines, known only at run time; a multipart copy that fails is aborted.',
    });
    // An upload event on-upload cannot handle (its retries spent, or older than its maximum
    // age) goes to the on-failure queue: job-dead-letter ends that job (SqsDestination grants
    // sqs:SendMessage on that queue alone).
    this.onUpload.configureAsyncInvoke({
      retryAttempts: ON_UPLOAD_RETRY_ATTEMPTS,
      maxEventAge: ON_UPLOAD_MAX_EVENT_AGE,
      onFailure: new destinations.SqsDestination(queues.uploadFailures),
    });
    allow(ids.onUploadRole, 'WriteJobStatus', ['s3:PutObject'], [storage.jobs.arnForObjects('jobs/*/status.json')], {
      why: 'Writes the status of the job an upload creates (queued) or why it was refused; job ids are known at run time.',
    });
    // The record only, not fleet-genesis/: whoever sealed the job checked the epoch's genesis, and
    // this check (the header's key is the epoch's) only spares a host a job it could not open.
    allow(ids.onUploadRole, 'ReadFleetKeyEpochs', ['s3:GetObject'], [storage.attestations.arnForObjects('fleet-keys/*')], {
      why: 'Reads the fleet-key epoch a sealed header names, by its number; public keys and wrapped private keys only.',
    });
    // An epoch that does not exist is a refusal ("fleet_epoch"), not an access error: S3 says
    // 404 only to a caller allowed s3:ListBucket, evaluated with the key as s3:prefix (fleet.ts).
    allow(ids.onUploadRole, 'KnowAbsentEpochs', ['s3:ListBucket'], [storage.attestations.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['fleet-keys/*'] } },
    });
    allow(ids.onUploadRole, 'ReadModelManifests', ['s3:GetObject'], [storage.models.arnForObjects('models/*/manifest.cose')], {
      why: 'Reads the signed manifests of the model a header names, to find the manifest hash it carries; model names are known at run time.',
    });
    allow(ids.onUploadRole, 'ListModelManifests', ['s3:ListBucket'], [storage.models.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['models/*'] } },
    });
    allow(ids.onUploadRole, 'SendJobMessages', ['sqs:SendMessage'], [queues.jobs.queueArn]);
    // A refused input ends its job, which no host will see: on-upload reads the tokens bulk runs
    // may have left for that job (one object per run) and fails their tasks
    // (states:SendTaskFailure, granted in ephem-batch-stack.ts once the state machine exists).
    allow(ids.onUploadRole, 'ReadBulkTasks', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/bulk-tasks/*')], {
      why: 'Reads the task tokens bulk runs left for the job whose input it refused; job ids and bulk ids are known at run time.',
    });
    // The runs waiting for a job are known only by listing its slots (none for most jobs).
    allow(ids.onUploadRole, 'ListBulkTasks', ['s3:ListBucket'], [storage.jobs.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['jobs/*/bulk-tasks/*'] } },
    });

    // ledger-append: the ledger's single writer. FIFO-fed from one message group, which Lambda
    // hands to one invocation at a time (a reserved concurrency is optional: a new account's
    // quota may not allow one), and every ledger write is conditional (If-None-Match for new objects, If-Match for the checkpoint).
    // The attestation document travels in the message; besides the policies it reads no other
    // bucket. It settles each message itself: a receipt no policy admits goes to the ledger DLQ
    // at once (SendMessage), a failure that may pass is hidden for a short backoff
    // (ChangeMessageVisibility, which the event source's grant includes). Each receipt
    // newly appended is also one CloudWatch EMF log line (the dashboard's job and document counts).
    this.ledgerAppend = this.rustFunction('ledger-append', ids.ledgerRole, {
      timeout: LEDGER_APPEND_TIMEOUT,
      memorySize: 512,
      reservedConcurrentExecutions: props.ledgerReservedConcurrency,
      environment: {
        EPHEM_LEDGER_BUCKET: storage.ledger.bucketName,
        EPHEM_LEDGER_KEY_ARN: keys.ledgerSigningKey.attrArn,
        EPHEM_JOBS_BUCKET: storage.jobs.bucketName,
        EPHEM_LEDGER_QUEUE_URL: queues.ledger.queueUrl,
        EPHEM_LEDGER_DLQ_URL: queues.ledgerDlq.queueUrl,
        ...policies,
        // Each checkpoint is submitted to these witnesses before a job's proof is written.
        ...(props.witnesses?.length ? { EPHEM_WITNESSES: props.witnesses.join(',') } : {}),
      },
    });
    readPolicies(ids.ledgerRole);
    allow(ids.ledgerRole, 'DeadLetterHeldReceipts', ['sqs:SendMessage'], [queues.ledgerDlq.queueArn]);
    this.ledgerAppend.addEventSource(new SqsEventSource(queues.ledger, { batchSize: 10, reportBatchItemFailures: true }));
    const ledgerObjects = 'The ledger bucket holds only the ledger (entries, tiles, checkpoints), whose names follow the tree size; ledger-append is its sole writer.';
    allow(ids.ledgerRole, 'ReadLedger', ['s3:GetObject'], [storage.ledger.arnForObjects('*')], { why: ledgerObjects });
    allow(ids.ledgerRole, 'ListLedger', ['s3:ListBucket'], [storage.ledger.bucketArn]);
    allow(ids.ledgerRole, 'CreateLedgerObjectsIfAbsent', ['s3:PutObject'], [storage.ledger.arnForObjects('*')], {
      conditions: { Null: { 's3:if-none-match': 'false' } },
      why: ledgerObjects,
    });
    allow(ids.ledgerRole, 'SwapLedgerCheckpointIfMatch', ['s3:PutObject'], [storage.ledger.arnForObjects('*')], {
      conditions: { Null: { 's3:if-match': 'false' } },
      why: ledgerObjects,
    });
    allow(ids.ledgerRole, 'MarkJobsLedgered', ['s3:PutObject'], [
      storage.jobs.arnForObjects('jobs/*/ledger-proof.json'),
      storage.jobs.arnForObjects('jobs/*/transparent-statement.cbor'),
      storage.jobs.arnForObjects('jobs/*/ledgered.json'),
    ], {
      why: 'Writes jobs/<id>/ledger-proof.json (the entry\'s proof), jobs/<id>/transparent-statement.cbor (the same as a SCITT statement) and jobs/<id>/ledgered.json (its index) for the job just appended, which clients read; job ids are known at run time.',
    });

    // Bulk workflow steps.
    this.bulkListShards = this.rustFunction('bulk-list-shards', ids.bulkListRole, {
      timeout: Duration.minutes(5),
      memorySize: 512,
      environment: { EPHEM_JOBS_BUCKET: storage.jobs.bucketName, EPHEM_STORE_PREFIXES: storePrefixes },
    });
    allow(ids.bulkListRole, 'ListStorePrefixes', ['s3:ListBucket'], [storage.jobs.bucketArn], {
      conditions: { StringLike: { 's3:prefix': props.storePrefixes.map((p) => `${p}*`) } },
    });
    allow(ids.bulkListRole, 'ReadShardHeaders', ['s3:GetObject'], shardObjects, {
      why: 'Reads the headers of the sealed shards under the store prefixes, whose names the data owners choose.',
    });
    // The listing stays out of the workflow's 256 KiB state: written once per bulk id, read back
    // by a retried step (the same listing is fine) and by bulk-aggregate.
    allow(ids.bulkListRole, 'CreateBulkListingsIfAbsent', ['s3:PutObject'], [storage.jobs.arnForObjects('bulk/*/shards.json')], {
      conditions: { Null: { 's3:if-none-match': 'false' } },
      why: 'Writes bulk/<bulk_id>/shards.json, create-only (If-None-Match); bulk ids are chosen per run.',
    });
    allow(ids.bulkListRole, 'ReadBulkListings', ['s3:GetObject'], [storage.jobs.arnForObjects('bulk/*/shards.json')], {
      why: 'Reads back the listing a retried step (or another execution of the same bulk id) finds written; bulk ids are chosen per run.',
    });

    // bulk-await-shard: writes the task token a shard's Map item waits on, then completes it itself
    // if the job has already ended. Its states:SendTask* grant is on the state machine, which
    // names this function: workflow.ts grants it once both exist.
    this.bulkAwaitShard = this.rustFunction('bulk-await-shard', ids.bulkAwaitRole, {
      timeout: Duration.seconds(60),
      memorySize: 256,
      environment: { EPHEM_JOBS_BUCKET: storage.jobs.bucketName },
    });
    const perJob = 'Job ids are derived from each shard\'s header and only known at run time; the pattern admits one kind of object per job.';
    allow(ids.bulkAwaitRole, 'WriteBulkTasks', ['s3:PutObject'], [storage.jobs.arnForObjects('jobs/*/bulk-tasks/*')], {
      why: `${perJob} Writes the task token a bulk run waits on for that job, in the run's own slot (bulk ids are chosen per run). No other role may write there.`,
    });
    allow(ids.bulkAwaitRole, 'ReadJobEnds', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/receipt.cose'), storage.jobs.arnForObjects('jobs/*/status.json')], {
      why: `${perJob} Looks for the job's end: its committed receipt (HeadObject), else a failed or cancelled status.`,
    });
    // Normally absent: the receipt before the job is done, the status before on-upload has made
    // the shard a job. A 403 would fail the step (fleet.ts, KnowAbsentJobObjects).
    allow(ids.bulkAwaitRole, 'KnowAbsentJobEnds', ['s3:ListBucket'], [storage.jobs.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['jobs/*/receipt.cose', 'jobs/*/status.json'] } },
    });

    this.bulkAggregate = this.rustFunction('bulk-aggregate', ids.bulkAggregateRole, {
      timeout: Duration.minutes(5),
      memorySize: 512,
      environment: { EPHEM_JOBS_BUCKET: storage.jobs.bucketName, EPHEM_ATTESTATIONS_BUCKET: storage.attestations.bucketName, ...policies },
    });
    readPolicies(ids.bulkAggregateRole);
    allow(ids.bulkAggregateRole, 'ReadReceipts', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/receipt.cose')], {
      why: 'Reads the receipt of each job of the bulk run; job ids are known at run time.',
    });
    allow(ids.bulkAggregateRole, 'ReadJobStatus', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/status.json')], {
      why: 'Reads the recorded reason of each failed shard of the bulk run from its job status; job ids are known at run time.',
    });
    // It looks for every shard's receipt, whatever its task reported: a timed-out or failed
    // shard has none, and may have no status either. Both are outcomes in the manifest, not
    // access errors.
    allow(ids.bulkAggregateRole, 'KnowAbsentJobEnds', ['s3:ListBucket'], [storage.jobs.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['jobs/*/receipt.cose', 'jobs/*/status.json'] } },
    });
    allow(ids.bulkAggregateRole, 'ReadAttestationDocuments', ['s3:GetObject'], [storage.attestations.arnForObjects('attestations/by-hash/*')], {
      why: 'Verifies each receipt against the attestation document it names by hash; documents are public.',
    });
    // A document that was never published is a refused shard in the manifest, not an access error.
    allow(ids.bulkAggregateRole, 'KnowAbsentAttestationDocuments', ['s3:ListBucket'], [storage.attestations.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['attestations/by-hash/*'] } },
    });
    allow(ids.bulkAggregateRole, 'ReadBulkListings', ['s3:GetObject'], [storage.jobs.arnForObjects('bulk/*/shards.json')], {
      why: 'Reads the run\'s listing, bulk/<bulk_id>/shards.json; bulk ids are chosen per run.',
    });
    allow(ids.bulkAggregateRole, 'WriteBulkManifests', ['s3:PutObject'], [storage.jobs.arnForObjects('bulk/*/manifest.json')], {
      why: 'Writes bulk/<bulk_id>/manifest.json (and nothing else under bulk/: not the listing); bulk ids are chosen per run.',
    });

    // job-dead-letter: on-upload's failure records and the jobs DLQ -> the job's status.json =
    // failed (upload_unprocessed, dead_lettered) unless the job ended, written only
    // conditionally (create-only, or If-Match the version read); then the bulk task waiting for
    // the job is completed (states:SendTask*, granted in ephem-batch-stack.ts).
    this.jobDeadLetter = this.rustFunction('job-dead-letter', ids.deadLetterRole, {
      timeout: DEAD_LETTER_TIMEOUT,
      memorySize: 256,
      environment: {
        EPHEM_JOBS_BUCKET: storage.jobs.bucketName,
        EPHEM_STORE_PREFIXES: storePrefixes,
        // A committed job whose host died before telling the ledger: its receipt is sent on.
        EPHEM_ATTESTATIONS_BUCKET: storage.attestations.bucketName,
        EPHEM_LEDGER_QUEUE_URL: queues.ledger.queueUrl,
      },
    });
    for (const queue of [queues.uploadFailures, queues.jobsDlq]) {
      this.jobDeadLetter.addEventSource(new SqsEventSource(queue, { batchSize: 10, reportBatchItemFailures: true }));
    }
    const deadJobs = 'The job a dead letter names is known only at run time; the pattern admits one kind of object per job.';
    allow(ids.deadLetterRole, 'ReadJobEnds', ['s3:GetObject'], [
      storage.jobs.arnForObjects('jobs/*/status.json'),
      storage.jobs.arnForObjects('jobs/*/receipt.cose'),
      storage.jobs.arnForObjects('jobs/*/ledgered.json'),
      storage.jobs.arnForObjects('jobs/*/bulk-tasks/*'),
    ], { why: `${deadJobs} Looks for the job's end (its status, a committed receipt, whether the ledger holds it) and the bulk runs waiting for it.` });
    allow(ids.deadLetterRole, 'ReadAttestationDocuments', ['s3:GetObject'], [storage.attestations.arnForObjects('attestations/by-hash/*')], {
      why: 'Reads the attestation document a committed receipt names (by its hash), to send the receipt to the ledger as its host would have.',
    });
    allow(ids.deadLetterRole, 'KnowAbsentAttestationDocuments', ['s3:ListBucket'], [storage.attestations.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['attestations/by-hash/*'] } },
    });
    allow(ids.deadLetterRole, 'SendReceiptsToLedger', ['sqs:SendMessage'], [queues.ledger.queueArn]);
    allow(ids.deadLetterRole, 'ReadJobInputsAndShardHeaders', ['s3:GetObject'], [storage.jobs.arnForObjects('jobs/*/input.sealed'), ...shardObjects], {
      why: `${deadJobs} A shard's job is the one its header derives (read), unless that job's input exists (HeadObject).`,
    });
    // Normally absent: the status of an upload on-upload never handled, the receipt, a bulk run's
    // task, the input of a shard never copied. A 403 would fail the record (fleet.ts).
    allow(ids.deadLetterRole, 'KnowAbsentJobObjects', ['s3:ListBucket'], [storage.jobs.bucketArn], {
      conditions: { StringLike: { 's3:prefix': ['jobs/*/status.json', 'jobs/*/receipt.cose', 'jobs/*/ledgered.json', 'jobs/*/bulk-tasks/*', 'jobs/*/input.sealed'] } },
    });
    allow(ids.deadLetterRole, 'CreateFailedStatusIfAbsent', ['s3:PutObject'], [storage.jobs.arnForObjects('jobs/*/status.json')], {
      conditions: { Null: { 's3:if-none-match': 'false' } },
      why: `${deadJobs} Writes failed where no status exists, create-only.`,
    });
    allow(ids.deadLetterRole, 'ReplaceUnendedStatusIfMatch', ['s3:PutObject'], [storage.jobs.arnForObjects('jobs/*/status.json')], {
      conditions: { Null: { 's3:if-match': 'false' } },
      why: `${deadJobs} Replaces a status that has not ended with failed, only if it is still the version read.`,
    });

    this.all = [
      this.onUpload,
      this.ledgerAppend,
      this.bulkListShards,
      this.bulkAwaitShard,
      this.bulkAggregate,
      this.jobDeadLetter,
    ];
  }

  private rustFunction(
    name: LambdaName,
    role: iam.Role,
    opts: Pick<lambda.FunctionProps, 'timeout' | 'memorySize' | 'environment' | 'reservedConcurrentExecutions'>,
  ): lambda.Function {
    const id = name.replace(/(^|-)([a-z])/g, (_m, _d, c: string) => c.toUpperCase());
    const logGroup = new logs.LogGroup(this, `${id}Logs`, { retention: logs.RetentionDays.THREE_MONTHS });
    const fn = new lambda.Function(this, id, {
      description: `ephem-batch ${name}`,
      runtime: lambda.Runtime.PROVIDED_AL2023,
      architecture: lambda.Architecture.X86_64,
      handler: 'bootstrap',
      code: lambdaCode(this, this.props.lambdaAssetsDir, name),
      role,
      logGroup,
      loggingFormat: lambda.LoggingFormat.JSON,
      ...opts,
      environment: { RUST_LOG: 'info', ...opts.environment },
    });
    allow(role, 'WriteOwnLogs', ['logs:CreateLogStream', 'logs:PutLogEvents'], [logGroup.logGroupArn]);
    return fn;
  }
}
