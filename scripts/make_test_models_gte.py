"""GTE's part of make_test_models.py (`--only gte`): a random GteModel (transformers 5's port of
Alibaba's GTE v1.5 / mGTE: post-norm LayerNorm with bias, rotary positions, Q/K/V/O with biases, a
gated feed-forward act(gate) * up with the down projection biased, token type 0 added to the word
rows), written under tests/testdata/models/gte/ with its own reference.json.

The checkpoint: hidden 40, 4 heads of 10, 3 layers, intermediate 48, erf GELU, rotary base 160,000
(GteConfig's default), 2,048 positions, 2 token types; a WordPiece tokenizer trained here as
NomicBERT's generator does ([CLS] $A [SEP], lowercased), the prompts query / document. Two folders:
classic-cls (gte-base-en-v1.5's form: classic pooling flags, CLS, no Normalize, max_seq_length
2048) and v6-mean (6.x form, mean, Normalize, the length from the tokenizer 1,000, default prompt
query). The generator refuses weights for which a wrong choice (no rotary, another base, no token
type row, token type 1, gate and up swapped, no attention biases) would stay within cosine 0.99.
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer

import make_test_models as base
import make_test_models_nomic as nomic

GTE = dict(hidden_size=40, num_attention_heads=4, num_hidden_layers=3, intermediate_size=48, hidden_act="gelu",
           max_position_embeddings=2048, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
THETA = 160_000.0
PROMPTS = {"query": "query: ", "document": "document: "}
# (name, form, pooling, normalize, length, default prompt)
FOLDERS = [
    ("classic-cls", "classic", "cls", False, 2048, None),
    ("v6-mean", "v6", "mean", True, 1000, "query"),
]
TEXTS = nomic.TEXTS


def config(vocab, theta=THETA):
    return transformers.GteConfig(**GTE, vocab_size=vocab, rope_parameters={"rope_type": "default", "rope_theta": theta})


def build(cfg, state=None):
    model = transformers.GteModel(cfg)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def scale(model, generator):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm.weight" in name.lower():
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def pooled(tok, model, text, pooling, limit, **kwargs):
    enc = tok(text, truncation=True, max_length=limit, return_tensors="pt")
    n = enc["input_ids"].shape[1]
    if kwargs.pop("no_rotary", False):
        kwargs["position_ids"] = torch.zeros(1, n, dtype=torch.long)
    if kwargs.pop("token_type_one", False):
        kwargs["token_type_ids"] = torch.ones(1, n, dtype=torch.long)
    with torch.no_grad():
        h = model(input_ids=enc["input_ids"], **kwargs).last_hidden_state[0]
    v = h[0] if pooling == "cls" else h.mean(0)
    return (v / v.norm()).numpy()


def sensitivity(tok, vocab, state, vectors, texts, pooling, limit):
    layers = range(GTE["num_hidden_layers"])
    swapped, no_bias, no_type = dict(state), dict(state), dict(state)
    for i in layers:
        swapped[f"layers.{i}.mlp.gate_proj.weight"] = state[f"layers.{i}.mlp.up_proj.weight"]
        swapped[f"layers.{i}.mlp.up_proj.weight"] = state[f"layers.{i}.mlp.gate_proj.weight"]
        for p in "qkvo":
            key = f"layers.{i}.self_attn.{p}_proj.bias"
            no_bias[key] = torch.zeros_like(state[key])
    no_type["embeddings.token_type_embeddings.weight"] = torch.zeros_like(state["embeddings.token_type_embeddings.weight"])
    model = build(config(vocab), state)
    variants = [
        ("no rotary positions", model, dict(no_rotary=True)),
        ("rotary base 10,000 instead of 160,000", build(config(vocab, 10_000.0), state), {}),
        ("no token type row", build(config(vocab), no_type), {}),
        ("token type 1 instead of 0", model, dict(token_type_one=True)),
        ("gate and up swapped", build(config(vocab), swapped), {}),
        ("no Q/K/V/O biases", build(config(vocab), no_bias), {}),
    ]
    measured = {}
    for name, m, kwargs in variants:
        worst = min(float(np.dot(pooled(tok, m, t, pooling, limit, **dict(kwargs)), np.array(r)) / np.linalg.norm(r))
                    for t, r in zip(texts, vectors))
        if worst > 0.99:
            sys.exit(f"gte: {name} still gives cosine {worst:.5f} ({pooling}): weights too weak to test")
        print(f"gte ({pooling}): {name}: worst cosine {worst:.4f}")
        measured[name] = round(worst, 4)
    return measured


def gte(args):
    arch_dir = os.path.join(args.out, "gte")
    os.makedirs(arch_dir, exist_ok=True)
    committed = os.path.join(arch_dir, "tokenizer.json")
    if os.path.exists(committed) and not args.retrain_tokenizers:
        tok = Tokenizer.from_file(committed)
        tok.no_padding()
        tok.no_truncation()
    else:
        tok = nomic.tokenizer()
    texts = [t for _, t in TEXTS]
    torch.manual_seed(base.SEED)
    generator = torch.Generator().manual_seed(base.SEED + 41)
    vocab = tok.get_vocab_size()
    model = build(config(vocab))
    scale(model, generator)
    entry = {"model_type": "gte", "hidden_size": GTE["hidden_size"], "tokenizer": "committed", "folders": {},
             "wrong_choices": {}}
    doc = {"generator": "scripts/make_test_models.py --only gte", "versions": base.PINNED, "seed": base.SEED,
           "prompts": PROMPTS, "texts": [{"name": n, "text": t} for n, t in TEXTS], "architectures": {"gte": entry}}
    with tempfile.TemporaryDirectory() as work:
        staging = os.path.join(work, "hf")
        model.save_pretrained(staging, safe_serialization=True)
        weights = load_file(os.path.join(staging, "model.safetensors"))
        save_file({k: v.contiguous() for k, v in sorted(weights.items())}, os.path.join(arch_dir, "model.safetensors"))
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
            mask_token="[MASK]", model_max_length=2048, model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
        fast.save_pretrained(staging)
        if not os.path.exists(committed):
            shutil.copy(os.path.join(staging, "tokenizer.json"), committed)
        entry["tokenizer_sha256"] = base.sha256(committed)
        for name, form, pooling, normalize, limit, default in FOLDERS:
            saved = os.path.join(work, name)
            transformer = models.Transformer(staging, max_seq_length=limit if form == "classic" else None)
            modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
            if normalize:
                modules.append(models.Normalize())
            SentenceTransformer(modules=modules, device="cpu", prompts=PROMPTS, default_prompt_name=default).save(saved)
            if form == "classic":
                base.classic_form(saved, GTE["hidden_size"], pooling, limit)
                with open(os.path.join(saved, "config_sentence_transformers.json"), "w") as f:
                    json.dump({"prompts": PROMPTS, "default_prompt_name": None}, f, indent=2)
            else:
                tc_path = os.path.join(saved, "tokenizer_config.json")
                with open(tc_path) as f:
                    tc = json.load(f)
                tc["model_max_length"] = limit
                with open(tc_path, "w") as f:
                    json.dump(tc, f, indent=2)
            base.commit_folder(saved, os.path.join(arch_dir, name))
            assembled = os.path.join(work, name + ".assembled")
            base.assemble(arch_dir, name, committed, assembled)
            st = SentenceTransformer(assembled, device="cpu")
            assert st.max_seq_length == limit, (name, st.max_seq_length)
            assert type(st[0].auto_model).__name__ == "GteModel"
            runs = {}
            for key in [""] + list(PROMPTS):
                prefix = PROMPTS[key] if key else ""
                tokens, truncated = base.token_counts(st, texts, prefix)
                kw = dict(prompt_name=key) if key else dict(prompt="")
                vectors = st.encode(texts, batch_size=2, convert_to_numpy=True, **kw)
                runs[key] = {"tokens": tokens, "truncated": truncated, "vectors": base.rounded(vectors)}
            assert any(t == limit for t in runs[""]["tokens"]), (name, "a text cut at the limit")
            entry["folders"][name] = {"form": form, "pooling": pooling, "normalize": normalize, "max_seq_length": limit,
                                      "prompts": PROMPTS, "default_prompt_name": default, "runs": runs}
            state = {k: v.clone() for k, v in st[0].auto_model.state_dict().items()}
            entry["wrong_choices"][name] = sensitivity(st.tokenizer, vocab, state, runs[""]["vectors"], texts, pooling, limit)
    with open(os.path.join(arch_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"gte: {len(FOLDERS)} folders, {len(texts)} texts, written to {arch_dir}")
