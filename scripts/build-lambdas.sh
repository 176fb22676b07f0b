#!/usr/bin/env bash
# Builds the Lambda binaries of crate lambdas/ for the provided.al2023 runtime (x86_64) and
# writes target/lambda/<name>/bootstrap.zip for each, where the CDK app takes them
# (cdk/lib/lambda-code.ts):
#   on-upload ledger-append fleet-rotate bulk-list-shards bulk-await-shard bulk-aggregate job-dead-letter
#
# With cargo-lambda (installed from PyPI into .ephem/venv-lambda on first use) the build is
#   cargo lambda build --release --compiler cargo --output-format zip -p lambdas
# (--compiler cargo: a native x86_64 build, no Zig needed; the binaries need glibc 2.30 at
# most, which Amazon Linux 2023 has). If cargo-lambda cannot be installed, a plain
# `cargo build --release` and a zip of each binary named `bootstrap` give the same files.
#
#   scripts/build-lambdas.sh              # cargo-lambda if it installs, else plain cargo
#   scripts/build-lambdas.sh --plain      # plain cargo + zip
set -euo pipefail
cd "$(dirname "$0")/.."

NAMES=(on-upload ledger-append fleet-rotate bulk-list-shards bulk-await-shard bulk-aggregate job-dead-letter)
OUT=target/lambda
VENV=.ephem/venv-lambda
mode=${1:-auto}

cargo_lambda() {
  if [[ ! -x "$VENV/bin/cargo-lambda" ]]; then
    python3 -m venv "$VENV" >/dev/null 2>&1 || return 1
    "$VENV/bin/pip" install --quiet --disable-pip-version-check cargo-lambda >/dev/null 2>&1 || return 1
  fi
  [[ -x "$VENV/bin/cargo-lambda" ]]
}

# Both ways build for the explicit target, so they share target/x86_64-unknown-linux-gnu/.
TARGET=x86_64-unknown-linux-gnu

plain() {
  cargo build --release --locked -p lambdas --bins --target "$TARGET"
  for name in "${NAMES[@]}"; do
    dir="$OUT/$name"
    rm -rf "$dir" && mkdir -p "$dir"
    cp "target/$TARGET/release/$name" "$dir/bootstrap"
    # Symbols are half the binary; cargo-lambda strips them too.
    if command -v strip >/dev/null; then strip "$dir/bootstrap"; fi
    # The runtime starts the executable named `bootstrap` at the root of the zip.
    (cd "$dir" && python3 -m zipfile -c bootstrap.zip bootstrap && rm bootstrap)
  done
}

if [[ "$mode" != "--plain" ]] && cargo_lambda; then
  echo "building with $("$VENV/bin/cargo-lambda" lambda --version 2>/dev/null | head -1)"
  PATH="$PWD/$VENV/bin:$PATH" cargo lambda build --release --locked --compiler cargo --target "$TARGET" \
    --output-format zip -p lambdas --lambda-dir "$OUT"
else
  [[ "$mode" == "--plain" ]] || echo "cargo-lambda not available: plain cargo build + zip"
  plain
fi

for name in "${NAMES[@]}"; do
  zip="$OUT/$name/bootstrap.zip"
  [[ -f "$zip" ]] || { echo "missing $zip" >&2; exit 1; }
  printf '%-18s %s bytes\n' "$name" "$(stat -c %s "$zip")"
done
