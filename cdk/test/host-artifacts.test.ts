// The enclave image and host-poller are CDK assets named by their content (issue 19 item 1): the
// launch template names their keys and SHA-256, the host checks both before it runs anything, a
// new image is a new launch template version, and the hosts may read exactly those two objects.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { App, FileSystem, Stack } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import { FEATURE_FLAGS, buildApp } from '../lib/app';
import { ConfigError } from '../lib/config';
import { EphemBatch } from '../lib/ephem-batch';
import { NO_IMAGE_RULE_ID, placeholderText, sha256File } from '../lib/host-artifacts';
import { CfnTemplate, asArray, defaultStack, identityStatements, resourcesOfType, synth } from './helpers';

const ASSETS_BUCKET = { 'Fn::Sub': 'cdk-hnb659fds-assets-${AWS::AccountId}-${AWS::Region}' };

/** An image and a poller in a directory of their own, as step 2 of scripts/deploy.sh leaves them. */
function files(eifContent: string, pollerContent = 'host-poller v1'): { dir: string; eif: string; poller: string } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-image-'));
  fs.writeFileSync(path.join(dir, 'enclave.eif'), eifContent);
  fs.writeFileSync(path.join(dir, 'host-poller'), pollerContent);
  return { dir, eif: path.join(dir, 'enclave.eif'), poller: path.join(dir, 'host-poller') };
}

function withFiles(f: { eif: string; poller: string }, context: Record<string, unknown> = {}) {
  return synth({ enclaveEif: f.eif, hostPoller: f.poller, ...context });
}

function userData(t: CfnTemplate): unknown[] {
  const [[, lt]] = resourcesOfType(t, 'AWS::EC2::LaunchTemplate');
  return lt.Properties?.LaunchTemplateData?.UserData['Fn::Base64']['Fn::Join'][1] as unknown[];
}

/** The boot script with the assets bucket's name as <assets> and other values as JSON. */
function script(t: CfnTemplate): string {
  return userData(t)
    .map((p) => (typeof p === 'string' ? p : JSON.stringify(p) === JSON.stringify(ASSETS_BUCKET) ? '<assets>' : JSON.stringify(p)))
    .join('');
}

const sha256 = (text: string) => crypto.createHash('sha256').update(text).digest('hex');

describe('enclave image and host-poller: content-addressed assets', () => {
  const a = files('EIF image A');
  const synthA = withFiles(a);
  const scriptA = script(synthA.json);
  const eifKeyA = `${FileSystem.fingerprint(a.eif)}.eif`;

  it('user data fetches each from its content-named key in the CDK assets bucket and checks its SHA-256 before the PCR0 check and before anything runs', () => {
    const fetchEif = scriptA.indexOf(`fetch s3://<assets>/${eifKeyA} /opt/ephem-batch/enclave.eif\n`);
    const checkEif = scriptA.indexOf(`check_sha256 /opt/ephem-batch/enclave.eif ${sha256('EIF image A')}\n`);
    const pollerKey = synthA.stack.fleet.artifacts.hostPoller.asset.s3ObjectKey;
    assert.ok(pollerKey.startsWith(FileSystem.fingerprint(a.poller)), pollerKey);
    const fetchPoller = scriptA.indexOf(`fetch s3://<assets>/${pollerKey} /opt/ephem-batch/host-poller\n`);
    const checkPoller = scriptA.indexOf(`check_sha256 /opt/ephem-batch/host-poller ${sha256('host-poller v1')}\n`);
    const pcr0 = scriptA.indexOf('nitro-cli describe-eif');
    const run = scriptA.indexOf('systemctl enable --now ephem-kms-proxy.service');
    for (const [name, at] of Object.entries({ fetchEif, checkEif, fetchPoller, checkPoller, pcr0, run })) assert.ok(at > 0, `${name} in user data`);
    assert.ok(fetchEif < checkEif && checkEif < fetchPoller && fetchPoller < checkPoller && checkPoller < pcr0 && pcr0 < run, 'fetch, SHA-256, PCR0, run');
    assert.ok(scriptA.indexOf('chmod 0755 /opt/ephem-batch/host-poller') > checkPoller, 'the poller is made executable only once checked');
  });

  it('no fixed artifact key remains, in user data or any policy', () => {
    for (const t of [synthA.json, defaultStack().json]) {
      const text = JSON.stringify(t.Resources);
      for (const fixed of ['artifacts/enclave.eif', 'artifacts/host-poller']) assert.ok(!text.includes(fixed), fixed);
    }
  });

  it('a swapped object fails the boot, naming the SHA-256 check; the object it was made for passes', () => {
    const fn = /\ncheck_sha256\(\) \{\n[\s\S]*?\n\}\n/.exec(scriptA)?.[0];
    assert.ok(fn, 'check_sha256 is defined in user data');
    const run = (file: string) => spawnSync('bash', ['-c', `set -euo pipefail\n${fn}\ncheck_sha256 "$1" ${sha256('EIF image A')}\necho started`, 'boot', file], { encoding: 'utf8' });
    const good = run(a.eif);
    assert.equal(good.status, 0, good.stderr);
    assert.match(good.stdout, /SHA-256 check passed: .*enclave\.eif is [0-9a-f]{64}\nstarted\n$/);
    const swapped = files('EIF image B, uploaded over A').eif;
    const bad = run(swapped);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /^SHA-256 check failed: .*enclave\.eif has SHA-256 [0-9a-f]{64}, but this launch template names [0-9a-f]{64}/);
    assert.ok(!bad.stdout.includes('started'), 'nothing after the check runs');
  });

  it('two different images give two different launch template user data (keys and digests); the same files give the same', () => {
    const b = files('EIF image B');
    const scriptB = script(withFiles(b).json);
    assert.notEqual(scriptA, scriptB);
    assert.ok(!scriptB.includes(eifKeyA) && !scriptB.includes(sha256('EIF image A')), 'nothing of image A in B\'s user data');
    assert.ok(scriptB.includes(`${FileSystem.fingerprint(b.eif)}.eif /opt/ephem-batch/enclave.eif`));
    assert.ok(scriptB.includes(`check_sha256 /opt/ephem-batch/enclave.eif ${sha256('EIF image B')}`));
    // The same poller: the same lines for it.
    const pollerLines = (s: string) => s.split('\n').filter((l) => l.includes('/opt/ephem-batch/host-poller ')).join('\n');
    assert.equal(pollerLines(scriptA), pollerLines(scriptB));
    // The same content elsewhere (another build directory): nothing changes, no fleet roll.
    assert.deepEqual(userData(withFiles(files('EIF image A')).json), userData(synthA.json));
  });

  it('the group follows the launch template\'s latest version and rolls onto it one host at a time', () => {
    const [[ltId]] = resourcesOfType(synthA.json, 'AWS::EC2::LaunchTemplate');
    const [[, asg]] = resourcesOfType(synthA.json, 'AWS::AutoScaling::AutoScalingGroup');
    assert.deepEqual(asg.Properties?.LaunchTemplate?.Version, { 'Fn::GetAtt': [ltId, 'LatestVersionNumber'] });
    assert.equal(asg.UpdatePolicy?.AutoScalingRollingUpdate?.MaxBatchSize, 1);
  });

  it('the host role reads exactly those two objects of the assets bucket, nothing else of it, and no role writes them', () => {
    const { enclaveEif, hostPoller } = synthA.stack.fleet.artifacts;
    const onAssets = identityStatements(synthA.json).filter(({ statement: s }) => JSON.stringify(s.Resource ?? '').includes('assets-${AWS::AccountId}'));
    assert.deepEqual(onAssets.map(({ owner, statement: s }) => [owner.replace(/[0-9A-F]{8}$/, ''), s.Sid, s.Action]), [['IdentitiesHostRoleDefaultPolicy', 'FetchArtifacts', 's3:GetObject']]);
    const keys = asArray<any>(onAssets[0].statement.Resource).map((r) => {
      const parts = r['Fn::Join'][1] as unknown[];
      assert.deepEqual(parts.slice(0, 4), ['arn:', { Ref: 'AWS::Partition' }, ':s3:::', ASSETS_BUCKET]);
      return parts[4];
    });
    assert.deepEqual(keys, [`/${enclaveEif.asset.s3ObjectKey}`, `/${hostPoller.asset.s3ObjectKey}`]);
    assert.ok(keys.every((k) => !String(k).includes('*')), 'no pattern');
  });

  it('cdk deploy publishes both files, staged byte for byte under those keys', () => {
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-out-'));
    const zips = fs.mkdtempSync(path.join(os.tmpdir(), 'ephem-zips-'));
    for (const name of ['on-upload', 'ledger-append', 'bulk-list-shards', 'bulk-await-shard', 'bulk-aggregate', 'job-dead-letter']) {
      fs.mkdirSync(path.join(zips, name));
      fs.writeFileSync(path.join(zips, name, 'bootstrap.zip'), name);
    }
    const { app, stack } = buildApp({ pcr0: 'a0'.repeat(48), hostAmi: 'ami-0123456789abcdef0', lambdaAssetsDir: zips, enclaveEif: a.eif, hostPoller: a.poller }, out, {});
    const dir = app.synth().directory;
    const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'EphemBatch.assets.json'), 'utf8'));
    for (const artifact of [stack.fleet.artifacts.enclaveEif, stack.fleet.artifacts.hostPoller]) {
      const entries = Object.values(manifest.files as Record<string, any>).filter((f) =>
        Object.values(f.destinations as Record<string, any>).some((d) => d.objectKey === artifact.asset.s3ObjectKey),
      );
      assert.equal(entries.length, 1, artifact.asset.s3ObjectKey);
      assert.equal(entries[0].source.packaging, 'file');
      assert.equal(sha256File(path.join(dir, entries[0].source.path)), artifact.sha256);
    }
    assert.deepEqual(imageRules(JSON.parse(fs.readFileSync(path.join(dir, 'EphemBatch.template.json'), 'utf8'))), [], 'no placeholder rule');
  });

  it('without the files, placeholders stand in and a rule makes the template undeployable; with them, no such rule', () => {
    const { json, stack } = defaultStack();
    const { placeholder, enclaveEif, hostPoller } = stack.fleet.artifacts;
    assert.equal(placeholder, true);
    assert.equal(enclaveEif.sha256, sha256(placeholderText('enclave.eif')));
    assert.equal(hostPoller.sha256, sha256(placeholderText('host-poller')));
    assert.notEqual(enclaveEif.asset.s3ObjectKey, hostPoller.asset.s3ObjectKey);
    const [rule] = imageRules(json);
    assert.ok(rule, 'the rule is in the template');
    const [assertion] = rule.Assertions;
    // An assertion that never holds: no account id is that string.
    assert.deepEqual(assertion.Assert['Fn::Equals'], [{ Ref: 'AWS::AccountId' }, 'synthesized without an enclave image']);
    assert.match(assertion.AssertDescription, /-c enclaveEif=PATH -c hostPoller=PATH/);
    assert.equal(synthA.stack.fleet.artifacts.placeholder, false);
    assert.deepEqual(imageRules(synthA.json), []);
  });

  it('both or neither; a path that is not a file is a synth error saying where step 2 puts them', () => {
    const isConfig = (re: RegExp) => (e: Error) => e instanceof ConfigError && re.test(e.message);
    assert.throws(() => synth({ enclaveEif: a.eif }), isConfig(/both -c enclaveEif=PATH and -c hostPoller=PATH.*got only enclaveEif/));
    assert.throws(() => synth({ hostPoller: a.poller }), isConfig(/got only hostPoller/));
    assert.throws(() => synth({ enclaveEif: path.join(a.dir, 'missing.eif'), hostPoller: a.poller }), isConfig(/enclaveEif: .*missing\.eif is not a file.*dist\/enclave\/<commit>/));
    assert.throws(() => synth({ enclaveEif: a.eif, hostPoller: a.dir }), isConfig(/hostPoller: .* is not a file/));
  });

  it('a CDK user gives them as props of the construct', () => {
    const app = new App({ context: { ...FEATURE_FLAGS, 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(app, 'Platform', { env: { account: '111122223333', region: 'eu-west-1' } });
    const batch = new EphemBatch(stack, 'Embeddings', {
      measurements: { pcr0: 'a0'.repeat(48), source: 'test' },
      hostImage: { kind: 'ami', imageId: 'ami-0123456789abcdef0' },
      enclaveEif: a.eif,
      hostPoller: a.poller,
    });
    const t = Template.fromStack(stack).toJSON() as CfnTemplate;
    assert.equal(batch.fleet.artifacts.enclaveEif.sha256, sha256('EIF image A'));
    assert.ok(JSON.stringify(userData(t)).includes(`check_sha256 /opt/ephem-batch/enclave.eif ${sha256('EIF image A')}`));
    assert.deepEqual(imageRules(t), []);
  });
});

/** The template's rules that refuse a deployment without the enclave image. */
function imageRules(t: CfnTemplate): any[] {
  return Object.entries((t.Rules ?? {}) as Record<string, any>)
    .filter(([id]) => id.includes(NO_IMAGE_RULE_ID))
    .map(([, r]) => r);
}
