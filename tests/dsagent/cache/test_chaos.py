"""Chaos. A real agent is killed (-9) at random points over many seeds while it
caches, releases and evicts; after every restart nothing it reports ready is anything
but a verified copy of its dataset, and in the end every task's datasets become ready.

Seeds are fixed (reproducible); each run is a few seconds on a real HTTP bundle store.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from dsagent.format.bundles.bundle import verify_tree
from dsagent.format.manifest import Manifest
from tests.dsagent.cli.test_agent_process import packed
from tools.support.harness import AgentProcess, LoopbackServer, allocated, wait_ready

SEEDS = range(8)


def check_nothing_wrong_is_ready(client: Any, manifests: dict[str, Manifest]) -> None:
    for view in client.datasets()["datasets"]:
        if view["state"] == "ready":
            manifest = manifests[view["name"]]
            assert view["digest"] == manifest.digest, view
            verify_tree(Path(view["path"]), manifest)


@pytest.mark.slow
def test_kill_9_at_random_points_never_leaves_anything_wrong_ready(
    tmp_path: Path, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    datasets, manifests = {}, {}
    for i, name in enumerate(("alpha", "beta", "gamma")):
        _, datasets[name], manifests[name] = packed(www, url, name, files=16, size=6000, seed=i, max_files=2)
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.05)
    root = tmp_path / "agent"
    on_disk = sum(allocated(m.total_bytes, m.file_count, root) for m in manifests.values())
    env = {"DSAGENT_FETCH_WORKERS": "2", "DSAGENT_CAPACITY": str(2 * on_disk)}  # room for all three twice
    tasks: dict[str, list[str]] = {}
    for seed in SEEDS:
        rng = random.Random(seed)
        agent = AgentProcess(root, env=env).start()
        try:
            with agent.client() as client:
                check_nothing_wrong_is_ready(client, manifests)
                for _ in range(rng.randint(1, 3)):
                    action = rng.random()
                    if action < 0.6 or not tasks:
                        task = f"task-{seed}-{rng.randint(0, 99)}"
                        names = rng.sample(sorted(datasets), rng.randint(1, 2))
                        tasks.setdefault(task, names)
                        client.submit_task(task, [datasets[n] for n in tasks[task]])
                    elif action < 0.8:
                        task = rng.choice(sorted(tasks))
                        client.release_task(task)
                        tasks.pop(task)
                    else:
                        client.evict(mode="unused")
                time.sleep(rng.uniform(0.0, 0.5))
                check_nothing_wrong_is_ready(client, manifests)
        finally:
            agent.kill9()
    agent = AgentProcess(root, env=env).start()
    try:
        with agent.client() as client:
            check_nothing_wrong_is_ready(client, manifests)
            for task, names in tasks.items():  # pods repeat their requests after a restart
                client.submit_task(task, [datasets[n] for n in names])
                record = wait_ready(client, task)
                assert record["state"] == "ready", record
                for status in record["datasets"]:
                    verify_tree(Path(status["path"]), manifests[status["name"]])
            check_nothing_wrong_is_ready(client, manifests)
    finally:
        agent.stop()
