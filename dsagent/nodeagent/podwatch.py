"""List+watch of the pods bound to this node, surviving 410 Gone and API server restarts.

:class:`PodWatch` runs in its own thread with the unmodified ``kubernetes`` client:
list pods with ``fieldSelector=spec.nodeName=<node>``, then watch from the list's
resourceVersion with bookmarks. It keeps the current set of pods and calls
``on_event(type, pod)`` (``ADDED`` / ``MODIFIED`` / ``DELETED``, raw pod JSON) for every
change. A ``410 Gone`` (history compacted) relists and reports the difference as events,
so a pod deleted while the watch was broken is still reported as DELETED. Connection
failures (API server restarts) back off and resume from the last resourceVersion seen.

The back-off is tenacity's (exponential from ``backoff[0]`` to ``backoff[1]``, plus up to
``backoff[0]`` of jitter, restarting after every watch that ends normally, sleeping on the stop event so
that :meth:`PodWatch.stop` interrupts it) rather than a hand-written loop.

Who calls it: :class:`dsagent.nodeagent.clusteragent.ClusterAgent` (which hands events to its loop).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import tenacity

log = logging.getLogger("dsagent.nodeagent")
PodJSON = dict[str, Any]
OnEvent = Callable[[str, PodJSON], None]


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class PodWatch:
    """The pods on one node, kept current by list+watch in a background thread."""

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        on_event: OnEvent,
        *,
        timeout_seconds: int = 300,
        backoff: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client)
        self.node_name = node_name
        self._on_event = on_event
        self._timeout = timeout_seconds
        self._backoff = backoff
        self._pods: dict[str, PodJSON] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.synced = threading.Event()
        self.relists = 0
        self.resource_version: str | None = None

    # -- life cycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"dsagent-podwatch-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    def pods(self) -> dict[str, PodJSON]:
        """The pods on this node now, by UID."""
        with self._lock:
            return dict(self._pods)

    def has_pod(self, uid: str) -> bool:
        with self._lock:
            return uid in self._pods

    # -- the loop

    def _run(self) -> None:
        low, high = self._backoff
        retrying = tenacity.Retrying(
            wait=tenacity.wait_exponential(multiplier=low, max=high) + tenacity.wait_random(0, low),
            stop=tenacity.stop_when_event_set(self._stop),
            sleep=self._sleep,
            before_sleep=self._retrying,
        )
        while not self._stop.is_set():
            try:
                retrying(self._list_and_watch)
            except tenacity.RetryError:  # stopped while failing
                break

    def _list_and_watch(self) -> None:
        if self._stop.is_set():
            return
        try:
            if self.resource_version is None:
                self._relist()
            self._watch()
        except _Gone:
            log.info(
                "pod watch on %s: resourceVersion %s expired (410 Gone); relisting",
                self.node_name,
                self.resource_version,
            )
            self.resource_version = None

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _retrying(self, state: tenacity.RetryCallState) -> None:
        """Log a failure (the API server restarting, a network blip, a 5xx) before the wait."""
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("pod watch on %s failed (%s: %s); retrying in %.1fs", self.node_name, type(exc).__name__, exc, wait)

    def _relist(self) -> None:
        result: Any = self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _request_timeout=30, _preload_content=False
        )
        try:
            if result.status != 200:
                raise RuntimeError(f"listing pods: HTTP {result.status}")
            body = json.loads(result.data)
        finally:
            result.release_conn()
        listed = {p["metadata"]["uid"]: p for p in body.get("items", []) if p.get("metadata", {}).get("uid")}
        with self._lock:
            before, self._pods = self._pods, dict(listed)
        self.relists += 1
        for uid, pod in before.items():
            if uid not in listed:
                self._emit("DELETED", pod)
        for uid, pod in listed.items():
            if uid not in before:
                self._emit("ADDED", pod)
            elif before[uid].get("metadata", {}).get("resourceVersion") != pod["metadata"].get("resourceVersion"):
                self._emit("MODIFIED", pod)
        self.resource_version = body.get("metadata", {}).get("resourceVersion")
        self.synced.set()

    def _watch(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        resp: Any = self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}",
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            watch=True,
            _preload_content=False,
            _request_timeout=(10, self._timeout + 30),
        )
        self._resp = resp
        try:
            if resp.status != 200:
                if resp.status == 410:
                    raise _Gone()
                raise RuntimeError(f"watching pods: HTTP {resp.status}")
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                if line:
                    self._handle(json.loads(line))
        finally:
            self._resp = None
            resp.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        uid = (obj.get("metadata") or {}).get("uid")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = obj
        self.resource_version = rv or self.resource_version
        self._emit(kind, obj)

    def _emit(self, kind: str, pod: PodJSON) -> None:
        try:
            self._on_event(kind, pod)
        except Exception:  # a consumer bug must not kill the watch
            log.exception("handling %s of pod %s failed", kind, (pod.get("metadata") or {}).get("name"))

    def _interrupt(self) -> None:
        """Unblock a thread waiting on the watch stream (closing its socket)."""
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


__all__ = ["PodWatch"]
