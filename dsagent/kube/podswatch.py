"""Every pod of the cluster, kept current by list+watch, for the Dataset controller's passes
that read all of them (striped and replicated Datasets, next-job preparation, migration,
the plan loop, the agents found among them).

Why: a list sends every pod of the cluster each time it is asked. With a few training pods
per node that is most of a pass at 5,000 nodes (``tools/bench/controller.py``
``--pods-per-node``); a watch sends only what changed, as it changes.

How: one daemon thread lists, then watches, ``/api/v1/pods`` with the official
``kubernetes`` client (raw JSON, no models), by the loop the node watch runs
(:class:`dsplatform.listwatch.Watches`: resumed from the last ``resourceVersion``, listed
again on ``410 Gone``, a failure tried again after ``retry_s``). Each pod is kept as what
the controller's readers read of it (:func:`slim`): without its managed fields, volumes,
container commands, environments and statuses, most of a running pod's bytes.

The controller starts it at the first pass that reads every pod (:meth:`PodsWatch.start`,
once): a cluster whose Datasets never need them keeps no pod in memory.
:meth:`PodsWatch.pods` returns the current pods: a new list of shared dicts, read-only by
convention; an event replaces a pod's dict, never changes it. Until the pods are listed
once, and while the list or watch is failing (:attr:`PodsWatch.synced` false), the reader
lists them itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dsagent.kube.apiclient import loads_list
from dsplatform.listwatch import Watches

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class PodsWatch:
    """Every pod of the cluster, kept current by list+watch (module docstring)."""

    def __init__(
        self,
        api_client: Any,
        *,
        watch_timeout_s: int = 300,
        retry_s: float = 5.0,
        page_size: int = 500,
        request_timeout: float | None = 30.0,
    ) -> None:
        from kubernetes import client
        from kubernetes.watch.watch import iter_resp_lines

        self._core: Any = client.CoreV1Api(api_client)
        self._watches = Watches(
            iter_resp_lines, log, watch_timeout_s=watch_timeout_s, retry_s=retry_s, page_size=page_size,
            request_timeout=request_timeout, loads=loads_list,
        )  # fmt: skip
        self._pods: dict[str, JSON] = {}  # "namespace/name" -> the pod, slimmed
        self._lock = threading.Lock()
        self._listed = threading.Event()
        self._started = False
        self.versions = self._watches.versions  # "pods" -> the last resourceVersion seen
        self.events = 0  # watch events applied since the start

    @property
    def started(self) -> bool:
        return self._started

    @property
    def synced(self) -> bool:
        """Listed at least once, and its list or watch not failing now: while it is, a
        reader lists for itself."""
        return self._listed.is_set() and not self._watches.failing

    def wait_synced(self, timeout: float) -> bool:
        return self._listed.wait(timeout)

    def pods(self) -> list[JSON]:
        """The pods now (read-only: shared dicts)."""
        with self._lock:
            return list(self._pods.values())

    def start(self) -> None:
        """Start the watch's thread; a second call does nothing."""
        if not self._started:
            self._started = True
            self._watches.start("pods", self._loop, thread_name="watch-pods")

    def stop(self, timeout: float = 5.0) -> None:
        self._watches.stop(timeout)

    def _loop(self) -> None:
        list_fn = self._core.list_pod_for_all_namespaces
        items, version = self._watches.list("pods", list_fn, each=slim)  # slimmed page by page
        pods = {key: p for p in items if (key := _key(p))}
        del items  # the list as sent is not kept while the watch runs
        with self._lock:
            self._pods = pods
        self._listed.set()
        for kind, obj in self._watches.watch("pods", list_fn, version):
            key = _key(obj)
            if key is None:
                continue
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(key, None)
                else:
                    self._pods[key] = slim(obj)
                self.events += 1


#: what :func:`slim` keeps of each part of a pod: what the controller's readers read of it
#: (``podfacts``, ``queues``, ``agents``, the plan loop's ``scheduling.nodefit`` and
#: ``scheduling.noderoom``, ``dsplatform.gpus``, ``dsplatform.jobs``); the rest (managed
#: fields, volumes, container commands and environments, container statuses) is most of a
#: running pod's bytes
KEPT: dict[str, tuple[str, ...]] = {
    "metadata": (
        "name", "namespace", "uid", "labels", "annotations", "ownerReferences", "creationTimestamp",
        "deletionTimestamp", "generateName", "resourceVersion",
    ),
    "spec": (
        "nodeName", "nodeSelector", "affinity", "tolerations", "schedulingGates", "overhead", "priority",
        "priorityClassName", "schedulerName", "runtimeClassName", "restartPolicy", "containers", "initContainers",
    ),
    "status": ("phase", "podIP", "podIPs", "startTime", "nominatedNodeName"),
}  # fmt: skip
#: what it keeps of each container and init container
CONTAINER_KEPT = ("name", "resources", "restartPolicy")
#: an annotation it drops: kubectl's copy of the whole object as last applied
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def slim(pod: Any) -> Any:
    """What the controller's readers read of ``pod`` (:data:`KEPT`), as a new dict (the pod
    as sent is not changed)."""
    if not isinstance(pod, dict):
        return pod  # not a pod: left out by its key
    out: JSON = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    for part, kept in KEPT.items():
        fields = pod.get(part)
        if isinstance(fields, dict):
            out[part] = {k: fields[k] for k in kept if k in fields}
    meta, spec = out.get("metadata"), out.get("spec")
    if meta is not None and isinstance(meta.get("annotations"), dict) and LAST_APPLIED in meta["annotations"]:
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    if spec is not None:
        for kind in ("containers", "initContainers"):
            containers = spec.get(kind)
            if isinstance(containers, list):
                spec[kind] = [
                    {k: c[k] for k in CONTAINER_KEPT if k in c} if isinstance(c, dict) else c for c in containers
                ]
    return out


def _key(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(name, str) and name and isinstance(namespace, str) else None


__all__ = ["PodsWatch", "slim"]
