"""A fetch that runs out of disk mid-way, then the same request once
space is free, must never publish a partial dataset.

A real ``dsagent serve`` whose cache root is a small tmpfs (root only; skipped otherwise),
a real HTTP bundle store of tar+zstd bundles, a multi-bundle dataset. The disk is filled
by another writer while bundles are being unpacked.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dsagent.format.bundles.bundle import verify_tree
from tests.dsagent.cache.test_full_disk import fill, small_disk  # noqa: F401 - the fixture
from tests.dsagent.cli.test_agent_process import packed
from tools.support.harness import AgentProcess, LoopbackServer


def test_a_full_disk_mid_fetch_then_a_retry_never_publishes_a_partial_dataset(
    small_disk: Path,  # noqa: F811 - the fixture
    agent_factory: Any,
    loopback: tuple[Path, str, LoopbackServer],
) -> None:
    www, url, server = loopback
    _, dataset, manifest = packed(www, url, "images", files=60, size=20_000, max_files=5)
    assert len(manifest.bundles) >= 10
    server.slow_down(lambda p: p.startswith("/store/bundles/"), 0.25)  # the disk fills mid-fetch
    agent = _agent_on(agent_factory, small_disk)
    with agent.client() as client:
        client.submit_task("pod-a", [dataset])
        deadline = time.monotonic() + 60
        while client.get_task("pod-a")["datasets"][0]["filesDone"] < 15 and time.monotonic() < deadline:
            time.sleep(0.02)
        fill(small_disk / "filler")  # someone else takes the rest of the disk
        record = _settled(client, "pod-a")
        assert record["state"] == "failed", record
        assert record["datasets"][0]["error"]["code"] == "insufficient_space", record
        (small_disk / "filler").unlink()
        again = client.submit_task("pod-a", [dataset], wait=60)  # the same request, with room again
        assert again["state"] == "ready", again
        verify_tree(Path(again["datasets"][0]["path"]), manifest)  # every file, whole
        assert not any((small_disk / "cache" / "staging").iterdir()), "staging was left behind"


def _agent_on(agent_factory: Any, disk: Path) -> AgentProcess:
    agent: AgentProcess = agent_factory(env={"DSAGENT_FETCH_WORKERS": "2"})
    agent.stop()
    agent.args[agent.args.index("--root") + 1] = str(disk / "cache")
    return agent.start()


def _settled(client: Any, task_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        record: dict[str, Any] = client.get_task(task_id)
        if record["state"] != "pending" or time.monotonic() > deadline:
            return record
        time.sleep(0.05)
