"""The one error tree of the scheduler_plugin package.

Every error the extender raises on purpose derives from :class:`SchedulerPluginError`.
Like ``dsagent.errors`` (which this package must not import), each class carries the
HTTP status, the ``dsctl`` exit code and a short machine-readable ``code``. The two
edges are the HTTP app (which, for kube-scheduler's verbs, never answers with an error
status: see :mod:`scheduler_plugin.app`) and the CLI's ``main``.

    SchedulerPluginError (500, exit 1)
    ├── InvalidRequest (400, exit 2)          a request body or query that is not what the
    │   │                                     extender protocol or endpoint expects
    │   └── SettingsError                     a DSEXT_* value or flag is invalid
    └── ViewUnavailable (503, exit 7)         the watch-backed cluster view is not synced yet
"""

from __future__ import annotations

from typing import Any, ClassVar


class SchedulerPluginError(Exception):
    """Base of every deliberate scheduler_plugin error."""

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
        """The JSON body the non-extender endpoints answer with."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        if self.details:
            body["details"] = self.details
        return body


class InvalidRequest(SchedulerPluginError):
    http_status = 400
    exit_code = 2
    code = "invalid_request"


class SettingsError(InvalidRequest):
    code = "invalid_setting"


class ViewUnavailable(SchedulerPluginError):
    http_status = 503
    exit_code = 7
    code = "unavailable"


__all__ = ["InvalidRequest", "SchedulerPluginError", "SettingsError", "ViewUnavailable"]
