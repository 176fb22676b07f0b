#!/usr/bin/env bash
# The SCITT export (docs/protocol.md §8.13) checked by an independent verifier: PyPI's pycose and
# cbor2 (scripts/tests/scitt_verify.py, written from the drafts and RFC 9162 only) verify the
# known-answer transparent statement that `receipts_ledger::scitt::tests::scitt_known_answer`
# asserts byte for byte, and refuse its tamperings. Pinned in scripts/tests/scitt_requirements.txt,
# installed into $EPHEM_HOME/venv-scitt (default .ephem/venv-scitt), reinstalled when that changes.
#
#   scripts/tests/scitt-interop.sh [STATEMENT.cbor PUBLIC_KEY_HEX]   (no arguments: the vector)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/venv.sh
started=$(date +%s)
home="${EPHEM_HOME:-$PWD/.ephem}"
venv="$home/venv-scitt"
requirements=scripts/tests/scitt_requirements.txt
if ! cmp -s "$requirements" "$venv/requirements.txt" 2>/dev/null; then
    make_venv "$venv" --clear
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements.txt"
fi
if [ $# -eq 0 ]; then
    "$venv/bin/python" scripts/tests/scitt_verify.py --vector scripts/tests/scitt_vector.json
else
    "$venv/bin/python" scripts/tests/scitt_verify.py "$@"
fi
echo "scitt-interop: passed in $(( $(date +%s) - started ))s"
