"""The cluster as one request sees it: from the request's Nodes, or from the watch cache.

- ``Nodes`` requests (``nodeCacheCapable: false``) are stateless: each Node object is
  read through the shared :class:`NodeReader` (cached by resourceVersion; a node cut
  from a Go-marshaled body is not even parsed when its resourceVersion is known); when
  a watch cache runs too, its pod GPU usage is added, and its ``NodeCache`` objects are
  overlaid on the Nodes (the scheduler's Node objects do not carry what a ``NodeCache``
  publishes: without the watch, only the annotations of agents of the release before are
  read; docs/operator-guide/upgrade.md#nodecache).
- ``NodeNames`` requests (``nodeCacheCapable: true``) are served from the
  :class:`NodeCache`; a name it does not know is None (scored 0, never filtered).

The view also answers "every node we know" for the cluster-wide RoCE class choice: the
cache's nodes, or without one the nodes of the most recent ``Nodes`` requests.
Called by the app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from dsplatform.wire import nodecache as nodecache_contract
from scheduler_plugin import catalog
from scheduler_plugin.columns import Selection
from scheduler_plugin.errors import InvalidRequest, ViewUnavailable
from scheduler_plugin.filter import NO_WAITING, Waiting
from scheduler_plugin.wire import ExtenderArgs, RawNode
from scheduling.kubeobjects import Node
from scheduling.nodeinfo import NodeFacts, NodeReader
from scheduling.podspec import PodRequest

if TYPE_CHECKING:  # the kubernetes client is imported only when the watch cache runs
    from scheduler_plugin.nodecache import NodeCache


class View:
    """Resolves a request's candidates to :class:`NodeFacts`."""

    def __init__(self, reader: NodeReader, cache: NodeCache | None = None) -> None:
        self.reader = reader
        self.cache = cache
        self._recent: list[NodeFacts | None] = []

    @property
    def ready(self) -> bool:
        return self.cache is None or self.cache.synced

    @property
    def source(self) -> str:
        return "watch" if self.cache is not None else "recent-requests"

    def candidates(self, args: ExtenderArgs) -> list[NodeFacts | None]:
        """One entry per candidate, in request order; None for an unknown node."""
        if args.raw_nodes is not None:
            facts: list[NodeFacts | None] = [self._read_raw(raw) for raw in args.raw_nodes]
            if self.cache is None:
                self._recent = facts
            return facts
        if args.nodes is not None:
            cache = self.cache
            facts = [self.reader.read(*self._overlaid(n)) if cache else self.reader.read(n, 0) for n in args.nodes]
            if cache is None:
                self._recent = facts
            return facts
        if self.cache is None:
            raise InvalidRequest(
                "a names-only (nodeCacheCapable) request needs the watch cache",
                hint="start the extender with DSEXT_WATCH=1 or set nodeCacheCapable: false",
            )
        if not self.cache.synced:
            raise ViewUnavailable("the node cache has not finished its first list yet")
        return list(map(self.cache.snapshot().get, args.node_names or ()))

    def selection(self, args: ExtenderArgs) -> Selection | None:
        """A names-only request's candidates read from the watch cache's columns (one pass
        in C, :mod:`scheduler_plugin.columns`); None for a ``Nodes`` request, which
        :meth:`candidates` serves."""
        if args.node_names is None or self.cache is None:
            return None
        if not self.cache.synced:
            raise ViewUnavailable("the node cache has not finished its first list yet")
        return self.cache.columns().select(args.node_names)

    def _overlaid(self, node: Node) -> tuple[Node, int]:
        """A request's Node with the watch cache's NodeCache overlaid, and its pods' GPUs."""
        assert self.cache is not None
        name = node["metadata"]["name"]
        state = self.cache.state(name)
        return cast(Node, nodecache_contract.overlay(node, state)), self.cache.used_gpus(name)

    def _read_raw(self, raw: RawNode) -> NodeFacts:
        # A node seen at this resourceVersion (and its NodeCache's) is not parsed again.
        if self.cache is None:
            facts = self.reader.cached(raw.name, raw.resource_version, 0)
            return facts if facts is not None else self.reader.read(raw.parse(), 0)
        used = self.cache.used_gpus(raw.name)
        state = self.cache.state(raw.name)
        version = raw.resource_version if state is None else f"{raw.resource_version}+{state.resource_version}"
        facts = self.reader.cached(raw.name, version, used)
        if facts is not None:
            return facts
        return self.reader.read(cast(Node, nodecache_contract.overlay(raw.parse(), state)), used)

    def resolve(self, pod: PodRequest) -> PodRequest:
        """Pin the pod's unpinned datasets to their Dataset resources' current versions
        (watch mode only; without the cache the pod is returned unchanged)."""
        if self.cache is None:
            return pod
        return catalog.resolve(pod, self.cache.current_datasets())

    def waiting(self) -> Waiting:
        """The multi-worker jobs kube-scheduler could not place, from the watch cache (none
        without one or before its first list: nothing is kept whole then)."""
        if self.cache is None or not self.cache.synced:
            return NO_WAITING
        return self.cache.waiting()

    def node(self, name: str) -> NodeFacts | None:
        """A node's facts by name from the watch cache (None without one, before its first
        list, or for a node it has not seen)."""
        if self.cache is None or not self.cache.synced:
            return None
        return self.cache.snapshot().get(name)

    def cluster(self, candidates: Sequence[NodeFacts | None]) -> list[NodeFacts]:
        """Every node the cluster-wide class choice should count (from the watch cache: one
        node per distinct GPU key with its count, :class:`GroupedNodes`)."""
        if self.cache is not None and self.cache.synced:
            return self.cache.columns().groups()
        return [f for f in candidates if f is not None]

    def known(self) -> list[NodeFacts]:
        """Every node known outside a request (for ``GET /v1/roce-class``)."""
        if self.cache is not None:
            if not self.cache.synced:
                raise ViewUnavailable("the node cache has not finished its first list yet")
            return self.cache.all()
        return list({f.name: f for f in self._recent if f is not None}.values())


__all__ = ["View"]
