"""Fault injection over a per-file copy (no bundle store), a sample in the suite.

The same harness as the packed fetch (``tools/support/faults.py``), over a dataset the agent
copies file by file from a local directory, a real HTTP server and a real S3 server (moto)
on 127.0.0.1: the Nth operation on the cache disk (open, write, fsync and syncfs, rename,
mkdir, catalog commit) or the Nth read of a source file fails, or the agent is killed
there, or the source is rewritten there. After each: failed with a clear code or ready
with every file exactly one version of its source file, nothing left behind, and the same
request then ready. ``tools/faults/sweep.py --per-file`` runs every point.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.support.faults import KINDS, PerFileSource, run_forked_kill_point, run_point

pytestmark = pytest.mark.slow  # real servers and a dozen agent runs per test


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tools.support.s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.env().items():
            patch.setenv(name, value)
        try:
            yield server
        finally:
            server.close()


def _source(kind: str, base: Path, request: pytest.FixtureRequest) -> PerFileSource:
    s3 = request.getfixturevalue("s3") if kind == "s3" else None
    source = PerFileSource.make(kind, base, s3=s3)
    request.addfinalizer(source.close)
    return source


@pytest.mark.parametrize("kind", ["local", "http", "s3"])
def test_faults_on_the_cache_disk_during_a_per_file_copy(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = _source(kind, tmp_path / "src", request)
    counted, injector = run_point(tmp_path / "count", source, None)
    assert counted.violations == [] and counted.first == "ready", counted
    assert {"open", "write", "rename", "commit"} <= set(injector.kinds), injector.kinds
    points = injector.count
    sample = [(1, errno.ENOSPC, True), (points // 3, errno.ENOSPC, True), (points // 2, errno.EIO, False)]
    for at, code, persist in sample:
        outcome, fired = run_point(tmp_path / f"{at}-{code}", source, at, code=code, persist=persist)
        assert fired.fired >= 1, f"point {at} of {points} was not reached"
        assert outcome.violations == [], outcome
        assert outcome.retry == "ready", outcome


@pytest.mark.parametrize("kind", ["local", "http", "s3"])
def test_a_source_read_failing_or_the_source_changing_mid_copy(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = _source(kind, tmp_path / "src", request)
    _, reads = run_point(tmp_path / "count", source, None, kinds=("read",))
    assert reads.count >= 8, reads.kinds
    failed, _ = run_point(tmp_path / "fail", source, reads.count // 2, code=errno.ECONNRESET, kinds=("read",))
    assert failed.violations == [] and failed.first == "failed:source_unavailable", failed
    big = next(i for i, (_, path) in enumerate(reads.ops) if path.endswith("weights.bin")) + 2
    changed, _ = run_point(tmp_path / "change", source, big, kinds=("read",), change=True)
    assert changed.violations == [], changed
    # a rewrite in the middle of a file's copy is seen: never a ready mix of two versions
    assert changed.first == "failed:integrity", changed


def test_kill_9_during_a_per_file_copy_from_http_then_a_restart(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    source = _source("http", tmp_path / "src", request)
    _, counted = run_point(tmp_path / "count", source, None, kinds=(*KINDS, "read"))
    points = counted.count
    for at in sorted({1, points // 2, points - 1}):
        outcome = run_forked_kill_point(tmp_path / f"kill-{at}", source, at, kinds=(*KINDS, "read"))
        assert outcome.first == "killed", outcome
        assert outcome.violations == [], outcome
