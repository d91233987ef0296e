"""The policies the simulator runs: their names, and what the deadline scheduler's variants among them mean.

Who calls it: every part of the simulator that asks which policy it runs --
:mod:`tools.sim.state` (the policy a simulation was given, its variant, which jobs
checkpoint), :mod:`tools.sim.placement` and :mod:`tools.sim.reads` (the policy's rules),
:mod:`tools.sim.report` (which rows are deadline variants), ``tools/sim/run.py``,
``tools/sim/sweep.py`` and ``python -m tools.sim.deadline`` (the names they accept). It
owns the policy names and, for the deadline variants, the settings they give the time
model and what a move costs. It imports no other part of the simulator but
:mod:`tools.sim.fluid`'s names, so every layer can read it. It owns no scheduling rule: the
rules are :func:`scheduling.timemodel.decide` and :func:`scheduling.migration.plan_migrations`;
this module only names their settings.

Deadline variants (docs/design.md#deadline-formula)::

    ours+time               (12) = slack per GPU, plans capped at the GPUs asked for (as before)
    deadline-slack          slack per GPU, plans over the free GPUs
    deadline-finish         earliest finish among the plans that meet the deadline
    deadline-efficiency     parallel efficiency t_single / (n x t_run)
    deadline-design         the design as written: (12) is the product's own function,
                            ``FORMULAS[DEFAULT_FORMULA]`` of scheduling.timemodel (the highest
                            running efficiency, what the webhook and the plan loop rank by),
                            reached through the product's ``decide``; plans over the free
                            GPUs, (3.4) without the project's rules, no waiting for one node
    deadline-applied        what the admission webhook applies to pods that opt in: efficiency,
                            plans over the free GPUs, single-node plans for one-worker jobs;
                            a multi-worker job keeps the GPUs it asked for
    <any of them>+migrate   step 5 for the jobs that checkpoint (a share of the jobs)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduling.timemodel import DEFAULT_FORMULA
from tools.sim import fluid

VARIANTS = {
    "ours+time": ("slack-per-gpu", False, False),
    "deadline-slack": ("slack-per-gpu", True, False),
    "deadline-finish": ("earliest-finish", True, False),
    "deadline-efficiency": ("efficiency", True, False),
    "deadline-design": (DEFAULT_FORMULA, True, True),  # the product's reading of (12)
    "deadline-applied": ("efficiency", True, False),
}
#: variants that plan only one-worker jobs, on one node (the webhook's applied plans)
ONE_POD_ONLY = frozenset({"deadline-applied"})
MIGRATE = "+migrate"
#: the deadline scheduler's variants, with and without moves
POLICY_NAMES = tuple(VARIANTS) + tuple(f"{v}{MIGRATE}" for v in VARIANTS if v != "ours+time")

# ours with the Dataset controller's cluster-side policies: next-job preparation,
# replication, and versions striped over a group (rank-affine reads; +early: training
# starts when the first bundles are local)
OURS_VARIANTS = ("ours+prepare", "ours+replicas", "ours+stripe", "ours+stripe+early")
OURS = ("ours", "ours+time", *OURS_VARIANTS)  # cluster-aware eviction, class sets
#: the JuiceFS cache group under kube-scheduler's spreading, and under packing as ours is
JUICEFS = ("juicefs", "juicefs+pack")
BASELINES = ("default", *fluid.POLICIES, *JUICEFS)
#: every policy a simulation accepts
POLICIES = (*BASELINES, *OURS, *(p for p in POLICY_NAMES if p not in OURS))

#: the policy the product runs, which the README and the results pages report: a Dataset with
#: ``spec.stripe: auto`` and ``spec.startBeforeWhole: true`` (docs/user-guide/striping.md),
#: held as :mod:`dsagent.policy.holding` decides (whole on each job node it fits, shares over
#: the job's nodes where it does not), the pods starting at once and reading through the
#: window until the local copy is whole. A Dataset without those fields runs ``ours``.
PRODUCT_POLICY = "ours+stripe+early"

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
    one_pod_only: bool = False  # plans for one-worker jobs on one node; others keep their count


def variant(policy: str) -> Variant | None:
    """The variant a policy name means; None for a policy that is not a deadline scheduler."""
    base, migrate = (policy[: -len(MIGRATE)], True) if policy.endswith(MIGRATE) else (policy, False)
    if base not in VARIANTS or (migrate and base == "ours+time"):
        return None
    formula, over_free, as_written = VARIANTS[base]
    return Variant(policy, formula, over_free, as_written, migrate, base in ONE_POD_ONLY)


def migratable(job_id: int, seed: int) -> bool:
    """Whether a job checkpoints: a fixed share, drawn per job from the seed."""
    return random.Random(seed * 1_000_003 + job_id).random() < MIGRATABLE_SHARE


def move_cost(refetch_bytes: int, fetch_bps: float) -> float:
    """Seconds a move costs: checkpoint, restart, and the data re-fetch on a node without it."""
    refetch = refetch_bytes / fetch_bps if refetch_bytes > 0 and fetch_bps > 0 else 0.0
    return CHECKPOINT_S + RESTART_S + refetch


__all__ = [
    "BASELINES",
    "CHECKPOINT_S",
    "JUICEFS",
    "MAX_PLAN_GPUS",
    "MIGRATE",
    "OURS",
    "OURS_VARIANTS",
    "POLICIES",
    "POLICY_NAMES",
    "PRODUCT_POLICY",
    "RESTART_S",
    "Variant",
    "migratable",
    "move_cost",
    "variant",
]
