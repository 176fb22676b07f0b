#!/usr/bin/env bash
# Interoperability with the transparency ecosystem's Go code (tests/go-interop): our checkpoints,
# witness cosignatures (cosignature/v1) and Merkle proofs must verify with
# golang.org/x/mod/sumdb/note, github.com/transparency-dev/formats and .../merkle, and what
# those produce must verify with ours. Modules come from the Go module proxy, pinned by
# tests/go-interop/go.sum.
#
#   1. `interop write DIR` (witness/examples/interop.rs): a ledger, checkpoints cosigned by our witness
#   2. `go test` in tests/go-interop: verifies DIR, writes DIR/go/ with Go's own log and witness
#   3. `interop check DIR`: Go's checkpoints, cosignatures and proofs verify with ours
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$(date +%s)
command -v go >/dev/null || { echo "go-interop: the Go toolchain (go) is not on PATH" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The workspace's feature set, so the build reuses what the workspace build compiled.
cargo build --workspace --locked -q --example interop
interop=target/debug/examples/interop
"$interop" write "$dir"
(cd tests/go-interop && EPHEM_INTEROP_DIR="$dir" go test -mod=readonly -count=1 -v ./... | grep -E '^(--- |ok|FAIL|PASS)')
"$interop" check "$dir"
echo "go-interop: passed in $(( $(date +%s) - started ))s"
