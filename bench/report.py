#!/usr/bin/env python3
"""Markdown table, plot and docs update from one results JSON of the benchmark suite.

  python bench/report.py bench/results/<name>.json [--docs docs/benchmarks.md]
      [--machine-kind "AuthenticAMD family 25 model 17"]

(bench/suite.py calls the same functions at the end of a run.) Results recorded before the suite
noted the CPU's vendor, family and model name only "AMD EPYC", which is several machine kinds;
`--machine-kind` supplies what the run's own notes say it was, and is refused for a file that
records it.
"""

import argparse
import json
import os
import re
import sys

LABELS = {
    "ours": "ephem-batch worker, fp32",
    "ours-bf16": "ephem-batch worker, precision bf16",
    "ours-int8": "ephem-batch worker, precision int8",
    "ort-fp32": "ONNX Runtime fp32 (batch 32, length-sorted)",
    "ort-int8": "ONNX Runtime dynamic int8 (per-channel)",
    "st": "sentence-transformers, PyTorch CPU (batch 32)",
}
ORDER = ["ours", "ours-bf16", "ours-int8", "ort-fp32", "ort-int8", "st"]
BEGIN, END = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"


def fmt(value, digits=1):
    return "–" if value is None else f"{value:,.{digits}f}"


def ratio(a, b):
    return None if not a or not b else a / b


def machine_kind(m):
    """What results are kept per in docs/benchmarks.md: vendor, family and model (KVM guests often
    report a generic model name), e.g. `AuthenticAMD family 26 model 2`."""
    if "cpu_family" in m:
        return f"{m.get('cpu_vendor', '?')} family {m['cpu_family']} model {m['cpu_model']}"
    return m.get("cpu", "unknown CPU")


def latency_pairs(lp):
    n = len(lp["pairs"])
    return f"{n} alternating pair{'s' if n != 1 else ''} of runs"


def latency_128(doc, top):
    """Ours / ONNX Runtime fp32 for the 128-token text, and how it was measured: the alternating
    pairs' median where the run has them, else the table's two runs."""
    lp = doc.get("latency_pairs")
    if lp:
        return lp["ratio_128_median"], f"median of {latency_pairs(lp)}"
    tp = doc["throughput"]
    ours, ort = tp["ours"][top]["latency_128_tokens_ms"], tp["ort-fp32"][top]["latency_128_tokens_ms"]
    return ratio(ours, ort), f"{fmt(ours, 2)} ms against {fmt(ort, 2)} ms"


def target_ratio(doc, top, a, b):
    """Engine `a`'s docs/s over engine `b`'s at `top` threads, and how it was measured: the median
    of the run's rotating rounds where it has them (runs since 2026-12-01), else the throughput
    table's one measurement of each, minutes apart."""
    tp = doc["throughput"]
    first = ratio(tp[a][top]["documents_per_s"], tp[b][top]["documents_per_s"]) if a in tp and b in tp else None
    rounds = (doc.get("rounds") or {}).get("ratios", {}).get(f"{a}/{b}")
    if rounds:
        return rounds["median"], (f"{rounds['median']:.2f}× (median of {len(rounds['values'])} rotating round(s), "
                                  f"{rounds['min']:.2f}–{rounds['max']:.2f}; the table's {fmt(first, 2)}×)")
    return first, fmt(first, 2) + "×"


def rounds_table(doc):
    """The rotating rounds: every engine's docs/s per round and the target ratios' medians."""
    rr = doc.get("rounds")
    if not rr or not rr["runs"]:
        return []
    engines = [e for e in ORDER if any(e in run["documents_per_s"] for run in rr["runs"])]
    n = len(rr["runs"])
    out = [f"Rotating rounds ({rr['threads']} threads, {n} round{'s' if n != 1 else ''} of one pass per engine, each round "
           "starting one engine further along; the target ratios below are their medians):", "",
           "| round | order | " + " | ".join(LABELS[e] for e in engines) + " |", "|---" * (len(engines) + 2) + "|"]
    for i, run in enumerate(rr["runs"], 1):
        order = " → ".join(run["order"])
        out.append(f"| {i} | {order} | " + " | ".join(fmt(run["documents_per_s"].get(e)) for e in engines) + " |")
    out += ["", "| ratio | per round | median | range |", "|---|---|---|---|"]
    for name, r in rr["ratios"].items():
        a, b = name.split("/")
        out.append(f"| {LABELS[a]} / {LABELS[b]} | {', '.join(f'{v:.2f}' for v in r['values'])} | "
                   f"**{r['median']:.2f}×** | {r['min']:.2f}–{r['max']:.2f} |")
    out.append("")
    return out


def supply_machine_kind(m, kind):
    if "cpu_family" in m:
        sys.exit(f"the results file records its machine kind already: {machine_kind(m)}")
    found = re.fullmatch(r"(\w+) family (\d+) model (\d+)", kind)
    if not found:
        sys.exit(f"--machine-kind {kind!r} is not '<vendor> family <n> model <n>'")
    m["cpu_vendor"], m["cpu_family"], m["cpu_model"] = found[1], int(found[2]), int(found[3])


def markdown(doc):
    threads = [str(t) for t in doc["settings"]["threads"]]
    top = threads[-1]
    tp = doc["throughput"]
    m = doc["machine"]
    out = []
    kind = "QUICK validation run (small corpus, 1 repeat): not figures to quote" if doc.get("quick") else "full run"
    out.append(f"**{doc['date_utc']}**, {kind}. Machine: {m.get('cpu', '?')} ({machine_kind(m)}), {m.get('cores')} cores "
               f"({', '.join(m.get('cpu_flags', []))}), {m.get('memory_gib', '?')} GiB; load average "
               f"{doc['loadavg_start']} at start, {doc['loadavg_end']} at end. Corpus: {doc['corpus']['documents']:,} "
               f"Debian package descriptions; each figure is the median of {doc['settings']['repeats']} pass(es).")
    out.append("")
    head = "| engine | " + " | ".join(f"docs/s, {t} thr" for t in threads) + \
        f" | 9-token text, {top} thr | 128-token text, {top} thr | min cosine to ST (corpus) |"
    out += [head, "|---" * (len(threads) + 4) + "|"]
    cos = doc.get("cosine_to_sentence_transformers", {})
    for engine in [e for e in ORDER if e in tp]:
        row = [LABELS[engine]] + [fmt(tp[engine][t]["documents_per_s"]) for t in threads]
        row += [fmt(tp[engine][top]["latency_9_tokens_ms"], 2) + " ms", fmt(tp[engine][top]["latency_128_tokens_ms"], 2) + " ms"]
        if engine == "st":
            row.append("reference")
        elif engine in ("ours-bf16", "ours-int8"):
            row.append(fmt(tp[engine][top].get("min_cosine_to_fp32"), 6) + " (to our fp32)")
        else:
            row.append(fmt(cos[engine]["min"], 6) if engine in cos else "–")
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    out.append("Ratios ours / peer (throughput: above 1 means we are faster; 128-token latency: below 1 means we are faster):")
    out.append("")
    out += ["| peer | " + " | ".join(f"throughput, {t} thr" for t in threads) + f" | 128-token latency, {top} thr |",
            "|---" * (len(threads) + 2) + "|"]
    for peer in ["ort-fp32", "ort-int8", "st"]:
        cells = [fmt(ratio(tp["ours"][t]["documents_per_s"], tp[peer][t]["documents_per_s"]), 2) + "×" for t in threads]
        cells.append(fmt(ratio(tp["ours"][top]["latency_128_tokens_ms"], tp[peer][top]["latency_128_tokens_ms"]), 2) + "×")
        out.append(f"| {LABELS[peer]} | " + " | ".join(cells) + " |")
    for precision in ("bf16", "int8"):
        if f"ours-{precision}" not in tp:
            continue
        b = tp[f"ours-{precision}"]
        cells = [fmt(ratio(b[t]["documents_per_s"], tp["ort-int8"][t]["documents_per_s"]), 2) + "×" for t in threads]
        cells.append(fmt(ratio(b[top]["latency_128_tokens_ms"], tp["ort-int8"][top]["latency_128_tokens_ms"]), 2) + "×")
        out.append(f"| ours at precision {precision} / {LABELS['ort-int8']} | " + " | ".join(cells) + " |")
    out.append("")
    out += rounds_table(doc)
    if "latency_pairs" in doc:
        lp = doc["latency_pairs"]
        ms = lambda engine, n: ", ".join(fmt(r[engine][n], 2) for r in lp["pairs"])
        out.append(f"One text, ours fp32 and ONNX Runtime fp32 in {latency_pairs(lp)} (fresh processes, "
                   f"{lp['threads']} threads, median of 20 each): 128 tokens {ms('ours', '128')} ms against "
                   f"{ms('ort-fp32', '128')} ms, median ratio **{lp['ratio_128_median']:.2f}**; 9 tokens "
                   f"{ms('ours', '9')} ms against {ms('ort-fp32', '9')} ms, median ratio {lp['ratio_9_median']:.2f}.")
        out.append("")
    out += issue23(doc, top)
    out += units_and_peaks(doc, top)
    out.append("")
    out.append("Our worker in detail:")
    out.append("")
    out += ["| threads | docs/s | real tokens/s | useful GFLOP/s | GEMM peak (same run) | fraction of peak | FMA peak (same run) | fraction of FMA peak | padded | model load | peak RSS |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in threads:
        r = tp["ours"][t]
        fma = r.get("fma_peak_gflop_per_s")
        fma_share = ratio(r["useful_gflop_per_s"], fma)
        out.append(f"| {t} | {fmt(r['documents_per_s'])} | {fmt(r['real_tokens_per_s'], 0)} | {fmt(r['useful_gflop_per_s'])} | "
                   f"{fmt(r['gemm_peak_gflop_per_s'], 0)} GFLOP/s | {100 * r['useful_gflop_per_s'] / r['gemm_peak_gflop_per_s']:.0f} % | "
                   f"{'–' if fma is None else fmt(fma, 0) + ' GFLOP/s'} | {'–' if fma_share is None else f'{100 * fma_share:.0f} %'} | "
                   f"{100 * r['padded_fraction']:.1f} % | {fmt(r['model_load_ms'], 0)} ms | {fmt(r['peak_rss_mib'], 0)} MiB |")
    out.append("")
    r = tp["ours"][top]
    if "dense_depth_slice" in r:
        source = "CPUID" if r["dense_l2_from_cpuid"] else "assumed: CPUID did not say"
        out.append(f"Dense blocking chosen at start-up: L2 {r['dense_l2_bytes'] // 1024:,} KiB per thread ({source}), "
                   f"weight panels run in depth slices of at most {r['dense_depth_slice']:,} lanes.")
        out.append("")
    if "throughput_by_size" in doc:
        s = doc["throughput_by_size"]
        out.append(f"Throughput against corpus size ({s['threads']} threads, docs/s):")
        out.append("")
        out += ["| documents | ours | ONNX Runtime fp32 | ours / ORT |", "|---|---|---|---|"]
        for n in sorted(s["ours"], key=int):
            out.append(f"| {int(n):,} | {fmt(s['ours'][n])} | {fmt(s['ort-fp32'][n])} | {fmt(ratio(s['ours'][n], s['ort-fp32'][n]), 2)}× |")
        out.append("")
    if "pipeline" in doc:
        p = doc["pipeline"]
        out.append(f"Whole local pipeline ({p['documents']:,} documents, {p['threads']} threads, submit to verified "
                   f"results): {fmt(p['pipeline_documents_per_s'])} docs/s against {fmt(p['raw_documents_per_s'])} docs/s "
                   f"of raw inference in the same run (medians of {p.get('pairs', 1)} pairs, each a raw run then a fresh "
                   f"stack's first job): **ratio {p['ratio']:.3f}** ({100 * (1 - p['ratio']):.1f} % overhead).")
        out.append("")
    if "cold_start" in doc:
        c = doc["cold_start"]
        s = c["summary"]
        out.append(f"Cold start of the worker process ({c['boots']} boots, {c['threads']} threads, spawn to ready with "
                   f"all-MiniLM-L6-v2): **p50 {fmt(s['total']['p50'], 0)} ms, p95 {fmt(s['total']['p95'], 0)} ms**.")
        out.append("")
        out += ["| phase | p50 | p95 | max |", "|---|---|---|---|"]
        names = {"listen": "process start → listening", "fleet_key": "fleet-key release + publication",
                 "model_key": "manifest check + DEK release", "stream_decrypt": "stream-decrypt + SHA-256 of the files",
                 "load": "model load + engine start", "total": "**total**", "kms_fleet": "(KMS time, fleet key)",
                 "kms_model": "(KMS time, DEK)"}
        for key, label in names.items():
            v = s[key]
            out.append(f"| {label} | {fmt(v['p50'], 0)} ms | {fmt(v['p95'], 0)} ms | {fmt(v['max'], 0)} ms |")
        out.append(f"| worker peak RSS when ready | {fmt(s['peak_rss_mib']['p50'], 0)} MiB | | {fmt(s['peak_rss_mib']['max'], 0)} MiB |")
        out.append("")
    if "memory" in doc:
        jobs = doc["memory"]["jobs"]
        out.append(f"Peak RSS against the size of one job (short texts through the whole local stack, "
                   f"{doc['memory']['threads']} threads; scripts/soak.sh, docs/soak.md):")
        out.append("")
        out += ["| documents | worker | host-poller | ledger appender | client submit | client results | every record back |",
                "|---|---|---|---|---|---|---|"]
        mib = lambda kb: fmt(kb / 1024, 1) + " MiB"  # noqa: E731
        for j in jobs:
            out.append(f"| {j['documents']:,} | {mib(j['worker_peak_rss_kb'])} | {mib(j['poller_peak_rss_kb'])} | "
                       f"{mib(j['ledger_appender_peak_rss_kb'])} | {mib(j['client_submit_peak_rss_kb'])} | "
                       f"{mib(j['client_results_peak_rss_kb'])} | {'yes' if j['all_accounted_for'] else 'NO'} |")
        out.append("")
    out += long_documents(doc)
    out.append("Against issue 8's targets:")
    out.append("")
    out += ["| target | measured | met |", "|---|---|---|"]
    o, f32, st = (tp[e][top] for e in ("ours", "ort-fp32", "st"))

    def check(label, value, goal, shown):
        met = "–" if value is None else ("yes" if value >= goal else "no")
        out.append(f"| {label} | {shown} | {met} |")

    r, shown = target_ratio(doc, top, "ours", "ort-fp32")
    check(f"throughput ≥ 1.2× ONNX Runtime fp32 ({top} threads)", r, 1.2, shown)
    r = ratio(o["documents_per_s"], st["documents_per_s"])
    check(f"throughput ≥ 2.5× sentence-transformers ({top} threads)", r, 2.5, fmt(r, 2) + "×")
    r, how = latency_128(doc, top)
    check("one 128-token text ≤ ONNX Runtime fp32's latency", r and 1 / r, 1.0, f"{fmt(r, 2)} of it ({how})")
    if "pipeline" in doc:
        r = doc["pipeline"]["ratio"]
        check("whole pipeline ≥ 95 % of raw inference", r, 0.95, f"{100 * r:.1f} %")
    if "cold_start" in doc:
        p95 = doc["cold_start"]["summary"]["total"]["p95"]
        check("cold start ≤ 1 s at p95", 1000.0 - p95, 0.0, f"{p95:.0f} ms")
    if "memory" in doc and len(doc["memory"]["jobs"]) > 1:
        jobs = sorted(doc["memory"]["jobs"], key=lambda j: j["documents"])
        first, last = jobs[0], jobs[-1]
        growth = max(last[k] / first[k] for k in ("worker_peak_rss_kb", "poller_peak_rss_kb"))
        check(f"worker and poller peak RSS flat from {first['documents']:,} to {last['documents']:,} documents "
              "(at most 1.25× the smallest)", 1.25 - growth, 0.0, f"{growth:.2f}× at most")
    if "ours" in cos:
        c = cos["ours"]["min"]
        check("min cosine to sentence-transformers ≥ 0.9999 (corpus)", c, 0.9999, f"{c:.6f}")
    if "ours-bf16" in tp:
        b = tp["ours-bf16"][top]
        r, shown = target_ratio(doc, top, "ours-bf16", "ort-int8")
        check(f"stretch: precision bf16 ≥ 1.0× ONNX Runtime dynamic int8 ({top} threads)", r, 1.0, shown)
        c = b.get("min_cosine_to_fp32")
        check("stretch: bf16's min cosine to fp32 ≥ 0.999 (corpus)", c, 0.999, fmt(c, 6))
    out.append("")
    return "\n".join(out) + "\n"


def issue23(doc, top):
    """Issue 23's targets, every ratio from this one run."""
    tp = doc["throughput"]
    o, f32, i8 = tp["ours"][top], tp["ort-fp32"][top], tp["ort-int8"][top]
    amd = doc["machine"].get("cpu_vendor") == "AuthenticAMD"
    # ONNX Runtime's useful FLOP rate: the same documents cost the same FLOP (the cost model), so
    # its docs/s times our FLOP per document, against the GEMM peak measured in our process.
    flop_per_doc = ratio(o["useful_gflop_per_s"], o["documents_per_s"])
    ort_share = ratio(f32["documents_per_s"] * flop_per_doc, o["gemm_peak_gflop_per_s"]) if flop_per_doc else None
    out = [f"Issue 23's targets ({top} threads, this run; {'AMD' if amd else 'Intel'} column of the issue):", "",
           "| target | measured | met |", "|---|---|---|"]

    def row(label, value, ok, shown):
        out.append(f"| {label} | {shown} | {'–' if value is None else ('yes' if ok(value) else 'no')} |")

    r, shown = target_ratio(doc, top, "ours", "ort-fp32")
    goal = 1.2 if amd and ort_share is not None and ort_share < 0.70 else 1.0
    shown = shown + ("" if ort_share is None else f" (ONNX Runtime at {100 * ort_share:.0f} % of the peak)")
    row(f"fp32 / ONNX Runtime fp32 ≥ {goal}×", r, lambda v: v >= goal, shown)
    share = ratio(o["useful_gflop_per_s"], o["gemm_peak_gflop_per_s"])
    fma_share = ratio(o["useful_gflop_per_s"], o.get("fma_peak_gflop_per_s"))
    row("fp32 at ≥ 85 % of the same-run GEMM peak", share, lambda v: v >= 0.85,
        "–" if share is None else f"{100 * share:.0f} % of {fmt(o['gemm_peak_gflop_per_s'], 0)} GFLOP/s"
        + ("" if fma_share is None else f"; {100 * fma_share:.0f} % of the FMA peak, {fmt(o['fma_peak_gflop_per_s'], 0)} GFLOP/s"))
    q = tp.get("ours-int8", {}).get(top)
    r, shown = target_ratio(doc, top, "ours-int8", "ort-int8") if q else (None, None)
    row("int8 / ONNX Runtime dynamic int8 (per-channel) ≥ 1.3×", r, lambda v: v >= 1.3,
        shown if q else "not run (no int8 kernel: neither AVX-512 VNNI nor AVX2; or before int8 was in the suite)")
    c = q.get("min_cosine_to_fp32") if q else None
    row("int8 min cosine to our fp32 (corpus) ≥ 0.999", c, lambda v: v >= 0.999, fmt(c, 6))
    # Per length, over the corpus and the accuracy set (short texts and the reference texts).
    buckets = (q or {}).get("min_cosine_to_fp32_by_tokens") or {}
    mins = [b["min"] for b in buckets.values() if b.get("min") is not None]
    # In length order ("1-8", "9-32", "33-128", "129+"; the JSON object's keys are sorted as text).
    order = sorted(buckets, key=lambda name: int(name.split("-")[0].rstrip("+")))
    shown = " / ".join(f"{name}: {fmt(buckets[name].get('min'), 6)} ({buckets[name].get('texts', 0)})" for name in order)
    row("int8 min cosine to our fp32 per length bucket (tokens: min (texts)) ≥ 0.999", min(mins) if mins else None,
        lambda v: v >= 0.999, shown or "not measured (before the buckets were in the suite)")
    r, how = latency_128(doc, top)
    row("128-token latency / ONNX Runtime fp32 ≤ 1.0", r, lambda v: v <= 1.0, f"{fmt(r, 2)} ({how})")
    p = doc.get("pipeline")
    row(f"pipeline / raw inference ≥ 0.95 ({p['documents']:,} docs)" if p else "pipeline / raw inference ≥ 0.95",
        p and p["ratio"], lambda v: v >= 0.95, f"{p['ratio']:.3f}" if p else "not run")
    out.append("")
    return out


# Each unit's peak as a multiple of the same-run FMA peak (register-only FMA chains on every thread;
# the GEMM peak in runs before it was recorded) (AVX-512 FMA, 2 FMA units:
# 32 multiply-adds a cycle): VNNI 4 (four u8 × i8 products per 32-bit lane), AVX-512 BF16 2
# (pairs), AMX int8 32 (1,024 multiply-adds a cycle), AMX bf16 16 (512). On a CPU without
# AVX-512 the FMA peak is AVX2 FMA's (16 a cycle), and int8 on AVX2 2 (`vpmaddwd`: 16 i16
# multiply-adds per instruction, each with a `vpaddd` beside it): 2 where the run did not measure
# it; runs since 2026-11-30 measure the pair's issue rate instead (`int8_avx2_peak_gop_per_s`:
# 1.5–1.6× the FMA peak on Zen 3, whose vector pipes the pair shares), and runs since 2026-12-01
# the AVX-512 units' too (`int8_avx512_peak_gop_per_s`, `bf16_avx512_peak_gop_per_s`: register-only
# `vpdpbusd` and `vdpbf16ps` chains; on Emerald Rapids under KVM 4.2× and 0.48× the FMA peak, where
# the multiples below assume 4× and 2×: BF16 issues at a quarter of what its width suggests). The
# multiples stay for AMX tiles and older runs.
PEAK_MULTIPLE = {("int8", "avx512"): 4, ("bf16", "avx512"): 2, ("int8", "amx"): 32, ("bf16", "amx"): 16, ("int8", "avx2"): 2}


def units_and_peaks(doc, top):
    """Issue 39: which unit ran bf16 and int8 (AVX-512 or AMX tiles, the worker's start-up
    choice) and each precision's useful work against its unit's peak, beside fp32's against the
    GEMM peak; on Intel, its targets (bf16 ≥ 2× our fp32, int8 ≥ 1.3× ONNX Runtime int8)."""
    tp = doc["throughput"]
    o = tp["ours"][top]
    base = "FMA" if o.get("fma_peak_gflop_per_s") else "GEMM"
    peak = o.get("fma_peak_gflop_per_s") or o.get("gemm_peak_gflop_per_s")
    intel = doc["machine"].get("cpu_vendor") == "GenuineIntel"
    out = [f"Dense units and peaks ({top} threads, this run):", "",
           f"| precision | unit | docs/s | useful G(FL)OP/s | unit peak (× {base} peak) | fraction of the unit's peak |",
           "|---|---|---|---|---|---|"]
    share = ratio(o["useful_gflop_per_s"], peak)
    # The f32 kernel's unit as the worker recorded it; before that was recorded, AVX-512's where
    # the CPU had it and gemm's AVX2 kernel elsewhere.
    recorded = (o.get("dense_units") or {}).get("f32")
    f32_unit = {"avx512": "AVX-512 FMA", "avx2": "AVX2 FMA"}.get(recorded) or (
        "AVX-512 FMA" if "avx512f" in doc["machine"].get("cpu_flags", ["avx512f"]) else "gemm (AVX2 FMA)")
    out.append(f"| fp32 | {f32_unit} | {fmt(o['documents_per_s'])} | {fmt(o['useful_gflop_per_s'], 0)} | "
               f"{fmt(peak, 0)} ({base} peak) | {'–' if share is None else f'{100 * share:.0f} %'} |")
    for precision in ("bf16", "int8"):
        r = tp.get(f"ours-{precision}", {}).get(top)
        if not r:
            continue
        unit = (r.get("dense_units") or {}).get(precision)
        measured = r.get(f"{precision}_{unit}_peak_gop_per_s")
        multiple = PEAK_MULTIPLE.get((precision, unit))
        unit_peak = measured or (peak * multiple if peak and multiple else None)
        how = f"{measured / peak:.2f}×, measured" if measured and peak else f"{multiple or '–'}×"
        share = ratio(r["useful_gflop_per_s"], unit_peak)
        out.append(f"| {precision} | {unit or 'not recorded'} | {fmt(r['documents_per_s'])} | {fmt(r['useful_gflop_per_s'], 0)} | "
                   f"{fmt(unit_peak, 0)} ({how}) | {'–' if share is None else f'{100 * share:.1f} %'} |")
    out.append("")
    if intel:
        out += ["Issue 39's Intel targets (this run):", "", "| target | measured | met |", "|---|---|---|"]
        q = tp.get("ours-int8", {}).get(top)
        rows = [("fp32 / ONNX Runtime fp32 ≥ 1.0×", "ours", "ort-fp32", 1.0),
                ("bf16 / our fp32 ≥ 2×", "ours-bf16", "ours", 2.0),
                ("int8 / ONNX Runtime dynamic int8 ≥ 1.3×", "ours-int8", "ort-int8", 1.3)]
        for label, a, against, goal in rows:
            r, shown = target_ratio(doc, top, a, against) if a in tp else (None, "not run")
            out.append(f"| {label} | {shown} | {'–' if r is None else ('yes' if r >= goal else 'no')} |")
        c = q.get("min_cosine_to_fp32") if q else None
        out.append(f"| int8 min cosine to our fp32 (corpus) ≥ 0.999 | {fmt(c, 6)} | {'–' if c is None else ('yes' if c >= 0.999 else 'no')} |")
        out.append("")
    return out


LONG_NAMES = {"modernbert": "ModernBERT-base's shape (encoder, mean pooling)",
              "qwen3": "Qwen3-Embedding-0.6B's shape (decoder, last-token pooling)"}


def share(attention_share):
    """A length's attention share; below zero the text ran faster per token than the shortest
    (fewer texts per pass, so less per-text work), which no share of attention explains."""
    if attention_share < 0:
        return f"none: {-100 * attention_share:.0f} % faster per token than at 128"
    return f"{100 * attention_share:.0f} %"


def long_documents(doc):
    """Issue 39 item 3: tokens/s from 128 to 8,192 tokens, ours and ONNX Runtime fp32 on the same
    model and texts, the share of our time that grows with length (attention), peak RSS."""
    if "long" not in doc:
        return []
    lo = doc["long"]
    out = [f"Long documents ({lo['threads']} threads, fp32, {lo['tokens_per_pass']:,} tokens per pass at every length, "
           "one text per ONNX Runtime run; random weights of the published shapes, bench/long.py):", ""]
    for name, m in lo["models"].items():
        out += [f"{LONG_NAMES.get(name, name)}, {m['parameters'] / 1e6:.0f} M parameters:", "",
                "| tokens per text | ours docs/s | ours tokens/s | ONNX Runtime tokens/s | ours / ORT | attention's share of ours "
                "| ours RSS: loaded / embedding peak (loading peak) | ORT peak RSS | min cosine ours to ORT |",
                "|---|---|---|---|---|---|---|---|---|"]
        for row in m["rows"]:
            o, r = row["ours"], row["ort-fp32"]
            out.append(f"| {row['length']:,} | {fmt(o['documents_per_s'], 2)} | {fmt(o['real_tokens_per_s'], 0)} | "
                       f"{fmt(r['tokens_per_s'], 0)} | {fmt(ratio(o['real_tokens_per_s'], r['tokens_per_s']), 2)}× | "
                       f"{share(row['attention_share'])} | {fmt(o.get('loaded_rss_mib'), 0)} / "
                       f"{fmt(o.get('embedding_peak_rss_mib'), 0)} MiB ({fmt(o['peak_rss_mib'], 0)}) | "
                       f"{fmt(r['peak_rss_mib'], 0)} MiB | {row['min_cosine_ours_to_ort']:.6f} |")
        by_length = {row["length"]: row["ours"]["real_tokens_per_s"] for row in m["rows"]}
        pairs = m.get("pairs_512_8192")
        if pairs:
            slow = pairs["ratio_median"]
            shown = ", ".join(f"{fmt(p['tokens_per_s_512'], 0)} / {fmt(p['tokens_per_s_8192'], 0)}" for p in pairs["pairs"])
            steps = by_length[512] / by_length[8192]
            out += ["", f"Tokens/s at 8,192 tokens {slow:.2f}× slower than at 512, the median of {len(pairs['pairs'])} "
                        f"alternating pairs of fresh processes (tokens/s at 512 / at 8,192: {shown}); {steps:.2f}× between "
                        f"the table's two steps (target: within 2×: {'met' if slow <= 2.0 else 'not met'})."]
        elif 512 in by_length and 8192 in by_length:
            slow = by_length[512] / by_length[8192]
            out.append("")
            out.append(f"Tokens/s at 8,192 tokens {slow:.2f}× slower than at 512 (target: within 2×: "
                       f"{'met' if slow <= 2.0 else 'not met'}).")
        out.append("")
    out.append("Attention's share: the fraction of the time per token above the 128-token rate (the dense "
               "products cost the same per token at every length). Our RSS: resident once the model is loaded "
               "(its packed weights), the peak while embedding (the peak is reset after loading), and in brackets "
               "the process's peak, which is the load's: the checkpoint's bytes and the packed weights held "
               "together for a moment. ONNX Runtime's is its process's peak.")
    out.append("")
    return out


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_sizes = "throughput_by_size" in doc
    fig, axes = plt.subplots(1, 2 if has_sizes else 1, figsize=(11 if has_sizes else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    threads = doc["settings"]["threads"]
    for engine in [e for e in ORDER if e in doc["throughput"]]:
        ys = [doc["throughput"][engine][str(t)]["documents_per_s"] for t in threads]
        ax.plot(threads, ys, marker="o", label=LABELS[engine], linewidth=2.5 if engine == "ours" else 1.5)
    ax.set_xticks(threads)
    ax.set_xlabel("threads")
    ax.set_ylabel("documents / s")
    ax.set_title(f"Throughput vs threads ({doc['corpus']['documents']:,} documents)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if has_sizes:
        ax = axes[0][1]
        s = doc["throughput_by_size"]
        for engine in ("ours", "ort-fp32"):
            ns = sorted(s[engine], key=int)
            ax.plot([int(n) for n in ns], [s[engine][n] for n in ns], marker="o", label=LABELS[engine],
                    linewidth=2.5 if engine == "ours" else 1.5)
        ax.set_xscale("log")
        ax.set_xlabel("documents in the corpus")
        ax.set_ylabel("documents / s")
        ax.set_title(f"Throughput vs corpus size ({s['threads']} threads)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    note = "QUICK run: " if doc.get("quick") else ""
    fig.suptitle(f"{note}all-MiniLM-L6-v2 on {doc['machine'].get('cpu', '?')}, {doc['date_utc'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_docs(docs_md, table, png, kind):
    """Puts the run into the results section of `kind`, replacing only that machine kind's previous
    result: the page keeps the latest result of every machine kind."""
    with open(docs_md, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{docs_md}: no {BEGIN} … {END} section to put the results in")
    start, end = f"<!-- machine:{kind} -->", f"<!-- /machine:{kind} -->"
    block = f"{start}\n### {kind}\n\n![throughput against threads and corpus size]({png})\n\n{table}{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.replace(END, f"{block}\n\n{END}")
    with open(docs_md, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--docs", help="docs/benchmarks.md to update")
    ap.add_argument("--machine-kind", help='"<vendor> family <n> model <n>", for a file without them')
    args = ap.parse_args()
    with open(args.results) as f:
        doc = json.load(f)
    if args.machine_kind:
        supply_machine_kind(doc["machine"], args.machine_kind)
    stem = args.results[: -len(".json")]
    table = markdown(doc)
    with open(stem + ".md", "w") as f:
        f.write(table)
    plot(doc, stem + ".png")
    if args.docs:
        update_docs(args.docs, table, os.path.relpath(stem + ".png", os.path.dirname(os.path.abspath(args.docs))),
                    machine_kind(doc["machine"]))
    print(table)


if __name__ == "__main__":
    main()
