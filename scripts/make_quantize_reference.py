#!/usr/bin/env python3
"""Writes tests/testdata/quantize/reference.json: vectors and what sentence-transformers'
`quantize_embeddings` makes of them (int8, uint8, binary, ubinary), for
`protocol/tests/quantize_reference.rs`.

Run by hand in the venv of scripts/make_test_models.requirements.txt (the versions pinned there
are checked). The vectors are normalised random ones (a seeded generator) of 37 dimensions (not a
multiple of 8, so the bit forms' padding is covered), two range cases: the vectors' own ranges,
and wider ones from a calibration set (every value inside them, as the enclave clips where NumPy
would too). Values are written with repr(), which round-trips float32 exactly.
"""
import json
import pathlib

import numpy as np
import sentence_transformers
from sentence_transformers.util.quantization import quantize_embeddings

assert sentence_transformers.__version__ == "6.2.0", sentence_transformers.__version__
assert np.__version__ == "2.4.6", np.__version__

rng = np.random.default_rng(20261128)
vectors = rng.standard_normal((24, 37)).astype(np.float32)
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
vectors[3, :5] = 0.0  # exact zeros: not > 0 for the bit forms, and on a range's edge
calibration = (rng.standard_normal((200, 37)) * 0.4).astype(np.float32)
wide = np.vstack([np.minimum(calibration.min(axis=0), vectors.min(axis=0)), np.maximum(calibration.max(axis=0), vectors.max(axis=0))])

cases = []
for name, ranges in [("own", None), ("calibrated", wide.astype(np.float32))]:
    used = ranges if ranges is not None else np.vstack([vectors.min(axis=0), vectors.max(axis=0)])
    case = {"name": name, "min": [float(v) for v in used[0]], "max": [float(v) for v in used[1]]}
    for precision in ["int8", "uint8", "binary", "ubinary"]:
        case[precision] = quantize_embeddings(vectors, precision=precision, ranges=used).astype(int).tolist()
    cases.append(case)

out = pathlib.Path(__file__).resolve().parent.parent / "tests/testdata/quantize/reference.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"generator": "scripts/make_quantize_reference.py", "sentence_transformers": "6.2.0",
                           "numpy": "2.4.6", "vectors": [[float(v) for v in row] for row in vectors],
                           "cases": cases}) + "\n")
print(f"wrote {out}")
