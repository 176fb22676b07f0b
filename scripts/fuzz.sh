#!/usr/bin/env bash
# Fuzzes every parser and verifier that reads bytes another party chose (docs/fuzzing.md).
#
#   scripts/fuzz.sh                    CI pass: every target for EPHEM_FUZZ_SECONDS (default 15) s
#   scripts/fuzz.sh --long SECONDS     every target for SECONDS s (the documented long runs)
#   scripts/fuzz.sh [--long S] TARGET… only these targets
#
# Steps: install cargo-fuzz if missing (nightly is required: `cargo +nightly fuzz`), build the
# instrumented targets into fuzz/target, write the seed corpora into fuzz/corpus/<target>/ from
# the shared fixtures ($EPHEM_FIXTURES) and from objects the project's own code makes, then run
# each target's libFuzzer binary for the time given. Corpora grow across runs (fuzz/corpus is not
# committed); crashes land in fuzz/artifacts/<target>/ and fail the script; logs in fuzz/logs/.
# Reproduce a crash: fuzz/target/<host>/release/<target> fuzz/artifacts/<target>/crash-…
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${EPHEM_FUZZ_SECONDS:-15}"
if [ "${1:-}" = "--long" ]; then
    seconds="${2:?--long needs a number of seconds per target}"
    shift 2
fi
all_targets=(attestation envelope stream records frame receipt manifest checkpoint cms jsonl)
targets=("${@:-${all_targets[@]}}")
export EPHEM_FIXTURES="${EPHEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
# Instrumentation without AddressSanitizer: the project's crates forbid unsafe code, and with ASan
# the targets ran 4-7 times slower (docs/fuzzing.md). EPHEM_FUZZ_SANITIZER=address adds it back;
# bundled SQLite (linked through receipts-ledger) then trips ASan's ODR check on two static
# arrays of the same name, a false alarm, so that check is off unless ASAN_OPTIONS says otherwise.
sanitizer="${EPHEM_FUZZ_SANITIZER:-none}"
if [ "$sanitizer" = address ]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}"
fi

now() { date +%s; }
started=$(now)

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: installing the nightly toolchain (cargo fuzz needs it)"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    t=$(now)
    cargo install cargo-fuzz --locked
    echo "fuzz: cargo-fuzz installed in $(( $(now) - t ))s"
fi

t=$(now)
cargo +nightly fuzz build --fuzz-dir fuzz --sanitizer "$sanitizer" --debug-assertions
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bin="fuzz/target/$host/release"
echo "fuzz: instrumented build in $(( $(now) - t ))s"

# libFuzzer without a sanitizer notes the sanitizer hooks it cannot find: not an error.
EPHEM_FUZZ_SEEDS=fuzz/corpus EPHEM_FUZZ_EXAMPLE_CORPUS=examples/corpus.jsonl "$bin/write_seeds" 2>&1 \
    | grep -v '^WARNING: Failed to find function "__sanitizer' | sed 's/^/fuzz: seeds: /'

mkdir -p fuzz/logs
failed=()
summary=()
for target in "${targets[@]}"; do
    mkdir -p "fuzz/artifacts/$target" "fuzz/corpus/$target"
    log="fuzz/logs/$target.log"
    echo "fuzz: $target for ${seconds}s"
    # -timeout: one input taking 10 s is a finding; -rss_limit_mb: so is 2 GB of memory.
    if "$bin/$target" "fuzz/corpus/$target" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$target/" >"$log" 2>&1; then
        :
    else
        failed+=("$target")
        echo "fuzz: $target FAILED; the end of $log:"
        tail -n 40 "$log"
    fi
    # The last status line: "#N  DONE  cov: C ft: F corp: K/S exec/s: E rss: R".
    status="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")"
    corp="$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$status")"
    summary+=("$(printf '%-12s %12s %8s %7s %7s %14s' "$target" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")")
done

printf '\n%-12s %12s %8s %7s %7s %14s\n' target executions exec/s cov ft corpus
printf '%s\n' "${summary[@]}"
echo "fuzz: ${#targets[@]} target(s), ${seconds}s each, $(( $(now) - started ))s in all"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: crashes or failures in: ${failed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
fi
# One line in the form test runners close with: a target passes when it ran its time out.
echo "fuzz: $(( ${#targets[@]} - ${#failed[@]} )) passed, ${#failed[@]} failed"
[ "${#failed[@]}" -eq 0 ]
# A CI run (.ci/run) has a small disk and no use for the instrumented build once every target passed.
if [ "${EPHEM_PRUNE_BUILDS:-0}" = 1 ]; then
    echo "fuzz: EPHEM_PRUNE_BUILDS=1: removing fuzz/target ($(du -sh fuzz/target | cut -f1))"
    rm -rf fuzz/target
fi
