#!/usr/bin/env bash
# The emulator flow's stack, created from the CDK app's own template by moto's CloudFormation
# (docs/operations.md §10):
#
#   scripts/emulator-stack.sh synth                    synthesize the app offline (dummy measurements,
#                                                      Lambda zips and AMI; no account, no lookup) and
#                                                      print what the emulator template keeps and strips
#   scripts/emulator-stack.sh deploy OUTPUTS [STACK]   synthesize again if the app changed, create stack
#                                                      STACK (default EphemBatch) in the emulator at
#                                                      AWS_ENDPOINT_URL, write its outputs to OUTPUTS
#                                                      (`cdk deploy --outputs-file` form)
#
# The synthesized app lives in .ephem/emulator-stack/ (cdk.out/, and the app compiled there, away
# from cdk/dist which the CDK tests rebuild); scripts/emulator_stack.py derives the emulator
# template from it and deploys it with boto3 from moto's virtual environment (scripts/moto.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$root/.ephem/emulator-stack"
template="$work/cdk.out/EphemBatch.template.json"
venv="${EPHEM_HOME:-$root/.ephem}/venv-moto"
export CDK_DISABLE_CLI_TELEMETRY=true CDK_DISABLE_VERSION_CHECK=true
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

# What the synthesized template depends on: a change to any of these synthesizes it again.
sources=("$root/cdk/bin" "$root/cdk/lib" "$root/cdk/package.json" "$root/cdk/tsconfig.json" "$root/cdk/cdk.json"
         "$root/package-lock.json" "$root/lambdas/asl" "$root/scripts/emulator-stack.sh")

stale() {
    [ -s "$template" ] && [ -e "$work/synth.stamp" ] || return 0
    [ -z "$(find "${sources[@]}" -newer "$work/synth.stamp" -print -quit 2>/dev/null)" ] && return 1
    return 0
}

synth() {
    mkdir -p "$work"
    # One synth at a time (tests deploy stacks in parallel).
    exec 9>"$work/lock"
    flock 9
    if [ "${1:-}" != force ] && ! stale; then
        exec 9>&-
        return
    fi
    local started=$SECONDS
    command -v node >/dev/null || { echo "emulator-stack: node is not installed (Node 20 or later is needed)" >&2; exit 1; }
    if [ ! -x "$root/node_modules/.bin/cdk" ] || [ "$root/package-lock.json" -nt "$root/node_modules/.package-lock.json" ]; then
        (cd "$root" && npm ci --loglevel=error)
    fi
    rm -rf "$work/dist" "$work/cdk.out" "$work/lambda-zips"
    (cd "$root/cdk" && npx --no-install tsc -p tsconfig.json --outDir "$work/dist")
    # The functions are created in the emulator, never run: any zip will do.
    python3 - "$work/lambda-zips" <<'EOF'
import pathlib, sys, zipfile
for name in ["on-upload", "ledger-append", "bulk-list-shards", "bulk-await-shard", "bulk-aggregate", "job-dead-letter"]:
    d = pathlib.Path(sys.argv[1]) / name
    d.mkdir(parents=True)
    with zipfile.ZipFile(d / "bootstrap.zip", "w") as z:
        z.writestr("bootstrap", "#!/bin/sh\necho 'emulator placeholder: moto runs no Lambda function' >&2\nexit 1\n")
EOF
    local touch_first="$work/synth.stamp.new"
    touch "$touch_first"
    (cd "$root/cdk" && npx --no-install cdk synth --quiet --no-notices --no-version-reporting \
        --app "node $work/dist/bin/app.js" -o "$work/cdk.out" \
        -c pcr0="$(printf 'e0%.0s' {1..48})" -c imagePublisherKey="$(printf 'e1%.0s' {1..32})" \
        -c lambdaAssetsDir="$work/lambda-zips" -c hostAmi=ami-0e0e0e0e0e0e0e0e0)
    [ -s "$template" ] || { echo "emulator-stack: the synth wrote no $template" >&2; exit 1; }
    mv "$touch_first" "$work/synth.stamp"
    echo "emulator-stack: synthesized in $((SECONDS - started))s: $template" >&2
    exec 9>&-
}

case "${1:-}" in
    synth)
        synth force
        python3 "$root/scripts/emulator_stack.py" derive "$template" "$work/emulator.template.json"
        ;;
    deploy)
        outputs="${2:?usage: scripts/emulator-stack.sh deploy OUTPUTS [STACK]}"
        stack="${3:-EphemBatch}"
        [ -n "${AWS_ENDPOINT_URL:-}" ] || { echo "emulator-stack: AWS_ENDPOINT_URL is not set (scripts/moto.sh start)" >&2; exit 1; }
        synth
        bash "$root/scripts/moto.sh" install
        "$venv/bin/python" "$root/scripts/emulator_stack.py" deploy --template "$template" --stack-name "$stack" --outputs "$outputs"
        ;;
    *)
        echo "usage: scripts/emulator-stack.sh synth | deploy OUTPUTS [STACK]" >&2
        exit 2
        ;;
esac
