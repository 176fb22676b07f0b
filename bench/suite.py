#!/usr/bin/env python3
"""Runs every measurement of the benchmark suite and writes the results; bench/run.sh prepares
what it needs (corpus, environment, release builds, ONNX export) and calls it with the suite's
Python. See docs/benchmarks.md for what each number means.

Every measurement runs in its own process with its thread count set the same way for all
engines: ours through RAYON_NUM_THREADS/CANDLE_NUM_THREADS (and the engine's own --threads),
PyTorch through torch.set_num_threads(n) + set_num_interop_threads(1), ONNX Runtime through
intra_op_num_threads=n + inter_op_num_threads=1, and OMP/MKL/OpenBLAS/Rayon variables = n for
every process.
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "bench", "peers.py")
LONG = os.path.join(ROOT, "bench", "long.py")
# Long documents: the lengths (the first is the per-token baseline), the tokens of one pass, and
# the timed passes at most per model (the decoder's 8,192-token pass takes about a minute).
LONG_LENGTHS = [128, 512, 2048, 8192]
LONG_TOKENS_PER_PASS = 8192
LONG_REPEATS = {"modernbert": 2, "qwen3": 1}
# The target's ratio (tokens/s at 512 over tokens/s at 8,192) from fresh processes of ours at the
# two lengths in alternation: the machines drift by tens of % between a run's steps.
LONG_PAIRS = 3
ENGINES = ["ours", "ours-bf16", "ours-int8", "ort-fp32", "ort-int8", "st"]
# The ratios the targets are stated in: (numerator, denominator) engines.
RATIO_PAIRS = [("ours", "ort-fp32"), ("ours-int8", "ort-int8"), ("ours-bf16", "ours"), ("ours-bf16", "ort-int8")]
# Our reduced precisions run only where the CPU has the instructions (elsewhere they are refused):
# bf16 needs AVX-512 BF16; int8 runs on AVX-512 VNNI, or on AVX2 without it.
NEEDS_FLAG = {"ours-bf16": "avx512_bf16", "ours-int8": "avx2"}
LABELS = {
    "ours": "ephem-batch worker (fp32)",
    "ours-bf16": "ephem-batch worker (precision bf16)",
    "ours-int8": "ephem-batch worker (precision int8)",
    "st": "sentence-transformers (PyTorch CPU)",
    "ort-fp32": "ONNX Runtime fp32",
    "ort-int8": "ONNX Runtime dynamic int8",
}


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def thread_env(threads):
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS",
                 "RAYON_RS_NUM_CPUS", "CANDLE_NUM_THREADS"):
        env[name] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "true"
    return env


def run(cmd, env=None, capture=False):
    log(" ".join(os.path.relpath(c, ROOT) if os.path.isabs(c) and c.startswith(ROOT) else c for c in cmd))
    if capture:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            # What it said is the only account of why: show it before the run stops.
            sys.stderr.write(done.stdout + done.stderr)
            done.check_returncode()
        return done.stdout
    subprocess.run(cmd, env=env, check=True)
    return None


def machine():
    info = {"cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        info["cpu"] = re.search(r"model name\s*:\s*(.*)", text).group(1).strip()
        # Vendor, family and model name the machine kind (the model name alone may be generic under KVM).
        info["cpu_vendor"] = re.search(r"vendor_id\s*:\s*(.*)", text).group(1).strip()
        info["cpu_family"] = int(re.search(r"cpu family\s*:\s*(\d+)", text).group(1))
        info["cpu_model"] = int(re.search(r"^model\s*:\s*(\d+)", text, re.M).group(1))
        flags = set(re.search(r"flags\s*:\s*(.*)", text).group(1).split())
        info["cpu_flags"] = sorted(f for f in ("avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8") if f in flags)
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        pass
    return info


def subset(corpus, count, work):
    """The first `count` documents: build_corpus.py's order makes this the corpus of that size."""
    path = os.path.join(work, f"corpus-{count}.jsonl")
    with open(corpus, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][:count]
    if len(lines) < count:
        sys.exit(f"{corpus} has only {len(lines)} documents, {count} asked")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return path


class Suite:
    def __init__(self, args):
        self.args = args
        self.work = args.work_dir
        self.bin = args.bin_dir
        self.python = sys.executable
        # The long-document texts made this run (bench/long.py corpus), by path.
        self.long_corpora = set()
        os.makedirs(self.work, exist_ok=True)

    def ours(self, corpus, threads, repeats, tag, precision="fp32", throughput_only=False):
        engine = "ours" if precision == "fp32" else f"ours-{precision}"
        out = os.path.join(self.work, f"{engine}-{tag}-t{threads}.json")
        only = ["--no-latency", "--no-agreement"] if throughput_only else []
        run([os.path.join(self.bin, "examples", "bench_inference"), "--corpus", corpus, "--threads", str(threads),
             "--repeats", str(repeats), "--precision", precision, "--json", out, *only], env=thread_env(threads))
        with open(out) as f:
            result = json.load(f)["results"][0]
        result["engine"] = engine
        return result

    def peer(self, engine, corpus, threads, repeats, tag, vectors=None):
        out = os.path.join(self.work, f"{engine}-{tag}-t{threads}.json")
        cmd = [self.python, PEERS, "measure", "--engine", engine, "--threads", str(threads), "--corpus", corpus,
               "--repeats", str(repeats), "--model-dir", self.args.model_dir, "--onnx-dir", self.args.onnx_dir,
               "--json", out]
        if vectors:
            cmd += ["--vectors", vectors]
        run(cmd, env=thread_env(threads))
        with open(out) as f:
            return json.load(f)

    def measure(self, engine, corpus, threads, repeats, tag, vectors=None, throughput_only=False):
        """One engine's run; `throughput_only` leaves out what ours measures besides docs/s (the
        latency texts, a reduced precision's agreement with fp32)."""
        if engine == "ours":
            return self.ours(corpus, threads, repeats, tag, throughput_only=throughput_only)
        if engine in ("ours-bf16", "ours-int8"):
            # Also measures its minimum cosine to our fp32 vectors over the corpus.
            return self.ours(corpus, threads, repeats, tag, precision=engine.removeprefix("ours-"),
                             throughput_only=throughput_only)
        return self.peer(engine, corpus, threads, repeats, tag, vectors)

    def rounds(self, engines, corpus, threads, count):
        """`count` rounds of one pass of every engine on `corpus`, each round starting one engine
        further along the list, and per round the ratios of [`RATIO_PAIRS`]: the machines drift by
        tens of per cent for minutes at a time, so a ratio of two measurements minutes apart says
        more about the drift than about the engines; within a round they run back to back."""
        runs = []
        for r in range(count):
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            docs_per_s = {}
            for engine in order:
                result = self.measure(engine, corpus, threads, 1, f"round{r}", throughput_only=True)
                docs_per_s[engine] = result["documents_per_s"]
            runs.append({"order": order, "documents_per_s": docs_per_s})
        ratios = {}
        for a, b in RATIO_PAIRS:
            values = [run["documents_per_s"][a] / run["documents_per_s"][b] for run in runs
                      if a in run["documents_per_s"] and b in run["documents_per_s"]]
            if values:
                ordered = sorted(values)
                ratios[f"{a}/{b}"] = {"values": values, "median": ordered[len(ordered) // 2],
                                      "min": ordered[0], "max": ordered[-1]}
        return {"threads": threads, "runs": runs, "ratios": ratios}

    def latency_pairs(self, corpus, threads, pairs):
        """`pairs` times: ours fp32 and ONNX Runtime fp32, each a fresh process warmed on `corpus`,
        each measuring the 9- and 128-token texts (median of 20); the ratios' medians. Which one
        runs first alternates from pair to pair, so that a machine speeding up or slowing down
        within a pair favours neither."""
        runs = []
        for i in range(pairs):
            if i % 2 == 0:
                ours = self.ours(corpus, threads, 1, f"latency{i}")
                ort = self.peer("ort-fp32", corpus, threads, 1, f"latency{i}")
            else:
                ort = self.peer("ort-fp32", corpus, threads, 1, f"latency{i}")
                ours = self.ours(corpus, threads, 1, f"latency{i}")
            runs.append({engine: {"9": r["latency_9_tokens_ms"], "128": r["latency_128_tokens_ms"]}
                         for engine, r in (("ours", ours), ("ort-fp32", ort))})
        ratio_128 = sorted(r["ours"]["128"] / r["ort-fp32"]["128"] for r in runs)
        ratio_9 = sorted(r["ours"]["9"] / r["ort-fp32"]["9"] for r in runs)
        return {"threads": threads, "pairs": runs, "ratio_128_median": ratio_128[len(runs) // 2],
                "ratio_9_median": ratio_9[len(runs) // 2]}

    def our_vectors(self, corpus, threads):
        out = os.path.join(self.work, "vectors-ours.f32")
        run([os.path.join(self.bin, "examples", "embed_corpus"), "--corpus", corpus, "--out", out,
             "--threads", str(threads)], env=thread_env(threads))
        return np.fromfile(out, dtype="<f4").reshape(-1, 384)

    def pipeline(self, corpus, threads):
        env = thread_env(threads)
        env["CARGO_TARGET_DIR"] = os.path.dirname(self.bin)
        env["EPHEM_MODEL_DIR"] = self.args.model_dir
        text = run(["bash", os.path.join(ROOT, "scripts", "bench_pipeline.sh"), corpus, str(threads)], env=env, capture=True)
        print(text, end="")
        # The summary lines (the pairs' own lines come first and also say "ratio").
        number = lambda label: float(re.search(rf"^{label}\s+([\d.]+)", text, re.M).group(1))  # noqa: E731
        seconds = float(re.search(r"\(([\d.]+) s, submit", text).group(1))
        return {"threads": threads, "raw_documents_per_s": number("raw inference"),
                "pipeline_documents_per_s": number("whole pipeline"), "ratio": number("ratio"), "pipeline_s": seconds,
                "pairs": len(re.findall(r"^pair \d+:", text, re.M))}

    def cold_start(self, threads, boots):
        out = os.path.join(self.work, "cold-start.json")
        env = thread_env(threads)
        env["EPHEM_MODEL_DIR"] = self.args.model_dir
        run([os.path.join(self.bin, "examples", "bench_cold_start"), "--boots", str(boots), "--threads", str(threads),
             "--worker", os.path.join(self.bin, "enclave-worker"), "--json", out], env=env)
        with open(out) as f:
            return json.load(f)


    def long_documents(self, threads, models, lengths, repeats):
        """Each long-context model (bench/long.py) at each length: ours fp32 and ONNX Runtime fp32
        on the same texts cut at exactly that many tokens (8,192 tokens per pass at every length),
        the vectors' agreement, and the rate per token against the shortest length's rate."""
        result = {"threads": threads, "tokens_per_pass": LONG_TOKENS_PER_PASS, "models": {}}
        for name in models:
            model_dir = os.path.join(self.args.long_dir, name)
            with open(os.path.join(model_dir, "export.json")) as f:
                export = json.load(f)
            passes = min(repeats, LONG_REPEATS.get(name, 1))
            rows = [self.long_row(name, model_dir, export["pooling"], length, passes, threads) for length in lengths]
            base = rows[0]["ours"]["real_tokens_per_s"]
            for row in rows:
                # Per token, a longer text costs more only in attention (every other product is
                # per token): the share of its time above the shortest length's rate.
                row["attention_share"] = 1.0 - row["ours"]["real_tokens_per_s"] / base
            result["models"][name] = {"parameters": export["parameters"], "pooling": export["pooling"], "passes": passes,
                                      "rows": rows}
            if {512, 8192} <= set(lengths):
                result["models"][name]["pairs_512_8192"] = self.long_pairs(name, model_dir, export["pooling"], threads)
        return result

    def long_corpus(self, name, model_dir, length):
        """The texts of one long-document step (cut at exactly `length` tokens), made once a run."""
        corpus = os.path.join(self.work, f"long-{name}-{length}.jsonl")
        if corpus not in self.long_corpora:
            self.long_corpora.add(corpus)
            run([self.python, LONG, "corpus", "--model-dir", model_dir, "--texts", self.args.corpus,
                 "--length", str(length), "--docs", str(long_docs(length)), "--out", corpus])
        return corpus

    def ours_long(self, name, model_dir, pooling, length, passes, threads, tag, vectors=None):
        """Our engine on one long-document step's texts, in a process of its own."""
        out = os.path.join(self.work, f"{tag}-ours.json")
        extra = ["--vectors", vectors] if vectors else []
        run([os.path.join(self.bin, "examples", "bench_inference"), "--corpus", self.long_corpus(name, model_dir, length),
             "--threads", str(threads), "--repeats", str(passes), "--max-tokens", str(length),
             "--budget", str(max(length, 2048)), "--pooling", pooling, "--no-latency", "--json", out, *extra],
            env=dict(thread_env(threads), EPHEM_MODEL_DIR=model_dir))
        with open(out) as f:
            ours = json.load(f)["results"][0]
        if ours["mean_tokens"] != length or ours["failed"]:
            sys.exit(f"{tag}: our engine embedded {ours['mean_tokens']} tokens per text, {ours['failed']} failed")
        return ours

    def long_pairs(self, name, model_dir, pooling, threads):
        """Ours at 512 and at 8,192 tokens in alternating fresh processes (one timed pass each, the
        first of every other pair at 8,192): tokens/s per pair and the median of the pairs' ratios."""
        pairs = []
        for i in range(LONG_PAIRS):
            order = (512, 8192) if i % 2 == 0 else (8192, 512)
            rate = {length: self.ours_long(name, model_dir, pooling, length, 1, threads, f"long-{name}-{length}-pair{i}")
                    ["real_tokens_per_s"] for length in order}
            pairs.append({"tokens_per_s_512": rate[512], "tokens_per_s_8192": rate[8192]})
        ratios = sorted(p["tokens_per_s_512"] / p["tokens_per_s_8192"] for p in pairs)
        return {"pairs": pairs, "ratio_median": ratios[len(ratios) // 2]}

    def long_row(self, name, model_dir, pooling, length, passes, threads):
        docs = long_docs(length)
        tag = f"long-{name}-{length}"
        corpus = self.long_corpus(name, model_dir, length)
        vectors = os.path.join(self.work, f"{tag}-ours.f32")
        ours = self.ours_long(name, model_dir, pooling, length, passes, threads, tag, vectors)
        ort_out, ort_vectors = os.path.join(self.work, f"{tag}-ort.json"), os.path.join(self.work, f"{tag}-ort.npy")
        run([self.python, LONG, "measure", "--model-dir", model_dir, "--onnx", os.path.join(model_dir, "model.onnx"),
             "--corpus", corpus, "--length", str(length), "--repeats", str(passes), "--json", ort_out,
             "--vectors", ort_vectors], env=thread_env(threads))
        with open(ort_out) as f:
            ort = json.load(f)
        reference = np.load(ort_vectors)
        agreement = min_cosine(np.fromfile(vectors, dtype="<f4").reshape(len(reference), -1), reference)
        return {"length": length, "documents": docs,
                "ours": {k: ours[k] for k in ("documents_per_s", "real_tokens_per_s", "peak_rss_mib", "loading_peak_rss_mib",
                                              "loaded_rss_mib", "embedding_peak_rss_mib", "model_load_ms",
                                              "gemm_peak_gflop_per_s", "loadavg_before_after")},
                "ort-fp32": {k: ort[k] for k in ("documents_per_s", "tokens_per_s", "peak_rss_mib")},
                "min_cosine_ours_to_ort": agreement["min"]}

    def memory(self, documents, threads):
        """One job of `documents` short texts through the local stack (scripts/soak.sh): peak RSS
        of every process on the way, and whether every record came back."""
        out = os.path.join(self.work, f"soak-{documents}.json")
        env = dict(os.environ, EPHEM_SOAK="1", EPHEM_BIN_DIR=self.bin, EPHEM_MODEL_DIR=self.args.model_dir,
                   EPHEM_SOAK_THREADS=str(threads))
        run(["bash", os.path.join(ROOT, "scripts", "soak.sh"), str(documents), out], env=env)
        with open(out) as f:
            result = json.load(f)
        return {k: v for k, v in result.items() if k != "job_id"}


def long_docs(length):
    """Texts of `length` tokens in one long-document pass."""
    return max(1, LONG_TOKENS_PER_PASS // length)


def min_cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    cos = np.sum(a[ok] * b[ok], axis=1) / (np.linalg.norm(a[ok], axis=1) * np.linalg.norm(b[ok], axis=1))
    return {"min": float(cos.min()), "mean": float(cos.mean()), "below_0_999": int((cos < 0.999).sum()),
            "compared": int(ok.sum()), "not_embedded": int((~ok).sum())}


def clean(result):
    """Drops what names this machine's paths from a sub-result."""
    return {k: v for k, v in result.items() if k not in ("corpus",)}


def measure_all(suite, args, doc, corpus, threads, top, sizes, skip):
    """Every step of the run, each adding its results to `doc`."""
    # 1. Throughput and latency, every engine at every thread count, same corpus.
    vectors = {}
    flags = doc["machine"].get("cpu_flags", [])
    engines = [e for e in ENGINES if e not in NEEDS_FLAG or NEEDS_FLAG[e] in flags]
    throughput = {engine: {} for engine in engines}
    for t in threads:
        for engine in engines:
            path = os.path.join(args.work_dir, f"vectors-{engine}.npy") if t == top and not engine.startswith("ours") else None
            throughput[engine][str(t)] = clean(suite.measure(engine, corpus, t, args.repeats, "main", path))
            if path:
                vectors[engine] = np.load(path)
    doc["throughput"] = throughput

    # 1b. The target ratios in rotating rounds, each engine once a round (the machines drift by
    # tens of per cent for minutes; an odd count has a true median).
    if "rounds" not in skip and args.rounds > 0:
        doc["rounds"] = suite.rounds([e for e in engines if e != "st"], corpus, top, args.rounds)

    # 2. Agreement with the sentence-transformers vectors over the corpus.
    if "cosine" not in skip:
        reference = vectors["st"]
        ours = suite.our_vectors(corpus, top)
        doc["cosine_to_sentence_transformers"] = {
            "ours": min_cosine(ours, reference),
            "ort-fp32": min_cosine(vectors["ort-fp32"], reference),
            "ort-int8": min_cosine(vectors["ort-int8"], reference),
        }

    # 3. Throughput against corpus size (ours and ONNX Runtime fp32) at the top thread count.
    if "sizes" not in skip:
        by_size = {"ours": {}, "ort-fp32": {}}
        for n in sizes:
            for engine in by_size:
                if n == args.docs:
                    result = throughput[engine][str(top)]
                else:
                    result = suite.measure(engine, subset(args.corpus, n, args.work_dir), top, args.repeats, f"n{n}")
                by_size[engine][str(n)] = result["documents_per_s"]
        doc["throughput_by_size"] = {"threads": top, **by_size}

    # 3b. One-text latency, ours fp32 and ONNX Runtime fp32 alternately (the machines drift by tens
    # of per cent for seconds at a time, which one 20-sample window per engine does not average).
    if "latency" not in skip:
        doc["latency_pairs"] = suite.latency_pairs(subset(args.corpus, 64, args.work_dir), top, args.latency_pairs)

    # 4. The whole local pipeline against raw inference, same corpus, 2 threads.
    if "pipeline" not in skip:
        n = args.pipeline_docs or args.docs
        doc["pipeline"] = suite.pipeline(subset(args.corpus, n, args.work_dir), top) | {"documents": n}

    # 5. Cold start of the real worker process.
    if "cold-start" not in skip:
        cold = suite.cold_start(top, args.boots)
        doc["cold_start"] = {k: cold[k] for k in ("boots", "threads", "first_boot_ms", "summary", "rsa2048_keygen_ms_median", "samples")}

    # 6. Peak RSS of every process against the size of one job (must not grow with it).
    if "memory" not in skip:
        doc["memory"] = {"threads": top, "jobs": [suite.memory(int(n), top) for n in args.rss_sizes.split(",") if n]}

    # 7. Long documents on long-context models, ours and ONNX Runtime fp32.
    if "long" not in skip:
        lengths = LONG_LENGTHS[:2] if args.quick else LONG_LENGTHS
        models = [m for m in args.long_models.split(",") if m]
        doc["long"] = suite.long_documents(top, models, lengths, args.repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="JSONL from scripts/build_corpus.py, at least --docs lines")
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1000,3000,10000")
    ap.add_argument("--boots", type=int, default=20)
    ap.add_argument("--pipeline-docs", type=int, default=None, help="corpus size of the pipeline run (default --docs)")
    ap.add_argument("--rss-sizes", default="1000,10000,100000",
                    help="job sizes (documents) of the memory step: peak RSS against corpus size")
    ap.add_argument("--skip", default="", help="comma list of: rounds, latency, pipeline, cold-start, sizes, cosine, memory, long")
    ap.add_argument("--long-dir", default=None, help="bench/long.py make's output")
    ap.add_argument("--long-models", default="modernbert,qwen3")
    ap.add_argument("--latency-pairs", type=int, default=7, help="alternating latency runs of ours and ONNX Runtime fp32")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rotating rounds of one pass per engine (not sentence-transformers) for the target ratios")
    ap.add_argument("--bin-dir", required=True, help="target/release")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--onnx-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", required=True, help="file name stem of the results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs-md", default=None, help="docs/benchmarks.md to put the table into (full runs)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    top = max(threads)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    skip = set(filter(None, args.skip.split(",")))
    suite = Suite(args)
    started = time.time()
    doc = {
        "suite": "ephem-batch bench/run.sh",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
        "machine": machine(),
        "loadavg_start": loadavg(),
        "corpus": {"source": "Debian package descriptions (scripts/build_corpus.py)", "documents": args.docs},
        "settings": {"threads": threads, "repeats": args.repeats, "batch_size_peers": 32, "sizes": sizes},
    }
    with open(os.path.join(args.onnx_dir, "export.json")) as f:
        doc["export"] = json.load(f)
    corpus = subset(args.corpus, args.docs, args.work_dir)

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, args.name)
    try:
        measure_all(suite, args, doc, corpus, threads, top, sizes, skip)
    except BaseException as failure:
        # What was measured before the failing step stays: a full run is half an hour.
        doc["failed"] = f"{type(failure).__name__}: {failure}"
        with open(stem + ".partial.json", "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        log(f"stopped: {doc['failed']}; the steps before it are in {stem}.partial.json")
        raise
    doc["loadavg_end"] = loadavg()
    doc["wall_s"] = round(time.time() - started, 1)
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    import report  # bench/report.py, beside this file

    table = report.markdown(doc)
    with open(stem + ".md", "w") as f:
        f.write(table)
    report.plot(doc, stem + ".png")
    log(f"wrote {stem}.json, .md, .png ({doc['wall_s']:.0f} s)")
    if args.docs_md:
        report.update_docs(args.docs_md, table, os.path.relpath(stem + ".png", os.path.dirname(args.docs_md)),
                           report.machine_kind(doc["machine"]))
        log(f"updated {args.docs_md}")
    print()
    print(table)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
