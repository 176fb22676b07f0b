// The whole deployment, top-down: who (identities), where data lives (storage, queues), the
// keys that bind data to the measured enclave image, the fleet that runs it, the Lambdas and
// the bulk workflow around it, what the operator watches, and the outputs the client reads.
import { CfnOutput, Stack, StackProps, Tags } from 'aws-cdk-lib';
import { Construct } from 'constructs';
import { DeployConfig } from './config';
import { Fleet } from './fleet';
import { Identities, allow } from './identities';
import { Keys } from './keys';
import { Lambdas } from './lambdas';
import { Observability } from './observability';
import { Queues } from './queues';
import { Storage } from './storage';
import { BulkWorkflow } from './workflow';

export interface EphemBatchStackProps extends StackProps {
  readonly config: DeployConfig;
}

export class EphemBatchStack extends Stack {
  readonly identities: Identities;
  readonly storage: Storage;
  readonly queues: Queues;
  readonly keys: Keys;
  readonly fleet: Fleet;
  readonly lambdas: Lambdas;
  readonly workflow: BulkWorkflow;
  readonly observability: Observability;

  constructor(scope: Construct, id: string, props: EphemBatchStackProps) {
    const cfg = props.config;
    super(scope, id, {
      description: `ephem-batch: confidential bulk text embedding on Nitro Enclaves (image PCR0 ${cfg.measurements.pcr0.slice(0, 16)}..., from ${cfg.measurements.source})`,
      ...props,
    });
    Tags.of(this).add('project', 'ephem-batch');

    this.identities = new Identities(this, 'Identities');
    this.storage = new Storage(this, 'Storage', {
      ledgerRetentionDays: cfg.ledgerRetentionDays,
      ledgerLockMode: cfg.ledgerLockMode,
      jobsRetentionDays: cfg.jobsRetentionDays,
    });
    this.queues = new Queues(this, 'Queues');
    this.keys = new Keys(this, 'Keys', {
      measurements: cfg.measurements,
      hostRole: this.identities.hostRole,
      rotationRole: this.identities.rotationRole,
      ledgerRole: this.identities.ledgerRole,
      modelPublisherRole: this.identities.modelPublisherRole,
    });
    this.fleet = new Fleet(this, 'Fleet', {
      hostRole: this.identities.hostRole,
      storage: this.storage,
      queues: this.queues,
      expectedPcr0: cfg.measurements.pcr0,
      instanceType: cfg.instanceType,
      hostImage: cfg.hostImage,
      enclaveCpuCount: cfg.enclaveCpuCount,
      enclaveMemoryMib: cfg.enclaveMemoryMib,
      minHosts: cfg.minHosts,
      maxHosts: cfg.maxHosts,
      jobsPerHost: cfg.jobsPerHost,
      maxAzs: cfg.maxAzs,
    });
    this.lambdas = new Lambdas(this, 'Lambdas', {
      identities: this.identities,
      storage: this.storage,
      queues: this.queues,
      keys: this.keys,
      storePrefixes: cfg.storePrefixes,
      rotationDays: cfg.rotationDays,
      lambdaAssetsDir: cfg.lambdaAssetsDir,
      ledgerReservedConcurrency: cfg.ledgerReservedConcurrency,
    });
    this.storage.routeUploadsTo(this.lambdas.onUpload, cfg.storePrefixes);
    this.workflow = new BulkWorkflow(this, 'BulkWorkflow', {
      jobsBucket: this.storage.jobs,
      listShards: this.lambdas.bulkListShards,
      awaitShard: this.lambdas.bulkAwaitShard,
      awaitShardRole: this.identities.bulkAwaitRole,
      aggregate: this.lambdas.bulkAggregate,
    });
    this.grantModelPublisher();
    this.grantHostBulkTasks();
    this.grantOnUploadBulkTasks();
    this.grantDeadLetterBulkTasks();
    this.observability = new Observability(this, 'Observability', {
      queues: this.queues,
      hosts: this.fleet.hosts,
      functions: this.lambdas.all,
      ledgerAppend: this.lambdas.ledgerAppend,
      stateMachine: this.workflow.stateMachine,
      alarmEmail: cfg.alarmEmail,
    });
    this.outputs(cfg);
  }

  /** The publisher uploads encrypted models; its only key right (kms:Encrypt) is in the model key policy. */
  private grantModelPublisher(): void {
    const role = this.identities.modelPublisherRole;
    const models = this.storage.models;
    allow(role, 'UploadModels', ['s3:PutObject', 's3:GetObject', 's3:AbortMultipartUpload'], [models.arnForObjects('models/*')], {
      why: 'The publisher uploads models/<model_id>/<version>/... for models it names; everything there is encrypted or signed.',
    });
  }

  /**
   * A host that ends a job bulk runs wait for (jobs/<id>/bulk-tasks/<bulk_id>.json names each run's
   * task token) completes those tasks: SendTaskSuccess or SendTaskFailure, never a heartbeat.
   */
  private grantHostBulkTasks(): void {
    allow(this.identities.hostRole, 'CompleteBulkTasks', ['states:SendTaskSuccess', 'states:SendTaskFailure'], [
      this.workflow.stateMachine.stateMachineArn,
    ]);
  }

  /**
   * on-upload fails the task a bulk run waits on for a job whose input it refused (no host
   * will ever end that job): SendTaskFailure only. The state machine does not name on-upload,
   * so the role's own policy can name the state machine without a dependency cycle.
   */
  private grantOnUploadBulkTasks(): void {
    allow(this.identities.onUploadRole, 'FailBulkTasks', ['states:SendTaskFailure'], [this.workflow.stateMachine.stateMachineArn]);
  }

  /**
   * job-dead-letter ends a job nobody else will end and completes the task a bulk run waits on
   * for it with that end: failed, or succeeded when the job's receipt turns out committed.
   */
  private grantDeadLetterBulkTasks(): void {
    allow(this.identities.deadLetterRole, 'CompleteBulkTasks', ['states:SendTaskSuccess', 'states:SendTaskFailure'], [
      this.workflow.stateMachine.stateMachineArn,
    ]);
  }

  /**
   * Stack outputs, read by `ephem-batch --backend aws` from the file that
   * `cdk deploy --outputs-file` writes. The names are a contract (docs/operations.md).
   */
  private outputs(cfg: DeployConfig): void {
    const out = (name: string, value: string, description: string) => new CfnOutput(this, name, { value, description });
    const s = this.storage;
    const q = this.queues;
    const k = this.keys;
    out('Region', this.region, 'AWS region of the deployment');
    out('JobsBucketName', s.jobs.bucketName, 'jobs/<job_id>/..., store prefixes, bulk/<bulk_id>/manifest.json');
    out('ModelsBucketName', s.models.bucketName, 'encrypted models and signed manifests');
    out('AttestationsBucketName', s.attestations.bucketName, 'published attestation documents (attestations/) and fleet-key epochs (fleet-keys/)');
    out('ArtifactsBucketName', s.artifacts.bucketName, 'artifacts/enclave.eif and artifacts/host-poller, fetched by hosts at boot');
    out('LedgerBucketName', s.ledger.bucketName, 'the ledger (C2SP tlog-tiles), under Object Lock (ledgerLockMode)');
    out('JobQueueUrl', q.jobs.queueUrl, 'job messages (on-upload -> hosts)');
    out('JobDlqUrl', q.jobsDlq.queueUrl, 'jobs that failed repeatedly');
    out('LedgerQueueUrl', q.ledger.queueUrl, 'receipts (hosts -> ledger-append), FIFO');
    out('LedgerDlqUrl', q.ledgerDlq.queueUrl, 'receipts that could not be appended');
    out('UploadFailureQueueUrl', q.uploadFailures.queueUrl, 'on-upload failure records (job-dead-letter marks their jobs failed)');
    out('FleetKeyArn', k.fleetKey.attrArn, 'KMS key wrapping fleet-key epochs (released only to the measured image)');
    out('ModelKeyArn', k.modelKey.attrArn, 'KMS key wrapping model data keys (released only to the measured image)');
    out('LedgerSigningKeyArn', k.ledgerSigningKey.attrArn, 'KMS Ed25519 key signing ledger checkpoints (GetPublicKey to pin it)');
    out('BulkStateMachineArn', this.workflow.stateMachine.stateMachineArn, 'bulk workflow (submit --bulk)');
    out('FleetRotateFunctionName', this.lambdas.fleetRotate.functionName, 'invoke to start a new fleet-key epoch now');
    out('ModelPublisherRoleArn', this.identities.modelPublisherRole.roleArn, 'role to assume for ephem-batch model encrypt|upload');
    out('FleetAutoScalingGroupName', this.fleet.hosts.autoScalingGroupName, 'the hosts');
    out('DashboardName', this.observability.dashboard.dashboardName, 'CloudWatch dashboard');
    out('AlarmTopicArn', this.observability.alarmTopic.topicArn, 'SNS topic every alarm notifies (subscribe the operators)');
    out('ImageSha384', cfg.measurements.pcr0, 'PCR0 the fleet and model keys are bound to');
    out('Pcr8', cfg.measurements.pcr8 ?? 'none', 'PCR8 the keys are bound to (none: not bound)');
    out('StorePrefixes', cfg.storePrefixes.join(','), 'jobs-bucket prefixes whose sealed shards become jobs');
  }
}
