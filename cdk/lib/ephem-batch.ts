// The whole deployment as one construct, top-down: who (identities), where data lives (storage,
// queues), the keys that bind data to the measured enclave image, the fleet that runs it, the
// Lambdas and the bulk workflow around it, what the operator watches, and the outputs the client
// reads. The app's stack (ephem-batch-stack.ts) is a thin shell over it; a CDK user puts it in a
// stack of their own (`new EphemBatch(stack, 'Embeddings', { measurements, vpc, ... })`).
import { CfnOutput, Stack, Tags, Token } from 'aws-cdk-lib';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import { Construct } from 'constructs';
import { CliEnvironment, DeployConfig, HostImage, Measurements, loadConfig } from './config';
import { Fleet } from './fleet';
import { Identities, allow } from './identities';
import { Keys } from './keys';
import { Lambdas } from './lambdas';
import { Observability } from './observability';
import { Queues } from './queues';
import { Storage } from './storage';
import { BulkWorkflow } from './workflow';

/**
 * What an EphemBatch deployment is made of. Every setting but the measurements is optional and
 * defaults (and is checked) exactly as its `-c key=value` counterpart of docs/operations.md §1.5.
 */
export interface EphemBatchProps extends Partial<Omit<DeployConfig, 'measurements' | 'hostImage'>> {
  /** The enclave image measurements the KMS key policies bind key release to (no default). */
  readonly measurements: Measurements;
  /**
   * The hosts' AMI, pinned: `{ kind: 'ami', imageId }`, or `{ kind: 'lookup', account, region }`
   * (looked up once, kept in cdk.context.json). Default: a lookup in the stack's environment if
   * it has one, else in the CDK CLI's (CDK_DEFAULT_ACCOUNT, CDK_DEFAULT_REGION).
   */
  readonly hostImage?: HostImage;
  /** An existing VPC for the hosts (default: a VPC of its own, without internet access). */
  readonly vpc?: ec2.IVpc;
  /** The hosts' subnets in that VPC (default: its private isolated subnets). */
  readonly hostSubnets?: ec2.SubnetSelection;
  /** In an existing VPC: add the S3 gateway and interface endpoints the hosts need (default true). */
  readonly vpcEndpoints?: boolean;
  /** The image publisher's Ed25519 public key, 64 hex (default: `-c imagePublisherKey`). */
  readonly imagePublisherKey?: string;
}

/** The props with every default filled in and every value checked (ConfigError otherwise). */
export function resolveProps(scope: Construct, props: EphemBatchProps): DeployConfig {
  const values: Record<string, unknown> = {
    ...props,
    pcr0: props.measurements.pcr0,
    pcr8: props.measurements.pcr8,
    hostAmi: props.hostImage?.kind === 'ami' ? props.hostImage.imageId : undefined,
  };
  const stack = Stack.of(scope);
  const stackEnv: CliEnvironment | undefined =
    Token.isUnresolved(stack.account) || Token.isUnresolved(stack.region) ? undefined : { CDK_DEFAULT_ACCOUNT: stack.account, CDK_DEFAULT_REGION: stack.region };
  const cliEnv: CliEnvironment =
    props.hostImage?.kind === 'lookup' ? { CDK_DEFAULT_ACCOUNT: props.hostImage.account, CDK_DEFAULT_REGION: props.hostImage.region } : stackEnv ?? process.env;
  return { ...loadConfig((key) => values[key], cliEnv), measurements: props.measurements, nextMeasurements: props.nextMeasurements };
}

export class EphemBatch extends Construct {
  /** The settings in force, defaults filled in. */
  readonly config: DeployConfig;
  readonly identities: Identities;
  readonly storage: Storage;
  readonly queues: Queues;
  readonly keys: Keys;
  readonly fleet: Fleet;
  readonly lambdas: Lambdas;
  readonly workflow: BulkWorkflow;
  readonly observability: Observability;

  constructor(scope: Construct, id: string, props: EphemBatchProps) {
    super(scope, id);
    const cfg = resolveProps(this, props);
    this.config = cfg;
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
      nextMeasurements: cfg.nextMeasurements,
      breakGlassRole: this.identities.keyBreakGlassRole,
      hostRole: this.identities.hostRole,
      ledgerRole: this.identities.ledgerRole,
      modelPublisherRole: this.identities.modelPublisherRole,
    });
    this.fleet = new Fleet(this, 'Fleet', {
      hostRole: this.identities.hostRole,
      storage: this.storage,
      queues: this.queues,
      fleetKeyArn: this.keys.fleetKey.attrArn,
      expectedPcr0: cfg.measurements.pcr0,
      enclaveEif: cfg.enclaveEif,
      hostPoller: cfg.hostPoller,
      instanceType: cfg.instanceType,
      hostImage: cfg.hostImage,
      enclaveCpuCount: cfg.enclaveCpuCount,
      enclaveMemoryMib: cfg.enclaveMemoryMib,
      minHosts: cfg.minHosts,
      maxHosts: cfg.maxHosts,
      jobsPerHost: cfg.jobsPerHost,
      maxAzs: cfg.maxAzs,
      vpc: props.vpc,
      hostSubnets: props.hostSubnets,
      vpcEndpoints: props.vpcEndpoints,
      sessionManager: cfg.sessionManager,
      onlineCertificateArn: cfg.onlineCertificateArn,
      onlineFlowsPerHost: cfg.onlineFlowsPerHost,
    });
    this.lambdas = new Lambdas(this, 'Lambdas', {
      identities: this.identities,
      storage: this.storage,
      queues: this.queues,
      keys: this.keys,
      storePrefixes: cfg.storePrefixes,
      lambdaAssetsDir: cfg.lambdaAssetsDir,
      ledgerReservedConcurrency: cfg.ledgerReservedConcurrency,
      witnesses: cfg.witnesses,
      imagePublisherKey: props.imagePublisherKey,
      imagePcr0s: [cfg.measurements.pcr0, ...(cfg.nextMeasurements ? [cfg.nextMeasurements.pcr0] : [])],
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
      fleetAlarms: [this.fleet.oldJobsAlarm],
      attestationsBucketName: this.storage.attestations.bucketName,
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
    const stack = Stack.of(this);
    const s = this.storage;
    const q = this.queues;
    const k = this.keys;
    out('Region', stack.region, 'AWS region of the deployment');
    out('JobsBucketName', s.jobs.bucketName, 'jobs/<job_id>/..., store prefixes, bulk/<bulk_id>/manifest.json');
    out('ModelsBucketName', s.models.bucketName, 'encrypted models and signed manifests');
    out('AttestationsBucketName', s.attestations.bucketName, 'published attestation documents (attestations/), fleet-key epochs (fleet-keys/) and their geneses (fleet-genesis/)');
    out('ArtifactsBucketName', s.artifacts.bucketName, 'artifacts/policies/: the image publisher\'s signed policies the ledger appenders accept');
    out('LedgerBucketName', s.ledger.bucketName, 'the ledger (C2SP tlog-tiles), under Object Lock (ledgerLockMode)');
    out('JobQueueUrl', q.jobs.queueUrl, 'job messages (on-upload -> hosts)');
    out('JobDlqUrl', q.jobsDlq.queueUrl, 'jobs that failed repeatedly');
    out('LedgerQueueUrl', q.ledger.queueUrl, 'receipts (hosts -> ledger-append), FIFO');
    out('LedgerDlqUrl', q.ledgerDlq.queueUrl, 'receipts that could not be appended');
    out('UploadFailureQueueUrl', q.uploadFailures.queueUrl, 'on-upload failure records (job-dead-letter marks their jobs failed)');
    out('FleetKeyArn', k.fleetKey.attrArn, 'KMS key wrapping fleet-key epochs (generated for and released only to the measured image)');
    out('ModelKeyArn', k.modelKey.attrArn, 'KMS key wrapping model data keys (released only to the measured image)');
    out('LedgerSigningKeyArn', k.ledgerSigningKey.attrArn, 'KMS Ed25519 key signing ledger checkpoints (GetPublicKey to pin it)');
    out('KeyBreakGlassRoleArn', this.identities.keyBreakGlassRole.roleArn, 'the kill switch: may DisableKey/EnableKey on the three keys, nothing else (MFA; docs/operations.md §5)');
    if (k.next !== undefined) {
      out('NextFleetKeyArn', k.next.fleetKey.attrArn, 'the incoming image\'s fleet key (its hosts create their epochs under it)');
      out('NextModelKeyArn', k.next.modelKey.attrArn, 'the incoming image\'s model key (seal the model under it before the hosts roll)');
      out('NextImageSha384', k.next.measurements.pcr0, 'PCR0 of the incoming image');
    }
    out('BulkStateMachineArn', this.workflow.stateMachine.stateMachineArn, 'bulk workflow (submit --bulk)');
    out('ModelPublisherRoleArn', this.identities.modelPublisherRole.roleArn, 'role to assume for ephem-batch model encrypt|upload');
    out('FleetAutoScalingGroupName', this.fleet.hosts.autoScalingGroupName, 'the hosts');
    out('DashboardName', this.observability.dashboard.dashboardName, 'CloudWatch dashboard');
    out('AlarmTopicArn', this.observability.alarmTopic.topicArn, 'SNS topic every alarm notifies (subscribe the operators)');
    out('ImageSha384', cfg.measurements.pcr0, 'PCR0 the fleet and model keys are bound to');
    out('Pcr8', cfg.measurements.pcr8 ?? 'none', 'PCR8 the keys are bound to (none: not bound)');
    out('StorePrefixes', cfg.storePrefixes.join(','), 'jobs-bucket prefixes whose sealed shards become jobs');
    if (this.fleet.onlineRelay !== undefined) {
      out('OnlineRelayDnsName', this.fleet.onlineRelay.loadBalancer.loadBalancerDnsName, 'the online relay (POST https://<name>/v1/ohttp); internal to the VPC');
    }
  }
}
