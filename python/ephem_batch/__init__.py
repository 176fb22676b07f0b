"""ephem-batch for Python: confidential bulk text embedding, with every attestation, receipt and
ledger check done by the Rust client library itself (the extension module ``_native``), never
re-implemented here.

>>> import ephem_batch
>>> client = ephem_batch.Client()                    # $EPHEM_HOME, the embedded default
>>> job = client.submit(["first text", "second text"])
>>> ids, vectors = job.wait().results()              # verified before anything is returned
>>> vectors.shape
(2, 384)

See python/README.md and docs/python.md.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from .bundle import BundleVerification, ProofBundle, RecordProof, RecordVerification, verify_bundle, verify_record
from .errors import (
    ConfigurationError,
    EphemBatchError,
    JobFailedError,
    NotAvailableError,
    OnlineError,
    VerificationError,
    WaitTimeoutError,
)

__all__ = [
    "Client",
    "Job",
    "JobStatus",
    "Verification",
    "Check",
    "Ledger",
    "ProofBundle",
    "BundleVerification",
    "verify_bundle",
    "verify_record",
    "RecordProof",
    "RecordVerification",
    "DEFAULT_MODEL",
    "EphemBatchError",
    "ConfigurationError",
    "VerificationError",
    "JobFailedError",
    "WaitTimeoutError",
    "NotAvailableError",
    "OnlineError",
]

__version__ = _native.version()

#: Where a submission of texts (not a file) keeps its corpus, in the job's client directory.
_KEPT_CORPUS = "corpus.jsonl"

#: The model ``submit`` uses unless told otherwise (as ``ephem-batch submit``).
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

#: ``wait``'s default timeout: a day, as ``ephem-batch submit --wait``.
DEFAULT_WAIT_TIMEOUT = 24 * 3600.0

_TERMINAL = ("completed", "failed", "cancelled")

Source = Union[str, "os.PathLike[str]", Iterable[Union[str, Mapping[str, Any]]]]


class Client:
    """A client of one deployment, configured like the ``ephem-batch`` command.

    Every argument left ``None`` is read from the same place as the command's option: ``home``
    from ``EPHEM_HOME`` (default ``./.ephem``), ``backend`` from ``EPHEM_BACKEND`` (``"local"``,
    the embedded default, or ``"aws"``), ``stack_outputs`` from ``EPHEM_STACK_OUTPUTS`` (the
    ``cdk deploy --outputs-file`` JSON), ``kms`` from ``EPHEM_KMS``, ``policy`` and
    ``publisher_key`` from ``EPHEM_POLICY`` and ``EPHEM_PUBLISHER_KEY`` (the signed attestation
    policy and its signer; default: the development policy of ``ephem-batch dev up``),
    ``model_publisher_key`` from ``EPHEM_MODEL_PUBLISHER_KEY``, ``fleet_key_arn`` from
    ``EPHEM_FLEET_KEY_ARN``, and ``witnesses`` from ``EPHEM_WITNESSES``.

    ``witnesses`` (cosigner keys, or files holding them) and ``witness_quorum`` are ``ephem-batch
    verify``'s ``--witness`` and ``--witness-quorum``: a job's ledger checkpoint must carry the
    quorum's cosignatures (default: all of them), else :meth:`Job.results` and :meth:`Job.verify`
    refuse it naming ``witness_quorum``. Without witnesses the ledger check says the checkpoint
    is signed by the operator's key only. Every checkpoint accepted is remembered in the home and
    a later one must be consistent with it (``fork``, ``consistency``).

    One process talks to one backend (the library's fleet key and ledger are process-wide): a
    second client with another home or backend raises :class:`ConfigurationError`.
    """

    def __init__(
        self,
        home: Optional[Union[str, "os.PathLike[str]"]] = None,
        backend: Optional[str] = None,
        stack_outputs: Optional[Union[str, "os.PathLike[str]"]] = None,
        policy: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        publisher_key: Optional[str] = None,
        model_publisher_key: Optional[str] = None,
        fleet_key_arn: Optional[str] = None,
        kms: Optional[str] = None,
        witnesses: Optional[Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]] = None,
        witness_quorum: Optional[int] = None,
    ) -> None:
        if backend is not None and backend not in ("local", "aws"):
            raise ConfigurationError(f"backend {backend!r}: expected 'local' or 'aws'")
        args: List[str] = []
        for flag, value in (
            ("--home", home),
            ("--backend", backend),
            ("--stack-outputs", stack_outputs),
            ("--kms", kms),
            ("--policy", policy),
            ("--publisher-key", publisher_key),
            ("--model-publisher-key", model_publisher_key),
            ("--fleet-key-arn", fleet_key_arn),
        ):
            if value is not None:
                args += [flag, os.fspath(value)]
        if isinstance(witnesses, (str, os.PathLike)):
            witnesses = [witnesses]
        for witness in witnesses or ():
            args += ["--witness", os.fspath(witness)]
        if witness_quorum is not None:
            args += ["--witness-quorum", str(int(witness_quorum))]
        self._native = _native.NativeClient(args)
        #: The receipts ledger's compliance view.
        self.ledger = Ledger(self)

    @property
    def home(self) -> str:
        """The home directory (absolute)."""
        return self._native.home

    @property
    def backend(self) -> str:
        """``"local"`` or ``"aws"``."""
        return self._native.backend

    def submit(
        self,
        source: Source,
        model: str = DEFAULT_MODEL,
        precision: str = "fp32",
        dimensions: Optional[int] = None,
        ids: Optional[Sequence[str]] = None,
        *,
        dtype: str = "float32",
        truncate: bool = True,
        normalize: bool = True,
        model_version: Optional[int] = None,
        manifest_sha256: Optional[str] = None,
        prompt: Optional[str] = None,
    ) -> "Job":
        """Seals ``source`` to the attested fleet key and submits it as one job.

        ``source`` is a path (JSON lines ``{"id", "text"}`` or OpenAI Batch embedding requests),
        or an iterable of ``{"id", "text"}`` mappings or of strings (ids ``ids``, else ``"0"``,
        ``"1"``, …), or a pandas Series / pyarrow array of strings. Lines that are not valid
        input are refused here, never sent, and reported by :meth:`Job.errors`; the job goes on
        with the rest.

        ``precision`` is ``"fp32"``, ``"bf16"`` or ``"int8"``; ``dtype`` ``"float32"`` or
        ``"float16"`` (the vectors as sealed: half the size); ``dimensions`` one of the Matryoshka
        lengths the model's signed manifest offers (``None``: the model's own); ``prompt`` one of
        the manifest's named prompts (``None``: its default prompt, ``"none"``: no prompt) — all
        recorded in the receipt. ``model_version`` / ``manifest_sha256`` pin a signed model
        version, as ``--model-version`` / ``--manifest-sha256``.

        Raises ``ValueError`` naming the file, before anything reaches the stack, when it is
        missing, not a regular file it can read, or holds no record (empty, or every line
        refused).
        """
        if dtype not in ("float32", "float16"):
            raise ConfigurationError(f"dtype {dtype!r}: expected 'float32' or 'float16'")
        path, scratch = _corpus_file(source, ids)
        try:
            record = json.loads(
                self._native.submit(
                    path,
                    model,
                    model_version=model_version,
                    manifest_sha256=manifest_sha256,
                    precision=precision,
                    f16=dtype == "float16",
                    truncate=truncate,
                    normalize=normalize,
                    prompt=prompt,
                    dimensions=dimensions,
                )
            )
        except ValueError as error:
            # A file the library refused before sealing (missing, not a readable regular file,
            # no record in it): named as the caller named it.
            if scratch is None:
                raise
            raise ValueError(str(error).replace(path, "the records given")) from None
        else:
            if scratch is not None:
                # Kept in the job's own (private) directory: prove_record reads the texts again.
                os.replace(path, os.path.join(self.home, "client", "jobs", record["job_id"], _KEPT_CORPUS))
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return Job(self, record["job_id"], record)

    def job(self, job_id: str) -> "Job":
        """A job this client (this home) submitted before."""
        record = json.loads(self._native.job_record(job_id))
        return Job(self, record["job_id"], record)

    def embed(
        self,
        texts: Union[str, Sequence[str]],
        model: str = DEFAULT_MODEL,
        *,
        relay: Optional[str] = None,
        dimensions: Optional[int] = None,
        prompt_name: Optional[str] = None,
    ) -> Any:
        """Query-time embeddings through the online path: the fleet's attestation document is
        verified with ``submit``'s checks and the model's signed manifest pinned, then the texts
        travel by Oblivious HTTP through the host's relay, which cannot read them. Returns a
        ``numpy.ndarray`` (float32, one unit-norm row per text), the batch path's vectors for the
        same texts. ``relay`` defaults to the running local stack's. Raises :class:`OnlineError`
        naming the check (``attestation`` when the document fails: nothing is sent).
        ``dimensions`` and ``prompt_name`` are OpenAI's ``dimensions`` and the prompt by name, as
        in :meth:`submit`."""
        import numpy as np

        batch = [texts] if isinstance(texts, str) else list(texts)
        rows = self._native.embed(model, batch, relay, dimensions, prompt_name)
        return np.asarray(rows, dtype=np.float32).reshape(len(batch), -1)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        model: str,
        *,
        top_n: Optional[int] = None,
        relay: Optional[str] = None,
    ) -> List[Tuple[int, float]]:
        """Scores ``documents`` against ``query`` with a cross-encoder through the online path
        (``POST /v1/rerank`` inside Oblivious HTTP, as :meth:`embed`): the query and the passages
        are read only by the attested enclave. Returns ``(index, relevance_score)`` pairs, best
        first, the ``top_n`` best (all when ``None``); the scores are sentence-transformers'
        ``CrossEncoder.predict`` for the same pairs. Raises :class:`OnlineError` naming the
        check or the refused field."""
        return [(int(i), float(s)) for i, s in self._native.rerank(model, query, list(documents), top_n, relay)]

    def __repr__(self) -> str:
        return f"ephem_batch.Client(home={self.home!r}, backend={self.backend!r})"


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands (``ephem-batch status``). ``state`` is ``queued``, ``in_progress``,
    ``completed``, ``failed`` or ``cancelled``; ``failure`` is ``(check, message)`` for a failed
    job; ``raw`` is the library's whole view."""

    job_id: str
    state: str
    records_done: int
    records_total: Optional[int]
    receipt_committed: bool
    ledger_index: Optional[int]
    failure: Optional[Tuple[str, str]]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def _of(cls, view: Dict[str, Any]) -> "JobStatus":
        status = view.get("status") or {}
        failure = status.get("failure")
        ledger = view.get("ledger")
        return cls(
            job_id=view["job_id"],
            state=view["state"],
            records_done=int(status.get("records_done") or 0),
            records_total=status.get("records_total"),
            receipt_committed=bool(view.get("receipt_committed")),
            ledger_index=ledger.get("index") if isinstance(ledger, dict) else None,
            failure=(failure["check"], failure["message"]) if failure else None,
            raw=view,
        )

    @property
    def done(self) -> bool:
        return self.state in _TERMINAL


@dataclass(frozen=True)
class Check:
    """One named check of a verification."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Verification:
    """Every check of a job's receipt against what this client sealed and opened, by name
    (``ephem-batch verify``)."""

    job_id: str
    development_root: bool
    checks: Tuple[Check, ...]

    @classmethod
    def _of(cls, value: Dict[str, Any]) -> "Verification":
        checks = tuple(Check(c["name"], bool(c["passed"]), c["detail"]) for c in value.get("checks", []))
        return cls(value["job_id"], bool(value.get("development_root")), checks)

    @property
    def passed(self) -> bool:
        """Every check ran and passed."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failures(self) -> List[Check]:
        return [c for c in self.checks if not c.passed]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(c.name == name for c in self.checks)

    def __iter__(self) -> Iterator[Check]:
        return iter(self.checks)

    def _error(self) -> VerificationError:
        failed = [(c.name, c.detail) for c in self.failures] or [("receipt", "no check ran")]
        lines = "\n  ".join(f"{name}: {detail}" for name, detail in failed)
        return VerificationError(
            f"job {self.job_id} does not verify:\n  {lines}", check=failed[0][0], failed=failed, verification=self
        )


class Job:
    """A submitted job. Its results are opened and checked by the client library before any
    vector is returned; a failed check raises :class:`VerificationError` naming it."""

    def __init__(self, client: Client, job_id: str, record: Optional[Dict[str, Any]] = None) -> None:
        self._client = client
        self.id = job_id
        self._record = record
        self._written: Optional[Dict[str, Any]] = None

    @property
    def record(self) -> Dict[str, Any]:
        """What this client remembers of the job (records, model, manifest, options, …)."""
        if self._record is None:
            self._record = json.loads(self._client._native.job_record(self.id))
        return self._record

    @property
    def records(self) -> int:
        """Records sealed (lines refused locally excluded)."""
        return int(self.record["records"])

    def status(self) -> JobStatus:
        return JobStatus._of(json.loads(self._client._native.status(self.id)))

    def wait(self, progress: bool = False, timeout: Optional[float] = None) -> "Job":
        """Waits until the receipt is committed and the ledger holds it. ``progress=True`` shows
        a tqdm bar (in notebooks and terminals) when tqdm is installed. A failed job raises
        :class:`JobFailedError` naming the check; ``timeout`` seconds (default a day) raises
        :class:`WaitTimeoutError` and leaves the job running."""
        timeout = DEFAULT_WAIT_TIMEOUT if timeout is None else float(timeout)
        started = time.monotonic()
        bar = _progress_bar(self.records, f"job {self.id[:8]}") if progress else None
        try:
            while True:
                status = self.status()
                if bar is not None:
                    bar.set_postfix_str(status.state, refresh=False)
                    bar.n = min(status.records_done, self.records) if status.state != "completed" else self.records
                    bar.refresh()
                if status.done or time.monotonic() - started >= timeout:
                    break
                time.sleep(0.25)
        finally:
            if bar is not None:
                bar.close()
        # The library's own wait: its verdict on failure, its wait for the ledger.
        remaining = max(0.0, timeout - (time.monotonic() - started))
        self._client._native.wait(self.id, self.records, remaining)
        return self

    @property
    def kind(self) -> str:
        """What the job's records hold: ``"dense"`` vectors, ``"sparse"`` weights (a SPLADE
        model), ``"scores"`` (a cross-encoder's, one per document) or ``"multivector"`` (a
        ColBERT model's, a vector per token)."""
        return self.record.get("output") or "dense"

    def _results(self) -> Dict[str, Any]:
        if self._written is None:
            directory = os.path.join(self._client.home, "client", "jobs", self.id)
            # Sparse weights and scores are written as JSON lines, vectors as a matrix.
            if self.kind == "dense":
                output, form = os.path.join(directory, "embeddings.npy"), "npy"
            else:
                output, form = os.path.join(directory, "results.jsonl"), "jsonl"
            self._written = json.loads(self._client._native.results(self.id, output, form))
        return self._written

    def results(self, mmap: bool = False, kind: Optional[str] = None) -> Tuple[List[str], Any]:
        """``(ids, values)``: the ids in the corpus's order and what the job computed for them.
        Refused lines and failed records are not in it (see :meth:`errors`).

        - dense (the default): a ``numpy.ndarray`` of shape ``(n, dimensions)``, ``float32``
          (``float16`` for a job submitted with ``dtype="float16"``);
        - ``kind="sparse"`` (a SPLADE model's job): a ``scipy.sparse.csr_matrix`` of shape
          ``(n, vocabulary)``, float32, a row per record with its nonzero weights by token id;
        - ``kind="scores"`` (a cross-encoder's job): a list of ``numpy.ndarray``, one per record,
          a score per document in the line's order;
        - ``kind="multivector"`` (a ColBERT model's job): a list of ``numpy.ndarray``, one per
          record, of shape ``(tokens kept, dimensions)``, float32, each row unit-length.

        ``kind`` defaults to the job's own and must equal it. The library streams the sealed
        output into a private file in the job's directory, checking everything as it goes, and
        writes it only if every check passes; a dense array is read from it once (``mmap=True``:
        memory-mapped, not read)."""
        import numpy as np

        kind = kind or self.kind
        if kind != self.kind:
            raise ValueError(f"results(kind={kind!r}): job {self.id} computed {self.kind} output")
        written = self._results()
        if kind != "dense":
            with open(written["output"], encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            ids = [row["id"] for row in rows]
            if kind == "scores":
                return ids, [np.asarray(row["scores"], dtype=np.float32) for row in rows]
            if kind == "multivector":
                dimensions = int(written["summary"].get("dimensions") or 0)
                return ids, [np.asarray(row["vectors"], dtype=np.float32).reshape(-1, dimensions) for row in rows]
            from scipy.sparse import csr_matrix

            indptr, indices, data = [0], [], []
            for row in rows:
                pairs = sorted((int(k), v) for k, v in row["sparse"].items())
                indices.extend(k for k, _ in pairs)
                data.extend(v for _, v in pairs)
                indptr.append(len(indices))
            shape = (len(rows), int(written["summary"].get("dimensions") or 0))
            return ids, csr_matrix((np.asarray(data, dtype=np.float32), np.asarray(indices, dtype=np.int32), np.asarray(indptr, dtype=np.int64)), shape=shape)

        vectors = np.load(written["output"], mmap_mode="r" if mmap else None)
        if self.record.get("dtype") == "f16" and not mmap:
            vectors = vectors.astype(np.float16)
        with open(written["ids"], encoding="utf-8") as f:
            ids = [json.loads(line) for line in f if line.strip()]
        return ids, vectors

    def to_parquet(self, path: Union[str, "os.PathLike[str]"], compression: str = "zstd") -> Dict[str, Any]:
        """Writes the job's results to a Parquet file at ``path``: columns ``id`` (string),
        ``vector`` (fixed-size list of float32, the model's dimensions) and ``tokens`` (int64,
        the record's token count), one row per embedded record in the corpus's order; the job id
        and model in the schema's metadata. The results are opened and checked by the library
        first (:class:`VerificationError` naming the failed check, nothing written), then
        streamed block by block. Needs pyarrow (the ``parquet`` extra). Returns ``{"path",
        "rows", "dimensions"}``."""
        from .parquet import write_parquet

        return write_parquet(self, path, compression=compression)

    def errors(self) -> List[Dict[str, Any]]:
        """The lines refused at submission and the records the enclave could not embed, one
        dict each (``ephem-batch results``' errors file)."""
        written = self._results()
        with open(written["errors"], encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def summary(self) -> Dict[str, Any]:
        """Counts of the results (records, errors, tokens, dimensions)."""
        return dict(self._results()["summary"])

    def verify(self, raise_on_failure: bool = True) -> Verification:
        """Every check of the job's receipt, its attestation, the output and the ledger entry
        (``ephem-batch verify``). Raises :class:`VerificationError` naming the first failed
        check unless ``raise_on_failure=False``."""
        verification = Verification._of(json.loads(self._client._native.verify(self.id)))
        if raise_on_failure and not verification.passed:
            raise verification._error()
        return verification

    def cancel(self) -> None:
        """Cancels the job if no host has started it (signed with this home's result key)."""
        self._client._native.cancel(self.id)

    def __repr__(self) -> str:
        return f"ephem_batch.Job({self.id!r})"


def _ledger_trust_args(
    ledger_key: Optional[str],
    root: Optional[str],
    development_root: Optional[Union[bool, str]],
    expect_pcr: Optional[Mapping[int, str]],
    allow_debug: bool,
) -> List[str]:
    """The ledger trust options as on the command line."""
    args: List[str] = []
    if ledger_key is not None:
        args += ["--ledger-key", ledger_key]
    if root is not None:
        args += ["--root", root]
    if development_root is True:
        args += ["--development-root"]
    elif isinstance(development_root, str):
        args += ["--development-root", development_root]
    for index, value in (expect_pcr or {}).items():
        args += ["--expect-pcr", f"{index}={value}"]
    if allow_debug:
        args += ["--allow-debug"]
    return args


class Ledger:
    """The receipts ledger of the client's backend (``ephem-batch ledger``)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def query(
        self,
        job: Optional[Union[str, Job]] = None,
        model: Optional[str] = None,
        pcr0: Optional[str] = None,
        client: Optional[str] = None,
        since: Optional[Union[int, str, _dt.datetime, _dt.date]] = None,
        until: Optional[Union[int, str, _dt.datetime, _dt.date]] = None,
        *,
        kind: Optional[str] = None,
        ledger_key: Optional[str] = None,
        root: Optional[str] = None,
        development_root: Optional[Union[bool, str]] = None,
        expect_pcr: Optional[Mapping[int, str]] = None,
        allow_debug: bool = False,
        dataframe: Optional[bool] = None,
    ) -> Any:
        """The compliance view (``ephem-batch ledger query``): one row per receipt, each with
        its verdict, filtered like the command. ``kind="usage"`` keeps only the usage receipts of
        online requests (``embed``, ``ephem-batch serve``), ``kind="job"`` only batch jobs. A pandas
        ``DataFrame`` when pandas is installed (``dataframe=False``: always a list of dicts)."""
        args: List[str] = []
        if isinstance(job, Job):
            job = job.id
        for flag, value in (("--job", job), ("--model", model), ("--pcr0", pcr0), ("--client", client), ("--kind", kind)):
            if value is not None:
                args += [flag, str(value)]
        for flag, when in (("--since", since), ("--until", until)):
            if when is not None:
                args += [flag, _time_arg(when)]
        args += _ledger_trust_args(ledger_key, root, development_root, expect_pcr, allow_debug)
        rows = json.loads(self._client._native.ledger_query(args))
        if dataframe is False:
            return rows
        try:
            import pandas as pd
        except ImportError:
            if dataframe:
                raise NotAvailableError("dataframe=True needs pandas (pip install pandas)") from None
            return rows
        return pd.DataFrame(rows)

    def reconcile_usage(
        self,
        *,
        ledger_key: Optional[str] = None,
        root: Optional[str] = None,
        development_root: Optional[Union[bool, str]] = None,
        expect_pcr: Optional[Mapping[int, str]] = None,
        allow_debug: bool = False,
    ) -> Dict[str, Any]:
        """This home's online usage against the ledger (``ephem-batch ledger reconcile-usage``):
        ``embed`` logs where the enclave accounted each answered request; every account must have
        a usage receipt with the log's count and commitment. A dict: ``passed``, ``log``,
        ``exchanges`` and ``periods`` (each with its ``outcome``: ``matched``, ``pending``,
        ``withheld``, ``commitment``, ``log_incomplete`` or ``unlogged``)."""
        args = _ledger_trust_args(ledger_key, root, development_root, expect_pcr, allow_debug)
        return json.loads(self._client._native.ledger_reconcile_usage(args))

    def prove(self, job: Union[str, Job], path: Optional[Union[str, "os.PathLike[str]"]] = None) -> ProofBundle:
        """Writes the job's offline proof bundle (``ephem-batch ledger prove``): its receipt,
        the attestation document, the inclusion proof and a signed checkpoint (one is signed
        first if none covers the entry yet), checked under the ledger's own key before it is
        written. ``path`` defaults to ``<home>/client/jobs/<id>/ledger-bundle.json``. Anyone can
        check it offline with :func:`ephem_batch.verify_bundle` and the ledger key."""
        job_id = job.id if isinstance(job, Job) else str(job)
        if path is None:
            path = os.path.join(self._client.home, "client", "jobs", job_id, "ledger-bundle.json")
        out = json.loads(self._client._native.ledger_prove(job_id, os.fspath(path)))
        return ProofBundle(path=os.fspath(out["path"]), ledger_key=out["ledger_key"], job_id=job_id)

    def prove_record(self, job: Union[str, Job], id: str, path: Optional[Union[str, "os.PathLike[str]"]] = None) -> RecordProof:
        """Writes the proof that record ``id`` came out of the job (``ephem-batch ledger
        prove-record``): that record's text, output and path to the receipt's record tree, and
        the job's ledger proof — nothing of the other records but hashes. The job's results are
        opened and its input file read again; they must rebuild the receipt's tree. ``path``
        defaults to ``<home>/client/jobs/<job>/record-<first 16 hex of SHA-256(id)>.json``. Checked offline with
        :func:`ephem_batch.verify_record`."""
        job_id = job.id if isinstance(job, Job) else str(job)
        if path is None:
            digest = hashlib.sha256(id.encode()).hexdigest()[:16]
            path = os.path.join(self._client.home, "client", "jobs", job_id, f"record-{digest}.json")
        kept = os.path.join(self._client.home, "client", "jobs", job_id, _KEPT_CORPUS)
        input_file = kept if os.path.exists(kept) else None
        out = json.loads(self._client._native.ledger_prove_record(job_id, id, os.fspath(path), input_file))
        return RecordProof(path=os.fspath(out["path"]), job_id=job_id, id=id, index=out["index"], records=out["records"])


def _time_arg(value: Union[int, str, _dt.datetime, _dt.date]) -> str:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return str(int(value.timestamp() * 1000))
    if isinstance(value, _dt.date):
        return value.isoformat()
    return str(value)


def _progress_bar(total: int, description: str) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit="rec")


def _corpus_file(source: Source, ids: Optional[Sequence[str]]) -> Tuple[str, Optional[str]]:
    """The path the library reads: ``source`` itself, or a private temporary JSON-lines file
    of its records (and the directory to remove once submitted)."""
    if isinstance(source, (str, os.PathLike)):
        if ids is not None:
            raise ConfigurationError("ids= goes with texts, not with a file (its lines carry their ids)")
        return os.fspath(source), None
    if isinstance(source, (bytes, bytearray)):
        raise ConfigurationError("source: a path (str), or an iterable of texts or {'id', 'text'} records, not bytes")
    items: Iterable[Any]
    if hasattr(source, "to_pylist"):  # pyarrow Array / ChunkedArray
        items = source.to_pylist()  # type: ignore[union-attr]
    elif hasattr(source, "tolist") and hasattr(source, "index"):  # pandas Series
        items = source.tolist()  # type: ignore[union-attr]
        if ids is None:
            ids = [str(i) for i in source.index]  # type: ignore[union-attr]
    else:
        items = source
    scratch = tempfile.mkdtemp(prefix="ephem-batch-")  # 0700: the texts are the user's alone
    path = os.path.join(scratch, "corpus.jsonl")
    id_iter = iter(ids) if ids is not None else None
    try:
        with open(path, "w", encoding="utf-8") as out:
            for n, item in enumerate(items):
                if isinstance(item, Mapping):
                    record = dict(item)
                    if id_iter is not None:
                        record["id"] = str(next(id_iter))
                elif isinstance(item, str):
                    record = {"id": str(next(id_iter)) if id_iter is not None else str(n), "text": item}
                else:
                    # Written as it is: the library refuses it as a line without text, and the
                    # job goes on with the rest.
                    record = {"id": str(next(id_iter)) if id_iter is not None else str(n), "text": item}
                try:
                    line = json.dumps(record, ensure_ascii=False)
                except (TypeError, ValueError):
                    # Not JSON: sent as a record without text, which the library refuses.
                    line = json.dumps({"id": str(record.get("id", n)), "text": None})
                out.write(line + "\n")
    except StopIteration:
        shutil.rmtree(scratch, ignore_errors=True)
        raise ConfigurationError("ids= has fewer ids than the source has records") from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return path, scratch


if sys.version_info < (3, 9):  # pragma: no cover
    raise ImportError("ephem_batch needs Python 3.9 or later")
