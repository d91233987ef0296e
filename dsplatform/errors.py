"""The one error base of the platform, its shared families, and the process edge.

Every error any package raises on purpose derives from :class:`PlatformError`. Each class
carries the four facts its edges need: a short machine-readable ``code``, the HTTP status an
API answers with, the exit code a command exits with, and the gRPC status a kubelet plugin
answers with (the name of a ``grpc.StatusCode`` member, so that this package needs no grpc;
:mod:`dsagent.nodeplugins.grpcstatus` turns it into the code). Each package draws its own tree
under this base (``dsagent.errors``, ``gpu_topology.errors``, ``scheduler_plugin.errors``);
the families below are the kinds more than one package has.

    PlatformError (500, exit 1, INTERNAL)     code "internal"
    ├── InvalidInput (400, exit 2, INVALID_ARGUMENT)
    │   ├── CannotListen                      dsplatform.serving: a listening address that cannot be bound
    │   ├── NamespaceError                    dsplatform.netns: a network namespace that cannot be entered
    │   └── VocabularyError                   a shared rule broken (a name, a size, a duration);
    │       │                                 also a ValueError, so pydantic and click accept it
    │       ├── UnitError                     dsplatform.units
    │       ├── JsonRefused                   dsplatform.boundedjson
    │       ├── InvalidSettings               dsplatform.settings
    │       ├── UnknownSettings               dsplatform.settings: a variable no settings class declares
    │       ├── QuantityError                 dsplatform.gpus: a resource quantity that is not one
    │       ├── KubeTimeError                 dsplatform.kubetime: not an RFC 3339 time
    │       └── LayoutError                   dsplatform.stripe: a stripe layout or group that breaks its format
    ├── Superseded (410, exit 15, NOT_FOUND)  a version another one replaced in the store: not worth
    │                                         retrying (dsplatform.data's reader raises it)
    └── Unavailable (503, exit 7, UNAVAILABLE)  worth retrying
        ├── ReaderError                       dsplatform.data: a bundle no endpoint could give
        ├── Gone                              dsplatform.listwatch: a watch's resourceVersion is too old
        └── Absent                            dsplatform.listwatch: a resource is not served (no CRD)

One exception outside the tree: ``dsplatform.boundedjson.DuplicateKey``, a ValueError raised
inside ``json.loads``' object hook, which every parser turns into its refusal where it
enters (a :class:`JsonRefused`, the extender's ``BodyNotJson``).

Errors become exit codes in one place: :func:`exit_on_error`, which every process's entry
point runs under (``dsctl``, ``dsagent``, the webhook, the controller, the extender). Errors
become HTTP answers in each API's exception handler, and gRPC statuses in the one helper of
the kubelet plugins. Nothing else sets an exit code from an error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, NoReturn


class PlatformError(Exception):
    """Base of every deliberate error of the platform; ``str()`` is the one line an edge prints."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    grpc_status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, Any]:
        """The JSON body an API answers with: ``{"code", "message", "hint"?, "details"?}``."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        if self.details:
            body["details"] = self.details
        return body


class InvalidInput(PlatformError):
    """Input that makes no sense: a name, size, flag, setting, request or document."""

    code = "invalid_input"
    http_status = 400
    exit_code = 2
    grpc_status = "INVALID_ARGUMENT"


class Unavailable(PlatformError):
    """Something this needs is not there or not ready yet: worth retrying."""

    code = "unavailable"
    http_status = 503
    exit_code = 7
    grpc_status = "UNAVAILABLE"


class Superseded(PlatformError):
    """The version asked for is gone for good: another version of the name replaced it in
    the store. Not worth retrying; whoever pinned it must ask for the current one."""

    code = "superseded"
    http_status = 410
    exit_code = 15
    grpc_status = "NOT_FOUND"


class VocabularyError(InvalidInput, ValueError):
    """Input that breaks one of the shared rules (a name, a size, a duration)."""


def exit_with(error: PlatformError, prog: str, *, now: bool = False) -> NoReturn:
    """The process edge: ``error`` as one line on stderr, and its exit code; ``now``: at
    once (``os._exit``), for a process whose threads are stuck in blocking calls."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    if now:
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(error.exit_code)
    raise SystemExit(error.exit_code)


@contextmanager
def exit_on_error(prog: str) -> Iterator[None]:
    """Run a process's entry point: a deliberate error leaving the block ends the process
    through :func:`exit_with`; anything else passes (a bug keeps its traceback)."""
    try:
        yield
    except PlatformError as exc:
        exit_with(exc, prog)


__all__ = [
    "InvalidInput",
    "PlatformError",
    "Superseded",
    "Unavailable",
    "VocabularyError",
    "exit_on_error",
    "exit_with",
]
