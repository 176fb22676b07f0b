#!/usr/bin/env bash
# The whole local pipeline (seal, upload, on-upload, queue, relay, open, infer, seal, receipt,
# ledger, download, open, verify) on a corpus, against the worker's raw inference rate on the
# same corpus and thread count, in the same run. Prints documents/s for both and their ratio.
#
#   python3 scripts/build_corpus.py --count 10000 --out /tmp/corpus-10000.jsonl
#   scripts/bench_pipeline.sh /tmp/corpus-10000.jsonl [THREADS]
#
# Runs EPHEM_BENCH_PIPELINE_PAIRS (default 3) pairs and reports medians. Uses release builds
# (EPHEM_BENCH_PROFILE=dev for the dev profile, whose worker and protocol code is optimised too);
# each stack runs in a temporary EPHEM_HOME.
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
# Pairs of (raw inference, pipeline) measured one after the other: the shared machines this runs
# on drift by ±10 % within minutes, so one pair can compare a fast minute with a slow one.
pairs=${EPHEM_BENCH_PIPELINE_PAIRS:-3}
work=$(mktemp -d)
home=""
trap '[ -n "$home" ] && "$bin/ephem-batch" --home "$home" dev down >/dev/null 2>&1; rm -rf "$work"' EXIT
docs=$(wc -l < "$corpus")

for pair in $(seq 1 "$pairs"); do
    echo "==> pair $pair of $pairs: raw inference ($docs documents, $threads threads), then the whole pipeline"
    "$bin/examples/bench_inference" --corpus "$corpus" --threads "$threads" --repeats 1 --json "$work/raw-$pair.json" > "$work/raw.txt"
    # A fresh stack each time: the job timed is the first after `dev up`, as a new host's would be.
    home="$work/home-$pair"
    mkdir -p "$home"
    "$bin/ephem-batch" --home "$home" dev up --threads "$threads" --concurrency 1 >/dev/null 2>&1
    "$bin/ephem-batch" --home "$home" submit "$corpus" --wait -o "$home/out.jsonl" --json > "$work/report-$pair.json"
    job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$work/report-$pair.json")
    "$bin/ephem-batch" --home "$home" verify "$job" > /dev/null
    "$bin/ephem-batch" --home "$home" dev down >/dev/null 2>&1
    home=""
done
python3 - "$work" "$pairs" "$docs" <<'PY'
import json, statistics, sys
work, pairs, docs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
raws, pipelines, seconds = [], [], []
for pair in range(1, pairs + 1):
    raws.append(json.load(open(f"{work}/raw-{pair}.json"))["results"][0]["documents_per_s"])
    seconds.append(json.load(open(f"{work}/report-{pair}.json"))["seconds"])
    pipelines.append(docs / seconds[-1])
    print(f"pair {pair}: raw {raws[-1]:.1f}, pipeline {pipelines[-1]:.1f} documents/s, ratio {pipelines[-1] / raws[-1]:.3f}")
raw, pipeline = statistics.median(raws), statistics.median(pipelines)
ratio = statistics.median(p / r for p, r in zip(pipelines, raws))
print(f"raw inference   {raw:8.1f} documents/s  (median of {pairs})")
print(f"whole pipeline  {pipeline:8.1f} documents/s  ({statistics.median(seconds):.1f} s, submit to verified results)")
print(f"ratio           {ratio:8.3f}  (median of the pairs' ratios; overhead {100 * (1 - ratio):.1f} %)")
PY
