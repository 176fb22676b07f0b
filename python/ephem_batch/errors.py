"""The exceptions of the SDK. Every failure is one of these, never a bare string: the failed
check, the job and the state are attributes, so a pipeline can branch on them."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

__all__ = [
    "EphemBatchError",
    "ConfigurationError",
    "VerificationError",
    "JobFailedError",
    "WaitTimeoutError",
    "NotAvailableError",
    "OnlineError",
]


class EphemBatchError(Exception):
    """Base class of every error the SDK raises. ``check`` names the failed check when there is
    one (``None`` otherwise)."""

    check: Optional[str] = None

    def __init__(self, message: str, *, check: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        if check is not None:
            self.check = check


class ConfigurationError(EphemBatchError):
    """The client's configuration (arguments or ``EPHEM_*`` variables) is not valid."""


class VerificationError(EphemBatchError):
    """A check of the job's receipt, attestation, output or ledger entry failed.

    ``check`` is the first failed check's name (``receipt``, ``receipt_attestation``,
    ``job_id``, ``model``, ``options``, ``result_key``, ``fleet_key``, ``records``,
    ``input_sha256``, ``output_sha256``, ``record_ids``, ``commitment``, ``ledger``,
    ``manifest``); ``failed`` lists every failed check as ``(name, detail)``; ``verification``
    is the whole :class:`~ephem_batch.Verification` when one was made."""

    def __init__(
        self,
        message: str,
        *,
        check: str = "",
        failed: Sequence[Tuple[str, str]] = (),
        verification: "Optional[object]" = None,
    ) -> None:
        super().__init__(message, check=check)
        self.failed: List[Tuple[str, str]] = [tuple(f) for f in failed]  # type: ignore[misc]
        self.verification = verification


class JobFailedError(EphemBatchError):
    """The job failed in the deployment; ``check`` is the check it failed there."""

    def __init__(self, message: str, *, job_id: str = "", check: Optional[str] = None) -> None:
        super().__init__(message, check=check)
        self.job_id = job_id


class WaitTimeoutError(EphemBatchError, TimeoutError):
    """``wait`` gave up; the job goes on (``state`` is where it stood)."""

    def __init__(self, message: str, *, job_id: str = "", state: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class NotAvailableError(EphemBatchError, NotImplementedError):
    """What was asked for does not exist in this deployment or this version."""


class OnlineError(EphemBatchError):
    """An online (query-time) request was refused. ``check`` is the code that names why —
    ``attestation`` (the fleet's document failed a check; nothing was sent), ``replay``,
    ``encapsulation``, ``relay``, or an OpenAI error code such as ``model_not_found`` or
    ``context_length_exceeded``; ``status`` is the HTTP status ``serve`` would answer."""

    status: Optional[int] = None

    def __init__(self, message: str, *, check: Optional[str] = None, status: Optional[int] = None) -> None:
        super().__init__(message, check=check)
        self.status = status
