"""The cluster results page: every policy on several workloads, and only the claims that hold on all.

    python tools/sim/results.py                     # run what is missing, then write the page (tens of minutes)
    python tools/sim/results.py --render-only       # the page from the JSON already in --out
    python tools/sim/results.py --seeds 2,3,4,5,6   # also the goals on other seeds of each workload

Runs ``run.py``'s simulation of :data:`POLICIES` on each workload of :data:`WORKLOADS`
(``tools/sim/workloads/results-*.json``, shapes the presets have and ones they do not),
writing one JSON per workload into ``--out`` (the same document as ``run.py --json``:
the workload, the rates with their sources, what caps changed in the input, every
policy's figures). Then writes ``--doc`` (``docs/results-cluster.md``) and the table
against Fluid into ``--readme``'s block between :data:`BEGIN` and :data:`END` from those JSON
files alone: per workload a table of the figures with each baseline's model and rates
beside it, then the claims, each stated only if it holds on every workload (at least
three), the workloads where ours loses named, and a policy that is best on one workload
only labelled experimental. With ``--seeds``, each workload runs again at those seeds
(other jobs and datasets drawn from the same shape: workloads the presets were never
tuned on) with the Fluid settings and ``ours+stripe+early``, into ``--out``/seeds/, and the
page gets the goal ratios of every such run, misses in bold. Who calls it: a person, and the simulator's tests
(:func:`render` on small documents). Exit codes: 0 done, 2 bad arguments or workload file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.sim import report  # noqa: E402
from tools.sim.policies import PRODUCT_POLICY  # noqa: E402
from tools.sim.run import WORKLOADS as WORKLOAD_DIR  # noqa: E402
from tools.sim.run import rate_table, run_all  # noqa: E402
from tools.sim.workload_file import WorkloadError, WorkloadFile, load  # noqa: E402

WORKLOADS = ("results-base", "results-multi-tb", "results-churn", "results-tight")
#: the seeds and workloads claims are measured on, recorded before they were run, and the
#: seeds choices were made on (tools/sim/holdout.json)
HOLDOUT = json.loads((Path(__file__).resolve().parent / "holdout.json").read_text())
CLAIM_SEEDS: tuple[int, ...] = tuple(HOLDOUT["claims"]["seeds"])
CLAIM_WORKLOADS: tuple[str, ...] = tuple(HOLDOUT["claims"]["workloads"])
TUNING_SEEDS: tuple[int, ...] = tuple(HOLDOUT["tuning"]["seeds"])
POLICIES = (
    "default",
    "fluid-r1",
    "fluid-r4",
    "fluid",
    "fluid-excl",
    "fluid-r4+pack",
    "fluid-r4+passive",
    "fluid-job",
    "juicefs",
    "juicefs+pack",
    "ours",
    "ours+prepare",
    "ours+replicas",
    "ours+stripe",
    "ours+stripe+early",
)
FLUIDS = ("fluid-r1", "fluid-r4", "fluid", "fluid-excl", "fluid-r4+pack", "fluid-r4+passive", "fluid-job")
JUICEFS = ("juicefs", "juicefs+pack")
RIVALS = (*FLUIDS, *JUICEFS)  # every setting of the systems platform teams install instead
BASELINES = ("default", *RIVALS)
#: the README's block of the simulator's figures against Fluid (:func:`with_goals`)
BEGIN, END = "<!-- cluster:begin -->", "<!-- cluster:end -->"
OURS = tuple(p for p in POLICIES if p not in BASELINES)
MODELS = {
    "default": "no cache: every epoch read from the store as the pod trains (first step at once)",
    "fluid-r1": "Fluid, AlluxioRuntime replicas 1, quota = size (at most the node's cache), Shared placement; "
    "local-first blocks, FUSE, first step at once",
    "fluid-r4": "Fluid, replicas 4, quota = size / 4, Shared placement; local-first blocks, FUSE, first step at once",
    "fluid": "Fluid, replicas = enough to hold the dataset (ceil(size / node cache)), Shared placement; FUSE",
    "fluid-excl": "as fluid, placement Exclusive (one runtime's worker per node)",
    "fluid-r4+pack": "as fluid-r4, under a kube-scheduler that packs GPU pods (NodeResourcesFit MostAllocated, as "
    "the chart configures ours) instead of spreading them",
    "fluid-r4+passive": "as fluid-r4, with Alluxio's passive caching on (its own default; Fluid turns it off): a "
    "block read from another worker is also cached on the reader's node's worker, each worker's quota the dataset",
    "fluid-job": "Fluid with a worker on every node of the job that first reads the dataset (replicas and node "
    "affinity set to the job's nodes), passive caching on",
    "juicefs": "JuiceFS cache group over every node: 4 MiB blocks on a hash ring, each miss filled once; FUSE; "
    "kube-scheduler's spreading, no data affinity",
    "juicefs+pack": "as juicefs, under a kube-scheduler that packs GPU pods as the chart configures ours",
    "ours": "the agent's whole copy on the node (P2P first, unpack rate), first step when it is ready, every "
    "epoch from local disk; a version with no room: the store every epoch; placed by the extender's score "
    "(weight 2) plus kube-scheduler's MostAllocated packing, as the chart configures the scheduler",
    "ours+prepare": "ours with next-job preparation",
    "ours+replicas": "ours with replication (spec.replicas: auto)",
    "ours+stripe": "ours, each version held as the product decides (dsagent.policy.holding): whole on each node "
    "it fits, else shares over the job's nodes first, filled as read, read rank-affine",
    "ours+stripe+early": "ours+stripe, training starts at once, reading through the window until the local copy "
    "is whole: what the product runs for a Dataset with spec.stripe: auto and spec.startBeforeWhole (the "
    "product policy, reported as ours)",
}

# (name, higher is better, figure)
Metric = tuple[str, bool, Callable[[Mapping[str, Any]], float]]
METRICS: tuple[Metric, ...] = (
    ("local-byte fraction", True, lambda f: f["local_fraction"]),
    ("store bytes", False, lambda f: f["storage_bytes"]),
    ("mean time to first step", False, lambda f: f["ttfs_mean_s"]),
    ("GPU-hours idle for data", False, lambda f: f["gpu_hours_idle_for_data"]),
    ("deadline misses", False, lambda f: f["deadline_misses"]),
    ("mean job time", False, lambda f: f["jct_mean_s"]),
)
METRIC = {m[0]: m for m in METRICS}  # by name


def run_missing(out: Path, names: tuple[str, ...], procs: int) -> None:
    for name in names:
        path = out / f"{name}.json"
        if path.exists():
            continue
        wf = load(WORKLOAD_DIR / f"{name}.json")
        started = time.perf_counter()
        results = run_all(wf, list(POLICIES), procs)
        doc = {
            "workload": wf.model_dump(mode="json"),
            **rate_table(wf),
            "input_changes": results[0]["input_changes"] if results else [],
            "seconds": time.perf_counter() - started,
            "policies": {r["policy"]: report.fields(r) for r in results},
        }
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(doc, indent=1) + "\n")
        staged.replace(path)


#: what the held-out runs compare: every rival setting and the policy the product runs
SEED_POLICIES = (*RIVALS, PRODUCT_POLICY)


def run_seeds(
    out: Path, names: tuple[str, ...], seeds: tuple[int, ...], procs: int, *, run: bool = True
) -> dict[str, Any]:
    """Each workload at each of ``seeds`` (:data:`SEED_POLICIES`; runs already in ``out`` are
    kept, and with ``run`` False the missing ones are left out, not run); the documents by
    ``<workload> seed <n>``."""
    docs = {}
    for name in names:
        wf = load(WORKLOAD_DIR / f"{name}.json")
        for seed in seeds:
            path = out / f"{name}-seed{seed}.json"
            if not path.exists() and not run:
                continue
            if not path.exists():
                seeded = WorkloadFile.model_validate({**wf.model_dump(), "seed": seed})
                results = run_all(seeded, list(SEED_POLICIES), procs)
                staged = path.with_suffix(".tmp")
                doc = {"product_policy": PRODUCT_POLICY, "seed": seed, "workload_file": name}
                doc["policies"] = {r["policy"]: report.fields(r) for r in results}
                staged.write_text(json.dumps(doc) + "\n")
                staged.replace(path)
            docs[f"{name} seed {seed}"] = json.loads(path.read_text())
    return docs


def seeds_section(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The goals on the held-out runs (:func:`run_seeds` at :data:`CLAIM_SEEDS`), with how
    many meet each goal: the only runs the README's claims come from."""
    return [
        "## The claims: held-out seeds",
        "",
        "The workload files at the seeds recorded in `tools/sim/holdout.json` before they were run "
        f"({seeds_summary(docs)}",
        "",
        *goals_table(docs),
        "",
    ]


def seeds_summary(docs: Mapping[str, Mapping[str, Any]]) -> str:
    """How many of the held-out runs meet each goal, in one sentence (after an opening
    parenthesis: the page and the README's block both start it)."""
    runs = goal_ratios(docs)
    met = ", ".join(f"{label} {sum(1 for _, _, cells in runs if cells[i][2])}" for i, (label, *_) in enumerate(GOALS))
    return (
        f"{len(runs)} runs): other jobs, datasets and versions drawn from the same shapes, on which no default or "
        f"policy constant was chosen. `{PRODUCT_POLICY}` (the product's policy) meets each goal on this many of "
        f"them: {met}."
    )


def best_setting(by: Mapping[str, Mapping[str, Any]], policies: tuple[str, ...], metric: Metric) -> str:
    """The setting among ``policies`` (those that ran, in ``by``) best on ``metric``."""
    _, higher, get = metric
    present = [p for p in policies if p in by]
    return (max if higher else min)(present, key=lambda p: get(by[p]))


def _strictly_best(by: Mapping[str, Mapping[str, Any]], metric: Metric) -> str | None:
    """The one policy better than every other on the measure (None on a tie)."""
    _, higher, get = metric
    values = sorted(((get(f), p) for p, f in by.items()), reverse=higher)
    if len(values) > 1 and values[0][0] == values[1][0]:
        return None
    return values[0][1] if values else None


def _ratio(ours: float, theirs: float) -> float:
    """ours / theirs; two zeros (both start at once) are equal, and so are two figures
    that differ only in the order floating-point sums were taken in."""
    if not theirs:
        return 1.0 if not ours else float("inf")
    ratio = ours / theirs
    return 1.0 if math.isclose(ratio, 1.0, rel_tol=1e-9) else ratio


def _better(a: float, b: float, higher: bool) -> bool:
    return a >= b if higher else a <= b


def claims(docs: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """(claims that hold on every workload, claims that do not -- naming where ours loses --,
    policies best on exactly one workload: experimental)."""
    holds, fails = [], []
    for mine in (PRODUCT_POLICY,):
        for metric in METRICS:
            name, higher, get = metric
            lost = []
            for wname, doc in docs.items():
                by = doc["policies"]
                if mine not in by:
                    continue
                best = best_setting(by, tuple(p for p in BASELINES if p in by), metric)
                if not _better(get(by[mine]), get(by[best]), higher):
                    lost.append(f"{wname} ({mine} {_fmt(name, get(by[mine]))}, {best} {_fmt(name, get(by[best]))})")
            line = f"`{mine}`: {name} at least as good as the best baseline's"
            if lost:
                fails.append(f"{line}: **not on** " + "; ".join(lost))
            elif len(docs) >= 3:
                holds.append(f"{line}, on all {len(docs)} workloads")
    experimental = []
    for policy in OURS:
        wins = [
            w
            for w, doc in docs.items()
            if policy in doc["policies"] and any(_strictly_best(doc["policies"], m) == policy for m in METRICS)
        ]
        if len(wins) == 1:
            experimental.append(f"{policy} (alone best on a measure only on {wins[0]})")
    return holds, fails, experimental


def goals(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per workload, the product's policy against the rivals' best setting on each measure
    (:data:`GOALS`)."""
    return [
        "## Against the rivals' best setting (tuning seed)",
        "",
        "Each ratio is ours over the rival setting best on that measure on that workload: the local-byte fraction "
        "against the Fluid settings (" + ", ".join(f"`{p}`" for p in FLUIDS) + "), the others against every "
        "Fluid and JuiceFS setting. A ratio that misses its target is in bold. These runs are at the workload "
        "files' own seeds, on which defaults were chosen: the claims are on "
        "[held-out seeds](#the-claims-held-out-seeds). "
        f"`{PRODUCT_POLICY}` is what the product runs (a Dataset with `spec.stripe: auto` and "
        "`spec.startBeforeWhole`).",
        "",
        *goals_table(docs),
        "",
    ]


def _avoidable(f: Mapping[str, Any]) -> float:
    return float(f.get("jobs_across_subnets_avoidable", 0))


#: each goal: its label, the measure, the rivals it is compared with (None: an absolute
#: figure), and whether ours' ratio (or figure) meets it
GOALS: tuple[tuple[str, str, tuple[str, ...] | None, Callable[[float], bool]], ...] = (
    ("local bytes >= 1.5x best Fluid", "local-byte fraction", FLUIDS, lambda r: r >= 1.5),
    ("store bytes <= 1.0x", "store bytes", RIVALS, lambda r: r <= 1.0),
    ("TTFS <= 1.0x", "mean time to first step", RIVALS, lambda r: r <= 1.0),
    ("GPU-h idle <= 1.0x", "GPU-hours idle for data", RIVALS, lambda r: r <= 1.0),
    ("JCT <= 1.0x", "mean job time", RIVALS, lambda r: r <= 1.0),
    ("avoidable split jobs = 0", "avoidable jobs across subnets", None, lambda v: v == 0),
)


def goal_ratios(docs: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, list[tuple[float, str, bool]]]]:
    """Per workload: per goal of :data:`GOALS`, the product policy's ratio over the best rival
    setting on that measure (or its own figure), that setting, and whether the goal is met
    (NaN and no setting where none of the goal's rivals ran)."""
    out = []
    for wname, doc in docs.items():
        by = doc["policies"]
        mine = PRODUCT_POLICY
        if mine not in by or not any(p in by for p in RIVALS):
            continue
        cells = []
        for _, name, rivals, met in GOALS:
            if rivals is None:
                value = _avoidable(by[mine])
                cells.append((value, "", met(value)))
                continue
            metric = METRIC[name]
            if not any(p in by for p in rivals):  # none of this goal's rivals ran (the sweep's subsets)
                cells.append((math.nan, "", True))
                continue
            best = best_setting(by, rivals, metric)
            ratio = _ratio(metric[2](by[mine]), metric[2](by[best]))
            cells.append((ratio, best, met(ratio)))
        out.append((wname, mine, cells))
    return out


def goals_table(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The table of :func:`goals` (also the README's block between :data:`BEGIN` and :data:`END`)."""
    lines = [
        "| workload | " + " | ".join(label for label, *_ in GOALS) + " |",
        "|---|" + "---:|" * len(GOALS),
    ]
    for wname, mine, cells in goal_ratios(docs):
        shown = []
        for goal, (ratio, best, met) in zip(GOALS, cells, strict=True):
            cell = goal_cell(docs[wname]["policies"], mine, goal, ratio, best)
            shown.append(cell if met else f"**{cell}**")
        lines.append(f"| {wname} | " + " | ".join(shown) + " |")
    return lines


def goal_cell(
    by: Mapping[str, Mapping[str, Any]],
    mine: str,
    goal: tuple[str, str, tuple[str, ...] | None, Callable[[float], bool]],
    ratio: float,
    best: str,
) -> str:
    """One cell of :func:`goal_ratios` as the pages show it: the figure of an absolute goal,
    ``-`` where none of the goal's rivals ran, the two figures where one side is zero, else
    the ratio and the rival setting."""
    _, name, rivals, _ = goal
    if rivals is None:
        return f"{ratio:.0f}"
    if not best:
        return "-"
    if ratio == 0 or math.isinf(ratio):  # one side is zero: a ratio says nothing, the figures do
        get = METRIC[name][2]
        return f"{_fmt(name, get(by[mine]))} against {_fmt(name, get(by[best]))} ({best})"
    digits = 4 if f"{ratio:.2f}" == "1.00" and ratio != 1.0 else 2  # near 1.0x: which side of the target
    return f"{ratio:.{digits}f}x ({best})"


def with_goals(readme: str, seeded: Mapping[str, Mapping[str, Any]]) -> str:
    """``readme`` with its block between the markers replaced by :func:`goals_table` of the
    held-out runs (:func:`run_seeds` at :data:`CLAIM_SEEDS`) and how many meet each goal
    (unchanged if it has no block, or there are no held-out runs)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start or not seeded:
        return readme
    lines = [BEGIN, *goals_table(seeded), "", f"Held-out seeds ({seeds_summary(seeded)}", END]
    return readme[:start] + "\n".join(lines) + readme[end + len(END) :]


def _fmt(metric: str, v: float) -> str:
    if metric == "local-byte fraction":
        return f"{v:.1%}"
    if metric == "store bytes":
        return f"{v / 1e12:.1f} TB"
    if metric in ("mean time to first step",):
        return f"{v:.0f} s"
    if metric == "mean job time":
        return f"{v / 3600:.2f} h"
    return f"{v:.0f}"


COLS: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("local bytes", lambda f: f"{f['local_fraction']:.1%}"),
    (
        "local, 1st / later epochs",
        lambda f: f"{f['local_fraction_first_epoch']:.0%} / {f['local_fraction_later_epochs']:.0%}",
    ),
    ("store TB", lambda f: f"{f['storage_bytes'] / 1e12:.1f}"),
    ("inter-node TB", lambda f: f"{f['inter_node_bytes'] / 1e12:.1f}"),
    ("TTFS mean s", lambda f: f"{f['ttfs_mean_s']:.0f}"),
    ("GPU-h idle for data", lambda f: f"{f['gpu_hours_idle_for_data']:.0f}"),
    ("JCT mean h", lambda f: f"{f['jct_mean_s'] / 3600:.2f}"),
    ("deadline misses", lambda f: f"{f['deadline_misses']}"),
)


def sensitivity(doc: Mapping[str, Any]) -> list[str]:
    """The sweep of the deciding rates and the job mix (tools/sim/sensitivity.py) as a table:
    ours, ours+stripe and the product policy against the best rival at each point."""
    keys = doc["keys"]
    mixed = len(keys) > 2
    cores = len(keys) > 3
    lines = [
        "## Sensitivity: store read per node x remote-cache read x language jobs' share"
        + (" x our fetch rate" if cores else ""),
        "",
        f"`tools/sim/sensitivity.py` on `results-base` at {sum(g['count'] for g in doc['workload']['nodes'])} nodes "
        f"and {doc['workload']['jobs']['count']} jobs; the rivals are "
        + ", ".join(p for p in doc["points"][0]["policies"] if p not in OURS)
        + ". Ratios are ours / the best rival on that measure (local bytes: higher is better; the others: lower).",
        "",
        f"| {keys[0]} | {keys[1]} | "
        + (f"{keys[2]} | " if mixed else "")
        + (f"{keys[3]} | " if cores else "")
        + "policy | local bytes | store bytes | TTFS mean | GPU-h idle | JCT mean |",
        "|---:|---:|" + ("---:|" if mixed else "") + ("---:|" if cores else "") + "---|---:|---:|---:|---:|---:|",
    ]
    for point in doc["points"]:
        by = point["policies"]
        base = tuple(p for p in by if p not in OURS)
        for mine in (p for p in ("ours", "ours+stripe", PRODUCT_POLICY) if p in by):
            cells = []
            for name in (
                "local-byte fraction",
                "store bytes",
                "mean time to first step",
                "GPU-hours idle for data",
                "mean job time",
            ):
                metric = METRIC[name]
                best = best_setting(by, base, metric)
                theirs, ours = metric[2](by[best]), metric[2](by[mine])
                cells.append(f"{ours / theirs:.2f}x" if theirs else "-")
            share = f"{point['rates'][keys[2]]:.0%} | " if mixed else ""
            share += f"{point['rates'][keys[3]] / 1e9:.2f} GB/s | " if cores else ""
            store, serve = point["rates"][keys[0]] / 1e9, point["rates"][keys[1]] / 1e9
            lines.append(f"| {store:.2f} GB/s | {serve:.2f} GB/s | {share}{mine} | " + " | ".join(cells) + " |")
    return [*lines, ""]


CAUSES = (
    ("first_fill", "first fill"),
    ("refetch", "fetched again"),
    ("lost_member", "lost member"),
    ("uncached", "not kept"),
)


def causes(doc: Mapping[str, Any]) -> list[str]:
    """The store bytes of each policy by cause (``storage_bytes_by_cause``), in TB; none for
    a document written before the simulator counted them."""
    by = {p: f["storage_bytes_by_cause"] for p, f in doc["policies"].items() if "storage_bytes_by_cause" in f}
    if not by:
        return []
    return [
        "Store bytes by cause (TB): the first read of a version's bytes kept in a cache; bytes the cluster "
        "had read and kept before, read again (evicted, or another copy from the store); a lost stripe "
        "member's bundles no node could take; reads nobody keeps (no cache, no room).",
        "",
        "| policy | " + " | ".join(label for _, label in CAUSES) + " |",
        "|---|" + "---:|" * len(CAUSES),
        *(f"| {p} | " + " | ".join(f"{c.get(k, 0.0) / 1e12:.2f}" for k, _ in CAUSES) + " |" for p, c in by.items()),
        "",
    ]


def render(
    docs: Mapping[str, Mapping[str, Any]],
    sweep: Mapping[str, Any] | None = None,
    seeded: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The page, from the run documents alone (workload name -> run.py --json document):
    the claims from the held-out runs (``seeded``) where there are any, else from ``docs``."""
    holds, fails, _ = claims(seeded or docs)
    _, _, experimental = claims(docs)
    lines = [
        "# Cluster results: ours against Fluid, JuiceFS and no cache",
        "",
        f"Generated by `python tools/sim/results.py --workloads {','.join(docs)}` from the JSON it writes to",
        "`tools/sim/out/results/`;",
        "do not edit by hand. The model, every rate's source and what is not modelled: [simulator.md](simulator.md).",
        "",
        "Every figure counts bytes by where a pod read them: its own node's disk (local), another node's",
        "cache (inter-node) or the store, over all the epochs a job makes in its run time (derived from",
        "its run time, GPUs and a per-GPU read rate). The no-cache baseline's store bytes are therefore",
        "every epoch of every job. Fluid and JuiceFS start training at once and read through FUSE; ours",
        "waits for its copy (`+early`: for its first bundles) and then reads local files.",
        "",
        "## What holds on every held-out run" if seeded else "## What holds on every workload",
        "",
        *([f"- {c}" for c in holds] or ["- nothing ours claims holds on every workload"]),
        "",
        "## Where ours does not win",
        "",
        *([f"- {c}" for c in fails] or ["- none"]),
        "",
        "## Experimental",
        "",
        "A policy of ours that is alone best on some measure on one workload only is experimental, not a",
        "recommendation:",
        "",
        *([f"- {c}" for c in experimental] or ["- none"]),
        "",
        *(seeds_section(seeded) if seeded else []),
        *goals(docs),
        "## The baselines as modelled",
        "",
        *[f"- `{p}`: {MODELS[p]}" for p in POLICIES],
        "",
    ]
    for name, doc in docs.items():
        wl = doc["workload"]
        nodes = sum(g["count"] for g in wl["nodes"])
        lines += [
            f"## Workload `{name}`",
            "",
            f"{nodes} nodes ({', '.join(str(g['count']) + ' ' + g['type'] for g in wl['nodes'])}), "
            f"{wl['cache_bytes_per_node'] / 1e12:g} TB cache per node, {wl['jobs']['count']} jobs at load "
            f"{wl['jobs']['load']}, {wl['datasets']['count']} datasets (median "
            f"{wl['datasets']['size_median_bytes'] / 1e9:g} GB, sigma {wl['datasets']['size_sigma']:g}, "
            f"Zipf {wl['datasets']['zipf_s']:g}, a new version every {wl['datasets']['new_version_mean_days']:g} days "
            f"on average); workload file `tools/sim/workloads/{name}.json`; {doc.get('seconds', 0):.0f} s to run.",
            "",
            "Rates: "
            + "; ".join(
                f"{r['key']} {r['value']:.3g}{'' if r['default'] else ' (set by the workload)'}" for r in doc["rates"]
            )
            + "; NIC "
            + ", ".join(f"{n['type']} {n['value'] / 1e9:g} GB/s" for n in doc["nic_bytes_per_s"])
            + f"; store aggregate {doc['storage_bytes_per_s']['value'] / 1e9:g} GB/s.",
            "",
        ]
        if doc.get("input_changes"):
            lines += ["Input changed by the workload's caps: " + "; ".join(doc["input_changes"]) + ".", ""]
        lines += [
            "| policy | " + " | ".join(c for c, _ in COLS) + " |",
            "|---|" + "---:|" * len(COLS),
        ]
        for policy, f in doc["policies"].items():
            lines.append(f"| {policy} | " + " | ".join(get(f) for _, get in COLS) + " |")
        lines += ["", *causes(doc)]
    if sweep is not None:
        lines += sensitivity(sweep)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "tools/sim/out/results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/results-cluster.md")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="workload names in tools/sim/workloads/")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument(
        "--seeds", default="", help="held-out seeds to run each workload at (default: tools/sim/holdout.json's)"
    )
    parser.add_argument(
        "--readme", type=Path, default=REPO / "README.md", help="whose block between the markers to rewrite"
    )
    args = parser.parse_args(argv)
    names = tuple(n.strip() for n in args.workloads.split(",") if n.strip())
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        try:
            run_missing(args.out, names, args.procs)
        except WorkloadError as e:
            print(f"results.py: {e}", file=sys.stderr)
            return 2
    docs = {}
    for name in names:
        path = args.out / f"{name}.json"
        if not path.exists():
            print(f"results.py: {path} missing (run without --render-only)", file=sys.stderr)
            return 2
        docs[name] = json.loads(path.read_text())
    sweep_path = args.out / "sensitivity.json"
    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else None
    seeds = tuple(int(n) for n in args.seeds.split(",") if n.strip()) or CLAIM_SEEDS
    tuned = sorted(set(seeds) & set(TUNING_SEEDS))
    if tuned:
        print(f"results.py: seeds {tuned} were used to choose defaults (tools/sim/holdout.json)", file=sys.stderr)
        return 2
    seeded_dir = args.out / "seeds"
    seeded_dir.mkdir(exist_ok=True)
    claimed = tuple(n for n in names if n in CLAIM_WORKLOADS)
    seeded = run_seeds(seeded_dir, claimed, seeds, args.procs, run=not args.render_only) or None
    args.doc.write_text(render(docs, sweep, seeded) + "\n")
    print(f"wrote {args.doc}")
    if args.readme is not None and args.readme.exists() and seeded:
        args.readme.write_text(with_goals(args.readme.read_text(), seeded))
        print(f"wrote the simulator's block of {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
