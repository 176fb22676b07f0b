// The bulk workflow (DESIGN.md §5, last paragraph): a Standard state machine whose definition
// is the single ASL file lambdas/asl/bulk-workflow.asl.json, shared with the Rust tests. The
// deployment only fills its ${...} placeholders. Each shard is awaited on a task token
// (bulk-await-shard, lambda:invoke.waitForTaskToken, one slot per run under
// jobs/<id>/bulk-tasks/), completed by whoever ends the job or by bulk-await-shard itself; the
// state machine polls nothing. The state holds the listing once and a word per shard: the
// listing itself goes to bulk/<bulk_id>/shards.json.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Validations } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as s3 from 'aws-cdk-lib/aws-s3';
import * as sfn from 'aws-cdk-lib/aws-stepfunctions';
import { Construct } from 'constructs';
import { repoRoot } from './config';
import { allow } from './identities';

export const ASL_FILE = path.join('lambdas', 'asl', 'bulk-workflow.asl.json');

export interface WorkflowProps {
  readonly jobsBucket: s3.IBucket;
  readonly listShards: lambda.IFunction;
  readonly awaitShard: lambda.IFunction;
  /** bulk-await-shard's role: it completes the tasks of this state machine. */
  readonly awaitShardRole: iam.Role;
  readonly aggregate: lambda.IFunction;
}

/** The placeholders of the ASL file and what fills them. */
export function aslSubstitutions(p: WorkflowProps): Record<string, string> {
  return {
    BulkListShardsFunctionArn: p.listShards.functionArn,
    BulkAwaitShardFunctionArn: p.awaitShard.functionArn,
    BulkAggregateFunctionArn: p.aggregate.functionArn,
    JobsBucketName: p.jobsBucket.bucketName,
  };
}

export function readAsl(): string {
  return fs.readFileSync(path.join(repoRoot(), ASL_FILE), 'utf8');
}

export class BulkWorkflow extends Construct {
  readonly stateMachine: sfn.StateMachine;

  constructor(scope: Construct, id: string, props: WorkflowProps) {
    super(scope, id);
    const role = new iam.Role(this, 'Role', {
      assumedBy: new iam.ServicePrincipal('states.amazonaws.com'),
      description: 'ephem-batch bulk workflow',
    });
    const logGroup = new logs.LogGroup(this, 'Logs', { retention: logs.RetentionDays.THREE_MONTHS });

    this.stateMachine = new sfn.StateMachine(this, 'StateMachine', {
      stateMachineType: sfn.StateMachineType.STANDARD,
      // Inline (not an S3 asset), so the deployed template shows and lint-checks the definition.
      definitionBody: sfn.DefinitionBody.fromString(readAsl()),
      definitionSubstitutions: aslSubstitutions(props),
      role,
      logs: { destination: logGroup, level: sfn.LogLevel.ALL, includeExecutionData: false },
      tracingEnabled: true,
    });

    // The calls the definition makes, and nothing else.
    allow(role, 'InvokeBulkSteps', ['lambda:InvokeFunction'], [
      props.listShards.functionArn,
      props.awaitShard.functionArn,
      props.aggregate.functionArn,
    ]);
    // bulk-await-shard completes a shard's task itself when the job ended before the token was
    // written. A separate policy: the state machine names the function, which depends on its
    // role's default policy, so that policy cannot name the state machine without a dependency
    // cycle; this one names it exactly, and nothing depends on it.
    new iam.Policy(this, 'AwaitShardTaskPolicy', {
      roles: [props.awaitShardRole],
      statements: [
        new iam.PolicyStatement({
          sid: 'CompleteBulkTasks',
          actions: ['states:SendTaskSuccess', 'states:SendTaskFailure'],
          resources: [this.stateMachine.stateMachineArn],
        }),
      ],
    });
    // CDK adds the log-delivery and X-Ray statements that these two options require.
    Validations.of(role).acknowledge({
      id: 'AwsSolutions-IAM5[Resource::*]',
      reason:
        'Added by CDK for logging (logs:CreateLogDelivery and related calls) and X-Ray tracing (xray:PutTraceSegments and related); ' +
        'AWS documents these actions as supporting no resource-level permissions.',
    });
    // The ${...} in the definition are DefinitionSubstitutions, not CloudFormation Fn::Sub:
    // tell CDK's template validation and cfn-lint (rule E1029) so, for this resource only.
    Validations.of(this.stateMachine).acknowledge({
      id: 'CloudFormation-Validate::E1029',
      reason: 'The ${...} placeholders of the shared ASL file are filled by DefinitionSubstitutions, as intended.',
    });
    (this.stateMachine.node.defaultChild as sfn.CfnStateMachine).addMetadata('cfn-lint', { config: { ignore_checks: ['E1029'] } });
  }
}
