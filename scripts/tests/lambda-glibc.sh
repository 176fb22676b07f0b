#!/usr/bin/env bash
# shellcheck disable=SC2015 # ok/not_ok never fail: A && ok || not_ok is if-then-else here
# The Lambda binaries' glibc ceiling (2.34, provided.al2023), run by `make test`:
#  1. the check itself, on binaries made to break it: a C program linked by the pinned Zig against
#     glibc 2.38 (strlcpy, the `GLIBC_2.38 not found` of a function built on a newer distribution)
#     and 2.36 (arc4random) must fail naming the binary and the symbol, also inside a bootstrap.zip;
#     the same program for 2.34 passes; versions compare as numbers (2.34 is above 2.4); a file that
#     is not ELF fails; a binary linked by the host's C compiler against the host's glibc, with the
#     newest symbol the host has, fails where that symbol is above 2.34;
#  2. the Lambda binaries as scripts/build-lambdas.sh builds them (--check: same target, linker
#     and C compiler as the release zips, cheap profile) all pass, and all were linked by Zig.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
passed=0 fails=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $*" >&2; fails=$((fails + 1)); }

venv="$(bash scripts/build-lambdas.sh --tools)"
py="$venv/bin/python"
check() { "$py" scripts/check-glibc.py "$@" >"$t/out" 2>&1; }
# expect_fail WHAT TEXT ARGS...: the check fails and its report contains TEXT.
expect_fail() {
  local what=$1 text=$2
  shift 2
  if check "$@"; then
    not_ok "$what: passed"; sed 's/^/    | /' "$t/out" >&2
  elif grep -qF -- "$text" "$t/out"; then
    ok "$what: $(grep -F -- "$text" "$t/out" | head -1 | cut -c1-160)"
  else
    not_ok "$what: failed without '$text'"; sed 's/^/    | /' "$t/out" >&2
  fi
}
expect_pass() {
  local what=$1
  shift
  check "$@" && ok "$what" || { not_ok "$what: failed"; sed 's/^/    | /' "$t/out" >&2; }
}

cat >"$t/new.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    char buf[16];
#if USE_STRLCPY
    strlcpy(buf, argc > 1 ? argv[1] : "x", sizeof buf);
#elif USE_ARC4RANDOM
    snprintf(buf, sizeof buf, "%u", arc4random());
#else
    snprintf(buf, sizeof buf, "%s", argc > 1 ? argv[1] : "x");
#endif
    puts(buf);
    return 0;
}
EOF
zigcc() { "$py" -m ziglang cc -O2 "$@" "$t/new.c"; }
zigcc -target x86_64-linux-gnu.2.38 -DUSE_STRLCPY=1 -o "$t/needs-2.38"
zigcc -target x86_64-linux-gnu.2.36 -DUSE_ARC4RANDOM=1 -o "$t/needs-2.36"
zigcc -target x86_64-linux-gnu.2.34 -o "$t/needs-2.34"

expect_fail "glibc 2.38 binary" "$t/needs-2.38: needs strlcpy@GLIBC_2.38 (libc.so.6)" "$t/needs-2.38"
expect_fail "glibc 2.36 binary" "$t/needs-2.36: needs arc4random@GLIBC_2.36 (libc.so.6)" "$t/needs-2.36"
mkdir -p "$t/zip"
cp "$t/needs-2.38" "$t/zip/bootstrap"
(cd "$t/zip" && "$py" -m zipfile -c bootstrap.zip bootstrap && rm bootstrap)
expect_fail "glibc 2.38 bootstrap.zip" "bootstrap.zip:bootstrap: needs strlcpy@GLIBC_2.38" "$t/zip/bootstrap.zip"
expect_fail "one bad binary among good ones" "1 failed" "$t/needs-2.34" "$t/needs-2.38" "$t/needs-2.34"
expect_pass "glibc 2.34 binary passes" "$t/needs-2.34"
expect_fail "versions compare as numbers (2.34 > 2.4)" "__libc_start_main@GLIBC_2.34" --max 2.4 "$t/needs-2.34"
expect_fail "a file that is not ELF" "not an ELF file" "$t/new.c"
mkdir -p "$t/empty"
expect_fail "a directory without ELF" "no ELF file found" "$t/empty"

# The same program linked the usual way, by the host's C compiler against the host's glibc, with
# the newest of these symbols the host's glibc has.
host_glibc="$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$' || true)"
if command -v cc >/dev/null && [ -n "$host_glibc" ]; then
  for spec in 2.38:USE_STRLCPY:strlcpy 2.36:USE_ARC4RANDOM:arc4random; do
    IFS=: read -r version flag symbol <<<"$spec"
    if "$py" -c "import sys; sys.exit(tuple(map(int, '$host_glibc'.split('.'))) < tuple(map(int, '$version'.split('.'))))"; then
      cc -O2 -D"$flag"=1 -o "$t/host" "$t/new.c"
      expect_fail "host-linked binary (cc, glibc $host_glibc)" "$symbol@GLIBC_$version" "$t/host"
      break
    fi
  done
fi
[ -e "$t/host" ] || echo "# skip: host-linked negative (host glibc ${host_glibc:-unknown} has neither strlcpy nor arc4random, or no cc)"

# What the workspace's own host build needs, for the record (it depends on the host's glibc).
for bin in target/debug/on-upload target/release/on-upload; do
  if [ -x "$bin" ]; then
    "$py" scripts/check-glibc.py "$bin" >"$t/out" 2>&1 || true
    echo "# host-linked $bin (host glibc ${host_glibc:-unknown}): $(head -1 "$t/out" | cut -c1-200)"
    break
  fi
done

# 2. The Lambda binaries.
if bash scripts/build-lambdas.sh --check >"$t/build.log" 2>&1; then
  grep -E '^(ok |build-lambdas|glibc ceiling)' "$t/build.log" || true
  grep -qx "glibc ceiling 2.34: 6 binaries, 0 failed" "$t/build.log" \
    && ok "the 6 Lambda binaries (x86_64-unknown-linux-gnu.2.34) need GLIBC_2.34 at most" \
    || not_ok "the Lambda check did not read 6 binaries"
  # And they were linked by Zig's LLD (its .comment line), not by the host's linker.
  zig_linked=0
  for bin in target/lambda-build/check/*/bootstrap; do
    grep -aq 'Linker: LLD [0-9.]* (https://github.com/ziglang/' "$bin" && zig_linked=$((zig_linked + 1))
  done
  [ "$zig_linked" = 6 ] && ok "the 6 Lambda binaries were linked by Zig" || not_ok "$zig_linked of 6 Lambda binaries linked by Zig"
else
  tail -40 "$t/build.log" >&2
  not_ok "scripts/build-lambdas.sh --check"
fi

echo "lambda-glibc: $passed passed, $fails failed"
[ "$fails" = 0 ]
# A CI run (.ci/run) has a small disk; nothing after this test reads the Lambda build.
if [ "${EPHEM_PRUNE_BUILDS:-0}" = 1 ]; then
  echo "lambda-glibc: EPHEM_PRUNE_BUILDS=1: removing target/lambda-build ($(du -sh target/lambda-build | cut -f1))"
  rm -rf target/lambda-build
fi
