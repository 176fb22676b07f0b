#!/usr/bin/env python3
"""sentence-transformers' vectors for the int8 accuracy set: short texts and the reference texts.

Reads tests/testdata/short_texts/texts.txt (one text per line, each 1..=8 tokens with [CLS] and
[SEP]: single words, two- and three-word phrases, numbers, symbols, CJK, Cyrillic, Arabic and other
scripts, emoji) and the texts of enclave-worker/testdata/reference_embeddings.json (every length up
to truncation at 256), encodes them all with sentence-transformers' own SentenceTransformer on the
installed all-MiniLM-L6-v2 directory (Transformer with max_seq_length 256, mean Pooling, Normalize,
as its modules.json says), and writes tests/testdata/short_texts/reference.json: per text its kind
(short or reference), token count and vector, with the versions that
computed them and the model files' SHA-256. A vector is its 384 float32 values as sentence-transformers
returned them, little-endian, in base64 (exact, and a fifth of the size of decimal text).

tests/tests/int8_short_texts.rs embeds every text through the local stack with `submit --precision
int8` and `--precision fp32` and holds int8 to cosine >= 0.999 against both.

The script refuses to run with other versions than the pinned ones
(scripts/short_text_references.requirements.txt), refuses a short text of more than 8 tokens, and
checks the known sentence-transformers value for "What is the capital of France?" (STACK.md §5)
before anything is written.

Run by hand (torch from PyPI is several GB), never by setup or CI:
  python3 -m venv /tmp/stvenv
  /tmp/stvenv/bin/pip install -r scripts/short_text_references.requirements.txt
  bash scripts/setup-model.sh
  /tmp/stvenv/bin/python scripts/short_text_references.py [--model-dir DIR]
  rm -rf /tmp/stvenv
"""

import argparse
import base64
import hashlib
import json
import os
import sys

PINNED = {
    "torch": "2.15.0",
    "transformers": "5.23.0",
    "tokenizers": "0.23.3",
    "sentence_transformers": "6.2.0",
    "numpy": "2.4.6",
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL_DIR = os.path.join(
    os.environ.get("EPHEM_HOME", os.path.join(ROOT, ".ephem")), "models", "all-MiniLM-L6-v2"
)
SET_DIR = os.path.join(ROOT, "tests", "testdata", "short_texts")
REFERENCE_TEXTS = os.path.join(ROOT, "enclave-worker", "testdata", "reference_embeddings.json")
MAX_SHORT_TOKENS = 8
MIN_SHORT_TEXTS = 100

KNOWN_TEXT = "What is the capital of France?"
KNOWN_FIRST5 = [0.08204813, 0.0360555, -0.00389286, -0.0048811, 0.02565121]


def check_versions():
    import importlib

    wrong = []
    for module, want in PINNED.items():
        have = importlib.import_module(module).__version__.split("+")[0]
        if have != want:
            wrong.append(f"{module} {have} (pinned {want})")
    if wrong:
        sys.exit("not the pinned versions: " + ", ".join(wrong))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def round8(x):
    return float(f"{float(x):.8g}")


def short_texts():
    with open(os.path.join(SET_DIR, "texts.txt"), encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f if line.strip()]
    if len(texts) < MIN_SHORT_TEXTS or len(set(texts)) != len(texts):
        sys.exit(f"texts.txt: {len(texts)} texts, {len(set(texts))} distinct; at least {MIN_SHORT_TEXTS} distinct wanted")
    return texts


def reference_texts():
    with open(REFERENCE_TEXTS, encoding="utf-8") as f:
        return [case["text"] for case in json.load(f)["cases"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=DEFAULT_MODEL_DIR)
    ap.add_argument("--out", default=os.path.join(SET_DIR, "reference.json"))
    args = ap.parse_args()
    check_versions()

    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(args.model_dir, device="cpu")
    if model.max_seq_length != 256:
        sys.exit(f"max_seq_length {model.max_seq_length}, 256 expected (sentence_bert_config.json)")

    def encode(texts):
        # One text per batch: no padding anywhere, each text exactly as it is embedded alone.
        return model.encode(texts, batch_size=1, normalize_embeddings=True, convert_to_numpy=True)

    known = encode([KNOWN_TEXT])[0]
    err = max(abs(float(a) - b) for a, b in zip(known[:5], KNOWN_FIRST5))
    print(f"{KNOWN_TEXT!r}: first five {[round8(v) for v in known[:5]]}, max abs diff {err:.2e}")
    if err > 1e-6:
        sys.exit("sentence-transformers disagrees with its known value; nothing written")

    def tokens(text):
        return len(model.preprocess([text])["input_ids"][0])

    cases = [("short", t) for t in short_texts()] + [("reference", t) for t in reference_texts()]
    for kind, text in cases:
        if kind == "short" and tokens(text) > MAX_SHORT_TOKENS:
            sys.exit(f"{text!r}: {tokens(text)} tokens, a short text has at most {MAX_SHORT_TOKENS}")
    vectors = encode([text for _, text in cases])
    assert np.isfinite(vectors).all()
    doc = {
        "description": "sentence-transformers' all-MiniLM-L6-v2 vectors (normalize_embeddings=True, one text per "
        "batch) of the short texts in texts.txt and of enclave-worker/testdata/reference_embeddings.json's texts; "
        "written by scripts/short_text_references.py",
        "engine": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__.split('+')[0]}",
        "model": "all-MiniLM-L6-v2",
        "model_files_sha256": {
            name: sha256_file(os.path.join(args.model_dir, name))
            for name in ("config.json", "tokenizer.json", "model.safetensors")
        },
        "known_answer_max_abs_diff": float(f"{err:.3g}"),
        "cases": [
            {"kind": kind, "text": text, "tokens": tokens(text),
             "vector_f32le": base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")}
            for (kind, text), vec in zip(cases, vectors)
        ],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        # One case a line: reviewable diffs without a line per number.
        head = {k: v for k, v in doc.items() if k != "cases"}
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ',\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(case, ensure_ascii=False) for case in doc["cases"]))
        f.write("\n ]\n}\n")
    counts = {}
    for case in doc["cases"]:
        counts[case["kind"]] = counts.get(case["kind"], 0) + 1
    print(f"wrote {counts} vectors to {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
