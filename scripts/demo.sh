#!/usr/bin/env bash
# README command 1. Until the local pipeline lands, it builds the `ephem-batch` binary and
# verifies a real AWS Nitro attestation document from the shared fixtures with the same verifier
# every client uses (time pinned to the document's own timestamp, since its certificates live
# three hours).
set -euo pipefail
cd "$(dirname "$0")/.."
fixtures="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
document="$fixtures/nitro-attestation/aws-samples_us-east-2_prod_2023-06-06.cbor"

echo "==> building ephem-batch"
cargo build --locked --bin ephem-batch
bin=target/debug/ephem-batch

echo "==> verifying a real Nitro attestation document against the AWS Nitro Enclaves root G1"
"$bin" attest verify "$document" --at 1686060167435 \
    --expect-pcr 0=836fa88a3e7ba543c2d8587cbf1ecbc285434fd2253fab68c20fcdd46ac749f1d33e10fa15601f77ce4ef1793ebd3901

echo "==> the same document with one flipped signature byte must be refused"
tampered="$(mktemp)"
trap 'rm -f "$tampered"' EXIT
cp "$fixtures/nitro-attestation/negative/neg_signature_byteflip.cbor" "$tampered"
if "$bin" attest verify "$tampered" --at 1686060167435; then
    echo "demo: a tampered document was accepted" >&2
    exit 1
fi
echo "==> done: the genuine document verifies, the tampered one is refused"
