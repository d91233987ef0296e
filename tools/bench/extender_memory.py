"""Benchmark the scheduler extender's peak memory on big ``Nodes`` requests.

kube-scheduler with ``nodeCacheCapable: false`` sends every candidate Node object in
every filter and prioritize request: about 48 MiB at 5,000 GPU nodes. This measures the
peak resident memory (``VmHWM`` of ``/proc/<pid>/status``) of the extender process
(``python -m scheduler_plugin``, stateless, as in a cluster) while it answers such
requests, for each body layout it accepts:

- ``go``:        exactly what kube-scheduler's ``json.Marshal`` writes (the fast path);
- ``spaced``:    the same document with ``", "`` / ``": "`` separators (another client);
- ``reordered``: ``NodeNames`` first, each Node with ``kind``/``apiVersion`` before its
  ``metadata``, 2-space indentation;

each for ``filter`` (whose reply echoes the passing Node objects) and ``prioritize``.
Each cell is a fresh extender process that answers three requests as kube-scheduler
would send them: the body, the body with ``--churn`` of its nodes changed (new
resourceVersions), the body again. Every reply is checked (200, the right shape, every
node scored or passed).

Baselines from the same run: the body size, the idle extender (after start-up), and the
peak of a fresh interpreter that does nothing but read the same body and ``json.loads``
it (what any Python consumer of that body pays at least).

    .venv/bin/python tools/bench/extender_memory.py                     # 5,000 nodes (~48 MiB)
    .venv/bin/python tools/bench/extender_memory.py --nodes 1000        # quicker
    .venv/bin/python tools/bench/extender_memory.py --smoke             # seconds: checks that it runs

Target: the extender's peak under 256 MB (244 MiB) at 5,000 nodes in every
layout and verb. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scheduler_plugin.testing import args_body, pod  # noqa: E402
from tools.bench.extender import Connection, churn, make_nodes  # noqa: E402
from tools.support.harness import held_port  # noqa: E402

MIB = 1 << 20
LAYOUTS = ("go", "spaced", "reordered")
VERBS = ("filter", "prioritize")
TARGET_BYTES = 256 * 1000 * 1000  # the goal: 256 MB


def body_in(layout: str, pod_obj: dict[str, Any], nodes: list[dict[str, Any]]) -> bytes:
    """The ExtenderArgs of ``nodes`` in one of the layouts the extender accepts."""
    if layout == "go":
        return args_body(pod_obj, nodes, node_cache_capable=False)
    doc: dict[str, Any] = {"Pod": pod_obj, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    if layout == "spaced":
        return json.dumps(doc).encode()
    reordered = [{"kind": "Node", "apiVersion": "v1", **n} for n in nodes]
    doc = {"NodeNames": None, "Pod": pod_obj, "Nodes": {"items": reordered, "metadata": {}}}
    return json.dumps(doc, indent=2).encode()


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    return _status_field(pid, "VmHWM")


def rss(pid: int) -> int:
    return _status_field(pid, "VmRSS")


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/{pid}/status has no {name}")


def json_loads_peak(path: Path) -> int:
    """Peak RSS of a fresh interpreter that reads ``path`` and parses it with json.loads."""
    # VmHWM, not ru_maxrss: the latter survives exec, so it would count the forked bench's pages
    code = (
        "import json, sys\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "doc = json.loads(data)\n"
        "print(open('/proc/self/status').read())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status")


def start_extender(port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DSEXT_HOST": "127.0.0.1",
        "DSEXT_PORT": str(port),
        "DSEXT_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen([sys.executable, "-m", "scheduler_plugin"], env=env, cwd=ROOT)


def wait_healthy(port: int, server: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the extender exited with {server.returncode} before answering")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the extender did not answer /healthz")


def check_reply(verb: str, reply: bytes, names: list[str]) -> None:
    """The reply answers every node: a filter result in Nodes mode, or a score per node."""
    doc = json.loads(reply)
    if verb == "filter":
        if doc.get("Error") or doc.get("NodeNames") is not None:
            raise SystemExit(f"filter failed: {str(doc.get('Error'))[:200]}")
        passed = [n["metadata"]["name"] for n in (doc.get("Nodes") or {}).get("items") or ()]
        failed = set(doc.get("FailedNodes") or {}) | set(doc.get("FailedAndUnresolvableNodes") or {})
        if set(passed) | failed != set(names):
            raise SystemExit("filter reply does not account for every node")
    elif [h["Host"] for h in doc] != names:
        raise SystemExit("prioritize reply does not score every node in order")


def measure(layout: str, verb: str, bodies: list[bytes], names: list[str]) -> tuple[int, int]:
    """(idle RSS, peak RSS) of a fresh extender answering ``bodies`` on ``verb``."""
    hold = contextlib.ExitStack()
    port = hold.enter_context(held_port())  # nobody else's until the extender listens on it
    server = start_extender(port)
    try:
        wait_healthy(port, server)
        hold.close()
        idle = rss(server.pid)
        conn = Connection(port, timeout=600)
        try:
            for body in bodies:
                check_reply(verb, conn.post(f"/{verb}", body), names)
        finally:
            conn.close()
        return idle, peak_rss(server.pid)
    finally:
        hold.close()
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="Node objects per request (5,000: ~48 MiB)")
    parser.add_argument("--datasets", type=int, default=20, help="datasets cached per node")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--verbs", default=",".join(VERBS), help="filter, prioritize or both")
    parser.add_argument("--churn", type=float, default=0.01, help="fraction of nodes changed in the second request")
    parser.add_argument("--workdir", type=Path, help="where the body files go (default: a temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 100 nodes, the go layout and one other")
    opts = parser.parse_args()
    if sys.platform != "linux":
        raise SystemExit("extender_memory reads /proc/<pid>/status: Linux only")
    layouts, verbs = opts.layouts.split(","), opts.verbs.split(",")
    if opts.smoke:
        opts.nodes, layouts = 100, ["go", "reordered"]
    nodes = make_nodes(opts.nodes, opts.datasets)
    names = [n["metadata"]["name"] for n in nodes]
    dataset_names = [f"ds-{i:03d}" for i in range(opts.datasets * 4)]
    wanted = [{"name": n, "source": f"s3://datasets/{n}"} for n in dataset_names[:2]]
    pod_obj = pod("job-0-worker-0", datasets=wanted, gpus=4, job="job-0")
    first = [json.loads(json.dumps(n)) for n in nodes]
    churn(nodes, opts.churn, random.Random(11), 1)
    second = nodes
    print(
        f"# {opts.nodes} nodes, {opts.datasets} datasets each, 3 requests per cell "
        f"({opts.churn:.0%} churn in the second); peak = VmHWM of the extender process"
    )
    print(
        f"{'layout':10} {'verb':10} {'body MiB':>9} {'json.loads MiB':>15} {'idle MiB':>9} "
        f"{'peak MiB':>9} {'peak/json.loads':>16} {'under 256 MB':>13}"
    )
    with tempfile.TemporaryDirectory(dir=opts.workdir) as tmp:
        for layout in layouts:
            bodies = [body_in(layout, pod_obj, first), body_in(layout, pod_obj, second)]
            bodies.append(bodies[0])
            path = Path(tmp) / f"{layout}.json"
            path.write_bytes(bodies[0])
            floor = json_loads_peak(path)
            for verb in verbs:
                idle, peak = measure(layout, verb, bodies, names)
                print(
                    f"{layout:10} {verb:10} {len(bodies[0]) / MIB:>9.1f} {floor / MIB:>15.1f} {idle / MIB:>9.1f} "
                    f"{peak / MIB:>9.1f} {peak / floor:>15.2f}x {'yes' if peak < TARGET_BYTES else 'NO':>13}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
