// What the operator watches: one dashboard (queue depth, age of the oldest job, jobs per
// minute, documents per second, errors, DLQ sizes, fleet size) and alarms for the states that
// need a human (a DLQ that is not empty, a job that ended dead-lettered or unprocessed, a backlog
// that is not moving, failing Lambdas or bulk runs).
import { Duration, Stack, Validations } from 'aws-cdk-lib';
import * as autoscaling from 'aws-cdk-lib/aws-autoscaling';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as cloudwatchActions from 'aws-cdk-lib/aws-cloudwatch-actions';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as sns from 'aws-cdk-lib/aws-sns';
import * as subscriptions from 'aws-cdk-lib/aws-sns-subscriptions';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { STALE_ATTESTATION_S } from './host-user-data';
import { Queues } from './queues';
import { ATTESTATION_CURRENT_METRIC } from './storage';

/**
 * The metrics ledger-append prints as CloudWatch Embedded Metric Format lines, one per receipt
 * newly in the ledger, without dimensions (lambdas/src/metrics.rs). Counting at the ledger counts
 * each job once, however often its receipt was delivered; the hosts publish no metrics.
 */
export const METRICS_NAMESPACE = 'EphemBatch';
export const LEDGER_METRICS = {
  jobsLedgered: 'JobsLedgered',
  documents: 'Documents',
  documentsFailed: 'DocumentsFailed',
} as const;

export interface ObservabilityProps {
  readonly queues: Queues;
  readonly hosts: autoscaling.AutoScalingGroup;
  /** The fleet's own alarms (their first action scales the group); the operator is told as well. */
  readonly fleetAlarms: cloudwatch.Alarm[];
  /** Where the hosts publish their documents (request metric ATTESTATION_CURRENT_METRIC). */
  readonly attestationsBucketName: string;
  readonly functions: lambda.Function[];
  readonly ledgerAppend: lambda.Function;
  readonly stateMachine: sfn.StateMachine;
  /** An address every alarm is mailed to (`-c alarmEmail=`), besides whoever subscribes to the topic. */
  readonly alarmEmail?: string;
}

export class Observability extends Construct {
  readonly dashboard: cloudwatch.Dashboard;
  readonly alarms: cloudwatch.Alarm[] = [];
  /** Where every alarm goes (output `AlarmTopicArn`): an alarm nobody hears is no alarm. */
  readonly alarmTopic: sns.Topic;

  constructor(scope: Construct, id: string, p: ObservabilityProps) {
    super(scope, id);
    const minute = Duration.minutes(1);
    this.alarmTopic = new sns.Topic(this, 'AlarmTopic', { displayName: 'ephem-batch alarms', enforceSSL: true });
    if (p.alarmEmail) this.alarmTopic.addSubscription(new subscriptions.EmailSubscription(p.alarmEmail));
    // CloudWatch cannot publish to a topic under the AWS-managed SNS key, and a key of our own
    // would be a fourth key policy for messages that carry only alarm names and states.
    Validations.of(this.alarmTopic).acknowledge({
      id: 'AwsSolutions-SNS2',
      reason: 'Alarm notifications carry alarm names, states and metric values only; CloudWatch cannot publish to a topic under the AWS-managed SNS key.',
    });
    const notify = new cloudwatchActions.SnsAction(this.alarmTopic);
    const { jobs, jobsDlq, ledger, ledgerDlq, uploadFailures } = p.queues;
    const ledgerMetric = (metricName: string, label: string) =>
      new cloudwatch.Metric({ namespace: METRICS_NAMESPACE, metricName, statistic: 'Sum', period: minute, label });
    const groupMetric = (metricName: string, label: string) =>
      new cloudwatch.Metric({
        namespace: 'AWS/AutoScaling',
        metricName,
        dimensionsMap: { AutoScalingGroupName: p.hosts.autoScalingGroupName },
        statistic: 'Average',
        period: minute,
        label,
      });

    const docsPerSecond = new cloudwatch.MathExpression({
      expression: 'docs / PERIOD(docs)',
      usingMetrics: { docs: ledgerMetric(LEDGER_METRICS.documents, 'documents') },
      label: 'documents/s',
      period: minute,
    });

    this.dashboard = new cloudwatch.Dashboard(this, 'Dashboard', {
      dashboardName: `${Stack.of(this).stackName}-fleet`,
      defaultInterval: Duration.hours(3),
    });
    this.dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: 'Job queue depth',
        left: [
          jobs.metricApproximateNumberOfMessagesVisible({ period: minute, label: 'waiting' }),
          jobs.metricApproximateNumberOfMessagesNotVisible({ period: minute, label: 'in flight' }),
        ],
      }),
      new cloudwatch.GraphWidget({
        title: 'Age of oldest job (s)',
        left: [jobs.metricApproximateAgeOfOldestMessage({ period: minute, label: 'jobs' })],
        right: [ledger.metricApproximateAgeOfOldestMessage({ period: minute, label: 'ledger receipts' })],
      }),
      new cloudwatch.GraphWidget({
        title: 'Jobs per minute',
        left: [
          jobs.metricNumberOfMessagesDeleted({ period: minute, statistic: 'Sum', label: 'finished (message deleted)' }),
          ledgerMetric(LEDGER_METRICS.jobsLedgered, 'in the ledger'),
        ],
      }),
      new cloudwatch.GraphWidget({ title: 'Documents per second', left: [docsPerSecond] }),
    );
    this.dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: 'Errors',
        left: p.functions.map((fn) => fn.metricErrors({ period: minute, label: fn.node.id })),
        right: [
          ledgerMetric(LEDGER_METRICS.documentsFailed, 'documents failed'),
          p.stateMachine.metricFailed({ period: minute, label: 'bulk runs failed' }),
        ],
      }),
      new cloudwatch.GraphWidget({
        title: 'Dead-letter queues',
        left: [
          jobsDlq.metricApproximateNumberOfMessagesVisible({ period: minute, label: 'jobs DLQ' }),
          ledgerDlq.metricApproximateNumberOfMessagesVisible({ period: minute, label: 'ledger DLQ' }),
          uploadFailures.metricApproximateNumberOfMessagesVisible({ period: minute, label: 'upload failures' }),
        ],
        right: [
          uploadFailures.metricNumberOfMessagesSent({ period: minute, statistic: 'Sum', label: 'uploads on-upload gave up on' }),
          jobsDlq.metricNumberOfMessagesReceived({ period: minute, statistic: 'Sum', label: 'dead-lettered jobs received' }),
        ],
      }),
      new cloudwatch.GraphWidget({
        title: 'Fleet size',
        left: [groupMetric('GroupInServiceInstances', 'in service'), groupMetric('GroupDesiredCapacity', 'desired')],
      }),
      new cloudwatch.GraphWidget({
        title: 'Ledger appends',
        left: [
          p.ledgerAppend.metricInvocations({ period: minute, label: 'invocations' }),
          ledger.metricApproximateNumberOfMessagesVisible({ period: minute, label: 'receipts waiting' }),
        ],
      }),
    );

    const alarm = (id: string, description: string, metric: cloudwatch.IMetric, threshold: number) => {
      const a = new cloudwatch.Alarm(this, id, {
        alarmDescription: description,
        metric,
        threshold,
        evaluationPeriods: 1,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      });
      a.addAlarmAction(notify);
      this.alarms.push(a);
      return a;
    };
    const fiveMin = Duration.minutes(5);
    // job-dead-letter drains the jobs DLQ and the upload-failure queue at once: a message that
    // stays visible is one it could not handle; one that arrives is a job that ended failed.
    alarm('JobsDlqNotEmpty', 'A dead-lettered job message stays in the jobs DLQ: job-dead-letter could not mark its job failed (see its logs).',
      jobsDlq.metricApproximateNumberOfMessagesVisible({ period: fiveMin, statistic: 'Maximum' }), 1);
    alarm('JobsDeadLettered', 'A job message was dead-lettered; job-dead-letter marked the job failed (dead_lettered) unless it had ended.',
      jobsDlq.metricNumberOfMessagesReceived({ period: fiveMin, statistic: 'Sum' }), 1);
    alarm('UploadsUnprocessed', 'on-upload gave up on an upload (its retries or its maximum event age); job-dead-letter marked the job failed (upload_unprocessed).',
      uploadFailures.metricNumberOfMessagesSent({ period: fiveMin, statistic: 'Sum' }), 1);
    alarm('UploadFailuresNotConsumed', 'An on-upload failure record has waited more than 15 minutes: job-dead-letter cannot end its job (see its logs).',
      uploadFailures.metricApproximateAgeOfOldestMessage({ period: fiveMin, statistic: 'Maximum' }), 900);
    alarm('LedgerDlqNotEmpty', 'A receipt could not be appended to the ledger and is in the ledger DLQ.',
      ledgerDlq.metricApproximateNumberOfMessagesVisible({ period: fiveMin, statistic: 'Maximum' }), 1);
    alarm('JobsNotMoving', 'The oldest job has waited more than an hour: the fleet is too small, stuck or failing.',
      jobs.metricApproximateAgeOfOldestMessage({ period: fiveMin, statistic: 'Maximum' }), 3600);
    alarm('LedgerNotMoving', 'The oldest receipt has waited more than 15 minutes for the ledger.',
      ledger.metricApproximateAgeOfOldestMessage({ period: fiveMin, statistic: 'Maximum' }), 900);
    for (const fn of p.functions) {
      alarm(`${fn.node.id}Errors`, `${fn.node.id} returned errors.`, fn.metricErrors({ period: fiveMin, statistic: 'Sum' }), 1);
    }
    alarm('BulkRunsFailed', 'A bulk workflow run failed.', p.stateMachine.metricFailed({ period: fiveMin, statistic: 'Sum' }), 1);

    // Healing beyond EC2: hosts are in service, yet none has published a document for twice the
    // republish interval. Each host marks itself Unhealthy when its own document is that old
    // (host-user-data.ts); this says the whole fleet is not attesting (KMS, the key policy, the
    // image), which replacing hosts will not fix: the operator is needed.
    const staleWindow = Duration.seconds(STALE_ATTESTATION_S);
    const noFreshAttestation = new cloudwatch.MathExpression({
      expression: 'IF(FILL(hosts, 0) >= 1 AND FILL(published, 0) < 1, 1, 0)',
      usingMetrics: {
        hosts: new cloudwatch.Metric({
          namespace: 'AWS/AutoScaling',
          metricName: 'GroupInServiceInstances',
          dimensionsMap: { AutoScalingGroupName: p.hosts.autoScalingGroupName },
          statistic: 'Minimum',
          period: staleWindow,
        }),
        published: new cloudwatch.Metric({
          namespace: 'AWS/S3',
          metricName: 'PutRequests',
          dimensionsMap: { BucketName: p.attestationsBucketName, FilterId: ATTESTATION_CURRENT_METRIC },
          statistic: 'Sum',
          period: staleWindow,
        }),
      },
      label: 'hosts in service but no attestation document published',
      period: staleWindow,
    });
    alarm('NoFreshAttestation',
      `Hosts were in service for ${STALE_ATTESTATION_S} s (twice the republish interval) and none published an attestation document: clients cannot seal new jobs.`,
      noFreshAttestation, 1);
    for (const a of p.fleetAlarms) {
      a.addAlarmAction(notify);
      this.alarms.push(a);
    }
  }
}
