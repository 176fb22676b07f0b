#!/usr/bin/env bash
# Builds the enclave image (EIF), measures it and writes the signed attestation policy.
# Runs where a Docker engine runs (CodeBuild, enclave-image/buildspec.yml; or any x86_64 Linux
# machine with Docker and git); nitro-cli comes from the pinned container, not the host. With
# EPHEM_IMAGE_MIRROR=<registry>/<prefix> (an ECR pull-through cache of public.ecr.aws, as
# image-build.yaml makes) both pinned images are pulled through it, by the same digests. Steps:
#   1. a clean source tree: `git archive` of the commit (uncommitted changes never get in);
#   2. `docker build` with the builder pinned by digest (pins.env), SOURCE_DATE_EPOCH = commit time;
#   3. `nitro-cli build-enclave` -> enclave.eif and its PCR0/1/2 (and PCR8 if the EIF is signed),
#      run inside the pinned Amazon Linux container with the pinned nitro-cli version (pins.env),
#      never the host's; the PCRs are compared with expected-pcrs.txt when it has this commit and key;
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
#   enclave-image/build-enclave.sh --pin     # print the RUST_BUILDER_IMAGE and NITRO_CLI_IMAGE lines for pins.env
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
  for var in RUST_BUILDER_IMAGE NITRO_CLI_IMAGE; do
    tag="${!var%@*}"
    digest="$(docker buildx imagetools inspect "$tag" --format '{{json .Manifest.Digest}}' | tr -d '"')"
    echo "$var=$tag@$digest"
  done
  exit 0
fi
"$here/check-pins.sh" >&2 || die "enclave-image/pins.env does not pin the build (the lines above name the remedy)"

# A pinned reference as pulled here: through the mirror if one is given (same digest, so the
# same bytes; a mirror without that digest fails the pull).
pulled() {
  local ref="$1"
  if [ -z "${EPHEM_IMAGE_MIRROR:-}" ]; then echo "$ref"; return; fi
  case "$ref" in
    public.ecr.aws/*) echo "$EPHEM_IMAGE_MIRROR/${ref#public.ecr.aws/}" ;;
    */*) die "no mirror path for $ref" ;;
    *) echo "$EPHEM_IMAGE_MIRROR/docker/library/$ref" ;;   # a Docker official image
  esac
}

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
tools="git docker jq"
[ -n "$unsigned" ] || tools="$tools ephem-batch"
for tool in $tools; do command -v "$tool" >/dev/null || die "$tool is not installed on this host"; done
builder="$(pulled "$RUST_BUILDER_IMAGE")"
nitro_image="$(pulled "$NITRO_CLI_IMAGE")"

rev="$(git -C "$root" rev-parse "$commit")"
[ -z "$(git -C "$root" status --porcelain)" ] || echo "warning: the work tree has uncommitted changes; they are NOT in the image (building $rev)" >&2
epoch="$(git -C "$root" log -1 --format=%ct "$rev")"
out="${out:-$root/dist/enclave/$rev}"
mkdir -p "$out"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT

echo "== source tree of $rev (SOURCE_DATE_EPOCH=$epoch)"
git -C "$root" archive --format=tar "$rev" | tar -x -C "$ctx"

echo "== pull the pinned images"
docker pull --quiet "$builder" && docker pull --quiet "$nitro_image"

echo "== docker build (builder $builder)"
image="ephem-batch-enclave:$rev"
SOURCE_DATE_EPOCH="$epoch" docker buildx build \
  --file "$ctx/enclave-image/Dockerfile" \
  --build-arg RUST_BUILDER_IMAGE="$builder" \
  --build-arg SOURCE_DATE_EPOCH="$epoch" \
  --build-arg MODEL_PUBLISHER_PUBKEY="$publisher_pubkey" \
  --output "type=docker,name=$image,rewrite-timestamp=true" \
  "$ctx"

echo "== nitro-cli $NITRO_CLI_VERSION build-enclave (in $nitro_image)"
# nitro-cli reads the image from the host's Docker engine (its socket) and writes to /out.
mounts=(-v /var/run/docker.sock:/var/run/docker.sock -v "$out:/out")
sign_args=""
if [ -n "$eif_cert" ]; then
  mounts+=(-v "$(realpath "$eif_cert"):/sign/cert.pem:ro" -v "$(realpath "$eif_key"):/sign/key.pem:ro")
  sign_args="--signing-certificate /sign/cert.pem --private-key /sign/key.pem"
fi
docker run --rm "${mounts[@]}" "$nitro_image" sh -euc "
  dnf install -q -y aws-nitro-enclaves-cli-$NITRO_CLI_VERSION aws-nitro-enclaves-cli-devel-$NITRO_CLI_VERSION >/dev/null
  mkdir -p /var/log/nitro_enclaves /tmp/nitro-artifacts
  export NITRO_CLI_ARTIFACTS=/tmp/nitro-artifacts
  nitro-cli build-enclave --docker-uri $image --output-file /out/enclave.eif $sign_args" >"$out/measurements.json"
jq . "$out/measurements.json"

# The PCRs this commit and model publisher key must give (expected-pcrs.txt, one line each):
# a different answer is a build that is not reproducible, and stops here.
pcrs="$(jq -r '[.Measurements.PCR0, .Measurements.PCR1, .Measurements.PCR2] | join(" ")' "$out/measurements.json")"
expected="$(awk -v c="$rev" -v k="${publisher_pubkey,,}" '$1 == c && $2 == k {print $3" "$4" "$5}' "$here/expected-pcrs.txt")"
if [ -z "$expected" ]; then
  echo "note: expected-pcrs.txt has no line for $rev and this key; to record this build's:" >&2
  echo "  $rev ${publisher_pubkey,,} $pcrs" >&2
elif [ "$expected" != "$pcrs" ]; then
  die "PCRs differ from expected-pcrs.txt for $rev: built $pcrs, expected $expected (same commit, key and pins.env must give the same image)"
else
  echo "== PCR0/1/2 equal the expected PCRs of $rev (expected-pcrs.txt)"
fi

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
      --arg nitro "$NITRO_CLI_VERSION" --arg nitro_image "$NITRO_CLI_IMAGE" --arg docker "$(docker version --format '{{.Server.Version}}')" \
      --arg eif_sha384 "$(sha384sum "$out/enclave.eif" | cut -d' ' -f1)" \
      '{commit: $commit, source_date_epoch: ($epoch|tonumber), builder_image: $builder, nitro_cli: $nitro,
        nitro_cli_image: $nitro_image, docker_engine: $docker, eif_sha384: $eif_sha384}' \
      >"$out/build-info.json"

pcr0="$(jq -r '.Measurements.PCR0' "$out/measurements.json")"
cat <<MSG

Built $out/enclave.eif
  PCR0 (kms:RecipientAttestation:ImageSha384) = $pcr0
Next (docs/operations.md §1): scripts/deploy.sh takes the EIF and policy from here.
Publish policy.json to your clients; they pin the publisher key that signed it.
MSG
