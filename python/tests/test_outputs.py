"""Output kinds beyond one dense vector through the SDK: a SPLADE model's sparse weights as a
scipy CSR matrix, a ColBERT model's vectors as an array per record, a cross-encoder's scores per
record, and ``Client.rerank`` online, each equal to
sentence-transformers' on the generated checkpoints of ``tests/testdata/outputs`` (written by
``scripts/make_output_models.py``)."""

import json
import os
import time

import numpy as np
import pytest

import ephem_batch

OUTPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "testdata", "outputs")


def _reference(name):
    with open(os.path.join(OUTPUTS, f"{name}-reference.json"), encoding="utf-8") as f:
        return json.load(f)


def _onboard(stack, tmp_path, name, model_id):
    sealed = str(tmp_path / f"{name}.sealed")
    stack.cli("model", "encrypt", os.path.join(OUTPUTS, name), "--model-id", model_id, "--version", "1", "-o", sealed)
    stack.cli("model", "sign", sealed, "--development")
    stack.cli("model", "upload", sealed)


def test_sparse_results_are_a_csr_matrix_of_splade_weights(client, stack, tmp_path):
    reference = _reference("splade")
    _onboard(stack, tmp_path, "splade", "py/splade")
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text("".join(json.dumps({"id": t["name"], "text": t["text"]}) + "\n" for t in reference["texts"]), encoding="utf-8")
    job = client.submit(str(corpus), model="py/splade").wait()
    assert job.kind == "sparse"
    ids, matrix = job.results()
    assert ids == [t["name"] for t in reference["texts"]]
    assert matrix.shape == (len(ids), reference["dimensions"]) and matrix.dtype == np.float32
    for row, text in enumerate(reference["texts"]):
        expected = np.zeros(reference["dimensions"], dtype=np.float32)
        for index, weight in text["sparse"]:
            expected[index] = weight
        got = matrix.getrow(row).toarray()[0]
        assert np.array_equal(np.nonzero(got)[0], np.nonzero(expected)[0]), text["name"]
        assert np.abs(got - expected).max() <= 1e-5, text["name"]
    with pytest.raises(ValueError, match="sparse"):
        job.results(kind="dense")
    assert job.verify().passed

    # The CLI's npz is the CSR matrix scipy reads, row for row the same as the SDK's.
    from scipy.sparse import load_npz

    npz = tmp_path / "weights.npz"
    stack.cli("results", job.id, "-o", str(npz), "--format", "npz")
    loaded = load_npz(str(npz))
    assert loaded.format == "csr" and loaded.dtype == np.float32 and loaded.shape == matrix.shape
    assert (loaded != matrix).nnz == 0
    assert [json.loads(line) for line in (tmp_path / "weights.ids.jsonl").read_text().splitlines()] == ids
    refused = stack.cli("results", job.id, "-o", str(tmp_path / "w.npy"), "--format", "npy", check=False)
    assert refused.returncode != 0 and "--format npy: sparse output is written as jsonl or npz" in refused.stderr


def test_multivector_results_are_an_array_per_record_of_colbert_vectors(client, stack, tmp_path):
    reference = _reference("colbert")
    _onboard(stack, tmp_path, "colbert", "py/colbert")
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text("".join(json.dumps({"id": t["name"], "text": t["text"]}) + "\n" for t in reference["texts"]), encoding="utf-8")
    job = client.submit(str(corpus), model="py/colbert").wait()
    assert job.kind == "multivector"
    ids, arrays = job.results()
    assert ids == [t["name"] for t in reference["texts"]]
    for got, text in zip(arrays, reference["texts"]):
        expected = np.asarray(text["vectors"], dtype=np.float64)
        assert got.dtype == np.float32 and got.shape == (text["tokens"], reference["dimensions"]), text["name"]
        cosines = (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
        assert cosines.min() >= 0.9999, text["name"]
        assert np.abs(np.linalg.norm(got, axis=1) - 1).max() < 1e-5, text["name"]
    with pytest.raises(ValueError, match="multivector"):
        job.results(kind="sparse")
    assert job.verify().passed

    # The CLI's npz: every record's vectors, one after the other, and the rows' offsets.
    npz = tmp_path / "tokens.npz"
    stack.cli("results", job.id, "-o", str(npz), "--format", "npz")
    with np.load(npz) as loaded:
        vectors, indptr = loaded["vectors"], loaded["indptr"]
    assert vectors.dtype == np.float32 and indptr.dtype == np.int64 and len(indptr) == len(ids) + 1
    for row, got in enumerate(arrays):
        assert np.array_equal(vectors[indptr[row] : indptr[row + 1]], got), ids[row]


def test_rerank_results_and_online_rerank_equal_cross_encoder(client, stack, tmp_path):
    reference = _reference("rerank")
    _onboard(stack, tmp_path, "rerank", "py/rerank")
    corpus = tmp_path / "pairs.jsonl"
    lines = [json.dumps({"id": f"q{i}", "query": q["query"], "documents": reference["documents"]}) for i, q in enumerate(reference["queries"])]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = client.submit(str(corpus), model="py/rerank").wait()
    assert job.kind == "scores"
    ids, scores = job.results()
    assert ids == [f"q{i}" for i in range(len(reference["queries"]))]
    for got, case in zip(scores, reference["queries"]):
        assert np.abs(got - np.asarray(case["scores"], dtype=np.float32)).max() <= 1e-4
        assert list(np.argsort(-got, kind="stable")) == case["order"]

    case = reference["queries"][1]
    ranked = None
    for _ in range(300):  # the enclave loads the model it was just given
        try:
            ranked = client.rerank(case["query"], reference["documents"], model="py/rerank", top_n=3)
            break
        except ephem_batch.OnlineError as error:
            if error.check != "model_not_found":
                raise
            time.sleep(0.2)
    assert ranked is not None
    assert [index for index, _ in ranked] == case["order"][:3]
    for index, score in ranked:
        assert abs(score - case["scores"][index]) <= 1e-4


def test_langchain_and_llama_index_rerankers_keep_the_cross_encoders_best(client, stack, tmp_path):
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from ephem_batch.langchain import EphemBatchRerank as LangChainRerank
    from ephem_batch.llama_index import EphemBatchRerank as LlamaIndexRerank

    reference = _reference("rerank")
    _onboard(stack, tmp_path, "rerank", "py/rerank-frameworks")
    case = reference["queries"][2]
    documents = reference["documents"]
    best = case["order"][:3]
    compressor = LangChainRerank(client, model="py/rerank-frameworks", top_n=3)
    kept = None
    for _ in range(300):  # the enclave loads the model it was just given
        try:
            kept = compressor.compress_documents([Document(page_content=d, metadata={"n": i}) for i, d in enumerate(documents)], case["query"])
            break
        except ephem_batch.OnlineError as error:
            if error.check != "model_not_found":
                raise
            time.sleep(0.2)
    assert [d.metadata["n"] for d in kept] == best
    assert all(abs(d.metadata["relevance_score"] - case["scores"][d.metadata["n"]]) <= 1e-4 for d in kept)

    postprocessor = LlamaIndexRerank(client, model="py/rerank-frameworks", top_n=3)
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i)), score=0.0) for i, d in enumerate(documents)]
    ranked = postprocessor.postprocess_nodes(nodes, QueryBundle(case["query"]))
    assert [int(n.node.node_id) for n in ranked] == best
    assert all(abs(n.score - case["scores"][int(n.node.node_id)]) <= 1e-4 for n in ranked)
