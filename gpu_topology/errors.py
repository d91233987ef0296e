"""The one error tree of the gpu_topology package.

Every error this library raises on purpose derives from :class:`TopologyError`. Like
``dsagent.errors``, each class carries the HTTP status an API would answer with, the exit
code ``dsctl`` exits with, and a short machine-readable ``code``; the library itself never
exits or answers HTTP. Foreign errors (``subprocess``, ``OSError``, XML and NVML errors)
are translated where they enter, with ``raise ... from exc``.

    TopologyError (500, exit 1)
    ├── InvalidTopology (400, exit 2)        a topology or request that makes no sense
    │   ├── ParseError                       text/XML/JSON that cannot be read (says where)
    │   └── UnknownDevice                    a GPU index or NIC name the topology lacks
    └── DiscoveryError (503, exit 7)         discovering the local machine failed
        └── BackendUnavailable (exit 10)     a backend cannot run here (says what to install)
"""

from __future__ import annotations

from typing import Any, ClassVar


class TopologyError(Exception):
    """Base of every deliberate gpu_topology error."""

    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    code: ClassVar[str] = "topology_error"

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, Any]:
        """A JSON body describing the error, in the same shape as dsagent's."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        if self.details:
            body["details"] = self.details
        return body


class InvalidTopology(TopologyError):
    http_status = 400
    exit_code = 2
    code = "invalid_topology"


class ParseError(InvalidTopology):
    code = "topology_parse_error"


class UnknownDevice(InvalidTopology):
    code = "unknown_device"


class DiscoveryError(TopologyError):
    http_status = 503
    exit_code = 7
    code = "discovery_failed"


class BackendUnavailable(DiscoveryError):
    exit_code = 10
    code = "backend_unavailable"
