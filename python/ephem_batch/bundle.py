"""Offline proof bundles: ``client.ledger.prove(job)`` writes one, :func:`verify_bundle` checks
one against a ledger key you pin, with no client, backend or network. Both are the client
library's ``ledger prove`` / ``ledger verify-bundle`` (python/src/lib.rs), not checks written
here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

from . import _native
from .errors import VerificationError

__all__ = ["ProofBundle", "BundleVerification", "verify_bundle", "RecordProof", "RecordVerification", "verify_record"]


@dataclass(frozen=True)
class ProofBundle:
    """A bundle ``client.ledger.prove`` wrote: its ``path`` and the ``ledger_key`` it verified
    under when written (publish that key out of band: a verifier must pin it, never take it
    from the bundle). Usable as a path (``os.fspath``)."""

    path: str
    ledger_key: str
    job_id: str

    def __fspath__(self) -> str:
        return self.path


@dataclass(frozen=True)
class BundleVerification:
    """What :func:`verify_bundle` found. ``valid``; for an invalid bundle ``check`` (the failed
    check: ``bundle``, ``checkpoint``, ``tree_size``, ``inclusion``, a receipt check such as
    ``receipt_attestation``, or ``job``) and ``message``; for a valid one ``proven``: the
    receipt's fields (``job_id``, ``model_id``, ``pcr0``, ``ok_count``, ``tokens``,
    ``leaf_index``, ``tree_size``, ``tree_root``, ``ledger_key``, …)."""

    valid: bool
    check: Optional[str]
    message: Optional[str]
    proven: Optional[Dict[str, Any]] = field(default=None, repr=False)

    @property
    def job_id(self) -> Optional[str]:
        return None if self.proven is None else self.proven.get("job_id")


def verify_bundle(
    path: Union[str, "os.PathLike[str]"],
    ledger_key: Optional[str] = None,
    root: Optional[str] = None,
    *,
    development_root: Optional[Union[bool, str, "os.PathLike[str]"]] = None,
    expect_pcr: Optional[Mapping[int, str]] = None,
    allow_debug: bool = False,
    job: Optional[Any] = None,
    home: Optional[Union[str, "os.PathLike[str]"]] = None,
    raise_on_failure: bool = True,
) -> BundleVerification:
    """Checks a proof bundle offline (``ephem-batch ledger verify-bundle``): its form, the
    checkpoint's signature under the pinned ``ledger_key`` (a verifier key string or a file
    holding one; default ``$EPHEM_LEDGER_KEY``; the key the bundle names is never trusted), the
    inclusion proof, the receipt and its attestation document under ``root`` (``"aws-nitro-g1"``,
    the default, or a PEM file; ``development_root=PEM`` for a development stack's root,
    ``True`` for ``$EPHEM_HOME``'s), and with ``job`` that it proves that job.

    Raises :class:`VerificationError` whose ``check`` names the failed check (unless
    ``raise_on_failure=False``); unusable options raise :class:`ConfigurationError`."""
    args = _trust_args(ledger_key, root, development_root, expect_pcr, allow_debug, home)
    if job is not None:
        args += ["--job", str(getattr(job, "id", job))]
    out = json.loads(_native.verify_bundle(os.fspath(path), args))
    return _verdict(BundleVerification, "proof bundle", path, out, raise_on_failure)


def _verdict(kind: Any, what: str, path: Any, out: Dict[str, Any], raise_on_failure: bool) -> Any:
    """The library's JSON verdict as ``kind``; an invalid one raised as :class:`VerificationError`
    naming its check, unless ``raise_on_failure`` is false."""
    error = out.get("error") or {}
    result = kind(valid=bool(out["valid"]), check=error.get("check"), message=error.get("message"), proven=out.get("proven"))
    if raise_on_failure and not result.valid:
        check = result.check or "bundle"
        raise VerificationError(
            f"{what} {os.fspath(path)} is invalid: {check}: {result.message}",
            check=check,
            failed=[(check, result.message or "")],
            verification=result,
        )
    return result


def _trust_args(
    ledger_key: Optional[str],
    root: Optional[str],
    development_root: Optional[Union[bool, str, "os.PathLike[str]"]],
    expect_pcr: Optional[Mapping[int, str]],
    allow_debug: bool,
    home: Optional[Union[str, "os.PathLike[str]"]],
) -> list:
    """The command-line options an offline check pins (the CLI parses them)."""
    args = []
    if ledger_key is not None:
        args += ["--ledger-key", os.fspath(ledger_key)]
    if root is not None:
        args += ["--root", os.fspath(root)]
    if development_root is True:
        args += ["--development-root"]
    elif development_root not in (None, False):
        args += ["--development-root", os.fspath(development_root)]  # type: ignore[arg-type]
    for index, value in (expect_pcr or {}).items():
        args += ["--expect-pcr", f"{index}={value}"]
    if allow_debug:
        args += ["--allow-debug"]
    if home is not None:
        args += ["--home", os.fspath(home)]
    return args


@dataclass(frozen=True)
class RecordProof:
    """A record bundle ``client.ledger.prove_record`` wrote: its ``path``, the record's ``index``
    among the job's embedded records and the tree's size ``records``. Usable as a path."""

    path: str
    job_id: str
    id: str
    index: int
    records: int

    def __fspath__(self) -> str:
        return self.path


@dataclass(frozen=True)
class RecordVerification:
    """What :func:`verify_record` found. ``valid``; for an invalid bundle ``check`` (``bundle``,
    a check of :func:`verify_bundle`, ``record_tree``, ``record``, ``record_tree_size`` or
    ``record_inclusion``) and ``message``; for a valid one ``proven``: the record's ``id``,
    ``text``, ``vector``, ``tokens`` and the receipt's fields."""

    valid: bool
    check: Optional[str]
    message: Optional[str]
    proven: Optional[Dict[str, Any]] = field(default=None, repr=False)


def verify_record(
    path: Union[str, "os.PathLike[str]"],
    ledger_key: Optional[str] = None,
    root: Optional[str] = None,
    *,
    development_root: Optional[Union[bool, str, "os.PathLike[str]"]] = None,
    expect_pcr: Optional[Mapping[int, str]] = None,
    allow_debug: bool = False,
    home: Optional[Union[str, "os.PathLike[str]"]] = None,
    raise_on_failure: bool = True,
) -> RecordVerification:
    """Checks a record bundle offline (``ephem-batch ledger verify-record``): the job's ledger
    proof and receipt as :func:`verify_bundle` does, then that the opened record (its text, id
    and vector) is a leaf of the receipt's record tree. Options as :func:`verify_bundle`.

    Raises :class:`VerificationError` whose ``check`` names the failed check (unless
    ``raise_on_failure=False``)."""
    args = _trust_args(ledger_key, root, development_root, expect_pcr, allow_debug, home)
    out = json.loads(_native.verify_record(os.fspath(path), args))
    return _verdict(RecordVerification, "record bundle", path, out, raise_on_failure)
