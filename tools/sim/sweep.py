"""The cache-pressure sweep: cache per node against the datasets' total size, and a multi-TB mix.

    python tools/sim/sweep.py --out tools/sim/out/sweep --plot docs/assets/sim/sweep/sweep.png  # the published sweep
    python tools/sim/sweep.py --smoke --out /tmp/sweep         # 3 regimes, 20 nodes, 150 jobs (the tests)

Each regime is a workload file (tools/sim/workloads/) with ``cache_bytes_per_node`` set to
``ratio x`` the total size of the datasets that file generates for its seed (one copy of
each, first version): ``sweep-base.json`` at ratios 0.02 .. 1, and ``sweep-multi-tb.json``
(datasets around 1.5 TB, up to 30 TB) at 4 TB per node and at ratio 0.1. Every policy runs
on the same jobs in every regime: no cache, Fluid at its default setting and with passive
caching on (its best for local bytes on the results workloads), the JuiceFS cache group under
packing (its best), the product's policy (:data:`~tools.sim.policies.PRODUCT_POLICY`), and
plain ``ours`` with each of the controller's cluster-side policies (``ours+prepare``: next-job
preparation; ``ours+replicas``: replication, ``spec.replicas: auto``). The goals are the
results pages' (:data:`tools.sim.results.GOALS`): the product's policy against the rivals'
best setting in the regime. Writes ``sweep.json`` (the
workload and run.py's ``--json`` fields per regime and policy), ``sweep.md`` (a table per
regime, a table of what preparation and replication change, and the goals,
each met or missed) and ``sweep.png`` (local-byte fraction and storage bytes against the ratio).
Each simulation's figures are also written to ``OUT/parts/`` as soon as it ends, so that
``--resume`` after an interruption runs only what is missing (a part is named by its
workload, policy and simulator, :func:`tools.sim.model.model_stamp`, so another simulator's
figures are never taken up, and every row of ``sweep.json`` names its simulator under
``model``); the tables and the plot always come from the whole set, and parts another
simulator left are removed. Who calls it: a person and
``tests/tools/test_sim_workload_file.py`` (``--smoke``). Exit codes: 0 done, 2 bad arguments
or workload file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import report  # noqa: E402
from tools.sim.model import model_stamp  # noqa: E402
from tools.sim.policies import POLICIES, PRODUCT_POLICY  # noqa: E402
from tools.sim.results import FLUIDS, GOALS, METRIC, RIVALS, best_setting, goal_cell, goal_ratios  # noqa: E402
from tools.sim.results import goals_table as results_goals_table  # noqa: E402
from tools.sim.run import WORKLOADS, simulate  # noqa: E402
from tools.sim.workload_file import WorkloadError, WorkloadFile, datasets_total_bytes, load  # noqa: E402

RATIOS = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
SMOKE_RATIOS = (0.05, 1.0)
MULTI_TB_NVME = 4 * 10**12
SWEEP_POLICIES = (
    "default", "fluid", "fluid-r4+passive", "juicefs+pack", PRODUCT_POLICY, "ours", "ours+prepare", "ours+replicas",
)  # fmt: skip


def regimes(base: WorkloadFile, multi: WorkloadFile, smoke: bool) -> list[tuple[str, WorkloadFile, float]]:
    """(name, workload, cache/total) of every regime."""
    if smoke:
        base = _shrink(base)
        multi = _shrink(multi)
    out = []
    total = datasets_total_bytes(base)
    for r in SMOKE_RATIOS if smoke else RATIOS:
        out.append((f"base, cache/total {r:g}", base.with_cache(int(r * total)), r))
    total_m = datasets_total_bytes(multi)
    out.append(("multi-TB, 4 TB per node", multi.with_cache(MULTI_TB_NVME), MULTI_TB_NVME / total_m))
    if not smoke:
        out.append(("multi-TB, cache/total 0.1", multi.with_cache(int(0.1 * total_m)), 0.1))
    return out


def _shrink(wf: WorkloadFile) -> WorkloadFile:
    """The smoke size: 20 nodes (the same mix), 150 jobs, a tenth of the datasets."""
    total = sum(g.count for g in wf.nodes)
    nodes = [g.model_copy(update={"count": max(1, round(20 * g.count / total))}) for g in wf.nodes]
    datasets = wf.datasets.model_copy(update={"count": max(5, wf.datasets.count // 10)})
    jobs = wf.jobs.model_copy(update={"count": 150})
    return wf.model_copy(update={"nodes": nodes, "datasets": datasets, "jobs": jobs})


def goals(by: dict[str, dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """Goals for one regime: (goal, figure, met). The results pages' goals
    (:data:`tools.sim.results.GOALS`: the product's policy over the best rival setting run
    here, a goal left out where none of its rivals ran), and next-job preparation's cut of
    the queued jobs' time to first step against plain ``ours``."""
    out: list[tuple[str, str, bool]] = []
    for _, mine, cells in goal_ratios({"regime": {"policies": by}}):
        for goal, (value, best, met) in zip(GOALS, cells, strict=True):
            if goal[2] is None or best:
                out.append((goal[0], goal_cell(by, mine, goal, value, best), met))
    ours, prep = by.get("ours"), by.get("ours+prepare")
    if ours is not None and prep is not None and ours["queued_ttfs_mean_s"]:
        cut = 1 - prep["queued_ttfs_mean_s"] / ours["queued_ttfs_mean_s"]
        out.append(("queued TTFS -50% with preparation", f"{-cut:+.0%}", cut >= 0.5))
    return out


COLS = (
    ("local bytes", "local_fraction", "{:.1%}"),
    ("hit ratio", "hit_ratio", "{:.1%}"),
    ("storage TB", "storage_bytes", "tb"),
    ("peer TB", "peer_bytes", "tb"),
    ("TTFS mean s", "ttfs_mean_s", "{:.0f}"),
    ("queued TTFS mean s", "queued_ttfs_mean_s", "{:.0f}"),
    ("queued data wait s", "queued_data_wait_mean_s", "{:.0f}"),
    ("storage first / not kept TB", ("storage_first_bytes", "storage_uncached_bytes"), "tb2"),
    (
        "task fetched / used TB",
        ("prepare_fetch_bytes", "prepare_used_bytes", "replica_fetch_bytes", "replica_used_bytes"),
        "task",
    ),
    ("GPU-h idle for data", "gpu_hours_idle_for_data", "{:.0f}"),
    ("JCT mean h", "jct_mean_s", "h"),
    ("deadline misses", "deadline_misses", "{:d}"),
)


def _cell(fmt: str, v: Any) -> str:
    if fmt == "tb2":
        return f"{v[0] / 1e12:.1f} / {v[1] / 1e12:.1f}"
    if fmt == "task":
        fetched, used = v[0] + v[2], v[1] + v[3]
        return f"{fetched / 1e12:.1f} / {used / 1e12:.1f}" if fetched else "-"
    if fmt == "tb":
        return f"{v / 1e12:.1f}"
    if fmt == "h":
        return f"{v / 3600:.2f}"
    return fmt.format(v)


def _get(f: dict[str, Any], key: str | tuple[str, ...]) -> Any:
    return tuple(f.get(k, 0) for k in key) if isinstance(key, tuple) else f[key]


def effects(rows: list[dict[str, Any]]) -> str:
    """One line per regime: what next-job preparation and replication change against plain ours."""
    lines = [
        "| regime | queued TTFS s ours / +prepare | change | queued data wait s ours / +prepare | change "
        "| prepared TB fetched / used | +replicas: hits | +replicas: storage TB | replica TB fetched / used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def change(new: float, old: float) -> str:
        return f"{new / old - 1:+.0%}" if old else "-"

    for row in rows:
        by = row["policies"]
        o, p, r = by.get("ours"), by.get("ours+prepare"), by.get("ours+replicas")
        if o is None or (p is None and r is None):
            continue
        cells = [row["regime"]]
        if p is not None:
            cells += [
                f"{o['queued_ttfs_mean_s']:.0f} / {p['queued_ttfs_mean_s']:.0f}",
                change(p["queued_ttfs_mean_s"], o["queued_ttfs_mean_s"]),
                f"{o['queued_data_wait_mean_s']:.0f} / {p['queued_data_wait_mean_s']:.0f}",
                change(p["queued_data_wait_mean_s"], o["queued_data_wait_mean_s"]),
                f"{p['prepare_fetch_bytes'] / 1e12:.1f} / {p['prepare_used_bytes'] / 1e12:.1f}",
            ]
        else:
            cells += ["-"] * 5
        if r is not None:
            cells += [
                f"{o['hit_ratio']:.1%} -> {r['hit_ratio']:.1%}",
                f"{o['storage_bytes'] / 1e12:.1f} -> {r['storage_bytes'] / 1e12:.1f}",
                f"{r['replica_fetch_bytes'] / 1e12:.1f} / {r['replica_used_bytes'] / 1e12:.1f}",
            ]
        else:
            cells += ["-"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _best_cell(pool: dict[str, dict[str, Any]], measure: str, shown: Callable[[float], str]) -> str:
    """The best figure of ``measure`` (:data:`tools.sim.results.METRICS`, which says which way
    is better) among the settings in ``pool``, as ``shown`` writes it, and the setting's name."""
    metric = METRIC[measure]
    name = best_setting(pool, tuple(pool), metric)
    return f"{shown(metric[2](pool[name]))} ({name})"


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per regime: the product's policy beside the rivals' best settings, in figures
    (the ratios and goals are :func:`goals_table`'s)."""
    lines = [
        "| regime | cache/total | local bytes: product / best Fluid | store TB: product / lowest rival / no cache "
        "| TTFS mean s: product / quickest rival | GPU-h idle: product / lowest rival |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        by = row["policies"]
        mine, rivals = by.get(PRODUCT_POLICY), {p: f for p, f in by.items() if p in RIVALS}
        if mine is None or not rivals:
            continue
        fluids = {p: f for p, f in rivals.items() if p in FLUIDS}
        fluid = _best_cell(fluids, "local-byte fraction", "{:.1%}".format) if fluids else "-"
        none = f"{by['default']['storage_bytes'] / 1e12:.1f}" if "default" in by else "-"
        store = _best_cell(rivals, "store bytes", lambda v: f"{v / 1e12:.1f}")
        ttfs = _best_cell(rivals, "mean time to first step", "{:.0f}".format)
        idle = _best_cell(rivals, "GPU-hours idle for data", "{:.0f}".format)
        lines.append(
            f"| {row['regime']} | {row['ratio']:.3g} "
            f"| {mine['local_fraction']:.1%} / {fluid} "
            f"| {mine['storage_bytes'] / 1e12:.1f} / {store} / {none} "
            f"| {mine['ttfs_mean_s']:.0f} / {ttfs} | {mine['gpu_hours_idle_for_data']:.0f} / {idle} |"
        )
    return "\n".join(lines)


def goals_table(rows: list[dict[str, Any]]) -> str:
    """The results pages' goals table (:func:`tools.sim.results.goals_table`), a regime a line."""
    return "\n".join(results_goals_table({row["regime"]: row for row in rows})).replace("| workload |", "| regime |", 1)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"The product's policy: `{PRODUCT_POLICY}`.",
        "",
        summary(rows),
        "",
        goals_table(rows),
        "",
        effects(rows),
        "",
    ]
    for row in rows:
        lines.append(
            f"**{row['regime']}** (cache per node {row['cache_bytes_per_node'] / 1e12:.2f} TB, "
            f"datasets {row['datasets_total_bytes'] / 1e12:.1f} TB, ratio {row['ratio']:.3g})\n"
        )
        lines.append("| policy | " + " | ".join(c for c, _, _ in COLS) + " |")
        lines.append("|---|" + "---:|" * len(COLS))
        for policy, f in row["policies"].items():
            lines.append(f"| {policy} | " + " | ".join(_cell(fmt, _get(f, key)) for _, key, fmt in COLS) + " |")
        for goal, figure, met in row["goals"]:
            lines.append(f"\n- {goal}: **{figure}** ({'met' if met else 'missed'})")
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [r for r in rows if r["regime"].startswith("base")]
    multi = [r for r in rows if r["regime"].startswith("multi")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, policy in enumerate(rows[0]["policies"]):
        color = f"C{i}"
        xs = [r["ratio"] for r in base]
        left.plot(xs, [r["policies"][policy]["local_fraction"] for r in base], "o-", color=color, label=policy)
        right.plot(xs, [r["policies"][policy]["storage_bytes"] / 1e12 for r in base], "o-", color=color, label=policy)
        mx = [r["ratio"] for r in multi]
        left.plot(mx, [r["policies"][policy]["local_fraction"] for r in multi], "s", color=color, mfc="none")
        right.plot(mx, [r["policies"][policy]["storage_bytes"] / 1e12 for r in multi], "s", color=color, mfc="none")
    for ax, label in ((left, "local-byte fraction"), (right, "storage TB read")):
        ax.set_xscale("log")
        ax.set_xlabel("cache per node / datasets' total size (log)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    right.set_yscale("log")
    left.legend(title="lines: base; squares: multi-TB", fontsize=8, loc="center right")
    fig.suptitle("Cache pressure sweep (tools/sim/sweep.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _part_path(parts: Path, wf: WorkloadFile, policy: str, model: str) -> Path:
    """Where one simulation's figures go: named by the workload, the policy and the simulator
    that ran it (:func:`tools.sim.model.model_stamp`), so a part another simulator left is
    never taken up."""
    key = json.dumps({"workload": wf.model_dump(mode="json"), "policy": policy, "model": model}, sort_keys=True)
    return parts / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _save_part(parts: Path, wf: WorkloadFile, policy: str, model: str, figures: dict[str, Any]) -> dict[str, Any]:
    """One finished simulation's figures, written as soon as it ends (stage and rename)."""
    path = _part_path(parts, wf, policy, model)
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps({"policy": policy, "model": model, "figures": figures}) + "\n")
    staged.replace(path)
    return figures


def _load_part(parts: Path, wf: WorkloadFile, policy: str, model: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(_part_path(parts, wf, policy, model).read_text())
    except (OSError, ValueError):
        return None
    ours = isinstance(doc, dict) and doc.get("policy") == policy and doc.get("model") == model
    figures = doc.get("figures") if ours else None
    return figures if isinstance(figures, dict) else None


def _prune_parts(parts: Path, model: str) -> None:
    """Drop the parts another simulator than ``model`` left (or that do not read)."""
    for path in parts.glob("*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict) or doc.get("model") != model:
            path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for sweep.json, sweep.md, sweep.png")
    parser.add_argument(
        "--plot", type=Path, help="where sweep.png goes instead (the published one: docs/assets/sim/sweep/sweep.png)"
    )
    parser.add_argument("--base", type=Path, default=WORKLOADS / "sweep-base.json")
    parser.add_argument("--multi-tb", type=Path, default=WORKLOADS / "sweep-multi-tb.json")
    parser.add_argument("--policies", default=",".join(SWEEP_POLICIES))
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="20 nodes, 150 jobs per regime")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the figures an interrupted run of the same code left in OUT/parts/ (same workload and policy)",
    )
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        parser.error(f"policies from {', '.join(POLICIES)}")
    try:
        todo = regimes(load(args.base), load(args.multi_tb), args.smoke)
    except WorkloadError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    # policy by policy over the regimes: the baselines and ours are done first
    tasks = [(i, p) for p in policies for i in range(len(todo))]
    model = model_stamp()
    parts = args.out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[int, str], dict[str, Any]] = {}
    if args.resume:
        for i, p in tasks:
            kept = _load_part(parts, todo[i][1], p, model)
            if kept is not None:
                results[(i, p)] = kept
    todo_tasks = [t for t in tasks if t not in results]
    if args.procs > 1 and len(todo_tasks) > 1:
        with ProcessPoolExecutor(max_workers=args.procs) as pool:
            futures = {pool.submit(simulate, t[1], todo[t[0]][1]): t for t in todo_tasks}
            for future in as_completed(futures):
                t = futures[future]
                results[t] = _save_part(parts, todo[t[0]][1], t[1], model, report.fields(future.result()))
    else:
        for t in todo_tasks:
            results[t] = _save_part(parts, todo[t[0]][1], t[1], model, report.fields(simulate(t[1], todo[t[0]][1])))
    rows = []
    for i, (name, wf, ratio) in enumerate(todo):
        by = {p: results[(i, p)] for p in policies}
        rows.append(
            {
                "regime": name,
                "model": model,
                "ratio": ratio,
                "cache_bytes_per_node": wf.cache_bytes_per_node,
                "datasets_total_bytes": datasets_total_bytes(wf),
                "workload": wf.model_dump(mode="json"),
                "policies": by,
                "goals": goals(by),
            }
        )
    _prune_parts(parts, model)
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows)
    (args.out / "sweep.md").write_text(text + "\n")
    print(text)
    print(f"{len(todo)} regimes x {len(policies)} policies in {time.perf_counter() - started:.0f} s")
    if not args.no_plot:
        picture = args.plot if args.plot is not None else args.out / "sweep.png"
        picture.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, picture)
        print(f"wrote {picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
