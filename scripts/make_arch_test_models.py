#!/usr/bin/env python3
"""Tiny random XLM-RoBERTa and MPNet sentence-transformers models, and their reference vectors.

Writes, under enclave-worker/testdata/arch-models/:
  xlm-roberta/   XLMRobertaModel (hidden 96, 3 heads, 3 layers, intermediate 200, 514 positions,
                 pad 1, one token type) with a SentencePiece-style Unigram tokenizer (Metaspace,
                 <s> $A </s>) trained here on a multilingual text set; mean pooling, Normalize,
                 max_seq_length 512.
  mpnet/         MPNetModel (same sizes, 32 relative-position buckets) with a WordPiece tokenizer
                 trained here (BERT normaliser and pre-tokeniser, <s> $A </s>, as MPNet's);
                 mean pooling, Normalize, max_seq_length 512.
  reference.json for each model: every text, its token count, whether it was truncated and the
                 sentence-transformers vector; plus MPNet's relative-position buckets as
                 transformers computes them, for the bucket function's own test.

enclave-worker/tests/arch_reference.rs checks the fused encoder against them (cosine >= 0.9999 in
f32, >= 0.999 in bf16).

No tokenizer with the real XLM-R SentencePiece vocabulary ships on PyPI in a size worth
committing (250,002 pieces: its embedding table alone would be ~100 MB at hidden 96), nor does
MPNet's (30,527), so both tokenizers are trained here with the `tokenizers` package: the same
model types, normalisers, pre-tokenisers and special tokens as the real ones, a small vocabulary.
Weights are random (fixed seed) and scaled up from transformers' initialisation so that a wrong
position, offset or bucket changes the vectors well beyond the tests' bounds (checked below:
the script refuses to write models on which such a mistake would go unnoticed).

Run by hand (pulls PyTorch, several GB), never by setup or CI:
  python3 -m venv /tmp/archenv
  /tmp/archenv/bin/pip install -r scripts/make_arch_test_models.requirements.txt
  /tmp/archenv/bin/python scripts/make_arch_test_models.py [--retrain-tokenizers]
  rm -rf /tmp/archenv
"""

import json
import os
import shutil
import sys


PINNED = {
    "torch": "2.15.0",
    "transformers": "5.23.0",
    "tokenizers": "0.23.3",
    "sentence_transformers": "6.2.0",
    "numpy": "2.4.6",
}

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer, models  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "enclave-worker", "testdata", "arch-models")
SEED = 20261126
MAX_SEQ_LENGTH = 512
VOCAB = 900

SIZES = dict(
    hidden_size=96,
    num_attention_heads=3,
    num_hidden_layers=3,
    intermediate_size=200,
    max_position_embeddings=514,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
)

# Tokenizer training text: several scripts, so that the vocabulary has pieces for each.
TRAINING = [
    "The quick brown fox jumps over the lazy dog while the river runs past the old mill.",
    "Embeddings map sentences to vectors; similar meanings land close together in the space.",
    "Le renard brun rapide saute par-dessus le chien paresseux près de la rivière.",
    "Der schnelle braune Fuchs springt über den faulen Hund, während es draußen regnet.",
    "El zorro marrón rápido salta sobre el perro perezoso junto al río tranquilo.",
    "Быстрая коричневая лиса прыгает через ленивую собаку у старой мельницы.",
    "Москва — столица России, крупнейший по численности населения город страны.",
    "敏捷的棕色狐狸跳过了懒狗。今天的天气很好，我们去公园散步吧。",
    "東京は日本の首都です。桜の季節には多くの人が公園に集まります。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘습니다. 서울은 한국의 수도입니다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول. القاهرة هي عاصمة مصر.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "Numbers 0123456789, prices $19.99 and €5, dates 2026-11-26, code fn main() {}.",
    "Emoji in text: 😀 🎉 🚀 ❤️ 👍 — people use them everywhere now.",
]

LONG_EN = (
    "The history of the printing press is often told as the story of a single inventor, but the "
    "machine assembled in Mainz around 1450 combined several older technologies: the screw press "
    "used for olives and grapes, oil-based inks, paper that had travelled from China into Europe, "
    "and a method for casting movable type from a hand mould. What was new was the system. "
)
LONG_RU = (
    "История книгопечатания часто рассказывается как история одного изобретателя, но машина, "
    "собранная в Майнце около 1450 года, объединила несколько более старых технологий. "
)
LONG_ZH = "印刷术的历史常常被讲述为一位发明家的故事，但这台机器结合了几种更古老的技术。"

TEXTS = [
    ("english", "What is the capital of France?"),
    ("french", "Quelle est la capitale de la France ? Paris, bien sûr."),
    ("german", "Die Hauptstadt Deutschlands ist Berlin, eine Stadt mit langer Geschichte."),
    ("spanish", "¿Dónde está la biblioteca? Está al lado del ayuntamiento."),
    ("russian", "Какая столица у Франции? Париж — красивый город."),
    ("ukrainian", "Київ — столиця України, місто на Дніпрі."),
    ("chinese", "法国的首都是哪里？巴黎是一个美丽的城市。"),
    ("japanese", "フランスの首都はどこですか？パリは美しい街です。"),
    ("korean", "프랑스의 수도는 어디입니까? 파리는 아름다운 도시입니다."),
    ("arabic", "ما هي عاصمة فرنسا؟ باريس مدينة جميلة."),
    ("hindi", "फ्रांस की राजधानी क्या है?"),
    ("emoji", "🚀🎉 launch day!!! 😀👍🏽 ❤️‍🔥"),
    ("mixed", "Paris 巴黎 Париж باريس パリ 파리 — one city, six scripts."),
    ("code", "def f(x): return {'a': [1, 2, 3], 'b': x ** 2}  # comment"),
    ("whitespace", "  spaces   inside\tand\nnewlines  "),
    ("special-token-text", "a <pad> b </s> c <s> d"),
    ("single-char", "x"),
    ("medium-english", (LONG_EN * 2)[:800]),
    ("medium-russian", LONG_RU * 3),
    ("long-english", (LONG_EN * 12)[:6000]),
    ("long-russian", LONG_RU * 14),
    ("long-chinese", LONG_ZH * 30),
    ("long-mixed", (LONG_EN + LONG_RU + LONG_ZH) * 6),
]


def check_versions():
    got = {
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "numpy": np.__version__,
    }
    wrong = {k: (got[k], v) for k, v in PINNED.items() if got[k] != v}
    if wrong:
        sys.exit(f"pinned versions differ (got, pinned): {wrong}")


def unigram_tokenizer():
    """XLM-R's pipeline: NFKC-like normaliser, Metaspace, Unigram, <s> $A </s>."""
    tok = Tokenizer(tokenizers.models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        max_piece_length=8,
    )
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    ids = {t: tok.token_to_id(t) for t in ["<s>", "<pad>", "</s>", "<unk>"]}
    assert ids == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok


def wordpiece_tokenizer():
    """MPNet's pipeline: BERT normaliser and pre-tokeniser, WordPiece, <s> $A </s>."""
    tok = Tokenizer(tokenizers.models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    ids = {t: tok.token_to_id(t) for t in ["<s>", "<pad>", "</s>", "<unk>"]}
    assert ids == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok


def scale_weights(model, generator):
    """Redraws every parameter with larger spreads than transformers' init (std 0.02), so that
    positions, biases and the relative-position table all visibly shape the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif "LayerNorm.bias" in name or name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            elif "relative_attention_bias" in name:
                p.copy_(1.5 * torch.randn(p.shape, generator=generator))
            elif "position_embeddings" in name or "token_type" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            elif "word_embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / fan_in**0.5))


def build(kind, directory, tokenizer):
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + (0 if kind == "xlm-roberta" else 1))
    vocab = tokenizer.get_vocab_size()
    if kind == "xlm-roberta":
        config = transformers.XLMRobertaConfig(vocab_size=vocab, type_vocab_size=1, **SIZES)
        model = transformers.XLMRobertaModel(config, add_pooling_layer=False)
        fast = transformers.XLMRobertaTokenizerFast(
            tokenizer_object=tokenizer,
            bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
            unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=MAX_SEQ_LENGTH,
        )
    else:
        config = transformers.MPNetConfig(vocab_size=vocab, relative_attention_num_buckets=32, **SIZES)
        model = transformers.MPNetModel(config, add_pooling_layer=False)
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
            unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=MAX_SEQ_LENGTH,
        )
    scale_weights(model, generator)
    model.eval()

    staging = directory + ".hf"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    fast.save_pretrained(staging)
    transformer = models.Transformer(staging, max_seq_length=MAX_SEQ_LENGTH)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    shutil.rmtree(directory, ignore_errors=True)
    st.save(directory)
    shutil.rmtree(staging)
    for extra in ["README.md"]:
        path = os.path.join(directory, extra)
        if os.path.exists(path):
            os.remove(path)


def reference(kind, directory):
    st = SentenceTransformer(directory, device="cpu")
    assert st.max_seq_length == MAX_SEQ_LENGTH, st.max_seq_length
    ours = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    ours.no_padding()
    ours.enable_truncation(MAX_SEQ_LENGTH)
    texts = [t for _, t in TEXTS]
    vectors = st.encode(texts, batch_size=4, normalize_embeddings=True, convert_to_numpy=True)
    hf = st.tokenizer(texts, truncation=True, max_length=MAX_SEQ_LENGTH)
    cases = []
    for (name, text), vector, ids in zip(TEXTS, vectors, hf["input_ids"]):
        enc = ours.encode(text)
        # The reference must come from the same tokens the enclave computes from tokenizer.json.
        assert enc.ids == list(ids), (kind, name, enc.ids[:20], list(ids)[:20])
        full = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        full.no_padding()
        full.no_truncation()
        length = len(full.encode(text).ids)
        cases.append(
            {
                "name": name,
                "text": text,
                "tokens": len(ids),
                "truncated": length > MAX_SEQ_LENGTH,
                "vector": [float(f"{v:.8g}") for v in vector.tolist()],
            }
        )
    assert any(c["truncated"] for c in cases), "no text longer than the limit"
    assert any(c["tokens"] > 256 and not c["truncated"] for c in cases), "no text between 256 and 512 tokens"
    return st, cases


def sensitivity(kind, st, cases):
    """The tests must notice a wrong position offset (and, for MPNet, a missing relative bias):
    recompute with the mistake and require the vectors to move far past the bf16 bound."""
    model = st[0].auto_model
    tok = st.tokenizer
    worst = 1.0
    for case in cases:
        enc = tok(case["text"], truncation=True, max_length=MAX_SEQ_LENGTH - 2, return_tensors="pt")
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            wrong = model(input_ids=enc["input_ids"], position_ids=torch.arange(n)[None, :]).last_hidden_state[0]
        v = wrong.mean(0)
        v = v / v.norm()
        ref = np.array(case["vector"])
        if case["tokens"] == n:
            worst = min(worst, float(np.dot(v.numpy(), ref)))
    if worst > 0.99:
        sys.exit(f"{kind}: positions without the offset still give cosine {worst:.5f}: weights too weak to test")
    print(f"{kind}: positions from 0 instead of padding_idx+1: worst cosine {worst:.4f}")
    if kind == "mpnet":
        layer_bias = model.encoder.relative_attention_bias.weight
        saved = layer_bias.detach().clone()
        with torch.no_grad():
            layer_bias.zero_()
        off = st.encode([c["text"] for c in cases], normalize_embeddings=True)
        with torch.no_grad():
            layer_bias.copy_(saved)
        worst = min(float(np.dot(a, np.array(c["vector"]))) for a, c in zip(off, cases))
        if worst > 0.99:
            sys.exit(f"mpnet: no relative bias still gives cosine {worst:.5f}")
        print(f"mpnet: without the relative position bias: worst cosine {worst:.4f}")


def buckets():
    """transformers' MPNet buckets for key − query from −700 to 700 (the encoder's own function is
    tested against these)."""
    rel = torch.arange(-700, 701)
    return transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(rel).tolist()


def main():
    check_versions()
    os.makedirs(OUT, exist_ok=True)
    # The tokenizer trainers are not deterministic (the pieces' order and scores vary between
    # runs), so the committed tokenizers are reused unless --retrain-tokenizers: with them, the
    # weights (seeded) and the reference vectors come out the same on every run.
    retrain = "--retrain-tokenizers" in sys.argv[1:]
    for kind, make in [("xlm-roberta", unigram_tokenizer), ("mpnet", wordpiece_tokenizer)]:
        directory = os.path.join(OUT, kind)
        committed = os.path.join(directory, "tokenizer.json")
        if os.path.exists(committed) and not retrain:
            tokenizer = Tokenizer.from_file(committed)
            tokenizer.no_padding()
            tokenizer.no_truncation()
        else:
            tokenizer = make()
        build(kind, directory, tokenizer)
        st, cases = reference(kind, directory)
        sensitivity(kind, st, cases)
        doc = {
            "generator": "scripts/make_arch_test_models.py",
            "versions": PINNED,
            "model_type": kind,
            "pooling": "mean",
            "normalize": True,
            "max_tokens": MAX_SEQ_LENGTH,
            "cases": cases,
        }
        if kind == "mpnet":
            doc["buckets"] = {"from": -700, "to": 700, "values": buckets()}
        with open(os.path.join(OUT, f"{kind}.reference.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        tokens = [c["tokens"] for c in cases]
        print(f"{kind}: {len(cases)} texts, tokens {min(tokens)}..{max(tokens)}, written to {directory}")


if __name__ == "__main__":
    main()
