// Every AWS call the binaries make (test/aws-calls.json) is allowed by the synthesized template,
// and the calls that must be refused are refused, as IAM would decide them: an IAM policy
// simulator (@cloud-copilot/iam-simulate, a test-only dev dependency, docs/supply-chain.md)
// evaluates each request against the principal's identity policies and the resource's policy
// (bucket, queue, key) from the template, with KMS's rule that a key policy must allow the
// principal itself or delegate to the account before any IAM policy counts. The emulator flow
// enforces no policy at all; this is where a grant that is missing (issue 19: ledger-append's
// kms:GetPublicKey) or too wide shows before a deployment does.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { allowedContextKeysForRequest, isWildcardOnlyAction, runSimulation, runUnsafeSimulation, type Simulation, type SimulationIdentityPolicy } from '@cloud-copilot/iam-simulate';
import { DefaultStackSynthesizer } from 'aws-cdk-lib';
import { repoRoot } from '../lib/config';
import { CallRow, CallTable, DenyRow, readTable, sdkOperations } from './aws-calls';
import { CfnTemplate, TEST_PCR0, TEST_PCR8, asArray, defaultStack, referencedId, resourcesOfType } from './helpers';

const ACCOUNT = '111122223333';
const REGION = 'eu-west-1';
const OTHER_MEASUREMENT = 'cc'.repeat(48);
const BUCKETS: Record<string, string> = { JOBS: 'Jobs', MODELS: 'Models', ATTESTATIONS: 'Attestations', ARTIFACTS: 'Artifacts', LEDGER: 'Ledger' };
const KEYS: Record<string, string> = { fleet: 'FleetKey', model: 'ModelKey', ledger: 'LedgerSigningKey' };
/** The CDK bootstrap's assets bucket (outside the template: its policy, TLS only, is the bootstrap's). */
const CDK_ASSETS_BUCKET = DefaultStackSynthesizer.DEFAULT_FILE_ASSETS_BUCKET_NAME.replace('${Qualifier}', DefaultStackSynthesizer.DEFAULT_QUALIFIER)
  .replace('${AWS::AccountId}', ACCOUNT)
  .replace('${AWS::Region}', REGION);
/** The roles of the template the table names, by construct id under Identities. */
const ROLES = ['HostRole', 'LedgerAppendRole', 'OnUploadRole', 'BulkListShardsRole', 'BulkAwaitShardRole', 'BulkAggregateRole', 'JobDeadLetterRole', 'ModelPublisherRole', 'KeyBreakGlassRole'];
/** Managed policies attached to those roles, which the simulation leaves out (it has no copy of them), with why that is safe. */
const UNMODELLED_MANAGED_POLICIES: Record<string, string> = {
  'arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore': 'ssm:, ssmmessages:, ec2messages: only: no S3, SQS, KMS, Step Functions or Auto Scaling action',
};

// ---- the template, with its intrinsics resolved to one concrete account and Region ----

/** A template in which every Ref, Fn::GetAtt and Fn::Join is resolved (names = logical ids). */
export class ResolvedTemplate {
  constructor(readonly json: CfnTemplate) {}

  private type(id: string): string {
    const r = this.json.Resources[id];
    if (!r) throw new Error(`no resource ${id}`);
    return r.Type;
  }

  ref(id: string): string {
    const pseudo: Record<string, string> = { 'AWS::Partition': 'aws', 'AWS::AccountId': ACCOUNT, 'AWS::Region': REGION, 'AWS::URLSuffix': 'amazonaws.com' };
    if (pseudo[id]) return pseudo[id];
    switch (this.type(id)) {
      case 'AWS::S3::Bucket':
        return id.toLowerCase();
      case 'AWS::SQS::Queue':
        return `https://sqs.${REGION}.amazonaws.com/${ACCOUNT}/${id}`;
      case 'AWS::StepFunctions::StateMachine':
        return `arn:aws:states:${REGION}:${ACCOUNT}:stateMachine:${id}`;
      case 'AWS::IAM::Role':
      case 'AWS::AutoScaling::AutoScalingGroup':
      case 'AWS::Logs::LogGroup':
      case 'AWS::Lambda::Function':
        return id;
      default:
        throw new Error(`Ref of ${this.type(id)} (${id}) is not modelled`);
    }
  }

  getAtt(id: string, attribute: string): string {
    if (attribute !== 'Arn') throw new Error(`Fn::GetAtt ${id}.${attribute} is not modelled`);
    switch (this.type(id)) {
      case 'AWS::S3::Bucket':
        return `arn:aws:s3:::${this.ref(id)}`;
      case 'AWS::SQS::Queue':
        return `arn:aws:sqs:${REGION}:${ACCOUNT}:${id}`;
      case 'AWS::KMS::Key':
        return `arn:aws:kms:${REGION}:${ACCOUNT}:key/${id}`;
      case 'AWS::IAM::Role':
        return `arn:aws:iam::${ACCOUNT}:role/${id}`;
      case 'AWS::Logs::LogGroup':
        return `arn:aws:logs:${REGION}:${ACCOUNT}:log-group:${id}:*`;
      case 'AWS::Lambda::Function':
        return `arn:aws:lambda:${REGION}:${ACCOUNT}:function:${id}`;
      default:
        throw new Error(`Fn::GetAtt of ${this.type(id)} (${id}) is not modelled`);
    }
  }

  resolve(v: unknown): any {
    if (Array.isArray(v)) return v.map((x) => this.resolve(x));
    if (v && typeof v === 'object') {
      const o = v as Record<string, any>;
      if (typeof o.Ref === 'string') return this.ref(o.Ref);
      if (Array.isArray(o['Fn::GetAtt'])) return this.getAtt(o['Fn::GetAtt'][0], o['Fn::GetAtt'][1]);
      if (Array.isArray(o['Fn::Join'])) return (this.resolve(o['Fn::Join'][1]) as string[]).join(o['Fn::Join'][0]);
      // The string form only, as CDK writes the assets bucket's name: ${AWS::AccountId}, ${LogicalId}.
      if (typeof o['Fn::Sub'] === 'string') return o['Fn::Sub'].replace(/\$\{([\w:]+)\}/g, (_m: string, name: string) => this.ref(name));
      const fn = Object.keys(o).find((k) => k.startsWith('Fn::'));
      if (fn) throw new Error(`${fn} is not modelled`);
      return Object.fromEntries(Object.entries(o).map(([k, x]) => [k, this.resolve(x)]));
    }
    return v;
  }

  /** The one logical id of `type` matching `pattern`. */
  idOf(type: string, pattern: RegExp): string {
    const ids = resourcesOfType(this.json, type).map(([id]) => id).filter((id) => pattern.test(id));
    if (ids.length !== 1) throw new Error(`${ids.length} resources of ${type} match ${pattern}: ${ids.join(', ')}`);
    return ids[0];
  }

  roleId(name: string): string {
    return this.idOf('AWS::IAM::Role', new RegExp(`^Identities${name}[0-9A-F]{8}$`));
  }

  /** The role's inline policies and every AWS::IAM::Policy attached to it, resolved. */
  identityPolicies(roleId: string): SimulationIdentityPolicy[] {
    const out: SimulationIdentityPolicy[] = [];
    const role = this.json.Resources[roleId];
    for (const p of asArray<any>(role.Properties?.Policies)) out.push({ name: `${roleId}/${p.PolicyName}`, policy: this.resolve(p.PolicyDocument) });
    for (const [id, p] of resourcesOfType(this.json, 'AWS::IAM::Policy')) {
      if (asArray(p.Properties?.Roles).map(referencedId).includes(roleId)) out.push({ name: id, policy: this.resolve(p.Properties?.PolicyDocument) });
    }
    return out;
  }

  managedPolicies(roleId: string): string[] {
    return asArray(this.json.Resources[roleId].Properties?.ManagedPolicyArns).map((a) => this.resolve(a));
  }

  /** The policy of the bucket, queue or key an ARN names (undefined: the resource has none). */
  resourcePolicy(arn: string): any {
    const s3 = /^arn:aws:s3:::([^/]+)/.exec(arn);
    if (s3) {
      const found = resourcesOfType(this.json, 'AWS::S3::BucketPolicy').filter(([, p]) => this.resolve(p.Properties?.Bucket) === s3[1]);
      return found.length ? this.resolve(found[0][1].Properties?.PolicyDocument) : undefined;
    }
    const sqs = new RegExp(`^arn:aws:sqs:${REGION}:${ACCOUNT}:(\\w+)$`).exec(arn);
    if (sqs) {
      const found = resourcesOfType(this.json, 'AWS::SQS::QueuePolicy').filter(([, p]) => asArray(p.Properties?.Queues).map(referencedId).includes(sqs[1]));
      return found.length ? this.resolve(found[0][1].Properties?.PolicyDocument) : undefined;
    }
    const kms = new RegExp(`^arn:aws:kms:${REGION}:${ACCOUNT}:key/(\\w+)$`).exec(arn);
    if (kms) return this.resolve(this.json.Resources[kms[1]].Properties?.KeyPolicy);
    return undefined;
  }

  /** A resource of the table (s3://JOBS/key, sqs://Jobs, kms://fleet, …) as an ARN of this template. */
  arn(resource: string): string {
    const [scheme, rest] = resource.split('://');
    const [name, ...tail] = rest.split('/');
    const sub = tail.join('/');
    switch (scheme) {
      case 's3': {
        const bucket = name === 'CDK_ASSETS' ? CDK_ASSETS_BUCKET : this.ref(this.idOf('AWS::S3::Bucket', new RegExp(`^Storage${BUCKETS[name]}[0-9A-F]{8}$`)));
        return tail.length ? `arn:aws:s3:::${bucket}/${sub}` : `arn:aws:s3:::${bucket}`;
      }
      case 'sqs':
        return this.getAtt(this.idOf('AWS::SQS::Queue', new RegExp(`^Queues${name}[0-9A-F]{8}$`)), 'Arn');
      case 'kms':
        return this.getAtt(this.idOf('AWS::KMS::Key', new RegExp(`^Keys${KEYS[name]}`)), 'Arn');
      case 'states':
        return this.ref(this.idOf('AWS::StepFunctions::StateMachine', /^BulkWorkflowStateMachine/));
      case 'logs':
        return `arn:aws:logs:${REGION}:${ACCOUNT}:log-group:${this.idOf('AWS::Logs::LogGroup', new RegExp(`^${name}[0-9A-F]{8}$`))}:log-stream:${sub}`;
      case 'autoscaling': {
        const group = name === 'hosts' ? this.idOf('AWS::AutoScaling::AutoScalingGroup', /^FleetHostsASG/) : name;
        return `arn:aws:autoscaling:${REGION}:${ACCOUNT}:autoScalingGroup:6e9d6a12-0000-4000-8000-000000000000:autoScalingGroupName/${group}`;
      }
      default:
        throw new Error(`unknown resource ${resource}`);
    }
  }
}

// ---- principals ----

interface Principal {
  readonly arn: string;
  readonly policies: SimulationIdentityPolicy[];
}

/** docs/operations.md §3's example tenant policy, with the template's buckets and keys. */
function tenantPolicy(t: ResolvedTemplate): any {
  const doc = fs.readFileSync(path.join(repoRoot(), 'docs', 'operations.md'), 'utf8');
  const section = doc.slice(doc.indexOf('## 3. '), doc.indexOf('## 4. '));
  const block = /```json\n([\s\S]*?)\n```/.exec(section);
  assert.ok(block, 'docs/operations.md §3 shows a tenant policy');
  let text = block[1];
  for (const placeholder of Object.keys(BUCKETS)) text = text.replace(new RegExp(`arn:aws:s3:::${placeholder}\\b`, 'g'), t.arn(`s3://${placeholder}`));
  for (const [placeholder, key] of [['FLEET_KEY_ARN', 'fleet'], ['MODEL_KEY_ARN', 'model'], ['LEDGER_SIGNING_KEY_ARN', 'ledger']]) {
    text = text.replace(new RegExp(placeholder, 'g'), t.arn(`kms://${key}`));
  }
  return JSON.parse(text);
}

const EVERYTHING = { Version: '2012-10-17', Statement: [{ Effect: 'Allow', Action: '*', Resource: '*' }] };

function principals(t: ResolvedTemplate): Record<string, Principal> {
  const out: Record<string, Principal> = {};
  for (const name of ROLES) {
    const id = t.roleId(name);
    // A role's requests come from a session of it (Lambda's, the instance profile's).
    out[name] = { arn: `arn:aws:sts::${ACCOUNT}:assumed-role/${id}/session`, policies: t.identityPolicies(id) };
  }
  out.tenant = { arn: `arn:aws:sts::${ACCOUNT}:assumed-role/TenantAcme/alice`, policies: [{ name: 'docs/operations.md §3', policy: tenantPolicy(t) }] };
  out.admin = { arn: `arn:aws:sts::${ACCOUNT}:assumed-role/Administrator/ops`, policies: [{ name: 'AdministratorAccess', policy: EVERYTHING }] };
  out.root = { arn: `arn:aws:iam::${ACCOUNT}:root`, policies: [{ name: 'the account root may do anything IAM governs', policy: EVERYTHING }] };
  return out;
}

// ---- requests ----

interface Request {
  readonly principal: Principal;
  readonly action: string;
  readonly resource: string; // an ARN
  readonly context: Record<string, string>;
}

function context(action: string, given: Record<string, string> = {}): Record<string, string> {
  const values: Record<string, string> = { '${PCR0}': TEST_PCR0, '${PCR8}': TEST_PCR8, '${OTHER}': OTHER_MEASUREMENT };
  const out: Record<string, string> = { 'aws:SecureTransport': 'true', ...(action.startsWith('s3:') ? { 's3:TlsVersion': '1.3' } : {}) };
  for (const [k, v] of Object.entries(given)) out[k] = values[v] ?? v;
  return out;
}

/**
 * Actions AWS's Service Authorization Reference lists without resource types (so IAM would
 * evaluate them against `*`), which the service is known to authorize against a resource the
 * template names: Step Functions authorizes SendTaskSuccess/SendTaskFailure against the state
 * machine of the task token (CDK's grantTaskResponse grants them on the state machine ARN; an
 * AccessDenied names `...:stateMachine:<name>`). They are simulated without the simulator's
 * wildcard check, on that ARN; docs/operations.md §9 lists them as a real account's question.
 */
export const EVALUATED_ON_THEIR_RESOURCE = ['states:SendTaskSuccess', 'states:SendTaskFailure'];

interface Decision {
  readonly result: string;
  /** Context keys the simulator ignored as not applying to the action. */
  readonly ignored: string[];
}

async function decide(t: ResolvedTemplate, r: Request): Promise<Decision> {
  const simulation: Simulation = {
    request: { principal: r.principal.arn, action: r.action, resource: { resource: r.resource, accountId: ACCOUNT }, contextVariables: r.context },
    identityPolicies: r.principal.policies,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    resourcePolicy: t.resourcePolicy(r.resource),
  };
  const [service, action] = r.action.split(':');
  if (EVALUATED_ON_THEIR_RESOURCE.includes(r.action) && (await isWildcardOnlyAction(service, action))) {
    assert.equal(simulation.resourcePolicy, undefined, `${r.action} on ${r.resource}: a resource policy the unchecked evaluation would not see`);
    return { result: runUnsafeSimulation(unchecked(simulation), {}), ignored: [] };
  }
  const result = await runSimulation(simulation, {});
  if (result.resultType === 'error') throw new Error(`the simulator refused ${describeRequest(r)}: ${JSON.stringify(result.errors)}`);
  const dropped = result.resultType === 'single' ? (result.result.ignoredContextKeys ?? []) : [];
  // The simulator matches a key with a variable part only after a '/' (aws:ResourceTag/<tag>), so it
  // drops kms:EncryptionContext:<key>, which AWS's reference lists for the action as
  // kms:EncryptionContext:${EncryptionContextKey}. Such a request is evaluated again, with its
  // whole context, once the keys are checked here against the action's own.
  const allowed = (await allowedContextKeysForRequest(service, action, r.resource, false, undefined)).map(keyPattern);
  const ignored = dropped.filter((k) => !allowed.some((re) => re.test(k)));
  if (dropped.length > ignored.length) {
    const kept = Object.fromEntries(Object.entries(r.context).filter(([k]) => !ignored.includes(k)));
    return { result: runUnsafeSimulation({ ...unchecked(simulation), request: { ...simulation.request, contextVariables: kept } }, {}), ignored };
  }
  return { result: result.overallResult, ignored };
}

/**
 * The simulation for runUnsafeSimulation, which loads a resource policy without the name the
 * evaluation reports it by: given as iam-policy's already validated form (checked above by runSimulation).
 */
function unchecked(simulation: Simulation): Simulation {
  if (!simulation.resourcePolicy) return simulation;
  return { ...simulation, resourcePolicy: { __validated: true, policyDocument: simulation.resourcePolicy, metadata: { name: 'resource policy' }, errors: [] } };
}

/** A condition key of AWS's reference (lower case, `${Variable}` parts) as a pattern. */
function keyPattern(key: string): RegExp {
  const parts = key.split(/\$\{[^}]+\}/).map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  return new RegExp(`^${parts.join('.+')}$`, 'i');
}

function describeRequest(r: Request): string {
  return `${r.principal.arn.split(':').pop()} ${r.action} ${r.resource} ${JSON.stringify(r.context)}`;
}

// ---- the tests ----

const table: CallTable = readTable();
const template = new ResolvedTemplate(defaultStack().json);
const who = principals(template);

/** The keys of the test deployment's enclave image and host-poller in the assets bucket (host-artifacts.ts). */
const { fleet } = defaultStack().stack;
const OBJECTS: Record<string, string> = {
  '${ENCLAVE_EIF}': fleet.artifacts.enclaveEif.asset.s3ObjectKey,
  '${HOST_POLLER}': fleet.artifacts.hostPoller.asset.s3ObjectKey,
};

function request(row: CallRow | DenyRow, principal: Principal, resource: string = row.resource): Request {
  const named = resource.replace(/\$\{[A-Z_]+\}/g, (v) => OBJECTS[v] ?? v);
  return { principal, action: row.action, resource: template.arn(named), context: { ...principalContext(principal), ...context(row.action, row.context) } };
}

/** aws:PrincipalArn as IAM sets it on every request: a role session's is its role's ARN. */
function principalContext(p: Principal): Record<string, string> {
  const session = new RegExp(`^arn:aws:sts::${ACCOUNT}:assumed-role/([^/]+)/`).exec(p.arn);
  return { 'aws:PrincipalArn': session ? `arn:aws:iam::${ACCOUNT}:role/${session[1]}` : p.arn };
}

/** A deny row for each principal and key it names (`*`: every role, the tenant, the administrator, the account root; kms://*: each key). */
function expand(row: DenyRow): Request[] {
  const names = row.role === '*' ? Object.keys(who) : [row.role];
  const resources = row.resource === 'kms://*' ? Object.keys(KEYS).map((k) => `kms://${k}`) : [row.resource];
  return names.flatMap((n) => {
    assert.ok(who[n], `unknown principal ${n}`);
    return resources.map((res) => request(row, who[n], res));
  });
}

describe('the AWS calls of the binaries (test/aws-calls.json)', () => {
  const found = sdkOperations();
  const inCode = new Set(found.map((f) => f.operation));

  it('lists every SDK operation the adapters send, and none they do not', () => {
    assert.ok(inCode.size >= 20, `found ${inCode.size} operations in cloud-aws/src`);
    for (const f of found) assert.ok(table.operations[f.operation], `cloud-aws/src/${f.file} sends ${f.operation}: add it to test/aws-calls.json (who sends it, with which action on what)`);
    for (const op of Object.keys(table.operations)) assert.ok(inCode.has(op), `test/aws-calls.json lists ${op}, which no adapter sends any more`);
  });

  it('simulates every action of every operation a deployed binary sends, and each row\'s action is its operation\'s', () => {
    for (const [op, o] of Object.entries(table.operations)) {
      if (o.outsideTemplate) continue;
      for (const action of o.actions) {
        assert.ok(table.allowed.some((c) => c.op === op && c.action === action), `no call of ${op} as ${action} is simulated`);
      }
    }
    for (const c of table.allowed) {
      if (!/^(s3|sqs|kms|sfn):/.test(c.op)) continue; // the aws CLI, the CloudWatch agent, Lambda itself
      assert.ok(table.operations[c.op], `${c.binary}: unknown operation ${c.op}`);
      assert.ok(table.operations[c.op].actions.includes(c.action), `${c.binary}: ${c.op} is not ${c.action}`);
      assert.equal(table.operations[c.op].outsideTemplate, undefined, `${c.binary}: ${c.op} is marked outside the template`);
    }
  });

  it('every role the table names is one of the template (and every template component role is exercised)', () => {
    const named = new Set(table.allowed.map((c) => c.role));
    for (const r of named) assert.ok(who[r], `unknown role ${r}`);
    for (const r of ROLES) assert.ok(named.has(r), `no call of ${r} is simulated`);
  });

  it('evaluates on their resource only the actions AWS\'s reference lists without one, which it still does', async () => {
    for (const a of EVALUATED_ON_THEIR_RESOURCE) {
      const [service, action] = a.split(':');
      assert.ok(await isWildcardOnlyAction(service, action), `${a} has resource types now: drop it from EVALUATED_ON_THEIR_RESOURCE`);
    }
  });

  it('leaves out only the managed policies it knows, which grant none of the simulated actions', () => {
    for (const name of ROLES) {
      for (const arn of template.managedPolicies(template.roleId(name))) {
        assert.ok(UNMODELLED_MANAGED_POLICIES[arn], `${name} has managed policy ${arn}, which the simulation does not model`);
      }
    }
  });
});

describe('allowed by the template (iam-simulate)', () => {
  for (const row of table.allowed) {
    const label = `${row.binary}: ${row.action} ${row.resource}${row.context ? ' ' + JSON.stringify(row.context) : ''}`;
    it(label, async () => {
      const r = request(row, who[row.role]);
      const d = await decide(template, r);
      assert.equal(d.result, 'Allowed', describeRequest(r));
      // A condition key of the table that does not apply to the action would prove nothing.
      for (const key of Object.keys(row.context ?? {})) assert.ok(!d.ignored.includes(key), `${key} does not apply to ${row.action}`);
    });
  }
});

describe('denied by the template (iam-simulate)', () => {
  for (const row of table.denied) {
    it(`${row.why}: ${row.role} ${row.action} ${row.resource}${row.context ? ' ' + JSON.stringify(row.context) : ''}`, async () => {
      for (const r of expand(row)) {
        const d = await decide(template, r);
        assert.notEqual(d.result, 'Allowed', describeRequest(r));
        if (row.expect) assert.equal(d.result, row.expect, describeRequest(r));
        for (const key of Object.keys(row.context ?? {})) assert.ok(!d.ignored.includes(key), `${key} does not apply to ${row.action}`);
      }
    });
  }
});

describe('KMS key-policy rule (issue 19: ledger-append could not read its key)', () => {
  const ledgerKeyId = template.idOf('AWS::KMS::Key', /^KeysLedgerSigningKey/);
  const getPublicKey: CallRow = { binary: 'ledger-append', role: 'LedgerAppendRole', op: 'kms:get_public_key', action: 'kms:GetPublicKey', resource: 'kms://ledger' };

  it('a key policy that lets only the account root read the public key refuses ledger-append (no IAM kms: statement may fix it here)', async () => {
    // The template as V1 had it: the ledger role's GetPublicKey statement gone.
    const v1 = structuredClone(defaultStack().json) as CfnTemplate;
    const policy = v1.Resources[ledgerKeyId].Properties!.KeyPolicy;
    policy.Statement = policy.Statement.filter((s: any) => s.Sid !== 'AllowLedgerAppendReadPublicKey');
    const t = new ResolvedTemplate(v1);
    const ledger = principals(t).LedgerAppendRole;
    assert.equal((await decide(t, { ...request(getPublicKey, ledger), resource: t.arn('kms://ledger') })).result, 'ImplicitlyDenied');
    // With the account's delegation, an IAM statement would have been enough: the rule the simulator models.
    const withIam: Principal = {
      arn: ledger.arn,
      policies: [...ledger.policies, { name: 'iam', policy: { Version: '2012-10-17', Statement: [{ Effect: 'Allow', Action: 'kms:GetPublicKey', Resource: t.arn('kms://ledger') }] } }],
    };
    assert.equal((await decide(t, { ...request(getPublicKey, withIam), resource: t.arn('kms://ledger') })).result, 'Allowed');
    // The template's own policy allows it with no IAM statement (grants.test.ts: no kms: in IAM).
    assert.equal((await decide(template, request(getPublicKey, who.LedgerAppendRole))).result, 'Allowed');
  });

  it('an IAM kms: statement does not reach a key whose policy neither names the role nor delegates that action to the account', async () => {
    const ledger = who.LedgerAppendRole;
    const withIam: Principal = {
      arn: ledger.arn,
      policies: [...ledger.policies, { name: 'iam', policy: { Version: '2012-10-17', Statement: [{ Effect: 'Allow', Action: 'kms:Sign', Resource: '*' }] } }],
    };
    // The host role's session with an IAM grant for Sign: the ledger key delegates no Sign to the account.
    const host: Principal = { arn: who.HostRole.arn, policies: withIam.policies.slice(-1) };
    assert.equal((await decide(template, { principal: host, action: 'kms:Sign', resource: template.arn('kms://ledger'), context: context('kms:Sign', { 'kms:SigningAlgorithm': 'ED25519_SHA_512' }) })).result, 'ImplicitlyDenied');
  });
});

describe('new fleet-key epochs: the Allow itself requires the attestation (docs/protocol.md §7.3.1)', () => {
  const fleetKeyId = template.idOf('AWS::KMS::Key', /^KeysFleetKey/);
  const epochContext = { 'kms:DataKeyPairSpec': 'ECC_NIST_P256', 'kms:EncryptionContext:epoch': '43', 'kms:EncryptionContext:not_after': '1767225600000' };
  const attested = { 'kms:RecipientAttestation:ImageSha384': '${PCR0}', 'kms:RecipientAttestation:PCR8': '${PCR8}' };
  const generate = (context: Record<string, string>): CallRow => ({
    binary: 'enclave', role: 'HostRole', op: 'enclave-tls', action: 'kms:GenerateDataKeyPair', resource: 'kms://fleet', context,
  });
  /** The template with the fleet key's statements edited. */
  function edited(edit: (statements: any[]) => any[]): ResolvedTemplate {
    const t = structuredClone(defaultStack().json) as CfnTemplate;
    const policy = t.Resources[fleetKeyId].Properties!.KeyPolicy;
    policy.Statement = edit(policy.Statement);
    return new ResolvedTemplate(t);
  }
  const decideIn = async (t: ResolvedTemplate, row: CallRow) =>
    (await decide(t, { ...request(row, principals(t).HostRole), resource: t.arn('kms://fleet') })).result;

  it('with every Deny of the fleet key removed, the host role still gets no unattested or other-image pair', async () => {
    // The Denies are the second line; this is the first: a regression that dropped the Allow's
    // condition (or put GenerateDataKeyPair in an unconditioned statement) would pass the Denies' rows alone.
    const noDenies = edited((statements) => statements.filter((x: any) => x.Effect !== 'Deny'));
    assert.equal(await decideIn(noDenies, generate({ ...attested, ...epochContext })), 'Allowed');
    assert.equal(await decideIn(noDenies, generate(epochContext)), 'ImplicitlyDenied', 'no attestation');
    assert.equal(await decideIn(noDenies, generate({ ...attested, 'kms:RecipientAttestation:ImageSha384': '${OTHER}', ...epochContext })), 'ImplicitlyDenied', 'another image');
    assert.equal(await decideIn(noDenies, generate({ 'kms:RecipientAttestation:ImageSha384': '${PCR0}', ...epochContext })), 'ImplicitlyDenied', 'no PCR8');
  });

  it('and the check can fail: the same Allow without its attestation condition lets the host have a pair in plaintext', async () => {
    const withoutAttestation = (c: Record<string, unknown>) => Object.fromEntries(Object.entries(c).filter(([operator]) => operator !== 'StringEqualsIgnoreCase'));
    const unconditioned = edited((statements) =>
      statements
        .filter((x: any) => x.Effect !== 'Deny')
        .map((x: any) => (x.Sid === 'AllowAttestedEnclaveNewEpochKeyPairs' ? { ...x, Condition: withoutAttestation(x.Condition) } : x)),
    );
    assert.equal(await decideIn(unconditioned, generate(epochContext)), 'Allowed');
  });

  it('with the Denies in place, the unattested request is refused explicitly', async () => {
    assert.equal((await decide(template, request(generate(epochContext), who.HostRole))).result, 'ExplicitlyDenied');
  });
});
