"""EmbeddingGemma's part of make_test_models.py (`--only gemma3`): a random Gemma 3 text body run
with bidirectional attention, mean pooling, two Dense projections and Normalize, written under
tests/testdata/models/gemma3/ with its own reference.json.

The checkpoint: hidden 48, 4 query heads and 2 key/value heads of 16, 4 layers (sliding, sliding,
full, sliding), a stated sliding_window of 16 (with bidirectional attention transformers lets
query i see keys |i - j| <= 8), intermediate 40 (GeGLU with gelu_pytorch_tanh),
query_pre_attn_scalar 24 (not the head size, so a wrong attention scale shows), rotary bases
1,000,000 (full) and 10,000 (sliding), 2,048 positions; Dense 48 -> 96 -> 48 without bias,
identity activation; a BPE tokenizer trained here, `<bos> $A <eos>` as EmbeddingGemma's. Two
folders: classic-mean (the published config form, the classic pooling flags, max_seq_length
2048, EmbeddingGemma's prompts, no default) and v6-mean (6.x form, the length from the tokenizer
1,000, default prompt query). The generator refuses weights for which a wrong choice (causal
attention, no window, swapped rotary bases, x*w for x*(1+w), no Dense) would stay within cosine
0.99 of sentence-transformers' vectors.
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
from tokenizers import Tokenizer, decoders, normalizers, processors, trainers

import make_test_models as base

GEMMA3 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
              intermediate_size=40, max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
              attention_bias=False, query_pre_attn_scalar=24, sliding_window=16, use_bidirectional_attention=True,
              layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
              attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=True)
GLOBAL_THETA = 1_000_000.0
LOCAL_THETA = 10_000.0
DENSE = [(48, 96), (96, 48)]
# EmbeddingGemma's model card prompts (a subset: two retrieval sides and two tasks).
PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Clustering": "task: clustering | query: ",
    "STS": "task: sentence similarity | query: ",
}
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
# name, form, max length (classic: max_seq_length; 6.x: the tokenizer's model_max_length), default prompt
FOLDERS = [
    ("classic-mean", "classic", 2048, None),
    ("v6-mean", "v6", 1000, "query"),
]
TEXTS = base.TEXTS + [
    ("typed-specials", "a <bos> b <eos> c"),
    ("very-long-mixed", (base.LONG_EN + base.LONG_RU + base.LONG_ZH) * 12),
]


def tokenizer():
    """Gemma's pipeline: spaces become ▁, BPE over the whole string, <bos> $A <eos> (EmbeddingGemma's
    post-processor appends <eos>)."""
    tok = Tokenizer(base.tokenizers.models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " ")])
    trainer = trainers.BpeTrainer(vocab_size=base.VOCAB, special_tokens=SPECIALS)
    tok.train_from_iterator(base.TRAINING * 4, trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    assert ids == {t: i for i, t in enumerate(SPECIALS)}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>", special_tokens=[("<bos>", 2), ("<eos>", 1)]
    )
    return tok


def config(vocab, **changes):
    kwargs = dict(GEMMA3, vocab_size=vocab, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": GLOBAL_THETA},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}})
    kwargs.update(changes)
    return transformers.Gemma3TextConfig(**kwargs)


def build(cfg, state=None):
    model = transformers.Gemma3TextModel(cfg)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def scale(model, generator):
    """Spreads that make every choice matter: norm weights w around 0.2 (so 1 + w and w differ),
    embeddings 0.5, linear layers 1.5/sqrt(fan-in)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            assert not name.endswith(".bias"), name
            if name.endswith("norm.weight"):
                p.copy_(0.2 + 0.3 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def dense_modules(generator):
    out = []
    for i, o in DENSE:
        w = torch.randn((o, i), generator=generator) * (1.0 / i ** 0.5)
        out.append(models.Dense(i, o, bias=False, activation_function=torch.nn.Identity(), init_weight=w))
    return out


def published_config(path):
    """config.json as EmbeddingGemma-300m carries it (transformers 4.56): rope_theta and
    rope_local_base_freq at the top, rope_scaling null, no rope_parameters."""
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    assert rope["full_attention"]["rope_theta"] == GLOBAL_THETA and rope["sliding_attention"]["rope_theta"] == LOCAL_THETA, rope
    cfg.pop("dtype", None)
    cfg.update(rope_theta=GLOBAL_THETA, rope_local_base_freq=LOCAL_THETA, rope_scaling=None, _sliding_window_pattern=6,
               torch_dtype="float32", use_cache=True, architectures=["Gemma3TextModel"])
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def pipeline(tok, model, dense, text, prompt=""):
    enc = tok(prompt + text, truncation=True, max_length=2048, return_tensors="pt")
    with torch.no_grad():
        v = model(input_ids=enc["input_ids"]).last_hidden_state[0].mean(0)
        for d in dense:
            v = d.linear(v)
    return (v / v.norm()).numpy()


def sensitivity(tok, vocab, state, dense, vectors, texts):
    """Each wrong choice must move some text's vector below cosine 0.99; returns the worst cosines."""
    no_offset = {k: (v - 1.0 if k.endswith("norm.weight") else v) for k, v in state.items()}
    swapped = {"full_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA},
               "sliding_attention": {"rope_type": "default", "rope_theta": GLOBAL_THETA}}
    variants = [
        ("causal instead of bidirectional attention", build(config(vocab, use_bidirectional_attention=False), state), dense),
        ("no sliding window (every layer full)", build(config(vocab, layer_types=["full_attention"] * 4), state), dense),
        ("window one token wider (stated 18)", build(config(vocab, sliding_window=18), state), dense),
        ("rotary bases swapped", build(config(vocab, rope_parameters=swapped), state), dense),
        ("x * w instead of x * (1 + w)", build(config(vocab), no_offset), dense),
        ("no Dense modules", build(config(vocab), state), []),
    ]
    measured = {}
    for name, model, layers in variants:
        worst = min(float(np.dot(pipeline(tok, model, layers, t), np.array(r)) / np.linalg.norm(r)) for t, r in zip(texts, vectors))
        if worst > 0.99:
            sys.exit(f"gemma3: {name} still gives cosine {worst:.5f}: weights too weak to test")
        print(f"gemma3: {name}: worst cosine {worst:.4f}")
        measured[name] = round(worst, 4)
    return measured


def gemma3(args):
    """The Gemma3 checkpoint, its two folders and tests/testdata/models/gemma3/reference.json."""
    arch_dir = os.path.join(args.out, "gemma3")
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
    generator = torch.Generator().manual_seed(base.SEED + 36)
    vocab = tok.get_vocab_size()
    model = build(config(vocab))
    scale(model, generator)
    dense = dense_modules(generator)
    entry = {"model_type": "gemma3_text", "hidden_size": GEMMA3["hidden_size"], "dimensions": DENSE[-1][1],
             "dense": [list(d) for d in DENSE], "tokenizer": "committed", "folders": {}}
    doc = {
        "generator": "scripts/make_test_models.py --only gemma3",
        "versions": base.PINNED,
        "seed": base.SEED,
        "prompts": PROMPTS,
        "texts": [{"name": n, "text": t} for n, t in TEXTS],
        "architectures": {"gemma3": entry},
    }
    with tempfile.TemporaryDirectory() as work:
        staging = os.path.join(work, "hf")
        model.save_pretrained(staging, safe_serialization=True)
        weights = load_file(os.path.join(staging, "model.safetensors"))
        save_file({k: v.contiguous() for k, v in sorted(weights.items())}, os.path.join(arch_dir, "model.safetensors"))
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
            padding_side="right", model_max_length=2048, model_input_names=["input_ids", "attention_mask"],
        )
        fast.save_pretrained(staging)
        if not os.path.exists(committed):
            shutil.copy(os.path.join(staging, "tokenizer.json"), committed)
        entry["tokenizer_sha256"] = base.sha256(committed)
        for name, form, limit, default in FOLDERS:
            saved = os.path.join(work, name)
            transformer = models.Transformer(staging, max_seq_length=limit if form == "classic" else None)
            pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
            SentenceTransformer(modules=[transformer, pooling, *dense, models.Normalize()], device="cpu", prompts=PROMPTS,
                                default_prompt_name=default).save(saved)
            if form == "classic":
                flags = {"word_embedding_dimension": GEMMA3["hidden_size"], "pooling_mode_cls_token": False,
                         "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                         "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                         "pooling_mode_lasttoken": False, "include_prompt": True}
                with open(os.path.join(saved, "1_Pooling", "config.json"), "w") as f:
                    json.dump(flags, f, indent=4)
                with open(os.path.join(saved, "sentence_bert_config.json"), "w") as f:
                    json.dump({"max_seq_length": limit, "do_lower_case": False}, f, indent=4)
                published_config(os.path.join(saved, "config.json"))
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
            loaded = st[0].auto_model
            assert type(loaded).__name__ == "Gemma3TextModel", type(loaded)
            assert loaded.config.use_bidirectional_attention and loaded.config.sliding_window == 9, loaded.config.sliding_window
            assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"], list(st)
            runs = {}
            for key in [""] + list(PROMPTS):
                prefix = PROMPTS[key] if key else ""
                tokens, truncated = base.token_counts(st, texts, prefix)
                kw = dict(prompt_name=key) if key else dict(prompt="")
                vectors = st.encode(texts, batch_size=2, convert_to_numpy=True, **kw)
                runs[key] = {"tokens": tokens, "truncated": truncated, "vectors": base.rounded(vectors)}
            tokens = runs[""]["tokens"]
            assert any(t == limit for t in tokens), (name, "a text cut at the limit")
            entry["folders"][name] = {
                "form": form,
                "pooling": "mean",
                "normalize": True,
                "max_seq_length": limit,
                "prompts": PROMPTS,
                "default_prompt_name": default,
                "runs": runs,
            }
            if form == "classic":
                # Right padding and a bidirectional mask: batched vectors equal each text alone.
                alone = np.stack([pipeline(st.tokenizer, loaded, dense, t) for t in texts])
                agree = min(float(np.dot(a, np.array(b))) for a, b in zip(alone, runs[""]["vectors"]))
                assert agree > 0.99999, agree
                print(f"gemma3/{name}: the pipeline by hand agrees with encode() to {agree:.8f}")
                entry["wrong_choices"] = sensitivity(st.tokenizer, vocab, weights, dense, runs[""]["vectors"], texts)
    with open(os.path.join(arch_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"gemma3: {len(FOLDERS)} folders, {len(texts)} texts, written to {arch_dir}")
