#!/usr/bin/env bash
# Builds the Lambda binaries of crate lambdas/ for the provided.al2023 runtime (x86_64, glibc 2.34)
# and writes target/lambda/<name>/bootstrap.zip for each, where the CDK app takes them
# (cdk/lib/lambda-code.ts):
#   on-upload ledger-append bulk-list-shards bulk-await-shard bulk-aggregate job-dead-letter
#
# The link is against glibc 2.34, whatever the build machine's glibc:
#   cargo lambda build --release --target x86_64-unknown-linux-gnu.2.34 --output-format zip -p lambdas
# cargo-lambda links with Zig (its cargo-zigbuild backend), which compiles the C dependencies
# against glibc 2.34's headers and links against stub libraries holding only the symbols of
# glibc 2.34 and older: a newer symbol is an undefined-symbol error at link time, not a
# `GLIBC_2.38 not found` when the function starts. Every binary is then read by
# scripts/check-glibc.py, which fails on any symbol version above GLIBC_2.34.
#
# The tools are pinned (versions and wheel SHA-256) and installed from PyPI into
# $EPHEM_HOME/venv-lambda (default .ephem/venv-lambda): cargo-lambda, ziglang (Zig), pyelftools.
# Cargo's files go to target/lambda-build/ (not the workspace's target/ directories).
#
#   scripts/build-lambdas.sh           # release zips in target/lambda/, then the glibc check
#   scripts/build-lambdas.sh --check   # the CI check (make test): same target and linker, cheap profile
#   scripts/build-lambdas.sh --tools   # only install the tools; prints the venv's directory
#
# --check builds the same binaries with the same toolchain, target, linker and C compiler, in the
# dev profile with every crate at opt-level 0 and no debug info, into target/lambda-build/check/,
# and runs the same check on them. The glibc symbol versions a binary needs are fixed by what it
# is linked against (the 2.34 stubs, for both profiles), not by optimisation, so this proves the
# build's configuration for the release zips at a fraction of the cost (docs/operations.md §1.4);
# the release build checks its own zips every time it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

NAMES=(on-upload ledger-append bulk-list-shards bulk-await-shard bulk-aggregate job-dead-letter)
GLIBC=2.34
TARGET="x86_64-unknown-linux-gnu.$GLIBC"
OUT=target/lambda
BUILD_DIR="$PWD/target/lambda-build"
VENV="${EPHEM_HOME:-$PWD/.ephem}/venv-lambda"
mode=${1:-release}

# Pinned tools: version, and the SHA-256 of each wheel pip may pick (Linux x86_64 and aarch64,
# macOS arm64). ziglang is cargo-lambda's only dependency; pyelftools has none.
CARGO_LAMBDA=1.9.2
ZIGLANG=0.15.2
PYELFTOOLS=0.33
requirements() {
  cat <<EOF
cargo-lambda==$CARGO_LAMBDA \\
  --hash=sha256:db2c0b1d53d7ed0055198fd045f641addc91b180b20d794fcf78cc9a9efacb38 \\
  --hash=sha256:3350315e8b4e88f7134967f51546bf51aa5db37a6d39a17380545362ae27e289 \\
  --hash=sha256:28e2f698b4e0e367097cd30a8ded8ddc6851dba6f4d53b907b4659a635ae3665
ziglang==$ZIGLANG \\
  --hash=sha256:806316453d1ede7174ed3fefb8e5348154629089c3bb5fe812dfd0e172fac130 \\
  --hash=sha256:edc0aa60ec964a4cf462d40f68d7de242ddf37fd9a80f2afaee6397059463230 \\
  --hash=sha256:acae2a9ce67ed249ad68d42c21bc73b5f9d51a33ba5ea42f609f78683e8d9bb7
pyelftools==$PYELFTOOLS \\
  --hash=sha256:f215ad5f47d3f1373a21496a6c9e0707c622840d0622f23ff7ce08678b020036
EOF
}

installed() {
  [[ -x "$VENV/bin/cargo-lambda" ]] && "$VENV/bin/python" - "$CARGO_LAMBDA" "$ZIGLANG" "$PYELFTOOLS" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
want = dict(zip(("cargo-lambda", "ziglang", "pyelftools"), sys.argv[1:]))
sys.exit(any(version(name) != v for name, v in want.items()))
PY
}

tools() {
  installed && return
  local started
  started=$(date +%s)
  make_venv "$VENV"
  requirements >"$VENV/requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$VENV/requirements.txt"
  installed || { echo "build-lambdas: the pinned tools are not in $VENV after installing them" >&2; exit 1; }
  echo "build-lambdas: cargo-lambda $CARGO_LAMBDA, ziglang $ZIGLANG, pyelftools $PYELFTOOLS installed in $(( $(date +%s) - started ))s" >&2
}

# cargo-lambda finds Zig as `python3 -m ziglang`: the venv's python3 comes first on PATH.
cargo_lambda() {
  PATH="$VENV/bin:$PATH" CARGO_TARGET_DIR="$BUILD_DIR" cargo lambda build --locked -p lambdas --bins \
    --target "$TARGET" "$@" </dev/null
}

check() { "$VENV/bin/python" scripts/check-glibc.py --max "$GLIBC" "$@"; }

case "$mode" in
  --tools)
    tools
    echo "$VENV"
    ;;
  --check)
    tools
    started=$(date +%s)
    dir="$BUILD_DIR/check"
    rm -rf "$dir"
    cargo_lambda --lambda-dir "$dir" \
      --config 'profile.dev.debug=false' \
      --config 'profile.dev.package."*".opt-level=0' \
      --config 'profile.dev.package.protocol.opt-level=0'
    echo "build-lambdas --check: built in $(( $(date +%s) - started ))s"
    bins=()
    for name in "${NAMES[@]}"; do bins+=("$dir/$name/bootstrap"); done
    check "${bins[@]}"
    ;;
  release)
    tools
    echo "building with $("$VENV/bin/cargo-lambda" lambda --version | head -1), Zig $("$VENV/bin/python" -m ziglang version), for $TARGET"
    cargo_lambda --release --output-format zip --lambda-dir "$OUT"
    zips=()
    for name in "${NAMES[@]}"; do
      zip="$OUT/$name/bootstrap.zip"
      [[ -f "$zip" ]] || { echo "missing $zip" >&2; exit 1; }
      printf '%-18s %s bytes\n' "$name" "$(stat -c %s "$zip")"
      zips+=("$zip")
    done
    check "${zips[@]}"
    ;;
  *)
    echo "usage: scripts/build-lambdas.sh [--check | --tools]" >&2
    exit 2
    ;;
esac
