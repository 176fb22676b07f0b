#!/usr/bin/env bash
# Builds the enclave image (EIF), measures it and writes the signed attestation policy.
# Runs on an AWS build host with Docker and nitro-cli (an EC2 instance of a Nitro type with
# `dnf install aws-nitro-enclaves-cli aws-nitro-enclaves-cli-devel docker`); it cannot run on
# a machine without a Docker engine. Steps:
#   1. a clean source tree: `git archive` of the commit (uncommitted changes never get in);
#   2. `docker build` with the builder pinned by digest (pins.env), SOURCE_DATE_EPOCH = commit time;
#   3. `nitro-cli build-enclave` -> enclave.eif and its PCR0/1/2 (and PCR8 if the EIF is signed);
#   4. policy.unsigned.json with those PCRs -> `ephem-batch policy sign` -> policy.json,
#      then `ephem-batch policy verify` on the result.
#
# Usage:
#   enclave-image/build-enclave.sh --model-publisher-pubkey HEX64 --policy-signing-key FILE \
#       [--policy-publisher-pubkey HEX64] [--eif-signing-cert CERT.pem --eif-signing-key KEY.pem] \
#       [--commit REV] [--out DIR]
#   enclave-image/build-enclave.sh --unsigned --model-publisher-pubkey HEX64 [--commit REV] [--out DIR]
#       measure only: stops at policy.unsigned.json (no key, no ephem-batch on the build host); the
#       CodeBuild image build runs this (enclave-image/buildspec.yml) and the operator signs the
#       policy on their own machine (scripts/deploy.sh step 2)
# The policy is signed with `ephem-batch policy sign --key FILE --out policy.json policy.unsigned.json`
# and checked with `ephem-batch policy verify policy.json [--publisher-key HEX64]`.
#   enclave-image/build-enclave.sh --pin     # print the RUST_BUILDER_IMAGE line for pins.env
#
# Output (default dist/enclave/<commit>/): enclave.eif, measurements.json (nitro-cli's output),
# policy.unsigned.json, policy.json (signed), build-info.json.
# Then: cdk deploy -c policyFile=<out>/policy.json, and upload enclave.eif (docs/operations.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
die() { echo "build-enclave: $*" >&2; exit 1; }

# shellcheck source=pins.env
. "$here/pins.env"

if [ "${1:-}" = "--pin" ]; then
  tag="${RUST_BUILDER_IMAGE%@*}"
  digest="$(docker buildx imagetools inspect "$tag" --format '{{json .Manifest.Digest}}' | tr -d '"')"
  echo "RUST_BUILDER_IMAGE=$tag@$digest"
  exit 0
fi

publisher_pubkey="" policy_key="" policy_pubkey="" eif_cert="" eif_key="" commit="HEAD" out="" unsigned=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model-publisher-pubkey) publisher_pubkey="$2"; shift 2 ;;
    --policy-signing-key) policy_key="$2"; shift 2 ;;
    --policy-publisher-pubkey) policy_pubkey="$2"; shift 2 ;;
    --eif-signing-cert) eif_cert="$2"; shift 2 ;;
    --eif-signing-key) eif_key="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --unsigned) unsigned=1; shift ;;
    *) die "unknown argument $1 (see the header of this script)" ;;
  esac
done
[[ "$publisher_pubkey" =~ ^[0-9a-fA-F]{64}$ ]] || die "--model-publisher-pubkey must be 64 hex characters (the model publisher's Ed25519 public key)"
[ -n "$policy_key" ] || [ -n "$unsigned" ] || die "--policy-signing-key is required (the image publisher's key for ephem-batch policy sign)"
if { [ -n "$eif_cert" ] && [ -z "$eif_key" ]; } || { [ -z "$eif_cert" ] && [ -n "$eif_key" ]; }; then
  die "give both --eif-signing-cert and --eif-signing-key, or neither"
fi
[[ "$RUST_BUILDER_IMAGE" =~ @sha256:[0-9a-f]{64}$ ]] || die "RUST_BUILDER_IMAGE in enclave-image/pins.env is not pinned by digest (run $0 --pin and commit the result)"
tools="git docker nitro-cli jq"
[ -n "$unsigned" ] || tools="$tools ephem-batch"
for tool in $tools; do command -v "$tool" >/dev/null || die "$tool is not installed on this host"; done
if [ -n "$NITRO_CLI_VERSION" ]; then
  have="$(nitro-cli --version | awk '{print $NF}')"
  [ "$have" = "$NITRO_CLI_VERSION" ] || die "nitro-cli $have installed, pins.env says $NITRO_CLI_VERSION (it supplies the enclave kernel: PCRs would differ)"
else
  echo "warning: NITRO_CLI_VERSION is not pinned in pins.env; using $(nitro-cli --version)" >&2
fi

rev="$(git -C "$root" rev-parse "$commit")"
[ -z "$(git -C "$root" status --porcelain)" ] || echo "warning: the work tree has uncommitted changes; they are NOT in the image (building $rev)" >&2
epoch="$(git -C "$root" log -1 --format=%ct "$rev")"
out="${out:-$root/dist/enclave/$rev}"
mkdir -p "$out"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT

echo "== source tree of $rev (SOURCE_DATE_EPOCH=$epoch)"
git -C "$root" archive --format=tar "$rev" | tar -x -C "$ctx"

echo "== docker build (builder $RUST_BUILDER_IMAGE)"
image="ephem-batch-enclave:$rev"
SOURCE_DATE_EPOCH="$epoch" docker buildx build \
  --file "$ctx/enclave-image/Dockerfile" \
  --build-arg RUST_BUILDER_IMAGE="$RUST_BUILDER_IMAGE" \
  --build-arg SOURCE_DATE_EPOCH="$epoch" \
  --build-arg MODEL_PUBLISHER_PUBKEY="$publisher_pubkey" \
  --output "type=docker,name=$image,rewrite-timestamp=true" \
  "$ctx"

echo "== nitro-cli build-enclave"
sign_args=()
[ -z "$eif_cert" ] || sign_args=(--signing-certificate "$eif_cert" --private-key "$eif_key")
nitro-cli build-enclave --docker-uri "$image" --output-file "$out/enclave.eif" "${sign_args[@]}" >"$out/measurements.json"
jq . "$out/measurements.json"

echo "== attestation policy"
jq '{version: 1, root: "aws-nitro-g1",
     pcrs: ({"0": .Measurements.PCR0, "1": .Measurements.PCR1, "2": .Measurements.PCR2}
            + (if .Measurements.PCR8 then {"8": .Measurements.PCR8} else {} end)),
     allow_debug: false, max_age_s: 3600}' "$out/measurements.json" >"$out/policy.unsigned.json"
if [ -n "$unsigned" ]; then
  echo "--unsigned: no policy.json; sign $out/policy.unsigned.json where the image publisher key is"
else
  ephem-batch policy sign --key "$policy_key" --out "$out/policy.json" "$out/policy.unsigned.json"
  if [ -n "$policy_pubkey" ]; then
    ephem-batch policy verify "$out/policy.json" --publisher-key "$policy_pubkey"
  else
    echo "warning: no --policy-publisher-pubkey: checking the signed policy without pinning its key" >&2
    ephem-batch policy verify "$out/policy.json"
  fi
fi
jq -n --arg commit "$rev" --arg epoch "$epoch" --arg builder "$RUST_BUILDER_IMAGE" \
      --arg nitro "$(nitro-cli --version)" --arg eif_sha384 "$(sha384sum "$out/enclave.eif" | cut -d' ' -f1)" \
      '{commit: $commit, source_date_epoch: ($epoch|tonumber), builder_image: $builder, nitro_cli: $nitro, eif_sha384: $eif_sha384}' \
      >"$out/build-info.json"

pcr0="$(jq -r '.Measurements.PCR0' "$out/measurements.json")"
cat <<MSG

Built $out/enclave.eif
  PCR0 (kms:RecipientAttestation:ImageSha384) = $pcr0
Next (docs/operations.md):
  cdk deploy -c policyFile=$out/policy.json ...
  aws s3 cp $out/enclave.eif s3://<ArtifactsBucketName>/artifacts/enclave.eif
Publish policy.json to your clients; they pin the publisher key that signed it.
MSG
