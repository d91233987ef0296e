"""Benchmark: one version fetched from a peer over one link, and over several (DSAGENT_FETCH_LINKS).

    python tools/bench/links.py                   # 400 files of ~256 kB (~100 MB), 3 links of 16 MB/s
    python tools/bench/links.py --links 4 --rate 32MB
    python tools/bench/links.py --smoke           # seconds: checks that it still runs

Two real ``dsagent serve`` processes on 127.0.0.1: ``a`` holds the dataset (read once from a
bundle store, a real HTTP server in its own process), ``b`` fetches it from ``a``. Loopback
addresses 127.0.0.2, 127.0.0.3, ... stand for the node's NICs (they all route to ``lo`` on
Linux). Loopback has no per-NIC bandwidth, so each link's is made by the serving agent's
per-peer upload cap (``DSAGENT_PEER_UPLOAD_RATE``, ``--rate``), which is kept per source
address: a link is as fast as a NIC of ``--rate`` bytes/s. Each round fetches the version
into a fresh agent twice, interleaved: over the default route (one link) and over
``--links`` bound links; the links' bytes come from the fetching agent's
``dsplatform_agent_link_bytes_total``.

Printed: per run, the time to ready and the throughput per link and in total, the median
ratio (several links / one link, ideally ``--links``) and the load average. The test suite
runs ``--smoke`` (tests/tools/test_bench_smoke.py). Data goes under ``.bench/links`` (or
``--workdir``) and is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cache import generate  # the same image-like dataset as the cache benchmark (this directory)
from p2p import PEER_TOKEN, Agent, start_store

from dsagent.api.client import AgentClient
from dsagent.errors import TransientError
from dsagent.format.bundles.bundle import pack
from dsplatform.units import format_size, parse_size
from tools.support.harness import held_ports


def wait_up(agent: Agent, timeout: float = 180.0) -> None:
    """``agent.wait_up``, patient with an agent slow to answer on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            agent.wait_up(timeout)
            return
        except TransientError:
            if time.monotonic() > deadline:
                raise


def link_bytes(agent: Agent) -> dict[str, float]:
    with AgentClient(socket_path=agent.socket) as client:
        text = client.metrics()
    found: dict[str, float] = {}
    for match in re.finditer(r'dsplatform_agent_link_bytes_total\{link="([^"]+)",source="\w+"\} (\S+)', text):
        found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


def fetcher(work: Path, index: int, port: int, holder: Agent, links: list[str], workers: int) -> Agent:
    """A fresh agent on ``port`` that fetches from ``holder`` over ``links`` (none: the default
    route), started."""
    agent = Agent(work, index, port)
    agent.start(
        {
            "DSAGENT_SWEEP_INTERVAL": "3600",
            "DSAGENT_FETCH_WORKERS": str(workers),
            "DSAGENT_NODE_NAME": f"b{index}",
            "DSAGENT_PEER_TOKEN": PEER_TOKEN,
            "DSAGENT_PEERS": holder.url,
            "DSAGENT_PEER_MAX_UPLOADS_PER_PEER": str(workers),
            "DSAGENT_FETCH_LINKS": ",".join(links),
        }
    )
    return agent


def fetch(agent: Agent, store: str, links: list[str]) -> dict[str, Any]:
    """``agent`` caches the dataset: the seconds it took, and what each link carried."""
    seconds = agent.cache(store)
    return {"seconds": seconds, "links": link_bytes(agent) if links else {}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--mean-kb", type=float, default=256.0)
    parser.add_argument("--links", type=int, default=3, help="bound links (127.0.0.2, ...)")
    parser.add_argument("--rate", default="16MB", help="bytes/s per link (the serving agent's per-address cap)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved pairs of runs (one link, several)")
    parser.add_argument("--max-bytes", default="4MB", help="bytes per bundle (many bundles, so they spread)")
    parser.add_argument("--workdir", type=Path, default=Path(".bench/links"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 36 small files, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.files, args.mean_kb, args.rate, args.rounds, args.max_bytes = 36, 16.0, "512kB", 1, "48kB"
    if not sys.platform.startswith("linux"):
        raise SystemExit("needs Linux: 127.0.0.2 and up route to lo there only")
    rate = parse_size(args.rate)
    addresses = [f"127.0.0.{2 + i}" for i in range(args.links)]
    workers = 2 * args.links  # an even spread: two bundles in flight per link

    work = args.workdir.absolute()
    shutil.rmtree(work, ignore_errors=True)
    (work / "www").mkdir(parents=True)
    server = holder = None
    agents: list[Agent] = []
    hold = contextlib.ExitStack()  # each agent's port nobody else's until it listens
    try:
        print(f"generating {args.files:,} files (~{args.mean_kb:g} kB) ...", flush=True)
        total = generate(work / "www" / "imgs", args.files, args.mean_kb, classes=20)
        manifest = pack(
            work / "www" / "imgs", work / "www" / "store", name="imgs", max_bytes=parse_size(args.max_bytes)
        )
        store, server = start_store(work / "www")
        ports = hold.enter_context(held_ports(1 + 2 * args.rounds))
        holder = Agent(work, 0, ports[0])
        holder.start(
            {
                "DSAGENT_SWEEP_INTERVAL": "3600",
                "DSAGENT_NODE_NAME": "a",
                "DSAGENT_PEER_TOKEN": PEER_TOKEN,
                "DSAGENT_PEER_UPLOAD_RATE": str(rate),
                "DSAGENT_PEER_MAX_UPLOADS": str(4 * workers),
                "DSAGENT_PEER_MAX_UPLOADS_PER_PEER": str(workers),
            }
        )
        # every fetching agent started at once (starting is slow on a loaded machine), used in turn
        plan = [([] if i % 2 == 0 else addresses) for i in range(2 * args.rounds)]
        agents = [fetcher(work, 1 + i, ports[1 + i], holder, links, workers) for i, links in enumerate(plan)]
        wait_up(holder)
        holder.cache(store)
        for agent in agents:
            wait_up(agent)
        hold.close()
        runs: list[tuple[str, dict[str, Any]]] = []
        for agent, links in zip(agents, plan):  # interleaved: one link, several, one link, ...
            runs.append(("one link" if not links else f"{args.links} links", fetch(agent, store, links)))
            agent.stop()
        load = os.getloadavg()

        print(f"\ndataset: {args.files:,} files, {format_size(total)}, {len(manifest.bundles)} bundles; "
              f"each link {format_size(rate)}/s (the holder's per-address upload cap); "
              f"{workers} fetch workers; {os.cpu_count()} CPUs")  # fmt: skip
        print(f"{'run':<10} {'ready':>9} {'total':>12}  per link")
        for label, result in runs:
            per_link = result["links"] or {"127.0.0.1": float(manifest.total_bytes)}
            links_text = "  ".join(
                f"{a} {format_size(int(n / result['seconds']))}/s" for a, n in sorted(per_link.items())
            )
            total_rate = format_size(int(manifest.total_bytes / result["seconds"]))
            print(f"{label:<10} {result['seconds']:>7.2f} s {total_rate + '/s':>12}  {links_text}")
        one = [r["seconds"] for label, r in runs if label == "one link"]
        many = [r["seconds"] for label, r in runs if label != "one link"]
        ratio = statistics.median(one) / statistics.median(many)
        spread = [r["links"] for label, r in runs if label != "one link"]
        print(f"throughput ratio ({args.links} links / one link, medians): {ratio:.2f}x (ideal {args.links}x)")
        print(f"every link carried bundles: {all(len(s) == args.links and all(s.values()) for s in spread)}")
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        hold.close()
        for agent in agents:
            agent.stop()
        if holder is not None:
            holder.stop()
        if server is not None:
            server.terminate()
            server.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
