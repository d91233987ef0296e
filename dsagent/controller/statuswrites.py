"""A pass's Dataset status writes, several at once.

Who calls it: :class:`dsagent.controller.reconcile.DatasetController`. A pass writes the
status of each Dataset whose status changed (a JSON merge patch). Against a real API
server each write is a round trip of several milliseconds, so with many Datasets changing
at once (a controller's first pass writes every one) writes made one after another would
be most of a pass's time. During a pass they go to :data:`WRITERS` threads while the pass
reconciles the next Datasets, and the pass waits for every one before it ends (:meth:`settle`):
a pass is over only once what it decided is written, and one write failing does not stop
the others. Outside a pass (a caller reconciling one Dataset) a write is made at once. The
``kubernetes`` client's connection pool is shared safely between threads.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from dsagent.kube.datasets import GROUP, MERGE_PATCH, PLURAL, VERSION

#: status writes in flight at once during a pass
WRITERS = 8

Key = tuple[str, str]  # (namespace, name) of a Dataset


class StatusWrites:
    """The status writes of one controller (see the module docstring)."""

    def __init__(self, custom: Any, *, timeout: float | None) -> None:
        self._custom, self._timeout = custom, timeout
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Key, Future[Any]]] | None = None  # None: not in a pass

    def begin(self) -> None:
        """A pass starts: writes are made in the background until :meth:`settle`."""
        self._pending = []

    def write(self, namespace: str, name: str, changed: dict[str, Any]) -> None:
        """Merge ``changed`` into the Dataset's status (at once outside a pass)."""
        call = partial(
            self._custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": changed},
            _content_type=MERGE_PATCH,
            _request_timeout=self._timeout,
        )
        if self._pending is None:
            call()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="status-write")
        self._pending.append(((namespace, name), self._pool.submit(call)))

    def settle(self) -> dict[Key, BaseException]:
        """Wait for the pass's writes; the Datasets whose write failed, with the error. Writes
        are made at once again until the next :meth:`begin`."""
        pending, self._pending = self._pending or [], None
        failed: dict[Key, BaseException] = {}
        for key, done in pending:
            error = done.exception()
            if error is not None:
                failed[key] = error
        return failed


__all__ = ["WRITERS", "StatusWrites"]
