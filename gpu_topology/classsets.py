"""Job-level class sets: one set of RoCE classes (hence subnets) for every worker of a job.

Pure functions, no I/O. Called by the scheduler extender (its filter and RoCE score, via
``scheduler_plugin.framework``), by the admission webhook (which keeps the job's set in
its Lease, ``dsagent.webhook.roceclass``) and by the simulator (``tools/sim/engine.py``).
Design: ``docs/design.md#class-sets``.

Decisions:

* A **class set** is a tuple of class names (``gpu-roce1``, ``gpu-roce2``, ...). Class
  ``<prefix>N`` is cabled to the same subnet (rail) on every node, so two workers share
  their subnets exactly when they use the same class set. Its text form, kept in the
  job's Lease, is the names joined by ``+`` (:func:`set_key`, :func:`parse_set`).
* The sets a node offers are the **runs** of consecutive classes in rail order (``1``,
  ``1+2``, ``2+3``, ...): its device plugin advertises each as one kubelet resource
  (:func:`resource_name`: ``gpu-roce1-2``), because one container asking for two class
  resources would get two Allocate answers whose ``NVIDIA_VISIBLE_DEVICES`` collide.
* A worker of ``need`` GPUs uses **every** class of its set, ``need`` split as evenly as
  possible over them (:func:`shares`): rail-aligned, as on rail-optimised fabrics, so
  every rail carries the same share of the worker's traffic. A node **serves** the set
  when it has every class of the set and each can give its share (the larger shares
  go to the classes with more room).
* The job's set (:func:`choose_class_set`): among the sets that can hold **every**
  worker now (one worker per node), the one with the fewest classes (a worker stays in
  as few NUMA groups as possible), then the most nodes able to take a worker (the RoCE
  design's majority vote, generalised), then the most free GPUs in it, then the name.
  When no set can hold the job now, the set that could hold it on the most nodes once
  they are free (``holds`` is then False): a job that *requires* one subnet set waits
  for it; a job that only *prefers* one is placed across layouts and counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_topology.model import Topology
from gpu_topology.scoring import best_gpu_set

SEPARATOR = "+"
MAX_CLASSES = 16  # a node publishing more classes than this has its extra classes ignored
_NUMBER = re.compile(r"(\d+)$")


def class_number(name: str) -> int:
    """The rail number at the end of a class name (``gpu-roce3`` -> 3); 0 when none."""
    found = _NUMBER.search(name)
    return int(found.group(1)) if found else 0


def _order(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names), key=lambda n: (class_number(n), n)))


def set_key(names: Iterable[str]) -> str:
    """``("gpu-roce2", "gpu-roce1")`` -> ``"gpu-roce1+gpu-roce2"`` (rail order)."""
    return SEPARATOR.join(_order(names))


def parse_set(text: str) -> tuple[str, ...]:
    """The inverse of :func:`set_key`; blank parts are dropped."""
    return _order(p.strip() for p in text.split(SEPARATOR) if p.strip())


def shares(need: int, count: int) -> tuple[int, ...]:
    """``need`` GPUs split over ``count`` classes as evenly as possible, larger first."""
    if count <= 0 or need <= 0:
        return ()
    base, extra = divmod(need, count)
    return tuple(base + 1 if i < extra else base for i in range(count))


def assign(room: Mapping[str, int], class_set: Sequence[str], need: int) -> dict[str, int] | None:
    """GPUs per class for one worker of ``need`` GPUs on a node with ``room`` (free GPUs,
    or class sizes) per class; None when the node does not serve the set."""
    if not class_set or need < len(class_set) or any(c not in room for c in class_set):
        return None
    by_room = sorted(class_set, key=lambda c: (-room[c], class_number(c), c))
    out = dict(zip(by_room, shares(need, len(class_set))))
    return out if all(room[c] >= out[c] for c in class_set) else None


def serves(room: Mapping[str, int], class_set: Sequence[str], need: int) -> bool:
    """Whether a node with ``room`` per class can take a worker of ``need`` GPUs in the set."""
    return assign(room, class_set, need) is not None


def runs(names: Iterable[str]) -> list[tuple[str, ...]]:
    """The class sets a node offers: every run of consecutive classes in rail order
    (``1``, ``1+2``, ``2+3``, ``1+2+3``, ...), at most :data:`MAX_CLASSES` classes. Runs,
    not every combination, so that a node's device plugin can advertise each set as a
    resource (``n(n+1)/2`` of them)."""
    ordered = _order(names)[:MAX_CLASSES]
    return [ordered[i:j] for i in range(len(ordered)) for j in range(i + 1, len(ordered) + 1)]


def candidate_sets(layouts: Iterable[Mapping[str, int]], need: int) -> list[tuple[str, ...]]:
    """Every class set (:func:`runs`) that some layout (class sizes) could serve for ``need`` GPUs."""
    found: set[tuple[str, ...]] = set()
    for sizes in layouts:
        for run in runs(sizes):
            if len(run) <= need and serves(sizes, run, need):
                found.add(run)
    return sorted(found, key=lambda s: (len(s), [class_number(c) for c in s], s))


def resource_name(class_set: Sequence[str]) -> str:
    """The kubelet resource name of a set: ``("gpu-roce1", "gpu-roce2")`` -> ``"gpu-roce1-2"``
    (one class: its own name). The classes share a prefix (``<prefix>N``)."""
    ordered = _order(class_set)
    if len(ordered) <= 1:
        return ordered[0] if ordered else ""
    stem = _NUMBER.sub("", ordered[0])
    return stem + "-".join(str(class_number(c)) for c in ordered)


def parse_resource_name(name: str, stem: str) -> tuple[str, ...]:
    """The inverse of :func:`resource_name` for classes named ``<stem>N``: ``"gpu-roce1-2"``
    -> ``("gpu-roce1", "gpu-roce2")``; ``()`` for a name that is not one."""
    if not name.startswith(stem):
        return ()
    parts = name[len(stem) :].split("-")
    if not parts or not all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts) or len(parts) > MAX_CLASSES:
        return ()
    return _order(f"{stem}{int(p)}" for p in parts)


@dataclass(frozen=True)
class NodeRoom:
    """One node (or ``weight`` nodes alike): GPUs per class, and free GPUs per class."""

    sizes: Mapping[str, int]
    free: Mapping[str, int]
    weight: int = 1


@dataclass(frozen=True)
class ClassSetChoice:
    """The job's class set, and the count behind it."""

    classes: tuple[str, ...]
    hosts: int  # nodes that can take one worker in the set now
    holds: bool  # the set can hold every worker now (else: the best set once nodes free up)

    @property
    def key(self) -> str:
        return set_key(self.classes)


def choose_class_set(nodes: Iterable[NodeRoom], need: int, workers: int) -> ClassSetChoice | None:
    """The job's class set (rules in the module docstring); None when no node's layout
    can serve any set for ``need`` GPUs (a worker larger than the node)."""
    rooms = list(nodes)
    sets = candidate_sets({tuple(sorted(r.sizes.items())): r.sizes for r in rooms}.values(), need)
    if not sets or need <= 0:
        return None
    best_now: tuple[tuple[int, int, int, tuple[int, ...]], ClassSetChoice] | None = None
    best_later: tuple[tuple[int, int, tuple[int, ...]], ClassSetChoice] | None = None
    for class_set in sets:
        hosts = free = could = 0
        for room in rooms:
            if serves(room.free, class_set, need):
                hosts += room.weight
                free += room.weight * sum(room.free[c] for c in class_set)
            if serves(room.sizes, class_set, need):
                could += room.weight
        numbers = tuple(class_number(c) for c in class_set)
        if hosts >= max(workers, 1):
            rank_now = (len(class_set), -hosts, -free, numbers)
            if best_now is None or rank_now < best_now[0]:
                best_now = (rank_now, ClassSetChoice(class_set, hosts, True))
        rank_later = (-min(could, max(workers, 1)), len(class_set), numbers)
        if best_later is None or rank_later < best_later[0]:
            best_later = (rank_later, ClassSetChoice(class_set, hosts, False))
    if best_now is not None:
        return best_now[1]
    return best_later[1] if best_later is not None else None


def fit_workers(nodes: Sequence[Mapping[str, int]], class_set: Sequence[str], needs: Sequence[int]) -> list[int] | None:
    """A node index per worker (in ``needs``' order) so that workers of ``needs`` GPUs
    fit in ``class_set``, one per node, on nodes with these free GPUs per class; None when
    they do not (greedy: largest worker first, on the tightest node that serves it)."""
    used: set[int] = set()
    where: dict[int, int] = {}
    for slot in sorted(range(len(needs)), key=lambda i: -needs[i]):
        need = needs[slot]
        fits = [
            (sum(room[c] for c in class_set), i)
            for i, room in enumerate(nodes)
            if i not in used and serves(room, class_set, need)
        ]
        if not fits:
            return None
        where[slot] = min(fits)[1]
        used.add(where[slot])
    return [where[i] for i in range(len(needs))]


def can_hold(nodes: Sequence[Mapping[str, int]], class_set: Sequence[str], needs: Sequence[int]) -> bool:
    """Whether :func:`fit_workers` finds room for every worker."""
    return fit_workers(nodes, class_set, needs) is not None


def single_set_placement(nodes: Sequence[NodeRoom], needs: Sequence[int]) -> tuple[tuple[str, ...], list[int]] | None:
    """A class set and a node index per worker holding workers of ``needs`` GPUs right now
    (the set with the fewest classes first), or None. ``weight`` is ignored: one room,
    one node. Behind ``jobs_across_subnets_avoidable`` and the simulator's re-placement
    of the time model's cross-node plans."""
    if not needs:
        return (), []
    layouts = {tuple(sorted(r.sizes.items())): r.sizes for r in nodes}.values()
    per_need = [set(candidate_sets(layouts, need)) for need in set(needs)]
    sets = set.intersection(*per_need)
    frees = [r.free for r in nodes]
    for class_set in sorted(sets, key=lambda s: (len(s), [class_number(c) for c in s], s)):
        where = fit_workers(frees, class_set, needs)
        if where is not None:
            return class_set, where
    return None


def single_set_exists(nodes: Sequence[NodeRoom], needs: Sequence[int]) -> bool:
    """Whether some class set could hold workers of ``needs`` GPUs right now."""
    return single_set_placement(nodes, needs) is not None


def gpus_in_set(
    topology: Topology,
    classes: Mapping[str, Iterable[int]],
    free: Iterable[int],
    class_set: Sequence[str],
    need: int,
) -> tuple[int, ...] | None:
    """A worker's GPUs on one node: its share of every class of the set, each share the
    best set inside the class (go-gpuallocator's score); None when the node cannot."""
    free_set = set(free)
    pools = {c: sorted(free_set.intersection(classes.get(c, ()))) for c in class_set if c in classes}
    split = assign({c: len(p) for c, p in pools.items()}, class_set, need)
    if split is None:
        return None
    chosen: list[int] = []
    for name, count in split.items():
        best = best_gpu_set(topology, pools[name], count)
        if best is None:
            return None
        chosen.extend(best.gpus)
    return tuple(sorted(chosen))


__all__ = [
    "ClassSetChoice",
    "NodeRoom",
    "SEPARATOR",
    "assign",
    "can_hold",
    "candidate_sets",
    "fit_workers",
    "choose_class_set",
    "class_number",
    "gpus_in_set",
    "parse_resource_name",
    "parse_set",
    "resource_name",
    "runs",
    "serves",
    "set_key",
    "shares",
    "single_set_exists",
    "single_set_placement",
]
