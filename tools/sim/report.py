"""Outcomes of finished simulations: the metrics, the table, the goals and the plots.

Who calls it: ``tools/sim/run.py`` and the simulator's tests. It owns the metric
definitions (what counts as a hit, an idle GPU-hour, a job across subnets) and the PNGs.
matplotlib is imported only by :func:`plot` (the ``sim`` extra).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.sim.deadline import POLICY_NAMES as DEADLINE_POLICIES
from tools.sim.engine import Simulation

COLUMNS = (
    ("hit ratio", "hit_ratio", "{:.1%}"),
    ("storage TB", "storage_tb", "{:.1f}"),
    ("TTFS p50 s", "ttfs_p50", "{:.0f}"),
    ("TTFS mean s", "ttfs_mean", "{:.0f}"),
    ("GPU-h idle for data", "idle_gpu_h", "{:.0f}"),
    ("jobs across subnets", "across_subnets", "{:d}"),
    ("NUMA-split workers", "numa_split", "{:d}"),
    ("deadline misses", "misses", "{:d}"),
    ("JCT p50 h", "jct_p50_h", "{:.2f}"),
    ("JCT mean h", "jct_mean_h", "{:.2f}"),
)


def metrics(sim: Simulation) -> dict[str, Any]:
    outs = [o for o in sim.outcomes.values() if not math.isnan(o.end)]
    ttfs = [o.first_step - o.job.arrival for o in outs]
    jct = [o.end - o.job.arrival for o in outs]
    idle = sum((o.first_step - o.start) * sum(len(w.gpus) for w in o.workers) for o in outs) / 3600
    return {
        "policy": sim.policy,
        "jobs": len(sim.jobs),
        "finished": len(outs),
        "requests": sim.requests,
        "hit_ratio": sim.hits / sim.requests if sim.requests else 0.0,
        "storage_tb": sim.storage_bytes / 1e12,
        "ttfs_p50": statistics.median(ttfs) if ttfs else math.nan,
        "ttfs_mean": statistics.fmean(ttfs) if ttfs else math.nan,
        "idle_gpu_h": idle,
        "across_subnets": sum(1 for o in outs if o.spans_subnets),
        "multi_worker_jobs": sum(1 for o in outs if len(o.workers) > 1),
        "numa_split": sum(o.numa_split for o in outs),
        "misses": sum(1 for o in outs if o.job.profile.deadline is not None and o.end >= o.job.profile.deadline),
        "jct_p50_h": statistics.median(jct) / 3600 if jct else math.nan,
        "jct_mean_h": statistics.fmean(jct) / 3600 if jct else math.nan,
        "ttfs": sorted(ttfs),
        "jct": sorted(jct),
        "storage_log": sim.storage_log,
    }


def table(results: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table, one row per policy."""
    head = "| policy | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [f"| {r['policy']} | " + " | ".join(fmt.format(r[key]) for _, key, fmt in COLUMNS) + " |" for r in results]
    return "\n".join([head, rule, *rows])


def goals(results: Sequence[Mapping[str, Any]]) -> str:
    """The issue's goals, each with its measured figure and whether it is met."""
    by = {r["policy"]: r for r in results}
    lines = []
    if {"ours", "fluid"} <= by.keys():
        hit = by["ours"]["hit_ratio"] / by["fluid"]["hit_ratio"] if by["fluid"]["hit_ratio"] else math.inf
        lines.append(_goal("hit ratio >= 1.5x Fluid-style", f"{hit:.2f}x", hit >= 1.5))
        storage = by["ours"]["storage_tb"] / by["fluid"]["storage_tb"] if by["fluid"]["storage_tb"] else math.inf
        lines.append(_goal("storage bytes <= 0.5x Fluid-style", f"{storage:.2f}x", storage <= 0.5))
    if "ours" in by:
        lines.append(
            _goal(
                "zero jobs across subnets",
                f"{by['ours']['across_subnets']} (ours), "
                f"{by.get('ours+time', {}).get('across_subnets', '-')} (ours+time)",
                by["ours"]["across_subnets"] == 0,
            )
        )
    if {"ours", "default"} <= by.keys():
        cut = 1 - by["ours"]["ttfs_mean"] / by["default"]["ttfs_mean"] if by["default"]["ttfs_mean"] else 0.0
        lines.append(_goal("time to first step -40% vs no cache (mean)", f"{-cut:+.0%}", cut >= 0.40))
    timed = [p for p in by if p in DEADLINE_POLICIES]
    others = [r["misses"] for p, r in by.items() if p not in DEADLINE_POLICIES]
    if timed and others:
        # issue 26: misses <= 0.7x the best non-deadline policy, mean JCT <= 1.05x ours
        best = min(timed, key=lambda p: (by[p]["misses"], by[p]["jct_mean_h"]))
        ratio = by[best]["misses"] / min(others) if min(others) else math.inf
        jct = by[best]["jct_mean_h"] / by["ours"]["jct_mean_h"] if "ours" in by else math.nan
        lines.append(
            _goal(
                "deadline misses <= 0.7x the best other policy, mean JCT <= 1.05x ours",
                f"{best}: {by[best]['misses']} vs {min(others)} ({ratio:.2f}x), JCT {jct:.2f}x",
                ratio <= 0.7 and jct <= 1.05,
            )
        )
    return "\n".join(lines)


def _goal(goal: str, figure: str, met: bool) -> str:
    return f"- {goal}: **{figure}** ({'met' if met else 'missed'})"


def plot(results: Sequence[Mapping[str, Any]], out: Path) -> list[Path]:
    """CDFs of time to first step and JCT per policy, and storage bytes over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title, unit, scale in (
        ("ttfs", "Time to first training step", "seconds", 1.0),
        ("jct", "Job completion time", "hours", 3600.0),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for r in results:
            xs = [max(v / scale, 1e-3) for v in r[key]]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=r["policy"])
        ax.set_xscale("log")
        ax.set_xlabel(f"{title.lower()} ({unit}, log scale; 0 drawn at 0.001)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{title}: CDF per policy")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out / f"sim-{key}-cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        log = r["storage_log"]
        ax.plot([t / 86400 for t, _ in log], [b / 1e12 for _, b in log], label=r["policy"])
    ax.set_xlabel("simulated time (days)")
    ax.set_ylabel("bytes read from shared storage (TB, cumulative)")
    ax.set_title("Storage reads over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = out / "sim-storage-bytes.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


__all__ = ["COLUMNS", "goals", "metrics", "plot", "table"]
