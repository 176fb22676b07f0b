#!/usr/bin/env python3
"""The peers of the benchmark suite: sentence-transformers (PyTorch, CPU) and ONNX Runtime (fp32
export of the same weights, and its dynamic int8 quantisation). Runs inside the suite's own
environment (.ephem/bench-venv, bench/requirements.txt); bench/suite.py calls it, one process per
engine and thread count, with the thread variables already set.

  peers.py export  --model-dir DIR --out-dir DIR
      fp32 ONNX of BERT + mean pooling over real tokens + L2 normalisation (the same pipeline as
      sentence-transformers' Transformer + Pooling(mean) + Normalize), checked against
      sentence-transformers; then ONNX Runtime dynamic int8 (per-channel weights) of it.
  peers.py measure --engine st|ort-fp32|ort-int8 --threads N --corpus C.jsonl --repeats R
                   [--vectors OUT.npy] --json OUT.json
      documents/s (median of R passes over the corpus, tokenization included, batch 32),
      latency of one 9-token and one 128-token text (median of 20 after 3 warm-ups, batch of
      one, tokenization included), and optionally the vectors of the last pass in corpus order.
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "enclave-worker", "testdata", "reference_embeddings.json")
MAX_TOKENS = 256
BATCH = 32
# sentence-transformers all-MiniLM-L6-v2, normalize_embeddings=True (STACK.md §5 of the project).
KNOWN_TEXT = "What is the capital of France?"
KNOWN_FIRST5 = [0.08204813, 0.0360555, -0.00389286, -0.0048811, 0.02565121]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def latency_texts():
    """The 9-token and 128-token texts the worker's benchmark uses."""
    with open(REFERENCE, encoding="utf-8") as f:
        cases = {c["name"]: c for c in json.load(f)["cases"]}
    short, long_ = cases["capital_of_france"], cases["tokens_128"]
    assert short["tokens"] == 9 and long_["tokens"] == 128
    return short["text"], long_["text"]


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def load_tokenizer(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()  # the file ships Fixed(128) padding
    tok.enable_truncation(max_length=MAX_TOKENS)  # and truncation at 128; sentence-transformers uses 256
    return tok


def st_model(model_dir):
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(model_dir, max_seq_length=MAX_TOKENS)
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------

def export(args):
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "2"))))
    os.makedirs(args.out_dir, exist_ok=True)
    fp32 = os.path.join(args.out_dir, "model-fp32.onnx")
    int8 = os.path.join(args.out_dir, "model-int8.onnx")

    class Pooled(torch.nn.Module):
        """BERT, then mean pooling over the attention mask, then L2 normalisation."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    bert = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager").eval()
    model = Pooled(bert).eval()
    tok = load_tokenizer(args.model_dir)
    sample = ["What is the capital of France?", "A longer second text, so that the batch has padding in it."]
    ids, mask, types = batch_arrays(tok.encode_batch(sample))
    inputs = tuple(torch.from_numpy(a) for a in (ids, mask, types))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad():
        try:
            # The TorchScript exporter: one graph with symbolic batch and sequence axes.
            torch.onnx.export(
                model, inputs, fp32, input_names=names, output_names=["sentence_embedding"],
                dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names} | {"sentence_embedding": {0: "batch"}},
                opset_version=17, dynamo=False,
            )
        except Exception as error:  # noqa: BLE001 - fall back to the dynamo exporter
            print(f"TorchScript exporter unavailable ({type(error).__name__}: {error}); using dynamo", file=sys.stderr)
            batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=1, max=MAX_TOKENS)
            torch.onnx.export(
                model, inputs, fp32, input_names=names, output_names=["sentence_embedding"],
                dynamic_shapes={n: {0: batch, 1: seq} for n in ["input_ids", "attention_mask", "token_type_ids"]},
                dynamo=True, external_data=False,
            )
    onnx.checker.check_model(fp32)
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True)

    # The export must agree with sentence-transformers (and the known answer) before it is used.
    st = st_model(args.model_dir)
    check = [KNOWN_TEXT, *latency_texts(), *sample]
    reference = st.encode(check, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True)
    err = max(abs(float(a) - b) for a, b in zip(reference[0][:5], KNOWN_FIRST5))
    if err > 1e-5:
        sys.exit(f"sentence-transformers disagrees with the known answer (max abs diff {err:.2e})")
    report = {"known_answer_max_abs_diff": err}
    for name, path in (("fp32", fp32), ("int8", int8)):
        session = ort_session(path, 1)
        got = ort_embed(session, tok, check)
        cos = float(np.min(np.sum(got * reference, axis=1)))
        report[f"{name}_min_cosine_to_st_on_checks"] = cos
        report[f"{name}_bytes"] = os.path.getsize(path)
        if name == "fp32" and cos < 0.99999:
            sys.exit(f"the fp32 export disagrees with sentence-transformers (min cosine {cos:.6f})")
    report["torch"], report["onnxruntime"], report["onnx"] = torch.__version__, ort.__version__, onnx.__version__
    with open(os.path.join(args.out_dir, "export.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


# ---------------------------------------------------------------------------------------------
# ONNX Runtime
# ---------------------------------------------------------------------------------------------

def batch_arrays(encodings):
    """Pads a batch to its longest member (never beyond)."""
    import numpy as np

    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return ids, mask, np.zeros_like(ids)


def ort_session(path, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def ort_embed(session, tok, texts):
    """Tokenizes, sorts by length, runs batches of 32, returns vectors in input order."""
    import numpy as np

    encodings = tok.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    out = np.zeros((len(texts), 384), dtype=np.float32)
    for start in range(0, len(order), BATCH):
        chunk = order[start : start + BATCH]
        ids, mask, types = batch_arrays([encodings[i] for i in chunk])
        (vectors,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        out[chunk] = vectors
    return out


# ---------------------------------------------------------------------------------------------
# measure
# ---------------------------------------------------------------------------------------------

def measure(args):
    import numpy as np

    texts = read_corpus(args.corpus)
    short, long_ = latency_texts()
    started = time.perf_counter()
    if args.engine == "st":
        import torch

        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(1)
        model = st_model(args.model_dir)

        def embed(batch):
            return model.encode(batch, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True)

        versions = {"torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__}
        threads_in_use = torch.get_num_threads()
    else:
        import onnxruntime as ort

        path = os.path.join(args.onnx_dir, "model-fp32.onnx" if args.engine == "ort-fp32" else "model-int8.onnx")
        session = ort_session(path, args.threads)
        tok = load_tokenizer(args.model_dir)

        def embed(batch):
            return ort_embed(session, tok, batch)

        versions = {"onnxruntime": ort.__version__}
        threads_in_use = args.threads
    load_s = time.perf_counter() - started

    embed(texts[:64])  # warm-up
    load_before = loadavg()
    rates, vectors = [], None
    for _ in range(max(1, args.repeats)):
        started = time.perf_counter()
        vectors = embed(texts)
        rates.append(len(texts) / (time.perf_counter() - started))

    def latency(text):
        times = []
        for i in range(23):
            started = time.perf_counter()
            embed([text])
            if i >= 3:
                times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)

    result = {
        "engine": args.engine,
        "threads": args.threads,
        "threads_in_use": threads_in_use,
        "documents": len(texts),
        "repeats": len(rates),
        "documents_per_s": statistics.median(rates),
        "documents_per_s_runs": rates,
        "latency_9_tokens_ms": latency(short),
        "latency_128_tokens_ms": latency(long_),
        "model_load_ms": load_s * 1e3,
        "loadavg_before_after": [load_before, loadavg()],
        "versions": versions,
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")},
    }
    if args.vectors:
        np.save(args.vectors, np.asarray(vectors, dtype=np.float32))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.engine:<9} threads {args.threads}: {result['documents_per_s']:7.1f} docs/s  "
          f"latency 9-tok {result['latency_9_tokens_ms']:.2f} ms, 128-tok {result['latency_128_tokens_ms']:.2f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("--model-dir", required=True)
    e.add_argument("--out-dir", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--engine", choices=["st", "ort-fp32", "ort-int8"], required=True)
    m.add_argument("--threads", type=int, required=True)
    m.add_argument("--corpus", required=True)
    m.add_argument("--repeats", type=int, default=3)
    m.add_argument("--model-dir", required=True)
    m.add_argument("--onnx-dir")
    m.add_argument("--vectors")
    m.add_argument("--json", required=True)
    args = ap.parse_args()
    export(args) if args.command == "export" else measure(args)


if __name__ == "__main__":
    main()
