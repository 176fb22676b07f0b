#!/usr/bin/env bash
# The benchmark suite: our worker's inference (fp32, and bf16 and int8 where the CPU has them)
# against sentence-transformers and ONNX Runtime (fp32 and dynamic int8, per channel) on the same
# corpus, same thread counts, in the same run, with issue 23's ratios in one table; agreement of
# the vectors; throughput against corpus size; the whole local pipeline; cold start of the
# worker process; long documents (128 to 8,192 tokens) on ModernBERT-base's and
# Qwen3-Embedding-0.6B's shapes against ONNX Runtime. Writes bench/results/<date>.json, .md and
# .png, and puts the table and plot into docs/benchmarks.md with the cost table
# (bench/costs.py). See docs/benchmarks.md.
#
#   bench/run.sh [--threads 1,2] [--docs 10000] [--repeats 3] [--sizes 1000,3000,10000]
#                [--boots 20] [--rss-sizes 1000,10000,100000] [--rounds 5]
#                [--skip rounds,latency,pipeline,cold-start,sizes,cosine,memory,long] [--long-models modernbert,qwen3] [--quick]
#
# --rounds: the target ratios (ours / ONNX Runtime, int8 / ONNX Runtime int8, bf16 / our fp32) as
# the median of this many rotating rounds of one pass per engine, beside the first measurement's.
#
# --quick: 300 documents, 1 repeat, sizes 100,300, 5 boots, RSS sizes 100,1000, 1 latency pair, 1 round,
# long documents on ModernBERT's shape up to 512 tokens; results go to bench/results/quick/
# (not committed) and docs/benchmarks.md is left alone. Use it to check the suite, not to quote.
#
# Needs: Rust, Python 3.11, the apt Translation-en indexes (apt-get update -o Acquire::Languages=en),
# and the package registries (PyPI for the peers' environment, the first time). Everything else it
# installs itself: the model (scripts/setup-model.sh), the peers' environment under
# .ephem/bench-venv (bench/requirements.txt: PyTorch with its CUDA wheels, several GB, only here),
# the ONNX export under .ephem/bench/onnx.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh
root=$PWD

threads=1,2
docs=10000
repeats=3
sizes=1000,3000,10000
boots=20
rss_sizes=1000,10000,100000
# The noisiest figure of a run (one text, fresh processes): more pairs than the rest.
latency_pairs=7
rounds=5
skip=""
long_models=modernbert,qwen3
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) threads=$2; shift 2 ;;
        --docs) docs=$2; shift 2 ;;
        --repeats) repeats=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --boots) boots=$2; shift 2 ;;
        --rss-sizes) rss_sizes=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        --long-models) long_models=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$quick" = 1 ]; then
    docs=300; repeats=1; sizes=100,300; boots=5; rss_sizes=100,1000; latency_pairs=1; rounds=1; long_models=modernbert
fi

home="${EPHEM_HOME:-$root/.ephem}"
work="$home/bench"
venv="$home/bench-venv"
model_dir="${EPHEM_MODEL_DIR:-$home/models/all-MiniLM-L6-v2}"
onnx_dir="$work/onnx"
target="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$work"

say() { echo "==> $*"; }

# 1. The corpus: the largest size asked, every smaller one is its prefix.
max=$docs
for n in ${sizes//,/ }; do [ "$n" -gt "$max" ] && max=$n; done
corpus="$work/corpus-all-$max.jsonl"
if [ ! -s "$corpus" ]; then
    say "corpus: $max Debian package descriptions"
    python3 scripts/build_corpus.py --count "$max" --out "$corpus.part"
    mv "$corpus.part" "$corpus"
fi

# 2. The model, and the peers' environment (pinned; recreated when bench/requirements.txt changes).
bash scripts/setup-model.sh
stamp="$venv/.requirements.sha256"
want=$(sha256sum bench/requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "peers' environment: $venv (PyTorch with CUDA wheels from PyPI: several GB, the first time)"
    make_venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet -r bench/requirements.txt
    echo "$want" > "$stamp"
fi
py="$venv/bin/python"

# 3. Release builds of what is measured, in one invocation (two would resolve features apart
# and build the dependencies twice): the worker and its benchmarks, and the stack's binaries
# for the pipeline and memory steps.
say "release builds"
cargo build --release --locked -p enclave-worker -p ephem-batch -p host-poller -p devstack --bins \
    --example bench_inference --example embed_corpus --example bench_cold_start

# 4. ONNX export of the same weights (fp32, then dynamic int8), checked against sentence-transformers.
model_sum=$(sha256sum "$model_dir/model.safetensors" bench/peers.py bench/requirements.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$onnx_dir/.source.sha256" 2>/dev/null)" != "$model_sum" ]; then
    say "ONNX export (fp32 + dynamic int8)"
    rm -rf "$onnx_dir"
    OMP_NUM_THREADS=2 "$py" bench/peers.py export --model-dir "$model_dir" --out-dir "$onnx_dir"
    echo "$model_sum" > "$onnx_dir/.source.sha256"
fi

# 4b. The long-document models: random weights of the published shapes, and their ONNX exports
# (bench/long.py; kept until bench/long.py or the requirements change).
long_dir="$work/long"
long_sum=$(sha256sum bench/long.py bench/requirements.txt | sha256sum | cut -d' ' -f1)
if [[ ",$skip," != *",long,"* ]]; then
    if [ "$(cat "$long_dir/.source.sha256" 2>/dev/null)" != "$long_sum" ]; then
        rm -rf "$long_dir"
        mkdir -p "$long_dir"
    fi
    say "long-document models ($long_models)"
    OMP_NUM_THREADS=2 "$py" bench/long.py make --out "$long_dir" --models "$long_models"
    echo "$long_sum" > "$long_dir/.source.sha256"
fi

# 5. The measurements.
name=$(date -u +%Y-%m-%d-%H%M)
if [ "$quick" = 1 ]; then
    out_dir=bench/results/quick
    docs_md=()
else
    out_dir=bench/results
    docs_md=(--docs-md docs/benchmarks.md)
fi
quick_flag=()
[ "$quick" = 1 ] && quick_flag=(--quick)
say "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
say "measuring (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
"$py" bench/suite.py --corpus "$corpus" --docs "$docs" --threads "$threads" --repeats "$repeats" \
    --sizes "$sizes" --boots "$boots" --rss-sizes "$rss_sizes" --latency-pairs "$latency_pairs" --rounds "$rounds" --skip "$skip" --bin-dir "$target/release" --model-dir "$model_dir" \
    --onnx-dir "$onnx_dir" --long-dir "$long_dir" --long-models "$long_models" --work-dir "$work" --out-dir "$out_dir" --name "$name" \
    "${quick_flag[@]}" "${docs_md[@]}"

# 6. The cost table from the newest full run of each machine kind (full runs only).
if [ "$quick" = 0 ]; then
    "$py" bench/costs.py --docs-md docs/benchmarks.md > /dev/null
fi
