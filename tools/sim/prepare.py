"""Next-job preparation measured against the faithful baselines on several workloads: is it
worth turning on by default? (docs/design.md#next-job-preparation)

    python tools/sim/prepare.py                                   # the three result presets, 1,500 jobs
    python tools/sim/prepare.py --workloads scale-120 --jobs 500  # one preset, fewer jobs
    python tools/sim/prepare.py --smoke                           # the smoke preset (seconds)

Each workload runs ``ours``, ``ours+prepare`` (the controller's two-phase plan, fetched as the
agent fetches) and the baselines ``fluid``, ``fluid-r4`` and ``juicefs`` on the same jobs,
through :func:`tools.sim.run.simulate`. The table gives, per workload and policy, the
figures preparation can move; the verdict lists every figure on which ``ours+prepare`` is
worse than ``ours`` (a loss): the rule for a default is that it never loses. The simulator
does not model the agent's second-threshold hold or its start check (the plan's own
second threshold, ``fill_fraction``, bounds the fetches). Who calls it: a person, and
``tests/tools/test_sim_prepare.py`` at the smoke size.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import report  # noqa: E402
from tools.sim.run import SMOKE, WORKLOADS, simulate  # noqa: E402
from tools.sim.workload_file import WorkloadFile, load  # noqa: E402

POLICIES = ("fluid", "fluid-r4", "juicefs", "ours", "ours+prepare")
DEFAULT_WORKLOADS = ("scale-120", "results-tight", "results-churn")
# (label, field, scale): lower is better for every one
FIGURES = (
    ("TTFS mean s", "ttfs_mean_s", 1.0),
    ("TTFS p50 s", "ttfs_p50_s", 1.0),
    ("queued data wait s", "queued_data_wait_mean_s", 1.0),
    ("GPU-h idle for data", "gpu_hours_idle_for_data", 1.0),
    ("storage TB", "storage_bytes", 1e-12),
    ("deadline misses", "deadline_misses", 1.0),
)
TOLERANCE = 0.005  # a change under 0.5% is no change (same jobs, a different event order)


def losses(ours: dict[str, Any], prepared: dict[str, Any]) -> list[str]:
    """The figures on which preparation is worse than ``ours`` by more than the tolerance."""
    out = []
    for label, key, scale in FIGURES:
        a, b = float(ours.get(key) or 0.0) * scale, float(prepared.get(key) or 0.0) * scale
        if b > a * (1 + TOLERANCE) and b - a > 1e-12:
            out.append(f"{label} {a:.4g} -> {b:.4g}")
    return out


def compare(workloads: Sequence[tuple[str, WorkloadFile]]) -> tuple[str, bool]:
    """The markdown table and whether preparation never lost."""
    head = "| workload | policy | " + " | ".join(label for label, _, _ in FIGURES) + " | prepared TB fetched / used |"
    lines = [head, "|" + "---|" * (len(FIGURES) + 3)]
    verdicts, never_loses = [], True
    for name, wf in workloads:
        results = {policy: report.fields(simulate(policy, wf)) for policy in POLICIES}
        for policy in POLICIES:
            r = results[policy]
            cells = [f"{float(r.get(key) or 0.0) * scale:.4g}" for _, key, scale in FIGURES]
            prepared = (
                f"{r['prepare_fetch_bytes'] / 1e12:.2f} / {r['prepare_used_bytes'] / 1e12:.2f}"
                if policy == "ours+prepare"
                else ""
            )
            lines.append(f"| {name} | {policy} | " + " | ".join(cells) + f" | {prepared} |")
        lost = losses(results["ours"], results["ours+prepare"])
        never_loses = never_loses and not lost
        verdicts.append(f"- {name}: " + ("never worse than ours" if not lost else "worse on " + "; ".join(lost)))
    verdict = "on by default: " + ("yes, it never lost" if never_loses else "no, it lost somewhere (opt-in)")
    return "\n".join(lines + ["", *verdicts, "", verdict]), never_loses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), help="presets in tools/sim/workloads"
    )
    parser.add_argument("--jobs", type=int, default=1500, help="jobs per workload")
    parser.add_argument("--smoke", action="store_true", help="the smoke preset only, its own job count")
    args = parser.parse_args(argv)
    chosen: list[tuple[str, WorkloadFile]] = []
    if args.smoke:
        chosen.append(("smoke", load(SMOKE)))
    else:
        for name in args.workloads:
            wf = load(WORKLOADS / f"{name}.json")
            wf = WorkloadFile.model_validate({**wf.model_dump(), "jobs": {**wf.jobs.model_dump(), "count": args.jobs}})
            chosen.append((name, wf))
    table, _ = compare(chosen)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
