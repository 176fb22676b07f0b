// Each component may make exactly the calls its binary makes (docs/operations.md §5): the S3 and
// SQS grants of the hosts and the Lambdas, statement by statement, and the rules every grant keeps.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { repoRoot } from '../lib/config';
import { flattenForNag } from '../lib/nag';
import { asArray, CfnTemplate, defaultStack, identityStatements, referencedId, resourcesOfType, synth } from './helpers';

const { json, stack } = defaultStack();
const statements = identityStatements(json);

/** A resource as the docs write it: `JOBS/jobs/*`, `ATTESTATIONS` (bucket logical ids → names). */
function resourceName(resource: unknown): string {
  return flattenForNag(resource)
    .replace(/<Storage(Jobs|Models|Attestations|Artifacts|Ledger)[0-9A-F]{8}\.Arn>/g, (_m, b: string) => b.toUpperCase())
    .replace(/<Queues(\w+?)[0-9A-F]{8}\.Arn>/g, (_m, q: string) => `queue:${q}`)
    .replace(/^arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-<AWS::AccountId>-<AWS::Region>/, 'CDK_ASSETS');
}

interface Grant {
  actions: string[];
  resources: string[];
  condition?: unknown;
}

/** The statements of the policies of `owner` (a logical id prefix), by Sid. */
function grantsOf(owner: string): Record<string, Grant> {
  const out: Record<string, Grant> = {};
  for (const { owner: o, statement: s } of statements) {
    if (!o.startsWith(owner) || !s.Sid) continue;
    assert.equal(out[s.Sid], undefined, `${owner}: Sid ${s.Sid} appears twice`);
    out[s.Sid] = { actions: asArray<string>(s.Action), resources: asArray(s.Resource).map(resourceName), ...(s.Condition ? { condition: s.Condition } : {}) };
  }
  return out;
}

/** Only the S3 statements of `grants`. */
function s3Only(grants: Record<string, Grant>): Record<string, Grant> {
  return Object.fromEntries(Object.entries(grants).filter(([, g]) => g.actions.some((a) => a.startsWith('s3:'))));
}

const prefix = (...patterns: string[]) => ({ StringLike: { 's3:prefix': patterns } });

function lambdaEnvironment(name: string, t: CfnTemplate = json): Record<string, unknown> {
  const [[, f]] = resourcesOfType(t, 'AWS::Lambda::Function').filter(([, x]) => x.Properties?.Description === `ephem-batch ${name}`);
  return f.Properties?.Environment?.Variables ?? {};
}

describe('host-poller (HostRole)', () => {
  const host = grantsOf('IdentitiesHostRole');

  it('S3: exactly the reads, writes, lists and deletes host-poller makes', () => {
    assert.deepEqual(s3Only(host), {
      ReadSealedInputsAndReceipts: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/input.sealed', 'JOBS/jobs/*/receipt.cose'] },
      ReadJobMarkers: {
        actions: ['s3:GetObject'],
        resources: ['JOBS/jobs/*/cancel.json', 'JOBS/jobs/*/ledgered.json', 'JOBS/jobs/*/status.json', 'JOBS/jobs/*/bulk-tasks/*'],
      },
      KnowAbsentJobObjects: {
        actions: ['s3:ListBucket'],
        resources: ['JOBS'],
        condition: prefix('jobs/*/receipt.cose', 'jobs/*/cancel.json', 'jobs/*/bulk-tasks/*'),
      },
      WriteAttemptOutputsAndStatus: { actions: ['s3:PutObject', 's3:AbortMultipartUpload'], resources: ['JOBS/jobs/*/attempts/*', 'JOBS/jobs/*/status.json'] },
      CommitReceiptOnlyIfAbsent: { actions: ['s3:PutObject'], resources: ['JOBS/jobs/*/receipt.cose'], condition: { Null: { 's3:if-none-match': 'false' } } },
      DeleteLosingAttemptOutputs: { actions: ['s3:DeleteObject'], resources: ['JOBS/jobs/*/attempts/*'] },
      ReadModels: { actions: ['s3:GetObject'], resources: ['MODELS/*'] },
      ListModels: { actions: ['s3:ListBucket'], resources: ['MODELS'], condition: prefix('models/*') },
      ReadFleetKeys: { actions: ['s3:GetObject'], resources: ['ATTESTATIONS/fleet-keys/*', 'ATTESTATIONS/fleet-genesis/*'] },
      ListFleetKeys: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('fleet-keys/*', 'fleet-genesis/*') },
      CreateFleetEpochsIfAbsent: {
        actions: ['s3:PutObject'],
        resources: ['ATTESTATIONS/fleet-keys/*', 'ATTESTATIONS/fleet-genesis/*'],
        condition: { Null: { 's3:if-none-match': 'false' } },
      },
      PublishAttestations: { actions: ['s3:PutObject'], resources: ['ATTESTATIONS/attestations/*'] },
      ReadAttestationDocumentsAndRequests: {
        actions: ['s3:GetObject'],
        resources: ['ATTESTATIONS/attestations/by-hash/*', 'ATTESTATIONS/attestations/requests/*', 'ATTESTATIONS/attestations/fresh/*'],
      },
      ListAttestationRequests: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('attestations/requests/*') },
      KnowAbsentAttestationDocuments: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('attestations/by-hash/*') },
      ConfirmOwnAttestationPublished: { actions: ['s3:GetObject'], resources: ['ATTESTATIONS/attestations/current/*'] },
      DeleteAnsweredAttestationRequests: { actions: ['s3:DeleteObject'], resources: ['ATTESTATIONS/attestations/requests/*'] },
      // The two objects the launch template names in the CDK assets bucket (host-artifacts.ts).
      FetchArtifacts: {
        actions: ['s3:GetObject'],
        resources: [`CDK_ASSETS/${stack.fleet.artifacts.enclaveEif.asset.s3ObjectKey}`, `CDK_ASSETS/${stack.fleet.artifacts.hostPoller.asset.s3ObjectKey}`],
      },
    });
  });

  it('fleet-key epochs: only hosts store them, create-only, and no Lambda writes one (enclaves create epochs)', () => {
    const writers = statements
      .filter(({ statement: s }) => s.Effect === 'Allow' && asArray<string>(s.Action).some((a) => a === 's3:PutObject' || a === 's3:*' || a === '*'))
      .filter(({ statement: s }) => asArray(s.Resource).map(resourceName).some((r) => /^ATTESTATIONS\/(fleet-keys|fleet-genesis|\*)/.test(r)));
    assert.deepEqual(writers.map(({ owner, statement: s }) => `${owner.replace(/[0-9A-F]{8}$/, '')}:${s.Sid}`), ['IdentitiesHostRoleDefaultPolicy:CreateFleetEpochsIfAbsent']);
    assert.deepEqual(writers[0].statement.Condition, { Null: { 's3:if-none-match': 'false' } });
    // Nothing of the retired rotation Lambda is left.
    assert.ok(!Object.keys(json.Resources).some((id) => /FleetRotate/.test(id)), 'no fleet-rotate resource');
    assert.ok(!resourcesOfType(json, 'AWS::Events::Rule').length, 'no schedule');
    assert.equal(json.Outputs?.FleetRotateFunctionName, undefined);
  });

  it('CloudWatch Logs: ships its journal and boot log to the host log group only', () => {
    assert.deepEqual(host.ShipHostLogs.actions, ['logs:CreateLogStream', 'logs:PutLogEvents', 'logs:DescribeLogStreams']);
    assert.match(host.ShipHostLogs.resources.join(), /^<FleetHostLogs[0-9A-F]{8}\.Arn>$/);
    const logs = statements.filter(({ owner, statement: s }) => owner.startsWith('IdentitiesHostRole') && asArray<string>(s.Action).some((a) => a.startsWith('logs:')));
    assert.deepEqual(logs.map(({ statement: s }) => s.Sid), ['ShipHostLogs']);
  });

  it('Step Functions: complete the task of a bulk run waiting for a job, on the bulk state machine only', () => {
    assert.deepEqual(host.CompleteBulkTasks.actions, ['states:SendTaskSuccess', 'states:SendTaskFailure']);
    assert.match(host.CompleteBulkTasks.resources[0], /^<BulkWorkflowStateMachine[0-9A-F]{8}>$/);
  });

  it('SQS: receive jobs, send receipts to the ledger', () => {
    assert.deepEqual(host.ReceiveJobs, {
      actions: ['sqs:ReceiveMessage', 'sqs:DeleteMessage', 'sqs:ChangeMessageVisibility', 'sqs:GetQueueAttributes'],
      resources: ['queue:Jobs'],
    });
    assert.deepEqual(host.SendReceiptsToLedger, { actions: ['sqs:SendMessage'], resources: ['queue:Ledger'] });
  });

  it('publishes no metrics, completes only its own group\'s lifecycle hooks (launch, drain; no heartbeat) and sets only its own group\'s instance health', () => {
    const all = statements.filter(({ owner }) => owner.startsWith('IdentitiesHostRole') || owner.startsWith('FleetHostDrainPolicy'));
    assert.ok(!all.some(({ statement: s }) => asArray<string>(s.Action).some((a) => a.startsWith('cloudwatch:'))));
    const hooks = grantsOf('FleetHostDrainPolicy');
    assert.deepEqual(hooks, {
      CompleteOwnLifecycleHooks: { actions: ['autoscaling:CompleteLifecycleAction'], resources: [hooks.CompleteOwnLifecycleHooks?.resources[0]] },
      SetOwnGroupInstanceHealth: { actions: ['autoscaling:SetInstanceHealth'], resources: [hooks.CompleteOwnLifecycleHooks?.resources[0]] },
    });
    // Both scoped to this group, by name: the health watcher can mark unhealthy only its own group's hosts.
    assert.match(hooks.CompleteOwnLifecycleHooks.resources[0], /^arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:autoScalingGroup:\*:autoScalingGroupName\/<FleetHostsASG[0-9A-F]{8}>$/);
    // Nothing else of Auto Scaling, anywhere in the host's policies.
    const autoscaling = all.flatMap(({ statement: s }) => asArray<string>(s.Action)).filter((a) => a.startsWith('autoscaling:'));
    assert.deepEqual(autoscaling.sort(), ['autoscaling:CompleteLifecycleAction', 'autoscaling:SetInstanceHealth']);
  });
});

describe('Lambdas', () => {
  it('on-upload reads headers, epochs and manifests, writes status.json, copies shards, queues jobs, reads a refused job\'s bulk task', () => {
    assert.deepEqual(s3Only(grantsOf('IdentitiesOnUploadRole')), {
      ReadSealedHeaders: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/input.sealed', 'JOBS/stores/*.sealed'] },
      CopyShardsToJobInputs: { actions: ['s3:PutObject', 's3:AbortMultipartUpload'], resources: ['JOBS/jobs/*/input.sealed'] },
      WriteJobStatus: { actions: ['s3:PutObject'], resources: ['JOBS/jobs/*/status.json'] },
      ReadFleetKeyEpochs: { actions: ['s3:GetObject'], resources: ['ATTESTATIONS/fleet-keys/*'] },
      KnowAbsentEpochs: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('fleet-keys/*') },
      ReadModelManifests: { actions: ['s3:GetObject'], resources: ['MODELS/models/*/manifest.cose'] },
      ListModelManifests: { actions: ['s3:ListBucket'], resources: ['MODELS'], condition: prefix('models/*') },
      ReadBulkTasks: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/bulk-tasks/*'] },
      ListBulkTasks: { actions: ['s3:ListBucket'], resources: ['JOBS'], condition: prefix('jobs/*/bulk-tasks/*') },
    });
    const env = lambdaEnvironment('on-upload');
    assert.ok(env.EPHEM_ATTESTATIONS_BUCKET && env.EPHEM_MODELS_BUCKET, 'the epoch and manifest checks are on');
  });

  it('on-upload fails (never succeeds) tasks of the bulk state machine only, and makes no other call', () => {
    const onUpload = grantsOf('IdentitiesOnUploadRole');
    const [[stateMachineId]] = resourcesOfType(json, 'AWS::StepFunctions::StateMachine');
    assert.deepEqual(onUpload.FailBulkTasks, { actions: ['states:SendTaskFailure'], resources: [`<${stateMachineId}>`] });
    assert.deepEqual(onUpload.SendJobMessages, { actions: ['sqs:SendMessage'], resources: ['queue:Jobs'] });
    assert.deepEqual(Object.keys(onUpload).sort(), [
      'CopyShardsToJobInputs', 'FailBulkTasks', 'KnowAbsentEpochs', 'ListBulkTasks', 'ListModelManifests', 'ReadBulkTasks',
      'ReadFleetKeyEpochs', 'ReadModelManifests', 'ReadSealedHeaders', 'SendJobMessages', 'WriteJobStatus', 'WriteOwnLogs',
    ]);
    // Every policy attached to the role: its default policy alone (the state machine does not name on-upload).
    const [[roleId]] = resourcesOfType(json, 'AWS::IAM::Role').filter(([id]) => id.startsWith('IdentitiesOnUploadRole'));
    const attached = resourcesOfType(json, 'AWS::IAM::Policy').filter(([, p]) => asArray(p.Properties?.Roles).map(referencedId).includes(roleId));
    assert.deepEqual(attached.map(([id]) => id.replace(/[0-9A-F]{8}$/, '')), ['IdentitiesOnUploadRoleDefaultPolicy']);
  });

  it('on-upload is tried three times, an event queued six hours at most, then its record goes to the upload-failure queue', () => {
    const [[onUploadId]] = resourcesOfType(json, 'AWS::Lambda::Function').filter(([, f]) => f.Properties?.Description === 'ephem-batch on-upload');
    const configs = resourcesOfType(json, 'AWS::Lambda::EventInvokeConfig');
    assert.equal(configs.length, 1);
    const [[, config]] = configs;
    assert.equal(referencedId(config.Properties?.FunctionName), onUploadId);
    assert.equal(config.Properties?.MaximumRetryAttempts, 2);
    assert.equal(config.Properties?.MaximumEventAgeInSeconds, 6 * 3600);
    assert.match(resourceName(config.Properties?.DestinationConfig?.OnFailure?.Destination), /^queue:UploadFailures$/);
    // Its only other SQS right: sending to that queue (the destination's grant, no Sid).
    const sends = statements.filter(({ owner, statement: s }) => owner.startsWith('IdentitiesOnUploadRole') && asArray<string>(s.Action).some((a) => a.startsWith('sqs:')));
    const targets = sends.map(({ statement: s }) => asArray(s.Resource).map(resourceName).join(',')).sort();
    assert.deepEqual(targets, ['queue:Jobs', 'queue:UploadFailures']);
    const copyTimeout = resourcesOfType(json, 'AWS::Lambda::Function').find(([id]) => id === onUploadId)![1].Properties?.Timeout;
    assert.equal(copyTimeout, 900, 'a server-side copy of a large shard has 15 minutes');
  });

  it('job-dead-letter reads a job\'s end and a shard\'s header, writes failed only conditionally, completes bulk tasks, consumes both queues, sends unledgered receipts on', () => {
    const grants = grantsOf('IdentitiesJobDeadLetterRole');
    assert.deepEqual(s3Only(grants), {
      ReadJobEnds: {
        actions: ['s3:GetObject'],
        resources: ['JOBS/jobs/*/status.json', 'JOBS/jobs/*/receipt.cose', 'JOBS/jobs/*/ledgered.json', 'JOBS/jobs/*/bulk-tasks/*'],
      },
      ReadAttestationDocuments: { actions: ['s3:GetObject'], resources: ['ATTESTATIONS/attestations/by-hash/*'] },
      KnowAbsentAttestationDocuments: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('attestations/by-hash/*') },
      ReadJobInputsAndShardHeaders: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/input.sealed', 'JOBS/stores/*.sealed'] },
      KnowAbsentJobObjects: {
        actions: ['s3:ListBucket'],
        resources: ['JOBS'],
        condition: prefix('jobs/*/status.json', 'jobs/*/receipt.cose', 'jobs/*/ledgered.json', 'jobs/*/bulk-tasks/*', 'jobs/*/input.sealed'),
      },
      CreateFailedStatusIfAbsent: { actions: ['s3:PutObject'], resources: ['JOBS/jobs/*/status.json'], condition: { Null: { 's3:if-none-match': 'false' } } },
      ReplaceUnendedStatusIfMatch: { actions: ['s3:PutObject'], resources: ['JOBS/jobs/*/status.json'], condition: { Null: { 's3:if-match': 'false' } } },
    });
    const [[stateMachineId]] = resourcesOfType(json, 'AWS::StepFunctions::StateMachine');
    assert.deepEqual(grants.CompleteBulkTasks, { actions: ['states:SendTaskSuccess', 'states:SendTaskFailure'], resources: [`<${stateMachineId}>`] });
    assert.deepEqual(Object.keys(grants).sort(), [
      'CompleteBulkTasks', 'CreateFailedStatusIfAbsent', 'KnowAbsentAttestationDocuments', 'KnowAbsentJobObjects', 'ReadAttestationDocuments',
      'ReadJobEnds', 'ReadJobInputsAndShardHeaders', 'ReplaceUnendedStatusIfMatch', 'SendReceiptsToLedger', 'WriteOwnLogs',
    ]);
    assert.deepEqual(grants.SendReceiptsToLedger, { actions: ['sqs:SendMessage'], resources: ['queue:Ledger'] });
    // The statements CDK adds for the event sources: consume the two queues, nothing else.
    const sqs = statements.filter(
      ({ owner, statement: s }) => owner.startsWith('IdentitiesJobDeadLetterRole') && s.Sid !== 'SendReceiptsToLedger' && asArray<string>(s.Action).some((a) => a.startsWith('sqs:')),
    );
    const consumed = sqs.flatMap(({ statement: s }) => asArray(s.Resource).map(resourceName)).sort();
    assert.deepEqual(consumed, ['queue:JobsDlq', 'queue:UploadFailures']);
    for (const { statement: s } of sqs) assert.ok(!asArray<string>(s.Action).includes('sqs:SendMessage'), 'it sends to no queue it consumes');

    const [[fnId, fn]] = resourcesOfType(json, 'AWS::Lambda::Function').filter(([, f]) => f.Properties?.Description === 'ephem-batch job-dead-letter');
    const sources = resourcesOfType(json, 'AWS::Lambda::EventSourceMapping').filter(([, m]) => referencedId(m.Properties?.FunctionName) === fnId);
    assert.deepEqual(sources.map(([, m]) => resourceName(m.Properties?.EventSourceArn)).sort(), ['queue:JobsDlq', 'queue:UploadFailures']);
    for (const [, m] of sources) assert.deepEqual(m.Properties?.FunctionResponseTypes, ['ReportBatchItemFailures']);
    for (const [, m] of sources) {
      const queue = json.Resources[referencedId(m.Properties?.EventSourceArn)!];
      assert.ok(queue.Properties?.VisibilityTimeout >= 6 * fn.Properties?.Timeout, 'a queue hides a message six times the function\'s timeout');
    }
    const [[jobsBucketId]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([id]) => id.startsWith('StorageJobs'));
    const [[attestationsBucketId]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([id]) => id.startsWith('StorageAttestations'));
    const [[ledgerQueueId]] = resourcesOfType(json, 'AWS::SQS::Queue').filter(([id]) => id.startsWith('QueuesLedger') && !id.startsWith('QueuesLedgerDlq'));
    assert.deepEqual(lambdaEnvironment('job-dead-letter'), {
      EPHEM_JOBS_BUCKET: { Ref: jobsBucketId },
      EPHEM_STORE_PREFIXES: 'stores/',
      EPHEM_ATTESTATIONS_BUCKET: { Ref: attestationsBucketId },
      EPHEM_LEDGER_QUEUE_URL: { Ref: ledgerQueueId },
      RUST_LOG: 'info',
    });
  });

  it('ledger-append writes ledger-proof.json, transparent-statement.cbor and ledgered.json (no object tags), reads the signed policies and no attestations bucket', () => {
    const ledger = s3Only(grantsOf('IdentitiesLedgerAppendRole'));
    assert.deepEqual(ledger.MarkJobsLedgered, {
      actions: ['s3:PutObject'],
      resources: ['JOBS/jobs/*/ledger-proof.json', 'JOBS/jobs/*/transparent-statement.cbor', 'JOBS/jobs/*/ledgered.json'],
    });
    assert.deepEqual(ledger.ReadAttestationPolicies, { actions: ['s3:GetObject'], resources: ['ARTIFACTS/artifacts/policies/*'] });
    assert.deepEqual(ledger.ListAttestationPolicies, { actions: ['s3:ListBucket'], resources: ['ARTIFACTS'], condition: prefix('artifacts/policies/*') });
    assert.deepEqual(
      Object.entries(ledger).filter(([, g]) => g.resources.some((r) => !r.startsWith('LEDGER'))).map(([sid]) => sid),
      ['ReadAttestationPolicies', 'ListAttestationPolicies', 'MarkJobsLedgered'],
    );
    const env = lambdaEnvironment('ledger-append');
    assert.equal(env.EPHEM_LEDGERED_TAG, undefined);
    assert.equal(env.EPHEM_ATTESTATIONS_BUCKET, undefined);
  });

  it('ledger-append settles its messages: backoff on the ledger queue, held receipts sent to the ledger DLQ only', () => {
    const env = lambdaEnvironment('ledger-append');
    const queueId = (prefix: string) => resourcesOfType(json, 'AWS::SQS::Queue').map(([id]) => id).find((id) => new RegExp(`^Queues${prefix}[0-9A-F]{8}$`).test(id));
    assert.deepEqual(env.EPHEM_LEDGER_QUEUE_URL, { Ref: queueId('Ledger') });
    assert.deepEqual(env.EPHEM_LEDGER_DLQ_URL, { Ref: queueId('LedgerDlq') });
    const grants = grantsOf('IdentitiesLedgerAppendRole');
    assert.deepEqual(grants.DeadLetterHeldReceipts, { actions: ['sqs:SendMessage'], resources: ['queue:LedgerDlq'] });
    // The event source's grant (no Sid) covers the visibility and the redrive policy it reads.
    const sqs = statements.filter(({ owner, statement: s }) => owner.startsWith('IdentitiesLedgerAppendRole') && asArray<string>(s.Action).some((a) => a.startsWith('sqs:')));
    const onLedger = sqs.filter(({ statement: s }) => asArray(s.Resource).map(resourceName).includes('queue:Ledger')).flatMap(({ statement: s }) => asArray<string>(s.Action));
    for (const action of ['sqs:ReceiveMessage', 'sqs:ChangeMessageVisibility', 'sqs:GetQueueAttributes', 'sqs:DeleteMessage']) {
      assert.ok(onLedger.includes(action), `${action} on the ledger queue`);
    }
    assert.ok(!onLedger.includes('sqs:SendMessage'), 'it sends nothing to the ledger queue');
    const sends = sqs.filter(({ statement: s }) => asArray<string>(s.Action).includes('sqs:SendMessage')).flatMap(({ statement: s }) => asArray(s.Resource).map(resourceName));
    assert.deepEqual(sends, ['queue:LedgerDlq']);
  });

  it('bulk-list-shards lists and reads the shards under the store prefixes and writes its listing once', () => {
    assert.deepEqual(s3Only(grantsOf('IdentitiesBulkListShardsRole')), {
      ListStorePrefixes: { actions: ['s3:ListBucket'], resources: ['JOBS'], condition: prefix('stores/*') },
      ReadShardHeaders: { actions: ['s3:GetObject'], resources: ['JOBS/stores/*.sealed'] },
      CreateBulkListingsIfAbsent: { actions: ['s3:PutObject'], resources: ['JOBS/bulk/*/shards.json'], condition: { Null: { 's3:if-none-match': 'false' } } },
      ReadBulkListings: { actions: ['s3:GetObject'], resources: ['JOBS/bulk/*/shards.json'] },
    });
  });

  it('bulk-await-shard writes its run\'s bulk task slot, looks for the job\'s end, and sees it absent', () => {
    assert.deepEqual(s3Only(grantsOf('IdentitiesBulkAwaitShardRole')), {
      WriteBulkTasks: { actions: ['s3:PutObject'], resources: ['JOBS/jobs/*/bulk-tasks/*'] },
      ReadJobEnds: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/receipt.cose', 'JOBS/jobs/*/status.json'] },
      KnowAbsentJobEnds: { actions: ['s3:ListBucket'], resources: ['JOBS'], condition: prefix('jobs/*/receipt.cose', 'jobs/*/status.json') },
    });
    assert.deepEqual(Object.keys(grantsOf('IdentitiesBulkAwaitShardRole')).sort(), ['KnowAbsentJobEnds', 'ReadJobEnds', 'WriteBulkTasks', 'WriteOwnLogs']);
    const [[jobsBucketId]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([id]) => id.startsWith('StorageJobs'));
    assert.deepEqual(lambdaEnvironment('bulk-await-shard'), { EPHEM_JOBS_BUCKET: { Ref: jobsBucketId }, RUST_LOG: 'info' });
  });

  it('bulk-await-shard completes tasks of the bulk state machine only (a policy of its own: no dependency cycle)', () => {
    const policies = resourcesOfType(json, 'AWS::IAM::Policy').filter(([id]) => id.startsWith('BulkWorkflowAwaitShardTaskPolicy'));
    assert.equal(policies.length, 1);
    const [[policyId, policy]] = policies;
    assert.deepEqual(asArray(policy.Properties?.Roles).map(referencedId), [resourcesOfType(json, 'AWS::IAM::Role').find(([id]) => id.startsWith('IdentitiesBulkAwaitShardRole'))![0]]);
    const [[stateMachineId]] = resourcesOfType(json, 'AWS::StepFunctions::StateMachine');
    assert.deepEqual(grantsOf(policyId), {
      CompleteBulkTasks: { actions: ['states:SendTaskSuccess', 'states:SendTaskFailure'], resources: [`<${stateMachineId}>`] },
    });
  });

  it('bulk-aggregate reads the run\'s listing, looks for every shard\'s receipt (and a failed one\'s status), reads the documents receipts name, writes bulk manifests', () => {
    assert.deepEqual(s3Only(grantsOf('IdentitiesBulkAggregateRole')), {
      ReadReceipts: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/receipt.cose'] },
      ReadJobStatus: { actions: ['s3:GetObject'], resources: ['JOBS/jobs/*/status.json'] },
      KnowAbsentJobEnds: { actions: ['s3:ListBucket'], resources: ['JOBS'], condition: prefix('jobs/*/receipt.cose', 'jobs/*/status.json') },
      ReadAttestationDocuments: { actions: ['s3:GetObject'], resources: ['ATTESTATIONS/attestations/by-hash/*'] },
      KnowAbsentAttestationDocuments: { actions: ['s3:ListBucket'], resources: ['ATTESTATIONS'], condition: prefix('attestations/by-hash/*') },
      ReadBulkListings: { actions: ['s3:GetObject'], resources: ['JOBS/bulk/*/shards.json'] },
      WriteBulkManifests: { actions: ['s3:PutObject'], resources: ['JOBS/bulk/*/manifest.json'] },
      ReadAttestationPolicies: { actions: ['s3:GetObject'], resources: ['ARTIFACTS/artifacts/policies/*'] },
      ListAttestationPolicies: { actions: ['s3:ListBucket'], resources: ['ARTIFACTS'], condition: prefix('artifacts/policies/*') },
    });
    assert.ok(lambdaEnvironment('bulk-aggregate').EPHEM_ATTESTATIONS_BUCKET, 'the binary refuses to start without it');
  });

  it('ledger-append and bulk-aggregate are given the signed policies and the publisher key that verifies them', () => {
    const [[artifactsId]] = resourcesOfType(json, 'AWS::S3::Bucket').filter(([id]) => id.startsWith('StorageArtifacts'));
    for (const name of ['ledger-append', 'bulk-aggregate']) {
      const env = lambdaEnvironment(name);
      assert.deepEqual(env.EPHEM_POLICIES_BUCKET, { Ref: artifactsId }, name);
      assert.equal(env.EPHEM_POLICIES_PREFIX, 'artifacts/policies/', name);
      // Without the key the functions refuse to start: no default, no "any image".
      assert.equal(env.EPHEM_IMAGE_PUBLISHER_KEY, undefined, name);
    }
    const key = 'AB'.repeat(32);
    const withKey = synth({ imagePublisherKey: key }).json;
    for (const name of ['ledger-append', 'bulk-aggregate']) {
      assert.equal(lambdaEnvironment(name, withKey).EPHEM_IMAGE_PUBLISHER_KEY, key.toLowerCase(), name);
    }
    assert.throws(() => synth({ imagePublisherKey: 'abcd' }), /imagePublisherKey must be the image publisher's Ed25519 public key/);
  });
});

describe('rules every grant keeps', () => {
  it('no IAM statement grants any kms: action (key policies alone do)', () => {
    for (const { owner, statement } of statements) {
      for (const a of asArray<string>(statement.Action)) assert.ok(!a.toLowerCase().startsWith('kms:'), `${owner} grants ${a}`);
    }
  });

  it('no Allow on a data bucket has a wildcard action, in identity or bucket policies', () => {
    const bucketIds = resourcesOfType(json, 'AWS::S3::Bucket').map(([id]) => id);
    const bucketPolicies = resourcesOfType(json, 'AWS::S3::BucketPolicy').flatMap(([id, p]) =>
      asArray<any>(p.Properties?.PolicyDocument?.Statement).map((statement) => ({ owner: id, statement })),
    );
    let checked = 0;
    for (const { owner, statement } of [...statements, ...bucketPolicies]) {
      if (statement.Effect !== 'Allow') continue;
      const resources = JSON.stringify(statement.Resource);
      if (!bucketIds.some((id) => resources.includes(`"${id}"`))) continue;
      checked++;
      for (const a of asArray<string>(statement.Action)) assert.ok(!a.includes('*'), `${owner} allows ${a} on a bucket`);
    }
    assert.ok(checked > 20, `checked ${checked} statements`);
  });

  it('the bulk hand-off objects have one writer each: task slots bulk-await-shard, listings bulk-list-shards (create-only)', () => {
    // A resource pattern as S3 matches it: `*` is any run of characters, `/` included.
    const matches = (pattern: string, key: string) =>
      new RegExp(`^${pattern.split('*').map((p) => p.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`).test(key);
    const writers = (key: string) =>
      statements
        .filter(({ statement: s }) => s.Effect === 'Allow' && asArray<string>(s.Action).some((a) => a === 's3:PutObject' || a === 's3:*' || a === '*'))
        .filter(({ statement: s }) => asArray(s.Resource).map(resourceName).some((r) => matches(r, key)))
        .map(({ owner, statement: s }) => `${owner.replace(/[0-9A-F]{8}$/, '')}:${s.Sid}`)
        .sort();
    const job = 'ab'.repeat(16);
    assert.deepEqual(writers(`JOBS/jobs/${job}/bulk-tasks/run-1.json`), ['IdentitiesBulkAwaitShardRoleDefaultPolicy:WriteBulkTasks']);
    assert.deepEqual(writers('JOBS/bulk/run-1/shards.json'), ['IdentitiesBulkListShardsRoleDefaultPolicy:CreateBulkListingsIfAbsent']);
    assert.deepEqual(writers('JOBS/bulk/run-1/manifest.json'), ['IdentitiesBulkAggregateRoleDefaultPolicy:WriteBulkManifests']);
  });

  it('every s3:ListBucket names the prefixes it may list, but the ledger writer\'s on its own bucket', () => {
    for (const { owner, statement } of statements) {
      if (!asArray<string>(statement.Action).includes('s3:ListBucket')) continue;
      if (owner.startsWith('IdentitiesLedgerAppendRole') && statement.Sid === 'ListLedger') continue;
      assert.ok(statement.Condition?.StringLike?.['s3:prefix'], `${owner} ${statement.Sid}: ListBucket without an s3:prefix condition`);
    }
  });

  it('nothing tags objects, and only hosts delete (losing attempt outputs, answered attestation requests)', () => {
    for (const { owner, statement } of statements) {
      const actions = asArray<string>(statement.Action);
      assert.ok(!actions.some((a) => a.includes('Tagging')), `${owner}: ${actions.join(',')}`);
      if (actions.some((a) => a.startsWith('s3:Delete'))) {
        assert.ok(owner.startsWith('IdentitiesHostRole'), `${owner} deletes`);
        assert.ok(['DeleteLosingAttemptOutputs', 'DeleteAnsweredAttestationRequests'].includes(statement.Sid), statement.Sid);
      }
    }
  });
});

describe('docs/operations.md §5', () => {
  const doc = fs.readFileSync(path.join(repoRoot(), 'docs', 'operations.md'), 'utf8');
  const section = doc.slice(doc.indexOf('## 5. What each component may do'), doc.indexOf('## 6. '));

  it('names every Sid the stack grants to its components', () => {
    for (const { owner, statement } of statements) {
      if (!statement.Sid || !['Identities', 'FleetHostDrain', 'BulkWorkflow'].some((p) => owner.startsWith(p))) continue;
      assert.ok(section.includes(`\`${statement.Sid}\``), `§5 names ${statement.Sid} (${owner})`);
    }
  });

  it('leaves no call ungranted', () => {
    assert.ok(!/not granted/i.test(section), 'a "not granted" row remains in §5');
  });
});
