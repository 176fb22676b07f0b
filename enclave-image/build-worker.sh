#!/bin/sh
# Reproducible, statically linked release build of the enclave-worker binary.
#   enclave-image/build-worker.sh OUT_PATH
# POSIX sh (it also runs in the Alpine builder). Environment:
#   SOURCE_DATE_EPOCH             build time (default: the commit time of HEAD)
#   EPHEM_MODEL_PUBLISHER_PUBKEY  model publisher key compiled into the worker (64 hex)
#   TARGET                        default x86_64-unknown-linux-musl (static)
#   CARGO_TARGET_DIR              default <repo>/target
#   BUILD_PACKAGE, BUILD_BIN      default enclave-worker, enclave-worker (another binary of the
#                                 workspace can be built the same way, e.g. to test this script)
#   BUILD_FEATURES                default `nitro` for enclave-worker (the real NSM and vsock: an
#                                 image without it could neither attest nor be reached), else none
# Prints the SHA-384 of the binary. The same commit, toolchain and inputs give the same bytes
# from any directory: enclave-image/check-reproducible.sh checks exactly that.
set -eu

out="${1:?usage: build-worker.sh OUT_PATH}"
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${TARGET:-x86_64-unknown-linux-musl}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git -C "$root" log -1 --format=%ct)"
fi
export SOURCE_DATE_EPOCH

# No absolute build path or cargo home may end up in the binary (panic messages, debug paths),
# neither from rustc nor from the C/C++ code that crates compile.
map="--remap-path-prefix=$root=/build --remap-path-prefix=$cargo_home=/cargo"
prefix_map="-ffile-prefix-map=$root=/build -ffile-prefix-map=$cargo_home=/cargo"
case "$target" in
  *-musl) static="-C target-feature=+crt-static" ;;
  *) static="" ;;
esac
export RUSTFLAGS="$map $static"
export CFLAGS="${CFLAGS:-} $prefix_map"
export CXXFLAGS="${CXXFLAGS:-} $prefix_map"
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
export CARGO_PROFILE_RELEASE_DEBUG=false
export CARGO_PROFILE_RELEASE_STRIP=symbols

cd "$root"
package="${BUILD_PACKAGE:-enclave-worker}"
bin="${BUILD_BIN:-enclave-worker}"
if [ "$package" = enclave-worker ]; then default_features=nitro; else default_features=; fi
features="${BUILD_FEATURES-$default_features}"
cargo build --release --locked --target "$target" -p "$package" --bin "$bin" ${features:+--features "$features"}

built="${CARGO_TARGET_DIR:-$root/target}/$target/release/$bin"
mkdir -p "$(dirname "$out")"
cp "$built" "$out"
touch -d "@$SOURCE_DATE_EPOCH" "$out" 2>/dev/null || touch -t "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d%H%M.%S)" "$out"

if command -v sha384sum >/dev/null 2>&1; then
  sum="$(sha384sum "$out" | cut -d' ' -f1)"
else
  sum="$(openssl dgst -sha384 -r "$out" | cut -d' ' -f1)"
fi
echo "$bin $target sha384=$sum"
