"""After a kill -9 in the middle of a fetch, the resumed fetch counts
its own staged bytes once (they are part of the version), so a capacity that fits the
dataset once still fits it. A real agent process, a real HTTP bundle store.

"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dsagent.format.bundles.bundle import verify_tree
from tests.dsagent.cli.test_agent_process import packed
from tools.support.harness import AgentProcess, LoopbackServer, allocated, wait_ready


def test_a_resumed_fetch_counts_its_own_staged_bytes_once(
    agent_factory: Any, loopback: tuple[Path, str, LoopbackServer]
) -> None:
    www, url, server = loopback
    _, dataset, manifest = packed(www, url, "audio", files=24, size=20_000, max_files=2)
    # room for the dataset's bytes 1.6 times, plus its blocks once: enough for one copy
    # with the eviction ratio's margin, not for its staged half counted as held plus the
    # whole of it reserved again
    size = manifest.total_bytes
    capacity = int(size * 1.6) + allocated(size, manifest.file_count, www) - size
    env = {"DSAGENT_FETCH_WORKERS": "2", "DSAGENT_CAPACITY": str(capacity)}
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.4)
    agent = agent_factory(env=env)
    with agent.client() as client:
        client.submit_task("pod-a", [dataset])
        deadline = time.monotonic() + 30
        while client.get_task("pod-a")["datasets"][0]["filesDone"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get_task("pod-a")["datasets"][0]["state"] == "fetching"
    agent.kill9()
    restarted = AgentProcess(agent.root, env=env).start()
    try:
        with restarted.client() as client:
            record = wait_ready(client, "pod-a")  # resumed by the agent itself
            assert record["state"] == "ready", record
            again = client.submit_task("pod-a", [dataset], wait=30)  # and repeated by the pod
            assert again["state"] == "ready", again
            verify_tree(Path(record["datasets"][0]["path"]), manifest)
    finally:
        restarted.stop()
