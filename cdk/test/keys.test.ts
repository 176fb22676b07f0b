// The key policies are the root of confidentiality (DESIGN.md §3): test every clause.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { EVIDENCE_ACTIONS, FORBIDDEN_ACTIONS, IMAGE_SHA384_KEY, PCR8_KEY, RELEASE_ACTIONS } from '../lib/keys';
import { CfnResourceJson, TEST_PCR0, TEST_PCR8, asArray, defaultStack, identityStatements, referencedId, resourcesOfType, synth } from './helpers';

const { json, stack } = defaultStack();
const keys = resourcesOfType(json, 'AWS::KMS::Key');
const roleId = (path: string) => stack.getLogicalId(stack.identities.node.findChild(path).node.defaultChild as any);
const HOST = roleId('HostRole');
const LEDGER = roleId('LedgerAppendRole');
const PUBLISHER = roleId('ModelPublisherRole');
const BREAK_GLASS = roleId('KeyBreakGlassRole');

function keyByDescription(prefix: string): CfnResourceJson {
  const found = keys.filter(([, k]) => String(k.Properties?.Description).startsWith(prefix));
  assert.equal(found.length, 1, `one key described "${prefix}..."`);
  return found[0][1];
}
const fleetKey = keyByDescription('ephem-batch fleet key');
const modelKey = keyByDescription('ephem-batch model key');
const ledgerKey = keyByDescription('ephem-batch ledger checkpoint signing key');
const statements = (k: CfnResourceJson): any[] => asArray(k.Properties?.KeyPolicy?.Statement);
const actionsOf = (s: any): string[] => asArray(s.Action);
const principalOf = (s: any): string | undefined => referencedId(s.Principal?.AWS);
const isAccountRoot = (s: any): boolean => JSON.stringify(s.Principal?.AWS ?? '').includes(':root');

describe('KMS keys', () => {
  it('are exactly three: fleet, model, ledger signing', () => {
    assert.equal(keys.length, 3);
  });

  for (const [name, key] of Object.entries({ fleet: fleetKey, model: modelKey, ledger: ledgerKey })) {
    describe(`${name} key policy`, () => {
      it('bypasses the lockout safety check on purpose and is retained', () => {
        assert.equal(key.Properties?.BypassPolicyLockoutSafetyCheck, true);
        assert.equal(key.DeletionPolicy, 'Retain');
      });
      it('allows kms:* to no one, and PutKeyPolicy, CreateGrant, ReEncrypt* to no one', () => {
        for (const s of statements(key).filter((x) => x.Effect === 'Allow')) {
          for (const a of actionsOf(s)) {
            assert.notEqual(a, 'kms:*', `statement ${s.Sid} allows kms:*`);
            assert.notEqual(a, '*', `statement ${s.Sid} allows *`);
            assert.ok(!/^kms:(PutKeyPolicy|CreateGrant|ReEncrypt)/.test(a), `statement ${s.Sid} allows ${a}`);
            assert.ok(!a.includes('*'), `statement ${s.Sid} has wildcard action ${a}`);
          }
        }
      });
      it('explicitly denies PutKeyPolicy, CreateGrant, ReEncrypt* and Import* to everyone (and Encrypt, under the fleet key)', () => {
        const deny = statements(key).find((s) => s.Effect === 'Deny' && s.Principal?.AWS === '*' && s.Condition === undefined);
        assert.ok(deny, 'an unconditional Deny statement');
        const expected = name === 'fleet' ? [...FORBIDDEN_ACTIONS, 'kms:Encrypt'] : FORBIDDEN_ACTIONS;
        assert.deepEqual([...actionsOf(deny)].sort(), [...expected].sort());
        for (const a of ['kms:PutKeyPolicy', 'kms:CreateGrant', 'kms:ReEncrypt*', 'kms:Import*']) assert.ok(actionsOf(deny).includes(a), a);
      });
      it('has the kill switch: the break-glass role may DisableKey and EnableKey, and nothing else anywhere', () => {
        const glass = statements(key).filter((s) => principalOf(s) === BREAK_GLASS);
        assert.equal(glass.length, 1);
        assert.equal(glass[0].Effect, 'Allow');
        assert.deepEqual([...actionsOf(glass[0])].sort(), ['kms:DisableKey', 'kms:EnableKey']);
        assert.equal(glass[0].Condition, undefined);
        // Nobody else may disable or enable it (the account root neither).
        for (const s of statements(key).filter((x) => x.Effect === 'Allow' && principalOf(x) !== BREAK_GLASS)) {
          assert.ok(!actionsOf(s).some((a) => a === 'kms:DisableKey' || a === 'kms:EnableKey'), `${s.Sid} may disable or enable the key`);
        }
      });
      it('gives the account root only reading and lifecycle operations', () => {
        const allowed = statements(key)
          .filter((s) => s.Effect === 'Allow' && isAccountRoot(s))
          .flatMap(actionsOf);
        const permitted = new Set([
          'kms:DescribeKey', 'kms:GetKeyPolicy', 'kms:GetKeyRotationStatus', 'kms:ListResourceTags', 'kms:ListGrants', 'kms:GetPublicKey',
          'kms:TagResource', 'kms:UntagResource', 'kms:ScheduleKeyDeletion', 'kms:CancelKeyDeletion', 'kms:EnableKeyRotation',
        ]);
        for (const a of allowed) assert.ok(permitted.has(a), `account root may ${a}`);
        assert.ok(allowed.includes('kms:GetKeyPolicy'), 'clients may read the key policy');
        for (const forbidden of [...RELEASE_ACTIONS, 'kms:Encrypt', 'kms:Sign', 'kms:DisableKey', 'kms:UpdateKeyDescription']) {
          assert.ok(!allowed.includes(forbidden), `account root may not ${forbidden}`);
        }
      });
    });
  }

  for (const [name, key, released] of [
    ['fleet', fleetKey, ['kms:Decrypt']],
    ['model', modelKey, ['kms:Decrypt', 'kms:GenerateDataKey']],
  ] as const) {
    describe(`${name} key: release only to the attested enclave`, () => {
      it(`allows ${released.join(' and ')} to the host role only with ImageSha384 = PCR0 and PCR8 exact`, () => {
        const allows = statements(key).filter((s) => s.Effect === 'Allow' && principalOf(s) === HOST && actionsOf(s).some((a) => a === 'kms:Decrypt'));
        assert.equal(allows.length, 1);
        const s = allows[0];
        assert.deepEqual([...actionsOf(s)].sort(), [...released].sort());
        assert.deepEqual(s.Condition, { StringEqualsIgnoreCase: { [IMAGE_SHA384_KEY]: TEST_PCR0, [PCR8_KEY]: TEST_PCR8 } });
      });
      it('every Allow of a release operation carries the attestation condition', () => {
        for (const s of statements(key).filter((x) => x.Effect === 'Allow')) {
          if (actionsOf(s).some((a) => RELEASE_ACTIONS.includes(a))) {
            assert.equal(s.Condition?.StringEqualsIgnoreCase?.[IMAGE_SHA384_KEY], TEST_PCR0, `statement ${s.Sid}`);
          }
        }
      });
      it('denies release to everyone when the attestation is absent (Null check) or names another image', () => {
        const denies = statements(key).filter((s) => s.Effect === 'Deny' && s.Principal?.AWS === '*' && s.Condition);
        const has = (cond: object) =>
          denies.some((s) => JSON.stringify(s.Condition) === JSON.stringify(cond) && RELEASE_ACTIONS.every((a) => actionsOf(s).includes(a)));
        assert.ok(has({ Null: { [IMAGE_SHA384_KEY]: 'true' } }), 'Deny when ImageSha384 is absent');
        assert.ok(has({ StringNotEqualsIgnoreCase: { [IMAGE_SHA384_KEY]: TEST_PCR0 } }), 'Deny when ImageSha384 differs');
        assert.ok(has({ Null: { [PCR8_KEY]: 'true' } }), 'Deny when PCR8 is absent');
        assert.ok(has({ StringNotEqualsIgnoreCase: { [PCR8_KEY]: TEST_PCR8 } }), 'Deny when PCR8 differs');
      });
    });
  }

  it('fleet key: the host role has exactly three statements: attested Decrypt, attested new epochs, the key evidence', () => {
    const forHost = statements(fleetKey).filter((s) => s.Effect === 'Allow' && principalOf(s) === HOST);
    assert.deepEqual(forHost.map((s) => s.Sid), ['AllowAttestedEnclaveDecrypt', 'AllowAttestedEnclaveNewEpochKeyPairs', 'AllowHostReadKeyEvidence']);
    // The model and ledger keys give it no evidence reads (nor anything else but the model key's release).
    for (const k of [modelKey, ledgerKey]) {
      assert.ok(!statements(k).some((s) => s.Effect === 'Allow' && principalOf(s) === HOST && actionsOf(s).some((a) => EVIDENCE_ACTIONS.includes(a))));
    }
  });

  it('fleet key: the host role may GenerateDataKeyPair only for the attested image (PCR0 and PCR8), P-256, under {epoch, not_after}', () => {
    // Epochs are created by enclaves (docs/protocol.md §7.3.1); without its attestation condition
    // this statement would let the host have KMS make a pair and return it in plaintext.
    const creating = statements(fleetKey).filter((s) => s.Effect === 'Allow' && actionsOf(s).some((a) => a.startsWith('kms:GenerateDataKeyPair')));
    assert.equal(creating.length, 1, 'one statement creates epochs');
    const [s] = creating;
    assert.equal(s.Sid, 'AllowAttestedEnclaveNewEpochKeyPairs');
    assert.equal(principalOf(s), HOST);
    assert.deepEqual(actionsOf(s), ['kms:GenerateDataKeyPair']);
    assert.deepEqual(s.Condition, {
      StringEqualsIgnoreCase: { [IMAGE_SHA384_KEY]: TEST_PCR0, [PCR8_KEY]: TEST_PCR8 },
      StringEquals: { 'kms:DataKeyPairSpec': 'ECC_NIST_P256' },
      Null: { 'kms:EncryptionContext:epoch': 'false', 'kms:EncryptionContext:not_after': 'false' },
    });
    // Without PCR8 the condition binds PCR0 alone, still.
    const pcr0Only = resourcesOfType(synth().json, 'AWS::KMS::Key').find(([, k]) => String(k.Properties?.Description).startsWith('ephem-batch fleet key'))![1];
    const s0 = statements(pcr0Only).find((x) => x.Sid === 'AllowAttestedEnclaveNewEpochKeyPairs');
    assert.deepEqual(s0?.Condition?.StringEqualsIgnoreCase, { [IMAGE_SHA384_KEY]: TEST_PCR0 });
    // The pair is never generated without plaintext for anyone (a pair only its caller's KMS key wraps).
    for (const k of [fleetKey, modelKey, ledgerKey]) {
      assert.ok(!statements(k).some((x) => x.Effect === 'Allow' && actionsOf(x).includes('kms:GenerateDataKeyPairWithoutPlaintext')));
    }
  });

  it('fleet key: the host role reads the key evidence (DescribeKey, GetKeyPolicy, ListGrants), unconditionally and nothing more', () => {
    const reads = statements(fleetKey).find((s) => s.Sid === 'AllowHostReadKeyEvidence');
    assert.ok(reads);
    assert.equal(reads.Effect, 'Allow');
    assert.equal(principalOf(reads), HOST);
    assert.deepEqual([...actionsOf(reads)].sort(), ['kms:DescribeKey', 'kms:GetKeyPolicy', 'kms:ListGrants']);
    assert.equal(reads.Condition, undefined);
  });

  it('model key: the publisher may only Encrypt, with {model_id, version} in the context', () => {
    const forPublisher = statements(modelKey).filter((s) => s.Effect === 'Allow' && principalOf(s) === PUBLISHER);
    assert.equal(forPublisher.length, 1);
    assert.deepEqual(actionsOf(forPublisher[0]), ['kms:Encrypt']);
    assert.deepEqual(Object.keys(forPublisher[0].Condition.Null).sort(), ['kms:EncryptionContext:model_id', 'kms:EncryptionContext:version']);
  });

  it('ledger key: a separate Ed25519 signing key that only ledger-append may use to sign', () => {
    assert.equal(ledgerKey.Properties?.KeySpec, 'ECC_NIST_EDWARDS25519');
    assert.equal(ledgerKey.Properties?.KeyUsage, 'SIGN_VERIFY');
    const signers = statements(ledgerKey).filter((s) => s.Effect === 'Allow' && actionsOf(s).includes('kms:Sign'));
    assert.equal(signers.length, 1);
    assert.equal(principalOf(signers[0]), LEDGER);
    assert.ok(!statements(ledgerKey).some((s) => principalOf(s) === HOST), 'hosts cannot touch the ledger key');
  });

  it('ledger key: its policy itself lets ledger-append make both calls it makes (GetPublicKey at start, Sign)', () => {
    // No identity policy grants KMS calls (next test), so a statement naming the account root
    // only delegates to IAM, which grants nothing: the role must be named in the key policy.
    const allowed = (action: string) =>
      statements(ledgerKey).some((s) => s.Effect === 'Allow' && principalOf(s) === LEDGER && actionsOf(s).includes(action));
    for (const action of ['kms:GetPublicKey', 'kms:Sign']) assert.ok(allowed(action), `ledger-append may not call ${action}`);
  });

  it('a policy that changed is a new key (a versioned logical id), since nobody may PutKeyPolicy; an unchanged one keeps its key', () => {
    const idOf = (prefix: string) => resourcesOfType(json, 'AWS::KMS::Key').filter(([, k]) => String(k.Properties?.Description).startsWith(prefix))[0][0];
    // V4 changed the fleet key's policy only (enclaves create epochs): the model and ledger keys stay V3.
    assert.match(idOf('ephem-batch fleet key'), /^KeysFleetKeyV4/);
    assert.match(idOf('ephem-batch model key'), /^KeysModelKeyV3/);
    assert.match(idOf('ephem-batch ledger'), /^KeysLedgerSigningKeyV3/);
  });

  it('under the model key only the publisher role may Encrypt: a Deny for every other principal, by aws:PrincipalArn', () => {
    const deny = statements(modelKey).find((s) => s.Sid === 'DenyEncryptButPublisher');
    assert.ok(deny);
    assert.equal(deny.Effect, 'Deny');
    assert.equal(deny.Principal?.AWS, '*');
    assert.deepEqual(actionsOf(deny), ['kms:Encrypt']);
    assert.equal(referencedId(deny.Condition?.ArnNotEquals?.['aws:PrincipalArn']), PUBLISHER);
    // The fleet key: nobody at all (the unconditional Deny above), and no Allow of it either.
    assert.ok(!statements(fleetKey).some((s) => s.Effect === 'Allow' && actionsOf(s).includes('kms:Encrypt')));
  });

  it('the break-glass role is assumed by the account with MFA only, and holds no policy of its own', () => {
    const role = json.Resources[BREAK_GLASS];
    const trust = asArray<any>(role.Properties?.AssumeRolePolicyDocument?.Statement);
    assert.equal(trust.length, 1);
    assert.deepEqual(trust[0].Condition, { Bool: { 'aws:MultiFactorAuthPresent': 'true' } });
    assert.equal(role.Properties?.Policies, undefined);
    assert.equal(role.Properties?.ManagedPolicyArns, undefined);
    assert.ok(!identityStatements(json).some(({ owner }) => owner.startsWith('IdentitiesKeyBreakGlassRole')), 'no identity policy');
    assert.ok(json.Outputs?.KeyBreakGlassRoleArn, 'KeyBreakGlassRoleArn output');
  });

  it('an incoming image (-c nextPcr0) gets its own fleet and model keys first; only its enclaves create epochs under its fleet key', () => {
    const next = 'dd'.repeat(48);
    const { json: j } = synth({ nextPcr0: next });
    const k = resourcesOfType(j, 'AWS::KMS::Key');
    assert.equal(k.length, 5, 'fleet and model keys of both images, and the ledger key');
    const bound = (prefix: string, pcr0: string) => k.filter(([, x]) => String(x.Properties?.Description).startsWith(prefix)
      && JSON.stringify(x.Properties?.KeyPolicy).includes(pcr0));
    for (const prefix of ['ephem-batch fleet key', 'ephem-batch model key']) {
      assert.equal(bound(prefix, TEST_PCR0).length, 1, `${prefix} of the running image`);
      assert.equal(bound(prefix, next).length, 1, `${prefix} of the incoming image`);
    }
    // The running image's keys keep their logical ids (an incoming image never replaces them).
    const ids = (t: typeof j) => resourcesOfType(t, 'AWS::KMS::Key').map(([id]) => id);
    for (const id of ids(synth().json)) assert.ok(ids(j).includes(id), `${id} kept`);
    assert.ok(j.Outputs?.NextFleetKeyArn && j.Outputs?.NextModelKeyArn && j.Outputs?.NextImageSha384);
    const [[, nextFleet]] = bound('ephem-batch fleet key', next);
    const creates = statements(nextFleet).find((s) => s.Sid === 'AllowAttestedEnclaveNewEpochKeyPairs');
    assert.equal(creates?.Condition?.StringEqualsIgnoreCase?.[IMAGE_SHA384_KEY], next, 'the new image\'s enclaves, not the running ones');
    // The hosts still run the current image, with its fleet key: the new key's first epoch is made
    // by the first host of the new image (docs/operations.md §4).
    const [[runningFleetId]] = bound('ephem-batch fleet key', TEST_PCR0);
    const [[, lt]] = resourcesOfType(j, 'AWS::EC2::LaunchTemplate');
    const named = JSON.stringify(lt.Properties?.LaunchTemplateData?.UserData);
    assert.ok(named.includes(`"${runningFleetId}"`), 'the hosts name the running image\'s fleet key');
    assert.ok(!named.includes(`"${bound('ephem-batch fleet key', next)[0][0]}"`), 'not the incoming one');
    // The functions that check receipts name both images, so naming the incoming one changes their
    // configuration (warm instances, whose allow-list predates the new policy, are replaced) and a
    // function whose allow-list lacks either image refuses to start (lambdas/src/policies.rs).
    const images = (t: typeof j) => resourcesOfType(t, 'AWS::Lambda::Function')
      .map(([, f]) => f.Properties?.Environment?.Variables?.EPHEM_IMAGE_PCR0S)
      .filter((v) => v !== undefined);
    assert.equal(images(j).length, 2, 'ledger-append and bulk-aggregate');
    for (const v of images(j)) assert.equal(v, `${TEST_PCR0},${next}`);
    for (const v of images(synth().json)) assert.equal(v, TEST_PCR0, 'without an incoming image: the running one only');
  });

  it('no identity policy grants any KMS permission: keys are reachable only through their key policies', () => {
    for (const { owner, statement } of identityStatements(json)) {
      for (const a of asArray<string>(statement.Action)) {
        assert.ok(!a.startsWith('kms:') && a !== '*', `${owner} grants ${a}`);
      }
    }
  });

  it('PCR8 is optional: without it the policies bind PCR0 only', () => {
    const { json: j } = synth();
    const fleet = resourcesOfType(j, 'AWS::KMS::Key').find(([, k]) => String(k.Properties?.Description).startsWith('ephem-batch fleet key'))!;
    const text = JSON.stringify(fleet[1].Properties?.KeyPolicy);
    assert.ok(text.includes(IMAGE_SHA384_KEY));
    assert.ok(!text.includes(PCR8_KEY));
  });

  it('a new image means new keys (new logical ids), never an edited policy', () => {
    const other = synth({ pcr0: 'c3'.repeat(48), pcr8: TEST_PCR8 });
    const ids = (t: typeof json) => resourcesOfType(t, 'AWS::KMS::Key').map(([id]) => id).sort();
    const before = ids(json);
    const after = ids(other.json);
    const fleetAndModel = (xs: string[]) => xs.filter((x) => !x.includes('Ledger'));
    for (const id of fleetAndModel(after)) assert.ok(!before.includes(id), `${id} reused for another image`);
    // The ledger signing key does not depend on the image.
    assert.deepEqual(after.filter((x) => x.includes('Ledger')), before.filter((x) => x.includes('Ledger')));
  });

  it('fleet key: nobody may wrap material they chose under it (what `ephem-batch fleet check-key` checks)', () => {
    // A client pins the fleet key's ARN (check fleet_kms_key); that is only as strong as the key's
    // inability to wrap a private key someone knows: no Encrypt, ReEncrypt*, plaintext-returning
    // data keys, pairs generated without plaintext, imported material or replicas, for anyone. The
    // one pair generation allowed returns the private key to the attested enclave alone (above).
    const wraps = /^kms:(Encrypt|ReEncrypt|ImportKeyMaterial|GenerateDataKey$|GenerateDataKeyWithoutPlaintext|GenerateDataKeyPairWithoutPlaintext|ReplicateKey|CreateGrant|PutKeyPolicy)/;
    for (const s of statements(fleetKey).filter((x) => x.Effect === 'Allow')) {
      for (const a of actionsOf(s)) assert.ok(!wraps.test(a), `statement ${s.Sid} allows ${a} on the fleet key`);
    }
    // KMS makes the material (Origin AWS_KMS, the default) and the key stays in one Region.
    assert.ok(fleetKey.Properties?.Origin === undefined || fleetKey.Properties?.Origin === 'AWS_KMS');
    assert.notEqual(fleetKey.Properties?.MultiRegion, true);
    // The only statements that release (Decrypt) or create a pair require the image's PCR0.
    for (const s of statements(fleetKey).filter((x) => x.Effect === 'Allow' && actionsOf(x).some((a) => RELEASE_ACTIONS.includes(a)))) {
      assert.equal(s.Condition?.StringEqualsIgnoreCase?.[IMAGE_SHA384_KEY], TEST_PCR0, `statement ${s.Sid}`);
    }
  });
});
