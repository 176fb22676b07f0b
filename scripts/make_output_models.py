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

  rerank_qwen3  the Qwen3 reranker as sentence-transformers 6.2 saves a CrossEncoder over a causal
           language model: Transformer with transformer_task "text-generation" (pairs as flat
           query/document chat messages) over Qwen3ForCausalLM (the Qwen3 test model's sizes, its
           lm_head tied to the word embeddings as Qwen3-Reranker-0.6B's config states), then
           LogitScore over "yes" and "no"; Qwen3-Reranker-0.6B's chat template; the Qwen3 test
           tokenizer with "yes", "no", <think> and </think> added; max length 256.

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
min-cosine 0.9999 test with the same count. rerank_qwen3: as rerank, plus the template reduced
to fixed text around the instruction, query and document (checked to rebuild every pair's tokens:
the render tokenized whole, cut at 256, the template's tail written back over a cut pair's last
tokens); it refuses weights for which scoring the first token, dropping the template, swapping yes
and no, or skipping the final norm would move no score by 0.05.

Run by hand in the venv of make_test_models.py (the same pinned versions), never by setup or CI:
  /tmp/stvenv/bin/python scripts/make_output_models.py [splade] [rerank] [rerank_bert] [colbert] [rerank_qwen3]

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
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
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


# Qwen3-Reranker-0.6B's chat template, as its tokenizer_config.json states it for
# sentence-transformers: the instruction from a system message (else its default), the query and
# the document by role, the assistant turn opened with an empty think block.
QWEN3_RERANK_TEMPLATE = (
    '{%- set instruction = messages | selectattr("role", "eq", "system") | map(attribute="content")'
    ' | first | default("Given a web search query, retrieve relevant passages that answer the query")'
    " -%}\n"
    '{%- set query_text = messages | selectattr("role", "eq", "query") | map(attribute="content")'
    " | first -%}\n"
    '{%- set document_text = messages | selectattr("role", "eq", "document") | map(attribute="content")'
    " | first -%}\n"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the"
    ' Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: {{ instruction }}\n<Query>: {{ query_text }}\n"
    "<Document>: {{ document_text }}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n"
)
RERANK_QWEN3_LENGTH = 256
RERANK_QWEN3_ROW = 0.1


def qwen3_rerank_tokenizer():
    """The Qwen3 test tokenizer with what the reranker needs: "yes" and "no" as vocabulary
    entries (the ids LogitScore reads), <think> and </think> as added tokens (not special, as in
    Qwen3's), and Qwen3's ByteLevel post-processor (a chat render is tokenized without special
    tokens added)."""
    with open(os.path.join(matrix.ROOT, "tests", "testdata", "models", "qwen3", "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    for word in ["yes", "no"]:
        assert word not in vocab
        vocab[word] = len(vocab)
    for word in ["<think>", "</think>"]:
        tok["added_tokens"].append({"id": len(vocab) + len(tok["added_tokens"]) - 3, "content": word, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False, "special": False})
    tok["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return tokenizers.Tokenizer.from_str(json.dumps(tok))


def rerank_qwen3():
    """The Qwen3 reranker: a Qwen3ForCausalLM (the Qwen3 test model's sizes, its lm_head tied to
    the word embeddings as Qwen3-Reranker-0.6B's config states) scored by LogitScore over "yes"
    and "no" at the last position, each pair rendered through the chat template."""
    from sentence_transformers.cross_encoder.modules import LogitScore
    tok = qwen3_rerank_tokenizer()
    ids = {w: tok.token_to_id(w) for w in ["yes", "no", "<think>", "</think>"]}
    assert len(set(ids.values())) == 4 and None not in ids.values(), ids
    staging = tempfile.mkdtemp()
    torch.manual_seed(matrix.SEED)
    generator = torch.Generator().manual_seed(matrix.SEED + 43)
    config = transformers.Qwen3Config(**matrix.QWEN3, vocab_size=tok.get_vocab_size(),
                                      rope_parameters={"rope_theta": matrix.QWEN3_THETA, "rope_type": "default"},
                                      pad_token_id=0, bos_token_id=0, eos_token_id=0)
    assert config.tie_word_embeddings
    model = transformers.Qwen3ForCausalLM(config)
    matrix.qwen3_scale(model.model, generator)
    with torch.no_grad():
        # The two rows the score reads: small enough that the scores spread over (0, 1).
        embed = model.model.embed_tokens.weight
        for i in (ids["yes"], ids["no"]):
            embed[i] = RERANK_QWEN3_ROW * torch.randn(embed.shape[1], generator=generator)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left",
        model_max_length=RERANK_QWEN3_LENGTH, model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = QWEN3_RERANK_TEMPLATE
    fast.save_pretrained(staging)
    transformer = Transformer(
        staging, transformer_task="text-generation",
        modality_config={"text": {"method": "forward", "method_output_name": "logits"},
                         "message": {"method": "forward", "method_output_name": "logits", "format": "flat"}},
        module_output_name="causal_logits",
    )
    ce = CrossEncoder(modules=[transformer, LogitScore(true_token_id=ids["yes"], false_token_id=ids["no"])])
    target = os.path.join(OUT, "rerank-qwen3")
    shutil.rmtree(target, ignore_errors=True)
    ce.save(target)
    os.remove(os.path.join(target, "README.md"))
    ce = CrossEncoder(target)
    assert ce.max_seq_length == RERANK_QWEN3_LENGTH, ce.max_seq_length
    assert type(ce[0].auto_model).__name__ == "Qwen3ForCausalLM", type(ce[0].auto_model)
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid), ce.activation_fn
    assert "lm_head.weight" not in load_file(os.path.join(target, "model.safetensors")), "the published form is tied"

    # The template as fixed text around markers: what onboarding must reduce it to.
    marks = {"instruction": "\ue000I\ue001", "query": "\ue000Q\ue001", "document": "\ue000D\ue001"}
    def render(system):
        messages = ([{"role": "system", "content": marks["instruction"]}] if system else []) + [
            {"role": "query", "content": marks["query"]}, {"role": "document", "content": marks["document"]}]
        return ce.tokenizer.apply_chat_template(messages, tokenize=False)
    prefix, rest = render(True).split(marks["instruction"])
    after_instruction, rest = rest.split(marks["query"])
    after_query, suffix = rest.split(marks["document"])
    default = render(False)
    instruction = default[len(prefix):default.index(after_instruction + marks["query"])]
    template = {"prefix": prefix, "after_instruction": after_instruction, "after_query": after_query, "suffix": suffix,
                "instruction": instruction}
    assert default == prefix + instruction + after_instruction + marks["query"] + after_query + marks["document"] + suffix

    documents = [t for _, t in matrix.TEXTS]
    cases = []
    for query in QUERIES:
        pairs = [(query, d) for d in documents]
        scores = ce.predict(pairs, batch_size=4)
        ranked = ce.rank(query, documents, batch_size=4)
        rows = [ce.preprocess([p]) for p in pairs]
        # The pieces rebuild every pair's tokens: the whole render tokenized without added special
        # tokens, cut at the length, the template's tail written back over a cut pair's last tokens.
        def rebuilt(q, d):
            ids = tok.encode(prefix + instruction + after_instruction + q + after_query + d + suffix, add_special_tokens=False).ids
            ids = ids[:RERANK_QWEN3_LENGTH]
            if len(ids) == RERANK_QWEN3_LENGTH:
                a, b = (tok.encode(prefix + instruction + after_instruction + f + after_query + f + suffix, add_special_tokens=False).ids
                        for f in ("0", "1 2 3 4"))
                n = next(i for i in range(min(len(a), len(b))) if a[-1 - i] != b[-1 - i])
                ids[-n:] = a[-n:]
            return ids
        assert all(rebuilt(*p) == r["input_ids"][0].tolist() for p, r in zip(pairs, rows)), query
        tokens = [int(r["attention_mask"].sum()) for r in rows]
        full = [len(tok.encode(ce.tokenizer.apply_chat_template([{"role": "query", "content": query}, {"role": "document", "content": d}], tokenize=False), add_special_tokens=False).ids) for d in documents]
        alone = np.array([float(ce.predict([p])[0]) for p in pairs])
        agree = float(np.abs(alone - scores).max())
        assert agree < 1e-5, f"batched and one by one differ by {agree}"
        cases.append({"query": query, "scores": [float(f"{x:.7g}") for x in scores], "order": [r["corpus_id"] for r in ranked],
                      "tokens": tokens, "truncated": [f > RERANK_QWEN3_LENGTH for f in full],
                      "ids": [r["input_ids"][0].tolist() for r in rows]})
    assert any(any(c["truncated"]) for c in cases) and not all(all(c["truncated"]) for c in cases)
    spread = max(max(c["scores"]) - min(c["scores"]) for c in cases)
    assert spread > 0.2, f"scores too close to tell an order: {spread}"

    # What a wrong choice would cost, on the first query's pairs.
    q = QUERIES[0]
    yes, no = ids["yes"], ids["no"]
    def score_ids(rows, position=-1, final_norm=True):
        body = ce[0].auto_model.model
        norm = body.norm
        if not final_norm:
            body.norm = torch.nn.Identity()
        out = []
        for r in rows:
            with torch.no_grad():
                h = body(input_ids=torch.tensor([r])).last_hidden_state[0]
                logits = ce[0].auto_model.lm_head(h[position])
            out.append(float(torch.sigmoid(logits[yes] - logits[no])))
        body.norm = norm
        return np.array(out)
    reference = np.array(cases[0]["scores"])
    rows = cases[0]["ids"]
    plain = [tok.encode(q + d, add_special_tokens=False).ids[:RERANK_QWEN3_LENGTH] for d in documents]
    wrong = {
        "first token": float(np.abs(score_ids(rows, position=0) - reference).max()),
        "no template": float(np.abs(score_ids(plain) - reference).max()),
        "yes and no swapped": float(np.abs((1 - reference) - reference).max()),
        "no final norm": float(np.abs(score_ids(rows, final_norm=False) - reference).max()),
    }
    exact = float(np.abs(score_ids(rows) - reference).max())
    assert exact < 1e-5, f"the hand-computed score differs by {exact}"
    if min(wrong.values()) < 0.05:
        sys.exit(f"rerank_qwen3: a wrong choice stays too close: {wrong}")
    for c in cases:
        del c["ids"]
    with open(os.path.join(OUT, "rerank-qwen3-reference.json"), "w") as f:
        json.dump({"documents": documents, "max_length": RERANK_QWEN3_LENGTH, "yes": yes, "no": no, "template": template,
                   "wrong_choices_max_difference": wrong, "queries": cases}, f, ensure_ascii=False, indent=1)
    shutil.rmtree(staging)
    print(f"rerank_qwen3: {len(QUERIES)} queries x {len(documents)} documents, score spread {spread:.3f}, "
          f"cut pairs {sum(sum(c['truncated']) for c in cases)}, wrong choices {wrong}")


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
    only = sys.argv[1:] or ["splade", "rerank", "rerank_bert", "colbert", "rerank_qwen3"]
    if "splade" in only:
        splade()
    if "rerank" in only:
        rerank()
    if "rerank_bert" in only:
        rerank_bert()
    if "colbert" in only:
        colbert()
    if "rerank_qwen3" in only:
        rerank_qwen3()


if __name__ == "__main__":
    main()
