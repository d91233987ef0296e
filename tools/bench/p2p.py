"""Benchmark: 8 agents on one machine caching the same packed dataset, without and with peers.

    python tools/bench/p2p.py                     # 1,000 files of ~256 kB (~256 MB), 8 agents
    python tools/bench/p2p.py --files 4000        # bigger
    python tools/bench/p2p.py --smoke             # seconds: checks that it still runs

The bundle store is a real HTTP server on 127.0.0.1, in its own process, that counts the
bytes it sends. Each agent is a real ``dsagent serve`` process with its own cache root, unix
socket and TCP port on 127.0.0.1. Three runs, fresh roots each:

1. **without peers**: all agents are asked for the dataset at once; each reads every
   bundle from the store (8x the dataset from the store);
2. **with peers**: every agent has ``DSAGENT_PEERS`` = the others and the shared peer token.
   One agent is asked first (the dataset is new to the cluster: somebody reads it from the
   store); when it is ready, the other seven are asked at once and fetch the bundles from
   the agents that hold the version ready, falling back to the store per bundle.
3. **with peers, all at once**: the same agents, all asked at once for the new version (a
   job's pods starting together): they ask each other first, a bundle another agent is
   downloading is waited for, so each bundle is read from the store about once.

Printed: the store's bytes (bundles only, and as a multiple of the packed dataset), the time
until all agents are ready, and the peers' served/fetched bytes. Target: with
peers the store serves <= 1.5x the dataset (8x without), in both runs with peers.

The test suite runs ``--smoke`` (tests/tools/test_bench_smoke.py). Data goes under
``.bench/p2p`` (or ``--workdir``) and is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from cache import LOOPBACK, generate  # the same image-like dataset as the cache benchmark (this directory)

from dsagent.api.client import AgentClient
from dsagent.errors import AgentUnreachable
from dsagent.format.bundles.bundle import pack
from dsplatform.units import format_size, parse_size
from tools.support.harness import held_ports

PEER_TOKEN = "bench-peer-token-0123456789abcdef"

# --------------------------------------------------------------------------- the store


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    """Files of one directory with byte ranges; counts the body bytes it sends.
    ``GET /__bytes`` answers ``<all bytes> <bundle bytes>``; ``POST /__reset`` zeroes them."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    sent: ClassVar[list[int]] = [0, 0]
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _count(self, n: int) -> None:
        with self.lock:
            self.sent[0] += n
            if "/bundles/" in self.path:
                self.sent[1] += n

    def do_POST(self) -> None:
        with self.lock:
            self.sent[:] = [0, 0]
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path == "/__bytes":
            with self.lock:
                body = f"{self.sent[0]} {self.sent[1]}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            super().do_GET()
            return
        size = path.stat().st_size
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        start, end = 0, size - 1
        if match is not None:
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(path, "rb") as fh:
            fh.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = fh.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                self._count(len(chunk))
                remaining -= len(chunk)


def serve(directory: Path) -> None:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _CountingHandler(*a, directory=str(directory))
    )
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def start_store(directory: Path) -> tuple[str, subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(directory)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    base = process.stdout.readline().strip()
    if not base.startswith("http://127.0.0.1:"):
        process.kill()
        raise SystemExit(f"the store server did not start (exit {process.wait()})")
    return base, process


def store_bytes(base: str) -> tuple[int, int]:
    import httpx

    every, bundles = httpx.get(f"{base}/__bytes").text.split()
    return int(every), int(bundles)


def reset_store(base: str) -> None:
    import httpx

    httpx.post(f"{base}/__reset")


# --------------------------------------------------------------------------- agents


class Agent:
    def __init__(self, work: Path, index: int, port: int) -> None:
        self.root = work / f"agent{index}"
        self.socket = work / f"a{index}.sock"
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"agent{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        args = [sys.executable, "-m", "dsagent", "serve", "--root", str(self.root), "--socket", str(self.socket),
                "--listen", f"127.0.0.1:{self.port}", "--log-level", "warning"]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                env={**os.environ, "DSAGENT_EGRESS_ALLOW": ",".join(LOOPBACK), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SystemExit(f"an agent exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            if self.socket.exists():
                try:
                    with AgentClient(socket_path=self.socket, timeout=5) as client:
                        if client.health():
                            return
                except AgentUnreachable:
                    pass
            time.sleep(0.05)
        raise SystemExit(f"an agent did not start:\n{self.log.read_text()[-2000:]}")

    def cache(self, store: str) -> float:
        """Ask for the dataset and wait until it is ready; the seconds it took."""
        started = time.perf_counter()
        with AgentClient(socket_path=self.socket, timeout=3600) as client:
            client.submit_task("bench", [{"name": "imgs", "source": f"{store}/imgs", "bundles": f"{store}/store"}])
            while True:
                record = client.get_task("bench")
                if record["state"] != "pending":
                    break
                time.sleep(0.02)
        if record["state"] != "ready":
            raise SystemExit(f"an agent failed: {record['datasets'][0].get('error')}\n{self.log.read_text()[-2000:]}")
        return time.perf_counter() - started

    def peer_bytes(self) -> tuple[float, float]:
        with AgentClient(socket_path=self.socket) as client:
            text = client.metrics()
        found = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r'dsplatform_agent_peer_bytes_total\{direction="(\w+)"\} (\S+)', text)
        }
        return found.get("served", 0.0), found.get("fetched", 0.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def run(work: Path, store: str, count: int, *, peers: bool, workers: int, seed: bool = True) -> dict[str, Any]:
    """One run: ``count`` fresh agents cache the dataset; with ``peers`` and ``seed``, one first."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hold = contextlib.ExitStack()  # the agents list each other: each port held until its agent listens
    agents = [Agent(work, i, port) for i, port in enumerate(hold.enter_context(held_ports(count)))]
    try:
        for agent in agents:
            env = {
                "DSAGENT_SWEEP_INTERVAL": "3600",
                "DSAGENT_FETCH_WORKERS": str(workers),
                "DSAGENT_NODE_NAME": agent.root.name,
            }
            if peers:
                env |= {
                    "DSAGENT_PEER_TOKEN": PEER_TOKEN,
                    "DSAGENT_PEERS": ",".join(a.url for a in agents if a is not agent),
                    # seven agents ask one holder at once: let it serve them all
                    "DSAGENT_PEER_MAX_UPLOADS": str(count * workers),
                    "DSAGENT_PEER_MAX_UPLOADS_PER_PEER": str(workers),
                }
            agent.start(env)
        for agent in agents:
            agent.wait_up()
        hold.close()
        reset_store(store)
        started = time.perf_counter()
        first = None
        if peers and seed:
            first = agents[0].cache(store)
            rest = agents[1:]
        else:
            rest = agents
        with ThreadPoolExecutor(len(rest)) as pool:
            list(pool.map(lambda a: a.cache(store), rest))
        elapsed = time.perf_counter() - started
        every, bundles = store_bytes(store)
        traffic = [a.peer_bytes() for a in agents]
        return {"seconds": elapsed, "first": first, "store": every, "store_bundles": bundles,
                "served": sum(t[0] for t in traffic), "fetched": sum(t[1] for t in traffic)}  # fmt: skip
    finally:
        hold.close()
        for agent in agents:
            agent.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mean-kb", type=float, default=256.0)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4, help="fetch workers per agent")
    parser.add_argument(
        "--max-bytes", default="32MB", help="bytes per bundle (the default 800MB would make one bundle here)"
    )
    parser.add_argument("--workdir", type=Path, default=Path(".bench/p2p"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 80 small files, 3 agents")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return
    if args.smoke:
        args.files, args.mean_kb, args.agents, args.max_bytes = 80, 16.0, 3, "200kB"

    work = args.workdir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    (work / "www").mkdir(parents=True)
    server = None
    try:
        print(f"generating {args.files:,} files (~{args.mean_kb:g} kB) ...", flush=True)
        total = generate(work / "www" / "imgs", args.files, args.mean_kb, classes=50)
        manifest = pack(
            work / "www" / "imgs", work / "www" / "store", name="imgs", max_bytes=parse_size(args.max_bytes)
        )
        packed = sum(b.compressed_size for b in manifest.bundles)
        store, server = start_store(work / "www")
        alone = run(work / "run", store, args.agents, peers=False, workers=args.workers)
        shared = run(work / "run", store, args.agents, peers=True, workers=args.workers)
        together = run(work / "run", store, args.agents, peers=True, workers=args.workers, seed=False)

        print(f"\ndataset: {args.files:,} files, {format_size(total)}, {len(manifest.bundles)} bundles, "
              f"{format_size(packed)} packed; "
              f"{args.agents} agents on 127.0.0.1, {args.workers} fetch workers each; "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        print(f"{'':<16} {'all ready':>10} {'store (bundles)':>18} {'x dataset':>10} {'peers served':>14}")
        for label, result in (("without peers", alone), ("with peers", shared), ("peers, at once", together)):
            print(f"{label:<16} {result['seconds']:>8.2f} s {format_size(result['store_bundles']):>18} "
                  f"{result['store_bundles'] / packed:>9.2f}x {format_size(int(result['served'])):>14}")  # fmt: skip
        print(f"with peers: the first agent (from the store) took {shared['first']:.2f} s, "
              f"the other {args.agents - 1} (from peers) {shared['seconds'] - shared['first']:.2f} s")  # fmt: skip
        ratio = max(shared["store_bundles"], together["store_bundles"]) / packed
        print(
            f"target: the store serves <= 1.5x the dataset with peers: {ratio:.2f}x at most "
            f"({'met' if ratio <= 1.5 else 'NOT met'})"
        )
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
