// The KMS keys, exactly as DESIGN.md §3 says. Key policies are the root of confidentiality:
//
//  * The fleet key (wraps each epoch's HPKE private key) and the model key (wraps model data
//    keys) release plaintext only to an attested enclave: `Decrypt` (and, for the model key,
//    `GenerateDataKey`; for the fleet key, `GenerateDataKeyPair`) is allowed to the host role only
//    when the request carries a Nitro attestation document whose image hash (PCR0,
//    `kms:RecipientAttestation:ImageSha384`) and, if given, PCR8 equal the measurements given at
//    deploy time. KMS then returns the result encrypted to the enclave's one-shot key; the host
//    that relays the call sees ciphertext.
//  * Fleet-key epochs are created by enclaves (docs/protocol.md §7.3.1): an enclave has KMS
//    generate the epoch's P-256 key pair for itself (`GenerateDataKeyPair` with a `Recipient`,
//    encryption context {epoch, not_after}), so the private key is known to KMS and to enclaves
//    of the measured image only. Before that it reads the key evidence (`DescribeKey`,
//    `GetKeyPolicy`, `ListGrants`) with the host role's credentials, which this policy grants the
//    host role itself. Nobody else can make an epoch: no `GenerateDataKeyPairWithoutPlaintext`
//    (a rotation step that called it could equally have wrapped a key pair of its own), no
//    `Encrypt`.
//  * Explicit Deny statements, for every principal, refuse those operations when the
//    attestation condition is absent (a `Null` check) or different, so no later Allow
//    anywhere can loosen them.
//  * No one may PutKeyPolicy, CreateGrant, ReEncrypt* or Import* (explicit Deny for every
//    principal), nor kms:Encrypt under the fleet key (whoever could wrap a key pair of their own
//    as an epoch would read every text sealed to it); under the model key only the model
//    publisher role may Encrypt. There is no "account root may do kms:*" statement: a key policy
//    cannot be edited after deployment, by anyone. A new enclave image therefore means new keys
//    (the measurements are part of the keys' logical ids), and so does a new policy (its version,
//    KEY_POLICY_VERSION or the key's own, is too). KMS refuses such a policy unless the
//    policy-lockout safety check is bypassed — which is why every key here sets
//    BypassPolicyLockoutSafetyCheck.
//  * The account may read the policy (GetKeyPolicy, DescribeKey, ListGrants): clients and
//    auditors check it (an IAM policy must allow them too, as the tenant policy of
//    docs/operations.md §3 does; the host role is named in the fleet key's policy instead).
//    It may also tag the key, turn rotation on, schedule deletion and cancel it: the operations
//    CloudFormation needs to create and retire a key. None of them releases or re-wraps data.
//  * The kill switch: a break-glass role may DisableKey and EnableKey, nothing else. Disabling
//    stops every release at once and is undone by EnableKey; it is also what brings a key back
//    after a mistaken ScheduleKeyDeletion (KMS leaves a cancelled key Disabled). Limiting
//    ScheduleKeyDeletion itself is an SCP's job (docs/operations.md §5, the keys' kill switch).
//  * An incoming image (`-c nextPolicyFile=`) gets its fleet and model keys before any host runs
//    it, so the model can be sealed to them first; its hosts then create their own epoch under
//    its fleet key (docs/operations.md §4).
import { createHash } from 'node:crypto';
import { Aws, Fn, RemovalPolicy } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as kms from 'aws-cdk-lib/aws-kms';
import { Construct } from 'constructs';
import { Measurements } from './config';

/** The condition keys KMS sets from a `Recipient` attestation document. */
export const IMAGE_SHA384_KEY = 'kms:RecipientAttestation:ImageSha384';
export const PCR8_KEY = 'kms:RecipientAttestation:PCR8';

/** Operations that can return key material or data keys in plaintext (to the caller or, with Recipient, to an enclave). */
export const RELEASE_ACTIONS = ['kms:Decrypt', 'kms:GenerateDataKey', 'kms:GenerateDataKeyPair'];
/** Operations that nobody may ever perform on these keys (explicit Deny for every principal). */
export const FORBIDDEN_ACTIONS = ['kms:PutKeyPolicy', 'kms:CreateGrant', 'kms:ReEncrypt*', 'kms:Import*'];
/** Wrapping under the key: forbidden to everyone on the fleet key, to all but the publisher on the model key. */
export const ENCRYPT_ACTION = 'kms:Encrypt';
/** The kill switch of the break-glass role: stop and restore every use of a key; releases nothing. */
export const KILL_SWITCH_ACTIONS = ['kms:DisableKey', 'kms:EnableKey'];
/**
 * The version of the policies below, part of each key's logical id: a key's policy can never be
 * changed, so a changed policy must be a new key (the old one is retained). A key whose policy did
 * not change keeps its version, and so stays the same key.
 *   3: the kill switch, the Encrypt/Import* denials and ListGrants for the account (every key).
 *   4: the fleet key only. Enclaves create the epochs: the host role may GenerateDataKeyPair with
 *      the image's attestation (P-256, {epoch, not_after}) and read the key evidence (DescribeKey,
 *      GetKeyPolicy, ListGrants); the fleet-rotate role and its GenerateDataKeyPairWithoutPlaintext
 *      are gone, since an epoch it made could as well have been a key pair its operator knows.
 */
export const KEY_POLICY_VERSION = 4;
/** The model key's policy is version 3's (unchanged by 4): its keys are kept. */
export const MODEL_KEY_POLICY_VERSION = 3;
/** The ledger signing key's policy is version 3's (unchanged by 4): the key clients pinned is kept. */
export const LEDGER_KEY_POLICY_VERSION = 3;
/** Read-only operations the account may perform (clients check the key policy and that it has no grants). */
export const READ_ACTIONS = ['kms:DescribeKey', 'kms:GetKeyPolicy', 'kms:GetKeyRotationStatus', 'kms:ListResourceTags', 'kms:ListGrants'];
/**
 * What an enclave reads of the fleet key, with the host role's credentials, before it creates an
 * epoch (protocol::key_checks::KeyEvidence); the host reads the first two to learn the key's ARN.
 */
export const EVIDENCE_ACTIONS = ['kms:DescribeKey', 'kms:GetKeyPolicy', 'kms:ListGrants'];
/** The key pair an epoch is: P-256 (DHKEM(P-256, HKDF-SHA256)), under {epoch, not_after}. */
export const EPOCH_KEY_PAIR_CONDITIONS = {
  StringEquals: { 'kms:DataKeyPairSpec': 'ECC_NIST_P256' },
  Null: { 'kms:EncryptionContext:epoch': 'false', 'kms:EncryptionContext:not_after': 'false' },
};
/** What CloudFormation needs to create, tag and retire a key; nothing here touches data. */
export const LIFECYCLE_ACTIONS = ['kms:TagResource', 'kms:UntagResource', 'kms:ScheduleKeyDeletion', 'kms:CancelKeyDeletion'];

export interface KeysProps {
  readonly measurements: Measurements;
  /** The image about to be rolled out (`-c nextPolicyFile=`): its keys are created now, first. */
  readonly nextMeasurements?: Measurements;
  readonly hostRole: iam.IRole;
  readonly ledgerRole: iam.IRole;
  readonly modelPublisherRole: iam.IRole;
  /** May DisableKey and EnableKey on every key, nothing else (the kill switch). */
  readonly breakGlassRole: iam.IRole;
}

/** The fleet key and model key bound to one enclave image. */
export interface ImageKeys {
  readonly measurements: Measurements;
  readonly fleetKey: kms.CfnKey;
  readonly modelKey: kms.CfnKey;
}

export class Keys extends Construct {
  /** Symmetric key under which KMS wraps each epoch's P-256 HPKE private key, generated for an attested enclave (the running image's). */
  readonly fleetKey: kms.CfnKey;
  /** Symmetric key under which model data keys are wrapped (encryption context {model_id, version}). */
  readonly modelKey: kms.CfnKey;
  /** The incoming image's keys, when one is given. */
  readonly next?: ImageKeys;
  /** Ed25519 signing key of the ledger's checkpoints; only ledger-append may sign. */
  readonly ledgerSigningKey: kms.CfnKey;

  constructor(scope: Construct, id: string, props: KeysProps) {
    super(scope, id);
    const current = this.imageKeys(props, props.measurements);
    this.fleetKey = current.fleetKey;
    this.modelKey = current.modelKey;
    if (props.nextMeasurements && measurementTag(props.nextMeasurements) !== measurementTag(props.measurements)) {
      this.next = this.imageKeys(props, props.nextMeasurements);
    }

    // The ledger key is separate and has nothing to do with enclaves: it signs checkpoints.
    // V3: the kill switch and the Import* denial (V2: ledger-append may read the public key;
    // V1: only the account root could). Each is retained when the next replaces it. Version 4
    // changed only the fleet key's policy, so this is still V3.
    this.ledgerSigningKey = newKey(this, `LedgerSigningKeyV${LEDGER_KEY_POLICY_VERSION}`, {
      description: 'ephem-batch ledger checkpoint signing key (Ed25519)',
      keySpec: 'ECC_NIST_EDWARDS25519',
      keyUsage: 'SIGN_VERIFY',
      enableKeyRotation: false,
      statements: [
        ...accountStatements(false, props.breakGlassRole),
        {
          sid: 'AllowAccountReadPublicKey',
          effect: 'Allow',
          principal: ACCOUNT_ROOT,
          actions: ['kms:GetPublicKey'],
        },
        {
          sid: 'AllowLedgerAppendSign',
          effect: 'Allow',
          principal: props.ledgerRole.roleArn,
          actions: ['kms:Sign'],
          conditions: { StringEquals: { 'kms:SigningAlgorithm': 'ED25519_SHA_512' } },
        },
        // ledger-append derives its note key from the public key when it starts.
        {
          sid: 'AllowLedgerAppendReadPublicKey',
          effect: 'Allow',
          principal: props.ledgerRole.roleArn,
          actions: ['kms:GetPublicKey'],
        },
        denyForbidden(),
      ],
    });
  }

  /** The fleet and model keys of one image; their logical ids name the image and the policy version. */
  private imageKeys(props: KeysProps, m: Measurements): ImageKeys {
    const fleetKey = newKey(this, `FleetKeyV${KEY_POLICY_VERSION}${measurementTag(m)}`, {
      description: `ephem-batch fleet key; releases epoch keys only to enclave image ${m.pcr0.slice(0, 16)}...`,
      keySpec: 'SYMMETRIC_DEFAULT',
      keyUsage: 'ENCRYPT_DECRYPT',
      enableKeyRotation: true,
      statements: [
        ...accountStatements(true, props.breakGlassRole),
        allowAttested('AllowAttestedEnclaveDecrypt', props.hostRole, ['kms:Decrypt'], m),
        // A new epoch: KMS generates the pair and returns the private key only inside the CMS
        // envelope for the enclave's Recipient key (the Denies below refuse it without one).
        allowAttested('AllowAttestedEnclaveNewEpochKeyPairs', props.hostRole, ['kms:GenerateDataKeyPair'], m, EPOCH_KEY_PAIR_CONDITIONS),
        // The key evidence the enclave checks before it creates an epoch (and the host's DescribeKey).
        {
          sid: 'AllowHostReadKeyEvidence',
          effect: 'Allow',
          principal: props.hostRole.roleArn,
          actions: EVIDENCE_ACTIONS,
        },
        ...denyUnattested(m),
        denyForbidden([ENCRYPT_ACTION]),
      ],
    });

    const modelKey = newKey(this, `ModelKeyV${MODEL_KEY_POLICY_VERSION}${measurementTag(m)}`, {
      description: `ephem-batch model key; releases model data keys only to enclave image ${m.pcr0.slice(0, 16)}...`,
      keySpec: 'SYMMETRIC_DEFAULT',
      keyUsage: 'ENCRYPT_DECRYPT',
      enableKeyRotation: true,
      statements: [
        ...accountStatements(true, props.breakGlassRole),
        allowAttested('AllowAttestedEnclaveDataKeys', props.hostRole, ['kms:Decrypt', 'kms:GenerateDataKey'], m),
        // The publisher wraps a data key it generated itself; Encrypt returns only ciphertext.
        {
          sid: 'AllowPublisherWrapModelDataKeys',
          effect: 'Allow',
          principal: props.modelPublisherRole.roleArn,
          actions: [ENCRYPT_ACTION],
          conditions: {
            Null: { 'kms:EncryptionContext:model_id': 'false', 'kms:EncryptionContext:version': 'false' },
          },
        },
        ...denyUnattested(m),
        denyForbidden(),
        // Everyone else: no Encrypt, whatever an IAM policy or a later statement says.
        {
          sid: 'DenyEncryptButPublisher',
          effect: 'Deny',
          principal: ANYONE,
          actions: [ENCRYPT_ACTION],
          conditions: { ArnNotEquals: { 'aws:PrincipalArn': props.modelPublisherRole.roleArn } },
        },
      ],
    });
    return { measurements: m, fleetKey, modelKey };
  }
}

interface NewKeyProps {
  readonly description: string;
  readonly keySpec: string;
  readonly keyUsage: string;
  readonly enableKeyRotation: boolean;
  readonly statements: KeyPolicyStatement[];
}

function newKey(scope: Construct, id: string, p: NewKeyProps): kms.CfnKey {
  const key = new kms.CfnKey(scope, id, {
    description: p.description,
    keySpec: p.keySpec,
    keyUsage: p.keyUsage,
    enableKeyRotation: p.enableKeyRotation ? true : undefined,
    // Literal JSON: nobody may PutKeyPolicy, so a library that rendered the same statements
    // otherwise (an upgrade, a feature flag) would make the key impossible to update.
    keyPolicy: { Version: '2012-10-17', Statement: p.statements.map(render) },
    // The policy grants no one PutKeyPolicy, so KMS's lockout safety check would refuse it.
    // That is the point: nobody, CloudFormation included, can loosen it later.
    bypassPolicyLockoutSafetyCheck: true,
    pendingWindowInDays: 30,
  });
  // Retained: a replaced key must outlive the stack's reference to it (old epochs, audits).
  key.applyRemovalPolicy(RemovalPolicy.RETAIN);
  return key;
}

/** One statement of a key policy, as written (the resource of a key policy is always the key). */
interface KeyPolicyStatement {
  readonly sid: string;
  readonly effect: 'Allow' | 'Deny';
  /** An ARN (or a token for one), or `*`. */
  readonly principal: string;
  readonly actions: string[];
  readonly conditions?: Record<string, Record<string, string>>;
}

const ANYONE = '*';
/** The account (its IAM policies decide who may use what this grants it). */
const ACCOUNT_ROOT = Fn.join('', ['arn:', Aws.PARTITION, ':iam::', Aws.ACCOUNT_ID, ':root']);

/** The statement's JSON, in the form IAM documents (a single action as a string). */
function render(s: KeyPolicyStatement): Record<string, unknown> {
  return {
    Action: s.actions.length === 1 ? s.actions[0] : s.actions,
    ...(s.conditions ? { Condition: s.conditions } : {}),
    Effect: s.effect,
    Principal: { AWS: s.principal },
    Resource: '*',
    Sid: s.sid,
  };
}

/** Statements for the account itself (read the policy, let CloudFormation manage the key's life) and the kill switch. */
function accountStatements(symmetric: boolean, breakGlassRole: iam.IRole): KeyPolicyStatement[] {
  return [
    {
      sid: 'AllowAccountReadKeyPolicy',
      effect: 'Allow',
      principal: ACCOUNT_ROOT,
      actions: READ_ACTIONS,
    },
    {
      sid: 'AllowAccountKeyLifecycle',
      effect: 'Allow',
      principal: ACCOUNT_ROOT,
      actions: symmetric ? [...LIFECYCLE_ACTIONS, 'kms:EnableKeyRotation'] : LIFECYCLE_ACTIONS,
    },
    {
      sid: 'AllowBreakGlassKillSwitch',
      effect: 'Allow',
      principal: breakGlassRole.roleArn,
      actions: KILL_SWITCH_ACTIONS,
    },
  ];
}

/**
 * Allow `actions` to `principal` only with the deployed image's attestation (PCR0, and PCR8 if
 * given), and the further conditions `more` (which may not replace the attestation's).
 */
function allowAttested(
  sid: string,
  principal: iam.IRole,
  actions: string[],
  m: Measurements,
  more: Record<string, Record<string, string>> = {},
): KeyPolicyStatement {
  const expected: Record<string, string> = { [IMAGE_SHA384_KEY]: m.pcr0 };
  if (m.pcr8) expected[PCR8_KEY] = m.pcr8;
  if ('StringEqualsIgnoreCase' in more) throw new Error(`${sid}: the attestation condition is allowAttested's own`);
  return {
    sid,
    effect: 'Allow',
    principal: principal.roleArn,
    actions,
    conditions: { StringEqualsIgnoreCase: expected, ...more },
  };
}

/** Deny every release operation, to everyone, without the attestation condition or with another value. */
function denyUnattested(m: Measurements): KeyPolicyStatement[] {
  const deny = (sid: string, conditions: Record<string, Record<string, string>>): KeyPolicyStatement => ({
    sid,
    effect: 'Deny',
    principal: ANYONE,
    actions: RELEASE_ACTIONS,
    conditions,
  });
  const out = [
    deny('DenyReleaseWithoutAttestation', { Null: { [IMAGE_SHA384_KEY]: 'true' } }),
    deny('DenyReleaseToOtherImages', { StringNotEqualsIgnoreCase: { [IMAGE_SHA384_KEY]: m.pcr0 } }),
  ];
  if (m.pcr8) {
    out.push(
      deny('DenyReleaseWithoutSignerPcr8', { Null: { [PCR8_KEY]: 'true' } }),
      deny('DenyReleaseToOtherSignersPcr8', { StringNotEqualsIgnoreCase: { [PCR8_KEY]: m.pcr8 } }),
    );
  }
  return out;
}

function denyForbidden(more: string[] = []): KeyPolicyStatement {
  return {
    sid: more.length === 0 ? 'DenyPolicyChangesGrantsReEncryptImport' : 'DenyPolicyChangesGrantsReEncryptImportEncrypt',
    effect: 'Deny',
    principal: ANYONE,
    actions: [...FORBIDDEN_ACTIONS, ...more],
  };
}

/** A short, stable fingerprint of the measurements, used in the keys' logical ids. */
export function measurementTag(m: Measurements): string {
  return createHash('sha256')
    .update(`${m.pcr0}|${m.pcr8 ?? ''}`)
    .digest('hex')
    .slice(0, 12)
    .toUpperCase();
}
