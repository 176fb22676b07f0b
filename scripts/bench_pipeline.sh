#!/usr/bin/env bash
# The whole local pipeline (seal, upload, on-upload, queue, relay, open, infer, seal, receipt,
# ledger, download, open, verify) on a corpus, against the worker's raw inference rate on the
# same corpus and thread count, in the same run. Prints documents/s for both and their ratio.
#
#   python3 scripts/build_corpus.py --count 10000 --out /tmp/corpus-10000.jsonl
#   scripts/bench_pipeline.sh /tmp/corpus-10000.jsonl [THREADS]
#
# Uses release builds (EPHEM_BENCH_PROFILE=dev for the dev profile, whose worker and protocol
# code is optimised too); the stack runs in a temporary EPHEM_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=$(realpath "$1")
threads=${2:-2}
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-$PWD/.ephem/models/all-MiniLM-L6-v2}"
profile=${EPHEM_BENCH_PROFILE:-release}
# One invocation: the worker's `dev` feature comes from ephem-batch's dependency on it, and a
# build of enclave-worker alone would have no NSM.
cargo build --profile "$profile" --locked --bins -p ephem-batch -p host-poller -p enclave-worker --example bench_inference
bin=${CARGO_TARGET_DIR:-$PWD/target}/$([ "$profile" = dev ] && echo debug || echo "$profile")
home=$(mktemp -d)
trap '"$bin/ephem-batch" --home "$home" dev down >/dev/null 2>&1 || true; rm -rf "$home"' EXIT
docs=$(wc -l < "$corpus")

echo "==> raw inference: $docs documents, $threads threads"
"$bin/examples/bench_inference" --corpus "$corpus" --threads "$threads" --repeats 1 --json "$home/raw.json" > "$home/raw.txt"
raw=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["documents_per_s"])' "$home/raw.json")

echo "==> whole pipeline"
"$bin/ephem-batch" --home "$home" dev up --threads "$threads" --concurrency 1 >/dev/null 2>&1
"$bin/ephem-batch" --home "$home" submit "$corpus" --wait -o "$home/out.jsonl" --json > "$home/report.json"
job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$home/report.json")
"$bin/ephem-batch" --home "$home" verify "$job" > /dev/null
python3 - "$home/report.json" "$raw" "$docs" <<'PY'
import json, sys
report, raw, docs = json.load(open(sys.argv[1])), float(sys.argv[2]), int(sys.argv[3])
pipeline = docs / report["seconds"]
print(f"raw inference   {raw:8.1f} documents/s")
print(f"whole pipeline  {pipeline:8.1f} documents/s  ({report['seconds']:.1f} s, submit to verified results)")
print(f"ratio           {pipeline / raw:8.3f}  (overhead {100 * (1 - pipeline / raw):.1f} %)")
PY
