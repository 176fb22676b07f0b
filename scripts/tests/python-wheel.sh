#!/usr/bin/env bash
# The Python SDK's release wheel (make test-python-wheel; not in `make test`: a release build of
# the client library takes minutes on 2 cores):
#  1. `maturin build --release` (maturin pinned in python/requirements-build.txt, installed into
#     $EPHEM_HOME/venv-maturin) makes one wheel, tagged abi3 (CPython >= 3.9) and manylinux;
#  2. its extension needs no glibc symbol above the manylinux tag's version (scripts/check-glibc.py);
#  3. the wheel installs into a clean venv, run with a PATH that has no cargo and no rustc, and the
#     root README's Python example runs there against a local stack (`ephem-batch dev up` in a
#     temporary home, the workspace's debug binaries: the server side, not the client's).
# Prints each step's time; exit 1 on the first failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/lib/venv.sh"
cd "$root"
now() { date +%s; }
started=$(now)
home="${EPHEM_HOME:-$root/.ephem}"
tools="$home/venv-maturin"
t="$(mktemp -d)"
stack="$t/stack"
cleanup() {
  if [ -x target/debug/ephem-batch ] && [ -d "$stack" ]; then
    target/debug/ephem-batch --home "$stack" dev down >/dev/null 2>&1 || true
  fi
  rm -rf "$t"
}
trap cleanup EXIT
fail() { echo "python-wheel: FAILED: $*" >&2; exit 1; }

if ! cmp -s python/requirements-build.txt "$tools/requirements-build.txt" 2>/dev/null; then
  make_venv "$tools" --clear
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-build.txt
  cp python/requirements-build.txt "$tools/requirements-build.txt"
fi

# 1. The wheel.
s=$(now)
"$tools/bin/maturin" build --release --locked -m python/Cargo.toml -o "$t/wheels"
wheels=("$t"/wheels/*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel, found: ${wheels[*]}"
wheel="${wheels[0]}"
name="$(basename "$wheel")"
case "$name" in
  ephem_batch-*-cp39-abi3-manylinux_2_*_x86_64*.whl | ephem_batch-*-cp39-abi3-manylinux_2_*_aarch64*.whl) ;;
  *) fail "$name is not a cp39-abi3 manylinux wheel" ;;
esac
echo "python-wheel: $name ($(( $(stat -c %s "$wheel") / 1024 / 1024 )) MiB) built in $(( $(now) - s ))s"

# 2. The glibc ceiling its tag promises (manylinux_2_N: glibc 2.N).
ceiling="$(echo "$name" | sed -E 's/.*manylinux_([0-9]+)_([0-9]+)_.*/\1.\2/')"
"$tools/bin/python" scripts/check-glibc.py --max "$ceiling" "$wheel" || fail "the extension needs a glibc above its tag's $ceiling"

# 3. A clean venv without Rust, the README's example against a local stack.
s=$(now)
python="$(python3 -c 'import sys; print(sys.executable)')"
clean_path="$t/venv/bin:/usr/local/bin:/usr/bin:/bin"
if PATH="$clean_path" command -v cargo >/dev/null || PATH="$clean_path" command -v rustc >/dev/null; then
  fail "the clean PATH ($clean_path) still has cargo or rustc"
fi
env -i HOME="$t" PATH="$clean_path" "$python" -m venv "$t/venv"
env -i HOME="$t" PATH="$clean_path" "$t/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c python/requirements-test.txt "$wheel"
echo "python-wheel: installed into a clean venv in $(( $(now) - s ))s"

cargo build --workspace --bins --locked
export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
bash scripts/setup-model.sh >/dev/null
model="${EPHEM_MODEL_DIR:-$home/models/all-MiniLM-L6-v2}"
mkdir -p "$stack"
EPHEM_MODEL_DIR="$model" EPHEM_BIN_DIR="$root/target/debug" \
  target/debug/ephem-batch --home "$stack" dev up --threads 2 --concurrency 2 >/dev/null

# The example is the ```python block of the root README's "Python" section, as a reader copies it.
awk '/^## Python/{p=1; next} /^## /{p=0} p && /^```python/{c=1; next} c && /^```/{c=0; exit} c' README.md > "$t/example.py"
[ -s "$t/example.py" ] || fail "no \`\`\`python block in README.md's Python section"
s=$(now)
(cd "$t" && env -i HOME="$t" PATH="$clean_path" EPHEM_HOME="$stack" "$t/venv/bin/python" example.py) > "$t/out" 2> "$t/err" \
  || { cat "$t/err" >&2; fail "the README's example"; }
cat "$t/out"
grep -q "(2, 384)" "$t/out" || fail "the example did not print the vectors' shape (2, 384)"
# It ran the wheel's extension, not a checkout's.
env -i HOME="$t" PATH="$clean_path" "$t/venv/bin/python" -c 'import ephem_batch._native as n; print(n.__file__)' | grep -q "^$t/venv/" \
  || fail "ephem_batch._native did not come from the clean venv"
echo "python-wheel: README example in $(( $(now) - s ))s; whole script $(( $(now) - started ))s"
