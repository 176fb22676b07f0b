// Builds the CDK app: feature flags, configuration from context, the stack, and the
// cdk-nag AwsSolutions checks, which fail the synth on any unacknowledged finding.
import { App, Validations } from 'aws-cdk-lib';
import { AwsSolutionsChecks } from 'cdk-nag';
import { CliEnvironment, loadConfig } from './config';
import { EphemBatchStack } from './ephem-batch-stack';

/** Feature flags this app relies on (set here so that tests and `cdk` behave the same). */
export const FEATURE_FLAGS: Record<string, unknown> = {
  // Server access logs are delivered under a bucket policy, not ACLs.
  '@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy': true,
};

export const DEFAULT_STACK_NAME = 'EphemBatch';

export interface BuiltApp {
  readonly app: App;
  readonly stack: EphemBatchStack;
}

/**
 * @param context extra context (tests pass measurements and `aws:cdk:bundling-stacks`);
 *   `cdk -c key=value` values reach the App through the CLI as usual.
 * @param outdir where to write the cloud assembly (default: what the CLI says, or a temporary directory).
 * @param cliEnv the CDK CLI's CDK_DEFAULT_ACCOUNT and CDK_DEFAULT_REGION (default: this process's environment).
 */
export function buildApp(context: Record<string, unknown> = {}, outdir?: string, cliEnv: CliEnvironment = process.env): BuiltApp {
  const app = new App({ context: { ...FEATURE_FLAGS, ...context }, outdir });
  const config = loadConfig((key) => app.node.tryGetContext(key), cliEnv);
  const stackName = String(app.node.tryGetContext('stackName') ?? DEFAULT_STACK_NAME);
  const stack = new EphemBatchStack(app, stackName, { config });
  Validations.of(app).addPlugins(new AwsSolutionsChecks(app, { verbose: true }));
  return { app, stack };
}
