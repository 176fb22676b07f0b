// The buckets. Every one blocks public access, encrypts at rest, refuses non-TLS requests
// and logs its accesses; the ones that hold evidence are versioned, and the ledger's
// objects cannot be changed or deleted by anyone until their retention ends.
//
// Key layout (DESIGN.md §5):
//   jobs bucket         jobs/<job_id>/input.sealed, jobs/<job_id>/attempts/<n>/output.sealed,
//                       jobs/<job_id>/receipt.cose, jobs/<job_id>/status.json,
//                       jobs/<job_id>/cancel.json, jobs/<job_id>/ledgered.json, jobs/<job_id>/bulk-tasks/<bulk_id>.json,
//                       <store prefix><...>.sealed (sealed shards dropped by data owners),
//                       bulk/<bulk_id>/shards.json, bulk/<bulk_id>/manifest.json (bulk workflow)
//   models bucket       models/<model_id>/<version>/... (encrypted weights + signed manifest)
//   attestations bucket attestations/... (published attestation documents), fleet-keys/epoch-<N>.json
//                       (epoch records), fleet-genesis/epoch-<N>.json (how an enclave created each)
//   artifacts bucket    artifacts/host-poller, artifacts/enclave.eif (fetched by the hosts at boot)
//   ledger bucket       the C2SP tlog-tiles layout written by ledger-append
import { Duration, Stack, Validations } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as s3 from 'aws-cdk-lib/aws-s3';
import * as s3n from 'aws-cdk-lib/aws-s3-notifications';
import { Construct } from 'constructs';
import { LedgerLockMode } from './config';

export interface StorageProps {
  readonly ledgerRetentionDays: number;
  readonly ledgerLockMode: LedgerLockMode;
  readonly jobsRetentionDays: number;
}

/** The S3 event filter of direct job submissions (DESIGN.md §5 step 3). */
export const JOB_INPUT_FILTER = { prefix: 'jobs/', suffix: '/input.sealed' };
/** The suffix of sealed shards under the store prefixes. */
export const SHARD_SUFFIX = '.sealed';
/** Clients' requests for a fresh attestation document, and the answers (cloud::layout). */
export const ATTESTATION_REQUESTS_PREFIX = 'attestations/requests/';
export const ATTESTATION_FRESH_PREFIX = 'attestations/fresh/';
/** Filter ids of the attestations bucket's request metrics (AWS/S3, dimension FilterId). */
export const ATTESTATION_REQUESTS_METRIC = 'AttestationRequests';
export const ATTESTATION_CURRENT_METRIC = 'AttestationsPublished';

export class Storage extends Construct {
  readonly accessLogs: s3.Bucket;
  readonly jobs: s3.Bucket;
  readonly models: s3.Bucket;
  readonly attestations: s3.Bucket;
  readonly artifacts: s3.Bucket;
  readonly ledger: s3.Bucket;

  constructor(scope: Construct, id: string, props: StorageProps) {
    super(scope, id);

    this.accessLogs = new s3.Bucket(this, 'AccessLogs', {
      ...secureDefaults(),
      lifecycleRules: [{ id: 'expire-access-logs', expiration: Duration.days(365) }],
    });
    Validations.of(this.accessLogs).acknowledge({
      id: 'AwsSolutions-S1',
      reason: 'This is the server access log bucket of all other buckets; logging it into itself would loop.',
    });

    // Jobs: transient, high-volume, unversioned. The truth about a job is its receipt in the
    // ledger, so everything here expires by age, sealed inputs with the rest of their job: a
    // lifecycle rule selects by prefix, tag or size, so it can neither pick out
    // jobs/<id>/input.sealed nor see jobs/<id>/ledgered.json (the embedded default's earlier,
    // ledger-gated input expiry has no counterpart here).
    this.jobs = new s3.Bucket(this, 'Jobs', {
      ...secureDefaults(),
      serverAccessLogsBucket: this.accessLogs,
      serverAccessLogsPrefix: 'jobs/',
      lifecycleRules: [
        { id: 'abort-incomplete-uploads', abortIncompleteMultipartUploadAfter: Duration.days(1) },
        { id: 'expire-jobs', prefix: 'jobs/', expiration: Duration.days(props.jobsRetentionDays) },
      ],
    });

    this.models = new s3.Bucket(this, 'Models', {
      ...secureDefaults(),
      versioned: true,
      serverAccessLogsBucket: this.accessLogs,
      serverAccessLogsPrefix: 'models/',
      lifecycleRules: [
        { id: 'abort-incomplete-uploads', abortIncompleteMultipartUploadAfter: Duration.days(1) },
        { id: 'expire-noncurrent', noncurrentVersionExpiration: Duration.days(30) },
      ],
    });

    // Attestation documents, fleet-key epochs and their geneses: an auditor verifies a receipt against the
    // document it names, so old versions are kept. Clients' requests for a fresh document and
    // the answers are tenant-written or tenant-driven and live seconds: whatever a host did not
    // remove (and, the bucket being versioned, what it did remove) is gone within about two days.
    this.attestations = new s3.Bucket(this, 'Attestations', {
      ...secureDefaults(),
      versioned: true,
      serverAccessLogsBucket: this.accessLogs,
      serverAccessLogsPrefix: 'attestations/',
      // S3 request metrics (1-minute, AWS/S3 PutRequests per filter): a client asking for a fresh
      // document starts the first host of an idle fleet, and a fleet that stops republishing its
      // documents raises an alarm (fleet.ts, observability.ts).
      metrics: [
        { id: ATTESTATION_REQUESTS_METRIC, prefix: ATTESTATION_REQUESTS_PREFIX },
        { id: ATTESTATION_CURRENT_METRIC, prefix: 'attestations/current/' },
      ],
      lifecycleRules: [ATTESTATION_REQUESTS_PREFIX, ATTESTATION_FRESH_PREFIX].map((prefix) => ({
        id: `expire-${prefix.replace(/\/$/, '').replace(/\//g, '-')}`,
        prefix,
        expiration: Duration.days(1),
        noncurrentVersionExpiration: Duration.days(1),
        abortIncompleteMultipartUploadAfter: Duration.days(1),
      })),
    });

    this.artifacts = new s3.Bucket(this, 'Artifacts', {
      ...secureDefaults(),
      versioned: true,
      serverAccessLogsBucket: this.accessLogs,
      serverAccessLogsPrefix: 'artifacts/',
      lifecycleRules: [{ id: 'expire-noncurrent', noncurrentVersionExpiration: Duration.days(90) }],
    });

    // The ledger: Object Lock, so no entry, tile or checkpoint version is overwritten or deleted
    // before the retention ends — in compliance mode by no one, the account root included; in
    // governance mode (the default, for trials) only by a principal allowed to bypass it.
    this.ledger = new s3.Bucket(this, 'Ledger', {
      ...secureDefaults(),
      versioned: true,
      objectLockEnabled: true,
      objectLockDefaultRetention:
        props.ledgerLockMode === 'compliance'
          ? s3.ObjectLockRetention.compliance(Duration.days(props.ledgerRetentionDays))
          : s3.ObjectLockRetention.governance(Duration.days(props.ledgerRetentionDays)),
      serverAccessLogsBucket: this.accessLogs,
      serverAccessLogsPrefix: 'ledger/',
    });
    this.ledger.addToResourcePolicy(
      new iam.PolicyStatement({
        sid: 'DenyLedgerDeletes',
        effect: iam.Effect.DENY,
        principals: [new iam.AnyPrincipal()],
        actions: ['s3:DeleteObject', 's3:DeleteObjectVersion', 's3:PutLifecycleConfiguration'],
        resources: [this.ledger.bucketArn, this.ledger.arnForObjects('*')],
      }),
    );
  }

  /**
   * S3 events that create jobs (DESIGN.md §5 step 3): direct submissions (prefix jobs/, suffix
   * /input.sealed) and sealed shards under each store prefix. The prefixes were checked not to
   * overlap (config.ts), as S3 requires.
   */
  routeUploadsTo(onUpload: lambda.IFunction, storePrefixes: string[]): void {
    const dest = new s3n.LambdaDestination(onUpload);
    this.jobs.addEventNotification(s3.EventType.OBJECT_CREATED, dest, JOB_INPUT_FILTER);
    for (const prefix of storePrefixes) {
      this.jobs.addEventNotification(s3.EventType.OBJECT_CREATED, dest, { prefix, suffix: SHARD_SUFFIX });
    }
    // CDK configures notifications through its own singleton custom resource (a Lambda that
    // calls PutBucketNotificationConfiguration), created by the calls above.
    const handlers = Stack.of(this).node.children.filter((c) => c.node.id.startsWith('BucketNotificationsHandler'));
    for (const handler of handlers) {
      Validations.of(handler).acknowledge({
        id: 'AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]',
        reason:
          "CDK's own bucket-notifications handler runs once per deployment and uses the AWS managed basic execution role " +
          '(CloudWatch Logs only); CDK offers no way to replace that role.',
      });
    }
  }
}

function secureDefaults(): Partial<s3.BucketProps> {
  return {
    blockPublicAccess: s3.BlockPublicAccess.BLOCK_ALL,
    encryption: s3.BucketEncryption.S3_MANAGED,
    enforceSSL: true,
    minimumTLSVersion: 1.2,
    objectOwnership: s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
  };
}
