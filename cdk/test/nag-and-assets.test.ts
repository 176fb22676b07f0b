// cdk-nag (AwsSolutions) finds nothing unacknowledged, every acknowledgement says why, and
// a real synth without the Lambda zips fails with the command to run.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { Validations } from 'aws-cdk-lib';
import { AwsSolutionsChecks } from 'cdk-nag';
import { buildApp } from '../lib/app';
import { LAMBDA_BUILD_COMMAND, LAMBDA_NAMES } from '../lib/lambda-code';
import { TEST_AMI, TEST_PCR0, defaultStack } from './helpers';

describe('cdk-nag AwsSolutions', () => {
  const { app } = defaultStack();

  it('reports no unacknowledged finding', () => {
    const report = new AwsSolutionsChecks(app).validateScope(app);
    const findings = report.violations.map((v) => `${v.ruleName}: ${v.violatingResources.map((r) => r.constructPath).join(', ')}`);
    assert.deepEqual(findings, []);
  });

  it('every acknowledgement carries a reason of substance', () => {
    let count = 0;
    for (const c of app.node.findAll()) {
      for (const entry of c.node.metadata) {
        if (entry.type !== Validations.ACKNOWLEDGED_RULES_METADATA_KEY) continue;
        for (const [id, reason] of Object.entries(entry.data as Record<string, unknown>)) {
          count++;
          assert.ok(String(reason).length >= 40, `${c.node.path} ${id}: reason too short: ${String(reason)}`);
        }
      }
    }
    assert.ok(count > 0);
  });

  it('runs as part of every synth (a finding fails the synth)', () => {
    const { app: other, stack } = buildApp({ pcr0: TEST_PCR0, hostAmi: TEST_AMI, 'aws:cdk:bundling-stacks': [] });
    // An unjustified wildcard grant, as a careless change might add.
    const { PolicyStatement } = require('aws-cdk-lib/aws-iam');
    stack.identities.bulkAggregateRole.addToPrincipalPolicy(new PolicyStatement({ actions: ['s3:GetObject'], resources: ['arn:aws:s3:::elsewhere/*'] }));
    let report = '';
    assert.throws(
      () => other.synth(),
      (e: Error) => {
        const file = /found in: (\S+validation-report\.json)/.exec(e.message)?.[1];
        report = file ? fs.readFileSync(file, 'utf8') : '';
        return /Validation failed/.test(e.message);
      },
    );
    assert.match(report, /AwsSolutions-IAM5\[Resource::arn:aws:s3:::elsewhere\/\*\]/);
  });
});

describe('Lambda code', () => {
  it('a synth that must bundle fails without the zips, naming the build command', () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-no-zips-'));
    assert.throws(
      () => buildApp({ pcr0: TEST_PCR0, hostAmi: TEST_AMI, lambdaAssetsDir: empty }),
      (e: Error) => e.message.includes(LAMBDA_BUILD_COMMAND) && e.message.includes('bootstrap.zip'),
    );
  });

  it('takes <dir>/<name>/bootstrap.zip for each function when present', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-zips-'));
    for (const name of LAMBDA_NAMES) {
      fs.mkdirSync(path.join(dir, name));
      fs.writeFileSync(path.join(dir, name, 'bootstrap.zip'), `not really a zip: ${name}`);
    }
    const { app } = buildApp({ pcr0: TEST_PCR0, hostAmi: TEST_AMI, lambdaAssetsDir: dir }, fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-out-')));
    const assembly = app.synth();
    const assets = JSON.parse(fs.readFileSync(path.join(assembly.directory, 'EphemBatch.assets.json'), 'utf8'));
    const zips = Object.values(assets.files as Record<string, any>).filter((f) => String(f.source.path).endsWith('.zip'));
    assert.equal(zips.length, LAMBDA_NAMES.length);
  });
});
