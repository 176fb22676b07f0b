// cdk-nag acknowledgements that depend on synthesized values. cdk-nag reports each wildcard
// resource of an IAM policy as its own finding, `AwsSolutions-IAM5[Resource::<flattened ARN>]`,
// where tokens appear as <LogicalId.Attr>; these helpers compute the same form, so that each
// acknowledgement names exactly one resource pattern and carries its own reason.
import { Stack, Validations } from 'aws-cdk-lib';
import { IConstruct } from 'constructs';

/** Flattens a resolved CloudFormation value the way cdk-nag names findings. */
export function flattenForNag(value: unknown): string {
  if (value === undefined) return '';
  if (typeof value === 'string') return value.replace(/\$\{/g, '<').replace(/\}/g, '>');
  if (Array.isArray(value)) return JSON.stringify(value);
  const v = value as Record<string, unknown>;
  if (v['Fn::Join']) {
    const [delimiter, items] = v['Fn::Join'] as [string, unknown[]];
    return items.map(flattenForNag).join(delimiter);
  }
  if (v['Fn::Sub']) return flattenForNag(v['Fn::Sub']);
  if (v['Fn::GetAtt']) {
    const [res, attr] = v['Fn::GetAtt'] as [unknown, unknown];
    return `<${flattenForNag(res)}.${flattenForNag(attr)}>`;
  }
  if (v['Ref']) return `<${flattenForNag(v['Ref'])}>`;
  return JSON.stringify(value);
}

/** The flattened form of an ARN (string or token) as cdk-nag will print it. */
export function nagResourceName(scope: IConstruct, arn: string): string {
  return flattenForNag(Stack.of(scope).resolve(arn));
}

/**
 * Acknowledges AwsSolutions-IAM5 for each resource pattern of `resources` that contains a
 * wildcard, with `reason`. Throws when a wildcard has no reason, so none slips in silently.
 */
export function justifyWildcardResources(scope: IConstruct, resources: string[], reason: string | undefined): void {
  for (const arn of resources) {
    const name = nagResourceName(scope, arn);
    if (!name.includes('*')) continue;
    if (!reason) {
      throw new Error(`${scope.node.path}: resource ${name} has a wildcard; give the reason it is needed`);
    }
    Validations.of(scope).acknowledge({ id: `AwsSolutions-IAM5[Resource::${name}]`, reason });
  }
}
