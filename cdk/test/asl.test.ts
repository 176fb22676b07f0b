// The bulk workflow's ASL file is shared with the Rust tests, so check it on its own:
// well-formed, every transition lands on a state, every state is reachable, and each task
// calls only what the state machine's role allows.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { readAsl } from '../lib/workflow';

interface StateMachineDef {
  StartAt: string;
  States: Record<string, any>;
}

const asl = JSON.parse(readAsl()) as StateMachineDef;

function machines(def: StateMachineDef, where = 'top'): [string, StateMachineDef][] {
  const out: [string, StateMachineDef][] = [[where, def]];
  for (const [name, s] of Object.entries(def.States)) {
    if (s.Type === 'Map') out.push(...machines(s.ItemProcessor ?? s.Iterator, `${where}/${name}`));
    if (s.Type === 'Parallel') (s.Branches as StateMachineDef[]).forEach((b, i) => out.push(...machines(b, `${where}/${name}[${i}]`)));
  }
  return out;
}

function successors(s: any): string[] {
  const next = [s.Next, s.Default, ...(s.Choices ?? []).map((c: any) => c.Next), ...(s.Catch ?? []).map((c: any) => c.Next)];
  return next.filter((x): x is string => typeof x === 'string');
}

describe('bulk workflow ASL', () => {
  for (const [where, m] of machines(asl)) {
    it(`${where}: transitions land on states, all states reachable, terminal states end`, () => {
      assert.ok(m.States[m.StartAt], `StartAt ${m.StartAt}`);
      const seen = new Set<string>();
      const todo = [m.StartAt];
      while (todo.length) {
        const name = todo.pop()!;
        if (seen.has(name)) continue;
        seen.add(name);
        const s = m.States[name];
        assert.ok(s, `${name} exists`);
        const next = successors(s);
        for (const n of next) assert.ok(m.States[n], `${name} -> ${n}`);
        if (!['Choice', 'Succeed', 'Fail'].includes(s.Type) && !s.End) assert.ok(s.Next, `${name} has Next or End`);
        todo.push(...next);
      }
      assert.deepEqual([...seen].sort(), Object.keys(m.States).sort());
    });
  }

  it('calls only the two bulk Lambdas and S3 ListObjectsV2', () => {
    const resources = machines(asl).flatMap(([, m]) => Object.values(m.States).filter((s: any) => s.Type === 'Task').map((s: any) => s.Resource));
    assert.deepEqual([...new Set(resources)].sort(), ['arn:aws:states:::aws-sdk:s3:listObjectsV2', 'arn:aws:states:::lambda:invoke']);
    const functions = machines(asl).flatMap(([, m]) =>
      Object.values(m.States).filter((s: any) => s.Resource === 'arn:aws:states:::lambda:invoke').map((s: any) => s.Parameters.FunctionName),
    );
    assert.deepEqual(functions.sort(), ['${BulkAggregateFunctionArn}', '${BulkListShardsFunctionArn}']);
  });

  it('looks for receipts at jobs/<job_id>/receipt.cose', () => {
    const text = JSON.stringify(asl);
    assert.ok(text.includes("States.Format('jobs/{}/receipt.cose', $.shard.job_id)"));
  });
});
