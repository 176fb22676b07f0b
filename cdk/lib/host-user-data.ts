// The boot script of a fleet host (Amazon Linux 2023): install nitro-cli, reserve the
// enclave's CPUs and memory, fetch the enclave image and the host-poller (CDK assets, named by
// their content: host-artifacts.ts), refuse either if its SHA-256 is not the one this launch
// template names and the image if its PCR0 is not the deployed measurement, then run the
// enclave, the poller and the drain watcher as systemd services. The host is untrusted: these
// checks only save time (a wrong image could not obtain keys anyway, the KMS key policies see to that).

/** An object the host fetches at boot, and the SHA-256 it must have. */
export interface FetchedFile {
  /** Bucket and key (tokens allowed: the CDK assets bucket's name is one). */
  readonly bucket: string;
  readonly key: string;
  /** 64 lowercase hex. */
  readonly sha256: string;
}

/** Where the boot script puts them. */
export const ENCLAVE_EIF_PATH = '/opt/ephem-batch/enclave.eif';
export const HOST_POLLER_PATH = '/opt/ephem-batch/host-poller';
/** The enclave's vsock context id on every host. */
export const ENCLAVE_CID = 16;
/** Name of the termination lifecycle hook that the host's drain watcher completes. */
export const DRAIN_HOOK_NAME = 'ephem-drain';
/** Name of the launch lifecycle hook that the host completes once its enclave has attested. */
export const LAUNCH_HOOK_NAME = 'ephem-launch';
/**
 * How long Auto Scaling holds a new host in Pending:Wait (the launch hook's heartbeat timeout)
 * before it abandons it and launches another: packages, artifacts, the enclave's start and its
 * first KMS call take a few minutes; a host whose enclave has not attested by then never will.
 */
export const LAUNCH_TIMEOUT_S = 900;
/**
 * Where the poller publishes the document of this host's enclave (cloud::layout::attestation_current),
 * with the instance id as host id (EPHEM_HOST_ID): the launch watcher waits for this object.
 */
export const ATTESTATION_CURRENT_PREFIX = 'attestations/current/';
/**
 * How often the poller publishes its enclave's document again (host-poller's
 * `republish_interval`, host-poller/src/poller.rs): the health watcher calls a document older
 * than twice this stale.
 */
export const ATTESTATION_REPUBLISH_S = 1800;
export const STALE_ATTESTATION_S = 2 * ATTESTATION_REPUBLISH_S;
/** Enclave restarts (by the watchdog) within ENCLAVE_RESTART_WINDOW_S after which the host gives up. */
export const ENCLAVE_RESTART_LIMIT = 3;
export const ENCLAVE_RESTART_WINDOW_S = 900;
/** Where the watchdog and the launch watcher leave what the health watcher reads (root only). */
const HEALTH_DIR = '/var/lib/ephem-batch-health';
/** The vsock port of the parent's byte relay to KMS (the enclave-worker's default `--kms-relay`). */
export const KMS_PROXY_PORT = 8000;

/** How long Auto Scaling waits for the drain hook (its heartbeat timeout), in seconds. */
export const DRAIN_TIMEOUT_S = 1800;
/** The poller finishes the jobs it holds for up to this long; a second SIGTERM then releases the rest. */
const FINISH_S = DRAIN_TIMEOUT_S - 300;
/** systemd's last resort (SIGKILL), still before the hook would time out. */
const STOP_TIMEOUT_S = DRAIN_TIMEOUT_S - 120;
/**
 * The poller's memory ceiling: its peak RSS is ~17 MB (docs/soak.md) plus, on S3, about three
 * 8 MiB upload parts per job in flight. Far above that, a runaway is killed and restarted
 * (Restart=always) instead of taking the host's memory.
 */
export const POLLER_MEMORY_MAX = '512M';

/** The units whose journal the host ships (JSON, one entry per line), besides the boot log. */
export const SHIPPED_UNITS = [
  'ephem-host-poller.service',
  'ephem-enclave.service',
  'ephem-enclave-watchdog.service',
  'ephem-kms-proxy.service',
  'ephem-drain.service',
  'ephem-launch-ready.service',
  'ephem-health.service',
  'nitro-enclaves-allocator.service',
];
/** The journal of those units, as the export writes it for the CloudWatch agent. */
export const JOURNAL_EXPORT_FILE = '/var/log/ephem-batch/journal.json';
/** What the CloudWatch agent ships: file, and the log stream under the instance id. */
export const SHIPPED_FILES: { file: string; stream: string }[] = [
  { file: JOURNAL_EXPORT_FILE, stream: 'journal' },
  { file: '/var/log/cloud-init-output.log', stream: 'boot' },
  { file: '/var/log/nitro_enclaves/nitro_enclaves.log', stream: 'nitro-cli' },
];

export interface HostUserDataProps {
  readonly region: string;
  /** The log group the CloudWatch agent ships to (a token). */
  readonly hostLogGroup: string;
  /** The enclave image and the poller, as published by `cdk deploy` (host-artifacts.ts). */
  readonly enclaveEif: FetchedFile;
  readonly hostPoller: FetchedFile;
  readonly expectedPcr0: string;
  readonly enclaveCpuCount: number;
  readonly enclaveMemoryMib: number;
  /** host-poller's environment (EPHEM_* variables), written to /etc/ephem-batch/host-poller.env. */
  readonly pollerEnv: Record<string, string>;
}

/** Returns the script as lines; values may be CDK tokens (they are joined, not substituted). */
export function hostUserData(p: HostUserDataProps): string[] {
  const env = Object.entries(p.pollerEnv).map(([k, v]) => `${k}=${v}`);
  return [
    'set -euo pipefail',
    'exec > >(tee -a /var/log/ephem-batch-boot.log) 2>&1',
    `export AWS_REGION=${p.region} AWS_DEFAULT_REGION=${p.region}`,
    ...IMDS_FUNCTION,
    '# The instance id names this host\'s published attestation (EPHEM_HOST_ID): unlike the host',
    '# name (ip-…, reused with its private address), no later host can have the same one.',
    'instance_id=$(imds instance-id)',
    '',
    '# 1. Nitro Enclaves tooling, and the CPUs and memory reserved for the enclave.',
    'dnf install -y aws-nitro-enclaves-cli jq amazon-cloudwatch-agent logrotate',
    ...logShipping(p.hostLogGroup),
    'cat > /etc/nitro_enclaves/allocator.yaml <<EOF',
    '---',
    `memory_mib: ${p.enclaveMemoryMib}`,
    `cpu_count: ${p.enclaveCpuCount}`,
    'EOF',
    'systemctl enable --now nitro-enclaves-allocator.service',
    '',
    '# 2. The enclave image and the poller: the CDK assets this launch template version names, by a key',
    '#    derived from their content (through the S3 gateway endpoint). `cdk deploy` published them before',
    '#    it created this version, so they are there; a few retries cover a network not yet up.',
    'install -d -m 0755 /opt/ephem-batch /etc/ephem-batch',
    'fetch() { for i in $(seq 1 10); do aws s3 cp --only-show-errors "$1" "$2" && return 0; echo "fetching $1 failed ($i/10)"; sleep 15; done; return 1; }',
    '# Each file must be the one this version was made for: an object replaced in the bucket fails the boot here.',
    'check_sha256() {',
    '  local actual; actual=$(sha256sum "$1" | cut -d" " -f1)',
    '  if [ "$actual" != "$2" ]; then',
    '    echo "SHA-256 check failed: $1 has SHA-256 ${actual}, but this launch template names $2: the object in the bucket was replaced; not running it" >&2',
    '    exit 1',
    '  fi',
    '  echo "SHA-256 check passed: $1 is $2"',
    '}',
    `fetch s3://${p.enclaveEif.bucket}/${p.enclaveEif.key} ${ENCLAVE_EIF_PATH}`,
    `check_sha256 ${ENCLAVE_EIF_PATH} ${p.enclaveEif.sha256}`,
    `fetch s3://${p.hostPoller.bucket}/${p.hostPoller.key} ${HOST_POLLER_PATH}`,
    `check_sha256 ${HOST_POLLER_PATH} ${p.hostPoller.sha256}`,
    `chmod 0755 ${HOST_POLLER_PATH}`,
    '',
    '# 3. Fail fast on an image other than the one the key policies were bound to.',
    `expected_pcr0=${p.expectedPcr0}`,
    `actual_pcr0=$(nitro-cli describe-eif --eif-path ${ENCLAVE_EIF_PATH} | jq -r '.Measurements.PCR0')`,
    'if [ "${actual_pcr0,,}" != "${expected_pcr0,,}" ]; then',
    '  echo "PCR0 check failed: enclave.eif has PCR0 ${actual_pcr0}, but this stack was deployed for ${expected_pcr0}: deploy the image its measurements came from" >&2',
    '  exit 1',
    'fi',
    '',
    '# 4. The poller\'s configuration.',
    'cat > /etc/ephem-batch/host-poller.env <<EOF',
    ...env,
    'EPHEM_HOST_ID=${instance_id}',
    'EOF',
    'id -u ephem >/dev/null 2>&1 || useradd --system --no-create-home --shell /sbin/nologin ephem',
    '',
    '# 5. The enclave (never in debug mode: its PCRs would be zeros and KMS would refuse it) and the poller.',
    'cat > /etc/systemd/system/ephem-enclave.service <<EOF',
    '[Unit]',
    'Description=ephem-batch enclave (enclave-worker)',
    'Requires=nitro-enclaves-allocator.service',
    'After=nitro-enclaves-allocator.service',
    '[Service]',
    'Type=oneshot',
    'RemainAfterExit=yes',
    `ExecStart=/usr/bin/nitro-cli run-enclave --eif-path ${ENCLAVE_EIF_PATH} --cpu-count ${p.enclaveCpuCount} --memory ${p.enclaveMemoryMib} --enclave-cid ${ENCLAVE_CID}`,
    'ExecStop=/usr/bin/nitro-cli terminate-enclave --all',
    '[Install]',
    'WantedBy=multi-user.target',
    'EOF',
    '# A oneshot unit stays "active" after its enclave died: a watchdog restarts it when no',
    '# enclave is running (the poller reconnects and control hands it its keys again).',
    'cat > /etc/systemd/system/ephem-enclave-watchdog.service <<EOF',
    '[Unit]',
    'Description=ephem-batch enclave watchdog',
    '[Service]',
    'Type=oneshot',
    // No quotes inside: the line passes through an unquoted heredoc and systemd's own unquoting.
    'ExecStart=/opt/ephem-batch/enclave-watchdog',
    'EOF',
    "cat > /opt/ephem-batch/enclave-watchdog <<'EOF'",
    '#!/bin/sh',
    'nitro-cli describe-enclaves | grep -q RUNNING && exit 0',
    '# Each restart is remembered: the health watcher gives the host up after too many.',
    `mkdir -p ${HEALTH_DIR} && date +%s >>${HEALTH_DIR}/enclave-restarts`,
    'exec systemctl restart ephem-enclave.service',
    'EOF',
    'chmod 0755 /opt/ephem-batch/enclave-watchdog',
    'cat > /etc/systemd/system/ephem-enclave-watchdog.timer <<EOF',
    '[Unit]',
    'Description=ephem-batch enclave watchdog, every 30 s',
    '[Timer]',
    'OnBootSec=120',
    'OnUnitActiveSec=30',
    '[Install]',
    'WantedBy=timers.target',
    'EOF',
    '# The enclave calls KMS itself, over TLS that ends inside it; this relay only carries bytes.',
    '# vsock-proxy reaches only what its allowlist names: exactly this Region\'s KMS (the',
    '# package\'s default list lacks newer Regions, where the enclave would never reach KMS).',
    'cat > /etc/nitro_enclaves/vsock-proxy.yaml <<EOF',
    'allowlist:',
    `- {address: kms.${p.region}.amazonaws.com, port: 443}`,
    'EOF',
    'cat > /etc/systemd/system/ephem-kms-proxy.service <<EOF',
    '[Unit]',
    'Description=ephem-batch byte relay from the enclave to KMS',
    'After=network-online.target',
    '[Service]',
    `ExecStart=/usr/bin/vsock-proxy ${KMS_PROXY_PORT} kms.${p.region}.amazonaws.com 443 --config /etc/nitro_enclaves/vsock-proxy.yaml`,
    'Restart=always',
    'RestartSec=2',
    'DynamicUser=yes',
    '[Install]',
    'WantedBy=multi-user.target',
    'EOF',
    'cat > /etc/systemd/system/ephem-host-poller.service <<EOF',
    '[Unit]',
    'Description=ephem-batch host-poller (untrusted relay between SQS/S3/KMS and the enclave)',
    'Requires=ephem-enclave.service',
    'After=ephem-enclave.service network-online.target',
    '[Service]',
    'User=ephem',
    'EnvironmentFile=/etc/ephem-batch/host-poller.env',
    `ExecStart=${HOST_POLLER_PATH}`,
    'Restart=always',
    'RestartSec=5',
    `MemoryMax=${POLLER_MEMORY_MAX}`,
    '# On SIGTERM the poller takes no new message and finishes the ones it holds (a second SIGTERM',
    '# releases them); the drain watcher sends both before the lifecycle hook times out.',
    'KillSignal=SIGTERM',
    `TimeoutStopSec=${STOP_TIMEOUT_S}`,
    'NoNewPrivileges=yes',
    'ProtectSystem=strict',
    'ProtectHome=yes',
    'PrivateTmp=yes',
    'StateDirectory=ephem-batch',
    '[Install]',
    'WantedBy=multi-user.target',
    'EOF',
    ...drainWatcher(),
    ...launchWatcher(),
    ...healthWatcher(),
    'systemctl daemon-reload',
    'systemctl enable --now ephem-kms-proxy.service ephem-enclave.service ephem-host-poller.service ephem-drain.service ephem-enclave-watchdog.timer ephem-health.timer',
    '# Not enabled: it concerns this launch only (a reboot finds no launch action to complete).',
    'systemctl start ephem-launch-ready.service',
  ];
}

/**
 * The host's logs, shipped from the start of the boot (so a host that fails is seen failing):
 * the CloudWatch agent tails files only, so a journalctl follower writes the journal of the
 * ephem-batch and Nitro Enclaves units as JSON lines (the poller's own lines are JSON too) into a
 * file it rotates, and the agent ships that file, the boot log and nitro-cli's log, each as a
 * stream `<instance id>/<name>` of the host log group (its retention is the group's).
 * The follower keeps its place in a cursor file, so a restart neither repeats nor skips.
 */
function logShipping(logGroup: string): string[] {
  const units = SHIPPED_UNITS.map((u) => `-u ${u}`).join(' ');
  const agentConfig = {
    logs: {
      logs_collected: {
        files: {
          collect_list: SHIPPED_FILES.map(({ file, stream }) => ({
            file_path: file,
            log_group_name: '__LOG_GROUP__',
            log_stream_name: `{instance_id}/${stream}`,
            timezone: 'UTC',
          })),
        },
      },
    },
  };
  // The group's name is a token, placed after rendering (JSON.stringify would quote its marker).
  const configLines = JSON.stringify(agentConfig, null, 2).split('\n');
  return [
    'cat > /etc/systemd/system/ephem-journal-export.service <<EOF',
    '[Unit]',
    'Description=ephem-batch journal export (JSON lines for the CloudWatch agent)',
    '[Service]',
    // No quotes inside the command: the line passes through an unquoted heredoc and systemd.
    `ExecStart=/bin/sh -c 'exec journalctl --follow --no-tail --output=json --output-fields=MESSAGE,PRIORITY,_SYSTEMD_UNIT,SYSLOG_IDENTIFIER,_PID,_BOOT_ID --cursor-file=/var/lib/ephem-journal-export/cursor ${units} >> ${JOURNAL_EXPORT_FILE}'`,
    'StateDirectory=ephem-journal-export',
    'LogsDirectory=ephem-batch',
    'Restart=always',
    'RestartSec=5',
    '[Install]',
    'WantedBy=multi-user.target',
    'EOF',
    'cat > /etc/logrotate.d/ephem-batch <<EOF',
    `${JOURNAL_EXPORT_FILE} {`,
    '  size 50M',
    '  rotate 2',
    '  copytruncate',
    '  missingok',
    '  notifempty',
    '}',
    'EOF',
    'cat > /opt/aws/amazon-cloudwatch-agent/etc/ephem-batch.json <<EOF',
    ...configLines.map((l) => l.replace('"__LOG_GROUP__"', `"${logGroup}"`)),
    'EOF',
    'systemctl daemon-reload',
    'systemctl enable --now ephem-journal-export.service',
    '/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:/opt/aws/amazon-cloudwatch-agent/etc/ephem-batch.json',
    '',
  ];
}

/** A shell function reading IMDSv2 (hop limit 1: from the host only, never from a container). */
const IMDS_FUNCTION = [
  'imds() {',
  "  local token; token=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token) &&",
  '    curl -sf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"',
  '}',
];

/**
 * 7. The launch watcher: Auto Scaling holds a new host in Pending:Wait on the launch hook, and
 * the host leaves it (CONTINUE) only once its enclave has published its attestation document,
 * which the poller does after the enclave took up a fleet key from KMS — the proof that the
 * image, its measurements, the key policies and the KMS relay all work on this host. A host
 * that fails anywhere before (a SHA-256 or PCR0 mismatch, an enclave that does not
 * start or cannot reach KMS) never completes the hook, and Auto Scaling abandons it after
 * LAUNCH_TIMEOUT_S: it is terminated and replaced, instead of counting InService forever.
 * Quoted heredoc: the script's `$` are its own.
 */
function launchWatcher(): string[] {
  return [
    "cat > /opt/ephem-batch/launch-ready <<'EOF'",
    '#!/bin/bash',
    'set -uo pipefail',
    ...IMDS_FUNCTION,
    'instance=$(imds instance-id)',
    `key="${ATTESTATION_CURRENT_PREFIX}\${instance}.cbor"`,
    'echo "waiting for this host\'s attestation at s3://${EPHEM_ATTESTATIONS_BUCKET}/${key}"',
    'until aws s3api head-object --bucket "$EPHEM_ATTESTATIONS_BUCKET" --key "$key" >/dev/null 2>&1; do',
    `  if [ "$SECONDS" -ge ${LAUNCH_TIMEOUT_S} ]; then`,
    `    echo "no attestation after ${LAUNCH_TIMEOUT_S} s: Auto Scaling abandons this host on the ${LAUNCH_HOOK_NAME} hook and replaces it" >&2`,
    '    exit 1',
    '  fi',
    '  sleep 10',
    'done',
    'echo "the enclave published ${key}: completing the launch hook"',
    `mkdir -p ${HEALTH_DIR} && touch ${HEALTH_DIR}/in-service`,
    `aws autoscaling complete-lifecycle-action --lifecycle-hook-name ${LAUNCH_HOOK_NAME} --lifecycle-action-result CONTINUE \\`,
    '  --instance-id "$instance" --auto-scaling-group-name "$(imds tags/instance/aws:autoscaling:groupName)" \\',
    "  || echo \"no launch action to complete (a host launched with the group itself, before the hook existed, or one that outlived the hook)\"",
    'EOF',
    'chmod 0755 /opt/ephem-batch/launch-ready',
    'cat > /etc/systemd/system/ephem-launch-ready.service <<EOF',
    '[Unit]',
    'Description=ephem-batch launch watcher (completes the launch lifecycle hook once the enclave has attested)',
    'After=ephem-host-poller.service',
    '[Service]',
    'Type=simple',
    '# AWS_REGION and EPHEM_ATTESTATIONS_BUCKET.',
    'EnvironmentFile=/etc/ephem-batch/host-poller.env',
    'ExecStart=/opt/ephem-batch/launch-ready',
    'EOF',
  ];
}

/**
 * 6. The drain watcher: when Auto Scaling decides to terminate this host (IMDSv2
 * `autoscaling/target-lifecycle-state` becomes `Terminated`; the instance then waits in
 * Terminating:Wait on the drain hook), stop the poller and complete the hook with the AWS CLI
 * (part of Amazon Linux 2023). Quoted heredoc: the script's `$` are its own.
 */
function drainWatcher(): string[] {
  return [
    "cat > /opt/ephem-batch/drain-watch <<'EOF'",
    '#!/bin/bash',
    'set -uo pipefail',
    ...IMDS_FUNCTION,
    'until [ "$(imds autoscaling/target-lifecycle-state)" = Terminated ]; do sleep 5; done',
    'echo "this host is terminating: draining the poller"',
    '# SIGTERM: no new job, finish the ones held; if that takes too long, a second SIGTERM releases them.',
    `if ! timeout ${FINISH_S} systemctl stop ephem-host-poller.service; then`,
    '  systemctl kill --signal=SIGTERM ephem-host-poller.service',
    '  systemctl stop ephem-host-poller.service',
    'fi',
    `exec aws autoscaling complete-lifecycle-action --lifecycle-hook-name ${DRAIN_HOOK_NAME} --lifecycle-action-result CONTINUE \\`,
    '  --instance-id "$(imds instance-id)" --auto-scaling-group-name "$(imds tags/instance/aws:autoscaling:groupName)"',
    'EOF',
    'chmod 0755 /opt/ephem-batch/drain-watch',
    'cat > /etc/systemd/system/ephem-drain.service <<EOF',
    '[Unit]',
    'Description=ephem-batch drain watcher (completes the termination lifecycle hook after the poller stopped)',
    'After=ephem-host-poller.service',
    '[Service]',
    '# AWS_REGION for the AWS CLI.',
    'EnvironmentFile=/etc/ephem-batch/host-poller.env',
    'ExecStart=/opt/ephem-batch/drain-watch',
    'Restart=on-failure',
    'RestartSec=10',
    '[Install]',
    'WantedBy=multi-user.target',
    'EOF',
  ];
}

/**
 * 8. The health watcher (every 60 s, once the launch watcher has seen this host attested): EC2's
 * health check sees a running instance, not an enclave that can no longer attest. The host tells
 * Auto Scaling itself (SetInstanceHealth Unhealthy, without the grace period; the group replaces
 * it through the drain hook) when the watchdog has restarted the enclave ENCLAVE_RESTART_LIMIT
 * times within ENCLAVE_RESTART_WINDOW_S, or when its published document is older than
 * STALE_ATTESTATION_S (twice the republish interval). The host role may set the health of its own
 * group's instances only (fleet.ts). Quoted heredoc: the script's `$` are its own.
 */
function healthWatcher(): string[] {
  return [
    "cat > /opt/ephem-batch/health-check <<'EOF'",
    '#!/bin/bash',
    'set -uo pipefail',
    ...IMDS_FUNCTION,
    `state=${HEALTH_DIR}`,
    '[ -f "$state/in-service" ] || exit 0   # before that, the launch hook decides',
    'now=$(date +%s)',
    'instance=$(imds instance-id)',
    'reason=""',
    `restarts=$(awk -v since=$((now - ${ENCLAVE_RESTART_WINDOW_S})) '$1 >= since' "$state/enclave-restarts" 2>/dev/null | wc -l)`,
    `if [ "$restarts" -ge ${ENCLAVE_RESTART_LIMIT} ]; then`,
    `  reason="the watchdog restarted the enclave $restarts times in ${ENCLAVE_RESTART_WINDOW_S} s"`,
    'else',
    `  published=$(aws s3api head-object --bucket "$EPHEM_ATTESTATIONS_BUCKET" --key "${ATTESTATION_CURRENT_PREFIX}$instance.cbor" --query LastModified --output text 2>/dev/null)`,
    '  if [ -n "$published" ]; then age=$((now - $(date -d "$published" +%s))); else age=$((now - $(stat -c %Y "$state/in-service"))); fi',
    `  if [ "$age" -ge ${STALE_ATTESTATION_S} ]; then`,
    `    reason="no attestation document published for $age s (republished every ${ATTESTATION_REPUBLISH_S} s)"`,
    '  fi',
    'fi',
    '[ -n "$reason" ] || exit 0',
    'echo "unhealthy: $reason; Auto Scaling replaces this host" >&2',
    'exec aws autoscaling set-instance-health --instance-id "$instance" --health-status Unhealthy --no-should-respect-grace-period',
    'EOF',
    'chmod 0755 /opt/ephem-batch/health-check',
    'cat > /etc/systemd/system/ephem-health.service <<EOF',
    '[Unit]',
    'Description=ephem-batch health watcher (marks this host Unhealthy when its enclave cannot attest)',
    '[Service]',
    'Type=oneshot',
    '# AWS_REGION and EPHEM_ATTESTATIONS_BUCKET.',
    'EnvironmentFile=/etc/ephem-batch/host-poller.env',
    'ExecStart=/opt/ephem-batch/health-check',
    'EOF',
    'cat > /etc/systemd/system/ephem-health.timer <<EOF',
    '[Unit]',
    'Description=ephem-batch health watcher, every 60 s',
    '[Timer]',
    'OnBootSec=300',
    'OnUnitActiveSec=60',
    '[Install]',
    'WantedBy=timers.target',
    'EOF',
  ];
}
