"""A LlamaIndex ``BaseEmbedding`` over ephem-batch (the ``llama-index`` extra:
llama-index-core).

>>> from ephem_batch.llama_index import EphemBatchEmbedding
>>> embed_model = EphemBatchEmbedding()               # or EphemBatchEmbedding(client=...)
>>> vectors = embed_model.get_text_embedding_batch(["first text", "second text"])

Texts (documents, nodes) go through batch jobs — one per ``embed_batch_size`` texts (at most
2,048, LlamaIndex's bound; the default here is that bound) — opened and checked by the client
library before any vector is returned. Queries go through ``client.embed`` (the online path:
Oblivious HTTP to the same attested enclaves).

``EphemBatchRerank`` is a node postprocessor that reranks retrieved nodes with a cross-encoder
in the same enclaves (``client.rerank``): neither the query nor the passages leave them."""

from __future__ import annotations

from typing import Any, List, Optional

try:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, QueryBundle
    from pydantic import PrivateAttr
except ImportError as error:  # pragma: no cover
    raise ImportError("ephem_batch.llama_index needs llama-index-core: pip install 'ephem-batch[llama-index]'") from error

from . import DEFAULT_MODEL, Client, Job
from ._documents import embed_texts

__all__ = ["EphemBatchEmbedding", "EphemBatchRerank"]


class EphemBatchEmbedding(BaseEmbedding):
    """LlamaIndex embeddings computed in attested enclaves. ``client``: an
    :class:`ephem_batch.Client` (default: ``Client(**client_options)``, configured from the
    ``EPHEM_*`` variables). ``precision``, ``timeout`` (seconds per job, default a day) and
    ``progress`` as for :meth:`Job.wait`. ``document_prompt`` / ``query_prompt``: the model's
    named prompts for texts and queries (``None``: its default prompt); ``dimensions``: a
    Matryoshka length the model offers. ``last_job`` is the last batch job."""

    precision: str = "fp32"
    document_prompt: Optional[str] = None
    query_prompt: Optional[str] = None
    dimensions: Optional[int] = None
    timeout: Optional[float] = None
    progress: bool = False
    _client: Client = PrivateAttr()
    _last_job: Optional[Job] = PrivateAttr(default=None)

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        model_name: str = DEFAULT_MODEL,
        precision: str = "fp32",
        timeout: Optional[float] = None,
        progress: bool = False,
        embed_batch_size: int = 2048,
        document_prompt: Optional[str] = None,
        query_prompt: Optional[str] = None,
        dimensions: Optional[int] = None,
        **client_options: Any,
    ) -> None:
        super().__init__(model_name=model_name, embed_batch_size=embed_batch_size)
        self.precision = precision
        self.document_prompt = document_prompt
        self.query_prompt = query_prompt
        self.dimensions = dimensions
        self.timeout = timeout
        self.progress = progress
        self._client = client if client is not None else Client(**client_options)

    @classmethod
    def class_name(cls) -> str:
        return "EphemBatchEmbedding"

    @property
    def client(self) -> Client:
        return self._client

    @property
    def last_job(self) -> Optional[Job]:
        return self._last_job

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        vectors, job = embed_texts(
            self._client,
            texts,
            model=self.model_name,
            precision=self.precision,
            timeout=self.timeout,
            progress=self.progress,
            prompt=self.document_prompt,
            dimensions=self.dimensions,
        )
        if job is not None:
            self._last_job = job
        return vectors.tolist()

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> List[float]:
        vectors = self._client.embed([query], self.model_name, dimensions=self.dimensions, prompt_name=self.query_prompt)
        return [float(x) for x in vectors[0]]

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> List[float]:
        return self._get_text_embedding(text)

    async def _aget_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._get_text_embeddings(texts)


class EphemBatchRerank(BaseNodePostprocessor):
    """A LlamaIndex node postprocessor that reranks with a cross-encoder in attested enclaves
    (:meth:`ephem_batch.Client.rerank`): the ``top_n`` best nodes, best first, their scores the
    cross-encoder's. ``client`` as for :class:`EphemBatchEmbedding`."""

    model: str
    top_n: Optional[int] = 3
    _client: Client = PrivateAttr()

    def __init__(self, client: Optional[Client] = None, *, model: str, top_n: Optional[int] = 3, **client_options: Any) -> None:
        super().__init__(model=model, top_n=top_n)
        self._client = client if client is not None else Client(**client_options)

    @classmethod
    def class_name(cls) -> str:
        return "EphemBatchRerank"

    def _postprocess_nodes(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("reranking needs the query")
        if not nodes:
            return []
        texts = [n.node.get_content() for n in nodes]
        ranked = self._client.rerank(query_bundle.query_str, texts, self.model, top_n=self.top_n)
        return [NodeWithScore(node=nodes[index].node, score=score) for index, score in ranked]
