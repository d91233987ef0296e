"""The deadline scheduler's variants in the simulator, and the cost model of migration.

Who calls it: :mod:`tools.sim.engine` (which variant a policy name means, what a move
costs) and ``tools/sim/run.py`` (the policy names). It owns no scheduling rule: the rules
are :func:`scheduling.timemodel.decide` and
:func:`scheduling.migration.plan_migrations`; this module only names their settings.

Policy names (docs/design.md#deadline-formula)::

    ours+time               (12) = slack per GPU, plans capped at the GPUs asked for (as before)
    deadline-slack          slack per GPU, plans over the free GPUs
    deadline-finish         earliest finish among the plans that meet the deadline
    deadline-efficiency     parallel efficiency t_single / (n x t_run)
    deadline-design         the design as written: slack per GPU, plans over the free GPUs,
                            (3.4) without the project's rules, no waiting for one node
    <any of them>+migrate   step 5 for the jobs that checkpoint (a share of the jobs)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VARIANTS = {
    "ours+time": ("slack-per-gpu", False, False),
    "deadline-slack": ("slack-per-gpu", True, False),
    "deadline-finish": ("earliest-finish", True, False),
    "deadline-efficiency": ("efficiency", True, False),
    "deadline-design": ("slack-per-gpu", True, True),
}
MIGRATE = "+migrate"
POLICY_NAMES = tuple(VARIANTS) + tuple(f"{v}{MIGRATE}" for v in VARIANTS if v != "ours+time")

MIGRATABLE_SHARE = 0.5  # jobs that checkpoint
CHECKPOINT_S = 120.0  # write the checkpoint (seconds)
RESTART_S = 180.0  # pods terminate, are re-created and scheduled, the framework restarts
MAX_PLAN_GPUS = 512  # largest plan tried (powers of two up to it, and the count asked for)


@dataclass(frozen=True)
class Variant:
    name: str
    formula: str
    over_free: bool  # plans range over the free GPUs (design) rather than the GPUs asked for
    as_written: bool  # (3.4) exactly as the design says, no project rules
    migrate: bool


def variant(policy: str) -> Variant | None:
    """The variant a policy name means; None for a policy that is not a deadline scheduler."""
    base, migrate = (policy[: -len(MIGRATE)], True) if policy.endswith(MIGRATE) else (policy, False)
    if base not in VARIANTS or (migrate and base == "ours+time"):
        return None
    formula, over_free, as_written = VARIANTS[base]
    return Variant(policy, formula, over_free, as_written, migrate)


def migratable(job_id: int, seed: int) -> bool:
    """Whether a job checkpoints: a fixed share, drawn per job from the seed."""
    return random.Random(seed * 1_000_003 + job_id).random() < MIGRATABLE_SHARE


def move_cost(refetch_bytes: int, fetch_bps: float) -> float:
    """Seconds a move costs: checkpoint, restart, and the data re-fetch on a node without it."""
    refetch = refetch_bytes / fetch_bps if refetch_bytes > 0 and fetch_bps > 0 else 0.0
    return CHECKPOINT_S + RESTART_S + refetch


__all__ = ["POLICY_NAMES", "Variant", "migratable", "move_cost", "variant"]
