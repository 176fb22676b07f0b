// The key policies, byte for byte. Nobody may PutKeyPolicy (keys.ts), so a deployment whose
// template renders a key's policy differently — a CDK upgrade, a feature flag, a new statement
// order — cannot be updated at all. The snapshot makes any such change a failing test; a change
// meant on purpose comes with a new key (a new logical id) and `EPHEM_UPDATE_SNAPSHOTS=1`.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { repoRoot } from '../lib/config';
import { defaultStack, resourcesOfType, synth } from './helpers';

const SNAPSHOT = path.join(repoRoot(), 'cdk', 'test', 'snapshots', 'key-policies.json');

/** Every key's logical id and its policy as the template states it (statements in order). */
function rendered(json: ReturnType<typeof synth>['json']): Record<string, unknown> {
  return Object.fromEntries(resourcesOfType(json, 'AWS::KMS::Key').map(([id, key]) => [id, key.Properties?.KeyPolicy]));
}

describe('key policies', () => {
  it('render exactly as recorded (with PCR8, and without)', () => {
    const now = { withPcr8: rendered(defaultStack().json), pcr0Only: rendered(synth().json) };
    if (process.env.EPHEM_UPDATE_SNAPSHOTS === '1') {
      fs.writeFileSync(SNAPSHOT, JSON.stringify(now, null, 2) + '\n');
    }
    const recorded = JSON.parse(fs.readFileSync(SNAPSHOT, 'utf8'));
    assert.deepEqual(now, recorded, 'a key policy renders differently: that key can no longer be updated (see the comment above)');
  });
});
