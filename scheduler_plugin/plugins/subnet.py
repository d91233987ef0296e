"""The GPU-RoCE subnet score (``prioritize``): how well a node fits a worker of the job's class
(docs/design.md#roce-class-choice).

A node's GPUs fall into classes, one per NUMA group of its RoCE NICs (hence subnet). All
workers of one job should use one class, so that their NICs share a subnet:

- the job's class is the cluster-wide vote, :mod:`gpu_topology.classvote` (every node
  suggests its class with the most free GPUs; the class suggested by the most nodes
  wins), shared with the admission webhook;
- :func:`fit` scores a node for a worker needing ``need`` GPUs of the job's class:
  best fit first (the smallest sufficient leftover scores highest), nothing when the
  class cannot hold the worker.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_plugin.plugins import normalize_to_max


def fit(free: int, need: int) -> float:
    """Best-fit raw score: 1 / (1 + leftover) when ``free >= need > 0``, else 0."""
    if need <= 0 or free < need:
        return 0.0
    return 1.0 / (1 + free - need)


def normalize(raws: Sequence[float]) -> list[int]:
    """0..10 over the candidates: the tightest sufficient fit gets 10."""
    return normalize_to_max(raws)


__all__ = ["fit", "normalize"]
