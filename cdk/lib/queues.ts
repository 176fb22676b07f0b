// The queues: one standard queue of jobs for the fleet, one FIFO queue of receipts for the
// ledger, each with a dead-letter queue, and on-upload's on-failure destination (the uploads it
// gave up on). All encrypted at rest and TLS-only. Messages carry only references and sealed or
// signed bytes, so SQS-managed encryption is enough.
import { Duration, RemovalPolicy, Validations } from 'aws-cdk-lib';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct } from 'constructs';

/** Deliveries before a job message goes to the DLQ (DESIGN.md §5: "fails N times"). */
export const JOB_MAX_RECEIVES = 5;
/**
 * Deliveries before a receipt message goes to the ledger DLQ. ledger-append hides a failure that
 * may pass for 2 s, then 8 s (by its ApproximateReceiveCount) and not at all on the last receive,
 * so a poison message leaves the one FIFO group within seconds (docs/operations.md, "Redrive").
 */
export const LEDGER_MAX_RECEIVES = 3;
/**
 * ledger-append's timeout. The FIFO queue's visibility is six times it (AWS's rule for a Lambda
 * event source): what a message waits only when an invocation dies without settling it.
 */
export const LEDGER_APPEND_TIMEOUT = Duration.seconds(30);
/** job-dead-letter's timeout; the queues it consumes hide a message six times as long. */
export const DEAD_LETTER_TIMEOUT = Duration.seconds(30);

export class Queues extends Construct {
  readonly jobs: sqs.Queue;
  readonly jobsDlq: sqs.Queue;
  readonly ledger: sqs.Queue;
  readonly ledgerDlq: sqs.Queue;
  /** on-upload's on-failure destination: Lambda's record of each upload event it gave up on. */
  readonly uploadFailures: sqs.Queue;

  constructor(scope: Construct, id: string) {
    super(scope, id);

    // job-dead-letter consumes it: a message whose host died on its last receive ends failed.
    this.jobsDlq = new sqs.Queue(this, 'JobsDlq', {
      ...secureDefaults(),
      retentionPeriod: Duration.days(14),
      visibilityTimeout: Duration.seconds(DEAD_LETTER_TIMEOUT.toSeconds() * 6),
    });
    // A host keeps extending the visibility of the message it works on (ChangeMessageVisibility),
    // so the default only matters when a host dies: then the job is redelivered after it.
    this.jobs = new sqs.Queue(this, 'Jobs', {
      ...secureDefaults(),
      visibilityTimeout: Duration.minutes(5),
      retentionPeriod: Duration.days(4),
      receiveMessageWaitTime: Duration.seconds(20),
      deadLetterQueue: { queue: this.jobsDlq, maxReceiveCount: JOB_MAX_RECEIVES },
    });

    this.ledgerDlq = new sqs.Queue(this, 'LedgerDlq', {
      ...secureDefaults(),
      fifo: true,
      retentionPeriod: Duration.days(14),
      removalPolicy: RemovalPolicy.RETAIN,
    });
    // Receipts, in one message group (the ledger is a single sequence); the host uses the job id
    // as deduplication id, so a receipt sent twice within five minutes is delivered once, and the
    // ledger ignores a job it already holds after that.
    this.ledger = new sqs.Queue(this, 'Ledger', {
      ...secureDefaults(),
      fifo: true,
      contentBasedDeduplication: false,
      visibilityTimeout: Duration.seconds(LEDGER_APPEND_TIMEOUT.toSeconds() * 6),
      retentionPeriod: Duration.days(14),
      deadLetterQueue: { queue: this.ledgerDlq, maxReceiveCount: LEDGER_MAX_RECEIVES },
      // `cdk destroy` keeps the receipts in flight (and those that failed): they are the only
      // record of finished jobs not yet in the ledger (docs/operations.md §8).
      removalPolicy: RemovalPolicy.RETAIN,
    });

    // Lambda sends here the record of an asynchronous on-upload invocation that failed its
    // retries or outlived its maximum age; job-dead-letter marks that upload's job failed.
    this.uploadFailures = new sqs.Queue(this, 'UploadFailures', {
      ...secureDefaults(),
      retentionPeriod: Duration.days(14),
      visibilityTimeout: Duration.seconds(DEAD_LETTER_TIMEOUT.toSeconds() * 6),
    });
    Validations.of(this.uploadFailures).acknowledge({
      id: 'AwsSolutions-SQS3',
      reason:
        'It is itself a dead-letter queue: on-upload\'s on-failure destination (Lambda asynchronous invocations). A record its consumer ' +
        'cannot handle stays, and the UploadFailuresNotConsumed alarm calls the operator.',
    });
  }
}

function secureDefaults(): Partial<sqs.QueueProps> {
  return { encryption: sqs.QueueEncryption.SQS_MANAGED, enforceSSL: true };
}
