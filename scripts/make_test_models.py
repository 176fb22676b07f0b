#!/usr/bin/env python3
"""The model matrix: tiny random sentence-transformers checkpoints and their reference vectors.

For each architecture the engine computes, one random checkpoint (fixed seed, odd sizes, weights
scaled up from transformers' initialisation so that a wrong position, offset, bucket or pooling
moves the vectors far past the tests' bounds):

  bert          BertModel, hidden 24, 3 heads, 3 layers, intermediate 52, 512 positions, the real
                all-MiniLM-L6-v2 vocabulary (its tokenizer.json is not committed: the tests take it
                from the installed model directory, and its SHA-256 is recorded here)
  xlm-roberta   XLMRobertaModel, hidden 36, 3 heads, 3 layers, intermediate 76, 514 positions,
                padding index 1, one token type, a SentencePiece-style Unigram tokenizer (Metaspace,
                <s> $A </s>) trained on multilingual text
  mpnet         MPNetModel, the same sizes, 32 relative-position buckets, a WordPiece tokenizer
                (BERT normaliser and pre-tokeniser, <s> $A </s>, as MPNet's)

each saved by sentence-transformers into four folders sharing one model.safetensors (and
tokenizer.json) beside them, under tests/testdata/models/<architecture>/:

  classic-mean  the 2.x form (pooling_mode_* flags, sentence_bert_config.json's max_seq_length:
                200 for BERT, 512 for the others), mean pooling, Normalize, no prompts
  classic-cls   the 2.x form, CLS pooling, max_seq_length 512, no Normalize, no prompts
  v6-mean       as sentence-transformers 6.x saves it ("pooling_mode": "mean", the length left to
                the tokenizer's model_max_length, 512), Normalize, prompts {"query": "query: ",
                "passage": "passage: "} with default_prompt_name "query"
  v6-cls        the 6.x form, CLS pooling, no Normalize, the same prompts

and tests/testdata/models/reference.json: the texts (Latin, Cyrillic, Greek, CJK, Arabic,
Devanagari, emoji, a typed <pad>, texts of 256..512 tokens and longer than 512), and for each
folder, as sentence-transformers encodes the folder assembled as the tests assemble it: the vectors
and token counts with no prompt and with each prompt by prompt_name, and for v6-mean the vectors
with truncate_dim=16 and normalisation (the Matryoshka tests); MPNet's relative-position buckets
as transformers computes them. Floats keep 7 significant digits.

tests/tests/st_config_forms.rs, tests/tests/model_matrix.rs and enclave-worker/tests/arch_reference.rs
read them.

ModernBERT (ModernBertModel: rotary positions, GeGLU, no biases, pre-norm LayerNorm without bias,
local and global attention layers) is written beside them, under tests/testdata/models/modernbert/
with its own reference.json (so that the file above stays as it was): hidden 36, 3 heads (head
dimension 12), 4 layers of which the first and the fourth global (global_attn_every_n_layers 3),
a local window of 16 (each token sees 8 on either side), intermediate 38, 8,192 positions, rotary
bases 160,000 (global) and 10,000 (local), a byte-level BPE tokenizer trained here ([CLS] $A
[SEP], as ModernBERT's), two folders (v6-mean: 6.x form, mean pooling, Normalize, the prompts;
classic-cls: classic form, CLS pooling, max_seq_length 8192) and the same texts plus one cut at
8,192 tokens. The generator refuses weights for which a wrong rotary base, no local window or
no rotary at all would keep the vectors within cosine 0.99 of the reference.

The tokenizer trainers are not deterministic, so the committed XLM-R, MPNet and ModernBERT
tokenizers are reused unless --retrain-tokenizers: with them a rerun rewrites every file byte for
byte.

Run by hand (torch from PyPI is several GB), never by setup or CI:
  python3 -m venv /tmp/stvenv
  /tmp/stvenv/bin/pip install -r scripts/make_test_models.requirements.txt
  bash scripts/setup-model.sh
  /tmp/stvenv/bin/python scripts/make_test_models.py [--model-dir DIR] [--retrain-tokenizers] [--only modernbert|qwen3|gemma3|nomic_bert|gte]
  rm -rf /tmp/stvenv
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

PINNED = {
    "torch": "2.15.0",
    "transformers": "5.24.0",
    "tokenizers": "0.23.3",
    "sentence_transformers": "6.2.0",
    "safetensors": "0.8.0",
    "numpy": "2.4.6",
}

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import sentence_transformers  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from sentence_transformers import SentenceTransformer, models  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 20261126
PROMPTS = {"query": "query: ", "passage": "passage: "}
MATRYOSHKA_FOLDER = "v6-mean"
MATRYOSHKA_DIM = 16
VOCAB = 900

ARCHS = {
    "bert": dict(hidden_size=24, num_attention_heads=3, num_hidden_layers=3, intermediate_size=52,
                 max_position_embeddings=512, hidden_act="gelu"),
    "xlm-roberta": dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=3, intermediate_size=76,
                        max_position_embeddings=514, hidden_act="gelu", layer_norm_eps=1e-5,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2),
}
ARCHS["mpnet"] = dict(ARCHS["xlm-roberta"])

# name, form, pooling, Normalize, stated max_seq_length (classic form only), prompts
FOLDERS = [
    ("classic-mean", "classic", "mean", True, None),
    ("classic-cls", "classic", "cls", False, None),
    ("v6-mean", "v6", "mean", True, PROMPTS),
    ("v6-cls", "v6", "cls", False, PROMPTS),
]


def classic_length(arch, folder):
    return 200 if (arch, folder) == ("bert", "classic-mean") else 512


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
    ("greek", "Ο γρήγορος καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί."),
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
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }
    wrong = {k: (got[k], v) for k, v in PINNED.items() if got[k] != v}
    if wrong:
        sys.exit(f"pinned versions differ (got, pinned): {wrong}")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def template(tok):
    ids = {t: tok.token_to_id(t) for t in ["<s>", "<pad>", "</s>", "<unk>"]}
    assert ids == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok


def unigram_tokenizer():
    """XLM-R's pipeline: NFKC-like normaliser, Metaspace, Unigram, <s> $A </s>."""
    tok = Tokenizer(tokenizers.models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=VOCAB, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>", max_piece_length=8
    )
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    return template(tok)


def wordpiece_tokenizer():
    """MPNet's pipeline: BERT normaliser and pre-tokeniser, WordPiece, <s> $A </s>."""
    tok = Tokenizer(tokenizers.models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    return template(tok)


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
            elif "position_embeddings" in name or "token_type" in name or "word_embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def base_checkpoint(arch, index, tokenizer, model_dir, staging):
    """A random transformers model with its tokenizer, saved to `staging`."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + index)
    sizes = ARCHS[arch]
    # With their poolers (which the engine ignores), so that loading a folder initialises nothing
    # at random and every folder saves the same weights.
    if arch == "bert":
        config = transformers.BertConfig(vocab_size=30522, **sizes)
        model = transformers.BertModel(config)
    elif arch == "xlm-roberta":
        config = transformers.XLMRobertaConfig(vocab_size=tokenizer.get_vocab_size(), type_vocab_size=1, **sizes)
        model = transformers.XLMRobertaModel(config)
    else:
        config = transformers.MPNetConfig(vocab_size=tokenizer.get_vocab_size(), relative_attention_num_buckets=32, **sizes)
        model = transformers.MPNetModel(config)
    scale_weights(model, generator)
    model.eval()
    model.save_pretrained(staging, safe_serialization=True)
    if arch == "bert":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(model_dir, name), staging)
        return
    cls = transformers.XLMRobertaTokenizerFast if arch == "xlm-roberta" else transformers.PreTrainedTokenizerFast
    fast = cls(
        tokenizer_object=tokenizer,
        bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=512,
    )
    fast.save_pretrained(staging)


def classic_form(folder, hidden, pooling, max_seq_length):
    """Rewrites a 6.x save as sentence-transformers 2.x wrote it."""
    flags = {
        "word_embedding_dimension": hidden,
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


def save_folder(arch, staging, name, form, pooling, normalize, prompts, saved):
    limit = classic_length(arch, name) if form == "classic" else None
    transformer = models.Transformer(staging, max_seq_length=limit)
    modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    kwargs = {"prompts": prompts, "default_prompt_name": "query"} if prompts else {}
    SentenceTransformer(modules=modules, device="cpu", **kwargs).save(saved)
    if form == "classic":
        classic_form(saved, ARCHS[arch]["hidden_size"], pooling, limit)
    else:
        stated = os.path.join(saved, "sentence_bert_config.json")
        if os.path.exists(stated):
            with open(stated) as f:
                assert "max_seq_length" not in json.load(f), "the 6.x form leaves the length to the tokenizer"


SHARED = ("model.safetensors", "tokenizer.json")
DROPPED = ("README.md", "vocab.txt", "special_tokens_map.json")


def commit_folder(saved, folder):
    shutil.rmtree(folder, ignore_errors=True)
    for root, _, files in os.walk(saved):
        for file in files:
            rel = os.path.relpath(os.path.join(root, file), saved)
            if rel in SHARED or rel in DROPPED:
                continue
            os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
            shutil.copy(os.path.join(saved, rel), os.path.join(folder, rel))


def assemble(arch_dir, name, tokenizer_path, target):
    """The folder as the tests assemble it: its files, the shared weights and the tokenizer."""
    shutil.copytree(os.path.join(arch_dir, name), target)
    shutil.copy(os.path.join(arch_dir, "model.safetensors"), target)
    shutil.copy(tokenizer_path, os.path.join(target, "tokenizer.json"))


def rounded(vectors):
    return [[float(f"{x:.7g}") for x in v] for v in vectors.tolist()]


def encode(st, texts, **kwargs):
    return st.encode(texts, batch_size=4, convert_to_numpy=True, **kwargs)


def token_counts(st, texts, prefix):
    limit = st.max_seq_length
    full = [len(st.tokenizer(prefix + t, truncation=False)["input_ids"]) for t in texts]
    return [min(n, limit) for n in full], [n > limit for n in full]


def references(st, form, prompts):
    """Vectors and token counts for no prompt and each prompt by name."""
    texts = [t for _, t in TEXTS]
    runs = {"": dict(prompt="")}
    for name in (prompts or {}):
        runs[name] = dict(prompt_name=name)
    out = {}
    for key, kwargs in runs.items():
        prefix = prompts[key] if key else ""
        tokens, truncated = token_counts(st, texts, prefix)
        out[key] = {"tokens": tokens, "truncated": truncated, "vectors": rounded(encode(st, texts, **kwargs))}
    if form == "v6":
        # The default prompt is what a plain encode() applies.
        plain = encode(st, texts)
        assert np.allclose(plain, encode(st, texts, prompt_name="query"), atol=1e-6), "default prompt"
    return out


def matryoshka(st, prompts):
    texts = [t for _, t in TEXTS]
    out = {}
    for key in [""] + list(prompts):
        kwargs = dict(prompt="") if not key else dict(prompt_name=key)
        truncated = encode(st, texts, truncate_dim=MATRYOSHKA_DIM, normalize_embeddings=True, **kwargs)
        full = encode(st, texts, **kwargs)
        cut = full[:, :MATRYOSHKA_DIM]
        assert np.allclose(truncated, cut / np.linalg.norm(cut, axis=1, keepdims=True), atol=1e-6)
        out[key] = rounded(truncated)
    return out


def sensitivity(arch, st, vectors):
    """The tests must notice a wrong position offset (and, for MPNet, a missing relative bias):
    recompute with the mistake and require the vectors to move far past the bf16 bound."""
    model = st[0].auto_model
    tok = st.tokenizer
    worst = 1.0
    for (_, text), ref in zip(TEXTS, vectors):
        enc = tok(text, truncation=True, max_length=510, return_tensors="pt")
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            wrong = model(input_ids=enc["input_ids"], position_ids=torch.arange(n)[None, :]).last_hidden_state[0]
        v = wrong.mean(0)
        v = v / v.norm()
        if n < 510:
            worst = min(worst, float(np.dot(v.numpy(), np.array(ref))))
    if worst > 0.99:
        sys.exit(f"{arch}: positions without the offset still give cosine {worst:.5f}: weights too weak to test")
    print(f"{arch}: positions from 0 instead of padding_idx+1: worst cosine {worst:.4f}")
    if arch == "mpnet":
        bias = model.encoder.relative_attention_bias.weight
        saved = bias.detach().clone()
        with torch.no_grad():
            bias.zero_()
        off = encode(st, [t for _, t in TEXTS], prompt="", normalize_embeddings=True)
        with torch.no_grad():
            bias.copy_(saved)
        worst = min(float(np.dot(a, np.array(r))) for a, r in zip(off, vectors))
        if worst > 0.99:
            sys.exit(f"mpnet: no relative bias still gives cosine {worst:.5f}")
        print(f"mpnet: without the relative position bias: worst cosine {worst:.4f}")


def pooling_differs(arch, entries):
    """CLS and mean pooling of the same weights must give clearly different vectors."""
    a, b = entries["classic-cls"]["runs"][""]["vectors"], entries["classic-mean"]["runs"][""]["vectors"]
    worst = min(abs(float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))) for x, y in zip(a, b))
    if worst > 0.99:
        sys.exit(f"{arch}: CLS and mean pooling agree to {worst:.5f}")


def buckets():
    """transformers' MPNet buckets for key − query from −700 to 700 (the encoder's own function is
    tested against these)."""
    rel = torch.arange(-700, 701)
    return transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(rel).tolist()


MODERNBERT = dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=4, intermediate_size=38,
                  max_position_embeddings=8192, local_attention=16, global_attn_every_n_layers=3,
                  hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False)
MODERNBERT_LENGTH = 8192
# name, form, pooling, Normalize, prompts
MODERNBERT_FOLDERS = [
    ("v6-mean", "v6", "mean", True, PROMPTS),
    ("classic-cls", "classic", "cls", False, None),
]
# Past 8,192 tokens with this tokenizer, so that one text is cut at the model's own length.
MODERNBERT_TEXTS = TEXTS + [("very-long-mixed", (LONG_EN + LONG_RU + LONG_ZH) * 40)]
MODERNBERT_SPECIALS = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"]


def bpe_tokenizer():
    """ModernBERT's pipeline: byte-level BPE (no normaliser), [CLS] $A [SEP]."""
    tok = Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=MODERNBERT_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in MODERNBERT_SPECIALS}
    assert ids == {t: i for i, t in enumerate(MODERNBERT_SPECIALS)}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 2)]
    )
    return tok


def modernbert_scale(model, generator):
    """Larger spreads than transformers' init, as scale_weights: norms around 1, embeddings 0.5,
    linear layers 1.5/sqrt(fan-in). ModernBERT has no biases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            assert not name.endswith(".bias"), name
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif "tok_embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def modernbert_model(config_kwargs, state=None):
    config = transformers.ModernBertConfig(**config_kwargs)
    model = transformers.ModernBertModel(config)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def modernbert_sensitivity(tok, config_kwargs, state, vectors, texts):
    """The tests must notice a wrong rotary base (the global and local ones swapped), a missing
    local window, or rotary positions missing altogether: each must move some text's mean-pooled
    vector below cosine 0.99."""
    thetas = dict(global_rope_theta=10_000.0, local_rope_theta=160_000.0)
    variants = {
        "rotary bases swapped": modernbert_model(dict(config_kwargs, **thetas), state),
        "no local window": modernbert_model(dict(config_kwargs, local_attention=4 * MODERNBERT_LENGTH), state),
    }
    def pooled(model, text, positions=None):
        enc = tok(text, truncation=True, max_length=MODERNBERT_LENGTH, return_tensors="pt")
        with torch.no_grad():
            out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=positions)
        v = out.last_hidden_state[0].mean(0)
        return (v / v.norm()).numpy()
    base = modernbert_model(config_kwargs, state)
    for name, model in list(variants.items()) + [("no rotary positions", base)]:
        worst = 1.0
        for text, ref in zip(texts, vectors):
            positions = None
            if name == "no rotary positions":
                n = len(tok(text, truncation=True, max_length=MODERNBERT_LENGTH)["input_ids"])
                positions = torch.zeros(1, n, dtype=torch.long)
            worst = min(worst, float(np.dot(pooled(model, text, positions), np.array(ref))))
        if worst > 0.99:
            sys.exit(f"modernbert: {name} still gives cosine {worst:.5f}: weights too weak to test")
        print(f"modernbert: {name}: worst cosine {worst:.4f}")


def modernbert(args):
    """The ModernBERT checkpoint, its two folders and tests/testdata/models/modernbert/reference.json."""
    arch_dir = os.path.join(args.out, "modernbert")
    os.makedirs(arch_dir, exist_ok=True)
    committed = os.path.join(arch_dir, "tokenizer.json")
    if os.path.exists(committed) and not args.retrain_tokenizers:
        tokenizer = Tokenizer.from_file(committed)
        tokenizer.no_padding()
        tokenizer.no_truncation()
    else:
        tokenizer = bpe_tokenizer()
    texts = [t for _, t in MODERNBERT_TEXTS]
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + len(ARCHS))
    config_kwargs = dict(MODERNBERT, vocab_size=tokenizer.get_vocab_size(), pad_token_id=1, cls_token_id=0,
                         bos_token_id=0, sep_token_id=2, eos_token_id=2)
    model = modernbert_model(config_kwargs)
    modernbert_scale(model, generator)
    layer_types = model.config.layer_types
    assert layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"], layer_types
    entry = {
        "model_type": "modernbert",
        "hidden_size": MODERNBERT["hidden_size"],
        "tokenizer": "committed",
        "layer_types": layer_types,
        "folders": {},
    }
    doc = {
        "generator": "scripts/make_test_models.py",
        "versions": PINNED,
        "seed": SEED,
        "prompts": PROMPTS,
        "texts": [{"name": n, "text": t} for n, t in MODERNBERT_TEXTS],
        "architectures": {"modernbert": entry},
    }
    with tempfile.TemporaryDirectory() as work:
        staging = os.path.join(work, "hf")
        model.save_pretrained(staging, safe_serialization=True)
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
            mask_token="[MASK]", model_max_length=MODERNBERT_LENGTH, model_input_names=["input_ids", "attention_mask"],
        )
        fast.save_pretrained(staging)
        if not os.path.exists(committed):
            shutil.copy(os.path.join(staging, "tokenizer.json"), committed)
        entry["tokenizer_sha256"] = sha256(committed)
        weights = None
        for name, form, pooling, normalize, prompts in MODERNBERT_FOLDERS:
            saved = os.path.join(work, name)
            limit = MODERNBERT_LENGTH if form == "classic" else None
            transformer = models.Transformer(staging, max_seq_length=limit)
            modules = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
            if normalize:
                modules.append(models.Normalize())
            kwargs = {"prompts": prompts, "default_prompt_name": "query"} if prompts else {}
            SentenceTransformer(modules=modules, device="cpu", **kwargs).save(saved)
            if form == "classic":
                classic_form(saved, MODERNBERT["hidden_size"], pooling, limit)
            commit_folder(saved, os.path.join(arch_dir, name))
            tensors = load_file(os.path.join(saved, "model.safetensors"))
            if weights is None:
                weights = tensors
                save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(arch_dir, "model.safetensors"))
            else:
                assert weights.keys() == tensors.keys() and all(torch.equal(weights[k], tensors[k]) for k in weights)
            assembled = os.path.join(work, name + ".assembled")
            assemble(arch_dir, name, committed, assembled)
            st = SentenceTransformer(assembled, device="cpu")
            assert st.max_seq_length == MODERNBERT_LENGTH, (name, st.max_seq_length)
            runs = {}
            for key in [""] + list(prompts or {}):
                prefix = prompts[key] if key else ""
                tokens, truncated = token_counts(st, texts, prefix)
                kw = dict(prompt_name=key) if key else dict(prompt="")
                vectors = st.encode(texts, batch_size=2, convert_to_numpy=True, **kw)
                runs[key] = {"tokens": tokens, "truncated": truncated, "vectors": rounded(vectors)}
            tokens = runs[""]["tokens"]
            assert any(t == MODERNBERT_LENGTH for t in tokens), "a text cut at 8,192"
            assert sum(t > MODERNBERT["local_attention"] for t in tokens) >= 5, "texts past the local window"
            entry["folders"][name] = {
                "form": form,
                "pooling": pooling,
                "normalize": normalize,
                "max_seq_length": MODERNBERT_LENGTH,
                "prompts": prompts or {},
                "default_prompt_name": "query" if prompts else None,
                "runs": runs,
            }
            if name == "v6-mean":
                modernbert_sensitivity(st.tokenizer, config_kwargs, weights, runs[""]["vectors"], texts)
        a = entry["folders"]["classic-cls"]["runs"][""]["vectors"]
        b = entry["folders"]["v6-mean"]["runs"][""]["vectors"]
        worst = min(abs(float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))) for x, y in zip(a, b))
        assert worst < 0.99, f"modernbert: CLS and mean pooling agree to {worst:.5f}"
    with open(os.path.join(arch_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"modernbert: {len(MODERNBERT_FOLDERS)} folders, {len(texts)} texts, written to {arch_dir}")


QWEN3 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
             intermediate_size=40, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu",
             attention_bias=False, use_sliding_window=False, tie_word_embeddings=True)
QWEN3_THETA = 1_000_000.0
# Qwen3-Embedding's own prompts: an instruction for queries, nothing for documents.
QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}
QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2/Qwen3's pre-tokenizer split (tokenizer.json of the Qwen3 models).
QWEN3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# name, form, max length (classic: max_seq_length; 6.x: the tokenizer's model_max_length), default prompt
QWEN3_FOLDERS = [
    ("classic-last", "classic", 8192, None),
    ("v6-last", "v6", 1000, "query"),
]
QWEN3_TEXTS = TEXTS + [
    ("typed-specials", "a <|endoftext|> b <|im_start|> c"),
    ("very-long-mixed", (LONG_EN + LONG_RU + LONG_ZH) * 40),
]


def qwen3_tokenizer():
    """Qwen3-Embedding's pipeline: NFC, Qwen's split then byte-level BPE, <|endoftext|> appended."""
    tok = Tokenizer(tokenizers.models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=QWEN3_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TRAINING * 4, trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in QWEN3_SPECIALS}
    assert ids == {t: i for i, t in enumerate(QWEN3_SPECIALS)}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="$A:0 <|endoftext|>:0", pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", 0)],
    )
    return tok


def qwen3_model(config_kwargs, state=None):
    model = transformers.Qwen3Model(transformers.Qwen3Config(**config_kwargs))
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def qwen3_scale(model, generator):
    """Larger spreads than transformers' init: norms (q_norm and k_norm included) around 1,
    embeddings 0.5, linear layers 1.5/sqrt(fan-in). Qwen3 has no biases."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            assert not name.endswith(".bias"), name
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (1.5 / p.shape[-1] ** 0.5))


def published_qwen3_config(path):
    """config.json as the published Qwen3-Embedding checkpoints carry it (transformers 4.51):
    rope_theta and the sliding-window fields at the top, no layer_types or rope_parameters."""
    with open(path) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    assert rope == {"rope_theta": QWEN3_THETA, "rope_type": "default"}, rope
    assert config.pop("layer_types") == ["full_attention"] * QWEN3["num_hidden_layers"]
    config.pop("dtype", None)
    config.update(rope_theta=QWEN3_THETA, rope_scaling=None, sliding_window=None, max_window_layers=QWEN3["num_hidden_layers"],
                  torch_dtype="float32", use_cache=True, architectures=["Qwen3ForCausalLM"])
    with open(path, "w") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)
        f.write("\n")


def qwen3_sensitivity(tok, config_kwargs, state, vectors, texts):
    """The tests must notice bidirectional attention, missing rotary positions, query heads
    paired with the wrong key/value heads, or missing q_norm/k_norm: each must move some text's
    last-token vector below cosine 0.99."""
    heads, kv, d = QWEN3["num_attention_heads"], QWEN3["num_key_value_heads"], QWEN3["head_dim"]
    def last(model, text, **kwargs):
        enc = tok(text, truncation=True, max_length=2048, return_tensors="pt")
        n = enc["input_ids"].shape[1]
        if kwargs.pop("bidirectional", False):
            kwargs["attention_mask"] = {"full_attention": torch.zeros(1, 1, n, n)}
        if kwargs.pop("no_rotary", False):
            kwargs["position_ids"] = torch.zeros(1, n, dtype=torch.long)
        with torch.no_grad():
            v = model(input_ids=enc["input_ids"], **kwargs).last_hidden_state[0, -1]
        return (v / v.norm()).numpy()
    # Query head slots 1 and 2 swapped: each then reads the other group's keys and values.
    order = [0, 2, 1, 3] if heads == 4 and kv == 2 else None
    assert order is not None
    swapped = {k: v.clone() for k, v in state.items()}
    for i in range(QWEN3["num_hidden_layers"]):
        q = state[f"layers.{i}.self_attn.q_proj.weight"].view(heads, d, -1)
        swapped[f"layers.{i}.self_attn.q_proj.weight"] = q[order].reshape(heads * d, -1)
        o = state[f"layers.{i}.self_attn.o_proj.weight"].view(-1, heads, d)
        swapped[f"layers.{i}.self_attn.o_proj.weight"] = o[:, order].reshape(-1, heads * d)
    no_norm = qwen3_model(config_kwargs, state)
    for layer in no_norm.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    base = qwen3_model(config_kwargs, state)
    variants = [
        ("bidirectional attention", base, dict(bidirectional=True)),
        ("no rotary positions", base, dict(no_rotary=True)),
        ("query heads on the other key/value group", qwen3_model(config_kwargs, swapped), {}),
        ("no q_norm/k_norm", no_norm, {}),
    ]
    for name, model, kwargs in variants:
        worst = min(float(np.dot(last(model, t, **dict(kwargs)), np.array(r) / np.linalg.norm(r))) for t, r in zip(texts, vectors))
        if worst > 0.99:
            sys.exit(f"qwen3: {name} still gives cosine {worst:.5f}: weights too weak to test")
        print(f"qwen3: {name}: worst cosine {worst:.4f}")


def qwen3(args):
    """The Qwen3 checkpoint, its two folders and tests/testdata/models/qwen3/reference.json."""
    arch_dir = os.path.join(args.out, "qwen3")
    os.makedirs(arch_dir, exist_ok=True)
    committed = os.path.join(arch_dir, "tokenizer.json")
    if os.path.exists(committed) and not args.retrain_tokenizers:
        tokenizer = Tokenizer.from_file(committed)
        tokenizer.no_padding()
        tokenizer.no_truncation()
    else:
        tokenizer = qwen3_tokenizer()
    texts = [t for _, t in QWEN3_TEXTS]
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED + len(ARCHS) + 1)
    config_kwargs = dict(QWEN3, vocab_size=tokenizer.get_vocab_size(), rope_parameters={"rope_theta": QWEN3_THETA, "rope_type": "default"},
                         pad_token_id=0, bos_token_id=0, eos_token_id=0)
    model = qwen3_model(config_kwargs)
    qwen3_scale(model, generator)
    entry = {"model_type": "qwen3", "hidden_size": QWEN3["hidden_size"], "tokenizer": "committed", "folders": {}}
    doc = {
        "generator": "scripts/make_test_models.py",
        "versions": PINNED,
        "seed": SEED,
        "prompts": QWEN3_PROMPTS,
        "texts": [{"name": n, "text": t} for n, t in QWEN3_TEXTS],
        "architectures": {"qwen3": entry},
    }
    with tempfile.TemporaryDirectory() as work:
        staging = os.path.join(work, "hf")
        model.save_pretrained(staging, safe_serialization=True)
        weights = load_file(os.path.join(staging, "model.safetensors"))
        save_file({k: v.contiguous() for k, v in sorted(weights.items())}, os.path.join(arch_dir, "model.safetensors"))
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>", padding_side="left",
            model_max_length=131072, model_input_names=["input_ids", "attention_mask"],
        )
        fast.save_pretrained(staging)
        if not os.path.exists(committed):
            shutil.copy(os.path.join(staging, "tokenizer.json"), committed)
        entry["tokenizer_sha256"] = sha256(committed)
        for name, form, limit, default in QWEN3_FOLDERS:
            saved = os.path.join(work, name)
            transformer = models.Transformer(staging, max_seq_length=limit if form == "classic" else None)
            pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="lasttoken", include_prompt=True)
            SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu", prompts=QWEN3_PROMPTS,
                                default_prompt_name=default).save(saved)
            if form == "classic":
                # Qwen3-Embedding's own files: the pooling flags, the stated length, the published config.
                flags = {"word_embedding_dimension": QWEN3["hidden_size"], "pooling_mode_cls_token": False,
                         "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                         "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                         "pooling_mode_lasttoken": True, "include_prompt": True}
                with open(os.path.join(saved, "1_Pooling", "config.json"), "w") as f:
                    json.dump(flags, f, indent=4)
                with open(os.path.join(saved, "sentence_bert_config.json"), "w") as f:
                    json.dump({"max_seq_length": limit, "do_lower_case": False}, f, indent=4)
                published_qwen3_config(os.path.join(saved, "config.json"))
            else:
                tc_path = os.path.join(saved, "tokenizer_config.json")
                with open(tc_path) as f:
                    tc = json.load(f)
                tc["model_max_length"] = limit
                with open(tc_path, "w") as f:
                    json.dump(tc, f, indent=2)
            commit_folder(saved, os.path.join(arch_dir, name))
            assembled = os.path.join(work, name + ".assembled")
            assemble(arch_dir, name, committed, assembled)
            st = SentenceTransformer(assembled, device="cpu")
            assert st.max_seq_length == limit, (name, st.max_seq_length)
            assert st.tokenizer.padding_side == "left"
            loaded = st[0].auto_model
            assert type(loaded).__name__ == "Qwen3Model", type(loaded)
            assert all(torch.equal(loaded.state_dict()[k], weights[k]) for k in weights)
            runs = {}
            for key in [""] + list(QWEN3_PROMPTS):
                prefix = QWEN3_PROMPTS[key] if key else ""
                tokens, truncated = token_counts(st, texts, prefix)
                kw = dict(prompt_name=key) if key else dict(prompt="")
                # Two to a batch: sentence-transformers pads a batch to its longest text, and
                # attention's scores over 8,192 padded tokens take gigabytes per text.
                vectors = st.encode(texts, batch_size=2, convert_to_numpy=True, **kw)
                # Left padding shifts a batched text's rotary positions; one by one they start at 0.
                alone = np.stack([st.encode([t], convert_to_numpy=True, **kw)[0] for t in texts])
                agree = min(float(np.dot(a, b)) for a, b in zip(vectors, alone))
                assert agree > 0.999999, (name, key, agree)
                runs[key] = {"tokens": tokens, "truncated": truncated, "vectors": rounded(vectors), "batched_vs_alone": agree}
                print(f"qwen3/{name} prompt {key!r}: batched and one by one agree to {agree:.8f}")
            tokens = runs[""]["tokens"]
            assert any(t == limit for t in tokens), (name, "a text cut at the limit")
            entry["folders"][name] = {
                "form": form,
                "pooling": "lasttoken",
                "normalize": True,
                "max_seq_length": limit,
                "prompts": QWEN3_PROMPTS,
                "default_prompt_name": default,
                "runs": runs,
            }
            if form == "classic":
                qwen3_sensitivity(st.tokenizer, config_kwargs, weights, runs[""]["vectors"], texts)
                # Mean pooling of the same states must differ too.
                mean = SentenceTransformer(modules=[st[0], models.Pooling(QWEN3["hidden_size"], pooling_mode="mean"), models.Normalize()], device="cpu")
                worst = min(float(np.dot(a, b)) for a, b in zip(mean.encode(texts, batch_size=2, prompt=""), runs[""]["vectors"]))
                assert worst < 0.99, f"qwen3: mean and last-token pooling agree to {worst:.5f}"
                print(f"qwen3: mean instead of last-token pooling: worst cosine {worst:.4f}")
    with open(os.path.join(arch_dir, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"qwen3: {len(QWEN3_FOLDERS)} folders, {len(texts)} texts, written to {arch_dir}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=os.path.join(ROOT, ".ephem", "models", "all-MiniLM-L6-v2"))
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "testdata", "models"))
    parser.add_argument("--retrain-tokenizers", action="store_true")
    parser.add_argument("--only", choices=["modernbert", "qwen3", "gemma3", "nomic_bert", "gte"], help="write only this architecture's folder")
    args = parser.parse_args()
    check_versions()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    if args.only == "modernbert":
        modernbert(args)
        return
    if args.only == "qwen3":
        qwen3(args)
        return
    if args.only == "gemma3":
        import make_test_models_gemma3
        make_test_models_gemma3.gemma3(args)
        return
    if args.only == "nomic_bert":
        import make_test_models_nomic
        make_test_models_nomic.nomic(args)
        return
    if args.only == "gte":
        import make_test_models_gte
        make_test_models_gte.gte(args)
        return
    doc = {
        "generator": "scripts/make_test_models.py",
        "versions": PINNED,
        "seed": SEED,
        "prompts": PROMPTS,
        "matryoshka": {"folder": MATRYOSHKA_FOLDER, "dimensions": MATRYOSHKA_DIM},
        "texts": [{"name": n, "text": t} for n, t in TEXTS],
        "architectures": {},
    }
    for index, arch in enumerate(ARCHS):
        arch_dir = os.path.join(args.out, arch)
        os.makedirs(arch_dir, exist_ok=True)
        committed = os.path.join(arch_dir, "tokenizer.json")
        tokenizer = None
        if arch == "bert":
            tokenizer_path = os.path.join(args.model_dir, "tokenizer.json")
        elif os.path.exists(committed) and not args.retrain_tokenizers:
            tokenizer_path = committed
            tokenizer = Tokenizer.from_file(committed)
            tokenizer.no_padding()
            tokenizer.no_truncation()
        else:
            tokenizer = unigram_tokenizer() if arch == "xlm-roberta" else wordpiece_tokenizer()
            tokenizer_path = None
        entry = {
            "model_type": arch,
            "hidden_size": ARCHS[arch]["hidden_size"],
            "tokenizer": "installed all-MiniLM-L6-v2" if arch == "bert" else "committed",
            "folders": {},
        }
        with tempfile.TemporaryDirectory() as work:
            staging = os.path.join(work, "hf")
            base_checkpoint(arch, index, tokenizer, args.model_dir, staging)
            if tokenizer_path is None:
                shutil.copy(os.path.join(staging, "tokenizer.json"), committed)
                tokenizer_path = committed
            entry["tokenizer_sha256"] = sha256(tokenizer_path)
            weights = None
            for name, form, pooling, normalize, prompts in FOLDERS:
                saved = os.path.join(work, name)
                save_folder(arch, staging, name, form, pooling, normalize, prompts, saved)
                commit_folder(saved, os.path.join(arch_dir, name))
                tensors = load_file(os.path.join(saved, "model.safetensors"))
                if weights is None:
                    weights = tensors
                    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(arch_dir, "model.safetensors"))
                else:
                    assert weights.keys() == tensors.keys() and all(torch.equal(weights[k], tensors[k]) for k in weights)
                # Reload the folder as the tests assemble it: the vectors are those of the files as committed.
                assembled = os.path.join(work, name + ".assembled")
                assemble(arch_dir, name, tokenizer_path, assembled)
                st = SentenceTransformer(assembled, device="cpu")
                limit = st.max_seq_length
                assert limit == (classic_length(arch, name) if form == "classic" else 512), (arch, name, limit)
                folder = {
                    "form": form,
                    "pooling": pooling,
                    "normalize": normalize,
                    "max_seq_length": limit,
                    "prompts": prompts or {},
                    "default_prompt_name": "query" if prompts else None,
                    "runs": references(st, form, prompts),
                }
                if name == MATRYOSHKA_FOLDER:
                    folder["truncate_dim"] = matryoshka(st, prompts)
                if arch != "bert" and name == "classic-mean":
                    sensitivity(arch, st, folder["runs"][""]["vectors"])
                tokens = folder["runs"][""]["tokens"]
                assert any(t == limit for t in tokens), (arch, name, "a text cut at the limit")
                if limit == 512:
                    assert any(256 < t < 512 for t in tokens), (arch, name, "a text of 256..512 tokens")
                entry["folders"][name] = folder
            pooling_differs(arch, entry["folders"])
        doc["architectures"][arch] = entry
        print(f"{arch}: {len(FOLDERS)} folders, {len(TEXTS)} texts, written to {arch_dir}")
    doc["buckets"] = {"from": -700, "to": 700, "values": buckets()}
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    modernbert(args)
    qwen3(args)
    import make_test_models_gemma3
    make_test_models_gemma3.gemma3(args)
    import make_test_models_nomic
    make_test_models_nomic.nomic(args)


if __name__ == "__main__":
    main()
