// The app is a thin shell over the EphemBatch construct, the way CDK users consume constructs:
// the package exports it, a user puts it in a stack of their own (an existing VPC, their
// settings), and the app's stack keeps every logical id it had before the construct existed.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { App, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import { AwsSolutionsChecks } from 'cdk-nag';
import { FEATURE_FLAGS } from '../lib/app';
import { repoRoot } from '../lib/config';
import { EphemBatch, EphemBatchProps } from '../lib/index';
import { CfnTemplate, TEST_AMI, TEST_PCR0, TEST_PCR8, defaultStack, referencedId, resourcesOfType } from './helpers';

const SNAPSHOT = path.join(repoRoot(), 'cdk', 'test', 'snapshots', 'logical-ids.json');
const measurements = { pcr0: TEST_PCR0, pcr8: TEST_PCR8, source: 'test' };

/** A user's own stack with a VPC of theirs, and EphemBatch in it. */
function userStack(props: Partial<EphemBatchProps> = {}, env = { account: '111122223333', region: 'eu-west-1' }) {
  const app = new App({ context: { ...FEATURE_FLAGS, 'aws:cdk:bundling-stacks': [] } });
  const stack = new Stack(app, 'Platform', { env });
  const vpc = new ec2.Vpc(stack, 'Shared', {
    maxAzs: 2,
    natGateways: 0,
    subnetConfiguration: [{ name: 'workloads', subnetType: ec2.SubnetType.PRIVATE_ISOLATED, cidrMask: 24 }],
  });
  const batch = new EphemBatch(stack, 'Embeddings', { measurements, hostImage: { kind: 'ami', imageId: TEST_AMI }, vpc, imagePublisherKey: 'ab'.repeat(32), ...props });
  const json = Template.fromStack(stack).toJSON() as CfnTemplate;
  return { app, stack, vpc, batch, json };
}

describe('the EphemBatch construct', () => {
  it('is what the package exports (package.json main and types)', () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(repoRoot(), 'cdk', 'package.json'), 'utf8'));
    assert.equal(pkg.main, 'dist/lib/index.js');
    assert.equal(pkg.types, 'dist/lib/index.d.ts');
    const exported = require(path.join(repoRoot(), 'cdk', pkg.main));
    assert.equal(exported.EphemBatch, EphemBatch);
    assert.ok(fs.existsSync(path.join(repoRoot(), 'cdk', pkg.types)), 'declarations are emitted');
  });

  it('the app\'s stack only instantiates it, and every logical id stays what it was (a new KMS key id would be a new key)', () => {
    const { stack, json } = defaultStack();
    assert.deepEqual(stack.node.children.filter((c) => c instanceof EphemBatch).map((c) => c.node.id), ['Default']);
    const ids = { resources: Object.keys(json.Resources).sort(), outputs: Object.keys(json.Outputs ?? {}).sort() };
    if (process.env.EPHEM_UPDATE_SNAPSHOTS === '1') fs.writeFileSync(SNAPSHOT, JSON.stringify(ids, null, 2) + '\n');
    assert.deepEqual(ids, JSON.parse(fs.readFileSync(SNAPSHOT, 'utf8')), 'a logical id changed: CloudFormation would replace that resource');
    // Nor do the Name tags (a new one on the launch template is a new version, a fleet roll).
    assert.ok(!JSON.stringify(json.Resources).includes('/Default/'), 'a Name tag names the construct\'s Default id');
  });

  it('runs in a user\'s own stack and existing VPC: hosts in its subnets, the endpoints added to it, no VPC of its own', () => {
    const { stack, vpc, json } = userStack();
    const vpcId = stack.getLogicalId(vpc.node.defaultChild as ec2.CfnVPC);
    assert.deepEqual(resourcesOfType(json, 'AWS::EC2::VPC').map(([id]) => id), [vpcId]);
    assert.equal(resourcesOfType(json, 'AWS::EC2::FlowLog').length, 0, 'the user\'s VPC, the user\'s flow logs');
    const [[, asg]] = resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup');
    const subnetIds = vpc.isolatedSubnets.map((s) => stack.getLogicalId(s.node.defaultChild as ec2.CfnSubnet)).sort();
    assert.deepEqual((asg.Properties?.VPCZoneIdentifier as unknown[]).map(referencedId).sort(), subnetIds);
    const endpoints = resourcesOfType(json, 'AWS::EC2::VPCEndpoint');
    assert.equal(endpoints.length, 6, 'S3 gateway + 5 interface endpoints (sqs, kms, states, logs, autoscaling; Session Manager\'s are opt-in)');
    for (const [id, e] of endpoints) assert.equal(referencedId(e.Properties?.VpcId), vpcId, id);
    assert.equal(resourcesOfType(json, 'AWS::KMS::Key').length, 3);
    assert.ok(json.Outputs && Object.keys(json.Outputs).some((o) => o.startsWith('EmbeddingsJobsBucketName')), 'the outputs the client reads');
  });

  it('takes the settings as props, checked as their -c counterparts', () => {
    const { json } = userStack({ instanceType: 'c6i.2xlarge', enclaveCpuCount: 4, enclaveMemoryMib: 8192, ledgerLockMode: 'compliance', ledgerRetentionDays: 400, alarmEmail: 'ops@example.com', maxHosts: 9 });
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    assert.equal(lt.Properties?.LaunchTemplateData?.InstanceType, 'c6i.2xlarge');
    assert.match(JSON.stringify(lt.Properties?.LaunchTemplateData?.UserData), /--cpu-count 4 --memory 8192/);
    const [[, ledger]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([, b]) => b.Properties?.ObjectLockEnabled);
    assert.deepEqual(ledger.Properties?.ObjectLockConfiguration?.Rule?.DefaultRetention, { Mode: 'COMPLIANCE', Days: 400 });
    assert.equal(resourcesOfType(json, 'AWS::SNS::Subscription').length, 1);
    assert.equal(resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup')[0][1].Properties?.MaxSize, '9');
    assert.throws(() => userStack({ enclaveCpuCount: 3 }), /even/);
    assert.throws(() => userStack({ minHosts: 5, maxHosts: 2 }), /maxHosts/);
  });

  it('in an existing VPC that has its endpoints already, adds none when told (vpcEndpoints: false)', () => {
    const { json } = userStack({ vpcEndpoints: false });
    assert.equal(resourcesOfType(json, 'AWS::EC2::VPCEndpoint').length, 0);
  });

  it('pins the AMI by a lookup in the stack\'s own environment when none is given', () => {
    const { app } = userStack({ hostImage: undefined }, { account: '444455556666', region: 'ap-southeast-4' });
    const missing = (app.synth().manifest.missing ?? []).filter((m) => m.provider === 'ssm');
    assert.deepEqual(missing.map((m) => [(m.props as any).account, (m.props as any).region, m.provider]), [['444455556666', 'ap-southeast-4', 'ssm']]);
  });

  it('passes cdk-nag AwsSolutions for everything it creates in a user\'s stack', () => {
    const { app, batch } = userStack();
    const report = new AwsSolutionsChecks(app).validateScope(app);
    const ours = report.violations
      .map((v) => ({ rule: v.ruleName, paths: v.violatingResources.map((r) => r.constructPath).filter((p) => p?.startsWith(`${batch.node.path}/`)) }))
      .filter((v) => v.paths.length > 0);
    assert.deepEqual(ours, []);
  });
});
