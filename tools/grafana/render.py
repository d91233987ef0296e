"""Draws the picture of the Grafana dashboard (docs/operator-guide/monitoring.md) from the metrics of a real demo run.

Who calls it: a maintainer (``python tools/grafana/render.py docs/img/dashboard.png``).
No Grafana server is available where this runs, so the panels of
``tools/grafana/dashboard.py`` are drawn with matplotlib: a real ``dsagent serve`` (TCP,
small capacity so evictions happen) and a real extender (uvicorn) serve a mixed workload
(hits, misses, failed requests, evictions, scheduler verbs and garbage bodies) for about
two minutes; both ``/metrics`` endpoints are scraped every 2 s and parsed with
``prometheus_client.parser``; each panel's PromQL is evaluated by hand over those samples
(``rate`` over a 10 s window, ``histogram_quantile`` by linear interpolation in buckets,
as Prometheus does).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tools.support.harness import held_ports  # noqa: E402

TOKEN = "demo-admin-token-0123456789"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def start_extender(port: int) -> None:
    import uvicorn

    from scheduler_plugin.app import create_app
    from scheduler_plugin.settings import Settings

    server = uvicorn.Server(uvicorn.Config(create_app(Settings()), host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the extender did not start")


def run(seconds: float, work: Path) -> list[tuple[float, Samples, Samples]]:
    from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json

    rng = random.Random(13)
    sources = work / "sources"
    for i in range(8):
        d = sources / f"set{i}"
        d.mkdir(parents=True)
        for j in range(rng.randint(4, 12)):
            (d / f"f{j}.bin").write_bytes(os.urandom(rng.randint(40_000, 160_000)))
    hold = contextlib.ExitStack()  # both ports nobody else's until the agent and the extender listen
    agent_port, ext_port = hold.enter_context(held_ports(2))
    env = {**os.environ, "DSAGENT_ADMIN_TOKEN": TOKEN, "DSAGENT_CAPACITY": "3MB", "DSAGENT_SWEEP_INTERVAL": "5"}
    log = open(work / "agent.log", "wb")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsagent",
            "serve",
            "--root",
            str(work / "cache"),
            "--socket",
            str(work / "a.sock"),
            "--listen",
            f"127.0.0.1:{agent_port}",
            "--local-source",
            str(sources),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    start_extender(ext_port)
    agent_url, ext_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{ext_port}"
    http = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    for _ in range(200):
        try:
            http.get(agent_url + "/healthz")
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    hold.close()
    topo = topology_json()
    nodes = [
        node(
            f"gpu-{i}",
            inventory=inventory_json(datasets={"set0": holding()} if i % 3 == 0 else {}),
            topology=topo,
            free_gpus=list(range(i % 8)),
        )
        for i in range(64)
    ]
    bodies = [
        args_body(pod(datasets=[{"name": "set0", "source": "s3://x/set0"}], gpus=g), nodes, node_cache_capable=False)
        for g in (1, 2, 4, 8)
    ]
    series: list[tuple[float, Samples, Samples]] = []
    started = time.monotonic()
    live: list[str] = []
    n = 0
    next_scrape = started
    try:
        while time.monotonic() - started < seconds:
            n += 1
            phase = (time.monotonic() - started) / seconds
            hot = rng.randint(0, 2) if phase < 0.5 else rng.randint(0, 7)  # a shift of the working set mid-run
            task = f"job-{n}"
            http.put(
                f"{agent_url}/v1/tasks/{task}?wait=10",
                json={"datasets": [{"name": f"set{hot}", "source": str(sources / f"set{hot}")}]},
            )
            live.append(task)
            if len(live) > 2:
                http.delete(f"{agent_url}/v1/tasks/{live.pop(0)}")
            if rng.random() < 0.25 + (0.3 if 0.6 < phase < 0.75 else 0):  # an incident: a bucket path gone
                http.put(
                    f"{agent_url}/v1/tasks/bad-{n}?wait=5",
                    json={"datasets": [{"name": "gone", "source": str(sources / f"missing{n}")}]},
                )
            if rng.random() < 0.1:
                http.put(
                    f"{agent_url}/v1/tasks/bad-{n}",
                    json={"datasets": [{"name": "Bad Name", "source": str(sources / "set0")}]},
                )
            for _ in range(rng.randint(3, 8)):
                body = rng.choice(bodies)
                httpx.post(f"{ext_url}/filter", content=body)
                httpx.post(f"{ext_url}/prioritize", content=body)
            if rng.random() < 0.15:
                httpx.post(f"{ext_url}/filter", content=b'{"Pod": ')
            if time.monotonic() >= next_scrape:
                series.append(
                    (time.monotonic() - started, scrape(agent_url + "/metrics"), scrape(ext_url + "/metrics"))
                )
                next_scrape += 2
            time.sleep(rng.uniform(0.05, 0.25))
    finally:
        agent.terminate()
        agent.wait(timeout=20)
        log.close()
    return series


# -- a little PromQL by hand ---------------------------------------------------------------


def _sum_by(
    samples: Samples,
    name: str,
    by: tuple[str, ...],
    where: dict[str, str] | None = None,
    negate: dict[str, str] | None = None,
) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for (n, labels), v in samples.items():
        d = dict(labels)
        if (
            n != name
            or any(d.get(k) != x for k, x in (where or {}).items())
            or any(d.get(k) == x for k, x in (negate or {}).items())
        ):
            continue
        out[tuple(d.get(k, "") for k in by)] += v
    return dict(out)


def rate(
    series: list[tuple[float, Samples]], name: str, by: tuple[str, ...] = (), window: float = 10, **kw: Any
) -> tuple[list[float], dict[tuple[str, ...], list[float]]]:
    times, out = [], defaultdict(list)
    keys = set().union(*(_sum_by(s, name, by, **kw).keys() for _, s in series))
    for i, (t, s) in enumerate(series):
        j = max(0, next(k for k in range(i + 1) if t - series[k][0] <= window))
        if j == i:
            continue
        t0, s0 = series[j]
        now, before = _sum_by(s, name, by, **kw), _sum_by(s0, name, by, **kw)
        times.append(t)
        for key in keys:
            out[key].append(max(0.0, now.get(key, 0) - before.get(key, 0)) / (t - t0))
    return times, dict(out)


def quantile(
    q: float, series: list[tuple[float, Samples]], name: str, by: tuple[str, ...] = (), window: float = 10
) -> tuple[list[float], dict[tuple[str, ...], list[float]]]:
    times, buckets = rate(series, name, by + ("le",), window)
    out: dict[tuple[str, ...], list[float]] = defaultdict(list)
    groups = {k[:-1] for k in buckets}
    for g in groups:
        les = sorted((float(k[-1]), k) for k in buckets if k[:-1] == g)
        for i in range(len(times)):
            counts = [(le, buckets[k][i]) for le, k in les]
            total = counts[-1][1]
            if total <= 0:
                out[g].append(float("nan"))
                continue
            rank, prev_le, prev_c = q * total, 0.0, 0.0
            value = counts[-2][0] if len(counts) > 1 else 0.0
            for le, c in counts:
                if c >= rank:
                    value = (
                        prev_le
                        if le == float("inf")
                        else prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
                    )
                    break
                prev_le, prev_c = le, c
            out[g].append(value)
    return times, dict(out)


def gauge(
    series: list[tuple[float, Samples]], name: str, by: tuple[str, ...] = ()
) -> tuple[list[float], dict[tuple[str, ...], list[float]]]:
    keys = set().union(*(_sum_by(s, name, by).keys() for _, s in series))
    return [t for t, _ in series], {k: [_sum_by(s, name, by).get(k, 0.0) for _, s in series] for k in keys}


def draw(series: list[tuple[float, Samples, Samples]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agent = [(t, a) for t, a, _ in series]
    ext = [(t, e) for t, _, e in series]
    hits_t, hits = rate(agent, "dsplatform_agent_cache_hits_total")
    _, misses = rate(agent, "dsplatform_agent_cache_misses_total")
    h, m = hits.get((), []), misses.get((), [])
    ratio = {("hit ratio",): [x / (x + y) if x + y else float("nan") for x, y in zip(h, m)]}
    p50_t, p50 = quantile(0.5, agent, "dsplatform_agent_fetch_duration_seconds_bucket")
    _, p95 = quantile(0.95, agent, "dsplatform_agent_fetch_duration_seconds_bucket")
    space_t, used = gauge(agent, "dsplatform_agent_used_bytes")
    _, free = gauge(agent, "dsplatform_agent_free_bytes")
    _, cap = gauge(agent, "dsplatform_agent_capacity_bytes")
    parse_t, parse = rate(ext, "dsplatform_extender_parse_failures_total", ("verb",))
    _, errs = rate(ext, "dsplatform_extender_requests_total", ("verb", "outcome"), negate={"outcome": "ok"})
    panels = [
        ("Cache requests by outcome (/s)", rate(agent, "dsplatform_agent_dataset_requests_total", ("code",)), "{0}"),
        ("Cache hit ratio", (hits_t, ratio), "{0}"),
        ("Fetch duration (p50, p95) [s]", (p50_t, {("p50",): p50.get((), []), ("p95",): p95.get((), [])}), "{0}"),
        ("Bytes fetched (/s)", rate(agent, "dsplatform_agent_fetched_bytes_total"), "fetched"),
        ("Cache space [bytes]", (space_t, {("used",): used[()], ("free",): free[()], ("capacity",): cap[()]}), "{0}"),
        ("Evictions by reason (/s)", rate(agent, "dsplatform_agent_evictions_total", ("reason",)), "{0}"),
        ("Tasks by state", gauge(agent, "dsplatform_agent_tasks", ("state",)), "{0}"),
        (
            "Extender latency p95 by verb [s]",
            quantile(0.95, ext, "dsplatform_extender_request_duration_seconds_bucket", ("verb",)),
            "{0}",
        ),
        (
            "Extender parse failures and errors (/s)",
            (
                parse_t,
                {
                    **{(f"parse {k[0]}",): v for k, v in parse.items()},
                    **{(f"{k[1]} {k[0]}",): v for k, v in errs.items()},
                },
            ),
            "{0}",
        ),
        ("Nodes scored (/s)", rate(ext, "dsplatform_extender_nodes_scored_total", ("verb",)), "{0}"),
    ]
    plt.style.use("dark_background")
    fig, axes = plt.subplots(5, 2, figsize=(16, 17), facecolor="#111217")
    for ax, (title, (times, lines), legend) in zip(axes.flat, panels):
        ax.set_facecolor("#181b1f")
        for key, values in sorted(lines.items()):
            if values and any(v == v and v != 0 for v in values):
                ax.plot(times[: len(values)], values, linewidth=1.6, label=legend.format(*key) if key else legend)
        ax.set_title(title, loc="left", fontsize=12, color="#d8d9da")
        ax.grid(color="#2c3235", linewidth=0.6)
        ax.tick_params(colors="#9fa7b3", labelsize=8)
        ax.set_xlabel("seconds into the demo run", fontsize=8, color="#9fa7b3")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left", frameon=False)
    fig.suptitle(
        "dsplatform - rendered with matplotlib from a real demo run's /metrics (no Grafana server here)",
        color="#d8d9da",
        fontsize=13,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=72, facecolor=fig.get_facecolor())


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/dashboard.png")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 120
    with tempfile.TemporaryDirectory() as tmp:
        series = run(seconds, Path(tmp))
    draw(series, out)
    print(f"wrote {out} from {len(series)} scrapes")


if __name__ == "__main__":
    main()
