"""List, then watch, Kubernetes resources: the loop every reader that keeps a resource
current runs (the extender's node cache, :mod:`scheduler_plugin.nodecache`; the node
watch of the controller and the webhook, :mod:`dsagent.kube.nodewatch`), one rule for all.

:class:`Watches` owns the part that is the same for every resource: a full list in pages,
a watch from its ``resourceVersion`` with bookmarks that resumes where it stopped, a new
list on ``410 Gone``, and a supervisor that runs a resource's loop until stopped, trying
again after ``retry_s`` when it fails (tenacity, fixed waits) and after ``absent_retry_s``
when the resource is not served (:class:`Absent`: its CRD is not installed). What the
reader keeps of each object is its own loop's.

It uses no ``kubernetes`` import (the vocabulary imports no client): the caller passes the
client's list functions (``CoreV1Api.list_node``, a ``functools.partial`` of
``list_cluster_custom_object``: called with ``_preload_content=False``, raw JSON) and its
line reader (``kubernetes.watch.watch.iter_resp_lines``); a client error is read by its
``status``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import tenacity

from dsplatform.errors import Unavailable

HTTP_NOT_FOUND, HTTP_GONE = 404, 410

ListFn = Callable[..., Any]
Lines = Callable[[Any], Iterable[str | bytes]]


class Gone(Unavailable):
    """The resourceVersion watched from is too old: list again."""

    code = "watch_expired"


class Absent(Unavailable):
    """The resource is not served (its CRD is not installed): asked for again later."""

    code = "resource_absent"


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a client error (``ApiException.status``), None for other failures."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class Watches:
    """The list+watch loops of one reader (module docstring); :meth:`stop` ends them all."""

    def __init__(
        self,
        lines: Lines,
        log: logging.Logger,
        *,
        watch_timeout_s: int = 300,
        retry_s: float = 1.0,
        absent_retry_s: float = 60.0,
        page_size: int = 500,
        request_timeout: float | None = None,
        loads: Callable[[bytes], Any] = json.loads,
    ) -> None:
        self._lines, self._log, self._loads = lines, log, loads
        self.watch_timeout_s, self.retry_s, self.absent_retry_s = watch_timeout_s, retry_s, absent_retry_s
        self.page_size, self.request_timeout = page_size, request_timeout
        self.stopping = threading.Event()
        self.versions: dict[str, str] = {}  # resource -> the last resourceVersion seen (lists, events, bookmarks)
        # the resources whose list or watch failed and whose watch has not opened since: a
        # list that succeeds between two failing watches is a snapshot, not a live resource
        self.failing: set[str] = set()
        self._responses: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    # -- life cycle ------------------------------------------------------------------------

    def start(self, kind: str, run: Callable[[], None], *, thread_name: str) -> None:
        """Run ``run`` (a resource's list, then its watch) on a daemon thread until stopped."""
        thread = threading.Thread(target=self.supervise, args=(kind, run), name=thread_name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        # set before the responses are read: a watch opening now sees the flag once its
        # response is recorded (:meth:`watch`), so none is left blocked reading its stream
        self.stopping.set()
        for response in list(self._responses.values()):
            try:
                # shutdown() (urllib3 >= 2.3) wakes the thread blocked reading the stream;
                # close() alone would wait for the next event or the watch timeout
                getattr(response, "shutdown", response.close)()
            except Exception:  # the stream may end under us; either way the thread exits
                pass
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def supervise(self, kind: str, run: Callable[[], None]) -> None:
        """Run ``run`` until stopped; tenacity tries it again after ``retry_s`` when the API
        server or the network failed, after ``absent_retry_s`` when the resource is not served."""

        def once() -> None:
            if self.stopping.is_set():
                return
            try:
                run()
            except Gone:
                self._log.info("watch of %s expired (410 Gone); listing again", kind)

        def wait(state: tenacity.RetryCallState) -> float:
            failed = state.outcome.exception() if state.outcome is not None else None
            return self.absent_retry_s if isinstance(failed, Absent) else self.retry_s

        def report(state: tenacity.RetryCallState) -> None:
            failed = state.outcome.exception() if state.outcome is not None else None
            if isinstance(failed, Absent):  # an answer, not a failure: the reader goes on without it
                self.failing.discard(kind)
                self._log.info("%s; checking again in %.0fs", failed, self.absent_retry_s)
            else:
                self.failing.add(kind)
                self._log.warning("watch of %s failed: %s; retrying in %.1fs", kind, failed, self.retry_s)

        def sleep(seconds: float) -> None:
            self.stopping.wait(seconds)

        retrying = tenacity.Retrying(
            wait=wait, stop=tenacity.stop_when_event_set(self.stopping), sleep=sleep, before_sleep=report
        )
        while not self.stopping.is_set():
            try:
                retrying(once)
            except tenacity.RetryError:  # stopped while failing
                return

    # -- list and watch --------------------------------------------------------------------

    def list(
        self, kind: str, list_fn: ListFn, *, absent: str | None = None, each: Callable[[Any], Any] | None = None
    ) -> tuple[list[Any], str]:
        """Every object of ``kind``, in pages of ``page_size``, and the list's resourceVersion.
        ``absent``: the resource may not be served; a 404 is then :class:`Absent` with it as
        the message. ``each``: what is kept of an object, applied page by page (the whole
        list is never held as sent). Each request waits at most ``request_timeout`` (None:
        the client's)."""
        items: list[Any] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            if self.request_timeout is not None:
                kwargs["_request_timeout"] = self.request_timeout
            try:
                response = list_fn(**kwargs)
            except Exception as exc:
                if absent is not None and status_of(exc) == HTTP_NOT_FOUND:
                    raise Absent(absent) from exc
                raise
            doc = self._loads(response.data)
            page = doc.get("items") or ()
            items.extend(map(each, page) if each is not None else page)
            meta = doc.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                version = str(meta.get("resourceVersion") or "")
                self.versions[kind] = version
                return items, version

    def watch(self, kind: str, list_fn: ListFn, version: str) -> Iterator[tuple[str, Any]]:
        """``(type, object)`` of each change of ``kind`` after ``version``, until stopped:
        the watch is opened again where it ended (its timeout, a bookmark's version);
        :class:`Gone` when the version is too old. A version is recorded in
        :attr:`versions` once its event is handled. With a ``request_timeout``, a stream that
        sends nothing for that long after the watch's own timeout is given up (a dead connection)."""
        timeout = self.request_timeout
        extra = {"_request_timeout": (timeout, self.watch_timeout_s + timeout)} if timeout is not None else {}
        while not self.stopping.is_set():
            try:
                response = list_fn(
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_timeout_s,
                    _preload_content=False,
                    **extra,
                )
            except Exception as exc:
                if status_of(exc) == HTTP_GONE:
                    raise Gone(f"the watch of {kind} from resourceVersion {version} expired") from exc
                raise
            self.failing.discard(kind)  # live again: its watch is open
            self._responses[kind] = response
            try:
                if self.stopping.is_set():  # stop() came while this watch opened: it did not see the response
                    return
                for line in self._lines(response):
                    if not line:
                        continue
                    event = json.loads(line)
                    type_, obj = event.get("type"), event.get("object") or {}
                    if type_ == "ERROR":
                        if obj.get("code") == HTTP_GONE:
                            raise Gone(f"the watch of {kind} from resourceVersion {version} expired")
                        raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if type_ in ("ADDED", "MODIFIED", "DELETED"):
                        yield type_, obj
                    self.versions[kind] = version
            finally:
                self._responses.pop(kind, None)
                response.release_conn()


__all__ = ["Absent", "Gone", "Watches", "status_of"]
