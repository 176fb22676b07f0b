// The two files a host runs that are not in its AMI: the enclave image (EIF) and the host-poller
// binary. They are CDK file assets: `cdk deploy` publishes each to the CDK assets bucket (the
// bootstrap's) under a key derived from its content before it updates the stack, and the launch
// template names those keys and each file's SHA-256. A new image is new keys and new user data,
// so a new launch template version that the group rolls onto (fleet.ts); hosts of the current
// version keep fetching the objects they were made for, which no later deploy overwrites.
// Synth builds nothing: the files come from `-c enclaveEif=PATH -c hostPoller=PATH` (or the
// construct's props), as scripts/deploy.sh step 2 brought them back from the image build.
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Annotations, Aws, CfnRule, Fn } from 'aws-cdk-lib';
import * as s3assets from 'aws-cdk-lib/aws-s3-assets';
import { Construct } from 'constructs';

/** One file of the host, published as an asset. */
export interface HostArtifact {
  /** The asset (bucket: the CDK assets bucket; key: `<content hash><extension>`). */
  readonly asset: s3assets.Asset;
  /** SHA-256 of the file, 64 lowercase hex: the host checks what it fetched against it. */
  readonly sha256: string;
}

/** What a synth without `-c enclaveEif`/`-c hostPoller` puts in place of file `name` (never runnable). */
export function placeholderText(name: string): string {
  return `ephem-batch placeholder for ${name}: this synth had no -c enclaveEif=PATH -c hostPoller=PATH; it cannot be deployed\n`;
}
/** Logical id of the rule that makes a template built on placeholders undeployable. */
export const NO_IMAGE_RULE_ID = 'EnclaveImageGiven';

export interface HostArtifactsProps {
  /** Path of the EIF; with `hostPoller`, or neither (then placeholders). */
  readonly enclaveEif?: string;
  readonly hostPoller?: string;
}

export class HostArtifacts extends Construct {
  readonly enclaveEif: HostArtifact;
  readonly hostPoller: HostArtifact;
  /** True when the files are placeholders (a synth for tests, cfn-lint or the emulator flow). */
  readonly placeholder: boolean;

  constructor(scope: Construct, id: string, props: HostArtifactsProps) {
    super(scope, id);
    this.placeholder = props.enclaveEif === undefined || props.hostPoller === undefined;
    const eif = props.enclaveEif ?? placeholderFile('enclave.eif');
    const poller = props.hostPoller ?? placeholderFile('host-poller');
    this.enclaveEif = artifact(this, 'EnclaveImage', eif);
    this.hostPoller = artifact(this, 'HostPoller', poller);
    if (this.placeholder) {
      // The offline synths (cdk/scripts/test.sh, the emulator flow) have no image and still need a
      // template; CloudFormation checks rules before it changes anything, so this one can never be
      // deployed, and never rolls a fleet onto hosts that would fail their boot checks.
      new CfnRule(this, NO_IMAGE_RULE_ID, {
        assertions: [
          {
            // Never true (an account id is 12 digits), and not a constant cfn-lint would flag.
            assert: Fn.conditionEquals(Aws.ACCOUNT_ID, 'synthesized without an enclave image'),
            assertDescription:
              'This template was synthesized without the enclave image: synthesize and deploy with -c enclaveEif=PATH -c hostPoller=PATH (scripts/deploy.sh step 3 does).',
          },
        ],
      });
      Annotations.of(this).addWarningV2(
        'ephem-batch:no-enclave-image',
        'No -c enclaveEif=PATH -c hostPoller=PATH: placeholders stand in, and CloudFormation will refuse to deploy this template.',
      );
    }
  }
}

function artifact(scope: Construct, id: string, file: string): HostArtifact {
  return { asset: new s3assets.Asset(scope, id, { path: file }), sha256: sha256File(file) };
}

/** SHA-256 of a file, read in chunks (an EIF is a few hundred MB). */
export function sha256File(file: string): string {
  const hash = crypto.createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.alloc(1 << 20);
    let n: number;
    while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) hash.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

/** The placeholder's file, the same content (and so the same asset key) in every synth. */
function placeholderFile(name: string): string {
  const dir = path.join(os.tmpdir(), `ephem-batch-placeholder-${process.getuid?.() ?? 'user'}`);
  const file = path.join(dir, name);
  const text = placeholderText(name);
  if (fs.existsSync(file) && fs.readFileSync(file, 'utf8') === text) return file;
  fs.mkdirSync(dir, { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
  return file;
}
