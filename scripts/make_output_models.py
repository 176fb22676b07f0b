#!/usr/bin/env python3
"""Output kinds beyond one dense vector: tiny random checkpoints and sentence-transformers' outputs.

  splade   a SPLADE sparse encoder as sentence-transformers 6.x saves one (SparseEncoder:
           Transformer with transformer_task "fill-mask" over BertForMaskedLM, then SpladePooling
           "max" / "relu"): hidden 24, 3 heads, 3 layers, intermediate 52, 512 positions, the
           committed WordPiece tokenizer of the MPNet matrix folder (901 tokens, <s> $A </s>),
           the MLM decoder tied to the word embeddings. Its prediction bias is shifted down so that
           about one vocabulary entry in ten is active per text, as in a trained SPLADE model.

  colbert  a ColBERT multi-vector encoder as sentence-transformers 6.x saves one (MultiVectorEncoder:
           Transformer over BertModel, a token-level Dense 24 -> 16 without bias and with the
           identity activation, MultiVectorMask with no skiplist, a token-level Normalize), the
           same sizes and tokenizer as splade. Without prompts, query expansion or a skiplist a
           query's vectors are a document's, so one set is written (checked here).

Written under tests/testdata/outputs/<name>/ (a whole model directory, as `model encrypt` reads it)
with <name>-reference.json. splade: the matrix's texts (make_test_models.TEXTS), their token counts and
SparseEncoder.encode()'s weights as (token id, weight) pairs, all of them and with
max_active_dims=8. The generator refuses weights for which sum pooling instead of max, or the
activation without log1p, would keep the weights within 1e-3 of the reference. rerank: queries,
each with the matrix's texts as its documents, CrossEncoder.predict()'s scores and rank()'s
order, and the token count of every pair; it refuses weights for which scoring without the
classification head's tanh, or the query alone, would keep the scores within 1e-3. rerank_bert:
the same for a BERT cross-encoder (BertForSequenceClassification, the matrix's BERT sizes, the
committed GTE WordPiece tokenizer: [CLS] $A [SEP] $B:1 [SEP]:1), refusing weights for which
all-type-0 segments, or the pooler without its tanh, would keep the scores within 1e-3. colbert:
every text's per-token vectors from MultiVectorEncoder.encode() and their count; it refuses
weights for which the unprojected states, the unnormalised projections (a norm within 0.05 of
1), vectors moved by one token, or dropping the first token (bge-m3's choice) would still pass a
min-cosine 0.9999 test with the same count.

Run by hand in the venv of make_test_models.py (the same pinned versions), never by setup or CI:
  /tmp/stvenv/bin/python scripts/make_output_models.py [splade] [rerank] [rerank_bert] [colbert]

bgem3 (bge-m3's dense, lexical and ColBERT outputs, against FlagEmbedding) is
make_output_models_bgem3.py, in its own venv (FlagEmbedding 1.4.2 needs transformers 4.x):
  /tmp/flagvenv/bin/python scripts/make_output_models_bgem3.py
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
from sentence_transformers import CrossEncoder, MultiVectorEncoder, SparseEncoder  # noqa: E402
from sentence_transformers.base.modules import Normalize, Transformer  # noqa: E402
from sentence_transformers.base.modules.dense import Dense  # noqa: E402
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

OUT = os.path.join(matrix.ROOT, "tests", "testdata", "outputs")
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


QUERIES = [
    "What is the capital of France?",
    "Какая столица у Франции?",
    "history of the printing press",
    "emoji 🚀",
]


def cross_encoder_cases(ce):
    """Every query against the matrix's texts: predict()'s scores, rank()'s order, each pair's
    token count (and whether it was cut at 128)."""
    documents = [t for _, t in matrix.TEXTS]
    cases = []
    for query in QUERIES:
        pairs = [(query, d) for d in documents]
        scores = ce.predict(pairs, batch_size=4)
        ranked = ce.rank(query, documents, batch_size=4)
        tokens = [len(ce.tokenizer(query, d, truncation=True, max_length=128)["input_ids"]) for d in documents]
        full = [len(ce.tokenizer(query, d)["input_ids"]) for d in documents]
        cases.append({
            "query": query,
            "scores": [float(f"{x:.7g}") for x in scores],
            "order": [r["corpus_id"] for r in ranked],
            "tokens": tokens,
            "truncated": [f > 128 for f in full],
        })
    assert any(any(c["truncated"]) for c in cases)
    spread = max(max(c["scores"]) - min(c["scores"]) for c in cases)
    assert spread > 0.2, f"scores too close to tell an order: {spread}"
    return documents, cases, spread


def rerank():
    tokenizer = os.path.join(matrix.ROOT, "tests", "testdata", "models", "xlm-roberta", "tokenizer.json")
    staging = tempfile.mkdtemp()
    torch.manual_seed(matrix.SEED)
    generator = torch.Generator().manual_seed(matrix.SEED + 41)
    vocab = json.load(open(tokenizer))["model"]["vocab"]
    config = transformers.XLMRobertaConfig(vocab_size=len(vocab) + 1, type_vocab_size=1, num_labels=1, **matrix.ARCHS["xlm-roberta"])
    model = transformers.XLMRobertaForSequenceClassification(config)
    matrix.scale_weights(model, generator)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    fast = transformers.XLMRobertaTokenizerFast(
        tokenizer_file=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512,
    )
    fast.save_pretrained(staging)
    target = os.path.join(OUT, "rerank")
    shutil.rmtree(target, ignore_errors=True)
    CrossEncoder(staging, max_length=128).save(target)
    os.remove(os.path.join(target, "README.md"))
    ce = CrossEncoder(target)
    assert ce.max_length == 128, ce.max_length

    documents, cases, spread = cross_encoder_cases(ce)

    # What a wrong head or a wrong pair would cost.
    features = ce.tokenizer([QUERIES[0]] * len(documents), documents, truncation=True, max_length=128, padding=True, return_tensors="pt")
    with torch.no_grad():
        body = ce.model.roberta(**features).last_hidden_state[:, 0]
        head = ce.model.classifier
        no_tanh = torch.sigmoid(head.out_proj(head.dense(body))).squeeze(-1).numpy()
        alone = ce.tokenizer([QUERIES[0]] * len(documents), truncation=True, max_length=128, padding=True, return_tensors="pt")
        query_only = torch.sigmoid(ce.model(**alone).logits).squeeze(-1).numpy()
    reference = np.array(cases[0]["scores"])
    wrong = {"no tanh": float(np.abs(no_tanh - reference).max()), "query alone": float(np.abs(query_only - reference).max())}
    assert all(v > 1e-3 for v in wrong.values()), wrong
    with open(os.path.join(OUT, "rerank-reference.json"), "w") as f:
        json.dump({"documents": documents, "max_length": 128, "wrong_choices_max_difference": wrong, "queries": cases},
                  f, ensure_ascii=False, indent=1)
    shutil.rmtree(staging)
    print(f"rerank: {len(QUERIES)} queries x {len(documents)} documents, score spread {spread:.3f}, wrong choices {wrong}")


def rerank_bert():
    """A BERT cross-encoder (ms-marco-MiniLM's shape): the pair's second segment, its [SEP]
    included, has token type 1; the score is the pooler's tanh(dense([CLS])), then `classifier`."""
    tokenizer = os.path.join(matrix.ROOT, "tests", "testdata", "models", "gte", "tokenizer.json")
    staging = tempfile.mkdtemp()
    torch.manual_seed(matrix.SEED)
    generator = torch.Generator().manual_seed(matrix.SEED + 42)
    vocab = json.load(open(tokenizer))["model"]["vocab"]
    config = transformers.BertConfig(vocab_size=len(vocab), type_vocab_size=2, num_labels=1, pad_token_id=0, **matrix.ARCHS["bert"])
    model = transformers.BertForSequenceClassification(config)
    matrix.scale_weights(model, generator)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=tokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", model_max_length=512, model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    fast.save_pretrained(staging)
    target = os.path.join(OUT, "rerank-bert")
    shutil.rmtree(target, ignore_errors=True)
    CrossEncoder(staging, max_length=128).save(target)
    os.remove(os.path.join(target, "README.md"))
    ce = CrossEncoder(target)
    assert ce.max_length == 128, ce.max_length
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid), ce.activation_fn

    documents, cases, spread = cross_encoder_cases(ce)
    features = ce.tokenizer([QUERIES[0]] * len(documents), documents, truncation=True, max_length=128, padding=True, return_tensors="pt")
    types = features["token_type_ids"]
    assert int(types.sum()) > 0, "the pairs' second segments have token type 1"
    # Each row: 0…0 1…1 over its real tokens, the last [SEP] of type 1.
    for row, mask in zip(types.tolist(), features["attention_mask"].tolist()):
        real = row[:sum(mask)]
        first = real.index(1)
        assert real[first:] == [1] * (len(real) - first) and real[-1] == 1, real

    # What all-type-0 segments or a pooler without tanh would cost.
    with torch.no_grad():
        zeroed = dict(features, token_type_ids=torch.zeros_like(types))
        type0 = torch.sigmoid(ce.model(**zeroed).logits).squeeze(-1).numpy()
        first = ce.model.bert(**features).last_hidden_state[:, 0]
        no_tanh = torch.sigmoid(ce.model.classifier(ce.model.bert.pooler.dense(first))).squeeze(-1).numpy()
    reference = np.array(cases[0]["scores"])
    wrong = {"token types 0": float(np.abs(type0 - reference).max()), "no tanh": float(np.abs(no_tanh - reference).max())}
    assert all(v > 1e-3 for v in wrong.values()), wrong
    with open(os.path.join(OUT, "rerank-bert-reference.json"), "w") as f:
        json.dump({"documents": documents, "max_length": 128, "wrong_choices_max_difference": wrong, "queries": cases},
                  f, ensure_ascii=False, indent=1)
    shutil.rmtree(staging)
    print(f"rerank_bert: {len(QUERIES)} queries x {len(documents)} documents, score spread {spread:.3f}, wrong choices {wrong}")


COLBERT_DIM = 16


def colbert():
    tokenizer = os.path.join(matrix.ROOT, "tests", "testdata", "models", "mpnet", "tokenizer.json")
    staging = tempfile.mkdtemp()
    torch.manual_seed(matrix.SEED)
    generator = torch.Generator().manual_seed(matrix.SEED + 42)
    vocab = json.load(open(tokenizer))["model"]["vocab"]
    config = transformers.BertConfig(vocab_size=len(vocab) + 1, pad_token_id=1, **SPLADE_SIZES)
    model = transformers.BertModel(config, add_pooling_layer=False)
    matrix.scale_weights(model, generator)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512,
    )
    fast.save_pretrained(staging)

    transformer = Transformer(staging)
    hidden = transformer.get_embedding_dimension()
    dense = Dense(hidden, COLBERT_DIM, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
    with torch.no_grad():
        # Norms of the projections well away from 1, so a missing Normalize cannot pass.
        dense.linear.weight.copy_(0.6 * torch.randn(dense.linear.weight.shape, generator=generator))
    st = MultiVectorEncoder(modules=[transformer, dense, MultiVectorMask(), Normalize(module_input_name="token_embeddings")])
    target = os.path.join(OUT, "colbert")
    shutil.rmtree(target, ignore_errors=True)
    st.save(target)
    os.remove(os.path.join(target, "README.md"))
    st = MultiVectorEncoder(target)

    texts = [t for _, t in matrix.TEXTS]
    tokens, truncated = matrix.token_counts(st, texts, "")
    vectors = [v.numpy() for v in st.encode(texts, batch_size=4)]
    queries = [v.numpy() for v in st.encode_query(texts, batch_size=4)]
    assert [len(v) for v in vectors] == tokens, ([len(v) for v in vectors], tokens)
    assert all(np.array_equal(q, d) for q, d in zip(queries, vectors)), "queries differ from documents"

    # What a plausible mistake would score on the same tests (min cosine, same count).
    def min_cos(a, b):
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return float((a * b).sum(axis=1).min())
    features = st.tokenize(texts)
    with torch.no_grad():
        states = st[0](dict(features))["token_embeddings"]
        projected = st[1](dict(token_embeddings=states))["token_embeddings"]
    mask = features["attention_mask"].bool()
    raw = [p[m].numpy() for p, m in zip(projected, mask)]
    norms = np.concatenate([np.linalg.norm(r, axis=1) for r in raw])
    shifted = min(min_cos(v[1:], v[:-1]) for v in vectors)
    wrong = {
        "no normalisation: largest |norm - 1|": float(np.abs(norms - 1).max()),
        "no normalisation: smallest |norm - 1|": float(np.abs(norms - 1).min()),
        "moved by one token: min cosine": shifted,
        "first token dropped: token count": "one fewer on every text",
    }
    assert np.abs(norms - 1).min() > 0.05, wrong
    assert shifted < 0.9, wrong
    assert states.shape[-1] != COLBERT_DIM  # unprojected states have another width

    reference = {
        "dimensions": COLBERT_DIM,
        "max_seq_length": st.max_seq_length,
        "wrong_choices": wrong,
        "texts": [{"name": name, "text": text, "tokens": n, "truncated": cut,
                   "vectors": [[float(f"{x:.7g}") for x in row] for row in v]}
                  for (name, text), n, cut, v in zip(matrix.TEXTS, tokens, truncated, vectors)],
    }
    with open(os.path.join(OUT, "colbert-reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
    shutil.rmtree(staging)
    print(f"colbert: {COLBERT_DIM} dimensions, tokens per text {min(tokens)}..{max(tokens)}, wrong choices {wrong}")


def main():
    matrix.check_versions()
    os.makedirs(OUT, exist_ok=True)
    only = sys.argv[1:] or ["splade", "rerank", "rerank_bert", "colbert"]
    if "splade" in only:
        splade()
    if "rerank" in only:
        rerank()
    if "rerank_bert" in only:
        rerank_bert()
    if "colbert" in only:
        colbert()


if __name__ == "__main__":
    main()
