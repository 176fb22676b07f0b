"""NomicBERT's part of make_test_models.py (`--only nomic_bert`): a random NomicBertModel
(transformers 5's port of nomic-embed-text: post-norm LayerNorm with bias, rotary positions, SwiGLU,
no linear biases, token type 0 added to the word rows), mean pooling and Normalize, written under
tests/testdata/models/nomic_bert/ with its own reference.json.

The checkpoint: hidden 36, 3 heads of 12, 3 layers, intermediate 40, rotary base 1,000, 2,048
positions, 2 token types; a WordPiece tokenizer trained here ([CLS] $A [SEP], lowercased, as
nomic-embed-text's BERT vocabulary); the prompts search_query / search_document. Two folders:
classic-mean (classic pooling flags, max_seq_length 2048) and v6-mean (6.x form, the length from
the tokenizer 1,000, default prompt search_query). The generator refuses weights for which a wrong
choice (no rotary, no token type row, gate and up swapped, pre-norm) would stay within cosine 0.99.
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
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers

import make_test_models as base

NOMIC = dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=3, intermediate_size=40, hidden_act="silu",
             max_position_embeddings=2048, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0)
THETA = 1000.0
PROMPTS = {"search_query": "search_query: ", "search_document": "search_document: "}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FOLDERS = [
    ("classic-mean", "classic", 2048, None),
    ("v6-mean", "v6", 1000, "search_query"),
]
TEXTS = base.TEXTS + [("very-long-mixed", (base.LONG_EN + base.LONG_RU + base.LONG_ZH) * 12)]


def tokenizer():
    tok = Tokenizer(base.tokenizers.models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(base.TRAINING * 4, trainer=trainers.WordPieceTrainer(vocab_size=base.VOCAB, special_tokens=SPECIALS))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    assert ids == {t: i for i, t in enumerate(SPECIALS)}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tok


def config(vocab, theta=THETA):
    return transformers.NomicBertConfig(**NOMIC, vocab_size=vocab, rope_parameters={"rope_type": "default", "rope_theta": theta})


def build(cfg, state=None):
    model = transformers.NomicBertModel(cfg)
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


def pooled(tok, model, text, **kwargs):
    enc = tok(text, truncation=True, max_length=2048, return_tensors="pt")
    n = enc["input_ids"].shape[1]
    if kwargs.pop("no_rotary", False):
        kwargs["position_ids"] = torch.zeros(1, n, dtype=torch.long)
    if kwargs.pop("token_type_one", False):
        kwargs["token_type_ids"] = torch.ones(1, n, dtype=torch.long)
    with torch.no_grad():
        v = model(input_ids=enc["input_ids"], **kwargs).last_hidden_state[0].mean(0)
    return (v / v.norm()).numpy()


def sensitivity(tok, vocab, state, vectors, texts):
    swapped = dict(state)
    for i in range(NOMIC["num_hidden_layers"]):
        swapped[f"layers.{i}.mlp.gate_proj.weight"] = state[f"layers.{i}.mlp.up_proj.weight"]
        swapped[f"layers.{i}.mlp.up_proj.weight"] = state[f"layers.{i}.mlp.gate_proj.weight"]
    model = build(config(vocab), state)
    variants = [
        ("no rotary positions", model, dict(no_rotary=True)),
        ("token type 1 instead of 0", model, dict(token_type_one=True)),
        ("gate and up swapped", build(config(vocab), swapped), {}),
        ("rotary base 10,000 instead of 1,000", build(config(vocab, 10_000.0), state), {}),
    ]
    measured = {}
    for name, m, kwargs in variants:
        worst = min(float(np.dot(pooled(tok, m, t, **dict(kwargs)), np.array(r)) / np.linalg.norm(r)) for t, r in zip(texts, vectors))
        if worst > 0.99:
            sys.exit(f"nomic_bert: {name} still gives cosine {worst:.5f}: weights too weak to test")
        print(f"nomic_bert: {name}: worst cosine {worst:.4f}")
        measured[name] = round(worst, 4)
    return measured


def nomic(args):
    arch_dir = os.path.join(args.out, "nomic_bert")
    os.makedirs(arch_dir, exist_ok=True)
    committed = os.path.join(arch_dir, "tokenizer.json")
    if os.path.exists(committed) and not args.retrain_tokenizers:
        tok = Tokenizer.from_file(committed)
        tok.no_padding()
        tok.no_truncation()
    else:
        tok = tokenizer()
    texts = [t for _, t in TEXTS]
    torch.manual_seed(base.SEED)
    generator = torch.Generator().manual_seed(base.SEED + 37)
    vocab = tok.get_vocab_size()
    model = build(config(vocab))
    scale(model, generator)
    entry = {"model_type": "nomic_bert", "hidden_size": NOMIC["hidden_size"], "tokenizer": "committed", "folders": {}}
    doc = {"generator": "scripts/make_test_models.py --only nomic_bert", "versions": base.PINNED, "seed": base.SEED,
           "prompts": PROMPTS, "texts": [{"name": n, "text": t} for n, t in TEXTS], "architectures": {"nomic_bert": entry}}
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
        for name, form, limit, default in FOLDERS:
            saved = os.path.join(work, name)
            transformer = models.Transformer(staging, max_seq_length=limit if form == "classic" else None)
            pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
            SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu", prompts=PROMPTS,
                                default_prompt_name=default).save(saved)
            if form == "classic":
                base.classic_form(saved, NOMIC["hidden_size"], "mean", limit)
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
            assert type(st[0].auto_model).__name__ == "NomicBertModel"
            runs = {}
            for key in [""] + list(PROMPTS):
                prefix = PROMPTS[key] if key else ""
                tokens, truncated = base.token_counts(st, texts, prefix)
                kw = dict(prompt_name=key) if key else dict(prompt="")
                vectors = st.encode(texts, batch_size=2, convert_to_numpy=True, **kw)
                runs[key] = {"tokens": tokens, "truncated": truncated, "vectors": base.rounded(vectors)}
            assert any(t == limit for t in runs[""]["tokens"]), (name, "a text cut at the limit")
            entry["folders"][name] = {"form": form, "pooling": "mean", "normalize": True, "max_seq_length": limit,
                                      "prompts": PROMPTS, "default_prompt_name": default, "runs": runs}
            if form == "classic":
                # The model's own names (transformers saves the published ones: Wqkv, fc11, fc12, ...).
                state = {k: v.clone() for k, v in st[0].auto_model.state_dict().items()}
                entry["wrong_choices"] = sensitivity(st.tokenizer, vocab, state, runs[""]["vectors"], texts)
    with open(os.path.join(arch_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"nomic_bert: {len(FOLDERS)} folders, {len(texts)} texts, written to {arch_dir}")
