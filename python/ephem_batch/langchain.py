"""A LangChain ``Embeddings`` over ephem-batch (the ``langchain`` extra: langchain-core).

>>> from ephem_batch.langchain import EphemBatchEmbeddings
>>> embeddings = EphemBatchEmbeddings()              # or EphemBatchEmbeddings(client=...)
>>> vectors = embeddings.embed_documents(["first text", "second text"])   # one verified batch job

Documents go through one batch job per ``embed_documents`` call, opened and checked by the
client library before any vector is returned; queries go through ``client.embed`` (the online
path: Oblivious HTTP to the same attested enclaves).

>>> from ephem_batch.langchain import EphemBatchRerank
>>> reranker = EphemBatchRerank(model="my/reranker", top_n=3)   # a document compressor
>>> best = reranker.compress_documents(documents, "the query")  # scored inside the enclave

The reranker sends the query and the passages through the online path to a cross-encoder
(``client.rerank``), so neither is read outside the attested enclave."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.embeddings import Embeddings
    from pydantic import ConfigDict
except ImportError as error:  # pragma: no cover
    raise ImportError("ephem_batch.langchain needs langchain-core: pip install 'ephem-batch[langchain]'") from error

from . import DEFAULT_MODEL, Client, Job
from ._documents import embed_texts

__all__ = ["EphemBatchEmbeddings", "EphemBatchRerank"]


class EphemBatchEmbeddings(Embeddings):
    """LangChain embeddings computed in attested enclaves. ``client``: an
    :class:`ephem_batch.Client` (default: ``Client(**client_options)``, configured from the
    ``EPHEM_*`` variables like the CLI). ``timeout``: seconds to wait for a job (default a
    day); ``progress``: a tqdm bar while waiting. ``document_prompt`` / ``query_prompt``: the
    model's named prompts for each side (e.g. ``"passage"`` / ``"query"`` for E5; ``None``: the
    model's default prompt); ``dimensions``: a Matryoshka length the model offers. ``last_job``
    is the last batch job, for ``verify()`` or the ledger."""

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        model: str = DEFAULT_MODEL,
        precision: str = "fp32",
        timeout: Optional[float] = None,
        progress: bool = False,
        document_prompt: Optional[str] = None,
        query_prompt: Optional[str] = None,
        dimensions: Optional[int] = None,
        **client_options: Any,
    ) -> None:
        self.client = client if client is not None else Client(**client_options)
        self.model = model
        self.precision = precision
        self.timeout = timeout
        self.progress = progress
        self.document_prompt = document_prompt
        self.query_prompt = query_prompt
        self.dimensions = dimensions
        self.last_job: Optional[Job] = None

    def embed_documents(self, texts: List[str]) -> List[List[float]]:
        """One vector per text, from one batch job (every check passed)."""
        vectors, job = embed_texts(
            self.client,
            texts,
            model=self.model,
            precision=self.precision,
            timeout=self.timeout,
            progress=self.progress,
            prompt=self.document_prompt,
            dimensions=self.dimensions,
        )
        if job is not None:
            self.last_job = job
        return vectors.tolist()

    def embed_query(self, text: str) -> List[float]:
        """The query's vector through the online path (:meth:`ephem_batch.Client.embed`)."""
        vectors = self.client.embed([text], self.model, dimensions=self.dimensions, prompt_name=self.query_prompt)
        return [float(x) for x in vectors[0]]


class EphemBatchRerank(BaseDocumentCompressor):
    """A LangChain document compressor that reranks with a cross-encoder in attested enclaves
    (:meth:`ephem_batch.Client.rerank`): the ``top_n`` best documents, best first, each with its
    score in ``metadata["relevance_score"]``. ``client`` as for :class:`EphemBatchEmbeddings`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client
    model: str
    top_n: Optional[int] = 3

    def __init__(self, client: Optional[Client] = None, *, model: str, top_n: Optional[int] = 3, **client_options: Any) -> None:
        super().__init__(client=client if client is not None else Client(**client_options), model=model, top_n=top_n)

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks: Optional[Callbacks] = None) -> Sequence[Document]:
        if not documents:
            return []
        ranked = self.client.rerank(query, [d.page_content for d in documents], self.model, top_n=self.top_n)
        return [
            Document(page_content=documents[index].page_content, metadata={**documents[index].metadata, "relevance_score": score}, id=documents[index].id)
            for index, score in ranked
        ]
