// Where each Rust Lambda's code comes from: the `bootstrap.zip` that scripts/build-lambdas.sh
// writes to target/lambda/<name>/ (cargo-lambda with `--compiler cargo`: a native x86_64 build,
// no Zig; or plain cargo and zip). Synth never builds anything, needs no Docker and no network.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Stack } from 'aws-cdk-lib';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct } from 'constructs';

/** The Lambda binaries of crate `lambdas/` (one `[[bin]]` each). */
export const LAMBDA_NAMES = [
  'on-upload',
  'ledger-append',
  'bulk-list-shards',
  'bulk-await-shard',
  'bulk-aggregate',
  'job-dead-letter',
] as const;
export type LambdaName = (typeof LAMBDA_NAMES)[number];

export const LAMBDA_BUILD_COMMAND = 'scripts/build-lambdas.sh';

/** Placeholder code used only when the stack is synthesized with bundling skipped (tests). */
const PLACEHOLDER_DIR = path.join(__dirname, '..', '..', 'assets', 'lambda-placeholder');
const PLACEHOLDER_DIR_SRC = path.join(__dirname, '..', 'assets', 'lambda-placeholder');

export function lambdaZipPath(assetsDir: string, name: LambdaName): string {
  return path.join(assetsDir, name, 'bootstrap.zip');
}

/**
 * The code asset of Lambda `name`. A missing zip fails the synth with the command to run,
 * except when asset bundling is switched off for this stack
 * (`new App({context: {'aws:cdk:bundling-stacks': []}})`, as the tests do): then a
 * placeholder directory stands in, since nothing will be deployed.
 */
export function lambdaCode(scope: Construct, assetsDir: string, name: LambdaName): lambda.Code {
  const zip = lambdaZipPath(assetsDir, name);
  if (fs.existsSync(zip)) {
    return lambda.Code.fromAsset(zip);
  }
  if (!Stack.of(scope).bundlingRequired) {
    const dir = fs.existsSync(PLACEHOLDER_DIR) ? PLACEHOLDER_DIR : PLACEHOLDER_DIR_SRC;
    return lambda.Code.fromAsset(dir);
  }
  throw new Error(
    `Lambda '${name}': ${zip} does not exist. Build the Lambda zips first, from the repository root:\n` +
      `    ${LAMBDA_BUILD_COMMAND}\n` +
      `(or point -c lambdaAssetsDir=<dir> at a directory holding <name>/bootstrap.zip for: ${LAMBDA_NAMES.join(', ')}).`,
  );
}
