#!/usr/bin/env bash
# CDK checks, offline (registries only), from a fresh clone:
#   1. npm ci at the workspace root, compile the app (tsc);
#   2. synthesize through the CDK CLI, as `cdk deploy` would, with dummy measurements and dummy
#      Lambda zips (cdk-nag AwsSolutions runs inside the synth and fails it on any finding);
#   3. cfn-lint on the synthesized template (installed into a cached virtualenv);
#   4. the assertion tests (node --test), which also run cdk-nag;
#   and on the side: scripts/deploy.sh (shellcheck, scripts/tests/deploy-dry-run.sh) and cfn-lint
#   on enclave-image/image-build.yaml.
# Any failure stops the script with a non-zero exit.
set -euo pipefail

cdk_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$cdk_dir/.." && pwd)"
CFN_LINT_VERSION="1.58.0"
# Dummy, well-formed measurements: this synth is never deployed.
DUMMY_PCR0="$(printf 'a0%.0s' {1..48})"
DUMMY_PCR8="$(printf 'b8%.0s' {1..48})"
# A pinned host AMI: no lookup, so no AWS credentials are needed or used.
DUMMY_AMI=ami-0123456789abcdef0

step() { printf '\n== cdk: %s\n' "$*"; }
fail() { printf '\n!! cdk: %s\n' "$*" >&2; exit 1; }
trap 'fail "step failed (line $LINENO)"' ERR

# No telemetry, no notices, no update checks: nothing but the registries is reachable.
export CDK_DISABLE_CLI_TELEMETRY=true CDK_DISABLE_VERSION_CHECK=true
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

step "npm ci"
command -v node >/dev/null || fail "node is not installed (Node 20 or later is needed)"
(cd "$root" && npm ci --loglevel=error)

step "compile"
(cd "$cdk_dir" && rm -rf dist && npx --no-install tsc -p tsconfig.json)

step "synth through the CDK CLI (offline, dummy measurements and Lambda zips)"
zips="$(mktemp -d)"
trap 'rm -rf "$zips"' EXIT
python3 - "$zips" <<'EOF'
import sys, zipfile, pathlib
for name in ["on-upload", "ledger-append", "bulk-list-shards", "bulk-await-shard", "bulk-aggregate", "job-dead-letter"]:
    d = pathlib.Path(sys.argv[1]) / name
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / "bootstrap.zip", "w") as z:
        z.writestr("bootstrap", "#!/bin/sh\necho 'placeholder used by cdk/scripts/test.sh'\nexit 1\n")
EOF
rm -rf "$cdk_dir/cdk.out"
(cd "$cdk_dir" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
  -c pcr0="$DUMMY_PCR0" -c pcr8="$DUMMY_PCR8" -c lambdaAssetsDir="$zips" -c hostAmi="$DUMMY_AMI")
template="$cdk_dir/cdk.out/EphemBatch.template.json"
[ -s "$template" ] || fail "synth wrote no template at $template"

step "synth with the online relay (-c onlineCertificateArn, a dummy ARN)"
(cd "$cdk_dir" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting -o "$zips/online" \
  -c pcr0="$DUMMY_PCR0" -c pcr8="$DUMMY_PCR8" -c lambdaAssetsDir="$zips" -c hostAmi="$DUMMY_AMI" \
  -c onlineCertificateArn=arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-0000-0000-000000000000)
online_template="$zips/online/EphemBatch.template.json"
[ -s "$online_template" ] || fail "synth wrote no template at $online_template"

step "a synth without measurements must fail"
if (cd "$cdk_dir" && npx --no-install cdk synth --quiet --no-notices -c lambdaAssetsDir="$zips" -o "$zips/out" >"$zips/nomeasure.log" 2>&1); then
  fail "synth without measurements succeeded"
fi
grep -q "missing enclave measurements" "$zips/nomeasure.log" || { cat "$zips/nomeasure.log"; fail "synth without measurements failed for another reason"; }

step "enclave-image pins (check-pins.sh: the committed pins hold; an UNPINNED one is refused)"
bash -n "$root/enclave-image/build-enclave.sh" "$root/enclave-image/check-reproducible.sh" "$root/enclave-image/check-pins.sh"
sh -n "$root/enclave-image/build-worker.sh"
# What main ships must pin the build: a fresh clone deploys without editing pins.env.
bash "$root/enclave-image/check-pins.sh" || fail "enclave-image/pins.env does not pin the image build (remedy above)"
# The CodeBuild project's image default is the pinned one (the buildspec refuses another).
pinned_build_image="$(sed -n 's/^CODEBUILD_IMAGE=//p' "$root/enclave-image/pins.env")"
grep -A4 '^  BuildImage:' "$root/enclave-image/image-build.yaml" | grep -qx "    Default: $pinned_build_image" \
  || fail "enclave-image/image-build.yaml BuildImage default is not $pinned_build_image (pins.env CODEBUILD_IMAGE)"
# An UNPINNED value, in any pin, is refused by the checker and by build-enclave.sh before it
# builds anything (a copy of enclave-image/ with one pin replaced).
for var in RUST_BUILDER_IMAGE NITRO_CLI_IMAGE NITRO_CLI_VERSION; do
  copy="$zips/pins-$var/enclave-image"
  mkdir -p "$copy" && cp "$root/enclave-image/"*.sh "$root/enclave-image/pins.env" "$root/enclave-image/expected-pcrs.txt" "$copy/"
  sed -i -E "s/^($var=)(.*@sha256:)?.*/\1\2UNPINNED/" "$copy/pins.env"
  if bash "$copy/check-pins.sh" >"$zips/pin.log" 2>&1; then fail "check-pins.sh accepted $var=...UNPINNED"; fi
  grep -q "^check-pins: .*$var=" "$zips/pin.log" || { cat "$zips/pin.log"; fail "check-pins.sh did not name $var"; }
  grep -q "remedy:" "$zips/pin.log" || { cat "$zips/pin.log"; fail "check-pins.sh named no remedy for $var"; }
  if bash "$copy/build-enclave.sh" --unsigned --model-publisher-pubkey "${DUMMY_PCR0:0:64}" >"$zips/pin.log" 2>&1; then
    fail "build-enclave.sh accepted $var=...UNPINNED"
  fi
  grep -q "does not pin the build" "$zips/pin.log" || { cat "$zips/pin.log"; fail "build-enclave.sh failed for another reason than $var"; }
done
echo "pins: committed pins hold; UNPINNED refused by check-pins.sh and build-enclave.sh"

step "scripts/deploy.sh (shellcheck if installed, else bash -n; the dry-run plan and resuming)"
if command -v shellcheck >/dev/null; then
  shellcheck "$root/scripts/deploy.sh" "$root/scripts/tests/deploy-dry-run.sh"
else
  echo "shellcheck not installed: syntax only"
  bash -n "$root/scripts/deploy.sh" "$root/scripts/tests/deploy-dry-run.sh"
fi
bash "$root/scripts/tests/deploy-dry-run.sh" >"$zips/deploy-test.log" 2>&1 || { cat "$zips/deploy-test.log"; fail "scripts/tests/deploy-dry-run.sh"; }
tail -n1 "$zips/deploy-test.log"

step "cfn-lint $CFN_LINT_VERSION"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/ephem-batch/cfn-lint-$CFN_LINT_VERSION"
if [ ! -x "$cache/bin/cfn-lint" ]; then
  rm -rf "$cache"
  if python3 -m venv "$cache" >/dev/null 2>&1; then
    "$cache/bin/python" -m pip install --quiet --disable-pip-version-check "cfn-lint==$CFN_LINT_VERSION"
  else
    # No venv module (e.g. Debian without python3-venv): a user install instead.
    python3 -m pip install --quiet --user --disable-pip-version-check "cfn-lint==$CFN_LINT_VERSION"
    mkdir -p "$cache/bin"
    printf '#!/bin/sh\nexec python3 -m cfnlint "$@"\n' >"$cache/bin/cfn-lint"
    chmod +x "$cache/bin/cfn-lint"
  fi
fi
# W3005 (redundant DependsOn) comes from CDK's own ordering of resources it generates.
"$cache/bin/cfn-lint" --ignore-checks W3005 -- "$template" "$online_template"
# The enclave image build stack (CodeBuild; deployed by scripts/deploy.sh step 2).
"$cache/bin/cfn-lint" -- "$root/enclave-image/image-build.yaml"
echo "cfn-lint: no findings"

step "assertion tests (node --test)"
cd "$cdk_dir"
node --test dist/test/
