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

__all__ = ["ProofBundle", "BundleVerification", "verify_bundle"]


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
    if job is not None:
        args += ["--job", str(getattr(job, "id", job))]
    if home is not None:
        args += ["--home", os.fspath(home)]
    out = json.loads(_native.verify_bundle(os.fspath(path), args))
    error = out.get("error") or {}
    result = BundleVerification(
        valid=bool(out["valid"]), check=error.get("check"), message=error.get("message"), proven=out.get("proven")
    )
    if raise_on_failure and not result.valid:
        check = result.check or "bundle"
        raise VerificationError(
            f"proof bundle {os.fspath(path)} is invalid: {check}: {result.message}",
            check=check,
            failed=[(check, result.message or "")],
            verification=result,
        )
    return result
