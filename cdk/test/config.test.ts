// Deploy-time configuration: no default measurements, clear errors, policy files, prefixes.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { ConfigError, checkPrefixes, hostImage, loadConfig, loadMeasurements } from '../lib/config';
import { TEST_AMI, TEST_PCR0, TEST_PCR8 } from './helpers';

// A pinned AMI unless a test says otherwise (no test may depend on the caller's AWS credentials).
const ctx = (values: Record<string, unknown>) => (key: string) => ({ hostAmi: TEST_AMI, ...values })[key];

function tempPolicy(doc: unknown): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-policy-'));
  const file = path.join(dir, 'policy.json');
  fs.writeFileSync(file, JSON.stringify(doc));
  return file;
}

describe('measurements', () => {
  it('a synth without measurements fails and says how to give them', () => {
    assert.throws(() => loadMeasurements(ctx({})), (e: Error) => e instanceof ConfigError && /-c pcr0=/.test(e.message) && /policyFile/.test(e.message));
  });

  it('takes -c pcr0 and -c pcr8, lower-cased', () => {
    const m = loadMeasurements(ctx({ pcr0: TEST_PCR0.toUpperCase(), pcr8: TEST_PCR8 }));
    assert.equal(m.pcr0, TEST_PCR0);
    assert.equal(m.pcr8, TEST_PCR8);
  });

  it('pcr8 is optional', () => {
    assert.equal(loadMeasurements(ctx({ pcr0: TEST_PCR0 })).pcr8, undefined);
  });

  for (const bad of ['abc', 'g'.repeat(96), 'a'.repeat(95), 'a'.repeat(97), '0x' + 'a'.repeat(94)]) {
    it(`refuses a malformed value (${bad.slice(0, 12)}..., ${bad.length} chars)`, () => {
      assert.throws(() => loadMeasurements(ctx({ pcr0: bad })), ConfigError);
    });
  }

  it('refuses all-zero PCRs (debug-mode enclaves)', () => {
    assert.throws(() => loadMeasurements(ctx({ pcr0: '0'.repeat(96) })), /debug/);
  });

  it('reads only the pcrs of a policy file', () => {
    const file = tempPolicy({ root: 'aws-nitro-g1', pcrs: { '0': TEST_PCR0, '1': 'c1'.repeat(48), '2': 'c2'.repeat(48), '8': TEST_PCR8 }, allow_debug: false, max_age_s: 3600, signature: 'x' });
    const m = loadMeasurements(ctx({ policyFile: file }));
    assert.equal(m.pcr0, TEST_PCR0);
    assert.equal(m.pcr8, TEST_PCR8);
    assert.match(m.source, /policy file/);
  });

  it('a policy file without PCR8 binds PCR0 only', () => {
    const file = tempPolicy({ pcrs: { '0': TEST_PCR0, '1': 'c1'.repeat(48), '2': 'c2'.repeat(48) } });
    assert.equal(loadMeasurements(ctx({ policyFile: file })).pcr8, undefined);
  });

  it('refuses a policy file without pcrs.0, a missing file, and giving both sources', () => {
    assert.throws(() => loadMeasurements(ctx({ policyFile: tempPolicy({ pcrs: { '1': TEST_PCR0 } }) })), /PCR0/);
    assert.throws(() => loadMeasurements(ctx({ policyFile: '/nonexistent/policy.json' })), /cannot read/);
    assert.throws(() => loadMeasurements(ctx({ policyFile: tempPolicy({ pcrs: { '0': TEST_PCR0 } }), pcr0: TEST_PCR0 })), /not both/);
  });
});

describe('deploy configuration', () => {
  it('has sensible defaults', () => {
    const c = loadConfig(ctx({ pcr0: TEST_PCR0 }));
    assert.equal(c.instanceType, 'm6i.xlarge');
    assert.equal(c.enclaveCpuCount, 2);
    assert.deepEqual(c.storePrefixes, ['stores/']);
    assert.equal(c.ledgerRetentionDays, 30);
    assert.equal(c.ledgerLockMode, 'governance');
    assert.equal(c.ledgerReservedConcurrency, undefined);
    assert.equal(c.alarmEmail, undefined);
    assert.ok(c.lambdaAssetsDir.endsWith(path.join('target', 'lambda')));
  });

  it('parses numbers given as strings on the command line, and refuses nonsense', () => {
    assert.equal(loadConfig(ctx({ pcr0: TEST_PCR0, maxHosts: '10' })).maxHosts, 10);
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, maxHosts: 'ten' })), ConfigError);
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, minHosts: '5', maxHosts: '2' })), /maxHosts/);
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, enclaveCpuCount: '3' })), /even/);
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, ledgerLockMode: 'legal-hold' })), /governance or compliance/);
    assert.equal(loadConfig(ctx({ pcr0: TEST_PCR0, ledgerLockMode: 'compliance' })).ledgerLockMode, 'compliance');
    assert.equal(loadConfig(ctx({ pcr0: TEST_PCR0, ledgerReservedConcurrency: '1' })).ledgerReservedConcurrency, 1);
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, alarmEmail: 'not an address' })), /e-mail/);
    const witness = 'w1.example+1a2b3c4d+BPwE7Bbd3Wq1QVm5y0OZnL5JUGlmtGJd7aCgQ6oiZAeP@http://witness.example:7380/w';
    assert.deepEqual(loadConfig(ctx({ pcr0: TEST_PCR0 })).witnesses, []);
    assert.deepEqual(loadConfig(ctx({ pcr0: TEST_PCR0, witnesses: ` ${witness}, ` })).witnesses, [witness]);
    for (const bad of ['w1.example@http://h:1', `${witness.split('@')[0]}@https://h:1`, `${witness.split('@')[0]}@http://h`]) {
      assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, witnesses: bad })), /witnesses/, bad);
    }
  });

  it('the hosts\' AMI is pinned: -c hostAmi, else a lookup where the CLI deploys, else the synth stops', () => {
    const none = (key: string) => (({ pcr0: TEST_PCR0 }) as Record<string, unknown>)[key];
    assert.deepEqual(hostImage(ctx({}), {}), { kind: 'ami', imageId: TEST_AMI });
    assert.deepEqual(hostImage(none, { CDK_DEFAULT_ACCOUNT: '123456789012', CDK_DEFAULT_REGION: 'ap-southeast-5' }), {
      kind: 'lookup', account: '123456789012', region: 'ap-southeast-5',
    });
    // -c hostAmi wins over the lookup.
    assert.equal(hostImage(ctx({}), { CDK_DEFAULT_ACCOUNT: '123456789012', CDK_DEFAULT_REGION: 'eu-west-1' }).kind, 'ami');
    assert.throws(() => loadConfig(none, {}), (e: Error) => e instanceof ConfigError && /-c hostAmi=ami-/.test(e.message) && /cdk\.context\.json/.test(e.message));
    assert.throws(() => hostImage(none, { CDK_DEFAULT_REGION: 'eu-west-1' }), ConfigError);
    for (const bad of ['ami-123', 'ami-XYZ45678', 'i-0123456789abcdef0', 'ami-0123456789abcdef01']) {
      assert.throws(() => hostImage(ctx({ hostAmi: bad }), {}), /hostAmi must be an AMI id/, bad);
    }
  });

  it('refuses the former inputRetentionDays instead of ignoring it (inputs expire with their job)', () => {
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, inputRetentionDays: '1' })), (e: Error) => e instanceof ConfigError && /jobsRetentionDays/.test(e.message));
    assert.equal(loadConfig(ctx({ pcr0: TEST_PCR0, jobsRetentionDays: '7' })).jobsRetentionDays, 7);
  });

  it('refuses the former rotationDays instead of ignoring it (enclaves create the epochs)', () => {
    assert.throws(() => loadConfig(ctx({ pcr0: TEST_PCR0, rotationDays: '7' })), (e: Error) => e instanceof ConfigError && /rotationDays is no longer a setting/.test(e.message));
  });

  it('store prefixes must not overlap each other or jobs/', () => {
    assert.doesNotThrow(() => checkPrefixes(['store/', 'tenants/acme/', 'tenants/globex/']));
    assert.throws(() => checkPrefixes(['tenants/', 'tenants/acme/']), /overlap/);
    assert.throws(() => checkPrefixes(['jobs/x/']), /reserved/);
    assert.throws(() => checkPrefixes(['store']), /ending with/);
    assert.deepEqual(loadConfig(ctx({ pcr0: TEST_PCR0, storePrefixes: 'tenants/acme/, tenants/globex/' })).storePrefixes, ['tenants/acme/', 'tenants/globex/']);
  });
});
