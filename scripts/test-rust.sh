#!/usr/bin/env bash
# Runs every Rust test in the workspace against the shared fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
cargo test --workspace --locked
