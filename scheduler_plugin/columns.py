"""The watch cache's nodes as columns: what a names-only request reads, kept per node.

Who calls it: :class:`scheduler_plugin.nodecache.NodeCache` updates it on every node and
pod event (under its lock); :class:`scheduler_plugin.view.View` reads it for names-only
(``nodeCacheCapable``) prioritize requests, and :class:`scheduler_plugin.framework.Framework`
scores from what it reads.

What it owns, beside the name -> :class:`NodeFacts` map the filter reads:

- ``ids``: node name -> the id of its GPU key (:attr:`NodeFacts.gpu_key`, everything the
  RoCE and NUMA scores read), and ``reps``: id -> one node with that key. A request maps
  its 5,000 names to ids in one pass in C, scores each distinct id once (a cluster has
  a few hundred), and looks the scores up in C: no Python loop over the candidates.
- ``ready`` and ``ready_at``: dataset name (and digest) -> the nodes that hold it ready
  (at that digest). Without partial credit a node's dataset affinity is nonzero exactly
  when it holds every wanted dataset ready and current
  (:func:`scheduler_plugin.plugins.dataset.holding_all`), which is an intersection of
  these sets in C instead of an affinity call per node.

Decisions: the per-request work was about ten Python passes over 5,000 node objects
scattered in memory; the columns move that work to the watch events, where
it is paid once per change. The sets are frozensets replaced on change (copy on write),
so a request reading them never sees one half-updated; an event changes one or two of
them (the reader hands the same :class:`Inventory` object to a node whose inventory text
did not change, and only datasets whose holding changed are touched). Ids are never
reused while a table lives: when it exceeds ``key_limit`` ids (keys that no node has
any more) it is rebuilt from the current nodes as a new pair, swapped in one assignment,
so a request that took the old pair reads a consistent one.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import NamedTuple, TypeVar

from scheduling.nodeinfo import Holding, Inventory, NodeFacts
from scheduling.podspec import DatasetWant

#: GPU-key ids kept before the table is rebuilt from the current nodes (keys no node has
#: any more are dropped then); each keeps one node's GPU facts, without its inventory.
KEY_LIMIT = 8_192
_NONE: frozenset[str] = frozenset()
K = TypeVar("K")


class GpuIds(NamedTuple):
    """Node name -> GPU-key id (>= 1), id -> a node with that key (``reps[0]`` is None),
    and id -> how many nodes have that key now."""

    ids: dict[str, int]
    reps: list[NodeFacts | None]
    counts: dict[int, int]


class GroupedNodes(list[NodeFacts]):
    """The cluster's nodes as one node per distinct GPU key, with ``counts[i]`` nodes like
    ``self[i]``: what the cluster-wide class vote and class-set choice read
    (:func:`scheduler_plugin.framework._grouped_rooms`), without a pass over every node."""

    def __init__(self, groups: list[tuple[NodeFacts, int]]) -> None:
        super().__init__(node for node, _ in groups)
        self.counts = [count for _, count in groups]


class NodeColumns:
    """Per-node facts and the columns derived from them; written by one thread at a time."""

    def __init__(self, facts: Mapping[str, NodeFacts] | None = None, *, key_limit: int = KEY_LIMIT) -> None:
        self.key_limit = key_limit
        self.facts: dict[str, NodeFacts] = {}
        self.gpu = GpuIds({}, [None], {})
        self._id_of: dict[object, int] = {}
        # A bulk load (the first list, a relist) builds the sets in place, then freezes them:
        # adding the nodes one by one would copy each set once per holder.
        ready: dict[str, set[str]] = {}
        ready_at: dict[tuple[str, str], set[str]] = {}
        for name, node in (facts or {}).items():
            self.facts[name] = node
            for dataset, holding in _holdings(node.inventory).items():
                if holding.ready:
                    ready.setdefault(dataset, set()).add(name)
                    if holding.digest is not None:
                        ready_at.setdefault((dataset, holding.digest), set()).add(name)
        self.ready: dict[str, frozenset[str]] = {key: frozenset(nodes) for key, nodes in ready.items()}
        self.ready_at: dict[tuple[str, str], frozenset[str]] = {
            key: frozenset(nodes) for key, nodes in ready_at.items()
        }
        # dataset name -> how many nodes hold part of it (a stripe share, a copy being
        # fetched): a request wanting one takes the scoring path that reads every node
        self.partial: Counter[str] = Counter()
        for node in self.facts.values():
            self.partial.update(_partial(node.inventory))
        self._rebuild()

    # -- writing (the watch threads, under the cache's lock) --------------------

    def put(self, name: str, node: NodeFacts) -> None:
        """Add or replace one node."""
        old = self.facts.get(name)
        self.facts[name] = node
        gpu = self.gpu
        key = node.gpu_key
        found = self._id_of.get(key)
        if found is None and len(gpu.reps) >= self.key_limit:
            self._rebuild()  # gives this node its id too
        else:
            if found is None:
                found = self._id_of[key] = len(gpu.reps)
                gpu.reps.append(_gpu_only(node))  # before ids names it: a reader never sees an id without its node
            before_id = gpu.ids.get(name)
            if before_id != found:
                gpu.counts[found] = gpu.counts.get(found, 0) + 1
                gpu.ids[name] = found
                if before_id is not None:
                    _uncount(gpu.counts, before_id)
        before = old.inventory if old is not None else None
        if before is not node.inventory:
            self._index(name, _holdings(before), _holdings(node.inventory))
            self.partial.subtract(_partial(before))
            self.partial.update(_partial(node.inventory))
            self.partial = +self.partial

    def drop(self, name: str) -> None:
        """Forget one node (deleted)."""
        old = self.facts.pop(name, None)
        before_id = self.gpu.ids.pop(name, None)
        if before_id is not None:
            _uncount(self.gpu.counts, before_id)
        if old is not None:
            self._index(name, _holdings(old.inventory), {})
            self.partial.subtract(_partial(old.inventory))
            self.partial = +self.partial

    def _rebuild(self) -> None:
        """A new id table from the current nodes. Its keys are fresh copies of the names,
        made together: a request's lookups compare each name with its key, and keys
        packed in memory (rather than scattered over the objects the watch decoded)
        cost a third less at 5,000 nodes."""
        ids: dict[str, int] = {}
        reps: list[NodeFacts | None] = [None]
        counts: dict[int, int] = {}
        id_of: dict[object, int] = {}
        for name, node in self.facts.items():
            found = id_of.get(node.gpu_key)
            if found is None:
                found = id_of[node.gpu_key] = len(reps)
                reps.append(_gpu_only(node))
            ids[name.encode().decode()] = found
            counts[found] = counts.get(found, 0) + 1
        self._id_of = id_of
        self.gpu = GpuIds(ids, reps, counts)

    def _index(self, name: str, before: Mapping[str, Holding], after: Mapping[str, Holding]) -> None:
        """Move ``name`` between the dataset sets where its holdings changed."""
        for dataset in before.keys() | after.keys():
            old, new = before.get(dataset), after.get(dataset)
            if old == new:
                continue
            if old is not None and old.ready:
                _remove(self.ready, dataset, name)
                if old.digest is not None:
                    _remove(self.ready_at, (dataset, old.digest), name)
            if new is not None and new.ready:
                self.ready[dataset] = self.ready.get(dataset, _NONE) | {name}
                if new.digest is not None:
                    key = (dataset, new.digest)
                    self.ready_at[key] = self.ready_at.get(key, _NONE) | {name}

    # -- reading (requests) ----------------------------------------------------

    def partly_held(self, wants: Iterable[DatasetWant]) -> bool:
        """Whether some node holds part of a wanted dataset (see :attr:`partial`)."""
        partial = self.partial
        return bool(partial) and any(want.name in partial for want in wants)

    def select(self, names: list[str]) -> Selection:
        """The candidates' GPU-key ids (0 for a node the cache does not know) and one node
        per distinct id: one pass in C over the names."""
        gpu = self.gpu
        ids = list(map(gpu.ids.get, names, repeat(0)))
        distinct = set(ids)
        distinct.discard(0)
        reps = gpu.reps
        return Selection(names, ids, {i: reps[i] for i in distinct}, self)  # type: ignore[misc]

    def groups(self) -> GroupedNodes:
        """Every node, as one node per distinct GPU key with its count."""
        gpu = self.gpu
        reps = gpu.reps
        return GroupedNodes([(reps[i], count) for i, count in list(gpu.counts.items())])  # type: ignore[misc]


class Selection(NamedTuple):
    """A names-only request's candidates as the columns give them."""

    names: list[str]
    ids: list[int]  # per candidate, in request order; 0 for an unknown node
    reps: dict[int, NodeFacts]  # each distinct id among the candidates -> a node with that key
    columns: NodeColumns

    def facts(self) -> list[NodeFacts | None]:
        """Each candidate's facts (None when unknown), for the paths that read every node."""
        return list(map(self.columns.facts.get, self.names))


def _gpu_only(node: NodeFacts) -> NodeFacts:
    """The node's GPU facts (all a GPU key's representative is read for), without the
    inventory, which an id kept after its last node changed would otherwise keep alive."""
    return dataclasses.replace(node, inventory=None) if node.inventory is not None else node


def _partial(inventory: Inventory | None) -> frozenset[str]:
    """The names ``inventory`` holds part of (:attr:`Inventory.partial`)."""
    return inventory.partial if inventory is not None else frozenset()


def _holdings(inventory: Inventory | None) -> Mapping[str, Holding]:
    return inventory.datasets if inventory is not None else {}


def _uncount(counts: dict[int, int], key: int) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def _remove(table: dict[K, frozenset[str]], key: K, name: str) -> None:
    """Take ``name`` out of ``table[key]`` (a new set); a set left empty is dropped."""
    nodes = table.get(key, _NONE)
    if name not in nodes:
        return
    if len(nodes) == 1:
        del table[key]
    else:
        table[key] = nodes - {name}


__all__ = ["KEY_LIMIT", "GpuIds", "GroupedNodes", "NodeColumns", "Selection"]
