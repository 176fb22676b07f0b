#!/usr/bin/env bash
# The README's first command builds: the selection `make demo` builds (scripts/lib/demo-build.sh)
# enables the worker's development NSM, without which enclave-worker refuses to compile, and
# compiles neither of the two slowest things a 2-core machine would otherwise build for it:
# candle (the tests' reference backend) and aws-lc (README: how long the first run takes).
# Resolved by `cargo tree`, so the check costs no build.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/demo-build.sh
features="$(cargo tree --locked "${DEMO_PACKAGES[@]}" -e features,normal -i enclave-worker 2>&1)" || {
  echo "not ok - cargo cannot resolve the demo's build selection:" >&2; echo "$features" >&2; exit 1; }
if grep -q 'enclave-worker feature "dev"' <<<"$features"; then
  echo "ok - make demo builds enclave-worker with its development NSM"
else
  echo "not ok - make demo would build enclave-worker without the dev feature:" >&2; echo "$features" >&2; exit 1
fi
tree="$(cargo tree --locked "${DEMO_PACKAGES[@]}" -e normal,build --prefix none --format '{p}')"
if slow="$(grep -E '^(candle-[a-z]+|aws-lc-sys|aws-lc-rs) ' <<<"$tree" | sort -u)" && [ -n "$slow" ]; then
  echo "not ok - make demo would compile crates it does not need:" >&2; echo "$slow" >&2; exit 1
fi
echo "ok - make demo compiles neither candle nor aws-lc"
