// The security and wiring properties of the synthesized template (issue "Done when" and more).
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { spawnSync } from 'node:child_process';
import { Match } from 'aws-cdk-lib/assertions';
import { repoRoot } from '../lib/config';
import { DRAIN_TIMEOUT_S, JOURNAL_EXPORT_FILE, LAUNCH_TIMEOUT_S, POLLER_MEMORY_MAX, SHIPPED_UNITS } from '../lib/host-user-data';
import { buildApp } from '../lib/app';
import { ContextProvider } from 'aws-cdk-lib';
import * as cxschema from 'aws-cdk-lib/cloud-assembly-schema';
import { LAMBDA_NAMES } from '../lib/lambda-code';
import { LEDGER_METRICS, METRICS_NAMESPACE } from '../lib/observability';
import { ASL_FILE, readAsl } from '../lib/workflow';
import { CfnTemplate, TEST_AMI, TEST_PCR0, TEST_PCR8, asArray, defaultStack, identityStatements, referencedId, resourcesOfType, synth } from './helpers';

const { template, json, stack } = defaultStack();
const resolve = (v: unknown) => JSON.stringify(stack.resolve(v));

/** The host's boot script, with the CloudFormation values in it rendered as <region>, <Ref> or <GetAtt>. */
function userDataScript(t: CfnTemplate = json): string {
  const [[, lt]] = resourcesOfType(t, 'AWS::EC2::LaunchTemplate');
  const parts = lt.Properties?.LaunchTemplateData?.UserData['Fn::Base64']['Fn::Join'][1] as unknown[];
  const render = (part: any): string => {
    if (typeof part === 'string') return part;
    if (part?.Ref === 'AWS::Region') return '<region>';
    if (typeof part?.Ref === 'string') return `<Ref:${part.Ref}>`;
    if (Array.isArray(part?.['Fn::GetAtt'])) return `<GetAtt:${part['Fn::GetAtt'].join('.')}>`;
    return JSON.stringify(part);
  };
  return parts.map(render).join('');
}

describe('fleet', () => {
  it('launch template has Nitro Enclaves on, IMDSv2 only, encrypted root volume', () => {
    template.hasResourceProperties('AWS::EC2::LaunchTemplate', {
      LaunchTemplateData: Match.objectLike({
        EnclaveOptions: { Enabled: true },
        MetadataOptions: Match.objectLike({ HttpTokens: 'required', InstanceMetadataTags: 'enabled' }),
        InstanceType: 'm6i.xlarge',
        BlockDeviceMappings: [Match.objectLike({ Ebs: Match.objectLike({ Encrypted: true }) })],
      }),
    });
  });

  it('the Auto Scaling group uses that launch template', () => {
    const [[ltId]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const [[, asg]] = resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup');
    assert.equal(referencedId(asg.Properties?.LaunchTemplate?.LaunchTemplateId), ltId);
    assert.equal(asg.Properties?.MinSize, '1');
    assert.equal(asg.Properties?.MaxSize, '4');
  });

  it('user data fetches the artifacts, checks their SHA-256 and PCR0, runs the enclave (not in debug mode) and the poller under systemd', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const userData = JSON.stringify(lt.Properties?.LaunchTemplateData?.UserData);
    const { enclaveEif, hostPoller } = stack.fleet.artifacts;
    for (const needle of [
      'dnf install -y aws-nitro-enclaves-cli',
      `/${enclaveEif.asset.s3ObjectKey} /opt/ephem-batch/enclave.eif`,
      `check_sha256 /opt/ephem-batch/enclave.eif ${enclaveEif.sha256}`,
      `/${hostPoller.asset.s3ObjectKey} /opt/ephem-batch/host-poller`,
      `check_sha256 /opt/ephem-batch/host-poller ${hostPoller.sha256}`,
      `expected_pcr0=${TEST_PCR0}`,
      'nitro-cli describe-eif',
      'nitro-cli run-enclave',
      'ephem-host-poller.service',
      'systemctl enable --now ephem-kms-proxy.service ephem-enclave.service ephem-host-poller.service ephem-drain.service ephem-enclave-watchdog.timer',
      // The enclave's own TLS to KMS goes through this relay (vsock port 8000, the worker's default).
      '/usr/bin/vsock-proxy 8000 kms.',
      '.amazonaws.com 443 --config /etc/nitro_enclaves/vsock-proxy.yaml',
    ]) {
      assert.ok(userData.includes(needle), `user data contains ${needle}`);
    }
    assert.ok(!userData.includes('--debug-mode'));
    // Variables nothing reads are not written.
    for (const unused of ['EPHEM_METRICS_NAMESPACE', 'EPHEM_LIFECYCLE_HOOK']) assert.ok(!userData.includes(unused), unused);
  });

  it('the poller is given its image\'s fleet key, under which its enclave creates the epochs (EPHEM_FLEET_KEY_ARN)', () => {
    const env = /host-poller\.env <<EOF\n([\s\S]*?)\nEOF\n/.exec(userDataScript())?.[1] ?? '';
    const [[fleetKeyId]] = resourcesOfType(json, 'AWS::KMS::Key').filter(([, k]) => String(k.Properties?.Description).startsWith('ephem-batch fleet key'));
    assert.match(env, new RegExp(`^EPHEM_FLEET_KEY_ARN=<GetAtt:${fleetKeyId}\\.Arn>$`, 'm'));
    assert.deepEqual(json.Outputs?.FleetKeyArn?.Value, { 'Fn::GetAtt': [fleetKeyId, 'Arn'] }, 'the key clients pin');
  });

  it('vsock-proxy may reach exactly this Region\'s KMS on 443, and a dead enclave is restarted', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const parts = stack.resolve(lt.Properties?.LaunchTemplateData?.UserData)['Fn::Base64']['Fn::Join'][1] as unknown[];
    // The Region is a token (the stack is environment-agnostic): render it as a placeholder.
    const script = parts.map((part) => (typeof part === 'string' ? part : '<region>')).join('');
    const allowlist = /vsock-proxy\.yaml <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1];
    assert.equal(allowlist, 'allowlist:\n- {address: kms.<region>.amazonaws.com, port: 443}');
    const watchdog = /ephem-enclave-watchdog\.service <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    assert.ok(watchdog.includes('ExecStart=/opt/ephem-batch/enclave-watchdog'), watchdog);
    const dog = /enclave-watchdog <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    assert.ok(dog.includes('nitro-cli describe-enclaves | grep -q RUNNING && exit 0'), dog);
    // Each restart is counted before it happens: the health watcher reads the count.
    const [count, restart] = [dog.indexOf('>>/var/lib/ephem-batch-health/enclave-restarts'), dog.indexOf('exec systemctl restart ephem-enclave.service')];
    assert.ok(count > 0 && restart > count, dog);
    assert.match(/ephem-enclave-watchdog\.timer <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '', /OnUnitActiveSec=30/);
  });

  it('the poller runs under a memory ceiling and is restarted whatever ends it', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const script = (stack.resolve(lt.Properties?.LaunchTemplateData?.UserData)['Fn::Base64']['Fn::Join'][1] as unknown[])
      .filter((part): part is string => typeof part === 'string')
      .join('');
    const unit = /ephem-host-poller\.service <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1];
    assert.ok(unit, 'the poller unit is written');
    const lines = unit.split('\n');
    assert.equal(POLLER_MEMORY_MAX, '512M');
    assert.deepEqual(lines.filter((l) => /^(MemoryMax|Restart)=/.test(l)), ['Restart=always', 'MemoryMax=512M']);
    // The ceiling is far above the measured ~17 MB peak (docs/soak.md) and below the host's memory.
    const bytes = Number(/^MemoryMax=(\d+)M$/m.exec(unit)?.[1]) * 2 ** 20;
    assert.ok(bytes >= 256 * 2 ** 20 && bytes <= 2 ** 30, `MemoryMax ${bytes} bytes`);
  });

  it('a drain watcher stops the poller and completes the hook before the hook times out', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const userData = JSON.stringify(lt.Properties?.LaunchTemplateData?.UserData);
    for (const needle of [
      'imds autoscaling/target-lifecycle-state',
      'X-aws-ec2-metadata-token',
      'systemctl stop ephem-host-poller.service',
      'systemctl kill --signal=SIGTERM ephem-host-poller.service',
      'aws autoscaling complete-lifecycle-action --lifecycle-hook-name ephem-drain --lifecycle-action-result CONTINUE',
      'tags/instance/aws:autoscaling:groupName',
      'ExecStart=/opt/ephem-batch/drain-watch',
    ]) {
      assert.ok(userData.includes(needle), `user data contains ${needle}`);
    }
    const seconds = (re: RegExp) => Number(re.exec(userData)?.[1]);
    const finish = seconds(/timeout (\d+) systemctl stop/);
    const stop = seconds(/TimeoutStopSec=(\d+)/);
    assert.ok(finish > 0 && finish < stop && stop < DRAIN_TIMEOUT_S, `finish ${finish} < TimeoutStopSec ${stop} < hook ${DRAIN_TIMEOUT_S}`);
  });

  it('a new host is held on a launch hook and abandoned (replaced) unless its enclave attests within 15 minutes', () => {
    const [[asgId]] = resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup');
    const launch = resourcesOfType(json, 'AWS::AutoScaling::LifecycleHook').filter(
      ([, h]) => h.Properties?.LifecycleTransition === 'autoscaling:EC2_INSTANCE_LAUNCHING',
    );
    assert.equal(launch.length, 1);
    const [[, hook]] = launch;
    assert.deepEqual(
      { ...hook.Properties, AutoScalingGroupName: referencedId(hook.Properties?.AutoScalingGroupName) },
      { AutoScalingGroupName: asgId, LifecycleHookName: 'ephem-launch', LifecycleTransition: 'autoscaling:EC2_INSTANCE_LAUNCHING', DefaultResult: 'ABANDON', HeartbeatTimeout: LAUNCH_TIMEOUT_S },
    );
    assert.equal(LAUNCH_TIMEOUT_S, 900);
  });

  it('the host completes the launch hook (CONTINUE) only once its enclave\'s attestation is published under its instance id', () => {
    const script = userDataScript();
    // The poller names its current document by the instance id, which no later host reuses.
    assert.match(script, /\ninstance_id=\$\(imds instance-id\)\n/);
    assert.match(/host-poller\.env <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '', /^EPHEM_HOST_ID=\$\{instance_id\}$/m);
    const watcher = /launch-ready <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(script)?.[1];
    assert.ok(watcher, 'the launch watcher is written (quoted heredoc)');
    const wait = watcher.indexOf('until aws s3api head-object --bucket "$EPHEM_ATTESTATIONS_BUCKET" --key "$key"');
    const complete = watcher.indexOf('aws autoscaling complete-lifecycle-action --lifecycle-hook-name ephem-launch --lifecycle-action-result CONTINUE');
    assert.ok(wait > 0 && complete > wait, 'it completes the hook only after the wait for the document');
    assert.ok(watcher.includes('key="attestations/current/${instance}.cbor"'), watcher);
    assert.ok(watcher.includes('--instance-id "$instance" --auto-scaling-group-name "$(imds tags/instance/aws:autoscaling:groupName)"'));
    assert.ok(!/ABANDON/.test(watcher), 'abandoning is the hook\'s default, never the host\'s call');
    // Where the poller publishes it (cloud::layout), so the watcher waits for the right object.
    const layout = fs.readFileSync(path.join(repoRoot(), 'cloud', 'src', 'layout.rs'), 'utf8');
    assert.ok(layout.includes('format!("attestations/current/{host_id}.cbor")'), 'cloud::layout::attestation_current');
    const unit = /ephem-launch-ready\.service <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    assert.ok(unit.includes('EnvironmentFile=/etc/ephem-batch/host-poller.env') && unit.includes('ExecStart=/opt/ephem-batch/launch-ready'), unit);
    assert.ok(unit.includes('Type=simple'), 'a simple unit: starting it does not block the boot script');
    assert.match(script, /\nsystemctl start ephem-launch-ready\.service\n?$/);
  });

  it('hosts ship the journal of their units (JSON lines) and the boot log to a log group kept 3 months, from the start of the boot', () => {
    const groups = resourcesOfType(json, 'AWS::Logs::LogGroup').filter(([id]) => id.startsWith('FleetHostLogs'));
    assert.equal(groups.length, 1);
    const [[groupId, group]] = groups;
    assert.equal(group.Properties?.RetentionInDays, 90);
    const script = userDataScript();
    assert.match(script, /\ndnf install -y aws-nitro-enclaves-cli jq amazon-cloudwatch-agent logrotate\n/);
    const config = JSON.parse(/ephem-batch\.json <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? 'null');
    const shipped = config.logs.logs_collected.files.collect_list.map((f: any) => [f.file_path, f.log_group_name, f.log_stream_name]);
    assert.deepEqual(shipped, [
      [JOURNAL_EXPORT_FILE, `<Ref:${groupId}>`, '{instance_id}/journal'],
      ['/var/log/cloud-init-output.log', `<Ref:${groupId}>`, '{instance_id}/boot'],
      ['/var/log/nitro_enclaves/nitro_enclaves.log', `<Ref:${groupId}>`, '{instance_id}/nitro-cli'],
    ]);
    assert.equal(config.metrics, undefined, 'the agent publishes no metrics');
    const exportUnit = /ephem-journal-export\.service <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    const follow = /^ExecStart=\/bin\/sh -c 'exec (journalctl [^']*) >> (\S+)'$/m.exec(exportUnit);
    assert.ok(follow, exportUnit);
    assert.equal(follow[2], JOURNAL_EXPORT_FILE);
    for (const flag of ['--follow', '--no-tail', '--output=json', '--cursor-file=/var/lib/ephem-journal-export/cursor']) assert.ok(follow[1].split(' ').includes(flag), flag);
    const units = [...follow[1].matchAll(/-u (\S+)/g)].map((m) => m[1]);
    assert.deepEqual(units, SHIPPED_UNITS);
    for (const unit of ['ephem-host-poller.service', 'ephem-enclave.service', 'ephem-launch-ready.service']) assert.ok(units.includes(unit), unit);
    // Every unit the boot script writes is shipped.
    const written = [...script.matchAll(/cat > \/etc\/systemd\/system\/(ephem-[\w-]+\.service) <</g)].map((m) => m[1]).filter((u) => u !== 'ephem-journal-export.service');
    for (const unit of written) assert.ok(units.includes(unit), `${unit} is not shipped`);
    assert.match(/\/etc\/logrotate\.d\/ephem-batch <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '', /copytruncate/);
    // The poller writes JSON, and the agent runs before the boot waits for anything.
    assert.match(/host-poller\.env <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '', /^EPHEM_LOG_FORMAT=json$/m);
    const agent = script.indexOf('amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:/opt/aws/amazon-cloudwatch-agent/etc/ephem-batch.json');
    assert.ok(agent > 0 && agent < script.indexOf('fetch s3://'), 'logs are shipped before the artifacts are awaited');
  });

  it('Session Manager is opt-in (its three endpoints cost while idle): none by default', () => {
    const services = resourcesOfType(json, 'AWS::EC2::VPCEndpoint').map(([, r]) => resolve(r.Properties?.ServiceName));
    for (const s of ['.ssm"', '.ssmmessages"', '.ec2messages"']) assert.ok(!services.some((x) => x.includes(s)), `${s} endpoint by default`);
    const [[, hostRole]] = resourcesOfType(json, 'AWS::IAM::Role').filter(([id]) => id.startsWith('IdentitiesHostRole'));
    assert.equal(hostRole.Properties?.ManagedPolicyArns, undefined);
  });

  it('with -c sessionManager=true operators reach hosts through Session Manager: SSM endpoints and AmazonSSMManagedInstanceCore, nothing inbound', () => {
    const { json, stack } = synth({ pcr8: TEST_PCR8, sessionManager: 'true' });
    const resolve = (v: unknown) => JSON.stringify(stack.resolve(v));
    const services = resourcesOfType(json, 'AWS::EC2::VPCEndpoint').map(([, r]) => resolve(r.Properties?.ServiceName));
    for (const s of ['.ssm', '.ssmmessages', '.ec2messages']) {
      const [endpoint] = resourcesOfType(json, 'AWS::EC2::VPCEndpoint').filter(([, r]) => resolve(r.Properties?.ServiceName).includes(`${s}"`));
      assert.ok(endpoint, `endpoint for ${s}: ${services.join(' ')}`);
      assert.equal(endpoint[1].Properties?.PrivateDnsEnabled, true);
      assert.equal(endpoint[1].Properties?.VpcEndpointType, 'Interface');
    }
    const [[, hostRole]] = resourcesOfType(json, 'AWS::IAM::Role').filter(([id]) => id.startsWith('IdentitiesHostRole'));
    assert.deepEqual(stack.resolve(hostRole.Properties?.ManagedPolicyArns), [
      { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':iam::aws:policy/AmazonSSMManagedInstanceCore']] },
    ]);
  });

  it('the hosts\' AMI is pinned: -c hostAmi, a literal id, never resolved again at deploy', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    assert.equal(lt.Properties?.LaunchTemplateData?.ImageId, TEST_AMI);
    for (const [name, p] of Object.entries<any>(json.Parameters ?? {})) assert.ok(!String(p.Type).includes('AWS::EC2::Image::Id'), `parameter ${name} is resolved at each deploy`);
    assert.ok(!JSON.stringify(json).includes('/aws/service/ami-amazon-linux-latest/'), 'no AMI parameter is named anywhere');
  });

  it('without -c hostAmi, the Region\'s newest Amazon Linux 2023 is looked up once and kept in context; a rule refuses other Regions', () => {
    const cliEnv = { CDK_DEFAULT_ACCOUNT: '123456789012', CDK_DEFAULT_REGION: 'eu-central-2' };
    const parameterName = '/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.1-x86_64';
    const props = { account: cliEnv.CDK_DEFAULT_ACCOUNT, region: cliEnv.CDK_DEFAULT_REGION, parameterName };
    const key = `${cxschema.ContextProvider.SSM_PARAMETER_PROVIDER}:${Object.entries(props).sort().map(([k, v]) => `${k}=${v}`).join(':')}`;
    // Not yet in context: the synth asks the CLI for it (and the CLI writes cdk.context.json).
    const first = buildApp({ pcr0: TEST_PCR0, 'aws:cdk:bundling-stacks': [] }, undefined, cliEnv);
    const missing = first.app.synth().manifest.missing ?? [];
    assert.deepEqual(missing.map((m) => [m.key, m.provider, (m.props as any).parameterName]), [[key, 'ssm', parameterName]]);
    // In context: that id, literally, whatever the parameter says today.
    const cached = buildApp({ pcr0: TEST_PCR0, 'aws:cdk:bundling-stacks': [], [key]: 'ami-0fedcba9876543210' }, undefined, cliEnv);
    const t = cached.app.synth().getStackByName(cached.stack.stackName).template;
    assert.equal(resourcesOfType(t, 'AWS::EC2::LaunchTemplate')[0][1].Properties?.LaunchTemplateData?.ImageId, 'ami-0fedcba9876543210');
    assert.deepEqual(Object.values<any>(t.Rules ?? {}).filter((r) => JSON.stringify(r).includes('eu-central-2')).map((r) => r.Assertions[0].Assert), [
      { 'Fn::Equals': [{ Ref: 'AWS::Region' }, 'eu-central-2'] },
    ]);
    assert.equal(ContextProvider.getKey(cached.stack, { provider: cxschema.ContextProvider.SSM_PARAMETER_PROVIDER, props }).key, key);
  });

  it('scales on backlog per host with target tracking on a metric-math custom metric', () => {
    template.hasResourceProperties('AWS::AutoScaling::ScalingPolicy', {
      PolicyType: 'TargetTrackingScaling',
      TargetTrackingConfiguration: {
        TargetValue: 2,
        CustomizedMetricSpecification: {
          Metrics: Match.arrayWith([
            Match.objectLike({ Id: 'waiting', MetricStat: Match.objectLike({ Metric: Match.objectLike({ MetricName: 'ApproximateNumberOfMessagesVisible' }) }) }),
            Match.objectLike({ Id: 'hosts', MetricStat: Match.objectLike({ Metric: Match.objectLike({ MetricName: 'GroupInServiceInstances' }) }) }),
            Match.objectLike({ Id: 'backlog_per_host', Expression: '(waiting + inflight) / hosts', ReturnData: true }),
          ]),
        },
      },
    });
    template.hasResourceProperties('AWS::AutoScaling::AutoScalingGroup', {
      MetricsCollection: [Match.objectLike({ Metrics: Match.arrayWith(['GroupInServiceInstances']) })],
    });
  });

  it('drains a host before termination (lifecycle hook)', () => {
    template.hasResourceProperties('AWS::AutoScaling::LifecycleHook', {
      LifecycleHookName: 'ephem-drain',
      LifecycleTransition: 'autoscaling:EC2_INSTANCE_TERMINATING',
      DefaultResult: 'CONTINUE',
      HeartbeatTimeout: DRAIN_TIMEOUT_S,
    });
  });

  it('network: private isolated subnets, no internet or NAT gateway, endpoints for every API the hosts call', () => {
    template.resourceCountIs('AWS::EC2::InternetGateway', 0);
    template.resourceCountIs('AWS::EC2::NatGateway', 0);
    const services = resourcesOfType(json, 'AWS::EC2::VPCEndpoint').map(([, r]) => resolve(r.Properties?.ServiceName));
    for (const s of ['.s3', '.sqs', '.kms', '.states', '.logs', '.autoscaling']) {
      assert.ok(services.some((x) => x.includes(`${s}"`)), `endpoint for ${s}: ${services.join(' ')}`);
    }
    template.resourceCountIs('AWS::EC2::FlowLog', 1);
  });

  it('hosts accept no inbound traffic', () => {
    const hostSgs = resourcesOfType(json, 'AWS::EC2::SecurityGroup').filter(([, r]) => String(r.Properties?.GroupDescription).startsWith('ephem-batch hosts'));
    assert.equal(hostSgs.length, 1);
    assert.equal(hostSgs[0][1].Properties?.SecurityGroupIngress, undefined);
    const ingressToHosts = resourcesOfType(json, 'AWS::EC2::SecurityGroupIngress').filter(([, r]) => referencedId(r.Properties?.GroupId) === hostSgs[0][0]);
    assert.equal(ingressToHosts.length, 0);
  });
});

describe('storage', () => {
  const buckets = resourcesOfType(json, 'AWS::S3::Bucket');

  it('the ledger bucket has Object Lock, by default in governance mode for 30 days (a trial can be removed)', () => {
    template.hasResourceProperties('AWS::S3::Bucket', {
      ObjectLockEnabled: true,
      ObjectLockConfiguration: { ObjectLockEnabled: 'Enabled', Rule: { DefaultRetention: { Mode: 'GOVERNANCE', Days: 30 } } },
      VersioningConfiguration: { Status: 'Enabled' },
    });
  });

  it('compliance mode and the retention are explicit production settings', () => {
    const other = synth({ ledgerRetentionDays: 2555, ledgerLockMode: 'compliance' });
    other.template.hasResourceProperties('AWS::S3::Bucket', {
      ObjectLockConfiguration: { ObjectLockEnabled: 'Enabled', Rule: { DefaultRetention: { Mode: 'COMPLIANCE', Days: 2555 } } },
    });
  });

  it('ledger-append reserves no concurrency unless asked (a new account\'s quota may not allow it)', () => {
    const reserved = (t: typeof json) =>
      resourcesOfType(t, 'AWS::Lambda::Function').map(([, f]) => f.Properties?.ReservedConcurrentExecutions).filter((r) => r !== undefined);
    assert.deepEqual(reserved(json), []);
    assert.deepEqual(reserved(synth({ ledgerReservedConcurrency: 1 }).json), [1]);
  });

  it('ledger-append submits checkpoints to the witnesses given, and to none by default', () => {
    const witnessEnv = (t: typeof json) =>
      resourcesOfType(t, 'AWS::Lambda::Function').map(([, f]) => f.Properties?.Environment?.Variables?.EPHEM_WITNESSES).filter((w) => w !== undefined);
    assert.deepEqual(witnessEnv(json), []);
    const witness = 'w1.example+1a2b3c4d+BPwE7Bbd3Wq1QVm5y0OZnL5JUGlmtGJd7aCgQ6oiZAeP@http://witness.example:7380';
    assert.deepEqual(witnessEnv(synth({ witnesses: `${witness},${witness.replace('w1', 'w2')}` }).json), [`${witness},${witness.replace('w1', 'w2')}`]);
  });

  it('every bucket blocks public access, is encrypted, and has a TLS-only policy', () => {
    assert.equal(buckets.length, 6);
    const policies = resourcesOfType(json, 'AWS::S3::BucketPolicy');
    for (const [id, b] of buckets) {
      assert.deepEqual(b.Properties?.PublicAccessBlockConfiguration, {
        BlockPublicAcls: true, BlockPublicPolicy: true, IgnorePublicAcls: true, RestrictPublicBuckets: true,
      }, id);
      assert.ok(b.Properties?.BucketEncryption, `${id} encrypted`);
      const policy = policies.find(([, p]) => referencedId(p.Properties?.Bucket) === id);
      assert.ok(policy, `${id} has a bucket policy`);
      const denyTls = asArray<any>(policy![1].Properties?.PolicyDocument?.Statement).find(
        (s) => s.Effect === 'Deny' && s.Condition?.Bool?.['aws:SecureTransport'] === 'false',
      );
      assert.ok(denyTls, `${id} denies non-TLS requests`);
    }
  });

  it('no bucket policy allows anything to anyone', () => {
    for (const [id, p] of resourcesOfType(json, 'AWS::S3::BucketPolicy')) {
      for (const s of asArray<any>(p.Properties?.PolicyDocument?.Statement)) {
        if (s.Effect !== 'Allow') continue;
        assert.notEqual(s.Principal, '*', id);
        assert.notDeepEqual(s.Principal, { AWS: '*' }, id);
      }
    }
  });

  it('nobody may delete ledger objects', () => {
    template.hasResourceProperties('AWS::S3::BucketPolicy', {
      PolicyDocument: {
        Statement: Match.arrayWith([
          Match.objectLike({ Sid: 'DenyLedgerDeletes', Effect: 'Deny', Action: Match.arrayWith(['s3:DeleteObject', 's3:DeleteObjectVersion']) }),
        ]),
      },
    });
  });

  it('S3 upload events reach on-upload: jobs/ + /input.sealed, and each store prefix, without overlap', () => {
    const [[, n]] = resourcesOfType(json, 'Custom::S3BucketNotifications');
    const configs = n.Properties?.NotificationConfiguration?.LambdaFunctionConfigurations as any[];
    const filters = configs.map((c) => Object.fromEntries(c.Filter.Key.FilterRules.map((r: any) => [r.Name.toLowerCase(), r.Value])));
    assert.deepEqual(filters, [
      { prefix: 'jobs/', suffix: '/input.sealed' },
      { prefix: 'stores/', suffix: '.sealed' },
    ]);
    for (const c of configs) assert.equal(c.Events[0], 's3:ObjectCreated:*');
  });

  it('everything under jobs/ expires by age; no lifecycle rule depends on a tag', () => {
    const [[, jobsBucket]] = buckets.filter(([id]) => id.startsWith('StorageJobs'));
    assert.deepEqual(jobsBucket.Properties?.LifecycleConfiguration?.Rules, [
      { Id: 'abort-incomplete-uploads', AbortIncompleteMultipartUpload: { DaysAfterInitiation: 1 }, Status: 'Enabled' },
      { Id: 'expire-jobs', Prefix: 'jobs/', ExpirationInDays: 30, Status: 'Enabled' },
    ]);
    for (const [id, b] of buckets) {
      for (const rule of asArray<any>(b.Properties?.LifecycleConfiguration?.Rules)) assert.equal(rule.TagFilters, undefined, `${id} ${rule.Id}`);
    }
  });

  it('requests for fresh attestation documents and their answers expire after a day, every version', () => {
    const [[, attestations]] = buckets.filter(([id]) => id.startsWith('StorageAttestations'));
    const rule = (prefix: string) => ({
      Id: `expire-${prefix.replace(/\/$/, '').replace(/\//g, '-')}`,
      Prefix: prefix,
      ExpirationInDays: 1,
      NoncurrentVersionExpiration: { NoncurrentDays: 1 },
      AbortIncompleteMultipartUpload: { DaysAfterInitiation: 1 },
      Status: 'Enabled',
    });
    assert.deepEqual(attestations.Properties?.LifecycleConfiguration?.Rules, [
      rule('attestations/requests/'),
      rule('attestations/fresh/'),
    ]);
    // Nothing else in the bucket expires: documents receipts name and fleet-key epochs stay.
    for (const r of attestations.Properties.LifecycleConfiguration.Rules) assert.ok(r.Prefix.length > 'attestations/'.length, r.Id);
  });

  it('versioning protects the evidence buckets (attestations, ledger, models, artifacts)', () => {
    const versioned = buckets.filter(([, b]) => b.Properties?.VersioningConfiguration?.Status === 'Enabled');
    assert.equal(versioned.length, 4);
  });
});

describe('queues', () => {
  const queues = resourcesOfType(json, 'AWS::SQS::Queue');

  it('are all encrypted and TLS-only', () => {
    assert.equal(queues.length, 5);
    for (const [id, q] of queues) {
      assert.ok(q.Properties?.SqsManagedSseEnabled === true || q.Properties?.KmsMasterKeyId, `${id} encrypted`);
    }
    for (const [id, p] of resourcesOfType(json, 'AWS::SQS::QueuePolicy')) {
      const deny = asArray<any>(p.Properties?.PolicyDocument?.Statement).find((s) => s.Effect === 'Deny' && s.Condition?.Bool?.['aws:SecureTransport'] === 'false');
      assert.ok(deny, `${id} denies non-TLS`);
    }
  });

  it('the job queue and the ledger FIFO queue each redrive to their DLQ', () => {
    const withRedrive = queues.filter(([, q]) => q.Properties?.RedrivePolicy);
    assert.equal(withRedrive.length, 2);
    for (const [id, q] of withRedrive) {
      const dlqId = referencedId(q.Properties!.RedrivePolicy.deadLetterTargetArn);
      assert.ok(dlqId && json.Resources[dlqId]?.Type === 'AWS::SQS::Queue', `${id} redrives to a queue`);
      // A poison receipt leaves the ledger's one group after three receives (seconds apart).
      assert.equal(q.Properties!.RedrivePolicy.maxReceiveCount, q.Properties?.FifoQueue ? 3 : 5);
      assert.equal(Boolean(json.Resources[dlqId!].Properties?.FifoQueue), Boolean(q.Properties?.FifoQueue), `${id} and its DLQ share FIFO-ness`);
    }
    assert.equal(withRedrive.filter(([, q]) => q.Properties?.FifoQueue).length, 1, 'the ledger queue is FIFO');
    const [[, ledger]] = withRedrive.filter(([, q]) => q.Properties?.FifoQueue);
    const [[, append]] = resourcesOfType(json, 'AWS::Lambda::Function').filter(([, f]) => f.Properties?.Description === 'ephem-batch ledger-append');
    assert.equal(append.Properties?.Timeout, 30);
    assert.equal(ledger.Properties?.VisibilityTimeout, 6 * 30, 'six times the function timeout, and no more');
  });
});

describe('lambdas', () => {
  const functions = resourcesOfType(json, 'AWS::Lambda::Function').filter(([, f]) => String(f.Properties?.Description ?? '').startsWith('ephem-batch '));

  it('the six Rust functions exist, on provided.al2023', () => {
    const names = functions.map(([, f]) => String(f.Properties?.Description).replace('ephem-batch ', '')).sort();
    assert.deepEqual(names, [...LAMBDA_NAMES].sort());
    for (const [, f] of functions) {
      assert.equal(f.Properties?.Runtime, 'provided.al2023');
      assert.equal(f.Properties?.Handler, 'bootstrap');
    }
  });

  it('ledger-append is the single writer: fed by the ledger FIFO queue (one group, one invocation at a time)', () => {
    const [[id]] = functions.filter(([, x]) => x.Properties?.Description === 'ephem-batch ledger-append');
    const [[, esm]] = resourcesOfType(json, 'AWS::Lambda::EventSourceMapping').filter(([, m]) => referencedId(m.Properties?.FunctionName) === id);
    assert.equal(referencedId(esm.Properties?.FunctionName), id);
    const queueId = referencedId(esm.Properties?.EventSourceArn)!;
    assert.equal(json.Resources[queueId].Properties?.FifoQueue, true);
    assert.deepEqual(esm.Properties?.FunctionResponseTypes, ['ReportBatchItemFailures']);
  });

  it('ledger-append may write ledger objects only conditionally (If-None-Match or If-Match)', () => {
    const puts = identityStatements(json).filter(({ statement: s }) => asArray(s.Action).includes('s3:PutObject') && JSON.stringify(s.Resource).includes('StorageLedger'));
    assert.equal(puts.length, 2);
    const conds = puts.map(({ statement: s }) => JSON.stringify(s.Condition)).sort();
    assert.deepEqual(conds, ['{"Null":{"s3:if-match":"false"}}', '{"Null":{"s3:if-none-match":"false"}}']);
  });

  it('no Lambda makes fleet-key epochs: no fleet-rotate, no schedule (the hosts\' enclaves create them)', () => {
    const names = resourcesOfType(json, 'AWS::Lambda::Function').map(([, f]) => String(f.Properties?.Description));
    assert.ok(!names.some((n) => n.includes('fleet-rotate')), names.join());
    assert.ok(!resourcesOfType(json, 'AWS::Events::Rule').some(([, r]) => r.Properties?.ScheduleExpression !== undefined), 'no scheduled rule');
  });
});

describe('IAM', () => {
  const statements = identityStatements(json);

  it('no wildcard actions anywhere', () => {
    for (const { owner, statement } of statements) {
      for (const a of asArray<string>(statement.Action)) {
        assert.ok(!a.includes('*'), `${owner} grants wildcard action ${a}`);
      }
    }
  });

  it('no statement on a data bucket uses Resource "*"', () => {
    for (const { owner, statement } of statements) {
      const actions = asArray<string>(statement.Action);
      if (actions.some((a) => a.startsWith('s3:') || a.startsWith('sqs:'))) {
        assert.ok(!asArray(statement.Resource).includes('*'), `${owner}: ${actions.join(',')} on *`);
      }
    }
  });

  it('hosts commit receipts only with If-None-Match', () => {
    const host = statements.filter(({ owner }) => owner.startsWith('IdentitiesHostRole'));
    const receipt = host.find(({ statement: s }) => s.Sid === 'CommitReceiptOnlyIfAbsent')!;
    assert.deepEqual(receipt.statement.Condition, { Null: { 's3:if-none-match': 'false' } });
  });

  it('only CDK\'s bucket-notification handler and the hosts (Session Manager) use an AWS managed policy', () => {
    for (const [id, r] of resourcesOfType(json, 'AWS::IAM::Role')) {
      if (!r.Properties?.ManagedPolicyArns) continue;
      if (id.startsWith('IdentitiesHostRole')) {
        assert.match(resolve(r.Properties.ManagedPolicyArns), /^\[\{"Fn::Join":\["",\["arn:",\{"Ref":"AWS::Partition"\},":iam::aws:policy\/AmazonSSMManagedInstanceCore"\]\]\}\]$/);
        continue;
      }
      assert.ok(id.startsWith('BucketNotificationsHandler'), id);
    }
  });
});

describe('bulk workflow', () => {
  it('the state machine\'s definition is the shared ASL file, with every placeholder substituted', () => {
    const [[, sm]] = resourcesOfType(json, 'AWS::StepFunctions::StateMachine');
    assert.equal(sm.Properties?.DefinitionString, readAsl());
    const placeholders = new Set([...readAsl().matchAll(/\$\{([A-Za-z0-9]+)\}/g)].map((m) => m[1]));
    assert.deepEqual([...placeholders].sort(), Object.keys(sm.Properties?.DefinitionSubstitutions).sort());
    assert.equal(sm.Properties?.TracingConfiguration?.Enabled, true);
    assert.equal(sm.Properties?.LoggingConfiguration?.Level, 'ALL');
  });

  it('the state machine invokes exactly the three bulk Lambdas, and calls nothing else of the deployment', () => {
    const [[smId, sm]] = resourcesOfType(json, 'AWS::StepFunctions::StateMachine');
    const subs = sm.Properties?.DefinitionSubstitutions as Record<string, unknown>;
    const functionIds = Object.fromEntries(resourcesOfType(json, 'AWS::Lambda::Function').map(([id, f]) => [id, String(f.Properties?.Description)]));
    const substituted = (name: string) => functionIds[referencedId(subs[name])!];
    assert.equal(substituted('BulkListShardsFunctionArn'), 'ephem-batch bulk-list-shards');
    assert.equal(substituted('BulkAwaitShardFunctionArn'), 'ephem-batch bulk-await-shard');
    assert.equal(substituted('BulkAggregateFunctionArn'), 'ephem-batch bulk-aggregate');

    const roleId = referencedId(sm.Properties?.RoleArn)!;
    const own = identityStatements(json).filter(({ owner }) => owner.startsWith(roleId.replace(/[0-9A-F]{8}$/, '')));
    const bySid = own.filter(({ statement: s }) => s.Sid);
    assert.deepEqual(bySid.map(({ statement: s }) => s.Sid), ['InvokeBulkSteps'], `${smId}'s role: only the invoke statement has a Sid`);
    const invoke = bySid[0].statement;
    assert.deepEqual(invoke.Action, 'lambda:InvokeFunction');
    assert.deepEqual(
      asArray(invoke.Resource).map((r) => functionIds[referencedId(r)!]).sort(),
      ['ephem-batch bulk-aggregate', 'ephem-batch bulk-await-shard', 'ephem-batch bulk-list-shards'],
    );
    // The rest is CDK's log delivery and X-Ray; no S3 polling is left.
    for (const { statement: s } of own) {
      for (const a of asArray<string>(s.Action)) assert.ok(/^(lambda:InvokeFunction|logs:|xray:)/.test(a), `${smId}'s role grants ${a}`);
    }
  });

  it('the ASL file exists where the Rust tests will look for it', () => {
    assert.ok(fs.existsSync(path.join(repoRoot(), ASL_FILE)));
  });
});

describe('observability', () => {
  it('alarms when a job ends dead-lettered or unprocessed, and when job-dead-letter cannot end one', () => {
    const alarms = new Map(resourcesOfType(json, 'AWS::CloudWatch::Alarm').map(([id, a]) => [id.replace(/[0-9A-F]{8}$/, ''), a.Properties!]));
    const on = (id: string) => {
      const a = alarms.get(`Observability${id}`);
      assert.ok(a, `alarm ${id}`);
      return { metric: a.MetricName, queue: referencedId(a.Dimensions?.[0]?.Value), threshold: a.Threshold };
    };
    const queue = (name: string) => resourcesOfType(json, 'AWS::SQS::Queue').find(([id]) => id.startsWith(`Queues${name}`))![0];
    assert.deepEqual(on('UploadsUnprocessed'), { metric: 'NumberOfMessagesSent', queue: queue('UploadFailures'), threshold: 1 });
    assert.deepEqual(on('UploadFailuresNotConsumed'), { metric: 'ApproximateAgeOfOldestMessage', queue: queue('UploadFailures'), threshold: 900 });
    assert.deepEqual(on('JobsDeadLettered'), { metric: 'NumberOfMessagesReceived', queue: queue('JobsDlq'), threshold: 1 });
    assert.ok(alarms.has('ObservabilityJobDeadLetterErrors'), 'the consumer\'s own errors');
  });

  it('every alarm notifies the alarm topic, which takes TLS only; -c alarmEmail subscribes an address', () => {
    const [[topicId]] = resourcesOfType(json, 'AWS::SNS::Topic');
    const alarms = resourcesOfType(json, 'AWS::CloudWatch::Alarm');
    assert.ok(alarms.length >= 5);
    for (const [id, a] of alarms) {
      if (id.startsWith('FleetStartFirstHostAlarm')) continue; // a scaling trigger, not news for anyone
      const actions = asArray<any>(a.Properties?.AlarmActions);
      assert.ok(actions.some((x) => x.Ref === topicId), `${id} notifies nobody`);
      // Besides the topic, only scaling actions of the fleet's own policies.
      for (const x of actions.filter((y) => y.Ref !== topicId)) assert.match(String(x.Ref), /^FleetAddHostForOldJobs/, id);
    }
    const [[, policy]] = resourcesOfType(json, 'AWS::SNS::TopicPolicy');
    assert.ok(JSON.stringify(policy.Properties?.PolicyDocument).includes('"aws:SecureTransport":"false"'));
    assert.equal(resourcesOfType(json, 'AWS::SNS::Subscription').length, 0);
    const mailed = synth({ alarmEmail: 'ops@example.com' }).json;
    const [[, sub]] = resourcesOfType(mailed, 'AWS::SNS::Subscription');
    assert.deepEqual([sub.Properties?.Protocol, sub.Properties?.Endpoint], ['email', 'ops@example.com']);
  });

  it('has a dashboard and alarms on both DLQs', () => {
    template.resourceCountIs('AWS::CloudWatch::Dashboard', 1);
    const alarms = resourcesOfType(json, 'AWS::CloudWatch::Alarm');
    const dlqAlarms = alarms.filter(([id]) => id.includes('DlqNotEmpty'));
    assert.equal(dlqAlarms.length, 2);
    const body = resolve(resourcesOfType(json, 'AWS::CloudWatch::Dashboard')[0][1].Properties?.DashboardBody);
    for (const metric of ['ApproximateNumberOfMessagesVisible', 'ApproximateAgeOfOldestMessage', 'NumberOfMessagesDeleted', 'Errors', 'GroupInServiceInstances']) {
      assert.ok(body.includes(metric), `dashboard shows ${metric}`);
    }
    for (const metric of Object.values(LEDGER_METRICS)) {
      assert.match(body, new RegExp(`${METRICS_NAMESPACE}\\W+${metric}\\W`), `dashboard shows ${METRICS_NAMESPACE}/${metric}`);
    }
  });

  it('the dashboard\'s job and document counts are the ones ledger-append prints (lambdas/src/metrics.rs)', () => {
    const emf = fs.readFileSync(path.join(repoRoot(), 'lambdas', 'src', 'metrics.rs'), 'utf8');
    assert.ok(emf.includes(`pub const NAMESPACE: &str = "${METRICS_NAMESPACE}";`));
    for (const metric of Object.values(LEDGER_METRICS)) assert.ok(emf.includes(`metric("${metric}")`), metric);
  });
});

describe('outputs', () => {
  const documented = () => fs.readFileSync(path.join(repoRoot(), 'docs', 'operations.md'), 'utf8');

  it('has the outputs the client reads, each documented in docs/operations.md', () => {
    const names = Object.keys(json.Outputs ?? {});
    for (const required of ['JobsBucketName', 'JobQueueUrl', 'LedgerQueueUrl', 'FleetKeyArn', 'ModelKeyArn', 'LedgerSigningKeyArn', 'BulkStateMachineArn', 'LedgerBucketName']) {
      assert.ok(names.includes(required), required);
    }
    const doc = documented();
    for (const n of names) assert.ok(doc.includes(`\`${n}\``), `docs/operations.md documents output ${n}`);
  });

  it('every IAM action the stack grants appears in the permissions table of docs/operations.md', () => {
    const granted = new Set<string>();
    for (const { statement } of identityStatements(json)) for (const a of asArray<string>(statement.Action)) granted.add(a);
    for (const [, k] of resourcesOfType(json, 'AWS::KMS::Key')) {
      for (const s of asArray<any>(k.Properties?.KeyPolicy?.Statement)) if (s.Effect === 'Allow') for (const a of asArray<string>(s.Action)) granted.add(a);
    }
    const doc = documented();
    const ownedByCdk = /^(logs:(CreateLogDelivery|DeleteLogDelivery|DescribeLogGroups|DescribeResourcePolicies|GetLogDelivery|ListLogDeliveries|PutResourcePolicy|UpdateLogDelivery)|xray:|s3:PutBucketNotification|logs:CreateLogGroup)/;
    for (const a of granted) {
      if (ownedByCdk.test(a) || a.startsWith('sqs:GetQueueUrl')) continue;
      assert.ok(doc.includes(a), `docs/operations.md mentions ${a}`);
    }
  });
});

describe('day two: rollouts, healing, idle cost, destroy', () => {
  const asg = () => resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup')[0][1];
  const policies = () => resourcesOfType(json, 'AWS::AutoScaling::ScalingPolicy');
  const alarms = () => resourcesOfType(json, 'AWS::CloudWatch::Alarm');

  it('a new launch template rolls host by host with one host always in service, each new host first given the launch hook\'s time', () => {
    const rolling = asg().UpdatePolicy?.AutoScalingRollingUpdate;
    assert.equal(rolling?.MaxBatchSize, 1);
    assert.equal(rolling?.MinInstancesInService, 1);
    assert.equal(rolling?.PauseTime, 'PT15M');
    // maxHosts=1 leaves no room for a new host beside the old one: MinInstancesInService must stay below MaxSize.
    const one = resourcesOfType(synth({ maxHosts: '1' }).json, 'AWS::AutoScaling::AutoScalingGroup')[0][1];
    assert.equal(one.UpdatePolicy?.AutoScalingRollingUpdate?.MinInstancesInService, 0);
  });

  it('minHosts=0 is allowed, and a step policy sets one host when work waits while the group wants none', () => {
    const j = synth({ minHosts: '0' }).json;
    assert.equal(resourcesOfType(j, 'AWS::AutoScaling::AutoScalingGroup')[0][1].Properties?.MinSize, '0');
    const [[stepId, step]] = policies().filter(([id]) => id.startsWith('FleetStartFirstHost'));
    assert.equal(step.Properties?.PolicyType, 'StepScaling');
    assert.equal(step.Properties?.AdjustmentType, 'ExactCapacity');
    assert.deepEqual(step.Properties?.StepAdjustments, [{ MetricIntervalLowerBound: 0, ScalingAdjustment: 1 }]);
    const [[, alarm]] = alarms().filter(([id]) => id.startsWith('FleetStartFirstHostAlarm'));
    assert.deepEqual(alarm.Properties?.AlarmActions, [{ Ref: stepId }]);
    assert.equal(alarm.Properties?.Threshold, 1);
    assert.equal(alarm.Properties?.ComparisonOperator, 'GreaterThanOrEqualToThreshold');
    const metrics = asArray<any>(alarm.Properties?.Metrics);
    const expression = metrics.find((m) => m.Expression)?.Expression;
    assert.equal(expression, 'IF(FILL(desired, 0) < 1, FILL(waiting, 0) + FILL(requests, 0), 0)');
    const byId = Object.fromEntries(metrics.filter((m) => m.MetricStat).map((m) => [m.Id, m.MetricStat.Metric]));
    assert.equal(byId.desired.MetricName, 'GroupDesiredCapacity');
    assert.equal(byId.waiting.MetricName, 'ApproximateNumberOfMessagesVisible');
    assert.equal(byId.requests.MetricName, 'PutRequests');
    assert.ok(JSON.stringify(byId.requests.Dimensions).includes('AttestationRequests'));
    // The attestations bucket publishes that request metric (and the one for published documents).
    const [[, bucket]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([id]) => id.startsWith('StorageAttestations'));
    assert.deepEqual(bucket.Properties?.MetricsConfigurations, [
      { Id: 'AttestationRequests', Prefix: 'attestations/requests/' },
      { Id: 'AttestationsPublished', Prefix: 'attestations/current/' },
    ]);
    // Target tracking still divides by in-service hosts: it takes over once there is one.
    assert.equal(policies().filter(([, p]) => p.Properties?.PolicyType === 'TargetTrackingScaling').length, 1);
  });

  it('alarms on the oldest job\'s age (adds a host, tells the operator) and on no fresh attestation document (tells the operator)', () => {
    const [[addId, add]] = policies().filter(([id]) => id.startsWith('FleetAddHostForOldJobs'));
    assert.equal(add.Properties?.AdjustmentType, 'ChangeInCapacity');
    assert.equal(add.Properties?.EstimatedInstanceWarmup, 900);
    const [[, old]] = alarms().filter(([id]) => id.startsWith('FleetOldestJobAgeAlarm'));
    assert.equal(old.Properties?.MetricName, 'ApproximateAgeOfOldestMessage');
    assert.equal(old.Properties?.Threshold, 900);
    assert.ok(asArray<any>(old.Properties?.AlarmActions).some((a) => a.Ref === addId));
    const [[topicId]] = resourcesOfType(json, 'AWS::SNS::Topic');
    assert.ok(asArray<any>(old.Properties?.AlarmActions).some((a) => a.Ref === topicId));
    const [[, stale]] = alarms().filter(([id]) => id.startsWith('ObservabilityNoFreshAttestation'));
    const metrics = asArray<any>(stale.Properties?.Metrics);
    assert.equal(metrics.find((m) => m.Expression)?.Expression, 'IF(FILL(hosts, 0) >= 1 AND FILL(published, 0) < 1, 1, 0)');
    for (const m of metrics.filter((x) => x.MetricStat)) assert.equal(m.MetricStat.Period, 3600, 'twice the 1800 s republish interval');
    const published = metrics.find((m) => m.Id === 'published').MetricStat.Metric;
    assert.equal(published.MetricName, 'PutRequests');
    assert.ok(JSON.stringify(published.Dimensions).includes('AttestationsPublished'));
    assert.deepEqual(stale.Properties?.AlarmActions, [{ Ref: topicId }]);
  });

  it('the host marks itself Unhealthy after 3 enclave restarts in 15 min or no document for twice the republish interval', () => {
    const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
    const parts = stack.resolve(lt.Properties?.LaunchTemplateData?.UserData)['Fn::Base64']['Fn::Join'][1] as unknown[];
    const script = parts.map((part) => (typeof part === 'string' ? part : '<token>')).join('');
    const check = /health-check <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    assert.ok(check.includes('[ -f "$state/in-service" ] || exit 0'), 'only once the launch watcher saw it attested');
    assert.ok(check.includes('-ge 3 ]') && check.includes('$((now - 900))'), check);
    assert.ok(check.includes('-ge 3600 ]') && check.includes('attestations/current/$instance.cbor'), check);
    assert.ok(check.includes('aws autoscaling set-instance-health --instance-id "$instance" --health-status Unhealthy --no-should-respect-grace-period'), check);
    assert.match(/ephem-health\.timer <<EOF\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '', /OnUnitActiveSec=60/);
    assert.ok(script.includes('ephem-enclave-watchdog.timer ephem-health.timer'), 'the timer is enabled');
    const ready = /launch-ready <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';
    assert.ok(ready.includes('touch /var/lib/ephem-batch-health/in-service'), ready);
  });

  it('cdk destroy keeps the ledger FIFO queue and its DLQ (receipts in flight)', () => {
    for (const prefix of ['QueuesLedger', 'QueuesLedgerDlq']) {
      const found = resourcesOfType(json, 'AWS::SQS::Queue').filter(([id]) => new RegExp(`^${prefix}[0-9A-F]{8}$`).test(id));
      assert.equal(found.length, 1, prefix);
      assert.equal(found[0][1].DeletionPolicy, 'Retain', prefix);
      assert.equal(found[0][1].UpdateReplacePolicy, 'Retain', prefix);
    }
  });
});

describe('the health watcher, run in bash against faked AWS CLI and IMDS', () => {
  const [[, lt]] = resourcesOfType(json, 'AWS::EC2::LaunchTemplate');
  const parts = stack.resolve(lt.Properties?.LaunchTemplateData?.UserData)['Fn::Base64']['Fn::Join'][1] as unknown[];
  const script = parts.map((part) => (typeof part === 'string' ? part : '<token>')).join('');
  const check = /health-check <<'EOF'\n([\s\S]*?)\nEOF\n/.exec(script)?.[1] ?? '';

  /** Runs the watcher with a state directory, a document LastModified `ageS` ago (or none), `restarts` timestamps. */
  function run(o: { inService: boolean; ageS?: number; restartsAgoS?: number[] }): { calls: string; stderr: string; status: number | null } {
    const dir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'health-'));
    const state = path.join(dir, 'state');
    const bin = path.join(dir, 'bin');
    fs.mkdirSync(state);
    fs.mkdirSync(bin);
    const now = Math.floor(Date.now() / 1000);
    if (o.inService) fs.writeFileSync(path.join(state, 'in-service'), '');
    if (o.restartsAgoS) fs.writeFileSync(path.join(state, 'enclave-restarts'), o.restartsAgoS.map((a) => `${now - a}\n`).join(''));
    // IMDS: a token, then the instance id. The AWS CLI: head-object answers LastModified, or fails (404).
    fs.writeFileSync(path.join(bin, 'curl'), '#!/bin/sh\ncase "$*" in *api/token*) echo token ;; *instance-id*) echo i-0abc ;; esac\n', { mode: 0o755 });
    const modified = o.ageS === undefined ? '' : new Date((now - o.ageS) * 1000).toISOString();
    fs.writeFileSync(path.join(bin, 'aws'), `#!/bin/sh\necho "$*" >>${dir}/calls\ncase "$2" in head-object) [ -n "${modified}" ] && echo "${modified}" || exit 254 ;; esac\n`, { mode: 0o755 });
    const body = check.replace('state=/var/lib/ephem-batch-health', `state=${state}`);
    assert.notEqual(body, check, 'the state directory is where the watchdog writes');
    const r = spawnSync('bash', ['-c', body], { encoding: 'utf8', env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, EPHEM_ATTESTATIONS_BUCKET: 'att' } });
    const calls = fs.existsSync(path.join(dir, 'calls')) ? fs.readFileSync(path.join(dir, 'calls'), 'utf8') : '';
    fs.rmSync(dir, { recursive: true, force: true });
    return { calls, stderr: r.stderr, status: r.status };
  }
  const unhealthy = 'autoscaling set-instance-health --instance-id i-0abc --health-status Unhealthy --no-should-respect-grace-period';

  it('leaves a healthy host alone: fresh document, no restarts', () => {
    const r = run({ inService: true, ageS: 600 });
    assert.equal(r.status, 0, r.stderr);
    assert.ok(r.calls.includes('s3api head-object --bucket att --key attestations/current/i-0abc.cbor'), r.calls);
    assert.ok(!r.calls.includes('set-instance-health'), r.calls);
  });

  it('marks the host Unhealthy when its document is older than twice the republish interval', () => {
    const r = run({ inService: true, ageS: 3700 });
    assert.ok(r.calls.includes(unhealthy), r.calls);
    assert.match(r.stderr, /no attestation document published for 3[67]\d\d s/);
  });

  it('marks the host Unhealthy after 3 enclave restarts within 15 minutes, not after 2, nor after old ones', () => {
    assert.ok(run({ inService: true, ageS: 60, restartsAgoS: [30, 300, 800] }).calls.includes(unhealthy));
    assert.ok(!run({ inService: true, ageS: 60, restartsAgoS: [30, 300] }).calls.includes('set-instance-health'));
    assert.ok(!run({ inService: true, ageS: 60, restartsAgoS: [30, 300, 1000, 2000] }).calls.includes('set-instance-health'));
  });

  it('does nothing before the launch watcher saw the host attested (the launch hook decides then)', () => {
    const r = run({ inService: false, ageS: 99999, restartsAgoS: [1, 2, 3, 4] });
    assert.equal(r.status, 0);
    assert.equal(r.calls, '');
  });
});
