// The app's stack: a thin shell over the EphemBatch construct (ephem-batch.ts), which holds the
// whole deployment. The construct's id is 'Default', which CDK leaves out of logical ids, so
// every resource keeps the logical id it had when the stack held them itself (a KMS key whose
// logical id changed would be a new key).
import { Stack, StackProps, Tags } from 'aws-cdk-lib';
import * as ec2 from 'aws-cdk-lib/aws-ec2';
import { Construct } from 'constructs';
import { DeployConfig } from './config';
import { EphemBatch } from './ephem-batch';

export interface EphemBatchStackProps extends StackProps {
  readonly config: DeployConfig;
}

export class EphemBatchStack extends Stack {
  readonly batch: EphemBatch;

  constructor(scope: Construct, id: string, props: EphemBatchStackProps) {
    const cfg = props.config;
    super(scope, id, {
      description: `ephem-batch: confidential bulk text embedding on Nitro Enclaves (image PCR0 ${cfg.measurements.pcr0.slice(0, 16)}..., from ${cfg.measurements.source})`,
      ...props,
    });
    // The stack's own tag too (CloudFormation's stack tags, and CDK's stack-level singletons).
    Tags.of(this).add('project', 'ephem-batch');
    this.batch = new EphemBatch(this, 'Default', cfg);
    this.keepNameTags();
  }

  /**
   * The VPC, its subnets, its flow log and the launch template carry a Name tag holding their construct path,
   * which the construct's 'Default' id would change (`<stack>/Default/Fleet/...`): a new Name on
   * the launch template is a new version, which would roll the whole fleet for nothing. The
   * former names are kept, above the constructs' own (priority 100).
   */
  private keepNameTags(): void {
    const former = (path: string) => path.replace(`${this.node.path}/Default/`, `${this.node.path}/`);
    const { vpc, launchTemplate } = this.batch.fleet;
    if (vpc instanceof ec2.Vpc) {
      Tags.of(vpc).add('Name', former(vpc.node.path), { priority: 101 });
      const named = [...vpc.publicSubnets, ...vpc.privateSubnets, ...vpc.isolatedSubnets, ...vpc.node.findAll().filter((c) => c instanceof ec2.FlowLog)];
      for (const c of named) Tags.of(c).add('Name', former(c.node.path), { priority: 102 });
    }
    Tags.of(launchTemplate).add('Name', former(launchTemplate.node.path), { priority: 101 });
  }

  get identities() {
    return this.batch.identities;
  }
  get storage() {
    return this.batch.storage;
  }
  get keys() {
    return this.batch.keys;
  }
  get fleet() {
    return this.batch.fleet;
  }
}
