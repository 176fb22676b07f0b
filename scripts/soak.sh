#!/usr/bin/env bash
# Soak: one N-document job through the local pipeline, every record accounted for, and the peak
# resident memory of every process that handles it: the enclave worker, the host-poller and the
# local Lambda runtime (the ledger appender), sampled, and the client's `submit` and `results`,
# measured exactly. Not part of CI (see
# docs/soak.md for the latest figures):
#
#   EPHEM_SOAK=1 scripts/soak.sh N [OUT.json]
#
# The corpus is N unique short texts generated deterministically. Uses the binaries in
# $EPHEM_BIN_DIR (default target/debug: the worker and the sealing code are optimised even
# there; `cargo build --workspace --bins` first) and the model in $EPHEM_MODEL_DIR. Everything,
# the stack's temporary files included, lives in a fresh directory that is removed at the end
# (kept with EPHEM_SOAK_KEEP=1).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${EPHEM_SOAK:-}" != 1 ]; then
    echo "soak.sh runs a long job: set EPHEM_SOAK=1 to run it" >&2
    exit 2
fi
n="${1:?usage: EPHEM_SOAK=1 scripts/soak.sh N [OUT.json]}"
out_json="${2:-soak-$n.json}"
bin="${EPHEM_BIN_DIR:-$PWD/target/debug}"
export EPHEM_BIN_DIR="$bin"
export EPHEM_MODEL_DIR="${EPHEM_MODEL_DIR:-$PWD/.ephem/models/all-MiniLM-L6-v2}"
threads="${EPHEM_SOAK_THREADS:-0}"

dir="$(mktemp -d "${TMPDIR:-/tmp}/ephem-soak.XXXXXX")"
home="$dir/home"
mkdir -p "$dir/tmp"
export TMPDIR="$dir/tmp"
eb() { "$bin/ephem-batch" --home "$home" "$@"; }
# Runs a command and writes its peak resident set (kB, the kernel's own count for the finished
# child: getrusage RUSAGE_CHILDREN) to the file named first.
peak_of() {
    local file=$1; shift
    python3 -c 'import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)' "$file" "$@"
}
cleanup() {
    [ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null || true
    eb dev down >/dev/null 2>&1 || true
    if [ "${EPHEM_SOAK_KEEP:-}" = 1 ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

# N unique short texts: the document number spelled out in words from a small vocabulary.
awk -v n="$n" 'BEGIN {
    split("amber basalt cedar delta ember fjord garnet harbor indigo juniper", w, " ");
    for (i = 0; i < n; i++) {
        t = ""; x = i;
        do { t = t " " w[x % 10 + 1]; x = int(x / 10) } while (x > 0);
        printf "{\"id\":\"doc-%d\",\"text\":\"Soak document%s, number %d.\"}\n", i, t, i;
    }
}' > "$dir/corpus.jsonl"

started=$(date +%s.%N)
eb dev up --threads "$threads" --concurrency 1 > "$dir/up.log" 2>&1 || { cat "$dir/up.log" >&2; exit 1; }
up_s=$(echo "$(date +%s.%N) - $started" | bc)

# Peak RSS per process: VmHWM is the kernel's own high-water mark; sampled each second (the
# last sample before the job ends is the peak over the process's life) and kept at its maximum
# in case a process is replaced.
hwm() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || true; }
pid_of() { cat "$home/run/$1.pid" 2>/dev/null || true; }
(
    worker_max=0; poller_max=0; lambdas_max=0
    while true; do
        for name in enclave-worker host-poller lambdas; do
            pid=$(pid_of "$name"); [ -n "$pid" ] || continue
            v=$(hwm "$pid"); [ -n "$v" ] || continue
            if [ "$name" = enclave-worker ] && [ "$v" -gt "$worker_max" ]; then worker_max=$v; fi
            if [ "$name" = host-poller ] && [ "$v" -gt "$poller_max" ]; then poller_max=$v; fi
            if [ "$name" = lambdas ] && [ "$v" -gt "$lambdas_max" ]; then lambdas_max=$v; fi
        done
        echo "$worker_max $poller_max $lambdas_max" > "$dir/hwm.tmp" && mv "$dir/hwm.tmp" "$dir/hwm"
        sleep 1
    done
) &
sampler=$!

submit_started=$(date +%s.%N)
job=$(peak_of "$dir/submit.kb" "$bin/ephem-batch" --home "$home" submit "$dir/corpus.jsonl" --json | sed -n 's/.*"job_id":"\([0-9a-f]*\)".*/\1/p')
[ -n "$job" ] || { echo "submit gave no job id" >&2; exit 1; }
submitted=$(date +%s.%N)
while true; do
    state=$(eb status "$job" --json 2>/dev/null | sed -n 's/^  "state": "\([a-z_]*\)".*/\1/p')
    case "$state" in
        completed) break ;;
        failed|cancelled) eb status "$job" >&2; exit 1 ;;
    esac
    sleep 1
done
embedded=$(date +%s.%N)
sleep 1.5  # one more sample after the end
read -r worker_kb poller_kb lambdas_kb < "$dir/hwm"
kill "$sampler"; sampler=

peak_of "$dir/results.kb" "$bin/ephem-batch" --home "$home" results "$job" -o "$dir/out.jsonl" > /dev/null
records=$(wc -l < "$dir/out.jsonl")
errors=$(wc -l < "$dir/out.errors.jsonl")
unique=$(sed 's/^{"id":"\([^"]*\)".*/\1/' "$dir/out.jsonl" | sort -u | wc -l)
peak_of "$dir/verify.kb" "$bin/ephem-batch" --home "$home" verify "$job" > /dev/null
done_at=$(date +%s.%N)

ok=true
if [ "$records" -ne "$n" ] || [ "$errors" -ne 0 ] || [ "$unique" -ne "$n" ]; then ok=false; fi
cat > "$out_json" <<EOF
{
  "documents": $n,
  "job_id": "$job",
  "records_out": $records,
  "unique_ids_out": $unique,
  "errors": $errors,
  "all_accounted_for": $ok,
  "stack_up_s": $(printf %.1f "$up_s"),
  "submit_s": $(printf %.1f "$(echo "$submitted - $submit_started" | bc)"),
  "embed_s": $(printf %.1f "$(echo "$embedded - $submitted" | bc)"),
  "results_and_verify_s": $(printf %.1f "$(echo "$done_at - $embedded" | bc)"),
  "docs_per_s": $(printf %.0f "$(echo "$n / ($embedded - $submitted)" | bc -l)"),
  "worker_peak_rss_kb": $worker_kb,
  "poller_peak_rss_kb": $poller_kb,
  "ledger_appender_peak_rss_kb": $lambdas_kb,
  "client_submit_peak_rss_kb": $(cat "$dir/submit.kb"),
  "client_results_peak_rss_kb": $(cat "$dir/results.kb"),
  "client_verify_peak_rss_kb": $(cat "$dir/verify.kb"),
  "binaries": "$(basename "$bin")"
}
EOF
cat "$out_json"
$ok
