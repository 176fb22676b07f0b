"""The memory of ``job.results()`` on a large job (issue 21: a 100,000-record ``results()``
peaks below 2x the vectors' size in RSS). A benchmark, not a timed test:

    scripts/test-python.sh --bench-memory [RECORDS]      # default 100000

It starts a local stack in a temporary home (tests/conftest.py's ``Stack``), submits RECORDS
short texts from a file and waits, then opens the results in fresh processes, one per way of
reading them (``results()``, ``results(mmap=True)``, ``to_parquet``), so each peak (VmHWM) is that
call's alone; each process reports its RSS before the call, its peak, and the vectors' size.
Prints one JSON object per line and a summary table."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

WORDS = (
    "enclave receipt ledger vector corpus token model attestation harbour lantern granite quay "
    "copper kettle saffron falcon keeper river meadow signal archive index query batch shard "
    "measure policy client host fleet sealed proof checkpoint root tree leaf branch"
).split()


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child(args: argparse.Namespace) -> None:
    """One reading of the results, in this fresh process."""
    import numpy as np  # noqa: F401  (imported before the baseline: part of any caller)

    import ephem_batch

    client = ephem_batch.Client(home=args.home, backend="local")
    job = client.job(args.job)
    before = status_kib("VmRSS")
    started = time.monotonic()
    if args.mode == "results":
        ids, vectors = job.results()
        nbytes = int(vectors.nbytes)
        rows = len(ids)
    elif args.mode == "results-mmap":
        ids, vectors = job.results(mmap=True)
        nbytes = int(vectors.nbytes)
        float(vectors[-1].sum())  # touch the last row
        rows = len(ids)
    else:
        out = os.path.join(tempfile.mkdtemp(), "vectors.parquet")
        written = job.to_parquet(out)
        rows = written["rows"]
        nbytes = rows * written["dimensions"] * 4
    seconds = time.monotonic() - started
    peak = status_kib("VmHWM")
    print(
        json.dumps(
            {
                "mode": args.mode,
                "rows": rows,
                "seconds": round(seconds, 2),
                "vectors_mib": round(nbytes / 2**20, 1),
                "rss_before_mib": round(before / 1024, 1),
                "peak_rss_mib": round(peak / 1024, 1),
                "peak_over_vectors": round(peak * 1024 / nbytes, 2),
                "growth_over_vectors": round((peak - before) * 1024 / nbytes, 2),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("records", nargs="?", type=int, default=100_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home")
    parser.add_argument("--job")
    parser.add_argument("--mode", default="results")
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from conftest import Stack  # the tests' stack: same binaries, model and options

    import ephem_batch

    stack = Stack()
    try:
        t = time.monotonic()
        stack.up()
        client = ephem_batch.Client(home=stack.home, backend="local")
        rng = random.Random(21)
        corpus = os.path.join(stack.home, "bench-corpus.jsonl")
        with open(corpus, "w") as f:
            for i in range(args.records):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
                f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")
        t = time.monotonic()
        job = client.submit(corpus)
        submitted = time.monotonic() - t
        job.wait(progress=sys.stderr.isatty())
        waited = time.monotonic() - t
        print(
            json.dumps({"records": args.records, "submit_seconds": round(submitted, 1), "job_seconds": round(waited, 1)}),
            flush=True,
        )
        results = []
        for mode in ("results", "results-mmap", "to_parquet"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--home", stack.home, "--job", job.id, "--mode", mode],
                check=True,
                capture_output=True,
                text=True,
            )
            line = out.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            results.append(json.loads(line))
        print(f"\n{'mode':14} {'rows':>8} {'s':>7} {'vectors MiB':>12} {'RSS before':>11} {'peak RSS':>9} {'peak/vectors':>13} {'growth/vectors':>15}")
        for r in results:
            print(
                f"{r['mode']:14} {r['rows']:>8} {r['seconds']:>7} {r['vectors_mib']:>12} {r['rss_before_mib']:>11} "
                f"{r['peak_rss_mib']:>9} {r['peak_over_vectors']:>13} {r['growth_over_vectors']:>15}"
            )
    finally:
        stack.down()


if __name__ == "__main__":
    main()
