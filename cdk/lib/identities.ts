// One IAM role per component. The roles are created first and empty, because the KMS key
// policies must name them; each construct that owns a resource then grants its own
// permissions to these roles (the table in docs/operations.md lists them all).
import { Stack } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import { Construct } from 'constructs';
import { justifyWildcardResources } from './nag';

export class Identities extends Construct {
  /**
   * EC2 hosts of the fleet (host-poller). Reaches the fleet and model keys only through an attested
   * enclave, which also has KMS generate each new fleet-key epoch for itself.
   */
  readonly hostRole: iam.Role;
  /** ledger-append Lambda: the ledger's only writer and signer. */
  readonly ledgerRole: iam.Role;
  /** on-upload Lambda: turns S3 upload events into job messages. */
  readonly onUploadRole: iam.Role;
  /** bulk-list-shards, bulk-await-shard and bulk-aggregate Lambdas (the bulk workflow's steps). */
  readonly bulkListRole: iam.Role;
  readonly bulkAwaitRole: iam.Role;
  readonly bulkAggregateRole: iam.Role;
  /** job-dead-letter Lambda: ends the jobs on-upload gave up on and those whose message was dead-lettered. */
  readonly deadLetterRole: iam.Role;
  /**
   * Model publisher: uploads encrypted models and wraps their data keys with kms:Encrypt.
   * Any principal of this account that IAM allows to assume it can act as publisher.
   */
  readonly modelPublisherRole: iam.Role;
  /**
   * The keys' kill switch: kms:DisableKey and kms:EnableKey on the fleet, model and ledger keys
   * (granted in their key policies), and nothing else; assumed only with MFA.
   */
  readonly keyBreakGlassRole: iam.Role;

  constructor(scope: Construct, id: string) {
    super(scope, id);
    const lambdaService = new iam.ServicePrincipal('lambda.amazonaws.com');
    this.hostRole = new iam.Role(this, 'HostRole', {
      assumedBy: new iam.ServicePrincipal('ec2.amazonaws.com'),
      description: 'ephem-batch fleet host (host-poller, untrusted relay)',
    });
    this.ledgerRole = new iam.Role(this, 'LedgerAppendRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch ledger-append Lambda',
    });
    this.onUploadRole = new iam.Role(this, 'OnUploadRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch on-upload Lambda',
    });
    this.bulkListRole = new iam.Role(this, 'BulkListShardsRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch bulk-list-shards Lambda',
    });
    this.bulkAwaitRole = new iam.Role(this, 'BulkAwaitShardRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch bulk-await-shard Lambda',
    });
    this.bulkAggregateRole = new iam.Role(this, 'BulkAggregateRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch bulk-aggregate Lambda',
    });
    this.deadLetterRole = new iam.Role(this, 'JobDeadLetterRole', {
      assumedBy: lambdaService,
      description: 'ephem-batch job-dead-letter Lambda',
    });
    this.modelPublisherRole = new iam.Role(this, 'ModelPublisherRole', {
      assumedBy: new iam.AccountPrincipal(Stack.of(this).account),
      description: 'ephem-batch model publisher (ephem-batch model encrypt|upload)',
    });
    this.keyBreakGlassRole = new iam.Role(this, 'KeyBreakGlassRole', {
      assumedBy: new iam.AccountPrincipal(Stack.of(this).account).withConditions({ Bool: { 'aws:MultiFactorAuthPresent': 'true' } }),
      description: 'ephem-batch key kill switch: DisableKey/EnableKey on the stack keys, nothing else',
    });
  }
}

export interface AllowOptions {
  readonly conditions?: Record<string, Record<string, unknown>>;
  /** Why a wildcard in `resources` is needed (required when there is one; becomes the cdk-nag acknowledgement). */
  readonly why?: string;
}

/** Adds one Allow statement to a role's default policy; a wildcard resource must say why. */
export function allow(role: iam.Role, sid: string, actions: string[], resources: string[], opts: AllowOptions = {}): void {
  role.addToPrincipalPolicy(
    new iam.PolicyStatement({ sid, effect: iam.Effect.ALLOW, actions, resources, conditions: opts.conditions }),
  );
  justifyWildcardResources(role, resources, opts.why);
}
