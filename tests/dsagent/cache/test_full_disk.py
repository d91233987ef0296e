"""A full disk is a state, not a wedge; a resumed fetch counts
its own staged bytes once.

A real ``dsagent serve`` whose cache root is a small tmpfs mounted for the test (root
only; skipped otherwise), real local sources.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.support.harness import ADMIN_TOKEN


@pytest.fixture
def small_disk(small_tmpfs: Callable[[str], Path]) -> Path:
    """A 24 MiB tmpfs (4 KiB blocks), unmounted afterwards."""
    return small_tmpfs("24m")


def many_small_files(root: Path, count: int, size: int) -> Path:
    for i in range(count):
        directory = root / f"d{i % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{i:05d}").write_bytes(os.urandom(size))
    return root


def fill(path: Path) -> None:
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * (64 << 10))
                filler.flush()
        except OSError:
            pass


def put(http: httpx.Client, task: str, name: str, source: Path, wait: float = 60) -> httpx.Response:
    return http.put(f"/v1/tasks/{task}?wait={wait}", json={"datasets": [{"name": name, "source": str(source)}]})


def test_files_are_accounted_in_blocks_and_a_full_disk_loses_nothing(
    small_disk: Path, agent_factory: Any, tmp_path: Path
) -> None:
    # 6,000 files of 512 B: 3 MB of bytes, ~24 MB of 4 KiB blocks: more than the disk
    many = many_small_files(tmp_path / "src" / "many", 6000, 512)
    few = many_small_files(tmp_path / "src" / "few", 10, 2000)
    agent = agent_factory(tcp=True, env={"DSAGENT_ROOT": str(small_disk / "cache")}, local_sources=(tmp_path / "src",))
    agent.args[agent.args.index("--root") + 1] = str(small_disk / "cache")
    agent.stop()
    agent.start()
    free_before = shutil.disk_usage(small_disk).free
    with httpx.Client(base_url=agent.url, timeout=120, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        record = put(http, "many", "many", many).json()
        assert record["state"] == "failed", record
        assert record["datasets"][0]["error"]["code"] == "insufficient_space", record
        assert not any((small_disk / "cache" / "staging").rglob("*")), "partial staging was left"
        # nothing of the failed copy stays; the stat-keyed digest cache of the local source
        # (digests.db and its WAL) may keep what it learned, and is only a cache
        learned = sum(p.stat().st_size for p in (small_disk / "cache").glob("digests.db*"))
        assert shutil.disk_usage(small_disk).free >= free_before - (1 << 20) - learned
        # the agent still works: a small dataset is cached, a repeat of the big one fails the same way
        assert put(http, "few", "few", few).json()["state"] == "ready"
        again = put(http, "many-2", "many", many)
        assert again.status_code == 200 and again.json()["datasets"][0]["error"]["code"] == "insufficient_space"


def test_the_agent_starts_answers_and_evicts_on_a_full_disk(
    small_disk: Path, agent_factory: Any, tmp_path: Path
) -> None:
    few = many_small_files(tmp_path / "src" / "few", 10, 2000)
    other = many_small_files(tmp_path / "src" / "other", 10, 3000)
    agent = agent_factory(tcp=True, local_sources=(tmp_path / "src",))
    agent.stop()
    agent.args[agent.args.index("--root") + 1] = str(small_disk / "cache")
    agent.start()
    with httpx.Client(base_url=agent.url, timeout=120, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        assert put(http, "few", "few", few).json()["state"] == "ready"
        assert http.delete("/v1/tasks/few").status_code == 200
    agent.stop()
    fill(small_disk / "filler")  # someone else filled the disk
    agent.start()  # starts on a full disk (its catalog's reserve makes room for it)
    fill(small_disk / "filler-2")  # and whatever that freed is taken too
    with httpx.Client(base_url=agent.url, timeout=120, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        answer = put(http, "other", "other", other)
        assert answer.status_code in (200, 507), answer.text
        body = answer.json()
        code = body.get("code") or body["datasets"][0]["error"]["code"]
        assert code == "insufficient_space", body
        evicted = http.post("/v1/evict", json={"mode": "unused"})
        assert evicted.status_code == 200, evicted.text
        assert [v["name"] for v in evicted.json()["evicted"]] == ["few"]
        assert http.get("/readyz").status_code == 200
        (small_disk / "filler").unlink()
        (small_disk / "filler-2").unlink()
        time.sleep(0.1)
        assert put(http, "other-2", "other", other).json()["state"] == "ready"
