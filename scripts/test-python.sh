#!/usr/bin/env bash
# The Python SDK's tests (python/tests, pytest) against the embedded default: a local stack in a
# temporary home per session, the workspace's own binaries and model. The extension module is the
# one the workspace build makes (target/debug/lib_native.so, the same build and target directory
# as every other crate, so nothing is compiled twice); it is put beside the package's Python
# sources in a temporary directory, as `pip install ./python` would install it.
#
# pytest, numpy and the optional extras under test (pyarrow, langchain-core, llama-index-core,
# tqdm) come from PyPI, pinned in python/requirements-test.txt, into $EPHEM_HOME/venv-python
# (default .ephem/venv-python), reinstalled when that file changes.
#
#   scripts/test-python.sh [PYTEST ARGS]          the tests (make test-python, in make test)
#   scripts/test-python.sh --bench-memory [N]     instead: results()' peak RSS on N records (100000)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh
now() { date +%s; }
started=$(now)
home="${EPHEM_HOME:-$PWD/.ephem}"
venv="$home/venv-python"
requirements=python/requirements-test.txt

if ! cmp -s "$requirements" "$venv/requirements-test.txt" 2>/dev/null; then
    t=$(now)
    make_venv "$venv" --clear
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements-test.txt"
    echo "python: test environment installed in $(( $(now) - t ))s"
fi

export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
bash scripts/setup-model.sh
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-$home/models/all-MiniLM-L6-v2}"

# The binaries the stack runs and the extension module, with the features `cargo test` resolves
# (dev-dependencies included; the same artifacts scripts/test-rust.sh made, not a second build).
t=$(now)
cargo build --workspace --bins --lib --tests --locked
echo "python: workspace build (extension module included) in $(( $(now) - t ))s"
export EPHEM_BIN_DIR="$PWD/target/debug"

package="$(mktemp -d)"
trap 'rm -rf "$package"' EXIT
cp -R python/ephem_batch "$package/ephem_batch"
ln -s "$PWD/target/debug/lib_native.so" "$package/ephem_batch/_native.abi3.so"

t=$(now)
if [ "${1:-}" = --bench-memory ]; then
    # Not a test: results()' peak RSS against the vectors' size (python/bench/results_memory.py).
    shift
    (cd "$package" && PYTHONPATH="$package" "$venv/bin/python" "$OLDPWD/python/bench/results_memory.py" "$@")
    echo "python: memory benchmark in $(( $(now) - t ))s"
    exit 0
fi
# The package from the temporary directory, never from the source tree (which has no extension).
(cd "$package" && PYTHONPATH="$package" "$venv/bin/python" -m pytest -p no:cacheprovider -q "$OLDPWD/python/tests" "$@")
echo "python: tests in $(( $(now) - t ))s; whole script $(( $(now) - started ))s"
