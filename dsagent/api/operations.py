"""Long actions as operations: an eviction or a release that the client can follow.

Who calls it: the ``/v1`` routes that may run longer than a client waits (``POST
/v1/evict``, ``DELETE /v1/datasets/{name}``, ``DELETE /v1/tasks/{id}``) and ``GET
/v1/operations/{id}``. What it owns: the running and recently finished operations of this
agent process, in memory.

Deleting a million-file dataset takes longer than any sensible HTTP timeout, and a client
that gave up could only say "the agent did not answer in time" about an eviction that
then happened. So each such action runs as an asyncio task here: the route waits for it
up to the request's ``wait`` (bounded) and answers the result as before (200) when it
finished in time, else ``202 Accepted`` with the operation and a ``Location`` to poll
(``GET /v1/operations/{id}?wait=S`` long-polls). Kubernetes answers a slow DELETE the
same way (200 with the result, 202 while it goes on).

Bounds: at most :data:`MAX_RUNNING` operations run at once (the next is a 503, worth
retrying); finished ones are kept :data:`KEEP_SECONDS` and at most :data:`KEEP_FINISHED`
of them, oldest dropped first. Operations live in the process: after an agent restart an
id is unknown (404), and the action itself was either done or rolled back by the
service's start-up recovery (docs/design.md#cache-layout).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dsagent.cache.task import iso
from dsagent.errors import DsagentError, NotFound, TransientError

log = logging.getLogger("dsagent.api")

#: operations running at once on one agent
MAX_RUNNING = 16
#: how long a finished operation can still be read
KEEP_SECONDS = 3600.0
#: finished operations kept at most
KEEP_FINISHED = 256
#: the longest a request (the action's or a poll's) is held open waiting for an operation
MAX_WAIT_SECONDS = 60.0
#: the ``wait`` of an action request that names none: long enough for an ordinary eviction,
#: short enough for any client's timeout
DEFAULT_WAIT_SECONDS = 10.0


@dataclass
class Operation:
    """One action the agent carries out for a caller."""

    id: str
    kind: str  # "evict" or "release"
    owner: str  # who may read it: "operator" or the pod UID whose task it is
    target: str  # what it acts on, for people: "names=imagenet", "task=<id>"
    started: float
    job: asyncio.Task[dict[str, Any]] = field(repr=False)
    finished: float | None = None

    @property
    def state(self) -> str:
        if not self.job.done():
            return "running"
        if self.job.cancelled() or self.job.exception() is not None:
            return "failed"
        return "succeeded"

    def result(self) -> dict[str, Any]:
        """The action's answer; raises its error when it failed (a bug's own exception, for the
        API's edge to log and answer 500)."""
        if self.job.cancelled():
            raise self.error() or TransientError(f"operation {self.id} was stopped")
        return self.job.result()

    def error(self) -> DsagentError | None:
        """What made the action fail (None while it runs, or when it succeeded)."""
        if not self.job.done():
            return None
        if self.job.cancelled():
            return TransientError(f"operation {self.id} was stopped with the agent", hint="run the action again")
        exc = self.job.exception()
        if exc is None or isinstance(exc, DsagentError):
            return exc
        return DsagentError(f"operation {self.id} failed: internal error")  # details stay in the log


class Operations:
    """The agent's operations (one per app)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._ops: dict[str, Operation] = {}

    def start(self, kind: str, owner: str, target: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> Operation:
        """Run ``action`` as a new operation (503 when :data:`MAX_RUNNING` are running)."""
        self._forget_old()
        if sum(1 for op in self._ops.values() if op.state == "running") >= MAX_RUNNING:
            raise TransientError(
                f"{MAX_RUNNING} operations are running on this agent", hint="retry when one of them has finished"
            )

        async def run() -> dict[str, Any]:
            return await action()

        op_id = f"{kind}-{secrets.token_hex(8)}"
        op = Operation(
            id=op_id, kind=kind, owner=owner, target=target, started=self._clock(), job=asyncio.create_task(run())
        )
        op.job.add_done_callback(lambda _job: self._finish(op))
        self._ops[op_id] = op
        return op

    def _finish(self, op: Operation) -> None:
        op.finished = self._clock()
        exc = None if op.job.cancelled() else op.job.exception()  # a failure is the operation's state
        if exc is not None and not isinstance(exc, DsagentError):  # a bug: its traceback in the log
            log.error("operation %s (%s %s) failed", op.id, op.kind, op.target, exc_info=exc)

    def get(self, op_id: str) -> Operation:
        self._forget_old()
        op = self._ops.get(op_id)
        if op is None:
            raise NotFound(
                f"no operation {op_id!r} on this agent",
                hint=f"finished operations are kept {KEEP_SECONDS / 60:.0f} min and not across agent restarts",
            )
        return op

    async def wait(self, op: Operation, seconds: float) -> bool:
        """Wait up to ``seconds`` (at most :data:`MAX_WAIT_SECONDS`) for ``op``; True when it has
        finished. Cancelling the waiter never cancels the operation."""
        if not op.job.done() and seconds > 0:
            await asyncio.wait({op.job}, timeout=min(seconds, MAX_WAIT_SECONDS))  # never cancels, never raises
        else:
            await asyncio.sleep(0)  # an action that needs no wait finishes within the request
        return op.job.done()

    async def close(self) -> None:
        """Stop the running operations (the agent is stopping)."""
        running = [op.job for op in self._ops.values() if not op.job.done()]
        for job in running:
            job.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    def _forget_old(self) -> None:
        now = self._clock()
        finished = sorted(
            (op for op in self._ops.values() if op.finished is not None), key=lambda op: op.finished or 0.0
        )
        for n, op in enumerate(finished):
            if now - (op.finished or now) > KEEP_SECONDS or len(finished) - n > KEEP_FINISHED:
                self._ops.pop(op.id, None)


def operation_out(op: Operation, *, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """The wire form of an operation (``OperationOut``)."""
    error = op.error()
    result = op.job.result() if op.state == "succeeded" else None
    end = op.finished if op.finished is not None else clock()
    return {
        "id": op.id,
        "kind": op.kind,
        "target": op.target,
        "state": op.state,
        "startedAt": iso(op.started),
        "finishedAt": iso(op.finished) if op.finished is not None else None,
        "elapsedSeconds": round(max(0.0, end - op.started), 3),
        "href": f"/v1/operations/{op.id}",
        "result": result,
        "error": None if error is None else error.to_dict(),
    }


__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "KEEP_FINISHED",
    "KEEP_SECONDS",
    "MAX_RUNNING",
    "MAX_WAIT_SECONDS",
    "Operation",
    "Operations",
    "operation_out",
]
