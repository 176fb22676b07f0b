"""The LangChain and LlamaIndex classes: documents through batch jobs (vectors of the right
shape, equal to the batch path's for the same texts), queries through the online path; the
model's prompts and Matryoshka lengths asked for on both sides."""

import numpy as np
import pytest

from ephem_batch.langchain import EphemBatchEmbeddings
from ephem_batch.llama_index import EphemBatchEmbedding

TEXTS = [
    "Retrieval-augmented generation needs document embeddings.",
    "The enclave's attestation is checked before any text is sealed.",
    "A tern dives for sprats off the breakwater.",
    "Vector stores index embeddings for nearest-neighbour search.",
    "Rhubarb crumble with vanilla custard.",
]


@pytest.fixture(scope="module")
def batch_vectors(client):
    """The same texts through the batch path directly."""
    ids, vectors = client.submit(TEXTS).wait().results()
    assert ids == [str(i) for i in range(len(TEXTS))]
    return vectors


def test_langchain_documents_equal_the_batch_path(client, batch_vectors):
    from langchain_core.embeddings import Embeddings

    embeddings = EphemBatchEmbeddings(client=client)
    assert isinstance(embeddings, Embeddings)
    vectors = embeddings.embed_documents(TEXTS)
    assert len(vectors) == len(TEXTS) and all(len(v) == 384 for v in vectors)
    assert all(isinstance(x, float) for x in vectors[0])
    np.testing.assert_allclose(np.array(vectors, dtype=np.float32), batch_vectors, rtol=0, atol=1e-6)
    assert embeddings.last_job is not None and embeddings.last_job.verify().passed
    assert embeddings.embed_documents([]) == []


def test_langchain_query_goes_online_and_equals_the_batch_vector(client, batch_vectors):
    embeddings = EphemBatchEmbeddings(client=client)
    query = embeddings.embed_query(TEXTS[1])
    assert len(query) == 384
    assert float(np.dot(np.array(query, dtype=np.float32), batch_vectors[1])) > 0.9999


def test_llama_index_documents_equal_the_batch_path(client, batch_vectors):
    from llama_index.core.base.embeddings.base import BaseEmbedding

    embed_model = EphemBatchEmbedding(client=client, embed_batch_size=3)
    assert isinstance(embed_model, BaseEmbedding)
    vectors = embed_model.get_text_embedding_batch(TEXTS)  # two jobs: 3 texts, then 2
    assert len(vectors) == len(TEXTS) and all(len(v) == 384 for v in vectors)
    np.testing.assert_allclose(np.array(vectors, dtype=np.float32), batch_vectors, rtol=0, atol=1e-6)
    single = embed_model.get_text_embedding(TEXTS[2])
    np.testing.assert_allclose(np.array(single, dtype=np.float32), batch_vectors[2], rtol=0, atol=1e-6)
    assert embed_model.last_job is not None and embed_model.last_job.records == 1


def test_llama_index_query_goes_online_and_equals_the_batch_vector(client, batch_vectors):
    embed_model = EphemBatchEmbedding(client=client)
    query = embed_model.get_query_embedding(TEXTS[3])
    assert len(query) == 384
    assert float(np.dot(np.array(query, dtype=np.float32), batch_vectors[3])) > 0.9999


def test_prompts_and_lengths_reach_the_enclave_for_both_sides(client):
    """The model serves no prompts and no shorter lengths: asking for them must be refused by
    name on both sides, which shows the options are sent (never dropped for the defaults)."""
    import ephem_batch

    asking = EphemBatchEmbeddings(client=client, query_prompt="query", document_prompt="passage")
    with pytest.raises(ephem_batch.OnlineError) as raised:
        asking.embed_query(TEXTS[0])
    assert raised.value.check == "unknown_prompt_name"
    with pytest.raises(ephem_batch.EphemBatchError) as raised:
        asking.embed_documents(TEXTS[:1])
    assert 'prompt "passage"' in str(raised.value)
    shorter = EphemBatchEmbedding(client=client, dimensions=128)
    with pytest.raises(ephem_batch.OnlineError) as raised:
        shorter.get_query_embedding(TEXTS[0])
    assert raised.value.check == "unsupported_dimensions"
    plain = EphemBatchEmbeddings(client=client, query_prompt="none")
    assert len(plain.embed_query(TEXTS[0])) == 384
