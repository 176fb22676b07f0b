// The AWS SDK operations the adapters of cloud-aws/src/ send, found in the code, and the table of
// who sends them (test/aws-calls.json). `node dist/test/aws-calls.js` prints the inventory.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { repoRoot } from '../lib/config';

export const ADAPTERS_DIR = path.join('cloud-aws', 'src');
export const TABLE = path.join(repoRoot(), 'cdk', 'test', 'aws-calls.json');

/** The SDK service of an adapter file's `client` (its field is one SDK client). */
const SERVICE_OF_FILE: [RegExp, string][] = [
  [/^s3(_\w+)?\.rs$/, 's3'],
  [/^sqs\.rs$/, 'sqs'],
  [/^kms\.rs$/, 'kms'],
  [/^sfn\.rs$/, 'sfn'],
];
/** Methods of an SDK client that send nothing. */
const NOT_OPERATIONS = new Set(['config', 'clone']);

export interface Found {
  readonly operation: string; // `service:snake_case_operation`
  readonly file: string;
}

/**
 * Every `client.<op>(` (an adapter's own SDK client) and `clients.<service>.<op>(` (the shared
 * clients of bootstrap.rs) in the adapters, across line breaks, as `service:op`.
 */
export function sdkOperations(root: string = repoRoot()): Found[] {
  const dir = path.join(root, ADAPTERS_DIR);
  const out: Found[] = [];
  const files = fs.readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.rs')).sort();
  for (const file of files) {
    const text = fs.readFileSync(path.join(dir, file), 'utf8');
    const base = path.basename(file);
    for (const m of text.matchAll(/\bclients\s*\.\s*(s3|sqs|kms|sfn)\s*\.\s*([a-z][a-z0-9_]*)\s*\(/g)) {
      if (!NOT_OPERATIONS.has(m[2])) out.push({ operation: `${m[1]}:${m[2]}`, file });
    }
    for (const m of text.matchAll(/\bclient\s*\.\s*([a-z][a-z0-9_]*)\s*\(/g)) {
      if (NOT_OPERATIONS.has(m[1])) continue;
      const service = SERVICE_OF_FILE.find(([re]) => re.test(base))?.[1];
      if (!service) throw new Error(`${ADAPTERS_DIR}/${file} calls client.${m[1]}(): say which SDK service its client is (test/aws-calls.ts)`);
      out.push({ operation: `${service}:${m[1]}`, file });
    }
  }
  return out;
}

export interface CallRow {
  readonly binary: string;
  readonly role: string;
  readonly op: string;
  readonly action: string;
  readonly resource: string;
  readonly context?: Record<string, string>;
  readonly why?: string;
}

export interface DenyRow {
  readonly why: string;
  readonly role: string;
  readonly action: string;
  readonly resource: string;
  readonly context?: Record<string, string>;
  readonly expect?: 'ExplicitlyDenied';
}

export interface CallTable {
  readonly operations: Record<string, { actions: string[]; outsideTemplate?: string; note?: string }>;
  readonly allowed: CallRow[];
  readonly denied: DenyRow[];
}

export function readTable(file: string = TABLE): CallTable {
  return JSON.parse(fs.readFileSync(file, 'utf8')) as CallTable;
}

if (require.main === module) {
  const found = sdkOperations();
  const table = readTable();
  const byOp = new Map<string, string[]>();
  for (const f of found) byOp.set(f.operation, [...(byOp.get(f.operation) ?? []), f.file]);
  for (const [op, files] of [...byOp].sort()) {
    const row = table.operations[op];
    const callers = [...new Set(table.allowed.filter((c) => c.op === op).map((c) => c.binary))];
    const who = row === undefined ? 'NOT IN THE TABLE' : row.outsideTemplate ? `outside the template: ${row.outsideTemplate}` : callers.join(', ');
    console.log(`${op.padEnd(50)} ${[...new Set(files)].join(',').padEnd(28)} ${who}`);
  }
}
