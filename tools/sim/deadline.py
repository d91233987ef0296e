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
    deadline-applied        what the admission webhook applies to pods that opt in: efficiency,
                            plans over the free GPUs, single-node plans for one-worker jobs;
                            a multi-worker job keeps the GPUs it asked for
    <any of them>+migrate   step 5 for the jobs that checkpoint (a share of the jobs)

The comparison (:func:`compare`, ``python -m tools.sim.deadline``) runs the deadline policy
(``deadline-efficiency``: plans over the free GPUs, (12) = highest running efficiency, as the
product applies them) beside the faithful baselines (``default``: kube-scheduler's spreading,
no cache; ``fluid``: Fluid's label affinity; ``juicefs``) and ``ours`` (dataset affinity, no
time model) on several workload files, and reports per workload and policy the deadline hit
rate, the mean JCT and the GPU utilisation (docs/simulation.md#deadline-policy)::

    python -m tools.sim.deadline --workloads smoke,results-base,results-tight,results-churn --jobs 300
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIANTS = {
    "ours+time": ("slack-per-gpu", False, False),
    "deadline-slack": ("slack-per-gpu", True, False),
    "deadline-finish": ("earliest-finish", True, False),
    "deadline-efficiency": ("efficiency", True, False),
    "deadline-design": ("slack-per-gpu", True, True),
    "deadline-applied": ("efficiency", True, False),
}
#: variants that plan only one-worker jobs, on one node (the webhook's applied plans)
ONE_POD_ONLY = frozenset({"deadline-applied"})
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


#: the faithful baselines (what users run instead), ours without the time model, and the
#: deadline variants the comparison reports
COMPARED = (
    "default",
    "fluid",
    "juicefs",
    "ours",
    "ours+time",
    "deadline-efficiency",
    "deadline-design",
    "deadline-applied",
    "deadline-efficiency+migrate",
)
COMPARED_WORKLOADS = ("smoke", "results-base", "results-tight", "results-churn")


def deadline_figures(sim: Any, total_gpus: int) -> dict[str, Any]:
    """One finished simulation's deadline figures: ``hit_rate`` (finished jobs with a deadline
    that ended before it, eq. (9)), ``jct_mean_h`` (arrival to end), and two utilisations over
    the arrival window (first to last arrival: the cluster under the workload's load, not the
    tail of the longest job): ``gpu_util``, GPU-time held from each job's first step to the
    end of its compute (on the GPUs of its last placement) over the cluster's GPU-time, and
    ``useful_util``, the same with each job's GPU-time counted as its run time on one GPU
    (eq. (6)'s ``t_single``: the work, spread evenly over the job's compute; the difference is
    communication)."""
    from scheduling.timemodel import single_gpu_time

    outs = [o for o in sim.outcomes.values() if not math.isnan(o.end)]
    timed = [o for o in outs if o.job.profile.deadline is not None]
    hits = sum(1 for o in timed if o.end < o.job.profile.deadline)
    t0 = min((o.job.arrival for o in sim.outcomes.values()), default=0.0)
    t1 = max((o.job.arrival for o in sim.outcomes.values()), default=0.0)
    busy = useful = 0.0
    for o in outs:
        length = o.compute_end - o.first_step
        inside = max(0.0, min(o.compute_end, t1) - max(o.first_step, t0))
        if length > 0 and inside > 0:
            busy += inside * sum(len(w.gpus) for w in o.workers)
            useful += single_gpu_time(o.job.profile) * inside / length
    capacity = total_gpus * (t1 - t0)
    return {
        "policy": sim.policy,
        "finished": len(outs),
        "deadline_jobs": len(timed),
        "hit_rate": hits / len(timed) if timed else math.nan,
        "jct_mean_h": sum(o.end - o.job.arrival for o in outs) / len(outs) / 3600 if outs else math.nan,
        "gpu_util": busy / capacity if capacity > 0 else math.nan,
        "useful_util": useful / capacity if capacity > 0 else math.nan,
    }


def _one(policy: str, workload: str, jobs: int | None, seed: int | None) -> dict[str, Any]:
    from tools.sim.engine import Simulation
    from tools.sim.run import WORKLOADS
    from tools.sim.workload import make_jobs
    from tools.sim.workload_file import WorkloadFile, load, total_gpus

    wf = load(WORKLOADS / f"{workload}.json")
    overrides: dict[str, Any] = {} if seed is None else {"seed": seed}
    if jobs is not None:
        overrides["jobs"] = {**wf.jobs.model_dump(), "count": jobs}
    if overrides:
        wf = WorkloadFile.model_validate({**wf.model_dump(), **overrides})
    cluster = wf.cluster()
    gpus = total_gpus(cluster)
    made, datasets = make_jobs(wf.workload(), gpus, wf.seed)
    sim = Simulation(policy, made, datasets, cluster, wf.seed).run()
    return {"workload": workload, **deadline_figures(sim, gpus)}


def compare(
    workloads: Sequence[str] = COMPARED_WORKLOADS,
    policies: Sequence[str] = COMPARED,
    *,
    jobs: int | None = None,
    seed: int | None = None,
    procs: int = 2,
) -> list[dict[str, Any]]:
    """Every policy on every workload file (``tools/sim/workloads/<name>.json``, ``jobs``
    overriding its count): :func:`deadline_figures` per run, in workload then policy order."""
    runs = [(p, w) for w in workloads for p in policies]
    if procs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=procs) as pool:
            return list(pool.map(_one, *zip(*runs), [jobs] * len(runs), [seed] * len(runs)))
    return [_one(p, w, jobs, seed) for p, w in runs]


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a Markdown table, one row per workload and policy."""
    lines = [
        "| workload | policy | deadline hit rate | mean JCT h | GPU utilisation | useful GPU utilisation |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['policy']} | {r['hit_rate']:.1%} | {r['jct_mean_h']:.2f} "
            f"| {r['gpu_util']:.1%} | {r['useful_util']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the deadline policy against the faithful baselines")
    parser.add_argument("--workloads", default=",".join(COMPARED_WORKLOADS), help="names in tools/sim/workloads/")
    parser.add_argument("--policies", default=",".join(COMPARED))
    parser.add_argument("--jobs", type=int, default=None, help="override each file's jobs.count")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args(argv)
    from tools.sim.engine import POLICIES
    from tools.sim.run import WORKLOADS

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    missing = [w for w in workloads if not (WORKLOADS / f"{w}.json").is_file()]
    unknown = [p for p in policies if p not in POLICIES]
    if missing or unknown or not workloads or not policies:
        print(f"deadline.py: unknown workloads {missing} or policies {unknown}", file=sys.stderr)
        return 2
    print(table(compare(workloads, policies, jobs=args.jobs, seed=args.seed, procs=args.procs)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main())


__all__ = [
    "COMPARED",
    "COMPARED_WORKLOADS",
    "POLICY_NAMES",
    "Variant",
    "compare",
    "deadline_figures",
    "migratable",
    "move_cost",
    "table",
    "variant",
]
