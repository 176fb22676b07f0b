#!/usr/bin/env python3
"""bge-m3's three outputs on a tiny random checkpoint, as FlagEmbedding computes them.

A random XLMRobertaModel of the XLM-R matrix sizes (hidden 36, 3 heads, 3 layers, intermediate 76,
514 positions, padding index 1) with the committed Unigram tokenizer of
tests/testdata/models/xlm-roberta/, saved in the layout of the published BAAI/bge-m3 directory:
config.json, model.safetensors, the tokenizer files, modules.json (Transformer, Pooling "cls",
Normalize), 1_Pooling/config.json, sentence_bert_config.json, config_sentence_transformers.json,
and the two heads as FlagEmbedding loads them, torch.save of each Linear's state dict:
sparse_linear.pt (Linear(36, 1)) and colbert_linear.pt (Linear(36, 36)).

Written under tests/testdata/outputs/bgem3/ with bgem3-reference.json: for the matrix's texts
(tests/testdata/models/reference.json), BGEM3FlagModel(..., use_fp16=False).encode(texts,
return_dense=True, return_sparse=True, return_colbert_vecs=True) at max_length 512:
  dense     the CLS state, L2-normalised
  sparse    relu(sparse_linear(h)) per token, the maximum per token id, the ids of <s>, </s>,
            <pad>, <unk> dropped, zero weights dropped: (id, weight) pairs in id order, all of them
            and the 8 largest
  colbert   colbert_linear(h) of every token after the first, each L2-normalised: tokens - 1
            vectors
and each text's token count and ids. The heads as `model encrypt` seals them (safetensors, f32
`weight` and `bias`; docs/protocol.md §5) go to tests/testdata/outputs/bgem3-heads/, which the
enclave's reference test loads and the client's onboarding test compares its conversion with. The generator refuses weights for which a plausible mistake
would stay within the tests' bounds (weights within 1e-5 with the same ids; min cosine 0.9999 with
the same count): the lexical weights summed instead of maximised per id, kept without ReLU (negative
weights written), or with <s> and </s> kept; ColBERT vectors from the first token on (moved by one),
unnormalised (a norm within 0.05 of 1), or without the head's bias; the dense vector mean-pooled. The
margins are printed and stored in the reference JSON.

FlagEmbedding 1.4.2 does not import with transformers 5.x (it imports
transformers.modeling_attn_mask_utils), so this runs in its own venv with the pins of
scripts/make_output_models_bgem3.requirements.txt, by hand, never by setup or CI:
  python3 -m venv /tmp/flagvenv
  /tmp/flagvenv/bin/pip install -r scripts/make_output_models_bgem3.requirements.txt
  /tmp/flagvenv/bin/python scripts/make_output_models_bgem3.py
(or `make_output_models.py bgem3` from that venv).
"""

import json
import os
import shutil
import sys

import numpy as np
import safetensors.torch
import torch
import transformers

PINNED = {"torch": "2.15.0", "transformers": "4.57.6", "FlagEmbedding": "1.4.2", "numpy": "2.4.6"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "testdata", "outputs")
XLMR = os.path.join(ROOT, "tests", "testdata", "models", "xlm-roberta")
SEED = 20261129
TOP_K = 8
MAX_LENGTH = 512
SIZES = dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=3, intermediate_size=76,
             max_position_embeddings=514, hidden_act="gelu", layer_norm_eps=1e-5,
             pad_token_id=1, bos_token_id=0, eos_token_id=2)


def check_versions():
    from importlib.metadata import version
    got = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "FlagEmbedding": version("FlagEmbedding"), "numpy": np.__version__}
    wrong = {k: (got[k], v) for k, v in PINNED.items() if got[k] != v}
    if wrong:
        sys.exit(f"pinned versions differ (got, pinned): {wrong}")


def redraw(model, generator):
    """Spreads wider than transformers' init (std 0.02), so positions and biases shape the states."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def save_directory(target, texts):
    """The checkpoint in the published bge-m3 layout."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + 1)
    tokenizer_file = os.path.join(XLMR, "tokenizer.json")
    vocab = len(json.load(open(tokenizer_file))["model"]["vocab"])
    config = transformers.XLMRobertaConfig(vocab_size=vocab, type_vocab_size=1, **SIZES)
    model = transformers.XLMRobertaModel(config, add_pooling_layer=False)
    redraw(model, generator)
    model.eval()
    model.save_pretrained(target, safe_serialization=True)
    fast = transformers.XLMRobertaTokenizerFast(
        tokenizer_file=tokenizer_file, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=MAX_LENGTH,
    )
    fast.save_pretrained(target)
    hidden = SIZES["hidden_size"]
    sparse = torch.nn.Linear(hidden, 1)
    colbert = torch.nn.Linear(hidden, hidden)
    with torch.no_grad():
        # About half the tokens get a positive weight; norms of the projections well away from 1.
        # A text's states share a large part of their own: the lexical head reads what is
        # orthogonal to every text's mean state, scaled to unit spread, and its bias centres the
        # scores, so that about half the tokens of every text have a positive weight.
        per_text = [model(**fast(t, return_tensors="pt", truncation=True, max_length=MAX_LENGTH)).last_hidden_state[0] for t in texts]
        states = torch.cat(per_text)
        means, _ = torch.linalg.qr(torch.stack([s.mean(0) for s in per_text]).T)
        w = torch.randn(hidden, generator=generator)
        w -= means @ (means.T @ w)
        w /= (states @ w).std()
        sparse.weight.copy_(w.unsqueeze(0))
        sparse.bias.fill_(-float((states @ w).median()))
        colbert.weight.copy_(0.6 * torch.randn(colbert.weight.shape, generator=generator))
        colbert.bias.copy_(0.5 * torch.randn(colbert.bias.shape, generator=generator))
    torch.save(sparse.state_dict(), os.path.join(target, "sparse_linear.pt"))
    torch.save(colbert.state_dict(), os.path.join(target, "colbert_linear.pt"))
    sealed = os.path.join(OUT, "bgem3-heads")
    shutil.rmtree(sealed, ignore_errors=True)
    os.makedirs(sealed)
    for name, head in (("sparse_linear", sparse), ("colbert_linear", colbert)):
        tensors = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
        safetensors.torch.save_file(tensors, os.path.join(sealed, f"{name}.safetensors"))
    # Heads onboarding refuses by field: another key beside weight and bias, f64 weights.
    extra = dict(sparse.state_dict(), scale=torch.ones(1))
    torch.save(extra, os.path.join(sealed, "refused-extra-key.pt"))
    torch.save({k: v.to(torch.float64) for k, v in sparse.state_dict().items()}, os.path.join(sealed, "refused-f64.pt"))
    write_json(os.path.join(target, "modules.json"), [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    write_json(os.path.join(target, "1_Pooling", "config.json"), {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
    })
    os.makedirs(os.path.join(target, "2_Normalize"), exist_ok=True)
    write_json(os.path.join(target, "sentence_bert_config.json"), {"max_seq_length": MAX_LENGTH, "do_lower_case": False})
    write_json(os.path.join(target, "config_sentence_transformers.json"),
               {"__version__": {"sentence_transformers": "2.2.2", "transformers": "4.33.0", "pytorch": "2.1.2+cu121"}})
    return sparse, colbert


def pairs(weights):
    return [[int(i), float(f"{w:.9g}")] for i, w in sorted(weights.items(), key=lambda kv: int(kv[0]))]


def top(weights, k):
    kept = sorted(weights.items(), key=lambda kv: (-kv[1], int(kv[0])))[:k]
    return dict(kept)


def main():
    check_versions()
    from FlagEmbedding import BGEM3FlagModel

    target = os.path.join(OUT, "bgem3")
    shutil.rmtree(target, ignore_errors=True)
    texts = json.load(open(os.path.join(ROOT, "tests", "testdata", "models", "reference.json")))["texts"]
    inputs = [t["text"] for t in texts]
    sparse, colbert = save_directory(target, inputs)

    m3 = BGEM3FlagModel(target, use_fp16=False, devices="cpu")
    out = m3.encode(inputs, batch_size=4, max_length=MAX_LENGTH, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    tok = m3.tokenizer
    ids = [tok(t, truncation=True, max_length=MAX_LENGTH)["input_ids"] for t in inputs]
    full = [len(tok(t)["input_ids"]) for t in inputs]
    assert [len(v) for v in out["colbert_vecs"]] == [len(i) - 1 for i in ids]
    specials = {tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    assert specials == {0, 1, 2, 3}, specials

    # What a plausible mistake would give, on the same states.
    body = m3.model.model
    summed, unrelu, with_specials, worst_cls_shift, raw_norms, no_bias, mean_cos = [], [], [], 1.0, [], 1.0, 1.0
    with torch.no_grad():
        for text_ids, dense, colbert_vecs in zip(ids, out["dense_vecs"], out["colbert_vecs"]):
            h = body(input_ids=torch.tensor([text_ids])).last_hidden_state[0]
            w = sparse(h).squeeze(-1)
            s, u, k = {}, {}, {}
            for i, x in zip(text_ids, w.tolist()):
                s[i] = s.get(i, 0.0) + max(x, 0.0)
                u[i] = max(u.get(i, -1e9), x)
                k[i] = max(k.get(i, 0.0), max(x, 0.0))
            summed.append({i: v for i, v in s.items() if i not in specials and v > 0})
            unrelu.append({i: v for i, v in u.items() if i not in specials and v != 0})
            with_specials.append({i: v for i, v in k.items() if v > 0})
            projected = colbert(h)
            unit = torch.nn.functional.normalize(projected, dim=-1).numpy()
            shifted = (unit[:-1] * colbert_vecs).sum(-1).min()
            worst_cls_shift = min(worst_cls_shift, float(shifted))
            raw_norms.extend(projected[1:].norm(dim=-1).tolist())
            nb = torch.nn.functional.normalize(projected[1:] - colbert.bias, dim=-1).numpy()
            no_bias = min(no_bias, float((nb * colbert_vecs).sum(-1).min()))
            mean = torch.nn.functional.normalize(h.mean(0), dim=-1).numpy()
            mean_cos = min(mean_cos, float(mean @ dense))

    def weight_gap(wrong):
        """The largest weight difference over ids both have, and how many ids one has alone."""
        diff, alone = 0.0, 0
        for right, other in zip(out["lexical_weights"], wrong):
            right = {int(i): float(v) for i, v in right.items()}
            alone += len(set(right) ^ set(other))
            diff = max([diff] + [abs(right[i] - other[i]) for i in set(right) & set(other)])
        return {"max_difference": diff, "ids_differing": alone}

    wrong = {
        "sparse: summed per id": weight_gap(summed),
        "sparse: no ReLU (negative weights kept)": weight_gap(unrelu),
        "sparse: <s> and </s> kept": weight_gap(with_specials),
        "colbert: first token kept (moved by one): min cosine": worst_cls_shift,
        "colbert: unnormalised: smallest |norm - 1|": float(np.abs(np.array(raw_norms) - 1).min()),
        "colbert: head without bias: min cosine": no_bias,
        "dense: mean pooling: min cosine": mean_cos,
    }
    for name in ("sparse: summed per id", "sparse: no ReLU (negative weights kept)", "sparse: <s> and </s> kept"):
        assert wrong[name]["ids_differing"] > 0 or wrong[name]["max_difference"] > 1e-3, wrong
    assert wrong["sparse: summed per id"]["max_difference"] > 1e-3, wrong
    assert worst_cls_shift < 0.9 and no_bias < 0.99 and mean_cos < 0.99, wrong
    assert wrong["colbert: unnormalised: smallest |norm - 1|"] > 0.05, wrong

    active = [len(w) for w in out["lexical_weights"]]
    assert min(active) >= 1 and max(active) > TOP_K, active
    reference = {
        "generator": "scripts/make_output_models_bgem3.py",
        "versions": PINNED,
        "max_seq_length": MAX_LENGTH,
        "hidden_size": SIZES["hidden_size"],
        "vocab_size": sparse_vocab(target),
        "colbert_dimensions": SIZES["hidden_size"],
        "top_k": TOP_K,
        "dropped_ids": sorted(specials),
        "wrong_choices": wrong,
        "texts": [{
            "name": t["name"], "text": t["text"], "tokens": len(i), "truncated": n > MAX_LENGTH, "ids": i,
            "dense": [float(f"{x:.7g}") for x in d],
            "sparse": pairs(lw),
            "top_k": pairs(top(lw, TOP_K)),
            "colbert": [[float(f"{x:.7g}") for x in row] for row in c],
        } for t, i, n, d, lw, c in zip(texts, ids, full, out["dense_vecs"], out["lexical_weights"], out["colbert_vecs"])],
    }
    with open(os.path.join(OUT, "bgem3-reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
    print(f"bgem3: active ids per text {min(active)}..{max(active)}, tokens "
          f"{min(len(i) for i in ids)}..{max(len(i) for i in ids)}, wrong choices {json.dumps(wrong, indent=1)}")


def sparse_vocab(target):
    return json.load(open(os.path.join(target, "config.json")))["vocab_size"]


if __name__ == "__main__":
    main()
