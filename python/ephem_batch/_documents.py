"""Documents through one batch job, for the framework integrations (``langchain``,
``llama_index``): the vectors in the texts' order, every one opened and checked by the client
library (``Job.results``), or an exception naming what is missing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from .errors import EphemBatchError

if TYPE_CHECKING:  # pragma: no cover
    from . import Client, Job


def embed_texts(
    client: "Client",
    texts: Sequence[str],
    *,
    model: str,
    precision: str,
    timeout: Optional[float],
    progress: bool,
    prompt: Optional[str] = None,
    dimensions: Optional[int] = None,
) -> "tuple[Any, Optional[Job]]":
    """``(vectors, job)``: a float32 matrix, row ``i`` the vector of ``texts[i]``; ``job`` is
    ``None`` for no texts. A text the job could not embed raises :class:`EphemBatchError`
    naming it and the job (a framework expects one vector per text)."""
    import numpy as np

    texts = list(texts)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32), None
    job = client.submit(texts, model=model, precision=precision, prompt=prompt, dimensions=dimensions)
    ids, vectors = job.wait(progress=progress, timeout=timeout).results()
    if len(ids) != len(texts):
        failed = job.errors()
        first = failed[0] if failed else {}
        raise EphemBatchError(
            f"job {job.id} embedded {len(ids)} of {len(texts)} texts; first failure: text "
            f"{first.get('id')} ({first.get('code')}: {first.get('message')})",
            check=first.get("code"),
        )
    order = [int(i) for i in ids]
    if order != list(range(len(texts))):  # the library keeps the corpus's order
        vectors = vectors[np.argsort(order)]
    return np.asarray(vectors, dtype=np.float32), job
