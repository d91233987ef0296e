"""What ``kubectl describe pod`` says about a pod's datasets: an Event on the Pod when one of
them starts caching, is ready, or fails (with the error's code and hint).

Who calls it: the node agent's cluster mode (:class:`dsagent.nodeagent.clusteragent.ClusterAgent`),
which hands it each pod whose datasets it caches and, every :data:`INTERVAL`, the pods'
task records. What it owns: which state each (pod, dataset) was last told in, so that each
change is said once; the Events themselves go through :class:`~dsagent.kube.events.EventRecorder`
(repeats counted on one Event, never failing the agent), each write in a daemon thread so
that a hanging API server holds up nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dsagent.errors import NotFound
from dsagent.kube.apiclient import in_daemon_thread
from dsagent.kube.events import EventRecorder, ObjectRef
from dsplatform.units import format_size

log = logging.getLogger("dsagent.nodeagent")

#: how often the pods' datasets are looked at
INTERVAL = 2.0
#: ``reportingController`` of the agents' Events
EVENTS_CONTROLLER = "dsagent.io/agent"


class PodEvents:
    """The Events of the pods one agent caches for (see the module docstring)."""

    def __init__(self, recorder: EventRecorder, node_name: str) -> None:
        self.recorder, self.node_name = recorder, node_name
        self._pods: dict[str, ObjectRef] = {}  # pod UID -> the Pod
        self._told: dict[tuple[str, str], str] = {}  # (pod UID, dataset) -> the state last said

    def watch(self, uid: str, pod: Mapping[str, Any]) -> None:
        """Say from now on what happens to ``pod``'s datasets."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        self._pods[uid] = ObjectRef("v1", "Pod", namespace, str(meta.get("name")), uid)

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)
        for key in [k for k in self._told if k[0] == uid]:
            del self._told[key]

    async def run_forever(self, task_of: Callable[[str], Awaitable[Any]]) -> None:
        """Every :data:`INTERVAL`, each watched pod's task record (``task_of(uid)``) told, and
        the repeats the recorder counted written once due (:meth:`EventRecorder.flush`: the
        agent has no pass to end, so its loop is where a counted series reaches the API server)."""
        while True:
            await asyncio.sleep(INTERVAL)
            await self.tick(task_of)

    async def tick(self, task_of: Callable[[str], Awaitable[Any]]) -> None:
        """One round of :meth:`run_forever`."""
        for uid in list(self._pods):
            try:
                await self.tell(uid, await task_of(uid))
            except NotFound:
                self.forget(uid)
            except Exception:  # Events are best effort: never stop the loop
                log.exception("telling pod %s about its datasets failed", uid)
        try:
            await in_daemon_thread(self.recorder.flush)
        except Exception:  # best effort, as above: the next round tries again
            log.exception("writing the counted Events failed")

    async def tell(self, uid: str, record: Any) -> None:
        """An Event for each of the pod's datasets whose state changed since the last one."""
        regarding = self._pods.get(uid)
        if regarding is None:
            return
        for ds in record.datasets:
            state = "ready" if ds.state == "ready" else "failed" if ds.state == "failed" else "caching"
            if self._told.get((uid, ds.name)) == state:
                continue
            kind, reason, note = self._event(ds, state)
            before = self._told.get((uid, ds.name))
            self._told[(uid, ds.name)] = state  # first: the loop and a new pod's first look may overlap
            said = await in_daemon_thread(
                functools.partial(self.recorder.record, regarding, type=kind, reason=reason, action="Cache", note=note)
            )
            if not said and self._told.get((uid, ds.name)) == state:  # say it again next time
                if before is None:
                    self._told.pop((uid, ds.name), None)
                else:
                    self._told[(uid, ds.name)] = before

    def _event(self, ds: Any, state: str) -> tuple[str, str, str]:
        if state == "ready":
            size = format_size(ds.size_bytes)
            return (
                "Normal",
                "DatasetReady",
                f"dataset {ds.name} ({size}) is cached and verified on node {self.node_name}",
            )
        if state == "failed":
            error = ds.error or {}
            hint = f" ({error['hint']})" if error.get("hint") else ""
            message = f"dataset {ds.name}: {error.get('code', 'failed')}: {error.get('message', '')}{hint}"
            return "Warning", "DatasetFailed", message
        return "Normal", "DatasetCaching", f"caching dataset {ds.name} on node {self.node_name}"


__all__ = ["EVENTS_CONTROLLER", "INTERVAL", "PodEvents"]
