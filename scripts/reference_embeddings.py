#!/usr/bin/env python3
"""Reference embeddings for the enclave worker's quality test.

Computes sentence embeddings of a fixed set of texts with all-MiniLM-L6-v2 (mean pooling over the
real tokens, L2 normalisation, truncation at 256 tokens) and writes them, with the texts, to
enclave-worker/testdata/reference_embeddings.json. `enclave-worker/tests/inference_reference.rs`
compares the Rust engine against every vector (minimum cosine >= 0.9999).

Two engines:
  numpy (default)  an independent float64 implementation of BERT written here in numpy; weights read
                   by parsing the safetensors header ourselves; tokenization by `tokenizers` (PyPI)
                   with the file's fixed padding removed and truncation set to 256, as
                   sentence-transformers does. Needs only numpy + tokenizers.
  st               sentence-transformers (Transformer(max_seq_length=256) + mean Pooling + Normalize)
                   on the same model directory; pulls PyTorch (~6 GB), so only for a manual re-check.

Both engines are checked at start against the known sentence-transformers value for
"What is the capital of France?" (STACK.md §5); the script refuses to write a file if it is off.

Usage (run by hand, not by setup or CI):
  python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install numpy tokenizers
  bash scripts/setup-model.sh
  /tmp/refenv/bin/python scripts/reference_embeddings.py [--engine numpy|st] [--model-dir DIR] [--out FILE]
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL_DIR = os.path.join(
    os.environ.get("EPHEM_HOME", os.path.join(ROOT, ".ephem")), "models", "all-MiniLM-L6-v2"
)
DEFAULT_OUT = os.path.join(ROOT, "enclave-worker", "testdata", "reference_embeddings.json")
MAX_TOKENS = 256

# sentence-transformers 'all-MiniLM-L6-v2', normalize_embeddings=True (STACK.md §5).
KNOWN_TEXT = "What is the capital of France?"
KNOWN_FIRST5 = [0.08204813, 0.0360555, -0.00389286, -0.0048811, 0.02565121]

LONG_TEXT = (
    "The history of the printing press is often told as the story of a single inventor, but the "
    "machine that Johannes Gutenberg assembled in Mainz around 1450 combined several older "
    "technologies: the screw press used for olives and grapes, oil-based inks that painters had "
    "refined for decades, paper that had travelled from China through the Islamic world into "
    "Europe, and a method for casting movable type from a hand mould in an alloy of lead, tin and "
    "antimony. What was new was the system. A compositor could set a page from thousands of "
    "identical letters, print hundreds of copies, break the page up again and reuse the type for "
    "the next one. Within fifty years presses were working in more than two hundred and fifty "
    "European cities, and an estimated twenty million volumes had been printed. Prices fell, "
    "spelling and grammar began to standardise, scholars could compare identical copies of a text "
    "across great distances, and pamphlets spread religious and political arguments faster than "
    "any authority could suppress them. Historians still argue about how much of the Reformation, "
    "the scientific revolution and the rise of national languages can be credited to the press, "
    "but few doubt that it changed how knowledge was stored, copied and challenged. Later "
    "improvements, from iron frames and steam power to rotary presses fed by continuous rolls of "
    "paper, multiplied the output again, until newspapers printed in the morning could be read "
    "across an entire country by the evening. The digital networks of our own time are often "
    "compared to that transformation, and the comparison is instructive: in both cases the cost of "
    "copying collapsed, the number of voices multiplied, and institutions struggled for "
    "generations to adapt to the flood of material that followed."
)

MEDIUM_TEXT = (
    "Bulk embedding jobs turn every document of a corpus into a fixed-length vector, so that "
    "similar documents end up close to each other and a search engine can find them by meaning "
    "rather than by exact words. A confidential deployment keeps the text and the vectors "
    "encrypted everywhere except inside an attested enclave, whose measurements the client checks "
    "before it seals anything to it. The enclave decrypts the input stream, tokenizes each record, "
    "groups records of similar length into batches under a token budget, runs the transformer, "
    "pools the token states into one vector per record, normalises it, and seals the result back "
    "to the client's key. Each step must preserve the order of the records and report every "
    "failure per record, never silently dropping anything, because the receipt counts them all."
)

# Texts whose result must be an error, not a vector (empty after normalisation).
ERROR_CASES = [
    ("empty", "", "empty_text"),
    ("whitespace_only", " \t\n\r\n   \u3000 ", "empty_text"),
]

CASES = [
    ("capital_of_france", KNOWN_TEXT),
    ("short", "Hello world"),
    ("single_word", "embedding"),
    ("long_truncated", LONG_TEXT),
    ("medium_over_128", MEDIUM_TEXT),
    ("french", "Le chat dort paisiblement sur le canapé pendant que la pluie tombe sur Paris."),
    ("german", "Die Straßenbahn fährt heute wegen Bauarbeiten nicht über den Hauptbahnhof hinaus."),
    ("chinese", "今天天气很好，我们一起去公园散步吧。机器学习正在改变世界。"),
    ("arabic", "القاهرة هي عاصمة مصر وأكبر مدنها، وتقع على ضفاف نهر النيل."),
    ("russian", "Москва — столица России и крупнейший город страны."),
    ("emoji", "I love pizza 🍕🍕 and coffee ☕ in the morning! 😀👍🏽 #happy"),
    ("mixed_whitespace", "  leading spaces\tand\ttabs\n\nnew  lines\r\n   and   many    spaces   "),
    ("punctuation_only", "?!... --- ;;; (()) !!! ***"),
    ("accents_case", "Crème Brûlée at the ÉCOLE: a naïve façade, ÜBER-cool!"),
    ("code", 'fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }'),
    ("numbers_url", "Order #12345 shipped 2024-03-01 to 221B Baker St.; track at https://example.com/t?id=42"),
    ("tokens_128", None),  # filled in below: exactly 128 tokens with [CLS] and [SEP]
]


def load_tokenizer(model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()  # the file ships Fixed(128) padding
    tok.enable_truncation(max_length=MAX_TOKENS)  # the file ships 128; sentence-transformers uses 256
    return tok


def text_of_n_tokens(tok, n):
    """A deterministic English text whose encoding (with [CLS]/[SEP]) is exactly n tokens."""
    words = (
        "the quick brown fox jumps over the lazy dog while a patient teacher explains to curious "
        "students how rivers carve valleys through soft rock over many thousands of years and why "
        "mountains slowly rise where continents collide beneath the restless surface of our planet "
        "so that every landscape we admire tells a long story of water wind ice and time"
    ).split()
    out = []
    i = 0
    while True:
        candidate = out + [words[i % len(words)]]
        if len(tok.encode(" ".join(candidate)).ids) > n:
            break
        out = candidate
        i += 1
    text = " ".join(out)
    assert len(tok.encode(text).ids) == n, "could not hit the exact token count"
    return text


# ---------------------------------------------------------------------------------------------
# numpy float64 BERT
# ---------------------------------------------------------------------------------------------

def read_safetensors(path):
    import numpy as np

    dtypes = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64}
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
        tensors[name] = arr.astype(np.float64) if arr.dtype.kind == "f" else arr
    return tensors


class NumpyBert:
    def __init__(self, model_dir):
        import numpy as np

        self.np = np
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        assert self.cfg["hidden_act"] == "gelu", "this engine implements the erf GELU only"
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.w = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in w.items()}
        self.heads = self.cfg["num_attention_heads"]
        self.eps = self.cfg["layer_norm_eps"]
        self._erf = np.frompyfunc(math.erf, 1, 1)

    def layer_norm(self, x, prefix):
        np = self.np
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def linear(self, x, prefix):
        return x @ self.w[prefix + ".weight"].T + self.w[prefix + ".bias"]

    def gelu(self, x):
        return 0.5 * x * (1.0 + self._erf(x / math.sqrt(2.0)).astype(self.np.float64))

    def forward(self, ids):
        """Hidden states of one unpadded sequence: (n, hidden)."""
        np = self.np
        n = len(ids)
        w = self.w
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self.layer_norm(x, "embeddings.LayerNorm")
        hidden = x.shape[1]
        d = hidden // self.heads
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            q = self.linear(x, p + ".attention.self.query").reshape(n, self.heads, d).transpose(1, 0, 2)
            k = self.linear(x, p + ".attention.self.key").reshape(n, self.heads, d).transpose(1, 0, 2)
            v = self.linear(x, p + ".attention.self.value").reshape(n, self.heads, d).transpose(1, 0, 2)
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            ctx = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
            x = self.layer_norm(self.linear(ctx, p + ".attention.output.dense") + x, p + ".attention.output.LayerNorm")
            h = self.gelu(self.linear(x, p + ".intermediate.dense"))
            x = self.layer_norm(self.linear(h, p + ".output.dense") + x, p + ".output.LayerNorm")
        return x

    def embed(self, tok, texts):
        np = self.np
        out = []
        for text in texts:
            ids = np.array(tok.encode(text).ids, dtype=np.int64)
            pooled = self.forward(ids).mean(axis=0)  # no padding: every token is real
            out.append(pooled / max(np.linalg.norm(pooled), 1e-12))
        return out


def numpy_engine(model_dir):
    import numpy as np

    tok = load_tokenizer(model_dir)
    bert = NumpyBert(model_dir)
    return tok, (lambda texts: bert.embed(tok, texts)), f"numpy-float64 (numpy {np.__version__})"


def st_engine(model_dir):
    import sentence_transformers
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(model_dir, max_seq_length=MAX_TOKENS)
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")

    def embed(texts):
        return list(model.encode(texts, batch_size=1, normalize_embeddings=True, convert_to_numpy=True))

    return load_tokenizer(model_dir), embed, f"sentence-transformers {sentence_transformers.__version__}"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def round8(x):
    return float(f"{float(x):.8g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["numpy", "st"], default="numpy")
    ap.add_argument("--model-dir", default=DEFAULT_MODEL_DIR)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(args.model_dir, name)):
            sys.exit(f"{args.model_dir}/{name} missing: run scripts/setup-model.sh")

    tok, embed, engine = (numpy_engine if args.engine == "numpy" else st_engine)(args.model_dir)

    # Known-answer check against sentence-transformers before anything is written.
    known = embed([KNOWN_TEXT])[0]
    err = max(abs(float(a) - b) for a, b in zip(known[:5], KNOWN_FIRST5))
    print(f"{engine}: {KNOWN_TEXT!r} first five {[round8(v) for v in known[:5]]}, max abs diff {err:.2e}")
    if err > 1e-6:
        sys.exit("the engine disagrees with the sentence-transformers reference; nothing written")

    cases = [(name, text if text is not None else text_of_n_tokens(tok, 128)) for name, text in CASES]
    vectors = embed([text for _, text in cases])
    doc = {
        "description": "all-MiniLM-L6-v2 reference sentence embeddings (mean pooling over real tokens, "
        "L2-normalised, truncation at 256 tokens incl. [CLS]/[SEP]); written by scripts/reference_embeddings.py",
        "engine": engine,
        "model": "all-MiniLM-L6-v2",
        "model_files_sha256": {
            name: sha256_file(os.path.join(args.model_dir, name))
            for name in ("config.json", "tokenizer.json", "model.safetensors")
        },
        "pooling": "mean",
        "normalize": True,
        "max_tokens": MAX_TOKENS,
        "known_answer_max_abs_diff": float(f"{err:.3g}"),
        "cases": [
            {
                "name": name,
                "text": text,
                "tokens": len(tok.encode(text).ids),
                "truncated": len(tok.encode(text).overflowing) > 0,
                "vector": [round8(v) for v in vec],
            }
            for (name, text), vec in zip(cases, vectors)
        ],
        "errors": [{"name": name, "text": text, "code": code} for name, text, code in ERROR_CASES],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for case in doc["cases"]:
        print(f"  {case['name']:<18} {case['tokens']:>4} tokens{' (truncated)' if case['truncated'] else ''}")
    print(f"wrote {len(doc['cases'])} vectors + {len(doc['errors'])} error cases to {args.out}")


if __name__ == "__main__":
    main()
