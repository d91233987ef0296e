"""Draws the picture of the Grafana dashboard (docs/operator-guide/monitoring.md) from the metrics of a real demo run.

Who calls it: a maintainer (``python tools/grafana/render.py docs/img/dashboard.png``).
No Grafana server is available where this runs, so every panel of
``tools/grafana/dashboard.py``'s ``PANELS`` is drawn with matplotlib, its PromQL evaluated
by ``tools/grafana/promql.py`` over scrapes of a demo run: a real ``dsagent serve`` (TCP,
small capacity so evictions happen), a real extender and a real admission webhook (uvicorn)
serve a mixed workload (hits, misses, failed requests, evictions, scheduler verbs,
admissions and garbage bodies) for about two minutes, every ``/metrics`` endpoint scraped
every 2 s and parsed with ``prometheus_client.parser``. A panel whose metrics the run
does not produce (striped reads need a cluster) says so on the picture.
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
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tools.grafana import promql  # noqa: E402
from tools.grafana.dashboard import PANELS  # noqa: E402
from tools.support.harness import held_ports  # noqa: E402

TOKEN = "demo-admin-token-0123456789"
Samples = promql.Samples


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def start_extender(port: int) -> None:
    from scheduler_plugin.app import create_app
    from scheduler_plugin.settings import Settings

    _serve(create_app(Settings()), port, "extender")


def _serve(app: Any, port: int, what: str) -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"the {what} did not start")


def start_webhook(port: int) -> None:
    """The admission webhook, its Datasets ``set0``-``set7`` (any other name is not found)."""
    from dsagent.errors import NotFound
    from dsagent.kube.datasets import Dataset
    from dsagent.webhook.mutation import Injection
    from dsagent.webhook.server import create_app

    def lookup(namespace: str, name: str) -> Dataset:
        if name.startswith("set"):
            return Dataset(namespace, name, f"s3://demo/{name}")
        raise NotFound(f"no Dataset {namespace}/{name}")

    _serve(create_app(Injection(image="dsplatform:demo"), lookup), port, "webhook")


def review(n: int, datasets: str | None) -> dict[str, Any]:
    """An AdmissionReview of a training pod's CREATE, asking for ``datasets`` (annotation JSON)."""
    from tools.support.fake_apiserver import make_pod

    asks = {"dsagent.io/datasets": datasets} if datasets else None
    pod = make_pod(f"train-{n}", namespace="ml", gpus=1, annotations=asks)
    request = {"uid": f"uid-{n}", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**request, "namespace": "ml", "object": pod},
    }


def run(seconds: float, work: Path) -> list[tuple[float, Samples]]:
    from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json

    rng = random.Random(13)
    sources = work / "sources"
    for i in range(8):
        d = sources / f"set{i}"
        d.mkdir(parents=True)
        for j in range(rng.randint(4, 12)):
            (d / f"f{j}.bin").write_bytes(os.urandom(rng.randint(40_000, 160_000)))
    hold = contextlib.ExitStack()  # the ports nobody else's until the agent, extender and webhook listen
    agent_port, ext_port, hook_port = hold.enter_context(held_ports(3))
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
    start_webhook(hook_port)
    agent_url, ext_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{ext_port}"
    hook_url = f"http://127.0.0.1:{hook_port}"
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
    series: list[tuple[float, Samples]] = []
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
            # an admission: unpatched (no datasets), patched, failed open (no such Dataset)
            asks = rng.choice([None, f'[{{"name": "set{hot}"}}]', '[{"name": "gone"}]'])
            httpx.post(f"{hook_url}/mutate", json=review(n, asks))
            if rng.random() < 0.05:
                httpx.post(f"{hook_url}/mutate", content=b'{"kind": "AdmissionReview"')
            if time.monotonic() >= next_scrape:
                samples = {**scrape(f"{agent_url}/metrics"), **scrape(f"{ext_url}/metrics")}
                samples.update(scrape(f"{hook_url}/metrics"))
                series.append((time.monotonic() - started, samples))
                next_scrape += 2
            time.sleep(rng.uniform(0.05, 0.25))
    finally:
        agent.terminate()
        agent.wait(timeout=20)
        log.close()
    return series


def draw(series: list[tuple[float, Samples]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t for t, _ in series]
    rows = (len(PANELS) + 1) // 2
    plt.style.use("dark_background")
    fig, axes = plt.subplots(rows, 2, figsize=(16, 3.4 * rows), facecolor="#111217")
    for ax, (title, unit, targets) in zip(axes.flat, PANELS):
        ax.set_facecolor("#181b1f")
        drawn = 0
        for template, expr in targets:
            for labels, values in sorted(promql.evaluate(promql.parse(expr), series).items()):
                if any(v == v and v != 0 for v in values):  # not all NaN or zero
                    ax.plot(times, values, linewidth=1.6, label=promql.legend(template, labels) or template)
                    drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no samples in the demo run", ha="center", va="center", color="#9fa7b3",
                    transform=ax.transAxes)  # fmt: skip
        ax.set_title(f"{title} [{unit}]", loc="left", fontsize=12, color="#d8d9da")
        ax.grid(color="#2c3235", linewidth=0.6)
        ax.tick_params(colors="#9fa7b3", labelsize=8)
        ax.set_xlabel("seconds into the demo run", fontsize=8, color="#9fa7b3")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left", frameon=False)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.set_visible(False)
    fig.suptitle(
        "dsplatform - every dashboard panel, drawn with matplotlib from a real demo run's /metrics (no Grafana here)",
        color="#d8d9da",
        fontsize=13,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))
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
