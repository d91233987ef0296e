"""Benchmark the scheduler extender's prioritize verb over HTTP on 127.0.0.1.

For 100, 1,000 and 5,000 nodes, in both kube-scheduler modes:

- ``full``:  ``nodeCacheCapable: false``, whole Node objects in every request;
- ``names``: ``nodeCacheCapable: true``, node names only, served from the watch cache
  (the extender lists and watches a fake API server holding the same nodes);

it sends sequential prioritize requests the way kube-scheduler does (one pod at a time,
a keep-alive connection), and prints p50 / p99 latency and requests per second next to
the floor: the bare cost of ``json.loads`` of the same request body in this process.
It also prints the extender process's CPU time per request (user + system, from
``/proc/<pid>/stat``, "-" where there is none): on a shared, loaded machine latency
includes waiting for a core, CPU time does not, so it is the figure to compare between
two runs there. The load average at the start and the end is printed too.

The client is a few lines of HTTP/1.1 over a socket that writes each request with
``sendall``, as Go's transport does. httpx is not used for the requests: its sync
transport re-slices the unsent rest of the body after every ``send()``, which costs
more than the extender itself on a 48 MiB body (``--client httpx`` shows it).

The extender runs as its own process (``python -m scheduler_plugin``), as in a cluster.
Nodes look like real GPU nodes: kubelet's status (conditions, images, nodeInfo) and the
free-GPU annotation, each with its ``NodeCache`` holding an inventory of ``--datasets``
cached datasets and the two-class 8-GPU topology, as this release's agents publish them
(docs/design.md#node-state; ``--annotations``: on the Node instead, as agents of the
release before wrote them). Between requests ``--churn`` of the nodes change (new
resourceVersion and free GPUs), like nodes whose agents republish.

    .venv/bin/python tools/bench/extender.py                         # full run
    .venv/bin/python tools/bench/extender.py --nodes 100,1000 --requests 20   # quick
    .venv/bin/python tools/bench/extender.py --nodes 15000 --modes names \
        --json docs/results/performance/extender-names-15k.json       # the published figures
    .venv/bin/python tools/bench/extender.py --smoke                  # seconds: checks that it runs

Targets: p99 <= 10 ms at 100 nodes; at 5,000 nodes <= 100 ms with full Node
objects and <= 20 ms names-only; at 15,000 nodes names-only p50 <= 5 ms and p99 <= 10 ms
(``--json`` records each as a headroom, the target over the measured figure: >= 1 meets
it). kube-scheduler's default ``percentageOfNodesToScore`` sends far fewer names at 15,000
nodes (5%: 750); the figures here are for a scheduler set to score every node. The test
suite runs ``--smoke`` (100 nodes, 20 requests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from scheduler_plugin.testing import args_body, holding, inventory_json, node, pod, topology_json  # noqa: E402
from tools.bench.support.record import Record  # noqa: E402
from tools.support.fake_apiserver import FakeApiServer, make_nodecache  # noqa: E402
from tools.support.harness import held_port  # noqa: E402

#: the targets ``--json`` records (milliseconds), by (mode, nodes, percentile)
TARGETS_MS = {
    ("names", 100, "p99"): 10.0,
    ("full", 100, "p99"): 10.0,
    ("full", 5000, "p99"): 100.0,
    ("names", 5000, "p99"): 20.0,
    ("names", 15000, "p50"): 5.0,
    ("names", 15000, "p99"): 10.0,
}

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: fake, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]
current-context: fake
"""


def make_nodes(
    count: int, datasets: int, seed: int = 7, *, nodecaches: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """``count`` GPU nodes; with ``nodecaches`` (a list to fill) the inventory and topology go
    into one ``NodeCache`` per node there instead of the Node's annotations."""
    rng = random.Random(seed)
    topology = topology_json()
    names = [f"ds-{i:03d}" for i in range(datasets * 4)]
    nodes = []
    for i in range(count):
        held = {
            n: holding(f"{abs(hash(n)) % 16**32:032x}", size=rng.randint(1, 500) << 30)
            for n in rng.sample(names, datasets)
        }
        free = sorted(rng.sample(range(8), rng.randint(0, 8)))
        name = f"gpu-node-{i:05d}"
        inventory = inventory_json(name, held)
        if nodecaches is not None:
            nodecaches.append(
                make_nodecache(name, inventory=inventory, topology=topology, published_at="2026-11-21T10:00:00Z")
            )
            nodes.append(node(name, free_gpus=free, resource_version=str(1000 + i)))
        else:
            nodes.append(
                node(name, inventory=inventory, topology=topology, free_gpus=free, resource_version=str(1000 + i))
            )
    return nodes


def churn(nodes: list[dict[str, Any]], fraction: float, rng: random.Random, version: int) -> None:
    for index in rng.sample(range(len(nodes)), int(len(nodes) * fraction)):
        meta = nodes[index]["metadata"]
        meta["resourceVersion"] = str(version * 100_000 + index)
        meta["annotations"]["dsagent.io/free-gpus"] = ",".join(
            map(str, sorted(rng.sample(range(8), rng.randint(0, 8))))
        )


def request_pod(i: int, names: list[str]) -> dict[str, Any]:
    # Jobs of four workers, each asking for 4 GPUs and two different datasets (a request
    # naming one dataset twice is invalid, and the extender would not score it).
    first = i % len(names)
    second = (first + 1 + (i * 7) % (len(names) - 1)) % len(names)
    wanted = [{"name": n, "source": f"s3://datasets/{n}"} for n in (names[first], names[second])]
    return pod(f"job-{i // 4}-worker-{i % 4}", datasets=wanted, gpus=4, job=f"job-{i // 4}")


#: what the extender logs for a request it could not score (scheduler_plugin.app, .framework)
UNSCORED = ("scoring it as unparseable", "prioritize:", "filter:", "failed")


def unscored(log_text: str) -> list[str]:
    """The extender's log lines that say a request was not scored as asked."""
    return [line for line in log_text.splitlines() if any(mark in line for mark in UNSCORED)]


def start_extender(kubeconfig: Path, port: int, log: Any = None) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DSEXT_HOST": "127.0.0.1",
        "DSEXT_PORT": str(port),
        "DSEXT_WATCH": "1",
        "DSEXT_KUBECONFIG": str(kubeconfig),
        "DSEXT_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen([sys.executable, "-m", "scheduler_plugin"], env=env, cwd=ROOT, stderr=log, stdout=log)


def wait_ready(http: httpx.Client, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("extender did not become ready")


class Connection:
    """One keep-alive HTTP/1.1 connection: a request is written with ``sendall`` (headers,
    then the body), the reply read by its Content-Length. Enough for the extender."""

    def __init__(self, port: int, timeout: float = 120) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go sets it
        self.reader = self.sock.makefile("rb")
        self.host = f"127.0.0.1:{port}"

    def post(self, path: str, body: bytes) -> bytes:
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        self.sock.sendall(body)
        status = self.reader.readline().split(b" ", 2)
        length = None
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise SystemExit(f"reply to POST {path} has no Content-Length")
        reply = self.reader.read(length)
        if len(status) < 2 or status[1] != b"200":
            raise SystemExit(f"POST {path}: {b' '.join(status).decode().strip()}: {reply[:200]!r}")
        return reply

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class HttpxConnection:
    """The same through httpx, to compare clients (``--client httpx``)."""

    def __init__(self, port: int) -> None:
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)

    def post(self, path: str, body: bytes) -> bytes:
        response = self.http.post(path, content=body, headers={"Content-Type": "application/json"})
        response.raise_for_status()
        return response.content

    def close(self) -> None:
        self.http.close()


def measure(conn: Connection | HttpxConnection, bodies: list[bytes], requests: int) -> tuple[list[float], float]:
    latencies = []
    for body in bodies[:2]:  # warm-up: first parse of every node
        reply = conn.post("/prioritize", body)
    # The nodes' datasets and topology (in their NodeCaches by default) must have been read:
    # a reply of zeros only would time an extender that scores nothing.
    if not any(item["Score"] for item in json.loads(reply)):
        raise SystemExit("every node scored 0: the extender did not read the nodes' inventories and topology")
    started = time.perf_counter()
    for i in range(requests):
        t0 = time.perf_counter()
        conn.post("/prioritize", bodies[i % len(bodies)])
        latencies.append(time.perf_counter() - t0)
    return latencies, requests / (time.perf_counter() - started)


def floor(bodies: list[bytes], repeat: int) -> float:
    times = []
    for i in range(repeat):
        body = bodies[i % len(bodies)]
        t0 = time.perf_counter()
        json.loads(body)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used so far, or None without ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--modes", default="full,names", help="full, names or both")
    parser.add_argument("--requests", type=int, default=200, help="prioritize requests per size and mode")
    parser.add_argument("--datasets", type=int, default=20, help="datasets cached per node")
    parser.add_argument(
        "--churn", type=float, default=0.01, help="fraction of nodes changed between requests (full mode)"
    )
    parser.add_argument("--port", type=int, default=0, help="the extender's port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--workdir", type=Path, help="where the kubeconfig goes (default: a temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 100 nodes, 20 requests per mode")
    parser.add_argument(
        "--annotations",
        action="store_true",
        help="inventory and topology on the Node (agents of the release before), not in NodeCaches",
    )
    parser.add_argument("--json", type=Path, help="write the results here (tools/bench/support/record.py)")
    parser.add_argument(
        "--client",
        choices=("socket", "httpx"),
        default="socket",
        help="HTTP client sending the requests (httpx adds its own cost on big bodies)",
    )
    opts = parser.parse_args()
    if opts.smoke:
        opts.nodes, opts.requests = "100", 20
    hold = contextlib.ExitStack()
    if opts.port == 0:
        opts.port = hold.enter_context(held_port())  # nobody else's until the extender listens on it
    sizes = [int(s) for s in opts.nodes.split(",")]
    modes = opts.modes.split(",")
    nodecaches: list[dict[str, Any]] | None = None if opts.annotations else []
    nodes = make_nodes(max(sizes), opts.datasets, nodecaches=nodecaches)
    record = Record(
        "extender",
        {
            "nodes": sizes,
            "modes": modes,
            "requests": opts.requests,
            "datasets_per_node": opts.datasets,
            "churn": opts.churn,
            "layout": "annotations" if opts.annotations else "nodecache",
            "client": opts.client,
        },
    )
    dataset_names = [f"ds-{i:03d}" for i in range(opts.datasets * 4)]
    rng = random.Random(11)
    print(
        f"# {max(sizes)} nodes, {opts.datasets} datasets each, {opts.requests} requests per cell, "
        f"node object ~{len(json.dumps(nodes[0])) // 1024} KiB"
        f"{'' if nodecaches is None else f' + NodeCache ~{len(json.dumps(nodecaches[0])) // 1024} KiB'}, "
        f"{opts.client} client"
    )
    print(f"# load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(
        f"{'mode':6} {'nodes':>6} {'body MiB':>9} {'json.loads':>11} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} {'p50/floor':>10} {'CPU ms/req':>11}"
    )
    with FakeApiServer() as api, tempfile.TemporaryDirectory(dir=opts.workdir) as tmp:
        for obj in nodes:
            created = {"kind": "Node", "apiVersion": "v1", **obj}
            created["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
            api.create(created)
        for cache in nodecaches or ():
            api.create(cache)
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG.format(url=api.url))
        log_path = Path(tmp) / "extender.log"
        log_file = log_path.open("wb")
        server = start_extender(kubeconfig, opts.port, log_file)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{opts.port}", timeout=120) as http:
                wait_ready(http)
            hold.close()
            conn = Connection(opts.port) if opts.client == "socket" else HttpxConnection(opts.port)
            try:
                for mode in modes:
                    for size in sizes:
                        bodies = []
                        for variant in range(8 if size <= 1000 else 3):
                            subset = nodes[:size]
                            if mode == "full" and opts.churn:
                                churn(subset, opts.churn, rng, variant + 1)
                            bodies.append(
                                args_body(
                                    request_pod(variant, dataset_names), subset, node_cache_capable=(mode == "names")
                                )
                            )
                        base = floor(bodies, max(5, min(opts.requests, 50)))
                        cpu_before = cpu_seconds(server.pid)
                        latencies, rps = measure(conn, bodies, opts.requests)
                        cpu_after = cpu_seconds(server.pid)
                        # the warm-up requests (two) ran inside the window too
                        cpu_per_request = (
                            (cpu_after - cpu_before) / (opts.requests + 2)
                            if cpu_before is not None and cpu_after is not None
                            else None
                        )
                        cpu = f"{cpu_per_request * 1e3:>11.2f}" if cpu_per_request is not None else f"{'-':>11}"
                        p50, p99 = pct(latencies, 0.5), pct(latencies, 0.99)
                        load = os.getloadavg()[0]
                        for name, value in (("p50", p50), ("p99", p99)):
                            record.row(
                                f"prioritize {mode} {size} nodes",
                                name,
                                value,
                                cpu_per_request,
                                mode=mode,
                                nodes=size,
                                body_bytes=len(bodies[0]),
                                requests_per_s=rps,
                                load=load,
                            )
                            target = TARGETS_MS.get((mode, size, name))
                            if target is not None:
                                record.ratio(
                                    f"extender prioritize {name} at {size:,} nodes ({mode}): {target:g} ms / measured",
                                    target / (value * 1e3),
                                    1.0,
                                    f"{value * 1e3:.2f} ms; extender CPU {cpu.strip()} ms/request; load {load:.2f}",
                                )
                        print(
                            f"{mode:6} {size:>6} {len(bodies[0]) / 2**20:>9.2f} {base * 1e3:>9.2f}ms "
                            f"{p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f} {rps:>7.1f} {p50 / base:>9.1f}x {cpu}",
                            flush=True,
                        )
            finally:
                conn.close()
        finally:
            hold.close()
            server.terminate()
            server.wait(10)
            log_file.close()
            log_text = log_path.read_text(errors="replace")
        sys.stderr.write(log_text)
        refused = unscored(log_text)
    print(f"# load average at the end: {os.getloadavg()[0]:.2f}")
    record.write(opts.json)
    if refused:
        raise SystemExit(f"the extender could not score {len(refused)} request(s): {refused[:3]}")


if __name__ == "__main__":
    main()
