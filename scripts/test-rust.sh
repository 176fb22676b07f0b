#!/usr/bin/env bash
# Runs every Rust test in the workspace against the shared fixtures, with an AWS emulator (moto,
# scripts/moto.sh) for the AWS-path tests, whose stack moto creates from the CDK app's template
# (scripts/emulator-stack.sh). `--aws` runs only the AWS emulator tests (`make test-aws`).
set -euo pipefail
cd "$(dirname "$0")/.."
only_aws=false
[ "${1:-}" = "--aws" ] && only_aws=true
export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
# Tests that run the model read it from here.
bash scripts/setup-model.sh
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-${EPHEM_HOME:-$PWD/.ephem}/models/all-MiniLM-L6-v2}"

# The emulator: started here (and stopped on exit) unless one of ours already runs.
if endpoint="$(bash scripts/moto.sh endpoint 2>/dev/null)"; then
    echo "moto: using the running server at $endpoint"
else
    started=$(date +%s)
    endpoint="$(bash scripts/moto.sh start)"
    trap 'bash scripts/moto.sh stop' EXIT
    echo "moto: started at $endpoint in $(( $(date +%s) - started ))s"
fi
export EPHEM_TEST_AWS_ENDPOINT="$endpoint"

# The AWS tests' stack is the CDK app's template, created by moto's CloudFormation
# (scripts/emulator-stack.sh): synthesized once here, then the filter that derives the emulator
# template is tested (on its fixtures and on that template).
started=$(date +%s)
bash scripts/emulator-stack.sh synth >/dev/null
python3 -m unittest discover -s scripts/tests -p 'test_emulator_stack.py'
echo "emulator stack: synthesized and its filter tested in $(( $(date +%s) - started ))s"

# The cross-component tests run the real binaries: build them first, with the tests, so that the
# features resolve as `cargo test` resolves them (dev-dependencies included); built without the
# tests, 82 crates (the AWS SDK and candle among them) were built twice (6 m 48 s, ~1.5 GB).
cargo build --workspace --bins --tests --locked
if $only_aws; then
    cargo test --locked -p cloud-aws --lib
    cargo test --locked -p tests --test aws_conformance --test aws_pipeline --test aws_stack --test aws_workflow -- aws_
else
    cargo test --workspace --locked
fi
