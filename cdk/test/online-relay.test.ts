// The online relay's load balancer: absent without -c onlineCertificateArn; with it, an internal
// NLB whose TLS listener forwards to the hosts' relay port, health-checked on /healthz, the only
// way into a host, a scaling policy on its flows, the relay started by user data, an output.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Match } from 'aws-cdk-lib/assertions';
import { AwsSolutionsChecks } from 'cdk-nag';
import { RELAY_PORT } from '../lib/online-relay';
import { TEST_AMI, TEST_PCR0, defaultStack, resourcesOfType, synth } from './helpers';
import { buildApp } from '../lib/app';

const CERTIFICATE = 'arn:aws:acm:eu-west-1:123456789012:certificate/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';

function userDataText(json: any): string {
  return JSON.stringify(resourcesOfType(json, 'AWS::EC2::LaunchTemplate').map(([, r]) => r.Properties?.LaunchTemplateData?.UserData));
}

function hostIngress(json: any): any[] {
  const ingress = resourcesOfType(json, 'AWS::EC2::SecurityGroupIngress').map(([, r]) => r.Properties ?? {});
  for (const [, sg] of resourcesOfType(json, 'AWS::EC2::SecurityGroup')) {
    if (String(sg.Properties?.GroupDescription).startsWith('ephem-batch hosts')) ingress.push(...(sg.Properties?.SecurityGroupIngress ?? []));
  }
  return ingress.filter((i) => JSON.stringify(i.GroupId ?? {}).includes('HostSecurityGroup') || i.GroupId === undefined);
}

describe('online relay: without a certificate', () => {
  const { template, json } = defaultStack();

  it('has no load balancer, no relay and no output', () => {
    template.resourceCountIs('AWS::ElasticLoadBalancingV2::LoadBalancer', 0);
    template.resourceCountIs('AWS::ElasticLoadBalancingV2::Listener', 0);
    assert.ok(!userDataText(json).includes('EPHEM_ONLINE_LISTEN'));
    assert.equal(json.Outputs?.OnlineRelayDnsName, undefined);
  });

  it('admits nothing into a host', () => {
    assert.deepEqual(hostIngress(json), []);
  });
});

describe('online relay: with -c onlineCertificateArn', () => {
  const built = synth({ onlineCertificateArn: CERTIFICATE });
  const { template, json } = built;

  it('is an internal NLB with a TLS listener on the certificate', () => {
    template.resourceCountIs('AWS::ElasticLoadBalancingV2::LoadBalancer', 1);
    template.hasResourceProperties('AWS::ElasticLoadBalancingV2::LoadBalancer', { Type: 'network', Scheme: 'internal' });
    template.hasResourceProperties('AWS::ElasticLoadBalancingV2::Listener', {
      Port: 443,
      Protocol: 'TLS',
      Certificates: [{ CertificateArn: CERTIFICATE }],
      SslPolicy: Match.stringLikeRegexp('TLS13'),
    });
  });

  it('forwards to the hosts\' relay port, health-checked on /healthz', () => {
    template.hasResourceProperties('AWS::ElasticLoadBalancingV2::TargetGroup', {
      Port: RELAY_PORT,
      Protocol: 'TCP',
      TargetType: 'instance',
      HealthCheckProtocol: 'HTTP',
      HealthCheckPath: '/healthz',
      HealthCheckPort: String(RELAY_PORT),
    });
    const groups = resourcesOfType(json, 'AWS::AutoScaling::AutoScalingGroup');
    assert.equal(groups.length, 1);
    assert.equal(groups[0][1].Properties?.TargetGroupARNs?.length, 1);
  });

  it('lets only the balancer into a host, on the relay port only', () => {
    const ingress = hostIngress(json);
    assert.equal(ingress.length, 1, JSON.stringify(ingress));
    const [rule] = ingress;
    assert.equal(rule.FromPort, RELAY_PORT);
    assert.equal(rule.ToPort, RELAY_PORT);
    assert.equal(rule.CidrIp, undefined);
    assert.match(JSON.stringify(rule.SourceSecurityGroupId), /OnlineRelaySecurityGroup/);
    // The balancer takes TLS from the VPC only, never from anywhere.
    const [, nlbSg] = resourcesOfType(json, 'AWS::EC2::SecurityGroup').find(([id]) => id.includes('OnlineRelaySecurityGroup'))!;
    for (const i of nlbSg.Properties?.SecurityGroupIngress ?? []) {
      assert.notEqual(i.CidrIp, '0.0.0.0/0');
      assert.equal(i.FromPort, 443);
    }
  });

  it('starts the relay on every host through user data', () => {
    assert.ok(userDataText(json).includes(`EPHEM_ONLINE_LISTEN=0.0.0.0:${RELAY_PORT}`), userDataText(json).slice(0, 400));
  });

  it('scales the group on TLS flows per in-service host', () => {
    const policies = resourcesOfType(json, 'AWS::AutoScaling::ScalingPolicy').map(([, r]) => JSON.stringify(r.Properties));
    // backlog and flows tracking; the first host from zero and a host for old jobs (step policies)
    assert.equal(policies.filter((p) => p.includes('TargetTrackingScaling')).length, 2);
    const online = policies.find((p) => p.includes('ActiveFlowCount_TLS'));
    assert.ok(online?.includes('flows / hosts') && online.includes('"TargetValue":16'), online);
  });

  it('outputs the balancer\'s DNS name', () => {
    assert.ok(json.Outputs?.OnlineRelayDnsName, 'OnlineRelayDnsName output');
  });

  it('leaves no cdk-nag finding unacknowledged', () => {
    const report = new AwsSolutionsChecks(built.app).validateScope(built.app);
    const findings = report.violations.map((v) => `${v.ruleName}: ${v.violatingResources.map((r) => r.constructPath).join(', ')}`);
    assert.deepEqual(findings, []);
  });

  it('refuses what is not an ACM certificate ARN', () => {
    for (const bad of ['yes', 'arn:aws:iam::123456789012:server-certificate/x', `${CERTIFICATE}x`]) {
      assert.throws(() => buildApp({ pcr0: TEST_PCR0, hostAmi: TEST_AMI, 'aws:cdk:bundling-stacks': [], onlineCertificateArn: bad }), /onlineCertificateArn/);
    }
  });
});
