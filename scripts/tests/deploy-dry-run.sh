#!/usr/bin/env bash
# shellcheck disable=SC2015 # ok/not_ok never fail: A && ok || not_ok is if-then-else here
# Tests scripts/deploy.sh without an account: the dry-run plan (every step, in order, with the
# exact commands, fake stack outputs resolved), that a dry run runs and writes nothing, resuming
# (steps 1-3 recorded done: the plan starts at 4, twice the same), a done step whose output is
# gone, --from, a real run that fails at step 2 naming it and resumes there, and the ledger key
# string against the known answer of docs/protocol.md §8.5, and the search for an epoch's genesis
# (fleet-genesis). Run by cdk/scripts/test.sh (make test).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
deploy="$root/scripts/deploy.sh"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
fails=0
ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*" >&2; fails=$((fails + 1)); }
has() { grep -qF -- "$2" "$1" && ok "$3" || { not_ok "$3 (no '$2' in $1)"; sed 's/^/    | /' "$1" >&2; }; }
lacks() { ! grep -qF -- "$2" "$1" && ok "$3" || not_ok "$3 ('$2' found in $1)"; }

# Fake tools: every call is logged; a dry run must make none. aws fails but for sts (so a real
# run gets past the preflight) and, given FAKE_S3 (a directory standing for the attestations
# bucket), for the listing of fleet-genesis/ and the copy of an object to stdout; ephem-batch can
# make keys (so a real run can finish step 1).
mkdir -p "$t/bin"
cat >"$t/bin/fake" <<'EOF'
#!/usr/bin/env bash
echo "$(basename "$0") $*" >>"$FAKE_LOG"
case "$(basename "$0") $1 ${2:-}" in
  "aws sts get-caller-identity") echo 123456789012 ;;
  "aws s3api list-objects-v2")
    [ -n "${FAKE_S3:-}" ] || exit 1
    keys="$(cd "$FAKE_S3" && find fleet-genesis -type f 2>/dev/null | sort | tr '\n' '\t')"
    echo "${keys:-None}" ;;
  "aws s3 cp")
    [ -n "${FAKE_S3:-}" ] && [ "$4" = - ] || exit 1
    cat "$FAKE_S3/${3#s3://*/}" ;;
  "ephem-batch policy keygen")
    out="$4"; [ "$3" = --out ] && [ ! -e "$out" ] || exit 1
    printf '%064d\n' 7 >"$out"; chmod 600 "$out"; printf 'ab%.0s' {1..32}; echo ;;
  *) exit 1 ;;
esac
EOF
chmod +x "$t/bin/fake"
for tool in aws npm npx cargo ephem-batch; do ln -s fake "$t/bin/$tool"; done
export PATH="$t/bin:$PATH" FAKE_LOG="$t/calls" EPHEM_BIN=ephem-batch
: >"$FAKE_LOG"

state="$t/deploy"
mkdir -p "$state"
cat >"$state/outputs.json" <<'EOF'
{"EphemBatch": {"Region": "eu-west-1", "ArtifactsBucketName": "fake-artifacts", "AttestationsBucketName": "fake-attestations",
 "ModelsBucketName": "fake-models", "LedgerBucketName": "fake-ledger", "LedgerSigningKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/fake-ledger",
 "ModelKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/fake-model", "FleetKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/fake-fleet",
 "ModelPublisherRoleArn": "arn:aws:iam::123456789012:role/fake-publisher", "FleetAutoScalingGroupName": "fake-asg"}}
EOF
export EPHEM_DEPLOY_DIR="$state"
snapshot() { (cd "$t" && { find deploy img -printf '%p %s %T@\n' 2>/dev/null || true; } | sort); }

# --- 1. the whole plan -----------------------------------------------------------------------------
before="$(snapshot)"
"$deploy" --dry-run >"$t/plan" 2>&1 || { cat "$t/plan"; not_ok "dry run exits 0"; }
order="$(grep -Eo '^[0-9]\. [a-z]+' "$t/plan" | tr '\n' ' ')"
[ "$order" = "0. preflight 1. keys 2. image 3. deploy 4. publish 5. ledger 6. job " ] \
  && ok "all steps, in order" || not_ok "steps in order: got '$order'"
has "$t/plan" "ephem-batch policy keygen --out $state/keys/image-publisher.key" "step 1 makes the image publisher key"
has "$t/plan" "ephem-batch policy keygen --out $state/keys/model-publisher.key" "step 1 makes the model publisher key"
has "$t/plan" "aws cloudformation deploy --stack-name EphemBatchImageBuild --template-file enclave-image/image-build.yaml" "step 2 deploys the image build stack"
has "$t/plan" "aws codebuild start-build" "step 2 starts the CodeBuild build"
has "$t/plan" "ephem-batch policy sign --key $state/keys/image-publisher.key" "step 2 signs the policy with the local key"
has "$t/plan" "scripts/build-lambdas.sh" "step 3 builds the Lambda zips"
has "$t/plan" "cdk deploy -c stackName=EphemBatch" "step 3 runs cdk deploy"
has "$t/plan" "--outputs-file $state/outputs.json" "step 3 writes the outputs file"
has "$t/plan" "-c enclaveEif=../dist/enclave/" "step 3 gives cdk deploy the EIF of step 2 as an asset"
grep -Eq -- "-c enclaveEif=\.\./dist/enclave/[0-9a-f]{40}/enclave\.eif -c hostPoller=\.\./dist/enclave/[0-9a-f]{40}/host-poller " "$t/plan" \
  && ok "step 3 passes the EIF and host-poller of the same image directory" || not_ok "step 3 asset paths: $(grep -- 'cdk deploy' "$t/plan")"
lacks "$t/plan" "/artifacts/enclave.eif" "no EIF is uploaded to a fixed key"
lacks "$t/plan" "/artifacts/host-poller" "no host-poller is uploaded to a fixed key"
has "$t/plan" "s3://fake-artifacts/artifacts/policies/" "step 3 uploads the signed policy (fake outputs resolved)"
policy_at="$(grep -n -- "/artifacts/policies/" "$t/plan" | head -n1 | cut -d: -f1)"
deploy_at="$(grep -n -- "cdk deploy -c" "$t/plan" | cut -d: -f1)"
[ "$(grep -c -- "/artifacts/policies/" "$t/plan")" = 1 ] && [ "$policy_at" -lt "$deploy_at" ] \
  && ok "a stack that exists (outputs file) gets the policy once, before cdk deploy rolls new hosts in" \
  || not_ok "policy upload order: policy at line $policy_at, cdk deploy at $deploy_at"
has "$t/plan" "aws sts assume-role --role-arn arn:aws:iam::123456789012:role/fake-publisher" "step 4 assumes the publisher role"
for sub in "model encrypt" "model sign" "model upload" "model verify --published models/all-MiniLM-L6-v2/v1/manifest.cose"; do
  has "$t/plan" "$sub" "step 4: $sub"
done
genesis_wait="scripts/deploy.sh fleet-genesis fake-attestations arn:aws:kms:eu-west-1:123456789012:key/fake-fleet"
has "$t/plan" "$genesis_wait" "step 4 waits for an epoch with its genesis under FleetKeyArn"
verify_at="$(grep -n -- "model verify --published" "$t/plan" | head -n1 | cut -d: -f1)"
genesis_at="$(grep -nF -- "$genesis_wait" "$t/plan" | head -n1 | cut -d: -f1)"
ledger_at="$(grep -n -- "^5\. ledger" "$t/plan" | cut -d: -f1)"
[ -n "$genesis_at" ] && [ "$verify_at" -lt "$genesis_at" ] && [ "$genesis_at" -lt "$ledger_at" ] \
  && ok "step 4 publishes the model, then waits for the first epoch (hosts boot meanwhile)" \
  || not_ok "step 4 order: model verify at $verify_at, genesis wait at $genesis_at, step 5 at $ledger_at"
lacks "$t/plan" "lambda invoke" "no Lambda makes an epoch"
lacks "$t/plan" "fleet-rotate" "fleet-rotate is gone"
has "$t/plan" "aws kms get-public-key --key-id arn:aws:kms:eu-west-1:123456789012:key/fake-ledger" "step 5 reads the ledger key"
has "$t/plan" "ledger-key-string fake-ledger.s3.eu-west-1.amazonaws.com" "step 5 names the origin from the outputs"
has "$t/plan" "submit examples/corpus.jsonl" "step 6 submits the example corpus"
has "$t/plan" "EPHEM_LEDGER_KEY=$state/ledger.key" "step 6 verifies against the pinned ledger key"
has "$t/plan" "! GAP: no client command derives the C2SP key string from KMS" "the plan names the missing client commands"
lacks "$t/plan" "resume at" "a fresh state starts at step 1"
[ ! -s "$FAKE_LOG" ] && ok "a dry run calls no tool" || { not_ok "a dry run called: $(cat "$FAKE_LOG")"; }
[ "$before" = "$(snapshot)" ] && [ ! -e "$state/state" ] && ok "a dry run writes nothing" || not_ok "a dry run wrote files"
# A first deploy (no outputs file yet): the policy after cdk deploy.
mv "$state/outputs.json" "$t/outputs.away"
"$deploy" --dry-run >"$t/first" 2>&1 || { cat "$t/first"; not_ok "dry run (first deploy) exits 0"; }
policy_at="$(grep -n -- "/artifacts/policies/" "$t/first" | head -n1 | cut -d: -f1)"
deploy_at="$(grep -n -- "cdk deploy -c" "$t/first" | cut -d: -f1)"
[ "$(grep -c -- "/artifacts/policies/" "$t/first")" = 1 ] && [ "$policy_at" -gt "$deploy_at" ] \
  && ok "a first deploy uploads the policy after cdk deploy (the bucket is the stack's)" \
  || not_ok "first deploy policy order: policy at line $policy_at, cdk deploy at $deploy_at"
has "$t/first" "s3://<ArtifactsBucketName>/artifacts/policies/" "a first deploy's plan names the bucket the stack will output"
mv "$t/outputs.away" "$state/outputs.json"

# --- 2. steps 1-3 recorded done: the plan resumes at 4, and says the same twice --------------------
mkdir -p "$state/keys" "$t/img"
for k in image-publisher model-publisher; do printf '%064d\n' 1 >"$state/keys/$k.key"; printf 'cd%.0s' {1..32} >"$state/keys/$k.pub"; done
for f in enclave.eif host-poller measurements.json policy.json; do echo x >"$t/img/$f"; done
cat >"$state/state" <<EOF
STEP_1=done
STEP_2=done
STEP_3=done
IMAGE_PUBLISHER_KEY=$(cat "$state/keys/image-publisher.pub")
MODEL_PUBLISHER_KEY=$(cat "$state/keys/model-publisher.pub")
IMAGE_DIR=$t/img
IMAGE_COMMIT=0123456789abcdef0123456789abcdef01234567
EOF
before="$(snapshot)"
"$deploy" --dry-run >"$t/resume1" 2>&1 || { cat "$t/resume1"; not_ok "dry run (resume) exits 0"; }
"$deploy" --dry-run >"$t/resume2" 2>&1
for n in "1. keys" "2. image" "3. deploy"; do has "$t/resume1" "$n: " "$n is reported"; done
[ "$(grep -c -- '— done$' "$t/resume1")" = 3 ] && ok "steps 1-3 are done" || not_ok "steps 1-3 done: $(grep -c -- '— done$' "$t/resume1")"
has "$t/resume1" "-- resume at step 4 (publish)" "the plan resumes at step 4"
lacks "$t/resume1" "policy keygen" "no step 1 command is planned again"
lacks "$t/resume1" "cdk deploy -c" "no step 3 command is planned again"
has "$t/resume1" "$genesis_wait" "step 4 is planned"
has "$t/resume1" "submit examples/corpus.jsonl --policy $t/img/policy.json --publisher-key $(cat "$state/keys/image-publisher.pub")" "later steps use the recorded outputs"
cmp -s "$t/resume1" "$t/resume2" && ok "the same plan twice (idempotent)" || not_ok "two dry runs differ"
[ "$before" = "$(snapshot)" ] && [ ! -s "$FAKE_LOG" ] && ok "the resumed dry runs touch nothing" || not_ok "a resumed dry run wrote or called something"

# --- 3. a step recorded done whose output is gone runs again ------------------------------------------
mv "$t/img/enclave.eif" "$t/img/enclave.eif.away"
"$deploy" --dry-run >"$t/gone" 2>&1
has "$t/gone" "2. image: recorded done, but its output is gone" "a vanished EIF re-plans step 2"
has "$t/gone" "-- resume at step 2 (image)" "and the plan resumes there"
mv "$t/img/enclave.eif.away" "$t/img/enclave.eif"

# --- 4. --from ----------------------------------------------------------------------------------------
"$deploy" --dry-run --from ledger >"$t/from" 2>&1
[ "$(grep -c -- '— skipped (--from 5)$' "$t/from")" = 4 ] && ok "--from ledger skips 1-4" || not_ok "--from ledger: $(cat "$t/from")"
has "$t/from" "-- resume at step 5 (ledger)" "--from ledger starts at 5"
"$deploy" --dry-run --from 3 >"$t/from3" 2>&1
has "$t/from3" "cdk deploy" "--from 3 re-plans a step recorded done"
has "$t/from3" "-c enclaveEif=$t/img/enclave.eif -c hostPoller=$t/img/host-poller" "step 3 takes the assets from the recorded image directory"
if "$deploy" --dry-run --from nine >"$t/bad" 2>&1; then not_ok "--from nine is refused"; else has "$t/bad" "--from nine: no such step" "--from nine is refused"; fi

# --- 5. a real run: step 1 done and recorded, step 2 fails naming itself, the next run resumes at 2 ----
real="$t/real"
mkdir -p "$real"
cp "$state/outputs.json" "$real/"
if EPHEM_DEPLOY_DIR="$real" "$deploy" >"$t/run1" 2>&1; then not_ok "a real run without an account fails"; fi
has "$t/run1" "deploy: step 2" "the failure names step 2"
grep -qx 'STEP_1=done' "$real/state" && ok "step 1 is recorded done" || not_ok "step 1 recorded: $(cat "$real/state" 2>/dev/null)"
[ "$(stat -c %a "$real/keys/image-publisher.key")" = 600 ] && ok "the key file is 0600" || not_ok "key mode"
EPHEM_DEPLOY_DIR="$real" "$deploy" --dry-run >"$t/run2" 2>&1
has "$t/run2" "-- resume at step 2 (image)" "after the failure the plan resumes at step 2"
grep -c "policy keygen" "$FAKE_LOG" | grep -qx 2 && ok "the keys were made once each" || not_ok "keygen calls: $(cat "$FAKE_LOG")"

# --- 6. unpinned image inputs stop every run, a dry run included, before any call -------------------
# A copy of the scripts with one pin UNPINNED (a repository of its own: deploy.sh reads its root).
bad="$t/unpinned"
mkdir -p "$bad/scripts" "$bad/enclave-image"
cp "$deploy" "$bad/scripts/"; cp "$root/enclave-image/check-pins.sh" "$root/enclave-image/pins.env" "$bad/enclave-image/"
sed -i -E 's/^(RUST_BUILDER_IMAGE=.*@sha256:).*/\1UNPINNED/' "$bad/enclave-image/pins.env"
git -C "$bad" init -q && git -C "$bad" -c user.name=t -c user.email=t@t commit -q --allow-empty -m t
: >"$FAKE_LOG"
if EPHEM_DEPLOY_DIR="$t/unpinned-state" "$bad/scripts/deploy.sh" --dry-run >"$t/unpinned.log" 2>&1; then
  not_ok "a dry run with an UNPINNED builder is refused"
else
  has "$t/unpinned.log" "RUST_BUILDER_IMAGE=rust:1.95.0-alpine@sha256:UNPINNED is not" "the refusal names the unpinned value"
  has "$t/unpinned.log" "remedy: on a machine with Docker run enclave-image/build-enclave.sh --pin" "and the exact remedy"
  lacks "$t/unpinned.log" "1. keys" "and stops before step 1"
fi
[ ! -s "$FAKE_LOG" ] && ok "no tool was called before the refusal" || not_ok "called before the pin check: $(cat "$FAKE_LOG")"
has "$t/plan" "enclave-image/check-pins.sh" "the plan shows the pin check"

# --- 7. --update-image: the new image's keys, then the model under them, then the hosts (whose first creates the epoch) ---
upd="$t/update"
mkdir -p "$upd/keys"
jq '.EphemBatch += {"NextFleetKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/fake-next-fleet",
                    "NextModelKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/fake-next-model"}' "$state/outputs.json" >"$upd/outputs.json"
{ for n in 1 2 3 4 5 6; do echo "STEP_$n=done"; done
  echo "IMAGE_PUBLISHER_KEY=$(cat "$state/keys/image-publisher.pub")"
  echo "MODEL_PUBLISHER_KEY=$(cat "$state/keys/model-publisher.pub")"
  echo "IMAGE_DIR=$t/img"
  echo "IMAGE_COMMIT=0123456789abcdef0123456789abcdef01234567"
  echo "MODEL_VERSION_PUBLISHED=1"
  echo "JOB_VERIFIED=1"; } >"$upd/state"
head_commit="$(git -C "$root" rev-parse HEAD)"
: >"$FAKE_LOG"
before="$(cat "$upd/state")"
EPHEM_DEPLOY_DIR="$upd" "$deploy" --update-image --dry-run >"$t/upd" 2>&1 || { cat "$t/upd"; not_ok "--update-image --dry-run exits 0"; }
order="$(grep -Eo '^U[0-9]\. [a-z]+' "$t/upd" | tr '\n' ' ')"
[ "$order" = "U1. build U2. keys U3. model U4. roll U5. epoch U6. job " ] && ok "update phases in order" || not_ok "update phases: '$order'"
line() { grep -nF -- "$1" "$t/upd" | head -n1 | cut -d: -f1; }
policy_at="$(line "s3://fake-artifacts/artifacts/policies/$head_commit.json")"
keys_at="$(line "-c nextPolicyFile=../dist/enclave/$head_commit/policy.json")"
seal_at="$(line "env EPHEM_MODEL_KEY_ARN=arn:aws:kms:eu-west-1:123456789012:key/fake-next-model ephem-batch")"
roll_at="$(line "-c enclaveEif=../dist/enclave/$head_commit/enclave.eif")"
attest_at="$(line "attest fetch --policy dist/enclave/$head_commit/policy.json")"
epoch_at="$(line "scripts/deploy.sh fleet-genesis fake-attestations arn:aws:kms:eu-west-1:123456789012:key/fake-next-fleet")"
submit_at="$(line "submit examples/corpus.jsonl --policy dist/enclave/$head_commit/policy.json")"
if [ -n "$policy_at" ] && [ -n "$keys_at" ] && [ -n "$seal_at" ] && [ -n "$roll_at" ] && [ -n "$attest_at" ] && [ -n "$epoch_at" ] && [ -n "$submit_at" ] \
   && [ "$policy_at" -lt "$keys_at" ] && [ "$keys_at" -lt "$seal_at" ] && [ "$seal_at" -lt "$roll_at" ] \
   && [ "$roll_at" -lt "$attest_at" ] && [ "$attest_at" -lt "$epoch_at" ] && [ "$epoch_at" -lt "$submit_at" ]; then
  ok "policy, then new keys, then the model under the new model key, then the launch template and its attestation, then the new key's genesis, then a job on the new policy"
else
  not_ok "update order: policy $policy_at, keys $keys_at, model $seal_at, roll $roll_at, attested $attest_at, epoch $epoch_at, submit $submit_at"
fi
lacks "$t/upd" "lambda invoke" "no Lambda makes the new key's epoch"
grep -F -- "-c nextPolicyFile=" "$t/upd" | grep -qF -- "-c enclaveEif=$t/img/enclave.eif" \
  && ok "the keys deploy keeps the running image on the hosts" || not_ok "the keys deploy changes the hosts' image"
grep -F -- "-c enclaveEif=../dist/enclave/$head_commit/" "$t/upd" | grep -qvF -- "nextPolicyFile" \
  && ok "the rolling deploy names no incoming image" || not_ok "the rolling deploy still names nextPolicyFile"
has "$t/upd" "model encrypt .ephem/models/all-MiniLM-L6-v2 --model-id sentence-transformers/all-MiniLM-L6-v2 --version 2" "the model is re-sealed as the next version"
has "$t/upd" "--version 2 --for-image dist/enclave/$head_commit/policy.json" "the next version is sealed for the new image only (old clients keep the old version)"
has "$t/upd" "attest fetch --policy dist/enclave/$head_commit/policy.json" "the roll waits for the new image's attestation"
[ ! -s "$FAKE_LOG" ] && [ "$before" = "$(cat "$upd/state")" ] && ok "an update dry run calls and writes nothing" || not_ok "an update dry run called or wrote"
# Nothing to roll: the fleet runs this commit already.
sed -i "s/^IMAGE_COMMIT=.*/IMAGE_COMMIT=$head_commit/" "$upd/state"
if EPHEM_DEPLOY_DIR="$upd" "$deploy" --update-image --dry-run >"$t/upd2" 2>&1; then not_ok "an update to the running commit is refused"; else
  has "$t/upd2" "the fleet already runs the image of $head_commit" "an update to the running commit is refused"; fi

# A real run (fake tools) of an update whose image has the running PCRs, U1 recorded done: no new
# keys or model; it fails at U4 (no account), names U4, and a re-run resumes there.
same="$t/same"
mkdir -p "$same/img-new"
cp "$upd/outputs.json" "$same/"
for f in enclave.eif host-poller measurements.json; do echo y >"$same/img-new/$f"; done
echo '{"version":1,"pcrs":{"0":"aa","1":"bb","2":"cc"}}' >"$same/img-new/policy.json"
echo '{"version":1,"pcrs":{"2":"cc","1":"bb","0":"aa"}}' >"$t/img/policy.json"
{ grep -v '^IMAGE_COMMIT=' "$upd/state"; echo "IMAGE_COMMIT=0123456789abcdef0123456789abcdef01234567"
  echo "NEXT_IMAGE_DIR=$same/img-new"; echo "NEXT_IMAGE_COMMIT=$head_commit"; echo "UPDATE_1=done:$head_commit"; } >"$same/state"
: >"$FAKE_LOG"
if EPHEM_DEPLOY_DIR="$same" "$deploy" --update-image >"$t/same.log" 2>&1; then not_ok "a real update without an account fails"; fi
has "$t/same.log" "U1. build — done" "U1 recorded done is not run again"
has "$t/same.log" "the new image has the running image's PCRs" "same PCRs: no new keys"
has "$t/same.log" "deploy: step U4 (roll) failed" "the failure names U4"
has "$t/same.log" "re-run scripts/deploy.sh --update-image: it resumes at step U4" "and how to resume"
lacks "$FAKE_LOG" "nextPolicyFile" "no keys deploy"
lacks "$FAKE_LOG" "model encrypt" "no re-sealed model"
grep -qx "UPDATE_3=done:$head_commit" "$same/state" && ok "U2-U3 recorded done" || not_ok "U3 recorded: $(cat "$same/state")"
grep -q "^UPDATE_4=" "$same/state" && not_ok "U4 recorded done after it failed" || ok "U4 not recorded done"
echo x >"$t/img/policy.json"

# --- 8. fleet-genesis: an unexpired epoch under the key, with its genesis --------------------------------
s3="$t/s3"
mkdir -p "$s3/fleet-keys" "$s3/fleet-genesis"
now_ms=$(( $(date +%s) * 1000 ))
old_key=arn:aws:kms:eu-west-1:123456789012:key/old new_key=arn:aws:kms:eu-west-1:123456789012:key/new
record() { # EPOCH NOT_AFTER_MS KEY_ARN
  printf '{"epoch": %s, "not_after_ms": %s, "kms_key_id": "%s", "public_key": "04", "wrapped_private_key": "00"}\n' "$1" "$2" "$3" \
    >"$s3/fleet-keys/epoch-$1.json"
}
record 1 $((now_ms + 86400000)) "$old_key"; echo '{}' >"$s3/fleet-genesis/epoch-1.json"   # another key's
record 2 $((now_ms - 60000)) "$new_key"; echo '{}' >"$s3/fleet-genesis/epoch-2.json"     # expired
record 3 $((now_ms + 86400000)) "$new_key"                                                 # no genesis
echo '{}' >"$s3/fleet-genesis/epoch-9.json"                                                # no record
if FAKE_S3="$s3" "$deploy" fleet-genesis fake-attestations "$new_key" >"$t/genesis.out" 2>&1; then
  not_ok "fleet-genesis found one where none counts: $(cat "$t/genesis.out")"
else
  ok "fleet-genesis: another key's, an expired one, a record without genesis and a genesis without record do not count"
fi
record 4 $((now_ms + 86400000)) "$new_key"; echo '{}' >"$s3/fleet-genesis/epoch-4.json"
got="$(FAKE_S3="$s3" "$deploy" fleet-genesis fake-attestations "$new_key" 2>&1)" || true
[ "$got" = "fleet-genesis/epoch-4.json" ] && ok "fleet-genesis finds the epoch under the key" || not_ok "fleet-genesis: '$got'"
got="$(FAKE_S3="$s3" "$deploy" fleet-genesis fake-attestations "$old_key" 2>&1)" || true
[ "$got" = "fleet-genesis/epoch-1.json" ] && ok "and the old key's under the old key" || not_ok "fleet-genesis (old key): '$got'"

# --- 9. the ledger key string: known answer of docs/protocol.md §8.5 ---------------------------------
# The verifier key's base64(0x01 || key), as an Ed25519 SubjectPublicKeyInfo the way KMS returns it.
pub="$(echo 'ASFS+NGbeR0kRTJC4V8uq2y3z/p7al7TAJeWDgaYgdsS' | base64 -d | tail -c 32 | od -An -tx1 | tr -d ' \n')"
spki="$(echo "302a300506032b6570032100$pub" | xxd -r -p | base64 -w0)"
got="$("$deploy" ledger-key-string ledger.ephem-batch.example/test "$spki")"
[ "$got" = "ledger.ephem-batch.example/test+70925f2d+ASFS+NGbeR0kRTJC4V8uq2y3z/p7al7TAJeWDgaYgdsS" ] \
  && ok "ledger key string matches protocol §8.5" || not_ok "ledger key string: $got"
if "$deploy" ledger-key-string bad "$(printf 'x%.0s' {1..44} | base64 -w0)" >/dev/null 2>&1; then not_ok "a non-Ed25519 key is refused"; else ok "a non-Ed25519 key is refused"; fi

[ "$fails" = 0 ] || { echo "deploy dry-run tests: $fails failed" >&2; exit 1; }
echo "deploy dry-run tests: all passed"
