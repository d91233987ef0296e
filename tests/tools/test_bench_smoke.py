"""Every benchmark in ``tools/bench/`` runs at its ``--smoke`` size, so that none rots.

The scripts are found by glob, so a new benchmark is run here without being listed, and
fails until its table line is added to ``TABLES``. Each runs as a subprocess in its own
``--workdir`` under ``tmp_path``; the test checks that it completes and prints its table,
not how fast it is (smoke sizes are far too small for the figures to mean anything).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

BENCH_DIR = REPO_ROOT / "tools" / "bench"
SCRIPTS = sorted(BENCH_DIR.glob("*.py"))

#: what each benchmark's table prints: its ratio line, or its header where it has no ratio
TABLES = {
    "bundle": ["digest", "pack", "unpack", "ratio (dsagent / C throughput)", "(fixed cost)", "unpack by writers"],
    "cache": ["baseline per-file copy:", "dsagent without bundles:", "dsagent with bundles:"],
    "digest": ["dsagent build_manifest", "ratio of medians (dsagent / C)"],
    "digestcache": ["parts", "whole", "ratio of medians (whole / parts)"],
    "extender": ["p50 ms", "p99 ms", "names     100"],
    "controller": ["node object bytes added max:", "pass s", "peak RSS MiB", "goal: <= 1024 B added per Node"],
    "webhook": ["median s", "slowest s", "watch", "an admission with the Nodes watched is", "process peaks at"],
    "agent_writes": ["writes/node-h mean", "nodecache", "goal: <= 360 writes per node-hour"],
    "extender_memory": ["peak MiB", "json.loads MiB", "go         filter", "reordered  prioritize"],
    "overlap": ["(baseline)", "(overlap)", "(init)", "overlap / baseline ="],
    "stripe_serve": ["served", "peak RSS before serving"],
    "reader": ["plain", "reader", "ratio of medians (reader / plain open)"],
    "links": ["one link", "3 links", "throughput ratio", "every link carried bundles: True", "load average"],
    "ranges": ["one link", "3 links", "throughput ratio", "every link carried a range: True", "load average"],
    "p2p": ["without peers", "with peers", "peers, at once", "target: the store serves <= 1.5x"],
    "ready": ["first-byte latency", "dsctl", "results written to"],
    "loader": [
        "images/s",
        "cache",
        "local",
        "striped",
        "s3",
        "ratio cache / local images/s",
        "ratio striped / local images/s",
        "results written to",
    ],
    "gpu_train": ["direct", "cached", "ratio cached / direct images/s", "results written to"],
    "results": ["# Performance results", "written to"],
}


def test_every_bench_is_run() -> None:
    assert SCRIPTS, f"no benchmarks found under {BENCH_DIR}"
    assert {s.stem for s in SCRIPTS} == set(TABLES), "add a new benchmark's table line to TABLES (or remove a gone one)"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_bench_smoke(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    work = tmp_path / "a work dir"  # every benchmark runs from a path with a space
    work.mkdir()
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--workdir", str(work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script.name} --smoke failed (exit {result.returncode}):\n{output[-3000:]}"
    for line in TABLES.get(script.stem, ["<no table line listed in TABLES>"]):
        assert line in result.stdout, f"{script.name} --smoke did not print {line!r}:\n{output[-3000:]}"
    print(f"{script.name} --smoke: {time.monotonic() - started:.1f} s")
