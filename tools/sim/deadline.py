"""The deadline policy against the faithful baselines: the comparison and its figures.

Who calls it: a person (``python -m tools.sim.deadline``) and the simulator's tests. It
owns the comparison's figures (:func:`deadline_figures`: the deadline hit rate, the mean
JCT and the GPU utilisation of one finished simulation) and their table; the deadline
variants themselves, what their names mean and what a move costs, are
:mod:`tools.sim.policies`, and the runs are :class:`tools.sim.engine.Simulation`'s.

The comparison (:func:`compare`) runs the deadline policy (``deadline-efficiency``: plans
over the free GPUs, (12) = highest running efficiency, as the product applies them) beside
the faithful baselines (``default``: kube-scheduler's spreading, no cache; ``fluid``:
Fluid's label affinity; ``juicefs``, spreading and packing) and ours without the time
model (``ours``, and the product's policy) on several workload files, and reports per
workload and policy the deadline hit rate, the mean JCT and the GPU utilisation
(docs/simulation.md#deadline-policy)::

    python -m tools.sim.deadline --workloads smoke,results-base,results-tight,results-churn --jobs 300
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduling.timemodel import single_gpu_time  # noqa: E402
from tools.sim.engine import Simulation  # noqa: E402
from tools.sim.policies import POLICIES, PRODUCT_POLICY  # noqa: E402
from tools.sim.run import WORKLOADS  # noqa: E402
from tools.sim.workload import make_jobs  # noqa: E402
from tools.sim.workload_file import WorkloadFile, load, total_gpus  # noqa: E402

#: the faithful baselines (what users run instead), ours without the time model (plain, and
#: the policy the chart's defaults run), and the deadline variants the comparison reports
COMPARED = (
    "default",
    "fluid",
    "juicefs",
    "juicefs+pack",
    "ours",
    PRODUCT_POLICY,
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
    raise SystemExit(main())


__all__ = [
    "COMPARED",
    "COMPARED_WORKLOADS",
    "compare",
    "deadline_figures",
    "table",
]
