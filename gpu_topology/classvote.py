"""The cluster-wide RoCE class choice (RoCE patent S4): one pure rule for every caller.

The admission webhook (which fixes a job's class when its first worker is created) and
the scheduler extender (``GET /v1/roce-class``, its RoCE score) both call it, on the
classes and free GPUs the node agents publish. Design: ``docs/design.md#roce-class-choice``.

- Each node **suggests** its class with the most free GPUs, if that class can hold the
  worker (``need`` GPUs); a node with equally free classes suggests each of them.
- The class suggested by the **most nodes** wins; ties: more free GPUs cluster-wide, then
  the name.
- :func:`choose_class_by_size` is the fallback when no node has room right now: the
  class that can hold the worker at all on the most nodes, so the job waits for the class
  most of the cluster offers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_topology.contract import classes_from_dict
from gpu_topology.roceclasses import RoceClass


@dataclass(frozen=True)
class ClassChoice:
    """The chosen class and the vote behind it."""

    name: str
    votes: Mapping[str, int] = field(default_factory=dict)  # class -> suggesting nodes
    free: Mapping[str, int] = field(default_factory=dict)  # class -> free GPUs, all nodes


def suggest(free_by_class: Mapping[str, int], need: int = 1) -> tuple[str, ...]:
    """The class(es) a node suggests: most free GPUs, at least ``need``; ties all suggested."""
    most = max(free_by_class.values(), default=0)
    if most < max(1, need):
        return ()
    return tuple(sorted(name for name, free in free_by_class.items() if free == most))


def choose_class(nodes: Iterable[Mapping[str, int]], need: int = 1) -> ClassChoice | None:
    """The class suggested by the most nodes (each node's free GPUs per class).

    A node whose best class has fewer than ``need`` free GPUs cannot host a worker and
    does not vote. A node with two equally free classes votes for both. The patent
    leaves a tie between classes open; this breaks it by total free GPUs, then name.
    """
    return choose_class_grouped(((free_by_class, 1) for free_by_class in nodes), need)


def choose_class_grouped(groups: Iterable[tuple[Mapping[str, int], int]], need: int = 1) -> ClassChoice | None:
    """:func:`choose_class` over (free_by_class, number of nodes with exactly that) pairs,
    so that a large cluster of few distinct free-GPU patterns is counted quickly."""
    votes: dict[str, int] = {}
    free: dict[str, int] = {}
    for free_by_class, weight in groups:
        for name, count in free_by_class.items():
            free[name] = free.get(name, 0) + count * weight
        for name in suggest(free_by_class, need):
            votes[name] = votes.get(name, 0) + weight
    if not votes:
        return None
    winner = min(votes, key=lambda name: (-votes[name], -free.get(name, 0), name))
    return ClassChoice(winner, votes, free)


def choose_class_by_size(nodes: Iterable[Mapping[str, int]], need: int = 1) -> ClassChoice | None:
    """The class whose size (GPUs, free or not) is at least ``need`` on the most nodes;
    ties by total size, then name. None when no class anywhere can hold ``need`` GPUs."""
    votes: dict[str, int] = {}
    total: dict[str, int] = {}
    for sizes in nodes:
        for name, size in sizes.items():
            total[name] = total.get(name, 0) + size
            if size >= max(1, need):
                votes[name] = votes.get(name, 0) + 1
    if not votes:
        return None
    winner = min(votes, key=lambda name: (-votes[name], -total.get(name, 0), name))
    return ClassChoice(winner, votes, total)


@dataclass(frozen=True)
class NodeClasses:
    """One node's published classes: GPUs per class and, when known, free GPUs per class."""

    sizes: Mapping[str, int]
    free: Mapping[str, int] | None  # None when the node publishes no free-GPU list


def node_classes(document: Mapping[str, Any], free_gpus: Iterable[int] | None) -> NodeClasses:
    """A node's classes as its agent published them (the topology contract document) and
    its free GPU indices (None: unknown). Raises ParseError on a malformed document."""
    return classes_with_free(classes_from_dict(document), free_gpus)


def classes_with_free(classes: Sequence[RoceClass], free_gpus: Iterable[int] | None) -> NodeClasses:
    """:func:`node_classes` of classes already read from their document (a reader that
    sees the same document on many nodes reads it once)."""
    free = None if free_gpus is None else set(free_gpus)
    return NodeClasses(
        sizes={c.name: len(c.gpus) for c in classes},
        free=None if free is None else {c.name: len(free.intersection(c.gpus)) for c in classes},
    )


_MAX_FREE_GPUS_TEXT = 4096  # a node's annotation, hostile: bounded before it is split


def parse_free_gpus(text: object) -> frozenset[int] | None:
    """The ``dsagent.io/free-gpus`` annotation: ``"0,1,4,5"`` -> {0, 1, 4, 5}; ``""`` -> no
    free GPU; anything unreadable -> None (unknown)."""
    if not isinstance(text, str) or len(text) > _MAX_FREE_GPUS_TEXT:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    # ASCII digits only ("²".isdigit() is true, int("²") fails), a few of them each
    if not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts):
        return None
    return frozenset(int(p) for p in parts)


__all__ = [
    "ClassChoice",
    "NodeClasses",
    "choose_class",
    "choose_class_by_size",
    "choose_class_grouped",
    "classes_with_free",
    "node_classes",
    "parse_free_gpus",
    "suggest",
]
