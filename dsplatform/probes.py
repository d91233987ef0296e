"""The one body every process answers ``GET /healthz`` and ``GET /readyz`` with.

Who calls it: the agent's API (:mod:`dsagent.api.routes`), the extender
(:mod:`scheduler_plugin.app`), the admission webhook (:mod:`dsagent.webhook.server`)
and the Dataset controller's metrics port (:mod:`dsagent.controller.controllermetrics`).
What it owns (docs/design.md#probes): the shape ``{"status": S}`` plus ``"detail"`` when
there is something to say, and which statuses are healthy, so that a script or a
``helm test`` reads every process alike.

- ``/healthz`` (liveness): ``200 {"status": "ok"}`` while the process serves.
- ``/readyz`` (readiness): ``200 {"status": "ready"}``, or ``503`` with ``starting``,
  ``syncing`` (the extender's node watch has not listed yet), ``stalled`` (the agent's
  blocking work waits for a thread) or ``stopping`` (the agent, told to stop, hands its
  stripe shares off) and a ``detail`` line.
"""

from __future__ import annotations

import json

OK = "ok"
READY = "ready"
#: statuses answered with 503: the process is alive but must not get traffic yet
NOT_READY = frozenset({"starting", "syncing", "stalled", "stopping"})


def body(status: str, detail: str | None = None) -> dict[str, str]:
    """The probe body for ``status`` (one of :data:`OK`, :data:`READY`, :data:`NOT_READY`)."""
    if status not in NOT_READY and status not in (OK, READY):
        raise ValueError(f"unknown probe status {status!r}")
    return {"status": status} if detail is None else {"status": status, "detail": detail}


def http_status(status: str) -> int:
    """200 for a healthy status, 503 for one of :data:`NOT_READY`."""
    return 503 if status in NOT_READY else 200


def encoded(status: str, detail: str | None = None) -> tuple[int, bytes]:
    """``(HTTP status, JSON bytes)`` for a server without a framework."""
    return http_status(status), json.dumps(body(status, detail)).encode()


__all__ = ["NOT_READY", "OK", "READY", "body", "encoded", "http_status"]
