#!/usr/bin/env python3
"""Output kinds beyond one dense vector: tiny random checkpoints and sentence-transformers' outputs.

  splade   a SPLADE sparse encoder as sentence-transformers 6.x saves one (SparseEncoder:
           Transformer with transformer_task "fill-mask" over BertForMaskedLM, then SpladePooling
           "max" / "relu"): hidden 24, 3 heads, 3 layers, intermediate 52, 512 positions, the
           committed WordPiece tokenizer of the MPNet matrix folder (901 tokens, <s> $A </s>),
           the MLM decoder tied to the word embeddings. Its prediction bias is shifted down so that
           about one vocabulary entry in ten is active per text, as in a trained SPLADE model.

Written under tests/testdata/sparse/<name>/ (a whole model directory, as `model encrypt` reads it)
with reference.json: the matrix's texts (make_test_models.TEXTS), their token counts and
SparseEncoder.encode()'s weights as (token id, weight) pairs, all of them and with
max_active_dims=8. The generator refuses weights for which sum pooling instead of max, or the
activation without log1p, would keep the weights within 1e-3 of the reference.

Run by hand in the venv of make_test_models.py (the same pinned versions), never by setup or CI:
  /tmp/stvenv/bin/python scripts/make_sparse_models.py
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_test_models as matrix  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SparseEncoder  # noqa: E402
from sentence_transformers.base.modules import Transformer  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

OUT = os.path.join(matrix.ROOT, "tests", "testdata", "sparse")
TOP_K = 8
SPLADE_SIZES = dict(hidden_size=24, num_attention_heads=3, num_hidden_layers=3, intermediate_size=52,
                    max_position_embeddings=512, hidden_act="gelu")


def pairs(dense):
    """A dense vocabulary-wide row as (token id, weight) pairs in id order, 7 significant digits."""
    ids = np.nonzero(dense)[0]
    return [[int(i), float(f"{dense[i]:.7g}")] for i in ids]


def splade():
    tokenizer = os.path.join(matrix.ROOT, "tests", "testdata", "models", "mpnet", "tokenizer.json")
    staging = tempfile.mkdtemp()
    torch.manual_seed(matrix.SEED)
    generator = torch.Generator().manual_seed(matrix.SEED + 40)
    vocab = json.load(open(tokenizer))["model"]["vocab"]
    config = transformers.BertConfig(vocab_size=len(vocab) + 1, pad_token_id=1, **SPLADE_SIZES)
    model = transformers.BertForMaskedLM(config)
    matrix.scale_weights(model, generator)
    with torch.no_grad():
        model.cls.predictions.bias.sub_(5.0)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512,
    )
    fast.save_pretrained(staging)

    transformer = Transformer(staging, transformer_task="fill-mask")
    st = SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy="max", activation_function="relu")])
    target = os.path.join(OUT, "splade")
    shutil.rmtree(target, ignore_errors=True)
    st.save(target)
    os.remove(os.path.join(target, "README.md"))  # a model card naming the staging directory
    st = SparseEncoder(target)

    texts = [t for _, t in matrix.TEXTS]
    tokens, truncated = matrix.token_counts(st, texts, "")
    full = st.encode(texts, batch_size=4, convert_to_tensor=True).to_dense().numpy()
    top = st.encode(texts, batch_size=4, convert_to_tensor=True, max_active_dims=TOP_K).to_dense().numpy()
    active = [int((row > 0).sum()) for row in full]
    assert min(active) >= 2 * TOP_K and max(active) < full.shape[1] // 3, f"active entries {active}"

    # What a wrong pooling or activation would cost, measured on the model's own logits.
    features = st.tokenize(texts)
    with torch.no_grad():
        logits = st[0](dict(features))["token_embeddings"]
    mask = features["attention_mask"].unsqueeze(-1).to(logits.dtype)
    summed = torch.log1p(torch.relu(logits * mask)).sum(dim=1).numpy()
    no_log = torch.relu(logits * mask).amax(dim=1).numpy()
    wrong = {"sum pooling": float(np.abs(summed - full).max()), "no log1p": float(np.abs(no_log - full).max())}
    assert all(v > 1e-3 for v in wrong.values()), wrong

    reference = {
        "dimensions": int(full.shape[1]),
        "top_k": TOP_K,
        "max_seq_length": st.max_seq_length,
        "wrong_choices_max_difference": wrong,
        "texts": [{"name": name, "text": text, "tokens": n, "truncated": cut, "sparse": pairs(f), "top_k": pairs(t)}
                  for (name, text), n, cut, f, t in zip(matrix.TEXTS, tokens, truncated, full, top)],
    }
    with open(os.path.join(target, "..", "splade-reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    shutil.rmtree(staging)
    print(f"splade: {full.shape[1]} dimensions, active per text {min(active)}..{max(active)}, wrong choices {wrong}")


def main():
    matrix.check_versions()
    os.makedirs(OUT, exist_ok=True)
    splade()


if __name__ == "__main__":
    main()
