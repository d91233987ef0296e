"""The one error tree of the dsagent package.

Every error the agent or ``dsctl`` raises on purpose derives from :class:`DsagentError`.
Each class carries the HTTP status the API answers with, the exit code ``dsctl`` exits
with, and a short machine-readable ``code``. Exactly two edges translate them: the API's
exception handler and the CLI's ``main``. Domain code never raises framework exceptions,
and foreign exceptions (``OSError`` from fsspec, ``sqlite3.Error``, ``zstd`` errors) are
translated where they enter, with ``raise ... from exc``.

    DsagentError (500, exit 1)
    ├── InvalidInput (400, exit 2)            bad names, URLs, sizes, settings, flags
    │   └── SettingsError                     a DSAGENT_* value or flag is invalid
    ├── Unauthorized (401, exit 9)            operator action without a valid admin token
    ├── StorageCredentials (403, exit 11)     the dataset source or bundle store has no, or refused, credentials
    ├── StorageForbidden (403, exit 12)       the store knows the credentials but refuses the action
    ├── Forbidden (403, exit 9)               a pod acting on another pod's task, or evicting
    ├── NotFound (404, exit 3)                unknown dataset, task, manifest or bundle
    │   └── BundleMissing                     --bundles store has no manifest for the dataset
    ├── Conflict (409, exit 4)                dataset in use, task already holds another set
    ├── IntegrityError (422, exit 5)          digest mismatch, truncated or tampered bundle
    │   └── UnsafeArchive                     a member that would escape its target
    ├── InsufficientSpace (507, exit 6)       cannot free enough space (gives the numbers)
    └── TransientError (503, exit 7)          worth retrying: source or agent unreachable
        ├── SourceUnavailable                 the dataset source or bundle store failed
        └── AgentUnreachable (exit 8)         dsctl could not reach the local agent

"Transient vs permanent" is a type: retry only :class:`TransientError`.

Storage refusals answer 403, not 401: a 401 from the agent means the *caller* lacks the
agent's admin token (:class:`Unauthorized`); a 403 says the agent reached the store and the
store refused the agent. The exit codes are listed in the README's "Exit codes" table,
which ``tests/test_exit_codes.py`` checks against these classes.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DsagentError(Exception):
    """Base of every deliberate dsagent error."""

    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, Any]:
        """The JSON body the API answers with."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        if self.details:
            body["details"] = self.details
        return body


class InvalidInput(DsagentError):
    http_status = 400
    exit_code = 2
    code = "invalid_input"


class SettingsError(InvalidInput):
    code = "invalid_setting"


class Unauthorized(DsagentError):
    http_status = 401
    exit_code = 9
    code = "unauthorized"


class StorageCredentials(DsagentError):
    http_status = 403
    exit_code = 11
    code = "credentials"


class StorageForbidden(DsagentError):
    http_status = 403
    exit_code = 12
    code = "storage_forbidden"


class Forbidden(DsagentError):
    http_status = 403
    exit_code = 9
    code = "forbidden"


class NotFound(DsagentError):
    http_status = 404
    exit_code = 3
    code = "not_found"


class Conflict(DsagentError):
    http_status = 409
    exit_code = 4
    code = "conflict"


class IntegrityError(DsagentError):
    http_status = 422
    exit_code = 5
    code = "integrity"


class UnsafeArchive(IntegrityError):
    code = "unsafe_archive"


class InsufficientSpace(DsagentError):
    http_status = 507
    exit_code = 6
    code = "insufficient_space"


class TransientError(DsagentError):
    http_status = 503
    exit_code = 7
    code = "unavailable"


class SourceUnavailable(TransientError):
    code = "source_unavailable"


class AgentUnreachable(TransientError):
    exit_code = 8
    code = "agent_unreachable"


__all__ = [
    "AgentUnreachable",
    "Conflict",
    "DsagentError",
    "Forbidden",
    "InsufficientSpace",
    "IntegrityError",
    "InvalidInput",
    "NotFound",
    "SettingsError",
    "SourceUnavailable",
    "StorageCredentials",
    "StorageForbidden",
    "TransientError",
    "UnsafeArchive",
    "Unauthorized",
]


class BundleMissing(NotFound):
    """The bundle store a request names has no manifest for the dataset (the store itself
    answered: an unreachable store stays :class:`SourceUnavailable`). Refused unless the
    request allows the per-file path (``allowPerFile`` / ``dsctl cache --allow-per-file``)."""

    code = "bundle_missing"


__all__ += ["BundleMissing"]
