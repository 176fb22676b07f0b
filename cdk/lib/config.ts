// Deploy-time configuration: everything `cdk deploy -c key=value` can change, parsed and
// checked in one place so that a bad value fails the synth with a message that says what to do.
import * as fs from 'node:fs';
import * as path from 'node:path';

/** The enclave image measurements that the KMS key policies bind key release to. */
export interface Measurements {
  /** PCR0 = SHA-384 of the enclave image (what KMS calls `kms:RecipientAttestation:ImageSha384`). 96 lowercase hex chars. */
  readonly pcr0: string;
  /** PCR8 = hash of the image's signing certificate, when the EIF is signed. Optional. */
  readonly pcr8?: string;
  /** Where the values came from, for error messages and the stack description. */
  readonly source: string;
}

export type LedgerLockMode = 'governance' | 'compliance';

/** How the hosts' AMI is pinned (see DeployConfig.hostImage). */
export type HostImage =
  | { readonly kind: 'ami'; readonly imageId: string }
  | { readonly kind: 'lookup'; readonly account: string; readonly region: string };

/** The environment variables the CDK CLI sets from its credentials (CDK_DEFAULT_ACCOUNT, CDK_DEFAULT_REGION). */
export type CliEnvironment = Record<string, string | undefined>;

export interface DeployConfig {
  readonly measurements: Measurements;
  /**
   * The image about to be rolled out (`-c nextPolicyFile=…` or `-c nextPcr0=… [-c nextPcr8=…]`):
   * its fleet and model keys are created beside the running image's (so the model can be sealed
   * to them; its hosts create their epochs under its fleet key), while the hosts still run the
   * current image (`scripts/deploy.sh --update-image`, docs/operations.md §4).
   */
  readonly nextMeasurements?: Measurements;
  /** EC2 instance type of the hosts; must support Nitro Enclaves. */
  readonly instanceType: string;
  /**
   * The hosts' Amazon Linux 2023 image, pinned: an AMI id (`-c hostAmi=ami-…`), or the Region's
   * newest looked up once at synth and kept in cdk.context.json. Either way a deploy never rolls
   * the fleet because Amazon published a new image; moving to a newer one is a choice.
   */
  readonly hostImage: HostImage;
  /** vCPUs and memory handed to the enclave (the rest stays with the host OS and the poller). */
  readonly enclaveCpuCount: number;
  readonly enclaveMemoryMib: number;
  /** Fleet size bounds and the scaling target (jobs waiting or in flight per host). */
  readonly minHosts: number;
  readonly maxHosts: number;
  readonly jobsPerHost: number;
  /**
   * Session Manager's interface endpoints and the hosts' SSM registration (`-c sessionManager=true`);
   * off by default: three endpoints per AZ cost about $22/month per AZ whether or not anyone logs in.
   */
  readonly sessionManager: boolean;
  /** Availability zones the fleet's VPC spans (1 or 2: the stack is environment-agnostic). */
  readonly maxAzs: number;
  /** Object Lock retention of every ledger object, in days. */
  readonly ledgerRetentionDays: number;
  /**
   * Object Lock mode of the ledger: `governance` (the default: a principal allowed
   * s3:BypassGovernanceRetention can still remove a trial's ledger) or `compliance` (production:
   * nobody, the account root included, until the retention ends).
   */
  readonly ledgerLockMode: LedgerLockMode;
  /** Reserved concurrency of ledger-append; unset by default (the FIFO group already serialises it). */
  readonly ledgerReservedConcurrency?: number;
  /**
   * Witnesses ledger-append submits each checkpoint to (C2SP tlog-witness), `-c
   * witnesses=KEY@http://HOST:PORT[/PREFIX],…` with `KEY` a witness's cosigner key
   * (`name+hex8+base64`); none by default. Their cosignatures go on the published checkpoint and
   * each job's proof; clients require them with `--witness KEY --witness-quorum N`.
   */
  readonly witnesses: string[];
  /** An address subscribed to the alarm topic (SNS asks it to confirm). */
  readonly alarmEmail?: string;
  /** Days anything under jobs/ is kept (sealed inputs, outputs, receipts, status). */
  readonly jobsRetentionDays: number;
  /** Prefixes of the jobs bucket where data owners drop sealed shards (S3-event-triggered jobs). */
  readonly storePrefixes: string[];
  /** Directory holding `<name>/bootstrap.zip` for each Lambda, as scripts/build-lambdas.sh writes them. */
  readonly lambdaAssetsDir: string;
  /**
   * The enclave image and the host-poller binary the hosts run (`-c enclaveEif=PATH -c
   * hostPoller=PATH`, both or neither): published by `cdk deploy` as assets named by their
   * content, so a new image is a new launch template version. Unset: placeholders, and a
   * template CloudFormation refuses to deploy (host-artifacts.ts).
   */
  readonly enclaveEif?: string;
  readonly hostPoller?: string;
  /**
   * The online relay (`-c onlineCertificateArn=arn:aws:acm:…`): with it, every host runs the
   * Oblivious HTTP relay behind an internal Network Load Balancer whose TLS listener uses this
   * certificate; without it, no relay and no balancer.
   */
  readonly onlineCertificateArn?: string;
  /** Scaling target for online load: TLS flows open at the balancer per host. */
  readonly onlineFlowsPerHost: number;
}

/** Reads context values (`-c key=value`, cdk.json or `new App({context})`). */
export type ContextReader = (key: string) => unknown;

const HEX96 = /^[0-9a-fA-F]{96}$/;

export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

const MEASUREMENTS_HELP =
  'The KMS key policies release keys only to the enclave image you deploy, so the stack needs its measurements. ' +
  'Pass them with `-c pcr0=<96 hex chars> [-c pcr8=<96 hex chars>]`, or point to the signed policy file written by ' +
  '`enclave-image/build-enclave.sh` with `-c policyFile=path/to/policy.json`. There are no default measurements.';

/** The repository root (cdk/ is one level below it; this file runs from cdk/lib or cdk/dist/lib). */
export function repoRoot(): string {
  let dir = __dirname;
  while (!fs.existsSync(path.join(dir, 'cdk', 'package.json'))) {
    const parent = path.dirname(dir);
    if (parent === dir) throw new ConfigError(`cannot find the repository root above ${__dirname}`);
    dir = parent;
  }
  return dir;
}

export function loadConfig(read: ContextReader, cliEnv: CliEnvironment = process.env): DeployConfig {
  if (read('inputRetentionDays') !== undefined) {
    // Refused rather than ignored: a retention setting must not silently do nothing.
    throw new ConfigError(
      'inputRetentionDays is no longer a setting: an S3 lifecycle rule cannot pick out jobs/<id>/input.sealed, ' +
        'so sealed inputs expire with the rest of their job after jobsRetentionDays',
    );
  }
  if (read('rotationDays') !== undefined) {
    // Refused rather than ignored, as above: nothing rotates on a schedule any more.
    throw new ConfigError(
      'rotationDays is no longer a setting: the hosts\' enclaves create the fleet-key epochs (a new one when none ' +
        'lasts two more days; docs/protocol.md §7.3.1), and no Lambda rotates them',
    );
  }
  const storePrefixes = stringList(read, 'storePrefixes', ['stores/']);
  checkPrefixes(storePrefixes);
  const lambdaAssetsDir = str(read, 'lambdaAssetsDir', path.join(repoRoot(), 'target', 'lambda'));
  const cfg: DeployConfig = {
    measurements: loadMeasurements(read),
    nextMeasurements: loadNextMeasurements(read),
    instanceType: str(read, 'instanceType', 'm6i.xlarge'),
    hostImage: hostImage(read, cliEnv),
    enclaveCpuCount: int(read, 'enclaveCpuCount', 2, 2, 128),
    enclaveMemoryMib: int(read, 'enclaveMemoryMib', 6144, 1024, 1024 * 1024),
    minHosts: int(read, 'minHosts', 1, 0, 1000),
    maxHosts: int(read, 'maxHosts', 4, 1, 1000),
    jobsPerHost: int(read, 'jobsPerHost', 2, 1, 1000),
    maxAzs: int(read, 'maxAzs', 2, 1, 2),
    sessionManager: bool(read, 'sessionManager', false),
    ledgerRetentionDays: int(read, 'ledgerRetentionDays', 30, 1, 36500),
    ledgerLockMode: lockMode(read),
    alarmEmail: email(read, 'alarmEmail'),
    ledgerReservedConcurrency: read('ledgerReservedConcurrency') === undefined ? undefined : int(read, 'ledgerReservedConcurrency', 1, 1, 1000),
    witnesses: witnesses(read),
    jobsRetentionDays: int(read, 'jobsRetentionDays', 30, 1, 3650),
    storePrefixes,
    lambdaAssetsDir: path.resolve(lambdaAssetsDir),
    ...hostArtifactPaths(read),
    onlineCertificateArn: certificateArn(read, 'onlineCertificateArn'),
    onlineFlowsPerHost: int(read, 'onlineFlowsPerHost', 16, 1, 100000),
  };
  if (cfg.maxHosts < cfg.minHosts) {
    throw new ConfigError(`maxHosts (${cfg.maxHosts}) must be at least minHosts (${cfg.minHosts})`);
  }
  if (cfg.enclaveCpuCount % 2 !== 0) {
    throw new ConfigError(`enclaveCpuCount must be even (an enclave takes whole cores, two vCPUs each): got ${cfg.enclaveCpuCount}`);
  }
  return cfg;
}

/** An ACM certificate ARN, or undefined when the key is not given. */
function certificateArn(read: ContextReader, key: string): string | undefined {
  const value = str(read, key, '');
  if (value === '') return undefined;
  if (!/^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate\/[0-9a-f-]{36}$/.test(value)) {
    throw new ConfigError(`${key}: ${value} is not an ACM certificate ARN (arn:aws:acm:REGION:ACCOUNT:certificate/UUID)`);
  }
  return value;
}

/**
 * `-c enclaveEif=PATH -c hostPoller=PATH`: both (each an existing file) or neither, so a fleet
 * never runs a new image with an old poller or the reverse by accident.
 */
export function hostArtifactPaths(read: ContextReader): { enclaveEif?: string; hostPoller?: string } {
  const eif = str(read, 'enclaveEif', '');
  const poller = str(read, 'hostPoller', '');
  if (eif === '' && poller === '') return {};
  if (eif === '' || poller === '') {
    throw new ConfigError(
      `give both -c enclaveEif=PATH and -c hostPoller=PATH (the image and the poller built with it), or neither; got only ${eif === '' ? 'hostPoller' : 'enclaveEif'}`,
    );
  }
  const out = { enclaveEif: path.resolve(eif), hostPoller: path.resolve(poller) };
  for (const [key, file] of Object.entries(out)) {
    if (!fs.existsSync(file) || !fs.statSync(file).isFile()) {
      throw new ConfigError(
        `${key}: ${file} is not a file. scripts/deploy.sh step 2 (image) writes enclave.eif and host-poller to dist/enclave/<commit>/ (docs/operations.md §1.3)`,
      );
    }
  }
  return out;
}

/**
 * Measurements from `-c pcr0=… -c pcr8=…`, or from the `pcrs` map of a policy file
 * (`-c policyFile=…`; only `pcrs` is read, the signature is checked by `ephem-batch policy verify`).
 * Giving both is refused, so there is never a question which one the keys were bound to.
 */
export function loadMeasurements(read: ContextReader): Measurements {
  const pcr0 = read('pcr0');
  const pcr8 = read('pcr8');
  const policyFile = read('policyFile');
  if (policyFile !== undefined && (pcr0 !== undefined || pcr8 !== undefined)) {
    throw new ConfigError('give either -c policyFile=… or -c pcr0=… [-c pcr8=…], not both');
  }
  if (policyFile !== undefined) {
    return measurementsFromPolicyFile(String(policyFile));
  }
  if (pcr0 === undefined) {
    throw new ConfigError(`missing enclave measurements. ${MEASUREMENTS_HELP}`);
  }
  return {
    pcr0: hex96('pcr0', pcr0),
    pcr8: pcr8 === undefined || pcr8 === '' ? undefined : hex96('pcr8', pcr8),
    source: 'context',
  };
}

/** The incoming image's measurements (`nextPolicyFile`, or `nextPcr0`/`nextPcr8`), if given. */
export function loadNextMeasurements(read: ContextReader): Measurements | undefined {
  const given = (k: string) => read(k) !== undefined && read(k) !== '';
  if (!given('nextPolicyFile') && !given('nextPcr0') && !given('nextPcr8')) return undefined;
  if (!given('nextPolicyFile') && !given('nextPcr0')) throw new ConfigError('nextPcr8 needs nextPcr0');
  return loadMeasurements((k) => (['pcr0', 'pcr8', 'policyFile'].includes(k) ? read(`next${k[0].toUpperCase()}${k.slice(1)}`) : undefined));
}

export function measurementsFromPolicyFile(file: string): Measurements {
  let doc: unknown;
  try {
    doc = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new ConfigError(`cannot read policy file ${file}: ${(e as Error).message}`);
  }
  const pcrs = (doc as { pcrs?: Record<string, unknown> } | null)?.pcrs;
  if (pcrs === undefined || pcrs === null || typeof pcrs !== 'object') {
    throw new ConfigError(`policy file ${file} has no "pcrs" object`);
  }
  if (pcrs['0'] === undefined) {
    throw new ConfigError(`policy file ${file} has no PCR0 in "pcrs"`);
  }
  return {
    pcr0: hex96(`${file} pcrs.0`, pcrs['0']),
    pcr8: pcrs['8'] === undefined ? undefined : hex96(`${file} pcrs.8`, pcrs['8']),
    source: `policy file ${path.basename(file)}`,
  };
}

function hex96(name: string, value: unknown): string {
  const s = String(value).trim();
  if (!HEX96.test(s)) {
    throw new ConfigError(`${name} must be 96 hex characters (a SHA-384), got ${JSON.stringify(s)}. ${MEASUREMENTS_HELP}`);
  }
  if (/^0+$/.test(s)) {
    throw new ConfigError(`${name} is all zeros, which is what a debug-mode enclave reports; keys are never released to debug enclaves`);
  }
  return s.toLowerCase();
}

/**
 * `-c hostAmi=ami-…`, else a lookup in the account and Region the CDK CLI deploys to (it sets
 * CDK_DEFAULT_ACCOUNT and CDK_DEFAULT_REGION from the credentials). Without either there is no
 * pinned image, and the synth stops rather than let every deploy take the newest AMI.
 */
export function hostImage(read: ContextReader, cliEnv: CliEnvironment): HostImage {
  const ami = str(read, 'hostAmi', '');
  if (ami !== '') {
    if (!/^ami-[0-9a-f]{8}([0-9a-f]{9})?$/.test(ami)) throw new ConfigError(`hostAmi must be an AMI id (ami- and 8 or 17 hex digits), got ${JSON.stringify(ami)}`);
    return { kind: 'ami', imageId: ami };
  }
  const account = cliEnv.CDK_DEFAULT_ACCOUNT ?? '';
  const region = cliEnv.CDK_DEFAULT_REGION ?? '';
  if (!/^\d{12}$/.test(account) || !/^[a-z]{2}(-[a-z]+)+-\d$/.test(region)) {
    throw new ConfigError(
      'the hosts\' AMI must be pinned: run the CDK CLI with credentials (it looks up the Region\'s newest Amazon Linux 2023 once ' +
        'and keeps it in cdk.context.json), or give -c hostAmi=ami-…',
    );
  }
  return { kind: 'lookup', account, region };
}

function str(read: ContextReader, key: string, dflt: string): string {
  const v = read(key);
  if (v === undefined || v === '') return dflt;
  return String(v);
}

function int(read: ContextReader, key: string, dflt: number, min: number, max: number): number {
  const v = read(key);
  if (v === undefined || v === '') return dflt;
  const n = typeof v === 'number' ? v : Number(String(v));
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new ConfigError(`${key} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`);
  }
  return n;
}

function bool(read: ContextReader, key: string, dflt: boolean): boolean {
  const v = read(key);
  if (v === undefined || v === '') return dflt;
  if (v === true || v === 'true') return true;
  if (v === false || v === 'false') return false;
  throw new ConfigError(`${key} must be true or false, got ${JSON.stringify(v)}`);
}

function email(read: ContextReader, key: string): string | undefined {
  const v = str(read, key, '');
  if (v === '') return undefined;
  if (!/^[^@\s]+@[^@\s]+\.[^@\s]+$/.test(v)) throw new ConfigError(`${key} must be an e-mail address, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * `-c witnesses`: comma-separated `KEY@http://HOST:PORT[/PREFIX]` (the form ledger-append's
 * `EPHEM_WITNESSES` parses; plain HTTP, as a witness's answer is checked by its key).
 */
function witnesses(read: ContextReader): string[] {
  const entries = str(read, 'witnesses', '').split(',').map((e) => e.trim()).filter((e) => e !== '');
  const entry = /^[\x21-\x2a\x2c-\x7e]+\+[0-9a-f]{8}\+[A-Za-z0-9+/]+={0,2}@http:\/\/[A-Za-z0-9.-]+:\d{1,5}(\/[A-Za-z0-9._~\/-]*)?$/;
  for (const e of entries) {
    if (!entry.test(e)) throw new ConfigError(`witnesses: ${JSON.stringify(e)} is not KEY@http://HOST:PORT[/PREFIX] (KEY: name+hex8+base64)`);
  }
  return entries;
}

function lockMode(read: ContextReader): LedgerLockMode {
  const v = str(read, 'ledgerLockMode', 'governance');
  if (v !== 'governance' && v !== 'compliance') {
    throw new ConfigError(`ledgerLockMode must be governance or compliance, got ${JSON.stringify(v)}`);
  }
  return v;
}

function stringList(read: ContextReader, key: string, dflt: string[]): string[] {
  const v = read(key);
  if (v === undefined || v === '') return dflt;
  const list = Array.isArray(v) ? v.map(String) : String(v).split(',');
  return list.map((s) => s.trim()).filter((s) => s.length > 0);
}

/**
 * S3 refuses two notification rules for the same event whose prefixes overlap, and a store
 * prefix under jobs/ would create jobs twice. Each prefix must end with '/', must not be
 * jobs/ (or under it), and no prefix may contain another.
 */
export function checkPrefixes(prefixes: string[]): void {
  const reserved = ['jobs/', 'bulk/'];
  for (const p of prefixes) {
    if (!/^[A-Za-z0-9][A-Za-z0-9._\-/]*\/$/.test(p)) {
      throw new ConfigError(`store prefix ${JSON.stringify(p)} must be a relative key prefix ending with '/'`);
    }
    for (const r of reserved) {
      if (p.startsWith(r) || r.startsWith(p)) {
        throw new ConfigError(`store prefix ${JSON.stringify(p)} overlaps the reserved prefix ${r}`);
      }
    }
  }
  for (const a of prefixes) {
    for (const b of prefixes) {
      if (a !== b && b.startsWith(a)) {
        throw new ConfigError(`store prefixes ${JSON.stringify(a)} and ${JSON.stringify(b)} overlap`);
      }
    }
  }
  if (new Set(prefixes).size !== prefixes.length) {
    throw new ConfigError('store prefixes contain a duplicate');
  }
}
