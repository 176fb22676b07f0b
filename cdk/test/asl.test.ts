// The bulk workflow's ASL file is shared with the Rust tests, so check it on its own:
// well-formed, every transition lands on a state, every state is reachable, each task calls
// only what the state machine's role allows, and each shard is awaited on a task token.
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

  const tasks = () => machines(asl).flatMap(([, m]) => Object.entries(m.States).filter(([, s]) => s.Type === 'Task'));

  it('calls only the three bulk Lambdas (the await step waits for a task token), and nothing else', () => {
    const resources = tasks().map(([, s]) => s.Resource);
    assert.deepEqual([...new Set(resources)].sort(), ['arn:aws:states:::lambda:invoke', 'arn:aws:states:::lambda:invoke.waitForTaskToken']);
    const functions = tasks().map(([name, s]) => `${name}: ${s.Parameters.FunctionName}`);
    assert.deepEqual(functions.sort(), [
      'Aggregate: ${BulkAggregateFunctionArn}',
      'AwaitShard: ${BulkAwaitShardFunctionArn}',
      'ListShards: ${BulkListShardsFunctionArn}',
    ]);
    const [[, awaitShard]] = tasks().filter(([, s]) => s.Resource.endsWith('.waitForTaskToken'));
    assert.equal(awaitShard.Parameters.FunctionName, '${BulkAwaitShardFunctionArn}');
  });

  it('awaits each shard on its task token, for at most 24 h, and keeps nothing of what completes it', () => {
    const waits = tasks().filter(([, s]) => s.Resource.endsWith('.waitForTaskToken'));
    assert.equal(waits.length, 1);
    const [[name, s]] = waits;
    assert.equal(s.Parameters.Payload['task_token.$'], '$$.Task.Token', `${name} hands the function its token`);
    assert.equal(s.TimeoutSeconds, 86400, `${name} TimeoutSeconds`);
    assert.equal(s.HeartbeatSeconds, undefined, 'nothing sends heartbeats');
    assert.equal(s.ResultPath, null, `${name}: the completer's output is dropped`);
    const caught = (s.Catch as any[]).map((c) => c.ErrorEquals.join(','));
    assert.deepEqual(caught, ['States.Timeout', 'States.ALL'], `${name}: a timeout and a failure end the shard, not the run`);
  });

  it('every Lambda task retries only Lambda service errors', () => {
    for (const [name, s] of tasks()) {
      const retried = (s.Retry as any[]).flatMap((r) => r.ErrorEquals as string[]);
      assert.ok(retried.length > 0 && retried.every((e) => e.startsWith('Lambda.')), `${name}: ${retried.join(',')}`);
    }
  });

  it('keeps one word per shard in the state: no key, receipt key, error or cause grows it', () => {
    const map = asl.States.AwaitShards;
    assert.equal(map.ResultPath, '$.outcomes');
    const items = map.ItemProcessor as StateMachineDef;
    const ends = Object.entries(items.States).filter(([, s]) => s.End);
    assert.deepEqual(ends.map(([, s]) => [s.Type, s.Result, s.Parameters]).sort(), [
      ['Pass', 'committed', undefined],
      ['Pass', 'failed', undefined],
      ['Pass', 'timed_out', undefined],
    ]);
    for (const c of items.States.AwaitShard.Catch) assert.equal(c.ResultPath, null, 'a caught error (its cause chosen by a host) is dropped');
    // The aggregate step is handed the words and reads the listing back from the jobs bucket.
    assert.deepEqual(Object.keys(asl.States.Aggregate.Parameters.Payload).sort(), ['bucket', 'bulk_id.$', 'outcomes.$', 'prefix.$']);
  });

  it('a 1000-shard run stays under the 25,000 events of an execution history, every await retry used', () => {
    // Per shard: its iteration (2), AwaitShard entered/exited (2), scheduled/started/submitted/
    // ended (4) plus 3 per retried attempt, ShardCommitted (2); the rest of the run is 18 events.
    const retries = Math.max(...(asl.States.AwaitShards.ItemProcessor.States.AwaitShard.Retry as any[]).map((r) => r.MaxAttempts));
    const events = 18 + 1000 * (2 + 2 + 4 + 3 * retries + 2);
    assert.ok(events <= 25000, `${events} events`);
  });
});
