#!/usr/bin/env python3
"""Tiny sentence-transformers checkpoints in both configuration forms, with reference vectors.

Makes one random BERT (fixed seed; hidden 48, 3 heads, 3 layers, intermediate 100, 512 positions,
the real all-MiniLM-L6-v2 vocabulary) and saves it as sentence-transformers models:

  classic-mean   classic form (pooling_mode_* flags, sentence_bert_config.json max_seq_length 200),
                 Normalize
  classic-cls    classic form, CLS pooling, max_seq_length 512, no Normalize
  v6-mean        as sentence-transformers 6.x saves it ("pooling_mode": "mean"), no
                 sentence_bert_config.json (the length is the tokenizer's model_max_length, 512),
                 Normalize, prompts {"query", "passage"} with default_prompt_name "query"
  v6-cls         as 6.x saves it, CLS pooling, no Normalize

and reference vectors from sentence-transformers over a multilingual text set that includes texts
longer than 256 and than 512 tokens. The weights are the same in every model, so one
model.safetensors is written beside the folders; tokenizer.json comes from the installed model
directory at test time (its SHA-256 is recorded). tests/tests/st_config_forms.rs onboards
each folder through `model encrypt`/`sign` and compares the enclave's engine to every vector.

Run by hand (not in CI), then delete the venv:
  python3 -m venv /tmp/stvenv
  /tmp/stvenv/bin/pip install -r scripts/make_test_models.requirements.txt
  bash scripts/setup-model.sh
  /tmp/stvenv/bin/python scripts/make_test_models.py [--model-dir DIR] [--out DIR]
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import sentence_transformers
import torch
import transformers
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer, models

SEED = 20261126
PROMPTS = {"query": "query: ", "passage": "passage: "}

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel.",
    "Быстрая коричневая лиса прыгает через ленивую собаку у реки.",
    "敏捷的棕色狐狸跳过了懒狗。东京和北京都是大城市。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول بالقرب من النهر.",
    "La vie est belle 🌍🚀✨ — café, naïve, façade, œuvre.",
    "Ο γρήγορος καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
]


def texts():
    out = [("empty-ish", "a"), ("short", "What is the capital of France?")]
    out += [(f"para-{i}", p) for i, p in enumerate(PARAGRAPHS)]
    # Longer than 256 tokens (and below 512), then longer than 512.
    out.append(("long-300", " ".join(PARAGRAPHS[i % 3] for i in range(9))))
    out.append(("long-600", " ".join(PARAGRAPHS[i % len(PARAGRAPHS)] for i in range(40))))
    out.append(("long-2000", " ".join(PARAGRAPHS[i % len(PARAGRAPHS)] for i in range(140))))
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def base_model(model_dir, work):
    """A random BertModel saved by transformers with the real tokenizer."""
    torch.manual_seed(SEED)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=48,
        num_attention_heads=3,
        num_hidden_layers=3,
        intermediate_size=100,
        max_position_embeddings=512,
        hidden_act="gelu",
    )
    # With its pooler, so that loading it again initialises nothing at random (the engine ignores it).
    model = transformers.BertModel(config)
    # Larger-than-initial weights so pooling and position choices change the vectors visibly.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    base = os.path.join(work, "base")
    model.save_pretrained(base, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(model_dir, name), base)
    return base


def build(base, pooling, normalize, max_seq_length, prompts):
    transformer = models.Transformer(base, max_seq_length=max_seq_length)
    modules = [transformer, models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    kwargs = {"prompts": prompts, "default_prompt_name": "query"} if prompts else {}
    return SentenceTransformer(modules=modules, device="cpu", **kwargs)


def classic_form(folder, pooling, max_seq_length):
    """Rewrites a 6.x save as sentence-transformers 2.x wrote it."""
    flags = {
        "word_embedding_dimension": 48,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump(flags, f, indent=2)
    with open(os.path.join(folder, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": max_seq_length, "do_lower_case": False}, f, indent=2)
    # 2.x wrote only its versions here: no prompts.
    with open(os.path.join(folder, "config_sentence_transformers.json"), "w") as f:
        json.dump({"__version__": {"sentence_transformers": "2.0.0"}}, f, indent=2)


def main():
    parser = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--model-dir", default=os.path.join(here, "..", ".ephem", "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "testdata", "st-models"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = texts()
    specs = [
        ("classic-mean", "mean", True, 200, None, True),
        ("classic-cls", "cls", False, 512, None, True),
        ("v6-mean", "mean", True, None, PROMPTS, False),
        ("v6-cls", "cls", False, None, None, False),
    ]
    os.makedirs(args.out, exist_ok=True)
    reference = {
        "generator": "scripts/make_test_models.py",
        "versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "tokenizer_sha256": sha256(os.path.join(args.model_dir, "tokenizer.json")),
        "models": {},
    }
    with tempfile.TemporaryDirectory() as work:
        base = base_model(args.model_dir, work)
        weights = None
        for name, pooling, normalize, max_seq_length, prompts, classic in specs:
            st = build(base, pooling, normalize, max_seq_length, prompts)
            saved = os.path.join(work, name)
            st.save(saved)
            if classic:
                classic_form(saved, pooling, max_seq_length)
            else:
                stated = os.path.join(saved, "sentence_bert_config.json")
                if os.path.exists(stated):
                    with open(stated) as f:
                        sbert = json.load(f)
                    if sbert.get("max_seq_length") in (None, 512):
                        # 6.x's own form leaves the limit to the tokenizer.
                        os.remove(stated)
            # Reload what was saved: the vectors are those of the folder as written.
            st = SentenceTransformer(saved, device="cpu")
            limit = st.max_seq_length
            vectors = st.encode([t for _, t in cases], prompt="", convert_to_numpy=True, batch_size=4)
            tokens = [min(len(st.tokenizer(t)["input_ids"]), limit) for _, t in cases]
            entry = {
                "max_seq_length": limit,
                "pooling": pooling,
                "normalize": normalize,
                "cases": [
                    {"name": n, "text": t, "tokens": k, "vector": [float(x) for x in v]}
                    for (n, t), k, v in zip(cases, tokens, vectors)
                ],
            }
            if prompts:
                queried = st.encode([t for _, t in cases], prompt_name="query", convert_to_numpy=True, batch_size=4)
                entry["query_vectors"] = [[float(x) for x in v] for v in queried]
            reference["models"][name] = entry
            folder = os.path.join(args.out, name)
            shutil.rmtree(folder, ignore_errors=True)
            for root, _, files in os.walk(saved):
                for file in files:
                    rel = os.path.relpath(os.path.join(root, file), saved)
                    if rel in ("model.safetensors", "tokenizer.json", "README.md", "vocab.txt", "special_tokens_map.json"):
                        continue
                    os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
                    shutil.copy(os.path.join(saved, rel), os.path.join(folder, rel))
            tensors = load_file(os.path.join(saved, "model.safetensors"))
            if weights is None:
                weights = tensors
            else:
                assert all(torch.equal(weights[k], tensors[k]) for k in weights), "one set of weights"
        save_file({k: v.contiguous() for k, v in sorted(weights.items())}, os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
