"""Step 5 of the deadline design (migration), as a pure policy: which running jobs to move.

Who calls it: the migrator (:mod:`dsagent.controller.migration`), which reads the running
pods, evicts the chosen jobs' pods through the Eviction API and lets their controllers
re-create them, and the cluster simulator (``tools/sim``), which models the cost. Nothing
here reads a clock or does I/O.

Decisions (docs/design.md#deadline-migration):

- Only jobs that opt in move: pods labelled or annotated ``dsagent.io/migratable: "true"``
  (the job checkpoints and resumes from its checkpoint). The design re-allocates every
  running job; a job that does not checkpoint would lose its progress, so the project never
  moves one.
- The design's order: single-node jobs before cross-node jobs, larger jobs first (5.2), and
  step 4's best-fit allocation for the new place. The project moves a job only to **one node**
  (the time model's fastest plan for its GPU count) and only when it pays: the job's
  remaining run there plus the move's cost (checkpoint, restart, data re-fetch where the
  node lacks the data) ends at least ``min_gain`` of the remaining time earlier than staying.
  A single-node job therefore moves only to a node with a faster GPU set.
- The GPUs a move takes are gone for the rest of the round; the GPUs it frees are not
  reused in the same round (the pods are still terminating).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduling.timemodel import Allocated, JobProfile, allocate_single, best_fit_order, t_run

MIGRATABLE_KEY = "dsagent.io/migratable"
DEFAULT_MIN_GAIN = 0.1


def is_migratable(labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None) -> bool:
    """The opt-in: label or annotation ``dsagent.io/migratable`` equal to ``"true"`` (any case)."""
    for source in (labels or {}, annotations or {}):
        value = source.get(MIGRATABLE_KEY)
        if isinstance(value, str) and value.strip().lower() == "true":
            return True
    return False


@dataclass(frozen=True)
class RunningJob(Allocated):
    """A running job as the policy sees it. ``remaining`` is the part of its work left (0..1]."""

    name: str
    profile: JobProfile
    allocation: tuple[tuple[str, int], ...]  # (node, GPUs)
    end: float  # expected end where it runs now
    remaining: float
    migratable: bool


@dataclass(frozen=True)
class Migration:
    job: str
    target: tuple[tuple[str, int], ...]
    end: float  # expected end after the move, cost included
    cost: float  # seconds the move costs (checkpoint + restart + re-fetch)


BandwidthOf = Callable[[RunningJob, tuple[tuple[str, int], ...]], float]
CostOf = Callable[[RunningJob, tuple[tuple[str, int], ...]], float]


def plan_migrations(
    jobs: Sequence[RunningJob],
    free: Mapping[str, int],
    bandwidth_of: BandwidthOf,
    cost_of: CostOf,
    *,
    now: float,
    min_gain: float = DEFAULT_MIN_GAIN,
) -> list[Migration]:
    """The moves of one round, in the design's order (5.2)."""
    left = dict(free)
    movable = [j for j in jobs if j.migratable and 0 < j.remaining <= 1 and j.end > now]
    single = sorted((j for j in movable if not j.cross_node), key=lambda j: (-j.n_gpu, j.name))
    cross = sorted((j for j in movable if j.cross_node), key=lambda j: (-j.n_gpu, j.name))
    moves: list[Migration] = []
    for job in single + cross:
        own = {n for n, _ in job.allocation}
        order = best_fit_order({n: c for n, c in left.items() if n not in own})
        target = allocate_single(order, job.n_gpu)
        if target is None:
            continue
        bw = bandwidth_of(job, target)
        run = t_run(job.profile, job.n_gpu, bw) * job.remaining
        cost = cost_of(job, target)
        if not (math.isfinite(run) and math.isfinite(cost) and cost >= 0):
            continue
        end = now + cost + run
        if end > job.end - min_gain * (job.end - now):
            continue
        node, count = target[0]
        left[node] -= count
        moves.append(Migration(job.name, target, end, cost))
    return moves


__all__ = [
    "DEFAULT_MIN_GAIN",
    "MIGRATABLE_KEY",
    "Migration",
    "RunningJob",
    "is_migratable",
    "plan_migrations",
]
