#!/usr/bin/env bash
# Refuses a pins file (default enclave-image/pins.env) that does not pin what the enclave image's
# measurements depend on, naming each unpinned value and the exact remedy; prints the pins when
# all hold. Run by scripts/deploy.sh (its preflight, dry run included), build-enclave.sh and
# cdk/scripts/test.sh (`make test`).
#   enclave-image/check-pins.sh [PINS_FILE]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
file="${1:-$here/pins.env}"
[ -r "$file" ] || { echo "check-pins: cannot read $file" >&2; exit 1; }

RUST_BUILDER_IMAGE="" NITRO_CLI_IMAGE="" NITRO_CLI_VERSION="" CODEBUILD_IMAGE=""
# shellcheck source=pins.env
. "$file"

bad=0
refuse() { echo "check-pins: $file: $1" >&2; echo "  remedy: $2" >&2; bad=1; }
digest='@sha256:[0-9a-f]{64}$'
[[ "$RUST_BUILDER_IMAGE" =~ ^rust:[0-9]+\.[0-9]+\.[0-9]+-alpine$digest ]] || refuse \
  "RUST_BUILDER_IMAGE=$RUST_BUILDER_IMAGE is not rust:<x.y.z>-alpine pinned by digest" \
  "on a machine with Docker run enclave-image/build-enclave.sh --pin (docker buildx imagetools inspect rust:<x.y.z>-alpine), put the line it prints into enclave-image/pins.env, record the new PCRs (enclave-image/expected-pcrs.txt), commit"
[[ "$NITRO_CLI_IMAGE" =~ ^public\.ecr\.aws/amazonlinux/amazonlinux:2023$digest ]] || refuse \
  "NITRO_CLI_IMAGE=$NITRO_CLI_IMAGE is not public.ecr.aws/amazonlinux/amazonlinux:2023 pinned by digest" \
  "docker buildx imagetools inspect public.ecr.aws/amazonlinux/amazonlinux:2023 --format '{{json .Manifest.Digest}}', put the digest into enclave-image/pins.env, commit"
[[ "$NITRO_CLI_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+\.amzn2023$ ]] || refuse \
  "NITRO_CLI_VERSION=$NITRO_CLI_VERSION is not an aws-nitro-enclaves-cli version-release (e.g. 1.4.5-0.amzn2023)" \
  "docker run --rm <NITRO_CLI_IMAGE> dnf list --showduplicates aws-nitro-enclaves-cli, pick one, put it into enclave-image/pins.env, commit"
[[ "$CODEBUILD_IMAGE" =~ ^aws/codebuild/amazonlinux-x86_64-standard:[0-9]+\.[0-9]+$ ]] || refuse \
  "CODEBUILD_IMAGE=$CODEBUILD_IMAGE is not a CodeBuild Amazon Linux x86_64 standard image" \
  "name the image-build.yaml BuildImage default here (aws/codebuild/amazonlinux-x86_64-standard:<n.0>), commit"
grep -v '^[[:space:]]*#' "$file" | grep -q 'UNPINNED' && refuse "a value still says UNPINNED" "replace it as above; nothing named UNPINNED is ever built"
[ "$bad" = 0 ] || exit 1
echo "pins: builder $RUST_BUILDER_IMAGE; nitro-cli $NITRO_CLI_VERSION in $NITRO_CLI_IMAGE; CodeBuild $CODEBUILD_IMAGE"
