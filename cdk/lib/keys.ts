// The KMS keys, exactly as DESIGN.md §3 says. Key policies are the root of confidentiality:
//
//  * The fleet key (wraps each epoch's HPKE private key) and the model key (wraps model data
//    keys) release plaintext only to an attested enclave: `Decrypt` (and, for the model key,
//    `GenerateDataKey`) is allowed to the host role only when the request carries a Nitro
//    attestation document whose image hash (PCR0, `kms:RecipientAttestation:ImageSha384`) and,
//    if given, PCR8 equal the measurements given at deploy time. KMS then returns the result
//    encrypted to the enclave's one-shot key; the host that relays the call sees ciphertext.
//  * Explicit Deny statements, for every principal, refuse those operations when the
//    attestation condition is absent (a `Null` check) or different, so no later Allow
//    anywhere can loosen them.
//  * No one may PutKeyPolicy, CreateGrant or ReEncrypt*, and there is no "account root may
//    do kms:*" statement: a key policy cannot be edited after deployment, by anyone. A new
//    enclave image therefore means a new key (the measurements are part of the key's logical
//    id, so CloudFormation creates a new key and keeps the old one, which it can no longer
//    change). KMS refuses such a policy unless the policy-lockout safety check is bypassed —
//    which is why every key here sets BypassPolicyLockoutSafetyCheck, on purpose.
//  * The account may read the policy (GetKeyPolicy, DescribeKey): clients and auditors check it.
//    It may also tag the key, turn rotation on and schedule deletion: the operations that
//    CloudFormation needs to create and retire a key. None of them releases or re-wraps data.
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
/** Operations that nobody may ever perform on these keys. */
export const FORBIDDEN_ACTIONS = ['kms:PutKeyPolicy', 'kms:CreateGrant', 'kms:ReEncrypt*'];
/** Read-only operations the account may perform (clients check the key policy). */
export const READ_ACTIONS = ['kms:DescribeKey', 'kms:GetKeyPolicy', 'kms:GetKeyRotationStatus', 'kms:ListResourceTags'];
/** What CloudFormation needs to create, tag and retire a key; nothing here touches data. */
export const LIFECYCLE_ACTIONS = ['kms:TagResource', 'kms:UntagResource', 'kms:ScheduleKeyDeletion', 'kms:CancelKeyDeletion'];

export interface KeysProps {
  readonly measurements: Measurements;
  readonly hostRole: iam.IRole;
  readonly rotationRole: iam.IRole;
  readonly ledgerRole: iam.IRole;
  readonly modelPublisherRole: iam.IRole;
}

export class Keys extends Construct {
  /** Symmetric key under which fleet-rotate wraps each epoch's P-256 HPKE private key. */
  readonly fleetKey: kms.CfnKey;
  /** Symmetric key under which model data keys are wrapped (encryption context {model_id, version}). */
  readonly modelKey: kms.CfnKey;
  /** Ed25519 signing key of the ledger's checkpoints; only ledger-append may sign. */
  readonly ledgerSigningKey: kms.CfnKey;

  constructor(scope: Construct, id: string, props: KeysProps) {
    super(scope, id);
    const m = props.measurements;
    // A new measurement gives new logical ids, hence new keys (policies are never edited).
    const tag = measurementTag(m);

    this.fleetKey = newKey(this, `FleetKey${tag}`, {
      description: `ephem-batch fleet key; releases epoch keys only to enclave image ${m.pcr0.slice(0, 16)}...`,
      keySpec: 'SYMMETRIC_DEFAULT',
      keyUsage: 'ENCRYPT_DECRYPT',
      enableKeyRotation: true,
      statements: [
        ...accountStatements(true),
        allowAttested('AllowAttestedEnclaveDecrypt', props.hostRole, ['kms:Decrypt'], m),
        {
          sid: 'AllowRotationNewEpochKeyPairs',
          effect: 'Allow',
          principal: props.rotationRole.roleArn,
          actions: ['kms:GenerateDataKeyPairWithoutPlaintext'],
          conditions: {
            StringEquals: { 'kms:DataKeyPairSpec': 'ECC_NIST_P256' },
            Null: { 'kms:EncryptionContext:epoch': 'false', 'kms:EncryptionContext:not_after': 'false' },
          },
        },
        ...denyUnattested(m),
        denyForbidden(),
      ],
    });

    this.modelKey = newKey(this, `ModelKey${tag}`, {
      description: `ephem-batch model key; releases model data keys only to enclave image ${m.pcr0.slice(0, 16)}...`,
      keySpec: 'SYMMETRIC_DEFAULT',
      keyUsage: 'ENCRYPT_DECRYPT',
      enableKeyRotation: true,
      statements: [
        ...accountStatements(true),
        allowAttested('AllowAttestedEnclaveDataKeys', props.hostRole, ['kms:Decrypt', 'kms:GenerateDataKey'], m),
        // The publisher wraps a data key it generated itself; Encrypt returns only ciphertext.
        {
          sid: 'AllowPublisherWrapModelDataKeys',
          effect: 'Allow',
          principal: props.modelPublisherRole.roleArn,
          actions: ['kms:Encrypt'],
          conditions: {
            Null: { 'kms:EncryptionContext:model_id': 'false', 'kms:EncryptionContext:version': 'false' },
          },
        },
        ...denyUnattested(m),
        denyForbidden(),
      ],
    });

    // The ledger key is separate and has nothing to do with enclaves: it signs checkpoints.
    // V2: V1's policy let only the account root read the public key, which ledger-append needs
    // at start; nobody may PutKeyPolicy, so a changed policy is a new key (V1 is retained).
    this.ledgerSigningKey = newKey(this, 'LedgerSigningKeyV2', {
      description: 'ephem-batch ledger checkpoint signing key (Ed25519)',
      keySpec: 'ECC_NIST_EDWARDS25519',
      keyUsage: 'SIGN_VERIFY',
      enableKeyRotation: false,
      statements: [
        ...accountStatements(false),
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

/** Statements for the account itself: read the policy, and let CloudFormation manage the key's life. */
function accountStatements(symmetric: boolean): KeyPolicyStatement[] {
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
  ];
}

/** Allow `actions` to `principal` only with the deployed image's attestation (PCR0, and PCR8 if given). */
function allowAttested(sid: string, principal: iam.IRole, actions: string[], m: Measurements): KeyPolicyStatement {
  const expected: Record<string, string> = { [IMAGE_SHA384_KEY]: m.pcr0 };
  if (m.pcr8) expected[PCR8_KEY] = m.pcr8;
  return {
    sid,
    effect: 'Allow',
    principal: principal.roleArn,
    actions,
    conditions: { StringEqualsIgnoreCase: expected },
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

function denyForbidden(): KeyPolicyStatement {
  return {
    sid: 'DenyPolicyChangesGrantsAndReEncrypt',
    effect: 'Deny',
    principal: ANYONE,
    actions: FORBIDDEN_ACTIONS,
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
