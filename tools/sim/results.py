"""The cluster results page: every policy on several workloads, and only the claims that hold on all.

    python tools/sim/results.py                     # run what is missing, then write the page (tens of minutes)
    python tools/sim/results.py --render-only       # the page from the JSON already in --out
    python tools/sim/results.py --seeds 2,3,4,5,6   # also the goals on other seeds of each workload

Runs ``run.py``'s simulation of :data:`POLICIES` on each workload of :data:`WORKLOADS`
(``tools/sim/workloads/results-*.json``, shapes the presets have and ones they do not),
writing one JSON per workload into ``--out`` (the same document as ``run.py --json``: the
workload, the rates with their sources, what caps changed in the input, every policy's
figures). Then writes ``--doc`` (``docs/results-cluster.md``) and the held-out runs in words
and as a table into ``--readme``'s block between :data:`BEGIN` and :data:`END` (and
``deadline-applied`` on them against the rivals into its block between
:data:`DEADLINE_BEGIN` and :data:`DEADLINE_END`) from those JSON files alone: per workload a
table of the figures with each baseline's model and rates beside it, then the claims, each
stated only if it holds on every workload (at least three), the workloads where ours loses
named, and a policy that is best on one workload only labelled experimental. With
``--seeds``, each workload runs again at those seeds (other jobs and datasets drawn from the
same shape: workloads the presets were never tuned on) with the Fluid and JuiceFS settings,
``ours+stripe+early`` and ``deadline-applied`` (only the policies a run's document lacks),
into ``--out``/seeds/, and the page gets the goal ratios of every such run, misses in bold.
Who calls it: a person, and the simulator's tests (:func:`render` on small documents). Exit
codes: 0 done, 2 bad arguments or workload file.
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
from tools.sim.model import model_stamp  # noqa: E402
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


def run_missing(out: Path, names: tuple[str, ...], procs: int, model: str) -> None:
    """Each workload's document in ``out``, run where it is missing or was run by another
    simulator than ``model`` (:func:`tools.sim.model.model_stamp`)."""
    for name in names:
        path = out / f"{name}.json"
        wf = load(WORKLOAD_DIR / f"{name}.json")
        if path.exists() and current(json.loads(path.read_text()), model, wf.model_dump(mode="json")):
            continue
        started = time.perf_counter()
        results = run_all(wf, list(POLICIES), procs)
        doc = {
            "model": model,
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
#: what the admission webhook applies to the jobs that opt in to deadline plans: run at each
#: held-out seed too, into the same document, and compared with the rivals apart from the
#: goals (:func:`deadline_prose`), neither a rival nor ours there
DEADLINE_POLICY = "deadline-applied"


def run_seeds(
    out: Path, names: tuple[str, ...], seeds: tuple[int, ...], procs: int, *, model: str, run: bool = True
) -> dict[str, Any]:
    """Each workload at each of ``seeds`` (:data:`SEED_POLICIES` and :data:`DEADLINE_POLICY`,
    one document a run; the policies a run in ``out`` already has are kept and only the
    others run into it, unless another simulator than ``model`` ran them: then all run
    again. With ``run`` False nothing runs: a missing run is left out, a missing policy
    stays missing, a document of another simulator is returned as it is); the documents by
    ``<workload> seed <n>``."""
    docs = {}
    for name in names:
        for seed in seeds:
            path = out / f"{name}-seed{seed}.json"
            if not path.exists() and not run:
                continue
            seeded = at_seed(name, seed)
            workload = seeded.model_dump(mode="json")
            doc = json.loads(path.read_text()) if path.exists() else None
            if doc is None or (run and not current(doc, model, workload)):
                doc = {
                    "model": model, "product_policy": PRODUCT_POLICY, "seed": seed, "workload_file": name,
                    "workload": workload, "policies": {},
                }  # fmt: skip
            missing = [p for p in (*SEED_POLICIES, DEADLINE_POLICY) if p not in doc["policies"]]
            if missing and run:
                results = run_all(seeded, missing, procs)
                doc["policies"].update({r["policy"]: report.fields(r) for r in results})
                staged = path.with_suffix(".tmp")
                staged.write_text(json.dumps(doc) + "\n")
                staged.replace(path)
            docs[f"{name} seed {seed}"] = doc
    return docs


def current(doc: Mapping[str, Any], model: str, workload: Mapping[str, Any]) -> bool:
    """Whether ``doc`` was run by the simulator ``model`` (:func:`tools.sim.model.model_stamp`)
    on ``workload`` as its file now reads."""
    return doc.get("model") == model and doc.get("workload") == workload


def stale(docs: Mapping[str, Mapping[str, Any]], model: str) -> list[str]:
    """The names in ``docs`` (a workload's document by its name, a held-out run's by
    ``<workload> seed <n>``) of those :func:`current` says are not ``model``'s on their
    workload file as it now reads."""
    older = []
    for label, doc in docs.items():
        wf = at_seed(doc.get("workload_file", label), doc.get("seed"))
        if not current(doc, model, wf.model_dump(mode="json")):
            older.append(label)
    return older


def at_seed(name: str, seed: int | None) -> WorkloadFile:
    """The workload file ``name`` (in ``tools/sim/workloads/``) as a run at ``seed`` reads it
    (None: at its own seed)."""
    wf = load(WORKLOAD_DIR / f"{name}.json")
    return wf if seed is None else WorkloadFile.model_validate({**wf.model_dump(), "seed": seed})


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


#: how the README's prose names a held-out workload (:func:`seeds_prose`): alone ("on small
#: caches") and before "run" ("on one small-cache run"); any other workload by its own name
GROUPS: dict[str, tuple[str, str]] = {
    "results-base": ("base", "base"),
    "results-multi-tb": ("multi-TB", "multi-TB"),
    "results-churn": ("churn", "churn"),
    "results-tight": ("small caches", "small-cache"),
}
#: a workload on which ours meets the idle goal on every run is named with its figures only
#: where the best rival idles at least this many GPU-hours on one of them: below, whole
#: GPU-hours show nothing to compare
IDLE_SHOWN_FROM_H = 2.0
_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
_SYSTEMS = {"fluid": "Fluid", "juicefs": "JuiceFS"}

# one held-out run on one goal: (workload, ratio or own figure, ours, the best rival's, that rival, met)
_Run = tuple[str, float, float, float, str, bool]


def _num(v: float) -> str:
    """A figure in the prose: whole from 1 up, one decimal below, one significant digit below 0.1."""
    if round(v, 1) >= 1:
        return f"{v:.0f}"
    if round(v, 1) >= 0.1:
        return f"{v:.1f}"
    return f"{v:.1g}"


def _times(ratio: float) -> str:
    """A ratio without its ``x``: two decimals, four where two would read 1.00 (near 1.0x, which
    side of the target it is on); the prose's and :func:`goal_cell`'s."""
    return f"{ratio:.{4 if f'{ratio:.2f}' == '1.00' and ratio != 1.0 else 2}f}"


def _span(values: list[float], fmt: Callable[[float], str]) -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _count(k: int) -> str:
    return _COUNTS[k] if k < len(_COUNTS) else str(k)


def _group(docs: Mapping[str, Mapping[str, Any]], wname: str) -> str:
    return str(docs[wname].get("workload_file") or wname.rsplit(" seed ", 1)[0])


def _goal_runs(docs: Mapping[str, Mapping[str, Any]], label: str) -> list[_Run]:
    """Every held-out run (:func:`goal_ratios`) on the goal labelled ``label``."""
    index = [g[0] for g in GOALS].index(label)
    _, name, rivals, _ = GOALS[index]
    out = []
    for wname, mine, cells in goal_ratios(docs):
        value, best, met = cells[index]
        by = docs[wname]["policies"]
        if rivals is None:
            out.append((_group(docs, wname), value, value, math.nan, "", met))
        elif best:
            get = METRIC[name][2]
            out.append((_group(docs, wname), value, get(by[mine]), get(by[best]), best, met))
    return out


def _misses(runs: list[_Run], values: Callable[[list[_Run], bool], str]) -> list[str]:
    """Per workload with a miss, most misses first: ``values`` of its missed runs (a range
    where every one of its several runs missed) and where ("on small caches", "on two
    multi-TB runs")."""
    groups = list(dict.fromkeys(r[0] for r in runs))
    missed = {g: [r for r in runs if r[0] == g and not r[5]] for g in groups}
    items = []
    for g in sorted((g for g in groups if missed[g]), key=lambda g: -len(missed[g])):
        label, adjective = GROUPS.get(g, (g, g))
        k = len(missed[g])
        whole = k > 1 and k == sum(1 for r in runs if r[0] == g)
        where = label if whole else f"{_count(k)} {adjective} run{'s' if k > 1 else ''}"
        items.append(f"{values(missed[g], whole)} on {where}")
    return items


def _against(unit: str, each: bool) -> Callable[[list[_Run], bool], str]:
    """Ours' figures against the best rival's, ``unit`` after both sides (``each``) or ours only."""

    def values(runs: list[_Run], whole: bool) -> str:
        ours = _span([r[2] for r in runs], _num) if whole else _and([_num(r[2]) for r in runs])
        theirs = _span([r[3] for r in runs], _num) if whole else _and([_num(r[3]) for r in runs])
        return f"{ours}{unit} against {theirs}{unit if each else ''}"

    return values


def _ratios(runs: list[_Run], whole: bool) -> str:
    return f"{_span([r[1] for r in runs], _times)}x" if whole else _and([f"{_times(r[1])}x" for r in runs])


def _over(runs: list[_Run], whole: bool) -> str:
    def pct(r: float) -> str:
        return _num((r - 1) * 100)

    return f"{_span([r[1] for r in runs], pct)}%" if whole else _and([f"{pct(r[1])}%" for r in runs])


def _jobs(runs: list[_Run], whole: bool) -> str:
    return f"{_span([r[1] for r in runs], _num) if whole else _and([_num(r[1]) for r in runs])} split jobs"


def _idle_met(runs: list[_Run]) -> list[str]:
    """Per workload on which ours meets the idle goal on every run and the best rival idles
    at least :data:`IDLE_SHOWN_FROM_H`: ours' range and the rival system's."""
    items: list[str] = []
    for g in dict.fromkeys(r[0] for r in runs):
        mine = [r for r in runs if r[0] == g]
        if not all(r[5] for r in mine) or max(r[3] for r in mine) < IDLE_SHOWN_FROM_H:
            continue
        systems = {_SYSTEMS.get(r[4].split("+")[0].split("-")[0], r[4]) for r in mine}
        rival = systems.pop() if len(systems) == 1 else "the best rival"
        first = not items
        items.append(
            f"{GROUPS.get(g, (g, g))[0]}{':' if first else ''} {_span([r[2] for r in mine], _num)}"
            f"{' GPU-hours' if first else ''}, {rival} {_span([r[3] for r in mine], _num)}"
        )
    return items


def _detail(items: list[str]) -> str:
    if not items:
        return ""
    return " (" + ("; " if any(", " in i for i in items) else ", ").join(items) + ")"


def seeds_prose(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The held-out runs (:func:`run_seeds` at :data:`CLAIM_SEEDS`) in a paragraph, one
    sentence an item: on how many ours meets each goal, the ratios' range where it meets it
    on all, and where it misses by how much (a store miss as the share over, a miss in time
    or idle GPUs as both figures); the README's block starts with it. None where there are
    no runs."""
    n = len(goal_ratios(docs))
    if not n:
        return []

    def on(runs: list[_Run]) -> str:
        met = sum(1 for r in runs if r[5])
        return f"on all {n}" if met == len(runs) == n else f"on {met}"

    split = _goal_runs(docs, "avoidable split jobs = 0")
    split_met = sum(1 for r in split if r[5])
    local = _goal_runs(docs, "local bytes >= 1.5x best Fluid")
    if all(r[5] for r in local):
        local_detail = _detail([f"{_span([r[1] for r in local], _times)}x"])
    else:
        local_detail = _detail(_misses(local, _ratios))
    jct = _goal_runs(docs, "JCT <= 1.0x")
    idle = _goal_runs(docs, "GPU-h idle <= 1.0x")
    idle_met = _idle_met(idle)
    idle_missed = _misses(idle, _against("" if idle_met else " GPU-hours", False))
    store = _goal_runs(docs, "store bytes <= 1.0x")
    store_missed = sum(1 for r in store if not r[5])
    ttfs = _goal_runs(docs, "TTFS <= 1.0x")
    ttfs_missed = sum(1 for r in ttfs if not r[5])
    if store_missed:
        store_text = f"reads more from the store on {store_missed}{_detail(_misses(store, _over))}"
    else:
        store_text = f"reads no more from the store than any rival on all {n}"
    if ttfs_missed:
        ttfs_text = f"starts later on {ttfs_missed}{_detail(_misses(ttfs, _against(' s', True)))}"
    else:
        ttfs_text = f"starts no later than any rival on all {n}"
    return [
        "A miss is in bold: ours keeps every multi-worker job in one RoCE subnet when one had room for it "
        + (f"on all {n} runs" if split_met == n else f"on {split_met} of {n} runs")
        + _detail(_misses(split, _jobs))
        + f" and reads at least 1.5x the best Fluid setting's local-byte fraction {on(local)}{local_detail}; "
        f"its mean job time is at most the best rival's {on(jct)}{_detail(_misses(jct, _ratios))}.",
        f"GPUs wait for data no longer than any rival's {on(idle)}{_detail([*idle_met, *idle_missed])}.",
        f"It {store_text} and {ttfs_text}.",
        "By `tools/sim/results.py`; [cluster results](docs/results-cluster.md).",
    ]


#: the README's block of the deadline policy on the held-out runs (:func:`with_deadlines`)
DEADLINE_BEGIN, DEADLINE_END = "<!-- deadline:begin -->", "<!-- deadline:end -->"
#: how :func:`deadline_prose` groups the held-out workloads, a clause a group; a workload in
#: none of them is in a last group, "elsewhere"
DEADLINE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("where datasets fit the caches", ("results-base", "results-churn")),
    ("where caches are small", ("results-multi-tb", "results-tight")),
)

# one held-out run of the deadline policy: its seed, its deadline misses, the fewest of any
# rival setting, and its mean job time over the lowest of any rival setting
_DeadlineRun = tuple[int, int, int, float]


def deadline_runs(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[_DeadlineRun]]:
    """Per workload, its held-out runs (:func:`run_seeds`) that have :data:`DEADLINE_POLICY`
    and a rival setting, in the order of ``docs``."""
    out: dict[str, list[_DeadlineRun]] = {}
    for wname, doc in docs.items():
        by = doc["policies"]
        rivals = [by[p] for p in RIVALS if p in by]
        if DEADLINE_POLICY not in by or not rivals:
            continue
        mine = by[DEADLINE_POLICY]
        fewest = min(int(f["deadline_misses"]) for f in rivals)
        slower = _ratio(mine["jct_mean_s"], min(f["jct_mean_s"] for f in rivals))
        seed = int(doc.get("seed") or wname.rsplit(" seed ", 1)[-1])
        out.setdefault(_group(docs, wname), []).append((seed, int(mine["deadline_misses"]), fewest, slower))
    return out


def _times_over(runs: list[_DeadlineRun]) -> str:
    return f"{_span([r[3] for r in runs], lambda v: f'{v:.1f}')}x"


def _deadline_clause(label: str, workloads: list[tuple[str, list[_DeadlineRun]]]) -> str:
    """One group of workloads: fewer misses than every rival setting on all its runs, with
    the figures' ranges, or per workload where the policy misses more (on which runs)."""
    runs = [r for _, rs in workloads for r in rs]
    if all(r[1] < r[2] for r in runs):
        return (
            f"{label} they miss fewer deadlines than every rival setting ({_span([r[1] for r in runs], _num)} "
            f"against the best rival's {_span([r[2] for r in runs], _num)} on "
            f"{_and([f'`{w}`' for w, _ in workloads])}), at {_times_over(runs)} the best rival's mean job time"
        )
    worse, fewer = [], []
    for w, rs in workloads:
        won = [r for r in rs if r[1] < r[2]]
        lost = [r for r in rs if r[1] >= r[2]]
        ranges = f"{_span([r[1] for r in rs], _num)} against {_span([r[2] for r in rs], _num)}, at {_times_over(rs)}"
        if not won or not lost:
            (fewer if won else worse).append(f"on `{w}` ({ranges})")
            continue
        others = "the other" if len(won) == 1 else "the others"
        worse.append(
            f"on {_count(len(lost))} of {_count(len(rs))} `{w}` runs ({_and([_num(r[1]) for r in lost])} against "
            f"{_and([_num(r[2]) for r in lost])}; {_and([_num(r[1]) for r in won])} against "
            f"{_and([_num(r[2]) for r in won])} on {others}), at {_times_over(rs)}"
        )
    more = "more" if all(r[1] > r[2] for r in runs if r[1] >= r[2]) else "no fewer"
    return f"{label} they miss {more} {_and(worse)}" + (f" and fewer {_and(fewer)}" if fewer else "")


def deadline_prose(docs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The deadline policy (:data:`DEADLINE_POLICY`) on the held-out runs against the rival
    settings, a clause per group of :data:`DEADLINE_GROUPS`: its deadline misses against the
    fewest of any rival, its mean job time over the lowest (the README's block between
    :data:`DEADLINE_BEGIN` and :data:`DEADLINE_END`, a line a sentence). None where no
    held-out run has the policy."""
    by = deadline_runs(docs)
    if not by:
        return []
    listed = {w for _, ws in DEADLINE_GROUPS for w in ws}
    groups = [*DEADLINE_GROUPS, ("elsewhere", tuple(w for w in by if w not in listed))]
    clauses = [
        _deadline_clause(label, [(w, by[w]) for w in ws if w in by]) for label, ws in groups if any(w in by for w in ws)
    ]
    seeds = sorted({r[0] for rs in by.values() for r in rs})
    contiguous = len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1))
    seeds_text = f"{seeds[0]}-{seeds[-1]}" if contiguous else _and([str(s) for s in seeds])
    presets = f"the {_count(len(by))} presets" if len(by) > 1 else "its preset"
    return [
        f"Deadline plans, applied to the jobs that opt in (`{DEADLINE_POLICY}` in the simulator, on the held-out "
        f"seeds {seeds_text} of {presets}): " + "; ".join(clauses) + ".",
        f"By `tools/sim/results.py` (`{DEADLINE_POLICY}` run beside the rivals at those seeds); [when the deadline "
        "policy helps and when it hurts](docs/simulation.md#deadline-policy).",
    ]


def with_deadlines(readme: str, seeded: Mapping[str, Mapping[str, Any]]) -> str:
    """``readme`` with its block between :data:`DEADLINE_BEGIN` and :data:`DEADLINE_END`
    replaced by :func:`deadline_prose` of the held-out runs (unchanged if it has no block,
    or no held-out run has the deadline policy)."""
    prose = deadline_prose(seeded)
    return _with_block(readme, DEADLINE_BEGIN, DEADLINE_END, prose) if prose else readme


def _with_block(readme: str, begin: str, end: str, lines: list[str]) -> str:
    """``readme`` with the text between ``begin`` and ``end`` replaced by ``lines``, a line
    each (unchanged without both markers in order)."""
    start, stop = readme.find(begin), readme.find(end)
    if start < 0 or stop < start:
        return readme
    return readme[:start] + "\n".join([begin, *lines, end]) + readme[stop + len(end) :]


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
    return f"{_times(ratio)}x ({best})"


def with_goals(readme: str, seeded: Mapping[str, Mapping[str, Any]]) -> str:
    """``readme`` with its block between the markers replaced by the held-out runs
    (:func:`run_seeds` at :data:`CLAIM_SEEDS`) in a paragraph (:func:`seeds_prose`, a line
    a sentence: a new run changes the lines of the sentences it changes), their
    :func:`goals_table` and how many meet each goal (unchanged if it has no block, or there
    are no held-out runs)."""
    if not seeded:
        return readme
    prose = seeds_prose(seeded)
    lines = [*([*prose, ""] if prose else []), *goals_table(seeded), "", f"Held-out seeds ({seeds_summary(seeded)}"]
    return _with_block(readme, BEGIN, END, lines)


def _fmt(metric: str, v: float) -> str:
    if metric == "local-byte fraction":
        return f"{v:.1%}"
    if metric == "store bytes":
        return f"{v / 1e12:.1f} TB"
    if metric in ("mean time to first step",):
        return f"{_whole(v)} s"
    if metric == "mean job time":
        return f"{v / 3600:.2f} h"
    return _whole(v)


def _whole(v: float) -> str:
    """``v`` in whole units, or to one significant digit below one (not 0 beside a true 0)."""
    return f"{v:.1g}" if 0 < abs(v) < 0.5 else f"{v:.0f}"


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
    model = model_stamp()
    if not args.render_only:
        try:
            run_missing(args.out, names, args.procs, model)
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
    seeded = run_seeds(seeded_dir, claimed, seeds, args.procs, model=model, run=not args.render_only) or None
    older = stale({**docs, **(seeded or {})}, model)
    if sweep is not None and sweep.get("model") != model:
        older.append("sensitivity (tools/sim/sensitivity.py)")
    if older:
        print(
            f"results.py: another simulator ran {', '.join(older)}: the page shows their figures, not this "
            "code's (run without --render-only)",
            file=sys.stderr,
        )
    args.doc.write_text(render(docs, sweep, seeded) + "\n")
    print(f"wrote {args.doc}")
    if args.readme is not None and args.readme.exists() and seeded:
        args.readme.write_text(with_deadlines(with_goals(args.readme.read_text(), seeded), seeded))
        print(f"wrote the simulator's blocks of {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
