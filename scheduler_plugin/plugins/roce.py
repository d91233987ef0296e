"""GPU-RoCE subnet placement (docs/design.md#roce-class-choice).

A node's GPUs fall into classes, one per RoCE NIC (hence subnet). All workers of one
job should use one class, so that their NICs share a subnet:

- :func:`choose_class` is the cluster-wide choice for a new job: every node suggests
  its class with the most free GPUs; the class suggested by the most nodes wins.
- :func:`fit` scores a node for a worker needing ``need`` GPUs of the job's class:
  best fit first (the smallest sufficient leftover scores highest), nothing when the
  class cannot hold the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_plugin.plugins import normalize_to_max


@dataclass(frozen=True)
class ClassChoice:
    """The chosen class and the vote behind it."""

    name: str
    votes: Mapping[str, int] = field(default_factory=dict)       # class -> suggesting nodes
    free: Mapping[str, int] = field(default_factory=dict)        # class -> free GPUs, all nodes


def suggest(free_by_class: Mapping[str, int], need: int = 1) -> tuple[str, ...]:
    """The class(es) a node suggests: most free GPUs, at least ``need``; ties all suggested."""
    most = max(free_by_class.values(), default=0)
    if most < max(1, need):
        return ()
    return tuple(sorted(name for name, free in free_by_class.items() if free == most))


def choose_class(nodes: Iterable[Mapping[str, int]], need: int = 1) -> ClassChoice | None:
    """The class suggested by the most nodes (each node's ``free_by_class``).

    A node whose best class has fewer than ``need`` free GPUs cannot host a worker and
    does not vote. A node with two equally free classes votes for both. The design
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


def fit(free: int, need: int) -> float:
    """Best-fit raw score: 1 / (1 + leftover) when ``free >= need > 0``, else 0."""
    if need <= 0 or free < need:
        return 0.0
    return 1.0 / (1 + free - need)


def normalize(raws: Sequence[float]) -> list[int]:
    """0..10 over the candidates: the tightest sufficient fit gets 10."""
    return normalize_to_max(raws)


__all__ = ["ClassChoice", "choose_class", "choose_class_grouped", "fit", "normalize", "suggest"]
