#!/usr/bin/env python3
"""Long documents: our engine and ONNX Runtime on the same long-context models, at 512, 2,048 and
8,192 tokens. Runs in the suite's environment (.ephem/bench-venv); bench/suite.py calls it.

The models have the published shapes with random weights (speed does not depend on the values):
  modernbert  ModernBERT-base: hidden 768, 22 layers (every third global, the others a 128-token
              window), 12 heads, GeGLU 1,152, rotary, 8,192 positions; mean pooling.
  qwen3       Qwen3-Embedding-0.6B: hidden 1,024, 28 causal layers, 16 query / 8 key-value heads
              of 128, SwiGLU 3,072, rotary, 32,768 positions; last-token pooling.
Their tokenizers are the committed byte-level BPE ones of the test models (tests/testdata/models),
so the embedding tables are small; every text is cut at exactly the measured length by both
engines.

  long.py make --out DIR
      each model's directory (config.json, model.safetensors, tokenizer.json) and its fp32 ONNX
      export (model, pooling, L2 normalisation in one graph; eager attention, as transformers
      computes it), refused unless ONNX Runtime agrees with transformers (cosine >= 0.99999).
  long.py corpus --model-dir DIR --texts CORPUS.jsonl --length L --docs N --out OUT.jsonl
      N texts of at least L tokens, each made of consecutive corpus documents.
  long.py measure --model-dir DIR --onnx FILE --corpus OUT.jsonl --length L --repeats R --json OUT
                  [--vectors OUT.npy]
      ONNX Runtime, one text per run (no padding): documents/s and tokens/s (median of R passes
      after one warm-up pass), peak RSS of the process, and the vectors of the last pass.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZERS = os.path.join(ROOT, "tests", "testdata", "models")

MODELS = {
    "modernbert": dict(
        pooling="mean",
        tokenizer="modernbert",
        config=dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=22, intermediate_size=1152,
                    max_position_embeddings=8192, local_attention=128, global_attn_every_n_layers=3,
                    hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
                    pad_token_id=1, cls_token_id=0, sep_token_id=2, bos_token_id=0, eos_token_id=2),
    ),
    "qwen3": dict(
        pooling="lasttoken",
        tokenizer="qwen3",
        config=dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_hidden_layers=28,
                    intermediate_size=3072, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu",
                    attention_bias=False, use_sliding_window=False, tie_word_embeddings=True,
                    rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
                    pad_token_id=0, bos_token_id=0, eos_token_id=0),
    ),
}


def log(msg):
    print(f"[long] {msg}", file=sys.stderr, flush=True)


def tokenizer(model_dir, length=None):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    if length:
        tok.enable_truncation(length)
    else:
        tok.no_truncation()
    return tok


def build(name, out_dir):
    """The random model of `name`'s shape, saved as transformers saves it, and its ONNX export."""
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers

    spec = MODELS[name]
    model_dir = os.path.join(out_dir, name)
    onnx_path = os.path.join(model_dir, "model.onnx")
    if os.path.exists(os.path.join(model_dir, "export.json")):
        log(f"{name}: kept ({model_dir})")
        return
    os.makedirs(model_dir, exist_ok=True)
    tok_src = os.path.join(TOKENIZERS, spec["tokenizer"], "tokenizer.json")
    with open(tok_src) as f:
        tok_json = f.read()
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        f.write(tok_json)
    vocab = tokenizer(model_dir).get_vocab_size()
    torch.manual_seed(0)
    if name == "modernbert":
        config = transformers.ModernBertConfig(vocab_size=vocab, **spec["config"])
        model = transformers.ModernBertModel(config)
    else:
        config = transformers.Qwen3Config(vocab_size=vocab, **spec["config"])
        model = transformers.Qwen3Model(config)
    model.config._attn_implementation = "eager"
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)

    class Pooled(torch.nn.Module):
        def __init__(self, inner, pooling):
            super().__init__()
            self.inner, self.pooling = inner, pooling

        def forward(self, input_ids, attention_mask):
            states = self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if self.pooling == "mean":
                mask = attention_mask.unsqueeze(-1).to(states.dtype)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            else:  # one unpadded text per run: its last token
                pooled = states[:, -1]
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    wrapped = Pooled(model, spec["pooling"]).eval()
    tok = tokenizer(model_dir, 300)
    ids = tok.encode("Confidential embedding of long documents, measured. " * 40).ids
    sample = (torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.int64))
    log(f"{name}: exporting ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters)")
    with torch.no_grad():
        expected = wrapped(*sample).numpy()
        torch.onnx.export(wrapped, sample, onnx_path, input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=18, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}})
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": sample[0].numpy(), "attention_mask": sample[1].numpy()})[0]
    cosine = float((got * expected).sum() / (np.linalg.norm(got) * np.linalg.norm(expected)))
    if cosine < 0.99999:
        sys.exit(f"{name}: the ONNX export disagrees with transformers (cosine {cosine})")
    record = {"model": name, "parameters": int(sum(p.numel() for p in model.parameters())), "vocab": vocab,
              "pooling": spec["pooling"], "cosine_onnx_to_transformers": cosine, "torch": torch.__version__,
              "transformers": transformers.__version__, "onnxruntime": ort.__version__}
    with open(os.path.join(model_dir, "export.json"), "w") as f:
        json.dump(record, f, indent=1)
    log(f"{name}: exported, ONNX Runtime to transformers cosine {cosine:.7f}")


def corpus(args):
    tok = tokenizer(args.model_dir)
    with open(args.texts) as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    out, start = [], 0
    for i in range(args.docs):
        parts = []
        while True:
            parts.append(docs[start % len(docs)])
            start += 1
            text = "\n\n".join(parts)
            if len(tok.encode(text).ids) > args.length:
                break
        out.append({"id": f"long-{args.length}-{i}", "text": text})
    with open(args.out, "w") as f:
        for record in out:
            f.write(json.dumps(record) + "\n")


def measure(args):
    import numpy as np
    import onnxruntime as ort

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(args.onnx, options, providers=["CPUExecutionProvider"])
    tok = tokenizer(args.model_dir, args.length)
    with open(args.corpus) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]

    vectors = []

    def one_pass():
        tokens = 0
        vectors.clear()
        started = time.perf_counter()
        for text in texts:
            ids = np.array([tok.encode(text).ids], dtype=np.int64)
            vectors.append(session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0])
            tokens += ids.shape[1]
        return time.perf_counter() - started, tokens

    one_pass()  # warm-up
    passes = [one_pass() for _ in range(args.repeats)]
    seconds = statistics.median(s for s, _ in passes)
    tokens = passes[0][1]
    result = {"engine": "ort-fp32", "threads": threads, "length": args.length, "documents": len(texts),
              "tokens": tokens, "documents_per_s": len(texts) / seconds, "tokens_per_s": tokens / seconds,
              "pass_s": [round(s, 3) for s, _ in passes],
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    if args.vectors:
        np.save(args.vectors, np.stack(vectors))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make")
    make.add_argument("--out", required=True)
    make.add_argument("--models", default=",".join(MODELS))
    c = sub.add_parser("corpus")
    for flag in ("--model-dir", "--texts", "--out"):
        c.add_argument(flag, required=True)
    c.add_argument("--length", type=int, required=True)
    c.add_argument("--docs", type=int, required=True)
    m = sub.add_parser("measure")
    for flag in ("--model-dir", "--onnx", "--corpus", "--json"):
        m.add_argument(flag, required=True)
    m.add_argument("--length", type=int, required=True)
    m.add_argument("--repeats", type=int, default=2)
    m.add_argument("--vectors", help="the last pass's vectors (.npy), in corpus order")
    args = ap.parse_args()
    if args.command == "make":
        for name in filter(None, args.models.split(",")):
            build(name, args.out)
    elif args.command == "corpus":
        corpus(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
