#!/usr/bin/env bash
# Builds the enclave-worker of one commit twice, from two clones at different paths with
# separate cargo target directories, and checks that the two binaries have the same SHA-384.
#   enclave-image/check-reproducible.sh [COMMIT]     (default HEAD)
# This is the part of the image build that runs without Docker. It takes two full release
# builds. TARGET defaults to the static musl target when its standard library is installed
# (rustup target add x86_64-unknown-linux-musl), else to the host target, which still checks
# that paths and times do not leak into the binary. BUILD_PACKAGE/BUILD_BIN (see build-worker.sh)
# select another binary of the workspace.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit="$(git -C "$root" rev-parse "${1:-HEAD}")"
if [ -z "${TARGET:-}" ]; then
  if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    TARGET=x86_64-unknown-linux-musl
  else
    TARGET="$(rustc -vV | sed -n 's/^host: //p')"
    echo "note: musl standard library not installed; checking reproducibility on $TARGET" >&2
  fi
fi
export TARGET
export EPHEM_MODEL_PUBLISHER_PUBKEY="${EPHEM_MODEL_PUBLISHER_PUBKEY:-$(printf '00%.0s' {1..32})}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sums=()
for n in first second-at-another-path; do
  git clone --quiet --no-hardlinks "$root" "$work/$n"
  git -C "$work/$n" checkout --quiet "$commit"
  line="$(CARGO_TARGET_DIR="$work/$n/target" sh "$work/$n/enclave-image/build-worker.sh" "$work/$n.bin" | tail -n1)"
  echo "$n: $line"
  sums+=("${line##*sha384=}")
done
if [ "${sums[0]}" != "${sums[1]}" ]; then
  echo "NOT reproducible: ${sums[0]} != ${sums[1]}" >&2
  exit 1
fi
echo "reproducible: ${BUILD_BIN:-enclave-worker}@$commit ($TARGET) sha384=${sums[0]}"
