"""Turns the benchmarks' JSON (``--json`` of bundle.py, ready.py, loader.py, gpu_train.py,
extender.py, controller.py, webhook.py, agent_writes.py, digestcache.py) into the
performance page, docs/results-performance.md, and the README's figures (the block between
``<!-- figures:begin -->`` and ``<!-- figures:end -->``: each ratio that has a goal).

    python tools/bench/bundle.py --json docs/results/performance/bundle-mixed.json --workdir /dev/shm/b
    python tools/bench/ready.py --json docs/results/performance/ready.json
    python tools/bench/loader.py --json docs/results/performance/loader.json
    python tools/bench/extender.py --nodes 100,1000,5000,15000 --modes names \
        --json docs/results/performance/extender-names.json
    python tools/bench/controller.py --json docs/results/performance/controller.json
    python tools/bench/webhook.py --json docs/results/performance/webhook.json
    python tools/bench/agent_writes.py --json docs/results/performance/agent-writes.json
    python tools/bench/results.py              # docs/results/performance/*.json -> the page and the README
    python tools/bench/results.py --smoke --workdir DIR                 # renders the JSON under DIR (the suite)

The JSON behind the published figures is committed (docs/results/performance/), and a test
checks that the page and the README block are what this script makes of it.

Every ratio is printed beside its goal and the load average of the machine while it was
measured (at the start and the end of its run): figures taken on a loaded machine say
little in seconds, and only interleaved ratios survive the noise. Nothing is edited by
hand in the page: re-run the benchmarks and this script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results-performance.md"
README = ROOT / "README.md"
DATA = ROOT / "docs" / "results" / "performance"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"

_TITLES = {
    "bundle": "Digest, pack and unpack against the C pipelines",
    "ready": "Time to ready from S3 against per-file tools",
    "loader": "Training read throughput (images decoded per second)",
    "gpu_train": "Training on a GPU: images per second and GPU utilisation, from the store and from the node cache",
    "extender": "Scheduler extender: prioritize latency by cluster size",
    "controller": "Dataset controller: one pass by cluster size, and what a Node carries",
    "webhook": "Admission webhook: the RoCE class vote by cluster size",
    "agent_writes": "Node agents' writes of their state under churn",
    "digestcache": "The digest cache: recording a big tree again after one file changed",
}
#: the order of the sections (and of the README's figures)
_ORDER = ("bundle", "ready", "loader", "gpu_train", "extender", "controller", "webhook", "agent_writes", "digestcache")

#: what a section's reader needs before its figures: where they come from
_NOTES = {
    "extender": """`tools/bench/extender.py`: the extender as its own process (`python -m scheduler_plugin`),
its watch cache listing a fake API server's Nodes and their `NodeCache` objects (inventory
of 20 datasets, two-class 8-GPU topology), sent sequential prioritize requests over one
keep-alive connection as kube-scheduler sends them; `names` is `nodeCacheCapable: true`
(node names only). Latency is measured by the client, on the same loaded machine; the
ratios are the target over the measured figure (>= 1 meets it). kube-scheduler's default
`percentageOfNodesToScore` sends about 5% of the names at 15,000 nodes; these runs send
them all.
""",
    "controller": """`tools/bench/controller.py`: one `DatasetController.reconcile_all` in a process of its
own against a fake API server serving its lists from memory, over N Nodes, N `NodeCache`
inventories (12 datasets each), N agent pods, 6 running training pods a node (as the API
server holds them: managed fields, container statuses; every other one names a Dataset)
and 1,000 Datasets in four namespaces (one in 20 with warm-up, one in 20 with replicas,
one in 20 striped: those make every pass read every pod), agents answering at once (every
agent call counted would be an HTTP request in a cluster). Each size runs twice: with the
Nodes, NodeCaches and pods listed every pass (the baseline) and kept by list+watch (the
default; the pods' watch started by the first pass; a pass starts once the watches have
the changes). The pass time is the median of the timed passes (1% of inventories changed
before each); the peak RSS is the controller process's `VmHWM` over them (interpreter and
imports included). The bytes added to a Node are what this release's agent writes on it
(free-GPU and follow-up annotations at their longest, device-plugin labels, RoCE-class
condition, class resources). Ratios: the goal over the measured figure.
""",
    "webhook": """`tools/bench/webhook.py`: the webhook's class policy (`auto`) admitting multi-worker
GPU pods, each of a new job and each once the class view's 5 s time to live has passed, so
that each reads every node's published classes again, over the cluster
`tools/bench/controller.py` builds, in the benchmark's process against a fake API server
serving its lists from memory; with the Nodes listed at the admission (the baseline) and
kept by list+watch (the default). The goal is 1 s at 15,000 nodes, a fifth of the chart's
`webhook.timeoutSeconds`, past which the API server admits the pod unchanged. The memory
the default mode holds is measured in a process of its own (the node watch's first list,
then one admission from a fresh class view; its `VmHWM`), against the chart's
`webhook.resources.limits.memory` (768 Mi) at 15,000 nodes.
""",
    "agent_writes": """`tools/bench/agent_writes.py`: simulated nodes on a simulated clock, each running the
agent's real publishing rule (`Coalescer`, the state builders and the merge patches it
sends) through an hour of pod starts and ends, cache hits, fetches and evictions at the
rates its docstring gives and justifies. Writes per node-hour count the `NodeCache` and
the Node's free-GPU annotation together; the ratio is the goal (360, one write per node
per 10 s) over the mean.
""",
    "digestcache": """`tools/bench/digestcache.py`: `DigestCache.store` of a synthetic tree in ImageNet's
shape (the columns the native listing gives, no file read) after one file's digest changed,
in one SQLite file a side on the benchmark's work directory: the cache as it is (only the
parts of the record whose bytes changed are written) against the same call given a
snapshot without its parts' hashes (the whole record written again), interleaved. Wall is
the median of the rounds; "written" is what the process passed to `write` in the last round
(`/proc/self/io`: SQLite's journal and checkpoint included).
""",
    "gpu_train": """`tools/bench/gpu_train.py` on a GPU machine: ResNet-50 (torchvision, bf16 autocast,
channels-last, SGD) trained by a PyTorch DataLoader over a generated JPEG set, the same job
reading each image as a GET of its own object from an S3-compatible store on loopback
(`direct`, first-byte latency in the parameters, one keep-alive connection per loader
process) and from the node cache, the set as `dsctl cache` leaves it (`cached`), and the
model alone on batches already on the GPU (`synthetic`). The timed rows give each way's
images per second, the GPU's mean utilisation (NVML, every 0.2 s) and the seconds the
training loop waited for its next batch, over the epochs after the first.
""",
    "ready": """The store is `tools/support/faststore.py` in runs whose parameters say `store=faststore`:
an S3-compatible server on loopback serving the objects from memory from one process per
core (`store_workers`), with the first-byte latency of each row and S3's documented limit of
5,500 GET/HEAD requests per second per prefix (`get_rate_per_prefix`, answered with
`503 SlowDown` past it). Its capacity here (`store_capacity_rps`: small GETs per second, no
latency, no limit, a raw client on the same CPUs) and, in the timed rows, the requests each
way made and the rate the store sustained show that no per-file tool was held back by the
store. The floor is one first-byte latency, plus the bundles' bytes at the rate this store
serves them, plus the project's unpack of those bundles on this disk (`floor: ...` rows);
`floor / dsctl` is its share of dsctl's time (goal 0.83: dsctl within 1.2x of the floor).
Runs without a `store` parameter were taken against moto (one Python process) behind a
latency proxy: there every per-file tool also measured moto's cost per request (`s5cmd`
reached about 227 files/s), so their ratios say more about that test server than about
the tools.
""",
}

_INTRO = """# Performance results

Generated by `tools/bench/results.py` from the JSON the benchmarks in `tools/bench/` write;
do not edit by hand. Each ratio is "how many times faster than the baseline" (or, for the
loader, the share of the baseline's images per second), measured in one run with the
sides interleaved, beside its goal and the machine's load average (1 minute, at the start
and the end of the run). How each benchmark works, and what it leaves out, is in its
docstring (`python tools/bench/NAME.py --help`).
"""


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _measured(value: float | None, goal: float | None) -> str:
    """A ratio to two decimals, or three where two would print it equal to a goal it misses
    (0.996x against 1.00x)."""
    if value is not None and goal is not None and value < goal and _fmt(value) == _fmt(goal):
        return _fmt(value, 3)
    return _fmt(value)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def _verdict(value: float | None, goal: float | None) -> str:
    if value is None or goal is None:
        return ""
    return "met" if value >= goal else "not met"


def render(runs: list[dict[str, Any]]) -> str:
    lines = [_INTRO]
    for bench in _ORDER:
        mine = [r for r in runs if r.get("bench") == bench]
        if not mine:
            continue
        lines += [f"## {_TITLES[bench]}", ""]
        if bench in _NOTES:
            lines += [_NOTES[bench]]
        lines += [
            "| ratio | measured | goal | | note | load avg (start / end) | run | parameters |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for run in mine:
            load = _load(run)
            params = ", ".join(f"{k}={v}" for k, v in run.get("params", {}).items())
            host = run.get("host", {})
            where = f"{run.get('started', '?')}, {host.get('cpus', '?')} CPUs"
            where += f", {host['cpu']}" if host.get("cpu") else ""
            for ratio in run.get("ratios", []):
                value, goal = ratio.get("value"), ratio.get("goal")
                wanted = _fmt(goal) + "x" if goal is not None else ""
                lines.append(
                    f"| {_cell(ratio['name'])} | {_measured(value, goal)}x | {wanted} "
                    f"| {_verdict(value, goal)} | {_cell(ratio.get('note', ''))} | {load} | {where} | {_cell(params)} |"
                )
        lines.append("")
        for run in mine:  # rows a run's JSON leaves out, and why (its own "excluded" field)
            if run.get("excluded"):
                lines += [f"Left out of the run of {run.get('started', '?')}: {run['excluded']}.", ""]
        lines += ["<details><summary>timed rows</summary>", "", "| step | side | wall s | CPU s |", "|---|---|---|---|"]
        for run in mine:
            for row in run.get("rows", []):
                served = ""
                if row.get("requests") is not None:
                    served = (
                        f" ({row['requests']:.0f} requests, {row.get('sustained_rps', 0):.0f}/s sustained, "
                        f"{row.get('throttled', 0):.0f} refused)"
                    )
                served += _scale_detail(row)
                if row.get("images_per_s") is not None and row.get("gpu_util_mean") is not None:
                    served = (
                        f" ({row['images_per_s']:.0f} images/s, GPU {row['gpu_util_mean']:.0f}% busy, "
                        f"{row.get('waited_s') or 0:.1f} s waiting for data)"
                    )
                lines.append(
                    f"| {_cell(row['step'])} | {_cell(row['side'] + served)} | {_fmt(row['wall_s'], 3)} "
                    f"| {_fmt(row.get('cpu_s'), 3)} |"
                )
        lines += ["", "</details>", ""]
    if len(lines) == 1:
        lines.append("No results yet: run the benchmarks with `--json` and this script.\n")
    return "\n".join(lines).rstrip("\n") + "\n"


def _scale_detail(row: dict[str, Any]) -> str:
    """What a row of the scale benchmarks (extender, controller, webhook, agent writes) adds to its side."""
    parts = []
    if row.get("requests_per_s") is not None:
        parts.append(f"{row['wall_s'] * 1e3:.2f} ms, {row['requests_per_s']:.0f} requests/s")
        if row.get("load") is not None:
            parts.append(f"load {row['load']:.2f}")
    if row.get("pass_s_median") is not None:
        parts.append(f"peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB, {row.get('agent_calls', 0)} agent calls")
    if row.get("bytes") is not None and row.get("annotations_bytes") is not None:
        parts.append(
            f"{row['bytes']} B: annotations {row['annotations_bytes']}, labels {row['labels_bytes']}, "
            f"condition {row['condition_bytes']}, class resources {row['resources_bytes']}"
        )
    if row.get("max_s") is not None:
        parts.append(f"slowest {row['max_s']:.3f} s, load {row['load']:.2f}")
    if row.get("peak_rss_bytes") is not None and row.get("pass_s_median") is None:
        parts.append(f"peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB in a process of its own")
    if row.get("writes_per_node_hour_mean") is not None:
        parts.append(
            f"{row['writes_per_node_hour_mean']:.1f} writes/node-hour (max {row['writes_per_node_hour_max']:.0f}), "
            f"{row['bytes_per_write_mean']:.0f} B/write (max {row['bytes_per_write_max']:.0f})"
        )
    return f" ({'; '.join(parts)})" if parts else ""


def _load(run: dict[str, Any]) -> str:
    return f"{run['load_start'][0]:.1f} / {run.get('load_end', [float('nan')])[0]:.1f}"


#: a baseline's process count names the machine, not the step: ``xargs -P2`` and ``xargs -P16``
#: are one row of the README, in the columns of their machines
_PROCESSES = re.compile(r"-P\d+\b")


def _row_name(name: str) -> str:
    return _PROCESSES.sub("-P$(nproc)", name)


def _cpus(run: dict[str, Any]) -> int | None:
    cpus = (run.get("host") or {}).get("cpus")
    return cpus if isinstance(cpus, int) else None


def _machine(run: dict[str, Any]) -> tuple[int | None, str]:
    """The machine a run was taken on: its CPUs and its CPU model, without the makers'
    marks ("Intel(R) Xeon(R) Processor" -> "Intel Xeon"); "" where the run does not say."""
    model = str((run.get("host") or {}).get("cpu") or "")
    return _cpus(run), " ".join(re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b", " ", model).split())


def figures(runs: list[dict[str, Any]]) -> str:
    """The README's block: every ratio with a goal, beside it and the load it was taken at, one
    column per machine (CPUs, and the CPU model where runs on as many CPUs came from two
    models: a ratio against the C tools moves with the machine's cost of a system call) the
    runs were taken on; a later run of the same ratio on the same machine replaces an earlier one."""
    columns = sorted({_machine(run) for run in runs if any(r.get("goal") is not None for r in run.get("ratios", []))},
                     key=lambda c: (-1 if c[0] is None else c[0], c[1]))  # fmt: skip
    rows: dict[str, tuple[float, dict[tuple[int | None, str], str]]] = {}
    for run in runs:
        for ratio in run.get("ratios", []):
            goal = ratio.get("goal")
            if goal is None:
                continue
            value = ratio.get("value")
            cell = f"{_measured(value, goal)}x ({_verdict(value, goal)}), {_load(run)}"
            rows.setdefault(_row_name(ratio["name"]), (goal, {}))[1][_machine(run)] = cell
    models: dict[int | None, set[str]] = {}
    for cpus, model in columns:
        models.setdefault(cpus, set()).add(model)

    def head(cpus: int | None, model: str) -> str:
        size = "measured" if cpus is None else f"{cpus} CPUs"
        return (f"{size}, {model or 'CPU not recorded'}" if len(models[cpus]) > 1 else size) + " (load start / end)"

    heads = [head(*c) for c in columns]
    lines = [
        BEGIN,
        "| what users feel | goal | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for name, (goal, cells) in rows.items():
        lines.append(f"| {_cell(name)} | {_fmt(goal)}x | " + " | ".join(cells.get(c, "-") for c in columns) + " |")
    if not rows:
        lines.append("| no results yet | | |")
    lines.append(END)
    return "\n".join(lines)


def with_figures(readme: str, runs: list[dict[str, Any]]) -> str:
    """``readme`` with its block between the markers replaced (unchanged if it has none)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return readme
    return readme[:start] + figures(runs) + readme[end + len(END) :]


def read_runs(files: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for path in files:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            sys.exit(f"results.py: cannot read {path}: {exc}")
    runs.sort(
        key=lambda run: (
            _ORDER.index(run["bench"]) if run.get("bench") in _TITLES else len(_ORDER),
            run.get("started", ""),
        )
    )
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="the benchmarks' JSON files")
    parser.add_argument("--out", type=Path, default=PAGE, help=f"the page to write (default: {PAGE.relative_to(ROOT)})")
    parser.add_argument("--smoke", action="store_true", help="render WORKDIR's JSON files to WORKDIR/results.md")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    files = list(args.files) or sorted(DATA.glob("*.json"))
    out = args.out
    if args.smoke:
        workdir = args.workdir or Path(".")
        files = list(args.files) + sorted(workdir.glob("*.json"))
        out = workdir / "results.md"
    runs = read_runs(files)
    page = render(runs)
    out.write_text(page)
    print(page)
    print(f"written to {out}")
    if not args.smoke and out == PAGE:
        README.write_text(with_figures(README.read_text(), runs))
        print(f"figures written to {README}")


if __name__ == "__main__":
    main()
