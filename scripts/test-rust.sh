#!/usr/bin/env bash
# Runs every Rust test in the workspace against the shared fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
# Tests that run the model read it from here.
bash scripts/setup-model.sh
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-${EPHEM_HOME:-$PWD/.ephem}/models/all-MiniLM-L6-v2}"
# The cross-component tests run the real binaries: build them first.
cargo build --workspace --bins --locked
cargo test --workspace --locked
