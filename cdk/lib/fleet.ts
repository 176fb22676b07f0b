// The fleet: an Auto Scaling group of Nitro Enclaves hosts in private subnets without any
// route to the internet. Hosts reach S3, SQS, KMS, Step Functions, CloudWatch and Auto Scaling
// through VPC endpoints only. The group scales on the job backlog per host and drains a host
// (lifecycle hook) before it terminates.
import { ArnFormat, Aws, CfnRule, ContextProvider, Duration, Fn, Stack, Validations } from 'aws-cdk-lib';
import * as cxschema from 'aws-cdk-lib/cloud-assembly-schema';
import * as autoscaling from 'aws-cdk-lib/aws-autoscaling';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as cloudwatchActions from 'aws-cdk-lib/aws-cloudwatch-actions';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as logs from 'aws-cdk-lib/aws-logs';
import { Construct } from 'constructs';
import { HostImage } from './config';
import { allow } from './identities';
import { justifyWildcardResources } from './nag';
import {
  ATTESTATION_CURRENT_PREFIX, DRAIN_HOOK_NAME, DRAIN_TIMEOUT_S, ENCLAVE_CID, FetchedFile, LAUNCH_HOOK_NAME, LAUNCH_TIMEOUT_S,
  hostUserData,
} from './host-user-data';
import { HostArtifact, HostArtifacts } from './host-artifacts';
import { OnlineRelay, RELAY_PORT } from './online-relay';
import { Queues } from './queues';
import { ATTESTATION_REQUESTS_METRIC, Storage } from './storage';

/** Age of the oldest job (s) at which the group adds a host and the operator is told. */
export const STALE_JOB_S = 900;

export interface FleetProps {
  readonly hostRole: iam.Role;
  readonly storage: Storage;
  readonly queues: Queues;
  /**
   * The running image's fleet key: the hosts describe it (its ARN) and have their enclaves create
   * epochs under it (keys.ts); a new image is a new key, and a new launch template.
   */
  readonly fleetKeyArn: string;
  readonly expectedPcr0: string;
  /** The enclave image and host-poller files (both or neither: placeholders, host-artifacts.ts). */
  readonly enclaveEif?: string;
  readonly hostPoller?: string;
  readonly instanceType: string;
  readonly hostImage: HostImage;
  readonly enclaveCpuCount: number;
  readonly enclaveMemoryMib: number;
  readonly minHosts: number;
  readonly maxHosts: number;
  readonly jobsPerHost: number;
  readonly maxAzs: number;
  /** An existing VPC for the hosts (default: a VPC of its own, without internet access). */
  readonly vpc?: ec2.IVpc;
  /** The hosts' subnets (default: the private isolated subnets). */
  readonly hostSubnets?: ec2.SubnetSelection;
  /** In an existing VPC: add the S3 gateway and interface endpoints the hosts need (default true). */
  readonly vpcEndpoints?: boolean;
  /** Session Manager's three interface endpoints (ssm, ssmmessages, ec2messages): opt-in, as they cost while idle. */
  readonly sessionManager: boolean;
  /** With a certificate: the online relay on every host, behind a TLS load balancer (online-relay.ts). */
  readonly onlineCertificateArn?: string;
  readonly onlineFlowsPerHost: number;
}

export class Fleet extends Construct {
  readonly vpc: ec2.IVpc;
  readonly hosts: autoscaling.AutoScalingGroup;
  readonly launchTemplate: ec2.LaunchTemplate;
  /** The enclave image and host-poller the launch template names (CDK assets, by content). */
  readonly artifacts: HostArtifacts;
  /** Where the hosts' agent ships their journal (JSON) and boot log. */
  readonly hostLogs: logs.LogGroup;
  /** The online relay's load balancer, when the deployment has a certificate for it. */
  readonly onlineRelay?: OnlineRelay;
  /** Starts the first host when work waits and the group wants none (minHosts=0). */
  startFirstHostAlarm!: cloudwatch.Alarm;
  /** Adds a host when the oldest job has waited STALE_JOB_S (observability.ts notifies on it too). */
  oldJobsAlarm!: cloudwatch.Alarm;

  constructor(scope: Construct, id: string, props: FleetProps) {
    super(scope, id);

    this.vpc = props.vpc ?? this.network(props.maxAzs);
    this.hostLogs = new logs.LogGroup(this, 'HostLogs', { retention: logs.RetentionDays.THREE_MONTHS });
    this.artifacts = new HostArtifacts(this, 'Artifacts', { enclaveEif: props.enclaveEif, hostPoller: props.hostPoller });
    this.grantHostPermissions(props);
    if (props.sessionManager) this.sessionManager(props.hostRole);

    const instanceType = new ec2.InstanceType(props.instanceType);
    const cpuType =
      instanceType.architecture === ec2.InstanceArchitecture.ARM_64 ? ec2.AmazonLinuxCpuType.ARM_64 : ec2.AmazonLinuxCpuType.X86_64;

    // Hosts accept no inbound connection (but the online relay's, from its balancer, when enabled); outbound HTTPS can only reach the VPC endpoints,
    // since the VPC has neither an internet gateway nor a NAT.
    const hostSg = new ec2.SecurityGroup(this, 'HostSecurityGroup', {
      vpc: this.vpc,
      allowAllOutbound: false,
      description: 'ephem-batch hosts: no inbound; HTTPS out to the VPC endpoints',
    });
    hostSg.addEgressRule(ec2.Peer.anyIpv4(), ec2.Port.tcp(443), 'HTTPS to VPC endpoints (no internet route exists)');
    if (props.vpc === undefined || props.vpcEndpoints !== false) this.endpoints(hostSg, props);

    const userData = ec2.UserData.forLinux();
    userData.addCommands(
      ...hostUserData({
        region: Aws.REGION,
        hostLogGroup: this.hostLogs.logGroupName,
        enclaveEif: fetched(this.artifacts.enclaveEif),
        hostPoller: fetched(this.artifacts.hostPoller),
        expectedPcr0: props.expectedPcr0,
        enclaveCpuCount: props.enclaveCpuCount,
        enclaveMemoryMib: props.enclaveMemoryMib,
        pollerEnv: {
          AWS_REGION: Aws.REGION,
          EPHEM_JOB_QUEUE_URL: props.queues.jobs.queueUrl,
          EPHEM_LEDGER_QUEUE_URL: props.queues.ledger.queueUrl,
          EPHEM_JOBS_BUCKET: props.storage.jobs.bucketName,
          EPHEM_MODELS_BUCKET: props.storage.models.bucketName,
          EPHEM_ATTESTATIONS_BUCKET: props.storage.attestations.bucketName,
          EPHEM_FLEET_KEY_ARN: props.fleetKeyArn,
          EPHEM_ENCLAVE_CID: String(ENCLAVE_CID),
          // One JSON object per line in the journal, as the log group receives it.
          EPHEM_LOG_FORMAT: 'json',
          // The Oblivious HTTP relay, reachable only from its load balancer (online-relay.ts).
          ...(props.onlineCertificateArn === undefined ? {} : { EPHEM_ONLINE_LISTEN: `0.0.0.0:${RELAY_PORT}` }),
        },
      }),
    );

    this.launchTemplate = new ec2.LaunchTemplate(this, 'HostTemplate', {
      instanceType,
      machineImage: this.machineImage(props.hostImage, cpuType),
      role: props.hostRole,
      securityGroup: hostSg,
      userData,
      nitroEnclaveEnabled: true,
      requireImdsv2: true,
      httpPutResponseHopLimit: 1,
      // The drain watcher reads its group's name from the instance tags (aws:autoscaling:groupName)
      // to complete the drain hook; passing it in user data would be a dependency cycle.
      instanceMetadataTags: true,
      detailedMonitoring: true,
      blockDevices: [
        {
          deviceName: '/dev/xvda',
          volume: ec2.BlockDeviceVolume.ebs(30, { encrypted: true, volumeType: ec2.EbsDeviceVolumeType.GP3, deleteOnTermination: true }),
        },
      ],
    });

    this.hosts = new autoscaling.AutoScalingGroup(this, 'Hosts', {
      vpc: this.vpc,
      vpcSubnets: props.hostSubnets ?? { subnetType: ec2.SubnetType.PRIVATE_ISOLATED },
      launchTemplate: this.launchTemplate,
      minCapacity: props.minHosts,
      maxCapacity: props.maxHosts,
      defaultInstanceWarmup: Duration.minutes(5),
      groupMetrics: [
        new autoscaling.GroupMetrics(
          autoscaling.GroupMetric.IN_SERVICE_INSTANCES,
          autoscaling.GroupMetric.DESIRED_CAPACITY,
          autoscaling.GroupMetric.TERMINATING_INSTANCES,
        ),
      ],
      // A new launch template version (a new image or poller: new asset keys and digests in the user
      // data; new measurements; a new AMI) rolls through the group host by host, a new host first:
      // at least one host stays in service (MinInstancesInService), so the running image keeps
      // working on the jobs it can open while the new one attests (docs/operations.md §4).
      updatePolicy: autoscaling.UpdatePolicy.rollingUpdate({
        maxBatchSize: 1,
        minInstancesInService: Math.min(1, props.maxHosts - 1),
        // The launch hook holds a new host until its enclave has attested (up to LAUNCH_TIMEOUT_S).
        pauseTime: Duration.seconds(LAUNCH_TIMEOUT_S),
        waitOnResourceSignals: false,
      }),
    });
    Validations.of(this.hosts).acknowledge(
      {
        id: 'AwsSolutions-AS3',
        reason:
          'Scaling events are visible on the dashboard (fleet size) and as Auto Scaling events in EventBridge; ' +
          'an SNS topic per deployment adds nothing the operator does not already have.',
      },
      {
        id: 'AwsSolutions-EC29',
        reason: 'Hosts are cattle in an Auto Scaling group that must be able to terminate them; they hold no state.',
      },
    );

    this.scaleOnBacklog(props);
    this.startFromZero(props);
    if (props.onlineCertificateArn !== undefined) {
      this.onlineRelay = new OnlineRelay(this, 'OnlineRelay', {
        vpc: this.vpc,
        subnets: props.hostSubnets ?? { subnetType: ec2.SubnetType.PRIVATE_ISOLATED },
        hosts: this.hosts,
        hostSecurityGroup: hostSg,
        certificateArn: props.onlineCertificateArn,
        flowsPerHost: props.onlineFlowsPerHost,
      });
    }
    this.inServiceOnlyOnceAttested();
    this.drainBeforeTermination(props.hostRole);
  }

  /**
   * The pinned AMI: `-c hostAmi`, or the Region's newest Amazon Linux 2023 as the CDK CLI looked
   * it up once (SSM parameter, kept in cdk.context.json; `cdk context --reset <key>` takes a newer
   * one, which then rolls through the group host by host). The stack is environment-agnostic, so
   * the lookup names its account and Region itself, and a rule refuses a deployment elsewhere,
   * where that AMI id does not exist.
   */
  private machineImage(image: HostImage, cpuType: ec2.AmazonLinuxCpuType): ec2.IMachineImage {
    let imageId: string;
    if (image.kind === 'ami') {
      imageId = image.imageId;
    } else {
      imageId = lookupHostImage(this, image.account, image.region, cpuType);
      new CfnRule(this, 'HostAmiRegion', {
        assertions: [
          {
            assert: Fn.conditionEquals(Aws.REGION, image.region),
            assertDescription: `The hosts' AMI (${imageId}) was looked up in ${image.region}: deploy there, or pin another with -c hostAmi=ami-...`,
          },
        ],
      });
    }
    // The literal AMI id in the template is the point (cfn-lint W9010 warns of literal ids).
    Validations.of(this).acknowledge({
      id: 'CloudFormation-Validate::W9010',
      reason: 'The hosts\' AMI is pinned on purpose, so that a deploy never rolls the fleet onto a newly published image.',
    });
    return { getImage: () => ({ imageId, osType: ec2.OperatingSystemType.LINUX, userData: ec2.UserData.forLinux() }) };
  }

  /**
   * Session Manager for operators (the SSM endpoints above): the agent Amazon Linux ships
   * registers the host. A session is a root shell on an untrusted host, which can do no more
   * than the host already can (docs/threat-model.md); it never reaches into the enclave.
   */
  private sessionManager(hostRole: iam.Role): void {
    hostRole.addManagedPolicy(iam.ManagedPolicy.fromAwsManagedPolicyName('AmazonSSMManagedInstanceCore'));
    Validations.of(hostRole).acknowledge({
      id: 'AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]',
      reason:
        'Session Manager needs the SSM agent\'s registration and message channels (ssm, ssmmessages, ec2messages), which AWS maintains as ' +
        'this managed policy; a session is a shell on an untrusted host, which holds no plaintext or key the enclave does not release to itself.',
    });
  }

  /** Private isolated subnets only (no internet gateway, no NAT), an S3 gateway endpoint, flow logs. */
  private network(maxAzs: number): ec2.Vpc {
    const vpc = new ec2.Vpc(this, 'Vpc', {
      maxAzs,
      natGateways: 0,
      subnetConfiguration: [{ name: 'hosts', subnetType: ec2.SubnetType.PRIVATE_ISOLATED, cidrMask: 22 }],
      gatewayEndpoints: { S3: { service: ec2.GatewayVpcEndpointAwsService.S3 } },
    });
    const flowLogs = new logs.LogGroup(this, 'FlowLogs', { retention: logs.RetentionDays.THREE_MONTHS });
    vpc.addFlowLog('FlowLog', { destination: ec2.FlowLogDestination.toCloudWatchLogs(flowLogs) });
    return vpc;
  }

  /** An interface endpoint for every other AWS API the hosts call, reachable from the hosts only. */
  private endpoints(hostSg: ec2.SecurityGroup, props: FleetProps): void {
    // In an existing VPC the endpoints are this construct's (that VPC may live in another stack),
    // and it gets the S3 gateway endpoint a VPC of our own is created with.
    const existing = props.vpc !== undefined;
    if (existing) new ec2.GatewayVpcEndpoint(this, 'S3Endpoint', { vpc: this.vpc, service: ec2.GatewayVpcEndpointAwsService.S3 });
    const addInterfaceEndpoint = (id: string, options: ec2.InterfaceVpcEndpointOptions) =>
      existing ? new ec2.InterfaceVpcEndpoint(this, id, { vpc: this.vpc, ...options }) : this.vpc.addInterfaceEndpoint(id, options);
    const endpointSg = new ec2.SecurityGroup(this, 'EndpointSecurityGroup', {
      vpc: this.vpc,
      allowAllOutbound: false,
      description: 'ephem-batch VPC endpoints: HTTPS from the hosts only',
    });
    endpointSg.addIngressRule(hostSg, ec2.Port.tcp(443), 'HTTPS from the hosts');
    const endpoints: Record<string, ec2.InterfaceVpcEndpointAwsService> = {
      // Exactly what the hosts call: SQS (jobs, receipts), KMS (the enclave, through the relay),
      // Step Functions (bulk task results), CloudWatch Logs (the agent ships logs only; the hosts
      // publish no metrics, so no monitoring endpoint), Auto Scaling (lifecycle hooks, health).
      Sqs: ec2.InterfaceVpcEndpointAwsService.SQS,
      Kms: ec2.InterfaceVpcEndpointAwsService.KMS,
      StepFunctions: ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
      CloudWatchLogs: ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
      AutoScaling: ec2.InterfaceVpcEndpointAwsService.AUTOSCALING,
      // Session Manager (opt-in, -c sessionManager=true): an operator reaches a host without SSH,
      // inbound rules or a bastion. Three endpoints per AZ that cost by the hour, idle or not.
      ...(props.sessionManager
        ? {
            Ssm: ec2.InterfaceVpcEndpointAwsService.SSM,
            SsmMessages: ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
            Ec2Messages: ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
          }
        : {}),
    };
    for (const [name, service] of Object.entries(endpoints)) {
      addInterfaceEndpoint(`${name}Endpoint`, {
        service,
        privateDnsEnabled: true,
        securityGroups: [endpointSg],
        open: false,
        ...(props.hostSubnets ? { subnets: props.hostSubnets } : {}),
      });
    }
  }

  /**
   * What host-poller may do: exactly the calls it makes (docs/operations.md §5 lists them, with
   * the Sid of each statement here).
   *
   * S3 answers a GET or HEAD of an absent key with 404 only to a caller allowed s3:ListBucket on
   * the bucket, else 403, which the poller takes for "access denied". For that decision S3
   * evaluates s3:ListBucket with the requested key as s3:prefix, so a condition naming the few
   * key patterns whose absence the poller must see grants the 404 without letting it list
   * anything else (the KnowAbsent* statements; docs/operations.md §5 gives the evidence for
   * this behaviour, which AWS's reference leaves unsaid, and the fallback).
   */
  private grantHostPermissions(p: FleetProps): void {
    const { jobs, models, attestations } = p.storage;
    const role = p.hostRole;
    const perJob = 'Job ids are derived from each sealed header and only known at run time; the pattern admits one kind of object per job.';
    const prefixes = (...patterns: string[]) => ({ StringLike: { 's3:prefix': patterns } });
    allow(role, 'ReceiveJobs', ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:ChangeMessageVisibility', 'sqs:GetQueueAttributes'], [
      p.queues.jobs.queueArn,
    ]);
    allow(role, 'SendReceiptsToLedger', ['sqs:SendMessage'], [p.queues.ledger.queueArn]);

    // Jobs bucket.
    allow(role, 'ReadSealedInputsAndReceipts', ['s3:GetObject'], [jobs.arnForObjects('jobs/*/input.sealed'), jobs.arnForObjects('jobs/*/receipt.cose')], {
      why: perJob,
    });
    allow(role, 'ReadJobMarkers', ['s3:GetObject'], [
      jobs.arnForObjects('jobs/*/cancel.json'),
      jobs.arnForObjects('jobs/*/ledgered.json'),
      jobs.arnForObjects('jobs/*/status.json'),
      jobs.arnForObjects('jobs/*/bulk-tasks/*'),
    ], {
      why: `${perJob} The poller checks for a cancellation, the ledger's marker, the status it is about to replace and the bulk runs waiting for the job (one token object per run).`,
    });
    // Normally absent: the receipt before the job is done, a cancellation. jobs/<id>/bulk-tasks/
    // is listed: the runs waiting for a job are known only from their slots.
    allow(role, 'KnowAbsentJobObjects', ['s3:ListBucket'], [jobs.bucketArn], {
      conditions: prefixes('jobs/*/receipt.cose', 'jobs/*/cancel.json', 'jobs/*/bulk-tasks/*'),
    });
    allow(role, 'WriteAttemptOutputsAndStatus', ['s3:PutObject', 's3:AbortMultipartUpload'], [
      jobs.arnForObjects('jobs/*/attempts/*'),
      jobs.arnForObjects('jobs/*/status.json'),
    ], { why: `${perJob} Attempt numbers likewise.` });
    // The first finished attempt wins: a receipt may only be written with If-None-Match.
    allow(role, 'CommitReceiptOnlyIfAbsent', ['s3:PutObject'], [jobs.arnForObjects('jobs/*/receipt.cose')], {
      conditions: { Null: { 's3:if-none-match': 'false' } },
      why: `${perJob} The write must be conditional (If-None-Match).`,
    });
    allow(role, 'DeleteLosingAttemptOutputs', ['s3:DeleteObject'], [jobs.arnForObjects('jobs/*/attempts/*')], {
      why: `${perJob} Only the output of an attempt that lost the race to commit its receipt is deleted.`,
    });

    // Models bucket.
    allow(role, 'ReadModels', ['s3:GetObject'], [models.arnForObjects('*')], {
      why: 'A host streams whichever model a job names into the enclave; weights are encrypted under the model key, which only the measured enclave can unwrap.',
    });
    allow(role, 'ListModels', ['s3:ListBucket'], [models.bucketArn], { conditions: prefixes('models/*') });

    // Attestations bucket: fleet-key epochs and their geneses, published documents, clients'
    // requests for fresh ones. A host offers its enclave only the epochs that have a genesis.
    allow(role, 'ReadFleetKeys', ['s3:GetObject'], [attestations.arnForObjects('fleet-keys/*'), attestations.arnForObjects('fleet-genesis/*')], {
      why: 'Fleet-key epochs and their geneses are named by epoch number, known at run time; private halves are wrapped under the fleet key and useless outside the enclave.',
    });
    allow(role, 'ListFleetKeys', ['s3:ListBucket'], [attestations.bucketArn], { conditions: prefixes('fleet-keys/*', 'fleet-genesis/*') });
    // The epoch its enclave created (record, then genesis): create-only, so two hosts never both
    // claim a number and nothing stored is ever replaced.
    allow(role, 'CreateFleetEpochsIfAbsent', ['s3:PutObject'], [attestations.arnForObjects('fleet-keys/*'), attestations.arnForObjects('fleet-genesis/*')], {
      conditions: { Null: { 's3:if-none-match': 'false' } },
      why: 'Epoch records and geneses are named by the epoch number the host claims at run time; the write must be conditional (If-None-Match).',
    });
    allow(role, 'PublishAttestations', ['s3:PutObject'], [attestations.arnForObjects('attestations/*')], {
      why: 'Each enclave boot publishes fresh attestation documents under names chosen at run time; clients verify them, so a forged one gains nothing.',
    });
    allow(role, 'ReadAttestationDocumentsAndRequests', ['s3:GetObject'], [
      attestations.arnForObjects('attestations/by-hash/*'),
      attestations.arnForObjects('attestations/requests/*'),
      attestations.arnForObjects('attestations/fresh/*'),
    ], {
      why: 'Documents are named by their hash, requests and answers by a client nonce: all chosen at run time, all public to the clients anyway.',
    });
    allow(role, 'ListAttestationRequests', ['s3:ListBucket'], [attestations.bucketArn], { conditions: prefixes('attestations/requests/*') });
    // A receipt's document found missing (a failed publish) is stored again.
    allow(role, 'KnowAbsentAttestationDocuments', ['s3:ListBucket'], [attestations.bucketArn], {
      conditions: prefixes('attestations/by-hash/*'),
    });
    // The launch watcher (host-user-data.ts) looks for the document this host's enclave published.
    allow(role, 'ConfirmOwnAttestationPublished', ['s3:GetObject'], [attestations.arnForObjects(`${ATTESTATION_CURRENT_PREFIX}*`)], {
      why: 'Named by the instance id, known only on the host; every current document is public to the clients, who list and read them all.',
    });
    allow(role, 'DeleteAnsweredAttestationRequests', ['s3:DeleteObject'], [attestations.arnForObjects('attestations/requests/*')], {
      why: 'A client request for a fresh document is removed once answered (or stale); requests are named by the client nonce.',
    });

    // The CloudWatch agent ships the journal and the boot log to the host log group only.
    allow(role, 'ShipHostLogs', ['logs:CreateLogStream', 'logs:PutLogEvents', 'logs:DescribeLogStreams'], [this.hostLogs.logGroupArn]);
    // Exactly the two objects this launch template names in the CDK assets bucket: not the bucket's
    // other assets (the Lambda code, earlier images), no list.
    const object = (a: HostArtifact) => a.asset.bucket.arnForObjects(a.asset.s3ObjectKey);
    allow(role, 'FetchArtifacts', ['s3:GetObject'], [object(this.artifacts.enclaveEif), object(this.artifacts.hostPoller)]);
    // KMS: nothing here. The fleet and model key policies name this role directly: releases and
    // new epochs only for requests that carry the enclave's attestation, and the reads of the
    // fleet key's evidence (DescribeKey, GetKeyPolicy, ListGrants) (keys.ts). CloudWatch metrics:
    // nothing either; the dashboard's job counts come from ledger-append (lambdas.ts). Step
    // Functions: the stack grants the bulk run's task completion once the state machine exists.
  }

  /**
   * Target tracking on (messages waiting + in flight) / in-service hosts. Target tracking in
   * the L2 construct takes only a plain metric, so the metric-math form is written in L1.
   */
  private scaleOnBacklog(p: FleetProps): void {
    const queueName = p.queues.jobs.queueName;
    const sqsMetric = (id: string, metricName: string) => ({
      id,
      metricStat: {
        metric: { namespace: 'AWS/SQS', metricName, dimensions: [{ name: 'QueueName', value: queueName }] },
        stat: 'Sum',
      },
      returnData: false,
    });
    new autoscaling.CfnScalingPolicy(this, 'BacklogPerHostScaling', {
      autoScalingGroupName: this.hosts.autoScalingGroupName,
      policyType: 'TargetTrackingScaling',
      estimatedInstanceWarmup: 300,
      targetTrackingConfiguration: {
        targetValue: p.jobsPerHost,
        customizedMetricSpecification: {
          metrics: [
            sqsMetric('waiting', 'ApproximateNumberOfMessagesVisible'),
            sqsMetric('inflight', 'ApproximateNumberOfMessagesNotVisible'),
            {
              id: 'hosts',
              metricStat: {
                metric: {
                  namespace: 'AWS/AutoScaling',
                  metricName: 'GroupInServiceInstances',
                  dimensions: [{ name: 'AutoScalingGroupName', value: this.hosts.autoScalingGroupName }],
                },
                stat: 'Average',
              },
              returnData: false,
            },
            {
              id: 'backlog_per_host',
              expression: '(waiting + inflight) / hosts',
              label: 'Jobs waiting or in flight per in-service host',
              returnData: true,
            },
          ],
        },
      },
    });
  }

  /**
   * The first host of an idle fleet (minHosts=0). Target tracking divides by the hosts in service,
   * so with none it has no value and never acts; this step policy sets the group to one host when
   * the group wants none yet something waits for a host: a job message, or a client's request
   * for a fresh attestation document (the attestations bucket's request metric), which comes
   * before any job can be sealed. Once a host is in service, tracking takes over (and scales back
   * to zero when nothing is waiting or in flight).
   */
  private startFromZero(p: FleetProps): void {
    const minute = Duration.minutes(1);
    const wanting = new cloudwatch.MathExpression({
      expression: 'IF(FILL(desired, 0) < 1, FILL(waiting, 0) + FILL(requests, 0), 0)',
      usingMetrics: {
        desired: new cloudwatch.Metric({
          namespace: 'AWS/AutoScaling',
          metricName: 'GroupDesiredCapacity',
          dimensionsMap: { AutoScalingGroupName: this.hosts.autoScalingGroupName },
          statistic: 'Maximum',
          period: minute,
        }),
        waiting: p.queues.jobs.metricApproximateNumberOfMessagesVisible({ period: minute, statistic: 'Maximum' }),
        requests: new cloudwatch.Metric({
          namespace: 'AWS/S3',
          metricName: 'PutRequests',
          dimensionsMap: { BucketName: p.storage.attestations.bucketName, FilterId: ATTESTATION_REQUESTS_METRIC },
          statistic: 'Sum',
          period: minute,
        }),
      },
      label: 'work waiting while the group wants no host',
      period: minute,
    });
    const policy = new autoscaling.StepScalingAction(this, 'StartFirstHost', {
      autoScalingGroup: this.hosts,
      adjustmentType: autoscaling.AdjustmentType.EXACT_CAPACITY,
      metricAggregationType: autoscaling.MetricAggregationType.MAXIMUM,
    });
    policy.addAdjustment({ lowerBound: 0, adjustment: 1 });
    this.startFirstHostAlarm = new cloudwatch.Alarm(this, 'StartFirstHostAlarm', {
      alarmDescription: 'Work waits and the fleet has no host: start the first one (target tracking takes over from there).',
      metric: wanting,
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    this.startFirstHostAlarm.addAlarmAction(new cloudwatchActions.AutoScalingAction(policy));

    // The oldest job has waited STALE_JOB_S: one more host, whatever the tracking target says
    // (a stuck or unhealthy host, or jobs too long for the target); observability.ts also notifies.
    const addHost = new autoscaling.StepScalingAction(this, 'AddHostForOldJobs', {
      autoScalingGroup: this.hosts,
      adjustmentType: autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
      metricAggregationType: autoscaling.MetricAggregationType.MAXIMUM,
      // A host just added counts only once it could have attested (the launch hook's limit).
      estimatedInstanceWarmup: Duration.seconds(LAUNCH_TIMEOUT_S),
    });
    addHost.addAdjustment({ lowerBound: 0, adjustment: 1 });
    this.oldJobsAlarm = new cloudwatch.Alarm(this, 'OldestJobAgeAlarm', {
      alarmDescription: `The oldest job has waited ${STALE_JOB_S} s: add a host (and tell the operator).`,
      metric: p.queues.jobs.metricApproximateAgeOfOldestMessage({ period: Duration.minutes(5), statistic: 'Maximum' }),
      threshold: STALE_JOB_S,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    this.oldJobsAlarm.addAlarmAction(new cloudwatchActions.AutoScalingAction(addHost));
  }

  /**
   * A new host stays in Pending:Wait until its launch watcher (host-user-data.ts) has seen its
   * enclave's attestation published and called CompleteLifecycleAction (CONTINUE); without that
   * within the heartbeat timeout, Auto Scaling abandons it: terminates it and launches another.
   * The hook is its own resource, created after the group: the hosts the group launches when it
   * is created (a first deployment's) are not held.
   */
  private inServiceOnlyOnceAttested(): void {
    this.hosts.addLifecycleHook('Launch', {
      lifecycleHookName: LAUNCH_HOOK_NAME,
      lifecycleTransition: autoscaling.LifecycleTransition.INSTANCE_LAUNCHING,
      defaultResult: autoscaling.DefaultResult.ABANDON,
      heartbeatTimeout: Duration.seconds(LAUNCH_TIMEOUT_S),
    });
  }

  /**
   * A terminating host stays in Terminating:Wait until its drain watcher (host-user-data.ts) has
   * stopped the poller, which finishes or hands back the jobs it holds, and called
   * CompleteLifecycleAction; or until the heartbeat timeout.
   */
  private drainBeforeTermination(hostRole: iam.Role): void {
    this.hosts.addLifecycleHook('Drain', {
      lifecycleHookName: DRAIN_HOOK_NAME,
      lifecycleTransition: autoscaling.LifecycleTransition.INSTANCE_TERMINATING,
      defaultResult: autoscaling.DefaultResult.CONTINUE,
      heartbeatTimeout: Duration.seconds(DRAIN_TIMEOUT_S),
    });
    // A separate policy: the group depends on the role, so the role's own default policy
    // cannot name the group without a dependency cycle.
    const groupArn = Stack.of(this).formatArn({
      service: 'autoscaling',
      resource: 'autoScalingGroup',
      resourceName: `*:autoScalingGroupName/${this.hosts.autoScalingGroupName}`,
      arnFormat: ArnFormat.COLON_RESOURCE_NAME,
    });
    const drainPolicy = new iam.Policy(this, 'HostDrainPolicy', {
      roles: [hostRole],
      statements: [
        new iam.PolicyStatement({
          // Both hooks: the launch hook (launch watcher) and the drain hook (drain watcher).
          sid: 'CompleteOwnLifecycleHooks',
          actions: ['autoscaling:CompleteLifecycleAction'],
          resources: [groupArn],
        }),
        new iam.PolicyStatement({
          // The health watcher (host-user-data.ts) marks its host Unhealthy when the enclave cannot
          // attest; only instances of this group (the worst a host can do is replace another host).
          sid: 'SetOwnGroupInstanceHealth',
          actions: ['autoscaling:SetInstanceHealth'],
          resources: [groupArn],
        }),
      ],
    });
    justifyWildcardResources(drainPolicy, [groupArn], 'An Auto Scaling group ARN contains a generated UUID; the pattern fixes the group by name.');
  }
}

/** An asset as the boot script fetches it. */
function fetched(a: HostArtifact): FetchedFile {
  return { bucket: a.asset.s3BucketName, key: a.asset.s3ObjectKey, sha256: a.sha256 };
}

/**
 * ContextProvider.getValue for an environment-agnostic stack: the lookup's account and Region are
 * its own props (getValue insists on the stack's), so the key, the cached value and the request
 * to the CLI are exactly what `latestAmazonLinux2023({ cachedInContext: true })` would make.
 */
function lookupHostImage(scope: Construct, account: string, region: string, cpuType: ec2.AmazonLinuxCpuType): string {
  const provider = cxschema.ContextProvider.SSM_PARAMETER_PROVIDER;
  const parameterName = ec2.AmazonLinux2023ImageSsmParameter.ssmParameterName({ cpuType, kernel: ec2.AmazonLinux2023Kernel.KERNEL_6_1 });
  const dummyValue = 'ami-00000000000000000';
  const { key, props } = ContextProvider.getKey(scope, { provider, props: { account, region, parameterName } });
  const value = scope.node.tryGetContext(key);
  if (typeof value === 'string' && /^ami-[0-9a-f]+$/.test(value)) return value;
  Stack.of(scope).reportMissingContextKey({ key, provider, props: { ...props, dummyValue } as unknown as cxschema.SSMParameterContextQuery });
  return dummyValue;
}
