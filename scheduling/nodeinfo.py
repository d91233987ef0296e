"""What a node offers: its cached datasets, GPU topology, RoCE classes and free GPUs.

The node agent publishes three annotations (exact keys and size budgets in docs/user-guide/scheduler-extender.md):

- ``dsagent.io/inventory``: the agent's inventory JSON (version 1, <= 64 KiB);
- ``dsagent.io/topology``: gpu_topology's JSON (version 1, <= 32 KiB);
- ``dsagent.io/free-gpus``: comma-separated indices of the free GPUs, e.g. ``"0,1,4,5"``.

:class:`NodeReader` turns a raw v1.Node into a frozen :class:`NodeFacts`, tolerantly:
bad data becomes an ``*_error`` string (scored as "cannot be parsed"), never an
exception. It caches by ``(name, resourceVersion)`` and, below that, by annotation
text, so a node whose free-GPU list changed does not pay for re-parsing its inventory
and topology. Called by :mod:`scheduler_plugin.view`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

from dsplatform import published
from dsplatform.boundedjson import JsonRefused
from dsplatform.gpus import CLASS_RESOURCE_PREFIX, GPU_RESOURCE, GpuResources, node_gpus
from dsplatform.wire import inventory as wire_inventory
from dsplatform.wire import nodecache
from gpu_topology import GpuSet, Topology, TopologyError, best_gpu_set, roce_classes, topology_from_dict
from gpu_topology.classvote import parse_free_gpus
from scheduling.kubeobjects import Node
from scheduling.timemodel import DEFAULT_BANDWIDTHS, Bandwidths, intra_node_bandwidth, plan_bandwidth

log = logging.getLogger(__name__)

INVENTORY_ANNOTATION = published.INVENTORY
TOPOLOGY_ANNOTATION = published.TOPOLOGY
FREE_GPUS_ANNOTATION = published.FREE_GPUS
INVENTORY_BUDGET = nodecache.INVENTORY_MAX_BYTES
TOPOLOGY_BUDGET = nodecache.TOPOLOGY_MAX_BYTES

NOTHING_HELD: Mapping[str, Any] = {}  # what a node without an inventory (or an unknown node) holds

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Holding:
    """One dataset name on a node, as its inventory describes it."""

    digest: str | None  # of the version a new request would get
    size_bytes: int | None
    ready: bool
    in_use: bool  # that version, or an older one still listed, serves running tasks
    held_bytes: int | None = None  # of a copy being fetched: bytes held so far (None: not said)


@dataclass(frozen=True)
class StripeHolding:
    """This node's share of a striped version, as its inventory's ``stripes`` describes it."""

    digest: str
    size_bytes: int
    held_bytes: int
    members: int
    group: tuple[str, ...] = ()  # the members' node names, when the inventory lists them


@dataclass(frozen=True)
class Inventory:
    """The parts of the agent's inventory the extender scores on."""

    capacity_bytes: int | None
    free_bytes: int | None
    datasets: Mapping[str, Holding]
    truncated: bool = False
    stripes: Mapping[str, StripeHolding] = field(default_factory=dict)

    #: the names it holds part of: its stripe shares and its copies being fetched (with held
    #: bytes); set once, the readers of a parsed inventory share it
    partial: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fetching = (name for name, h in self.datasets.items() if not h.ready and h.held_bytes)
        object.__setattr__(self, "partial", frozenset(self.stripes).union(fetching))


@dataclass(frozen=True)
class RoceClassInfo:
    """One GPU-RoCE class of a node: the GPUs affine to one RoCE NIC (one subnet)."""

    name: str
    gpus: frozenset[int]


#: Interned GPU keys (see :attr:`NodeFacts.gpu_key`); a cluster has a few hundred distinct ones.
_GPU_KEYS: dict[tuple[int, frozenset[int] | None, int], tuple[int, frozenset[int] | None, int]] = {}
_GPU_KEYS_LIMIT = 65_536


@dataclass(frozen=True)
class NodeFacts:
    """Everything the scores and the filter read about one node."""

    name: str
    inventory: Inventory | None = None
    inventory_error: str | None = None
    topology: Topology | None = None
    topology_id: int = -1  # equal ids <=> equal topology annotations
    topology_error: str | None = None
    classes: tuple[RoceClassInfo, ...] = ()
    allocatable_gpus: int = 0
    published_free: frozenset[int] | None = None  # the free-gpus annotation, when readable
    used_gpus: int = 0  # GPU requests of known active pods (watch mode)
    resource_version: str | None = None
    gpu_facts_known: bool = False  # allocatable, free list or topology was readable
    # what kube-scheduler's node filters read of the node but its name: the number the watch
    # cache gives its scheduling.nodefit.PlacementKey (None: not known); whom the node may be
    # kept whole for
    placement: object = None

    @cached_property
    def free_gpus(self) -> frozenset[int] | None:
        """The node's free GPU indices: published, else the best-scoring subset of the
        free count (when the topology is known), else unknown."""
        topology = self.topology
        if self.published_free is not None:
            if topology is None:
                return self.published_free
            # An index the topology lacks cannot be placed on; ignore it rather than fail.
            return self.published_free & frozenset(topology.gpu_indices)
        if topology is None:
            return None
        return _best_subset(topology, min(self.free_count, len(topology.gpus)))

    @cached_property
    def free_count(self) -> int:
        if self.published_free is not None:
            return len(self.published_free)
        return max(0, self.allocatable_gpus - self.used_gpus)

    @cached_property
    def gpu_key(self) -> tuple[int, frozenset[int] | None, int]:
        """Everything the GPU scores read: nodes with equal keys score alike.

        Interned: nodes with equal keys share one tuple, so the per-request dictionaries
        keyed by it (one entry per distinct key, 5,000 lookups at 5,000 nodes) match by
        identity instead of comparing free-GPU sets element by element (12% of
        a names-only request's samples were that comparison).
        """
        key = (self.topology_id, self.free_gpus, self.free_count)
        found = _GPU_KEYS.get(key)
        if found is None:
            if len(_GPU_KEYS) >= _GPU_KEYS_LIMIT:
                _GPU_KEYS.clear()
            found = _GPU_KEYS.setdefault(key, key)
        return found

    @cached_property
    def held(self) -> Mapping[str, Holding]:
        """The inventory's datasets by name (empty without a readable inventory)."""
        return self.inventory.datasets if self.inventory is not None else NOTHING_HELD

    @cached_property
    def class_sizes(self) -> dict[str, int]:
        return {c.name: len(c.gpus) for c in self.classes}

    @cached_property
    def free_by_class(self) -> dict[str, int]:
        """Free GPUs per RoCE class (empty when the node has no classes or no known set)."""
        free = self.free_gpus
        if free is None:
            return {}
        return {c.name: len(c.gpus & free) for c in self.classes}


class BoundedCache(Generic[K, V]):
    """A dict that forgets its oldest half when full (parsed data is cheap to rebuild).

    The watch threads and the request path share one; every step is a single dict
    operation, atomic under the GIL, and eviction tolerates a key already gone.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self.data.get(key)

    def put(self, key: K, value: V) -> V:
        if len(self.data) >= self.limit:
            for old in list(self.data)[: self.limit // 2]:
                self.data.pop(old, None)
        self.data[key] = value
        return value


@dataclass
class NodeReader:
    """Reads raw v1.Node objects into :class:`NodeFacts`, with caches."""

    gpu_resource: str = GPU_RESOURCE
    roce_prefix: str = CLASS_RESOURCE_PREFIX
    limit: int = 20_000
    _facts: BoundedCache[tuple[str, str], NodeFacts] = field(init=False)
    _inventories: BoundedCache[str, tuple[Inventory | None, str | None]] = field(init=False)
    _topologies: BoundedCache[str, tuple[Topology | None, int, str | None, tuple[RoceClassInfo, ...]]] = field(
        init=False
    )
    _warned: set[str] = field(init=False, default_factory=set)
    _ids: itertools.count[int] = field(init=False, default_factory=itertools.count)
    built: int = field(init=False, default=0)  # node objects read without a cache hit

    def __post_init__(self) -> None:
        self._facts = BoundedCache(self.limit)
        self._inventories = BoundedCache(self.limit)
        self._topologies = BoundedCache(max(64, self.limit // 8))

    def read(self, node: Node, used_gpus: int = 0) -> NodeFacts:
        """The facts of one node object (which must have ``metadata.name``); ``used_gpus``
        are the GPU requests of the active pods the caller knows on it."""
        meta: Any = node.get("metadata") or {}
        name: str = meta["name"]
        version = meta.get("resourceVersion")
        key = (name, version) if isinstance(version, str) and version else None
        facts = self._facts.get(key) if key is not None else None
        if facts is None:
            try:
                facts = self._build(name, version, meta, node)
            except Exception as exc:  # foreign data: this node scores 0, the others are unaffected
                log.warning(
                    "node %s: its data cannot be read (%s: %s); it scores 0", name, type(exc).__name__, str(exc)[:200]
                )
                problem = f"unreadable node data: {type(exc).__name__}"
                facts = NodeFacts(
                    name=name,
                    inventory_error=problem,
                    topology_error=problem,
                    resource_version=version if isinstance(version, str) else None,
                )
            self.built += 1
            if key is not None:
                self._facts.put(key, facts)
        return dataclasses.replace(facts, used_gpus=used_gpus) if used_gpus else facts

    def cached(self, name: str, resource_version: str, used_gpus: int = 0) -> NodeFacts | None:
        """The facts of a node already read at this resourceVersion, else None."""
        facts = self._facts.get((name, resource_version))
        if facts is None or not used_gpus:
            return facts
        return dataclasses.replace(facts, used_gpus=used_gpus)

    def _build(self, name: str, version: Any, meta: Any, node: Node) -> NodeFacts:
        annotations = meta.get("annotations")
        annotations = annotations if isinstance(annotations, dict) else {}
        inventory, inventory_error = self._inventory(annotations.get(INVENTORY_ANNOTATION))
        topology, topology_id, topology_error, classes = self._topology(annotations.get(TOPOLOGY_ANNOTATION))
        allocatable = self._allocatable_gpus(node)
        known = allocatable is not None or topology is not None
        if allocatable is None:
            allocatable = len(topology.gpus) if topology is not None else 0
        free = parse_free_gpus(annotations.get(FREE_GPUS_ANNOTATION))
        known = known or free is not None
        if free is None and topology is not None and name not in self._warned:
            self._warned.add(name)
            log.info(
                "node %s publishes no %s; counting free GPUs as allocatable minus known pod "
                "requests and assuming the best-scoring subset",
                name,
                FREE_GPUS_ANNOTATION,
            )
        return NodeFacts(
            name=name,
            inventory=inventory,
            inventory_error=inventory_error,
            topology=topology,
            topology_id=topology_id,
            topology_error=topology_error,
            classes=classes,
            allocatable_gpus=allocatable,
            published_free=free,
            resource_version=version if isinstance(version, str) else None,
            gpu_facts_known=known,
        )

    def _allocatable_gpus(self, node: Node) -> int | None:
        """The node's GPUs by the platform's one rule (:func:`dsplatform.gpus.node_gpus`): a
        GPU advertised as a class, in a class set and as ``gpu-all`` is one GPU."""
        status: Any = node.get("status")
        allocatable = status.get("allocatable") if isinstance(status, dict) else None
        return node_gpus(allocatable, GpuResources.of_class_prefix(self.gpu_resource, self.roce_prefix))

    def _inventory(self, text: Any) -> tuple[Inventory | None, str | None]:
        if text is None:
            return None, None
        if not isinstance(text, str):
            return None, f"{INVENTORY_ANNOTATION} is not a string"
        cached = self._inventories.get(text)
        if cached is None:
            cached = self._inventories.put(text, parse_inventory(text))
        return cached

    def _topology(self, text: Any) -> tuple[Topology | None, int, str | None, tuple[RoceClassInfo, ...]]:
        if text is None:
            return None, -1, None, ()
        if not isinstance(text, str):
            return None, -1, f"{TOPOLOGY_ANNOTATION} is not a string", ()
        cached = self._topologies.get(text)
        if cached is None:
            topology, error, classes = parse_topology(text)
            cached = self._topologies.put(text, (topology, next(self._ids) if topology else -1, error, classes))
        return cached


@functools.lru_cache(maxsize=1024)
def ideal_set(topology: Topology, count: int) -> GpuSet | None:
    """The best ``count`` GPUs of the whole topology, as if all were free: it depends on
    the hardware alone, so every node and free set of one topology shares it."""
    return best_gpu_set(topology, topology.gpu_indices, count) if count > 0 else None


def placed_sets(topology: Topology, free: Iterable[int], need: int) -> tuple[GpuSet, GpuSet | None] | None:
    """The best set of ``need`` free GPUs and the best the same hardware gives fully free
    (:func:`ideal_set`); None when no set fits or the free set names GPUs the topology
    lacks (logged). Shared by the NUMA and the time scores."""
    try:
        best = best_gpu_set(topology, free, need)
        ideal = ideal_set(topology, need) if best is not None else None
    except TopologyError as exc:  # e.g. a free index the topology lacks
        log.warning("cannot place %d GPUs on free set %s: %s", need, sorted(free), exc)
        return None
    return None if best is None else (best, ideal)


def _best_subset(topology: Topology, count: int) -> frozenset[int]:
    """The best-scoring ``count`` GPUs of a topology (shared by every node that has it)."""
    best = ideal_set(topology, count)
    return frozenset(best.gpus) if best else frozenset()


def parse_inventory(text: str) -> tuple[Inventory | None, str | None]:
    """The inventory annotation -> (inventory, error); malformed entries are skipped."""
    try:
        doc = wire_inventory.loads(text)
    except JsonRefused as exc:  # too large, too deep, not JSON, no datasets
        return None, exc.message[:300]
    datasets = {}
    for name in doc["datasets"]:
        holding = _holding(wire_inventory.versions_of(doc, name))
        if holding is not None:
            datasets[name] = holding
    return Inventory(
        capacity_bytes=_int_or_none(doc.get("capacityBytes")),
        free_bytes=_int_or_none(doc.get("freeBytes")),
        datasets=datasets,
        truncated=doc.get("truncated") is True,
        stripes=_stripes(doc.get("stripes")),
    ), None


def _stripes(section: Any) -> dict[str, StripeHolding]:
    """The ``stripes`` section; malformed entries are skipped."""
    out: dict[str, StripeHolding] = {}
    for name, entry in section.items() if isinstance(section, dict) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
            continue
        size, held, members = (_int_or_none(entry.get(k)) for k in ("sizeBytes", "heldBytes", "members"))
        if size is not None and held is not None and members:
            digest = entry["digest"].lower()
            group = wire_inventory.stripe_group({"stripes": {name: {**entry, "digest": digest}}}, name, digest)
            out[name] = StripeHolding(digest, size, min(held, size), members, group)
    return out


def _holding(versions: list[Mapping[str, Any]]) -> Holding | None:
    """The current entry (first of ``versions``); in use when any cached version is."""
    entry = versions[0] if versions else None
    if entry is None or not isinstance(entry.get("state"), str):
        return None
    digest = entry.get("digest")
    return Holding(
        digest=digest.lower() if isinstance(digest, str) else None,
        size_bytes=_int_or_none(entry.get("sizeBytes")),
        ready=entry["state"] == "ready",
        in_use=any(v.get("inUse") is True for v in versions),
        held_bytes=_int_or_none(entry.get("heldBytes")),
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_topology(text: str) -> tuple[Topology | None, str | None, tuple[RoceClassInfo, ...]]:
    """The topology annotation -> (topology, error, RoCE classes)."""
    try:
        doc = json.loads(text)
        topology = topology_from_dict(doc)
        raw_classes = doc.get("classes")
        # as published, like the webhook reads them: [] is "no classes" (e.g. the agent's
        # subnet rule could not be applied); only a document without the key is recomputed
        if isinstance(raw_classes, list):
            classes = tuple(
                RoceClassInfo(c["name"], frozenset(int(g) for g in c.get("gpus") or ()))
                for c in raw_classes
                if isinstance(c, dict) and isinstance(c.get("name"), str)
            )
        else:
            classes = tuple(RoceClassInfo(c.name, frozenset(c.gpus)) for c in roce_classes(topology))
    except Exception as exc:  # foreign data: any failure to read it means "cannot be parsed"
        return None, f"{TOPOLOGY_ANNOTATION} cannot be read: {exc}", ()
    return topology, None, classes


def pod_bandwidth(
    topology: Topology | None,
    free: Iterable[int] | None,
    need: int,
    workers: int,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> tuple[float, float] | None:
    """(``bw`` on this node's best free set, ``bw`` on the same hardware fully free), or None
    when the node cannot give ``need`` GPUs."""
    if topology is None or free is None:
        return None
    placed = placed_sets(topology, free, need)
    if placed is None:
        return None
    best, ideal = placed
    bw = intra_node_bandwidth(topology, best.gpus, bandwidths)
    ideal_bw = intra_node_bandwidth(topology, ideal.gpus if ideal else best.gpus, bandwidths)
    if workers > 1:
        bw = plan_bandwidth([bw, bw], bandwidths)
        ideal_bw = plan_bandwidth([ideal_bw, ideal_bw], bandwidths)
    return bw, ideal_bw


__all__ = [
    "FREE_GPUS_ANNOTATION",
    "INVENTORY_ANNOTATION",
    "INVENTORY_BUDGET",
    "TOPOLOGY_ANNOTATION",
    "TOPOLOGY_BUDGET",
    "BoundedCache",
    "Holding",
    "Inventory",
    "NodeFacts",
    "NodeReader",
    "RoceClassInfo",
    "parse_free_gpus",
    "parse_inventory",
    "parse_topology",
    "placed_sets",
    "pod_bandwidth",
]
