// The Oblivious HTTP relay's front door (issue 20): a Network Load Balancer whose TLS listener
// forwards to the hosts' relay port (host-poller --online-listen). The relay carries sealed
// requests it cannot read, so TLS ends at the balancer: what it protects is the OHTTP
// metadata (sizes, timing) from the network, not the content, which is sealed to the enclave.
//
// Internal: the hosts' VPC has no internet gateway (fleet.ts). Clients reach it from inside the
// VPC, through peering or a transit gateway, or through a PrivateLink endpoint service on it.
import { Duration, Validations } from 'aws-cdk-lib';
import * as autoscaling from 'aws-cdk-lib/aws-autoscaling';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import * as elbv2 from 'aws-cdk-lib/aws-elasticloadbalancingv2';
import { Construct } from 'constructs';

/** The port the relay listens on, on every host (plain HTTP inside the VPC, behind TLS). */
export const RELAY_PORT = 8080;
/** The balancer's TLS port. */
export const RELAY_TLS_PORT = 443;

export interface OnlineRelayProps {
  readonly vpc: ec2.IVpc;
  readonly subnets: ec2.SubnetSelection;
  readonly hosts: autoscaling.AutoScalingGroup;
  readonly hostSecurityGroup: ec2.SecurityGroup;
  /** ACM certificate of the relay's name (`-c onlineCertificateArn=arn:aws:acm:…`). */
  readonly certificateArn: string;
  /** Scaling target: TLS flows open at the balancer per in-service host. */
  readonly flowsPerHost: number;
}

export class OnlineRelay extends Construct {
  readonly loadBalancer: elbv2.NetworkLoadBalancer;
  readonly securityGroup: ec2.SecurityGroup;

  constructor(scope: Construct, id: string, props: OnlineRelayProps) {
    super(scope, id);
    this.securityGroup = new ec2.SecurityGroup(this, 'SecurityGroup', {
      vpc: props.vpc,
      allowAllOutbound: false,
      description: 'ephem-batch online relay balancer: TLS from the VPC, the relay port on the hosts',
    });
    this.securityGroup.addIngressRule(ec2.Peer.ipv4(props.vpc.vpcCidrBlock), ec2.Port.tcp(RELAY_TLS_PORT), 'TLS from the VPC');
    this.securityGroup.addEgressRule(props.hostSecurityGroup, ec2.Port.tcp(RELAY_PORT), 'the relay on the hosts');
    props.hostSecurityGroup.addIngressRule(this.securityGroup, ec2.Port.tcp(RELAY_PORT), 'the online relay, from its load balancer only');
    Validations.of(this.securityGroup).acknowledge({
      id: 'AwsSolutions-EC23',
      reason:
        'The rule cannot evaluate the source, the VPC\'s own CIDR block (a reference); no rule admits 0.0.0.0/0 or ::/0, which ' +
        'test/online-relay.test.ts asserts on the synthesized template.',
    });

    this.loadBalancer = new elbv2.NetworkLoadBalancer(this, 'LoadBalancer', {
      vpc: props.vpc,
      vpcSubnets: props.subnets,
      internetFacing: false,
      crossZoneEnabled: true,
      securityGroups: [this.securityGroup],
    });
    Validations.of(this.loadBalancer).acknowledge({
      id: 'AwsSolutions-ELB2',
      reason:
        'Access logs would keep every client\'s address and timing in a bucket; the relay already logs each request\'s status, sizes and ' +
        'duration without an address, and OHTTP exists so that no single party holds who asked with what.',
    });
    const listener = this.loadBalancer.addListener('Tls', {
      port: RELAY_TLS_PORT,
      protocol: elbv2.Protocol.TLS,
      certificates: [elbv2.ListenerCertificate.fromArn(props.certificateArn)],
      sslPolicy: elbv2.SslPolicy.RECOMMENDED_TLS,
      alpnPolicy: elbv2.AlpnPolicy.HTTP1_ONLY,
    });
    listener.addTargets('Hosts', {
      port: RELAY_PORT,
      protocol: elbv2.Protocol.TCP,
      targets: [props.hosts],
      // A draining host finishes what it relays; requests last at most the relay's deadline.
      deregistrationDelay: Duration.seconds(45),
      healthCheck: {
        protocol: elbv2.Protocol.HTTP,
        path: '/healthz',
        port: String(RELAY_PORT),
        interval: Duration.seconds(10),
        healthyThresholdCount: 2,
        unhealthyThresholdCount: 2,
      },
    });
    this.scaleOnFlows(props);
  }

  /**
   * Target tracking on the balancer's open TLS flows per in-service host: the online load, next
   * to the job backlog's policy (the group scales out when either asks, in when both allow).
   */
  private scaleOnFlows(p: OnlineRelayProps): void {
    new autoscaling.CfnScalingPolicy(this, 'FlowsPerHostScaling', {
      autoScalingGroupName: p.hosts.autoScalingGroupName,
      policyType: 'TargetTrackingScaling',
      estimatedInstanceWarmup: 300,
      targetTrackingConfiguration: {
        targetValue: p.flowsPerHost,
        customizedMetricSpecification: {
          metrics: [
            {
              id: 'flows',
              metricStat: {
                metric: {
                  namespace: 'AWS/NetworkELB',
                  metricName: 'ActiveFlowCount_TLS',
                  dimensions: [{ name: 'LoadBalancer', value: this.loadBalancer.loadBalancerFullName }],
                },
                stat: 'Average',
              },
              returnData: false,
            },
            {
              id: 'hosts',
              metricStat: {
                metric: {
                  namespace: 'AWS/AutoScaling',
                  metricName: 'GroupInServiceInstances',
                  dimensions: [{ name: 'AutoScalingGroupName', value: p.hosts.autoScalingGroupName }],
                },
                stat: 'Average',
              },
              returnData: false,
            },
            { id: 'flows_per_host', expression: 'flows / hosts', label: 'Online relay TLS flows per in-service host', returnData: true },
          ],
        },
      },
    });
  }
}
