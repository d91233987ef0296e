"""The time score (``prioritize/time``): how soon the pod's job would finish on a node.

Pure: the framework passes the pod's :class:`~scheduling.timemodel.JobProfile`, the
node's topology and free GPUs, and the time now. The pod's GPUs are the best set
gpu_topology's ``best_gpu_set`` finds on the node's free GPUs; their weakest link (and the
network, when the job has several workers) is the ``bw`` of the time model
(:mod:`scheduling.timemodel`), which gives the run time. Scores are absolute
(0..10): a node where the job would meet its deadline scores 6..10, any other 1..5, a node
that cannot hold the pod 0; within a tier faster and tighter-fitting nodes score higher.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from gpu_topology import Topology
from scheduling.nodeinfo import pod_bandwidth
from scheduling.timemodel import (
    DEFAULT_BANDWIDTHS,
    Bandwidths,
    Decision,
    JobProfile,
    Plan,
    node_score,
)

log = logging.getLogger(__name__)


def score(
    job: JobProfile,
    topology: Topology | None,
    free: frozenset[int] | None,
    need: int,
    *,
    now: float,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> int:
    """0..10 for one node and one pod needing ``need`` GPUs of a job described by ``job``."""
    if need <= 0:
        return 0
    found = pod_bandwidth(topology, free, need, job.workers, bandwidths)
    if found is None or free is None:
        return 0
    bw, ideal_bw = found
    return node_score(job, need * job.workers, bw, ideal_bw, len(free), now=now)


def describe(decision: Decision, *, now: float) -> dict[str, Any]:
    """The JSON answer of ``GET /v1/plan`` (times in seconds from ``now``)."""

    def one(p: Plan) -> dict[str, Any]:
        return {
            "gpus": p.n_gpu,
            "nodes": [{"node": n, "gpus": c} for n, c in p.allocation],
            "crossNode": p.cross_node,
            "runSeconds": round(p.t_run, 3),
            "endInSeconds": round(p.t_end - now, 3),
            "meetsDeadline": p.meets_deadline,
            "slackPerGpuSeconds": round(p.performance, 3) if math.isfinite(p.performance) else None,
        }

    candidates: Mapping[str, Plan] = decision.candidates
    return {
        "branch": decision.branch,
        "plan": one(decision.plan) if decision.plan else None,
        "candidates": {k: one(v) for k, v in candidates.items()},
    }


__all__ = ["describe", "score"]
