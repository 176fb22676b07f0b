#!/usr/bin/env python3
"""What a million documents cost: the newest full run of each machine kind in bench/results,
turned into documents per dollar and seconds per million documents on the EC2 family of that
kind, beside the batch prices of hosted embedding APIs. Writes the table between the
`costs` markers of docs/benchmarks.md (bench/run.sh calls it after every full run).

  bench/costs.py [--results bench/results] [--docs-md docs/benchmarks.md]

Prices are list prices with the date they were read; change them here, with their date, when
they change. A run's documents/s per vCPU is its 2-thread rate halved: it is assumed to scale with
the enclave's vCPUs (the engine splits a batch across its threads; measured only up to 2 here).
"""

import argparse
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The EC2 family with Nitro Enclaves of each measured machine kind (c6a: AMD EPYC 3rd gen, Zen 3;
# c7a: AMD EPYC 4th gen; on both a vCPU is a core; c7i: Intel Xeon 4th gen with AMX, two vCPUs are
# one core's two threads): its Linux on-demand price in us-east-1 and the date of the price list it
# was read from. c6a's is from price tables that carry no date; the same tables give c7a.2xlarge
# $0.4106 and c7i.2xlarge $0.357, the dated prices below. A 2xlarge: 8 vCPUs, 6 allocated to the
# enclave (whole cores), 2 left to the parent (host-poller relays bytes).
FAMILIES = {
    ("AuthenticAMD", 25, 1): dict(family="c6a.2xlarge", usd_per_hour=0.306, price_date="undated tables, read 2026-11-30"),
    ("AuthenticAMD", 25, 17): dict(family="c7a.2xlarge", usd_per_hour=0.41056, price_date="2026-10-08"),
    ("GenuineIntel", 6, 207): dict(family="c7i.2xlarge", usd_per_hour=0.357, price_date="2026-08-21"),
}
INSTANCE_VCPUS, ENCLAVE_VCPUS = 8, 6

# Hosted embedding APIs: batch price per million input tokens (their own tokenizers; the corpus's
# documents are about 90 tokens with BERT's WordPiece, taken as the same count), and the date.
APIS = [
    ("OpenAI text-embedding-3-small, Batch API", 0.01, "2026-07-03"),
    ("OpenAI text-embedding-3-large, Batch API", 0.065, "2026-07-03"),
    ("Google gemini-embedding-001, batch mode", 0.075, "2026-04-25"),
    ("Voyage voyage-4-lite, Batch API (33 % off $0.02)", 0.0134, "2026, undated page"),
]

ENGINES = [("ours", "fp32"), ("ours-bf16", "bf16"), ("ours-int8", "int8")]


def newest_full_runs(results_dir):
    """The newest full run (not --quick) of each machine kind that has an EC2 family."""
    newest = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        m = doc.get("machine", {})
        kind = (m.get("cpu_vendor"), m.get("cpu_family"), m.get("cpu_model"))
        # A full run measured the throughput (a section run alone, e.g. long documents, did not).
        if not doc.get("quick") and "throughput" in doc and kind in FAMILIES:
            newest[kind] = (os.path.basename(path), doc)
    return newest


def markdown(results_dir):
    runs = newest_full_runs(results_dir)
    out = ["| machine kind (run) | EC2 instance | precision | docs/s per vCPU | docs/s per instance | "
           "documents per dollar | seconds per million documents (one instance) |", "|---|---|---|---|---|---|---|"]
    tokens = []
    for kind, (name, doc) in sorted(runs.items()):
        family = FAMILIES[kind]
        top = str(max(doc["settings"]["threads"]))
        for engine, precision in ENGINES:
            result = doc["throughput"].get(engine, {}).get(top)
            if not result:
                continue
            per_vcpu = result["documents_per_s"] / int(top)
            per_instance = per_vcpu * ENCLAVE_VCPUS
            per_dollar = per_instance * 3600 / family["usd_per_hour"]
            out.append(f"| {kind[0]} family {kind[1]} model {kind[2]} ({name.removesuffix('.json')}) | {family['family']}, "
                       f"${family['usd_per_hour']}/h ({family['price_date']}) | {precision} | {per_vcpu:.1f} | "
                       f"{per_instance:.0f} | {per_dollar / 1e6:.2f} M | {1e6 / per_instance:,.0f} |")
        tokens.append(result.get("mean_tokens") or doc["throughput"]["ours"][top].get("mean_tokens"))
    mean_tokens = next((t for t in tokens if t), 90.0)
    out += ["", f"Hosted APIs at the same {mean_tokens:.0f} tokens per document (their batch prices):", "",
            "| API | $ per million tokens (date read) | documents per dollar |", "|---|---|---|"]
    for api, usd, date in APIS:
        out.append(f"| {api} | {usd} ({date}) | {1e6 / (usd * mean_tokens) / 1e6:.2f} M |")
    return "\n".join(out) + "\n"


def update_docs(docs_md, table):
    with open(docs_md) as f:
        text = f.read()
    block = f"<!-- costs:begin -->\n{table}<!-- costs:end -->"
    text, n = re.subn(r"<!-- costs:begin -->.*?<!-- costs:end -->", lambda _: block, text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{docs_md}: no costs markers")
    with open(docs_md, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--docs-md", default=None)
    args = ap.parse_args()
    table = markdown(args.results)
    if args.docs_md:
        update_docs(args.docs_md, table)
    print(table, end="")


if __name__ == "__main__":
    main()
