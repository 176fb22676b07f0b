// Shared by the tests: dummy but well-formed measurements, and a synthesized stack with asset
// bundling switched off (no Lambda zips, no Docker, no network).
import { Template } from 'aws-cdk-lib/assertions';
import { BuiltApp, buildApp } from '../lib/app';

export const TEST_PCR0 = 'a0'.repeat(48);
export const TEST_PCR8 = 'b8'.repeat(48);
/** A pinned host AMI (-c hostAmi), so that no test depends on a lookup or on AWS credentials. */
export const TEST_AMI = 'ami-0123456789abcdef0';

export interface Synthesized extends BuiltApp {
  readonly template: Template;
  /** The template as plain JSON. */
  readonly json: CfnTemplate;
}

export interface CfnResourceJson {
  Type: string;
  Properties?: Record<string, any>;
  [k: string]: any;
}

export interface CfnTemplate {
  Resources: Record<string, CfnResourceJson>;
  Outputs?: Record<string, any>;
  [k: string]: any;
}

export function synth(context: Record<string, unknown> = {}): Synthesized {
  const built = buildApp({ pcr0: TEST_PCR0, hostAmi: TEST_AMI, 'aws:cdk:bundling-stacks': [], ...context }, undefined, {});
  const template = Template.fromStack(built.stack);
  return { ...built, template, json: template.toJSON() as CfnTemplate };
}

let cached: Synthesized | undefined;
/** The default test deployment (PCR0 and PCR8 given), synthesized once per test file. */
export function defaultStack(): Synthesized {
  cached ??= synth({ pcr8: TEST_PCR8 });
  return cached;
}

export function resourcesOfType(t: CfnTemplate, type: string): [string, CfnResourceJson][] {
  return Object.entries(t.Resources).filter(([, r]) => r.Type === type);
}

export function asArray<T>(v: T | T[] | undefined): T[] {
  if (v === undefined) return [];
  return Array.isArray(v) ? v : [v];
}

/** Logical id referenced by {"Fn::GetAtt": [id, ...]} or {"Ref": id}, if that is what `v` is. */
export function referencedId(v: any): string | undefined {
  if (v && typeof v === 'object') {
    if (Array.isArray(v['Fn::GetAtt'])) return v['Fn::GetAtt'][0];
    if (typeof v.Ref === 'string') return v.Ref;
  }
  return undefined;
}

/** Every IAM policy statement of identity policies (AWS::IAM::Policy and inline role policies). */
export function identityStatements(t: CfnTemplate): { owner: string; statement: any }[] {
  const out: { owner: string; statement: any }[] = [];
  for (const [id, r] of Object.entries(t.Resources)) {
    if (r.Type === 'AWS::IAM::Policy') {
      for (const s of asArray(r.Properties?.PolicyDocument?.Statement)) out.push({ owner: id, statement: s });
    }
    if (r.Type === 'AWS::IAM::Role') {
      for (const p of asArray(r.Properties?.Policies as any[])) {
        for (const s of asArray(p.PolicyDocument?.Statement)) out.push({ owner: id, statement: s });
      }
    }
  }
  return out;
}
