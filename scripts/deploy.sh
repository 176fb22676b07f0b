#!/usr/bin/env bash
# From AWS credentials to a verified job, as one resumable sequence (docs/operations.md §1):
#   1 keys     the two publisher keys (ephem-batch policy keygen), kept on this machine
#   2 image    the enclave image built in your account by CodeBuild (enclave-image/image-build.yaml,
#              enclave-image/buildspec.yml); its measurements fetched back, the policy signed here
#   3 deploy   Lambda zips (scripts/build-lambdas.sh), cdk deploy --outputs-file with the EIF and
#              host-poller of step 2 as assets (published by their content), the policy uploaded
#   4 publish  the model (encrypt, sign, upload as ModelPublisherRoleArn), then the first
#              fleet-key epoch awaited: the first host's enclave creates it, with its genesis
#   5 ledger   the ledger key string derived from LedgerSigningKeyArn (GetPublicKey) and pinned
#   6 job      examples/corpus.jsonl submitted, its results opened and the job verified
#
#   scripts/deploy.sh [--dry-run] [--from STEP] [--yes]
#     --dry-run   print the numbered plan with the exact commands; runs and writes nothing
#     --from STEP re-run STEP (number or name) and every later step, even if recorded done;
#                 earlier steps must be done (their outputs are read from the state file)
#     --yes       cdk deploy --require-approval never (else the CDK CLI asks on a terminal)
#   scripts/deploy.sh --update-image [--dry-run] [--yes]
#                 roll the fleet onto the image of the checked-out commit, in the only order
#                 that loses no job (docs/operations.md §4): U1 build it; U2 its keys first
#                 (cdk deploy -c nextPolicyFile, the hosts unchanged) and its policy uploaded;
#                 U3 the model re-sealed under its model key as the next version; U4 only then
#                 the launch template (one host always in service), waiting for its attestation
#                 (its first host's enclave creates an epoch under the new fleet key first);
#                 U5 that epoch's genesis found; U6 a job submitted and verified against the new
#                 policy. Resumable like the steps (state UPDATE_<n>=done).
#   scripts/deploy.sh ledger-key-string NAME SPKI_BASE64
#                 print the C2SP verifier key string of an Ed25519 key (docs/protocol.md §8.5)
#   scripts/deploy.sh fleet-genesis ATTESTATIONS_BUCKET FLEET_KEY_ARN
#                 print the genesis (fleet-genesis/epoch-<N>.json) of an unexpired epoch whose
#                 record names FLEET_KEY_ARN; exit 1 if there is none
#
# State: $EPHEM_DEPLOY_DIR (default .ephem/deploy/): `state` (KEY=value lines: STEP_<n>=done and each
# step's outputs), outputs.json (cdk deploy --outputs-file), the client home (home/), the model's
# sealed files, the ledger key. Each step records itself done only when its output exists; a step
# recorded done is checked again (its files) and re-run if they are gone. The publisher keys are
# written to $EPHEM_DEPLOY_KEYS (default .ephem/deploy/keys/, mode 0700) and never leave this
# machine: only their public halves are passed on.
#
# Environment (all optional): EPHEM_STACK_NAME (EphemBatch), EPHEM_IMAGE_STACK_NAME
# (EphemBatchImageBuild), EPHEM_BIN (ephem-batch on PATH, else target/release/ephem-batch),
# EPHEM_CDK_CONTEXT (more `-c key=value` for cdk deploy, e.g. "-c alarmEmail=ops@example.com"),
# EPHEM_MODEL_VERSION (1), EPHEM_DEPLOY_CORPUS (examples/corpus.jsonl), EPHEM_DEPLOY_WAIT_S (3600:
# how long to wait for the image build, the fleet's first attestation and the job).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STATE_DIR="${EPHEM_DEPLOY_DIR:-.ephem/deploy}"
STATE="$STATE_DIR/state"
KEYS="${EPHEM_DEPLOY_KEYS:-$STATE_DIR/keys}"
OUT="$STATE_DIR/outputs.json"
HOME_DIR="$STATE_DIR/home"
STACK="${EPHEM_STACK_NAME:-EphemBatch}"
IMAGE_STACK="${EPHEM_IMAGE_STACK_NAME:-EphemBatchImageBuild}"
MODEL_ID="sentence-transformers/all-MiniLM-L6-v2"
MODEL_DIR=".ephem/models/all-MiniLM-L6-v2"          # where scripts/setup-model.sh puts it
MODEL_VERSION="${EPHEM_MODEL_VERSION:-1}"
CORPUS="${EPHEM_DEPLOY_CORPUS:-examples/corpus.jsonl}"
WAIT_S="${EPHEM_DEPLOY_WAIT_S:-3600}"

STEPS=(keys image deploy publish ledger job)
UPDATES=(build keys model roll epoch job)
TITLES=(
  "publisher keys (on this machine, never uploaded)"
  "enclave image built by CodeBuild in your account; measurements fetched, policy signed here"
  "Lambda zips, cdk deploy (the EIF and host-poller as assets), policy uploaded"
  "model encrypted, signed, uploaded as the publisher role; the first fleet-key epoch awaited"
  "ledger key pinned from the stack outputs"
  "first job submitted and verified"
)

DRY=0 FROM=0 YES=0 UPDATE=0 CURRENT=0 DIED="" FAILED="" PUB_CREDS=""
GAPS=()

die() { DIED=1; echo "deploy: $*" >&2; exit 1; }
# Any other failure names its step and command (set -E: also inside the step functions).
trap '[ -n "$FAILED" ] || FAILED="$BASH_COMMAND"' ERR
# shellcheck disable=SC2154 # rc is assigned inside the trap
trap 'rc=$?; if [ "$rc" != 0 ] && [ "$CURRENT" != 0 ] && [ -z "$DIED" ]; then
        echo "deploy: step $CURRENT ($(step_name "$CURRENT")) failed (exit $rc) at: $FAILED" >&2
        echo "deploy: fix it and re-run scripts/deploy.sh$([ "$UPDATE" = 0 ] || echo " --update-image"): it resumes at step $CURRENT" >&2; fi' EXIT
step_name() { case "$1" in U*) echo "${UPDATES[${1#U} - 1]}" ;; *) echo "${STEPS[$1 - 1]}" ;; esac; }

# ---- the C2SP verifier key string (docs/protocol.md §8.5) -----------------------------------
ledger_key_string() { # NAME SPKI_BASE64 (an Ed25519 SubjectPublicKeyInfo, as kms get-public-key gives it)
  python3 - "$1" "$2" <<'PY'
import base64, hashlib, sys
name, spki = sys.argv[1], base64.b64decode(sys.argv[2], validate=True)
prefix = bytes.fromhex("302a300506032b6570032100")  # SPKI of an Ed25519 key, then the 32-byte key
if len(spki) != 44 or not spki.startswith(prefix):
    sys.exit("not an Ed25519 SubjectPublicKeyInfo (ECC_ED25519 / ED25519_SHA_512 key expected)")
if not name or " " in name or "+" in name:
    sys.exit("key name must be non-empty, without spaces or '+'")
key = b"\x01" + spki[12:]
key_id = hashlib.sha256(name.encode() + b"\n" + key).digest()[:4]
print(f"{name}+{key_id.hex()}+{base64.b64encode(key).decode()}")
PY
}

if [ "${1:-}" = ledger-key-string ]; then
  [ $# -eq 3 ] || die "usage: scripts/deploy.sh ledger-key-string NAME SPKI_BASE64"
  ledger_key_string "$2" "$3"
  exit
fi

# ---- an epoch with its genesis under a fleet key (docs/protocol.md §7.3.1) -----------------------
# Hosts' enclaves create the epochs: the record fleet-keys/epoch-<N>.json (its kms_key_id names the
# KMS key), then the genesis fleet-genesis/epoch-<N>.json, both create-only. Clients seal only to
# an epoch that has a genesis.
fleet_genesis() { # BUCKET KEY_ARN: print the genesis of an unexpired epoch under KEY_ARN, else fail
  local bucket="$1" arn="$2" key n
  for key in $(aws s3api list-objects-v2 --bucket "$bucket" --prefix fleet-genesis/ --query 'Contents[].Key' --output text); do
    n="${key#fleet-genesis/epoch-}"; n="${n%.json}"
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$key" = "fleet-genesis/epoch-$n.json" ] || continue
    if aws s3 cp "s3://$bucket/fleet-keys/epoch-$n.json" - 2>/dev/null \
        | jq -e --arg k "$arn" '.kms_key_id == $k and .not_after_ms > (now * 1000)' >/dev/null 2>&1; then
      echo "$key"
      return 0
    fi
  done
  return 1
}

if [ "${1:-}" = fleet-genesis ]; then
  [ $# -eq 3 ] || die "usage: scripts/deploy.sh fleet-genesis ATTESTATIONS_BUCKET FLEET_KEY_ARN"
  fleet_genesis "$2" "$3"
  exit
fi

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --from)
      [ $# -ge 2 ] || die "--from needs a step (1-6 or ${STEPS[*]})"
      FROM=""
      for i in "${!STEPS[@]}"; do
        if [ "$2" = "$((i + 1))" ] || [ "$2" = "${STEPS[$i]}" ]; then FROM=$((i + 1)); fi
      done
      [ -n "$FROM" ] || die "--from $2: no such step (1-6 or ${STEPS[*]})"
      shift 2 ;;
    --yes) YES=1; shift ;;
    --update-image) UPDATE=1; shift ;;
    -h|--help) sed -n '2,/^set -Eeuo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (scripts/deploy.sh --help)" ;;
  esac
done
[ "$UPDATE" = 0 ] || [ "$FROM" = 0 ] || die "--update-image resumes by itself; --from is for the first deployment's steps"

# ---- state ------------------------------------------------------------------------------------
get() { if [ -f "$STATE" ]; then sed -n "s/^$1=//p" "$STATE" | tail -n1; fi; }
put() { # KEY VALUE: never in a dry run
  [ "$DRY" = 0 ] || return 0
  mkdir -p "$STATE_DIR"
  { if [ -f "$STATE" ]; then grep -v "^$1=" "$STATE" || true; fi; echo "$1=$2"; } >"$STATE.tmp"
  mv "$STATE.tmp" "$STATE"
}
sv() { local v; v="$(get "$1")"; echo "${v:-<$2>}"; } # a recorded output, else a placeholder
outp() { # an output of the deployed stack, else a placeholder naming it
  local v=""
  [ -f "$OUT" ] && v="$(jq -r --arg s "$STACK" --arg k "$1" '.[$s][$k] // empty' "$OUT" 2>/dev/null || true)"
  if [ -n "$v" ]; then echo "$v"; elif [ "$DRY" = 1 ]; then echo "<$1>"; else die "step $CURRENT: $OUT has no $STACK.$1 (did step 3 finish?)"; fi
}

# ---- commands: printed always, run unless --dry-run ---------------------------------------------
quote() { # a word as a shell would need it; <PLACEHOLDERS> stay readable
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./\<\>-]+$ ]]; then printf '%s' "$1"
  elif [[ "$1" != *[\"\$\`\\]* ]]; then printf '"%s"' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { local w line=""; for w in "$@"; do line+=" $(quote "$w")"; done; echo "    \$$line"; }
x() { show "$@"; [ "$DRY" = 1 ] || "$@"; }
note() { echo "    # $*"; }
gap() { echo "    ! GAP: $*"; GAPS+=("step $CURRENT: $*"); }
cap() { # VAR PLACEHOLDER CMD...: VAR gets the command's stdout (the placeholder in a dry run)
  local var="$1" ph="$2"; shift 2
  show "$@"
  if [ "$DRY" = 1 ]; then printf -v "$var" '%s' "$ph"; else printf -v "$var" '%s' "$("$@")"; fi
}
wait_for_genesis() { # KEY_ARN WHOSE: until an unexpired epoch under KEY_ARN has its genesis, up to $WAIT_S
  local arn="$1" whose="$2" bucket start=$SECONDS key
  bucket="$(outp AttestationsBucketName)"
  note "repeat every 30 s, up to ${WAIT_S} s, until it prints one: an epoch under $arn, created by $whose enclave"
  show scripts/deploy.sh fleet-genesis "$bucket" "$arn"
  [ "$DRY" = 1 ] && return 0
  until key="$(fleet_genesis "$bucket" "$arn")"; do
    [ $((SECONDS - start)) -lt "$WAIT_S" ] || die "step $CURRENT: after ${WAIT_S} s no epoch under $arn has a genesis in s3://$bucket/fleet-genesis/.
  Look at: the Auto Scaling group $(outp FleetAutoScalingGroupName) (is a host in service? with -c minHosts=0 none
  runs until work waits: set its desired capacity to 1); on a host, /var/log/ephem-batch-boot.log and the journal
  (the stack's host log group, Fleet/HostLogs): host-poller logs 'worker refused' for target Creation(<N>) with the
  enclave's reason (e.g. fleet_key_checks, naming each failed check), 'fleet key ...' when DescribeKey fails, or
  'new epoch not stored'. Re-run the script to keep waiting."
    sleep 30
  done
  echo "    (found: s3://$bucket/$key)"
}
wait_for() { # WHAT CMD...: retry CMD every 30 s for up to $WAIT_S
  local what="$1" start=$SECONDS; shift
  note "repeat every 30 s, up to ${WAIT_S} s, until it succeeds: $what"
  show "$@"
  [ "$DRY" = 1 ] && return 0
  until "$@" >/dev/null 2>&1; do
    [ $((SECONDS - start)) -lt "$WAIT_S" ] || die "step $CURRENT: gave up after ${WAIT_S} s waiting for $what"
    sleep 30
  done
}

EPHEM="${EPHEM_BIN:-}"
if [ -z "$EPHEM" ]; then
  if command -v ephem-batch >/dev/null 2>&1; then EPHEM=ephem-batch; else EPHEM=target/release/ephem-batch; fi
fi
CLIENT_ENV=()   # e.g. (env EPHEM_MODEL_KEY_ARN=…): a name the client takes before the outputs file's
client() { x "${CLIENT_ENV[@]}" "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" "$@"; }
in_cdk() { local line; line="$(show "$@")"; echo "    \$ (cd cdk && ${line#    \$ })"; [ "$DRY" = 1 ] || (cd cdk && "$@"); }
from_cdk() { case "$1" in /*) echo "$1" ;; *) echo "../$1" ;; esac; }
as_publisher() { # a client command with the ModelPublisherRoleArn session of step 4
  echo "    (as ModelPublisherRoleArn, with the credentials assume-role returned)"
  if [ "$DRY" = 1 ]; then client "$@"; return; fi
  ( unset AWS_PROFILE
    read -r AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN <<<"$PUB_CREDS"
    export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
    client "$@" )
}

COMMIT="$(git rev-parse HEAD)"

# ---- the steps ----------------------------------------------------------------------------------
# Each step_<name> does its work through x/cap/client (so the plan shows exactly what runs);
# check_<name> says, from local files only, whether a step recorded done still has its outputs.

check_keys() {
  local k
  for k in image-publisher model-publisher; do
    [ -s "$KEYS/$k.key" ] && grep -Eqx '[0-9a-f]{64}' "$KEYS/$k.pub" 2>/dev/null || return 1
  done
}
step_keys() {
  local k
  x mkdir -p "$KEYS"
  x chmod 700 "$KEYS"
  note "policy keygen writes the Ed25519 seed (64 hex, mode 0600) and prints the public key;"
  note "the model publisher key has the same format (model sign --key reads it)"
  gap "no 'model keygen' and no command that prints the public key of an existing seed: 'policy keygen' makes both keys, and the .pub files beside them are the only record of the public keys (keep them)"
  for k in image-publisher model-publisher; do
    if [ "$DRY" = 0 ] && [ -s "$KEYS/$k.key" ]; then
      grep -Eqx '[0-9a-f]{64}' "$KEYS/$k.pub" 2>/dev/null \
        || die "step 1: $KEYS/$k.key exists but $KEYS/$k.pub does not hold its public key; no client command derives it: restore the .pub file, or move the key away to make a new one"
      echo "    (kept: $KEYS/$k.key)"
      continue
    fi
    show "$EPHEM" policy keygen --out "$KEYS/$k.key"
    echo "      > $KEYS/$k.pub"
    if [ "$DRY" = 0 ]; then "$EPHEM" policy keygen --out "$KEYS/$k.key" >"$KEYS/$k.pub"; fi
  done
  if [ "$DRY" = 0 ]; then
    put IMAGE_PUBLISHER_KEY "$(cat "$KEYS/image-publisher.pub")"
    put MODEL_PUBLISHER_KEY "$(cat "$KEYS/model-publisher.pub")"
  fi
}

ROLLED_DIR=""   # the image an update has rolled onto (read before the state has it: a dry run writes none)
image_dir() { local d; d="${ROLLED_DIR:-$(get IMAGE_DIR)}"; echo "${d:-dist/enclave/$COMMIT}"; }
check_image() {
  local d; d="$(image_dir)"
  for f in enclave.eif host-poller measurements.json policy.json; do [ -s "$d/$f" ] || return 1; done
}
step_image() {
  build_image
  put IMAGE_DIR "$BUILT_DIR"; put IMAGE_COMMIT "$COMMIT"
}
BUILT_DIR=""
build_image() { # the image of $COMMIT into dist/enclave/$COMMIT (BUILT_DIR), its policy signed here
  local model_pub bucket project prefix d build status
  model_pub="$(sv MODEL_PUBLISHER_KEY MODEL_PUBLISHER_KEY)"
  d="dist/enclave/$COMMIT"
  prefix="builds/$COMMIT-${model_pub:0:16}"
  [[ "$model_pub" != "<"* ]] || prefix="builds/$COMMIT-<MODEL_PUBLISHER_KEY:16>"
  note "the build pins (checked in the preflight): $(sed -n 's/^RUST_BUILDER_IMAGE=//p' enclave-image/pins.env), nitro-cli $(sed -n 's/^NITRO_CLI_VERSION=//p' enclave-image/pins.env)"
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    note "WARNING: uncommitted changes are NOT in the image: it is built from commit $COMMIT"
  fi
  x aws cloudformation deploy --stack-name "$IMAGE_STACK" --template-file enclave-image/image-build.yaml \
      --capabilities CAPABILITY_IAM --no-fail-on-empty-changeset
  cap bucket "<ImageBuildBucketName>" aws cloudformation describe-stacks --stack-name "$IMAGE_STACK" \
      --query "Stacks[0].Outputs[?OutputKey=='ImageBuildBucketName'].OutputValue" --output text
  cap project "<ImageBuildProjectName>" aws cloudformation describe-stacks --stack-name "$IMAGE_STACK" \
      --query "Stacks[0].Outputs[?OutputKey=='ImageBuildProjectName'].OutputValue" --output text
  note "a build of this commit and model publisher key that already finished is reused (build-info.json is written last)"
  if [ "$DRY" = 1 ] || ! aws s3api head-object --bucket "$bucket" --key "$prefix/build-info.json" >/dev/null 2>&1; then
    build="$(get IMAGE_BUILD_ID)"
    if [ "$DRY" = 0 ] && [ -n "$build" ] && [ "$(get IMAGE_BUILD_PREFIX)" = "$prefix" ] \
        && [ "$(aws codebuild batch-get-builds --ids "$build" --query 'builds[0].buildStatus' --output text)" = IN_PROGRESS ]; then
      echo "    (build $build of this commit is still running: waiting for it)"
    else
      x mkdir -p "$STATE_DIR/image/src"
      x git bundle create "$STATE_DIR/image/src/source.bundle" HEAD
      x cp enclave-image/buildspec.yml "$STATE_DIR/image/src/buildspec.yml"
      x python3 -m zipfile -c "$STATE_DIR/image/source.zip" "$STATE_DIR/image/src/buildspec.yml" "$STATE_DIR/image/src/source.bundle"
      x aws s3 cp "$STATE_DIR/image/source.zip" "s3://$bucket/source/$COMMIT.zip"
      cap build "<BUILD_ID>" aws codebuild start-build --project-name "$project" \
          --source-location-override "$bucket/source/$COMMIT.zip" \
          --environment-variables-override "name=EPHEM_COMMIT,value=$COMMIT" \
              "name=MODEL_PUBLISHER_PUBKEY,value=$model_pub" "name=EPHEM_OUTPUT_PREFIX,value=$prefix" \
          --query build.id --output text
      put IMAGE_BUILD_ID "$build"; put IMAGE_BUILD_PREFIX "$prefix"
    fi
    note "wait for the build (about 20-40 min: two release builds, docker, nitro-cli); its log: aws logs tail <ImageBuildLogGroupName>"
    show aws codebuild batch-get-builds --ids "$build" --query 'builds[0].buildStatus' --output text
    if [ "$DRY" = 0 ]; then
      local start=$SECONDS
      while status="$(aws codebuild batch-get-builds --ids "$build" --query 'builds[0].buildStatus' --output text)" \
            && [ "$status" = IN_PROGRESS ]; do
        [ $((SECONDS - start)) -lt "$WAIT_S" ] || die "step 2: build $build still running after ${WAIT_S} s (re-run to keep waiting)"
        sleep 30
      done
      [ "$status" = SUCCEEDED ] || die "step 2: image build $build ended $status (its log: CodeBuild project $project)"
    fi
  fi
  x mkdir -p "$d"
  x aws s3 cp --recursive "s3://$bucket/$prefix/" "$d/"
  note "the policy is rebuilt here from nitro-cli's measurements (as build-enclave.sh does) and signed with the local key"
  show jq "{version: 1, root: \"aws-nitro-g1\", pcrs: ...PCR0/1/2[/8]..., allow_debug: false, max_age_s: 3600}" "$d/measurements.json"
  echo "      > $d/policy.unsigned.json"
  if [ "$DRY" = 0 ]; then
    jq '{version: 1, root: "aws-nitro-g1",
         pcrs: ({"0": .Measurements.PCR0, "1": .Measurements.PCR1, "2": .Measurements.PCR2}
                + (if .Measurements.PCR8 then {"8": .Measurements.PCR8} else {} end)),
         allow_debug: false, max_age_s: 3600}' "$d/measurements.json" >"$d/policy.unsigned.json"
    rm -f "$d/policy.json"
  fi
  x "$EPHEM" policy sign --key "$KEYS/image-publisher.key" --out "$d/policy.json" "$d/policy.unsigned.json"
  x "$EPHEM" policy verify "$d/policy.json" --publisher-key "$(sv IMAGE_PUBLISHER_KEY IMAGE_PUBLISHER_KEY)"
  x chmod +x "$d/host-poller"
  BUILT_DIR="$d"
}

cdk_deploy() { # IMAGE_DIR [-c more=...]: the stack with that image's policy, EIF and host-poller
  local d="$1" approval=() extra=(); shift
  [ "$YES" = 0 ] || approval=(--require-approval never)
  # shellcheck disable=SC2206 # EPHEM_CDK_CONTEXT is a list of -c key=value words
  [ -z "${EPHEM_CDK_CONTEXT:-}" ] || extra=($EPHEM_CDK_CONTEXT)
  in_cdk npx --no-install cdk deploy "${approval[@]}" -c "stackName=$STACK" -c "policyFile=$(from_cdk "$d/policy.json")" \
      -c "enclaveEif=$(from_cdk "$d/enclave.eif")" -c "hostPoller=$(from_cdk "$d/host-poller")" \
      -c "imagePublisherKey=$(sv IMAGE_PUBLISHER_KEY IMAGE_PUBLISHER_KEY)" "$@" "${extra[@]}" --outputs-file "$(from_cdk "$OUT")"
}

check_deploy() { [ -s "$OUT" ] && jq -e --arg s "$STACK" '.[$s].ArtifactsBucketName' "$OUT" >/dev/null 2>&1; }
step_deploy() {
  local d policy_key before=""
  d="$(image_dir)"
  policy_key="artifacts/policies/$(commit="$(get IMAGE_COMMIT)"; echo "${commit:-$COMMIT}").json"
  x scripts/build-lambdas.sh
  if check_deploy; then
    note "an update: the policy goes first, so the ledger accepts the receipts of the hosts the deploy rolls in"
    x aws s3 cp "$d/policy.json" "s3://$(outp ArtifactsBucketName)/$policy_key"
    before=1
  fi
  x npm ci --loglevel=error
  in_cdk npx --no-install tsc -p tsconfig.json
  note "once per account and region (a no-op afterwards):"
  in_cdk npx --no-install cdk bootstrap
  note "the EIF and host-poller are assets: cdk deploy publishes them to the CDK assets bucket under keys"
  note "derived from their content before it updates the stack; the launch template names those keys and"
  note "each file's SHA-256, so a new image is a new launch template version the group rolls onto"
  cdk_deploy "$d"
  check_deploy || [ "$DRY" = 1 ] || die "step 3: cdk deploy wrote no $STACK outputs into $OUT"
  if [ -z "$before" ]; then
    note "the ledger accepts receipts only from images an uploaded, publisher-signed policy allows"
    x aws s3 cp "$d/policy.json" "s3://$(outp ArtifactsBucketName)/$policy_key"
  fi
}

check_publish() { [ -n "$(get MODEL_MANIFEST)" ] && [ -s "$STATE_DIR/model/v$MODEL_VERSION/manifest.cose" ]; }
step_publish() {
  local manifest sealed="$STATE_DIR/model/v$MODEL_VERSION"
  x scripts/setup-model.sh
  note "the publisher role (ModelPublisherRoleArn): kms:Encrypt with the model key, writes under models/"
  show aws sts assume-role --role-arn "$(outp ModelPublisherRoleArn)" --role-session-name ephem-deploy-model
  if [ "$DRY" = 0 ]; then
    PUB_CREDS="$(aws sts assume-role --role-arn "$(outp ModelPublisherRoleArn)" --role-session-name ephem-deploy-model \
                 --query 'Credentials.[AccessKeyId,SecretAccessKey,SessionToken]' --output text)"
  fi
  if [ "$DRY" = 0 ] && [ -s "$sealed/manifest.cbor" ]; then
    echo "    (kept: $sealed, sealed earlier; a new encrypt would be a different manifest for v$MODEL_VERSION)"
  else
    as_publisher model encrypt "$MODEL_DIR" --model-id "$MODEL_ID" --version "$MODEL_VERSION" --for-image "$(image_dir)/policy.json" --output "$sealed"
  fi
  note "signed here, offline, with the model publisher key (never uploaded)"
  x "$EPHEM" model sign "$sealed" --key "$KEYS/model-publisher.key"
  as_publisher model upload "$sealed"
  manifest="models/${MODEL_ID##*/}/v$MODEL_VERSION/manifest.cose"
  client model verify --published "$manifest" --publisher-key "$(sv MODEL_PUBLISHER_KEY MODEL_PUBLISHER_KEY)"
  put MODEL_MANIFEST "$manifest"; put MODEL_VERSION_PUBLISHED "$MODEL_VERSION"
  note "the first fleet-key epoch: no one makes it but an enclave of the deployed image. The first host's"
  note "enclave reads the fleet key's policy and grants, has KMS generate the epoch's key pair for itself,"
  note "and its host stores the record and the genesis (docs/protocol.md §7.3.1); found at once if one exists"
  wait_for_genesis "$(outp FleetKeyArn)" "the first host's"
}

check_ledger() { [ -s "$STATE_DIR/ledger.key" ] && grep -q '+' "$STATE_DIR/ledger.key"; }
step_ledger() {
  local spki name key
  name="$(outp LedgerBucketName).s3.$(outp Region).amazonaws.com"
  note "the checkpoints' origin (ledger-append's EPHEM_LEDGER_ORIGIN default): $name"
  cap spki "<SPKI_BASE64>" aws kms get-public-key --key-id "$(outp LedgerSigningKeyArn)" --query PublicKey --output text
  gap "no client command derives the C2SP key string from KMS: this script computes it (docs/protocol.md §8.5: name+hex8(key id)+base64(0x01||key)) with: scripts/deploy.sh ledger-key-string NAME SPKI_BASE64"
  show scripts/deploy.sh ledger-key-string "$name" "$spki"
  echo "      > $STATE_DIR/ledger.key"
  if [ "$DRY" = 0 ]; then
    key="$(ledger_key_string "$name" "$spki")" || die "step 5: LedgerSigningKeyArn's public key: $key"
    mkdir -p "$STATE_DIR"; echo "$key" >"$STATE_DIR/ledger.key"
    put LEDGER_KEY "$key"
  fi
}

check_job() { [ "$(get JOB_VERIFIED)" = 1 ]; }
step_job() {
  local d job trust state
  d="$(image_dir)"
  trust=(--policy "$d/policy.json" --publisher-key "$(sv IMAGE_PUBLISHER_KEY IMAGE_PUBLISHER_KEY)"
         --model-publisher-key "$(sv MODEL_PUBLISHER_KEY MODEL_PUBLISHER_KEY)")
  note "the fleet is ready once a host's enclave has published its attestation (the launch hook holds it until then)"
  wait_for "the fleet's attestation document" \
      "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" attest fetch "${trust[@]:0:4}"
  job="$(get JOB_ID)"
  if [ "$DRY" = 0 ] && [ -n "$job" ]; then
    echo "    (job $job was submitted earlier: not submitted again)"
  else
    cap job "<JOB_ID>" "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" submit "$CORPUS" "${trust[@]}" --json
    [ "$DRY" = 1 ] || job="$(tail -n1 <<<"$job" | jq -r .job_id)"
    put JOB_ID "$job"
  fi
  gap "no command waits for a job submitted earlier (only submit --wait does): the script polls 'status --json' until the receipt is ledgered"
  show "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" status "$job" --json
  if [ "$DRY" = 0 ]; then
    local start=$SECONDS
    while :; do
      state="$("$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" status "$job" --json | jq -r 'if .ledger then "ledgered" else .state end')"
      case "$state" in
        ledgered) break ;;
        failed|cancelled) die "step 6: job $job is $state (ephem-batch ... status $job)" ;;
      esac
      [ $((SECONDS - start)) -lt "$WAIT_S" ] || die "step 6: job $job still $state after ${WAIT_S} s (re-run to keep waiting)"
      sleep 15
    done
  fi
  client results "$job" "${trust[@]}" -o "$STATE_DIR/job/corpus.embeddings.jsonl"
  note "verify checks the receipt, its attestation document and the ledger inclusion against the pinned ledger key"
  x env EPHEM_LEDGER_KEY="$STATE_DIR/ledger.key" "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" verify "$job" "${trust[@]}"
  put JOB_VERIFIED 1
}

# ---- an image update (--update-image; docs/operations.md §4) ------------------------------------
# The running image's keys release nothing to the new one, and the reverse (key policies bind
# PCR0 and never change), so every order but this one strands work: the new image's keys first,
# then the model sealed to them, and only then hosts that run it, while at least one host of the
# old image keeps serving what was sealed to the old keys. The new image's epoch cannot come
# earlier: only its enclaves can create one under its fleet key, and its first host does so
# before it attests (so before the launch hook lets it into service).

new_dir() { local d; d="$(get NEXT_IMAGE_DIR)"; echo "${d:-dist/enclave/$COMMIT}"; }

update_build() {
  note "the image of the checked-out commit $COMMIT, built and measured as in step 2"
  build_image
  put NEXT_IMAGE_DIR "$BUILT_DIR"; put NEXT_IMAGE_COMMIT "$COMMIT"
}
same_measurements() { # the new image has the running image's PCRs (a commit that changed nothing measured)
  [ "$DRY" = 0 ] && [ -s "$(image_dir)/policy.json" ] && [ -s "$(new_dir)/policy.json" ] \
    && [ "$(jq -cS .pcrs "$(image_dir)/policy.json")" = "$(jq -cS .pcrs "$(new_dir)/policy.json")" ]
}
update_keys() {
  local cur new
  cur="$(image_dir)" new="$(new_dir)"
  if same_measurements; then
    note "the new image has the running image's PCRs: its keys, epochs and model are the running ones (U2, U3 and U5 not needed)"
    return
  fi
  note "its signed policy first: the ledger then accepts receipts of both images"
  x aws s3 cp "$new/policy.json" "s3://$(outp ArtifactsBucketName)/artifacts/policies/$COMMIT.json"
  note "the new image's fleet and model keys, beside the running image's; the hosts keep their launch"
  note "template (the running image's EIF and host-poller); the new image's hosts will create their epochs under its fleet key"
  cdk_deploy "$cur" -c "nextPolicyFile=$(from_cdk "$new/policy.json")"
  put NEXT_FLEET_KEY_ARN "$(outp NextFleetKeyArn)"
}
next_fleet_key() { # recorded by U2 (after U4 the outputs name it FleetKeyArn, and NextFleetKeyArn is gone)
  local k; k="$(get NEXT_FLEET_KEY_ARN)"
  if [ -n "$k" ]; then echo "$k"; else outp NextFleetKeyArn; fi
}
update_model() {
  local version published sealed manifest key
  if same_measurements; then note "same PCRs: the model stays as it is"; return; fi
  version="$(get NEXT_MODEL_VERSION)"
  if [ -z "$version" ]; then
    published="$(get MODEL_VERSION_PUBLISHED)"
    version=$(( ${published:-$MODEL_VERSION} + 1 ))
    put NEXT_MODEL_VERSION "$version"
  fi
  sealed="$STATE_DIR/model/v$version"
  key="$(outp NextModelKeyArn)"
  note "the model re-sealed under the new model key ($key) as version $version, signed here, uploaded:"
  note "the new image's hosts take it up; the running image's keep version $((version - 1))"
  show aws sts assume-role --role-arn "$(outp ModelPublisherRoleArn)" --role-session-name ephem-deploy-model
  if [ "$DRY" = 0 ]; then
    PUB_CREDS="$(aws sts assume-role --role-arn "$(outp ModelPublisherRoleArn)" --role-session-name ephem-deploy-model \
                 --query 'Credentials.[AccessKeyId,SecretAccessKey,SessionToken]' --output text)"
  fi
  if [ "$DRY" = 0 ] && [ -s "$sealed/manifest.cbor" ]; then
    echo "    (kept: $sealed, sealed earlier)"
  else
    CLIENT_ENV=(env "EPHEM_MODEL_KEY_ARN=$key")
    as_publisher model encrypt "$MODEL_DIR" --model-id "$MODEL_ID" --version "$version" --for-image "$(new_dir)/policy.json" --output "$sealed"
    CLIENT_ENV=()
  fi
  x "$EPHEM" model sign "$sealed" --key "$KEYS/model-publisher.key"
  as_publisher model upload "$sealed"
  manifest="models/${MODEL_ID##*/}/v$version/manifest.cose"
  client model verify --published "$manifest" --publisher-key "$(sv MODEL_PUBLISHER_KEY MODEL_PUBLISHER_KEY)"
  put MODEL_MANIFEST "$manifest"; put MODEL_VERSION_PUBLISHED "$version"
}
update_roll() {
  local new
  new="$(new_dir)"
  note "only now the launch template: the new image's EIF and host-poller, its policy as the current one;"
  note "Auto Scaling starts a new host before it stops an old one (MinInstancesInService 1), and a"
  note "stopping host finishes the jobs it holds (drain hook); the old keys are retained, not deleted."
  note "The first new host's enclave finds no epoch under the new fleet key and creates one, then attests"
  cdk_deploy "$new"
  wait_for "an attestation document of the new image" \
      "$EPHEM" --home "$HOME_DIR" --backend aws --stack-outputs "$OUT" attest fetch --policy "$new/policy.json" \
      --publisher-key "$(sv IMAGE_PUBLISHER_KEY IMAGE_PUBLISHER_KEY)"
  put IMAGE_DIR "$new"; put IMAGE_COMMIT "$COMMIT"
  ROLLED_DIR="$new"
}
update_epoch() {
  local key
  if same_measurements; then note "same PCRs: the running fleet key's epochs serve (no new key)"; return; fi
  key="$(next_fleet_key)"
  note "the new fleet key (U2's NextFleetKeyArn) is now FleetKeyArn: the epoch its first host created, with its genesis"
  if [ "$DRY" = 0 ] && [ "$(outp FleetKeyArn)" != "$key" ]; then
    die "step U5: FleetKeyArn is $(outp FleetKeyArn), not the key U2 created ($key): the roll did not make the new keys current"
  fi
  wait_for_genesis "$key" "a new host's"
}
update_job() {
  note "clients move to the new policy (give them $(new_dir)/policy.json): a job sealed now is served by the new image"
  put JOB_ID ""; put JOB_VERIFIED ""
  step_job
}

run_update() {
  local i n name
  [ "$DRY" = 1 ] || [ "$(get STEP_6)" = done ] || die "--update-image rolls a deployment that exists: run scripts/deploy.sh first (steps 1-6)"
  if [ "$(get IMAGE_COMMIT)" = "$COMMIT" ] && [ -z "$(get NEXT_IMAGE_COMMIT)" ]; then
    die "the fleet already runs the image of $COMMIT: check out the commit to roll out"
  fi
  if [ -n "$(get NEXT_IMAGE_COMMIT)" ] && [ "$(get NEXT_IMAGE_COMMIT)" != "$COMMIT" ]; then
    die "an update to $(get NEXT_IMAGE_COMMIT) is under way: check that commit out and re-run --update-image to finish it"
  fi
  for i in "${!UPDATES[@]}"; do
    n=$((i + 1)) name="${UPDATES[$i]}"
    CURRENT="U$n"
    if [ "$(get "UPDATE_$n")" = "done:$COMMIT" ]; then echo "U$n. $name — done"; continue; fi
    echo "U$n. $name"
    "update_$name"
    put "UPDATE_$n" "done:$COMMIT"
  done
  [ "$DRY" = 1 ] || { put NEXT_IMAGE_COMMIT ""; put NEXT_IMAGE_DIR ""; put NEXT_MODEL_VERSION ""; put NEXT_FLEET_KEY_ARN ""; }
  echo "deploy: the fleet runs the image of $COMMIT$([ "$DRY" = 0 ] || echo " (dry run: nothing was run)")"
}

# ---- the sequence -------------------------------------------------------------------------------
need_outputs() { # the outputs a step needs from earlier steps
  case "$1" in
    image) echo "IMAGE_PUBLISHER_KEY MODEL_PUBLISHER_KEY" ;;
    deploy|publish|ledger|job) echo "IMAGE_PUBLISHER_KEY MODEL_PUBLISHER_KEY IMAGE_DIR" ;;
  esac
}

if [ "$DRY" = 1 ]; then
  echo "Plan (dry run: nothing is run or written; state: $STATE)"
else
  for tool in aws jq git python3 npm; do command -v "$tool" >/dev/null || die "$tool is not installed (docs/operations.md §1)"; done
fi

echo "0. preflight (every run)"
# First, before any account call: an image built from unpinned inputs would not reproduce its
# PCR0, so nothing is deployed (a dry run included) until enclave-image/pins.env pins them.
show enclave-image/check-pins.sh
enclave-image/check-pins.sh >/dev/null || die "enclave-image/pins.env does not pin the enclave image build: apply the remedy above, commit, re-run"
x aws sts get-caller-identity --query Account --output text
if ! command -v "$EPHEM" >/dev/null 2>&1; then
  note "the client ($EPHEM is not there yet)"
  x cargo build --release --locked -p ephem-batch --bin ephem-batch
fi

if [ "$UPDATE" = 1 ]; then
  run_update
  exit 0
fi

resumed=""
for i in "${!STEPS[@]}"; do
  n=$((i + 1)) name="${STEPS[$i]}"
  CURRENT="$n"
  if [ "$FROM" -gt 0 ] && [ "$n" -lt "$FROM" ]; then
    echo "$n. $name: ${TITLES[$i]} — skipped (--from $FROM)"
    continue
  fi
  if [ "$FROM" = 0 ] && [ "$(get "STEP_$n")" = "done" ]; then
    if "check_$name"; then
      echo "$n. $name: ${TITLES[$i]} — done"
      continue
    fi
    echo "$n. $name: recorded done, but its output is gone: running it again"
  fi
  if [ -z "$resumed" ]; then
    resumed="$n"
    [ "$n" = 1 ] || echo "-- resume at step $n ($name)"
  fi
  for k in $(need_outputs "$name"); do
    [ -n "$(get "$k")" ] || [ "$DRY" = 1 ] || die "step $n ($name) needs $k from an earlier step, and $STATE has none: run without --from"
  done
  echo "$n. $name: ${TITLES[$i]}"
  "step_$name"
  if [ "$DRY" = 0 ]; then
    "check_$name" || die "step $n ($name) ran but its output is not there"
    put "STEP_$n" "done"
  fi
done

if [ ${#GAPS[@]} -gt 0 ]; then
  echo
  echo "Client commands that do not exist yet (the script works around them; docs/operations.md §1):"
  printf '  - %s\n' "${GAPS[@]}"
fi
if [ "$DRY" = 1 ]; then
  echo
  echo "Not exercised outside a real account: step 2 (CodeBuild image build) and step 3 (first cdk deploy); see docs/operations.md §1."
else
  echo "deploy: all steps done; state in $STATE, client home $HOME_DIR, job $(get JOB_ID) verified"
fi
