"""The Nodes with their ``NodeCache`` overlaid, kept current by list+watch, for a process
that reads all of them again and again (the Dataset controller's passes, the webhook's
RoCE class vote and deadline plans).

Why: a list sends the whole cluster each time it is asked. At 5,000 nodes that is about
0.4 s of JSON to parse in every controller pass, however little changed
(``tools/bench/controller.py``); a watch sends only what changed, as it changes, so a
reader starts from the Nodes as they are.

How: two daemon threads list, then watch, ``/api/v1/nodes`` and the ``NodeCache`` resource
with the official ``kubernetes`` client (raw JSON, no models), by the loop the extender's
node cache runs too (:class:`dsplatform.listwatch.Watches`: resumed from the last
``resourceVersion``, listed again on ``410 Gone``, a failure tried again after
``retry_s``); without the ``NodeCache`` CRD (a chart not yet upgraded) the Nodes alone, the
CRD asked for again every ``absent_retry_s``. Each Node is kept without what no reader of
it uses (``status.images``, ``metadata.managedFields``: most of a Node's bytes), with its
``NodeCache`` overlaid as :func:`dsagent.kube.nodestate.overlaid` does for a list.

:meth:`NodeWatch.nodes` returns the current Nodes: a new list of shared dicts, read-only
by convention; an event replaces a node's dict, never changes it, so a reader holding the
list reads one consistent state of each node. Until both resources are listed once, and
while either's list or watch is failing (:attr:`NodeWatch.synced` false), a reader lists
them itself (:func:`current`).

Who uses it: :meth:`dsagent.controller.reconcile.DatasetController.list_nodes` (started by
the controller's process, ``DSAGENT_CONTROLLER_WATCH_NODES``) and the webhook's RoCE class
vote and deadline plans (started by its process, ``DSAGENT_WEBHOOK_WATCH_NODES``).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from dsagent.kube.apiclient import loads_list
from dsplatform.listwatch import Absent, Watches
from dsplatform.metrics import MetricSet
from dsplatform.wire import nodecache

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class NodeWatch:
    """Every Node with its ``NodeCache`` overlaid, kept current by list+watch (module docstring)."""

    def __init__(
        self,
        api_client: Any,
        *,
        watch_timeout_s: int = 300,
        retry_s: float = 5.0,
        absent_retry_s: float = 60.0,
        page_size: int = 500,
        request_timeout: float | None = 30.0,
        published: Collection[str] | None = None,
    ) -> None:
        """``published``: the published annotations (:data:`dsplatform.wire.nodecache.FIELDS`)
        the reader reads; the others are not kept (None: all of them)."""
        from kubernetes import client
        from kubernetes.watch.watch import iter_resp_lines

        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._watches = Watches(
            iter_resp_lines, log, watch_timeout_s=watch_timeout_s, retry_s=retry_s, absent_retry_s=absent_retry_s,
            page_size=page_size, request_timeout=request_timeout, loads=loads_list,
        )  # fmt: skip
        # the published annotations no reader here reads: dropped from Nodes and NodeCaches alike
        self._dropped = frozenset(nodecache.REPLACED_ANNOTATIONS) - frozenset(published or nodecache.FIELDS)
        self._nodes: dict[str, JSON] = {}  # name -> the Node, slimmed
        self._states: dict[str, nodecache.NodeState] = {}  # node name -> what its NodeCache publishes
        self._overlaid: dict[str, JSON] = {}  # name -> the Node as readers get it
        self._lock = threading.Lock()
        self._synced = {"nodes": threading.Event(), "nodecaches": threading.Event()}
        self.versions = self._watches.versions  # resource -> the last resourceVersion seen
        self.events = 0  # watch events applied since the start

    # -- reading ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Both resources listed at least once (or the NodeCache CRD found absent), and
        neither's list or watch failing now: while one is, a reader lists for itself."""
        return all(event.is_set() for event in self._synced.values()) and not self._watches.failing

    def wait_synced(self, timeout: float) -> bool:
        return all(event.wait(timeout) for event in self._synced.values())

    def nodes(self) -> list[JSON]:
        """The Nodes now, each with its ``NodeCache`` overlaid (read-only: shared dicts)."""
        with self._lock:
            return list(self._overlaid.values())

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._watches.start("nodes", self._nodes_loop, thread_name="watch-nodes")
        self._watches.start("nodecaches", self._nodecaches_loop, thread_name="watch-nodecaches")

    def stop(self, timeout: float = 5.0) -> None:
        self._watches.stop(timeout)

    # -- the two resources -----------------------------------------------------------------

    def _nodes_loop(self) -> None:
        slim = functools.partial(_slim, dropped=self._dropped)
        items, version = self._watches.list("nodes", self._core.list_node, each=slim)  # slimmed page by page
        nodes = {name: n for n in items if (name := _name(n))}
        del items  # the list as sent is not kept while the watch runs
        with self._lock:
            self._nodes = nodes
            self._overlaid = {name: self._overlay(name) for name in nodes}
        self._synced["nodes"].set()
        for kind, obj in self._watches.watch("nodes", self._core.list_node, version):
            name = _name(obj)
            if not name:
                continue
            with self._lock:
                if kind == "DELETED":
                    self._nodes.pop(name, None)
                    self._overlaid.pop(name, None)
                else:
                    self._nodes[name] = slim(obj)
                    self._overlaid[name] = self._overlay(name)
                self.events += 1

    def _nodecaches_loop(self) -> None:
        list_fn = functools.partial(
            self._custom.list_cluster_custom_object, nodecache.GROUP, nodecache.API_VERSION, nodecache.PLURAL
        )
        try:
            absent = f"no {nodecache.PLURAL}.{nodecache.GROUP} resource (CRD not installed): the Nodes alone"
            items, version = self._watches.list("nodecaches", list_fn, absent=absent)
        except Absent:
            with self._lock:  # the Nodes alone: what a NodeCache published before is gone with it
                changed, self._states = set(self._states), {}
                self._refresh(changed)
            self._synced["nodecaches"].set()
            raise
        states = {name: self._kept(state) for name, state in nodecache.by_node(items).items()}
        del items  # the list as sent (every inventory) is not kept while the watch runs
        with self._lock:
            changed = set(states) | set(self._states)
            self._states = states
            self._refresh(changed)
        self._synced["nodecaches"].set()
        for kind, obj in self._watches.watch("nodecaches", list_fn, version):
            with self._lock:
                owner = nodecache.apply_event(self._states, kind, obj)
                if owner is not None:
                    if owner in self._states:
                        self._states[owner] = self._kept(self._states[owner])
                    self._refresh((owner,))
                    self.events += 1

    def _kept(self, state: nodecache.NodeState) -> nodecache.NodeState:
        """``state`` without the published fields no reader here reads."""
        if not self._dropped:
            return state
        return state._replace(published={k: v for k, v in state.published.items() if k not in self._dropped})

    def _overlay(self, name: str) -> JSON:
        """Node ``name`` with its NodeCache overlaid (called under the lock)."""
        state = self._states.get(name)
        node = self._nodes[name]
        return dict(nodecache.overlay(node, state)) if state is not None else node

    def _refresh(self, names: Iterable[str]) -> None:
        """The overlaid Nodes of ``names`` again, after their NodeCache changed (under the lock)."""
        for name in names:
            if name in self._nodes:
                self._overlaid[name] = self._overlay(name)


def watched(watch: NodeWatch | None) -> bool:
    """Whether a reader reads ``watch``'s Nodes now: it has listed both and neither's watch
    is failing."""
    return watch is not None and watch.synced


#: where a reader's Nodes came from (:func:`current`): its watch, or a list of its own
SOURCES = ("watch", "list")


class NodeReads:
    """A process's ``node_reads`` counter (or another ``name``'s: the controller's pod reads),
    by source (:data:`SOURCES`, each series there from the start): called with the source,
    as :func:`current`'s ``reads``."""

    def __init__(self, metrics: MetricSet, documentation: str, *, name: str = "node_reads") -> None:
        self.counter = metrics.counter(name, documentation, "source")
        for source in SOURCES:
            self.counter.labels(source=source)

    def __call__(self, source: str) -> None:
        self.counter.labels(source=source).inc()


def current(
    watch: NodeWatch | None, listing: Callable[[], list[JSON]], reads: Callable[[str], object] | None = None
) -> list[JSON]:
    """``watch``'s Nodes when :func:`watched`, else ``listing()`` (the reader lists them for
    itself meanwhile); ``reads`` is told which of :data:`SOURCES` it was, once a call (the
    readers' ``node_reads`` metric)."""
    source = "watch" if watched(watch) else "list"
    if reads is not None:
        reads(source)
    return watch.nodes() if source == "watch" and watch is not None else listing()


def _slim(node: JSON, dropped: frozenset[str] = frozenset()) -> JSON:
    """``node`` without what no reader of it uses: ``status.images`` (every image on the
    node, often most of its bytes), ``metadata.managedFields``, and the ``dropped``
    published annotations (an agent of the release before writes them on its Node)."""
    if not isinstance(node, dict):
        return node  # not a Node: left out by name
    meta, status = node.get("metadata"), node.get("status")
    if isinstance(meta, dict) and "managedFields" in meta:
        node = {**node, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    annotations = node["metadata"].get("annotations") if isinstance(node.get("metadata"), dict) else None
    if dropped and isinstance(annotations, dict) and not dropped.isdisjoint(annotations):
        kept = {k: v for k, v in annotations.items() if k not in dropped}
        node = {**node, "metadata": {**node["metadata"], "annotations": kept}}
    if isinstance(status, dict) and "images" in status:
        node = {**node, "status": {k: v for k, v in status.items() if k != "images"}}
    return node


def _name(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None


__all__ = ["SOURCES", "NodeReads", "NodeWatch", "current", "watched"]
